"""Attention transfer end to end on tiny models: error goes down, the folder reloads, resuming is exact."""

from __future__ import annotations

import dataclasses

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoTokenizer, RobertaConfig

from hf_sliced_attn.attention import LAYER_MODE_ATTR
from hf_sliced_attn.integration import has_local_layers
from hf_sliced_attn import MECHANISMS
from hf_sliced_attn.conversion.converted_folder import CHECKPOINT_DIR, REPORT_NAME, check_reference, load_converted
from hf_sliced_attn.conversion.settings import mechanism_transfer_defaults, resolve_transfer_config
from hf_sliced_attn.convert import ConvertOptions, convert
from hf_sliced_attn.conversion.fidelity import measure_fidelity
from hf_sliced_attn.hub import push
from hf_sliced_attn.conversion.attention_taps import attention_modules
from hf_sliced_attn.conversion.training_text import split_heldout

from .conftest import tiny_options
from tests.helpers.models import HELDOUT_TEXT


def assert_converted_folder(output, mechanism: str) -> None:
    model, info = AutoModel.from_pretrained(output, output_loading_info=True)
    assert all(not info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.config._attn_implementation == mechanism  # selected by config.json alone
    converted = [m for m in attention_modules(model) if getattr(m, LAYER_MODE_ATTR) == mechanism]
    assert converted and all(hasattr(m, MECHANISMS[mechanism].module_names[0]) for m in converted)
    assert not (output / CHECKPOINT_DIR).exists()
    AutoTokenizer.from_pretrained(output)
    check_reference(output)


@pytest.mark.parametrize(("checkpoint", "mechanism"), [("tiny_roberta", "sliced_relu"), ("tiny_modernbert", "rela"),
                                                       ("tiny_modernbert", "sliced_relu"), ("tiny_electra", "rela"),
                                                       ("tiny_distilbert", "sliced_relu")])
def test_conversion_end_to_end(checkpoint, mechanism, request, tmp_path):
    output = tmp_path / "out"
    # convert's window of 16 covers these 11-word passages whole, so that softmax alone nearly reproduces the
    # teacher before any training; a window of 2 leaves the transfer something to learn.
    options = {"local_window": 2} if mechanism == "sliced_relu" else {}
    result = convert(tiny_options(request.getfixturevalue(checkpoint), output, mechanism=mechanism,
                                  mechanism_options=options))
    errors = result.report["attention_relative_error"]
    assert errors["mean_after"] < errors["mean_before"]
    assert set(errors["after"]) == {str(i) for i in result.report["converted_layers"]}
    if checkpoint == "tiny_modernbert":
        assert result.report["converted_layers"] == [0, 2]  # layer 1 is local and keeps softmax by default
    assert_converted_folder(output, mechanism)
    assert json.loads((output / REPORT_NAME).read_text()) == result.report
    assert (output / "README.md").exists()


def test_sliced_relu_conversions_use_the_conversion_options_unless_told(converted_roberta, tiny_roberta, tmp_path):
    saved = AutoConfig.from_pretrained(converted_roberta.output_dir).hf_sliced_attn
    defaults = MECHANISMS["sliced_relu"].conversion_options("convert")
    assert defaults["local_window"] > 0  # convert's window, which the recipe's transfer does not take
    assert {k: saved[k] for k in defaults} == defaults
    output = tmp_path / "plain"
    plain = dict(projection="linear", affine_output=False, num_slices=2)
    convert(tiny_options(tiny_roberta, output, mechanism_options=plain, steps=2))
    saved = AutoConfig.from_pretrained(output).hf_sliced_attn
    assert (saved["projection"], saved["affine_output"], saved["num_slices"]) == ("linear", False, 2)
    assert_converted_folder(output, "sliced_relu")


@pytest.mark.parametrize("option", [{"projection": "mlp"}, {"affine_output": True}, {"num_slices": 2}])
def test_sliced_relu_options_are_refused_for_rela(tiny_roberta, tmp_path, option):
    with pytest.raises(ValueError, match=rf"Unknown option\(s\) \['{next(iter(option))}'\] for 'rela'"):
        tiny_options(tiny_roberta, tmp_path / "o", mechanism="rela", mechanism_options=option)


def test_report_holds_every_figure(converted_roberta):
    """The session's conversion: the report holds every figure the issue asks for."""
    report = converted_roberta.report
    for key in ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman"):
        assert set(report[key]) == {"before", "after"} and -1.0 <= report[key]["after"] <= 1.0
    assert report["wall_time_s"] > 0
    assert report["heldout"]["num_texts"] == 100


def test_adapter_only(tiny_roberta, tmp_path):
    output = tmp_path / "adapter"
    result = convert(tiny_options(tiny_roberta, output, steps=10, adapter_only=True))
    assert (output / "adapter_config.json").exists() and not (output / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(output).hf_sliced_attn["mechanism"] == "sliced_relu"
    model = load_converted(output)
    assert model.config._attn_implementation == "sliced_relu"
    assert check_reference(output) < 1e-5
    assert result.report["adapter_only"]


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("interrupt_at", [7, 10])
def test_resume_after_interrupt_matches_uninterrupted_run(tiny_roberta, tmp_path, interrupt_at):
    """Interrupted in stage 1 (step 7, between checkpoints) or at its end (10), then resumed."""
    settings = dict(steps=10, stage2_steps=6, checkpoint_every=4)
    reference = convert(tiny_options(tiny_roberta, tmp_path / "straight", **settings))

    def interrupt(step, loss):
        if step == interrupt_at:
            raise KeyboardInterrupt

    output = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        convert(tiny_options(tiny_roberta, output, **settings), on_step=interrupt)
    assert (output / CHECKPOINT_DIR / "latest").read_text() == f"step-{interrupt_at:07d}"
    with pytest.raises(FileExistsError, match="pass resume=True to continue it"):
        convert(tiny_options(tiny_roberta, output, **settings))
    with pytest.raises(ValueError, match="other settings"):
        convert(tiny_options(tiny_roberta, output, **{**settings, "lr": 5e-4}, resume=True))
    resumed = convert(tiny_options(tiny_roberta, output, **settings, resume=True))

    expected, got = _weights(tmp_path / "straight"), _weights(output)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=0)
    assert resumed.report["attention_relative_error"] == reference.report["attention_relative_error"]


def test_resume_without_checkpoint_is_an_error(tiny_roberta, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        convert(tiny_options(tiny_roberta, tmp_path / "nothing", resume=True))


def test_heldout_split_is_deterministic_and_disjoint():
    texts = [f"passage {i}" for i in range(50)]
    train, heldout, note = split_heldout(texts, None, fraction=0.1, seed=3)
    assert (train, heldout) == split_heldout(texts, None, fraction=0.1, seed=3)[:2]
    assert len(heldout) == 5 and not set(train) & set(heldout) and set(train) | set(heldout) == set(texts)
    assert "split off" in note
    with pytest.raises(ValueError, match="also appear in the training text"):
        split_heldout(texts, ["passage 3", "new", "newer"], fraction=0.1, seed=0)
    with pytest.raises(ValueError, match="at least 3 passages"):
        split_heldout(texts, ["new", "newer"], fraction=0.1, seed=0)


def test_fidelity_of_a_model_with_itself(tiny_roberta):
    model = AutoModel.from_pretrained(tiny_roberta).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_roberta)
    texts = open(HELDOUT_TEXT).read().splitlines()[:12]
    same = measure_fidelity(model, model, tokenizer, texts, layers=[0, 1], max_length=32)
    assert same["attention_relative_error_mean"] == 0.0
    assert same["embedding_cosine"] == pytest.approx(1.0) and same["pairwise_spearman"] == pytest.approx(1.0)
    other = AutoModel.from_pretrained(tiny_roberta, attn_implementation="rela").eval()
    different = measure_fidelity(model, other, tokenizer, texts, layers=[0, 1], max_length=32)
    assert different["attention_relative_error_mean"] > 0.1 and different["hidden_state_cosine"] < 1.0


def test_text_from_files_and_saved_datasets(tmp_path):
    import datasets

    from hf_sliced_attn.conversion.training_text import load_texts

    (tmp_path / "a.txt").write_text("first line\n\n  second line  \n")
    datasets.Dataset.from_dict({"sentence": ["from a dataset", ""]}).save_to_disk(tmp_path / "ds")
    assert load_texts([str(tmp_path / "a.txt"), str(tmp_path / "ds")], column="sentence") == [
        "first line", "second line", "from a dataset"]
    with pytest.raises(ValueError, match="no column 'text'"):
        load_texts([str(tmp_path / "ds")])


def test_no_written_file_holds_a_local_path(tiny_roberta, tmp_path):
    """A conversion from a local folder: the card, config.json and report name neither the input
    nor the output folder, and the card says the base model is a local checkpoint."""
    output = tmp_path / "converted-here"
    convert(tiny_options(tiny_roberta, output, mechanism="rela", steps=2))
    written = [path for path in output.rglob("*") if path.is_file() and path.suffix in (".json", ".md", ".txt")]
    assert {"README.md", "config.json", REPORT_NAME} <= {path.name for path in written}
    for path in written:
        text = path.read_text()
        for local in (str(tiny_roberta), str(output), str(tmp_path), HELDOUT_TEXT):
            assert local not in text, f"{path.name} holds the local path {local}"
    card = (output / "README.md").read_text()
    assert "a local checkpoint" in card and "base_model:" not in card
    printed: list[str] = []
    push(output, "me/converted", dry_run=True, echo=printed.append)
    assert any(line.startswith("Warning: the model card names no base_model") for line in printed)


def test_each_mechanism_brings_its_measured_transfer_settings(tiny_roberta, tmp_path):
    """Settings left out take the mechanism's measured best for conversions; given ones win."""
    config = AutoConfig.from_pretrained(tiny_roberta)  # 2 layers
    for mechanism, given in (("sliced_relu", {}), ("rela", {"stage2_steps": 7})):
        options = ConvertOptions(model=str(tiny_roberta), mechanism=mechanism, output_dir=str(tmp_path), text=["t"],
                                 transfer=given)
        resolved = options.transfer_config(options.student_config(config))
        expected = {**mechanism_transfer_defaults(mechanism, "convert"), **given}
        assert dataclasses.asdict(resolved) == expected
        assert resolved.keep_softmax_layers == 0  # convert's default converts every layer (issue #24)
    sliced = ConvertOptions(model=str(tiny_roberta), mechanism="sliced_relu", output_dir=str(tmp_path), text=["t"])
    assert (sliced.resolved_options()["num_slices"], sliced.resolved_options()["local_window"]) == (4, 16)
    rela = ConvertOptions(model=str(tiny_roberta), mechanism="rela", output_dir=str(tmp_path), text=["t"])
    assert rela.resolved_options()["local_window"] == 16  # both convert with a window of 16 (issue #24)
    given = ConvertOptions(model=str(tiny_roberta), mechanism="rela", output_dir=str(tmp_path), text=["t"],
                           mechanism_options={"local_window": 0})
    assert given.resolved_options()["local_window"] == 0  # a given option wins


def test_a_default_count_of_softmax_layers_keeps_at_most_half(rela_keeps_two_layers):
    """A mechanism whose measured best before fine-tuning keeps 2 layers on softmax: a 2-layer model keeps 1 (at
    most half); a given count is not capped."""
    assert mechanism_transfer_defaults("rela", "finetune")["keep_softmax_layers"] == 2
    resolved = resolve_transfer_config("rela", "finetune", {}, converted_layers=2, layers_listed=False,
                                       has_local_layers=False)
    assert resolved.keep_softmax_layers == 1
    given = resolve_transfer_config("rela", "finetune", {"keep_softmax_layers": 3}, converted_layers=4,
                                    layers_listed=False, has_local_layers=False)
    assert given.keep_softmax_layers == 3


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_layer_converts_before_fine_tuning_with_a_window(mechanism):
    """Issue #24: both mechanisms' recipe transfers keep no layer on softmax and add the window of 4 they were
    measured with; the hybrid stays available by asking for it."""
    resolved = resolve_transfer_config(mechanism, "finetune", {}, converted_layers=6, layers_listed=False,
                                       has_local_layers=False)
    assert resolved.keep_softmax_layers == 0
    assert MECHANISMS[mechanism].conversion_options("finetune")["local_window"] == 4
    hybrid = resolve_transfer_config(mechanism, "finetune", {"keep_softmax_layers": 2}, converted_layers=6,
                                     layers_listed=False, has_local_layers=False)
    assert hybrid.keep_softmax_layers == 2


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_model_with_local_layers_keeps_no_global_layer_on_softmax_by_default(mechanism, tiny_modernbert):
    """On ModernBERT (local layers beside global ones) a layer kept on softmax would be a global softmax layer, so
    no default keeps one, whatever the mechanism's default count; a count given explicitly still applies."""
    config = AutoConfig.from_pretrained(tiny_modernbert)
    assert has_local_layers(config) and not has_local_layers(RobertaConfig(num_hidden_layers=2))
    resolved = resolve_transfer_config(mechanism, "finetune", {}, converted_layers=4, layers_listed=False,
                                       has_local_layers=True)
    assert resolved.keep_softmax_layers == 0
    given = resolve_transfer_config(mechanism, "finetune", {"keep_softmax_layers": 1}, converted_layers=4,
                                    layers_listed=False, has_local_layers=True)
    assert given.keep_softmax_layers == 1


def test_a_layer_list_keeps_every_listed_layer_converted(tiny_roberta, tmp_path):
    """A layers list implies keep_softmax_layers 0; a count given with it is an error, not a silent choice."""
    config = AutoConfig.from_pretrained(tiny_roberta)
    listed = ConvertOptions(model=str(tiny_roberta), mechanism="sliced_relu", output_dir=str(tmp_path), text=["t"],
                            mechanism_options={"layers": [0, 1]})
    assert listed.transfer_config(listed.student_config(config)).keep_softmax_layers == 0
    both = ConvertOptions(model=str(tiny_roberta), mechanism="sliced_relu", output_dir=str(tmp_path), text=["t"],
                          mechanism_options={"layers": [0, 1]}, transfer={"keep_softmax_layers": 1})
    with pytest.raises(ValueError, match="give it or a list of layers to convert, not both"):
        both.transfer_config(both.student_config(config))
    missing = ConvertOptions(model=str(tiny_roberta), mechanism="sliced_relu", output_dir=str(tmp_path), text=["t"],
                             mechanism_options={"layers": [99]})
    with pytest.raises(ValueError, match=r"names layers \[99\], but the model has 2 layers"):
        missing.transfer_config(missing.student_config(config))


def test_keep_softmax_layers_keeps_the_worst_layers_and_saves_the_choice(tiny_modernbert, tmp_path):
    """ModernBERT tiny (3 layers, all converted): stage 1 ranks them, the worst goes back to softmax."""
    output = tmp_path / "hybrid"
    result = convert(tiny_options(tiny_modernbert, output, mechanism="rela", steps=5, keep_softmax_layers=1,
                                  mechanism_options={"layers": "all"}))
    ranking = result.report["kept_softmax"]["ranking_attention_error"]
    worst = max(ranking, key=ranking.get)
    saved = AutoConfig.from_pretrained(output).hf_sliced_attn["layers"]
    assert saved == sorted(int(layer) for layer in ranking if layer != worst)
    assert result.report["kept_softmax"]["layers"] == [int(worst)]
    assert result.report["converted_layers"] == saved
    assert_converted_folder(output, "rela")
    with pytest.raises(ValueError, match="leaves none of the 3 converted layers"):
        convert(tiny_options(tiny_modernbert, tmp_path / "none", mechanism="rela", steps=2, keep_softmax_layers=3,
                             mechanism_options={"layers": "all"}))


def test_packed_passages_fill_rows_in_order(tiny_roberta):
    """Each row holds consecutive passages up to the token budget (special tokens included); a passage over it
    stands alone; every passage is in exactly one row, in its order."""
    from hf_sliced_attn.conversion.training_text import pack_passages

    tokenizer = AutoTokenizer.from_pretrained(tiny_roberta)
    texts = [f"passage number {i} says a little more" for i in range(12)]
    texts.insert(5, " ".join(["long"] * 80))
    rows = pack_passages(tokenizer, texts, 40)
    assert " ".join(rows) == " ".join(texts)  # every passage once, in order
    lengths = [len(tokenizer(row)["input_ids"]) for row in rows]
    assert all(length <= 40 for row, length in zip(rows, lengths) if "long long" not in row)
    assert " ".join(["long"] * 80) in rows  # the over-long passage alone
    one = len(tokenizer(texts[0])["input_ids"])
    assert 1 < len(rows) < len(texts) and lengths[0] + one - 2 > 40  # a row stops where the next passage would overflow
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        pack_passages(tokenizer, texts, 0)


def test_packing_trains_on_fewer_longer_rows_and_is_recorded(tiny_roberta, tmp_path):
    result = convert(tiny_options(tiny_roberta, tmp_path / "packed", pack_tokens=64, max_length=64, steps=2))
    unpacked = convert(tiny_options(tiny_roberta, tmp_path / "unpacked", max_length=64, steps=2))
    packed_training, training = result.report["training"], unpacked.report["training"]
    assert packed_training["pack_tokens"] == 64 and training["pack_tokens"] == 0
    assert packed_training["num_texts"] < training["num_texts"]
    assert result.report["heldout"]["num_texts"] == unpacked.report["heldout"]["num_texts"]  # held-out text unpacked
    with pytest.raises(ValueError, match="pack_tokens must be 0 .* at most max_length 64"):
        tiny_options(tiny_roberta, tmp_path / "bad", pack_tokens=65, max_length=64)
