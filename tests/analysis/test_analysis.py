"""ReLA sparsity analysis: the blockwise counts against a brute force over the full weight matrix."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModel, PreTrainedTokenizerFast

import hf_sliced_attn
from hf_sliced_attn.mechanisms.rela import analysis
from hf_sliced_attn.mechanisms.rela.analysis import analyze_rela
from hf_sliced_attn.analyze_cli import HEATMAP_NAME, JSON_NAME
from hf_sliced_attn.cli import main as cli
from hf_sliced_attn.attention import observe_attention
from hf_sliced_attn.ops.naive import rela_weights_reference
from tests.helpers.models import tiny_config

TEXTS = [
    "the cat sat on the mat and looked at the dog that sat on the other mat near the door",
    "a short one",
    "sparse attention with linear units lets heads switch off for some queries " * 3,
    "every head attends to what it likes",
    "the dog ran",
    "relu attention is zero for negative scores and the analysis counts those zeros block by block "
    "of queries without ever holding the whole matrix",
    "one",
]
WORDS = sorted({word for text in TEXTS for word in text.split()})
BATCH_SIZE = 3  # 7 texts: batches of 3, 3 and 1, two of them padded
BLOCK_SIZE = 7  # several query blocks per sequence; windows straddle block edges
WINDOW = 5  # ModernBERT local_attention=8 -> sliding_window 5 (|i - j| <= 4)


def make_tokenizer(pad_id: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over TEXTS whose padding token has id ``pad_id``."""
    specials = ["[PAD]", "[UNK]", "[CLS]"]
    specials.insert(pad_id, specials.pop(0))
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def roberta() -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    torch.manual_seed(0)
    config = tiny_config("roberta", num_hidden_layers=2, vocab_size=len(WORDS) + 3)
    model = AutoModel.from_config(hf_sliced_attn.prepare_config(config, "rela"))
    return model.eval(), make_tokenizer(pad_id=1)


def modernbert() -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """3 layers: global, local, local (window 5), all on ReLA."""
    torch.manual_seed(0)
    config = tiny_config("modernbert", vocab_size=len(WORDS) + 3, bos_token_id=2, eos_token_id=2, cls_token_id=2,
                         sep_token_id=2)
    model = AutoModel.from_config(hf_sliced_attn.prepare_config(config, "rela", layers="all"))
    return model.eval(), make_tokenizer(pad_id=0)


def brute_force(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> dict[int, dict]:
    """Per layer, the statistics counted on the full (B, H, T, T) weight matrices."""
    totals: dict[int, dict] = {}

    def capture(*, module, query, key, key_padding_mask, scaling, sliding_window, **_):
        weights = rela_weights_reference(
            query, key, key_padding_mask, scaling=scaling, sliding_window=sliding_window
        )  # (B, H, T, T), invalid keys already 0
        batch, _, length, _ = weights.shape
        valid = torch.ones(batch, length, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
        i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
        window = torch.ones_like(i, dtype=torch.bool) if sliding_window is None else (i - j).abs() < sliding_window
        pairs = valid[:, :, None] & valid[:, None, :] & window  # (B, T, T)
        zero = (weights == 0) & pairs[:, None]
        null = (weights == 0).all(-1) & valid[:, None]  # (B, H, T)
        # Generalised JS as the mean KL divergence of each live head to the mixture.
        row_sum = weights.sum(-1, keepdim=True)
        live = (row_sum[..., 0] > 0) & valid[:, None]
        probs = weights / row_sum.clamp_min(1e-300)
        n_live = live.sum(1)  # (B, T)
        mixture = (probs * live[..., None]).sum(1) / n_live.clamp_min(1)[..., None]
        kl = torch.where(probs > 0, probs * (probs / mixture[:, None].clamp_min(1e-300)).log(), 0.0).sum(-1)
        js = (kl * live).sum(1) / n_live.clamp_min(1)
        entry = totals.setdefault(module.layer_idx, dict(zero=0, pairs=0, null=0, queries=0, js=0.0, js_n=0))
        entry["zero"] = entry["zero"] + zero.sum(dim=(0, 2, 3))
        entry["pairs"] += int(pairs.sum())
        entry["null"] = entry["null"] + null.sum(dim=(0, 2))
        entry["queries"] += int(valid.sum())
        entry["js"] += float(js[n_live >= 2].sum())
        entry["js_n"] += int((n_live >= 2).sum())

    with torch.no_grad(), observe_attention(capture):
        for start in range(0, len(TEXTS), BATCH_SIZE):
            model(**tokenizer(TEXTS[start:start + BATCH_SIZE], padding=True, return_tensors="pt"))
    return totals


@pytest.mark.parametrize("build", [roberta, modernbert], ids=["roberta", "modernbert"])
def test_rates_match_brute_force(build, monkeypatch):
    model, tokenizer = build()
    slabs = []
    count_block = analysis._count_block
    monkeypatch.setattr(analysis, "_count_block", lambda counts, q, k, *rest: (
        slabs.append(tuple(q.shape[2:3]) + tuple(k.shape[2:3])), count_block(counts, q, k, *rest))[1])

    result = analyze_rela(model, tokenizer, TEXTS, batch_size=BATCH_SIZE, block_size=BLOCK_SIZE)
    expected = brute_force(model, tokenizer)

    assert result.layers == sorted(expected) == list(range(len(expected)))
    assert result.num_texts == len(TEXTS)
    for i, layer in enumerate(result.layers):
        e = expected[layer]
        sparsity, null_rate = torch.tensor(result.sparsity[i]), torch.tensor(result.null_rate[i])
        assert result.valid_pairs[i] == e["pairs"] and result.valid_queries[i] == e["queries"]
        torch.testing.assert_close(sparsity, (e["zero"] / e["pairs"]).float(), rtol=0, atol=1e-6)
        torch.testing.assert_close(null_rate, (e["null"] / e["queries"]).float(), rtol=0, atol=1e-6)
        assert result.head_diversity[i] == pytest.approx(e["js"] / e["js_n"], abs=1e-6)
        assert ((0 <= sparsity) & (sparsity <= 1)).all() and ((0 <= null_rate) & (null_rate <= 1)).all()
        assert 0 < sparsity.mean() < 1  # a random model's weights are neither all zero nor all positive
        assert 0 < result.head_diversity[i] <= torch.log(torch.tensor(4.0)).item()
    # Never more than a (block × reachable keys) slab at a time.
    longest = max(len(tokenizer(text)["input_ids"]) for text in TEXTS)
    assert max(q for q, _ in slabs) == BLOCK_SIZE
    assert max(k for _, k in slabs) <= longest


def test_modernbert_windows_are_counted():
    """Local layers count only the pairs within their window: fewer pairs than the global layer."""
    model, tokenizer = modernbert()
    result = analyze_rela(model, tokenizer, TEXTS, batch_size=BATCH_SIZE, block_size=BLOCK_SIZE)
    assert result.sliding_windows == [None, WINDOW, WINDOW]
    lengths = [len(tokenizer(text)["input_ids"]) for text in TEXTS]
    global_pairs = sum(n * n for n in lengths)
    local_pairs = sum(min(n, i + WINDOW) - max(0, i - WINDOW + 1) for n in lengths for i in range(n))
    assert result.valid_pairs == [global_pairs, local_pairs, local_pairs]
    assert result.valid_queries == [sum(lengths)] * 3


def test_outputs(tmp_path):
    model, tokenizer = roberta()
    result = analyze_rela(model, tokenizer, TEXTS, batch_size=BATCH_SIZE)
    saved = json.loads(result.to_json(tmp_path / "a.json").read_text())
    assert saved["layers"] == [0, 1] and saved["sparsity"] == result.sparsity
    table = result.to_markdown()
    assert table.count("\n| 0 |") == 3 and table.count("\n| 1 |") == 3  # summary + two layer × head tables
    png = result.plot_heatmap(tmp_path / "h.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_non_rela_model_is_refused():
    torch.manual_seed(0)
    config = tiny_config("roberta", num_hidden_layers=1, vocab_size=len(WORDS) + 3)
    for model in (AutoModel.from_config(config),
                  AutoModel.from_config(hf_sliced_attn.prepare_config(config, "sliced_relu"))):
        with pytest.raises(ValueError, match="needs a ReLA model"):
            analyze_rela(model, make_tokenizer(pad_id=1), TEXTS)


def test_cli_writes_the_files(tmp_path, capsys):
    model, tokenizer = roberta()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    text = tmp_path / "texts.txt"
    text.write_text("\n".join(TEXTS) + "\n\n")
    out = tmp_path / "out"
    assert cli(["analyze", str(tmp_path / "model"), "--text", str(text), "--output", str(out),
                "--max-length", "16"]) == 0
    printed = capsys.readouterr().out
    assert "| layer | window | mean sparsity" in printed
    saved = json.loads((out / JSON_NAME).read_text())
    assert saved["num_texts"] == len(TEXTS) and len(saved["sparsity"]) == 2
    tokens = [len(tokenizer(text)["input_ids"]) for text in TEXTS]
    assert max(tokens) > 16 and saved["valid_queries"] == [sum(min(n, 16) for n in tokens)] * 2  # truncated
    assert (out / HEATMAP_NAME).read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_a_softmax_model(tmp_path, capsys):
    config = tiny_config("roberta", num_hidden_layers=1, vocab_size=len(WORDS) + 3)
    AutoModel.from_config(config).save_pretrained(tmp_path / "model")
    text = tmp_path / "texts.txt"
    text.write_text("one text\n")
    assert cli(["analyze", str(tmp_path / "model"), "--text", str(text), "--output", str(tmp_path / "out")]) == 1
    assert "hf-sliced-attn analyze: error: The ReLA analysis needs a ReLA model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
