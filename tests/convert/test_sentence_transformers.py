"""A converted sentence-transformers checkpoint is a drop-in SentenceTransformer (skipped without the package)."""

from __future__ import annotations

import pytest
import torch
import yaml
from transformers import AutoModel, AutoTokenizer

from hf_sliced_attn.convert import convert, convert_sentence_transformer
from hf_sliced_attn.hub import upload_plan

from .conftest import tiny_options

sentence_transformers = pytest.importorskip("sentence_transformers")

TEXTS = ["the cat sat on the mat", "a dog ran in the park near the river", "one"]


@pytest.fixture(scope="module")
def tiny_sentence_transformer(tiny_roberta, tmp_path_factory):
    """The tiny RoBERTa as a sentence-transformers model: Transformer -> mean Pooling -> Normalize."""
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(str(tiny_roberta), max_seq_length=48)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    folder = tmp_path_factory.mktemp("tiny-st")
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(folder))
    return folder


def _mean_pooled_normalised(folder, texts):
    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def _assert_drop_in(folder, mechanism):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    assert model[0].auto_model.config._attn_implementation == mechanism
    embeddings = model.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, _mean_pooled_normalised(folder, TEXTS), atol=1e-5, rtol=1e-5)
    similarity = model.similarity(embeddings, embeddings)
    assert similarity.shape == (3, 3) and torch.allclose(similarity.diagonal(), torch.ones(3), atol=1e-5)
    assert model.max_seq_length == 48


def _card_header(folder) -> dict:
    return yaml.safe_load((folder / "README.md").read_text().split("---")[1])


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_converted_folder_loads_with_sentence_transformers(tiny_sentence_transformer, tmp_path, mechanism):
    output = tmp_path / "out"
    result = convert(tiny_options(tiny_sentence_transformer, output, mechanism=mechanism, steps=2))
    assert result.report["sentence_transformers"] == "kept"
    assert {"modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"} <= {
        p.name for p in output.iterdir()}
    _assert_drop_in(output, mechanism)
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json"} <= set(upload_plan(output))
    header = _card_header(output)
    assert header["library_name"] == "sentence-transformers" and header["pipeline_tag"] == "sentence-similarity"
    assert 'SentenceTransformer("out")' in (output / "README.md").read_text()


def test_an_adapter_only_conversion_says_sentence_transformers_cannot_load_it(tiny_sentence_transformer, tmp_path):
    output = tmp_path / "adapter"
    result = convert(tiny_options(tiny_sentence_transformer, output, steps=2, adapter_only=True))
    assert result.report["sentence_transformers"] == "adapter-only" and not (output / "modules.json").exists()
    assert "sentence-transformers cannot load this adapter-only" in (output / "README.md").read_text()


def test_converting_a_sentence_transformer_object(tiny_sentence_transformer, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_sentence_transformer), device="cpu")
    output = tmp_path / "from-object"
    options = tiny_options(tiny_sentence_transformer, output, steps=2)
    result = convert_sentence_transformer(model, "sliced_relu", str(output), options.text,
                                          heldout_text=options.heldout_text,
                                          transfer={"steps": 2, "stage2_steps": 0, "keep_softmax_layers": 0},
                                          base_model_id="someone/tiny-embedder")
    assert result.report["base_model"] == "someone/tiny-embedder"
    _assert_drop_in(output, "sliced_relu")
    assert _card_header(output)["base_model"] == "someone/tiny-embedder"
