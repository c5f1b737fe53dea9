"""The convert command line: a small run, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import GPT2Config

from hf_sliced_attn import SUPPORTED_MODEL_TYPES
from hf_sliced_attn.cli import main

from tests.helpers.models import HELDOUT_TEXT, TRAIN_TEXT


def convert_args(model, output, *extra: str) -> list[str]:
    return ["convert", "--model", str(model), "--attn", "rela", "--text", TRAIN_TEXT, "--output", str(output),
            "--steps", "4", "--stage2-steps", "0", "--keep-softmax-layers", "0", "--lora-r", "8", *extra]


def test_convert_command_splits_off_heldout_text(tiny_roberta, tmp_path, capsys):
    assert main(convert_args(tiny_roberta, tmp_path / "out", "--layers", "1", "--stage2-steps", "2",
                             "--stage2-loss", "cosine")) == 0
    passages = len(set(Path(TRAIN_TEXT).read_text().splitlines()))
    heldout = round(0.1 * passages)
    out = capsys.readouterr().out
    assert f"Note: no held-out text given: {heldout} of {passages} distinct passages" in out and "Wrote" in out
    report = json.loads((tmp_path / "out" / "fidelity.json").read_text())
    assert report["converted_layers"] == [1] and report["heldout"]["num_texts"] == heldout
    assert report["training"]["num_texts"] == passages - heldout


def test_unknown_attention_lists_the_valid_ones(tiny_roberta, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "--model", str(tiny_roberta), "--attn", "linear", "--text", TRAIN_TEXT,
              "--output", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "sliced_relu" in error and "rela" in error


def test_unsupported_architecture_lists_the_supported_ones(tmp_path, capsys):
    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "gpt2")
    assert main(convert_args(tmp_path / "gpt2", tmp_path / "o")) == 1
    error = capsys.readouterr().err
    assert "'gpt2'" in error and all(name in error for name in SUPPORTED_MODEL_TYPES)


def test_empty_text(tiny_roberta, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    assert main(["convert", "--model", str(tiny_roberta), "--attn", "rela", "--text", str(empty),
                 "--output", str(tmp_path / "o")]) == 1
    assert "training text is empty" in capsys.readouterr().err


def test_overlapping_heldout_text(tiny_roberta, tmp_path, capsys):
    assert main(convert_args(tiny_roberta, tmp_path / "o", "--heldout-text", TRAIN_TEXT)) == 1
    assert "also appear in the training text" in capsys.readouterr().err


def test_existing_output_needs_overwrite(tiny_roberta, tmp_path, capsys):
    output = tmp_path / "o"
    output.mkdir()
    (output / "keep.txt").write_text("precious")
    assert main(convert_args(tiny_roberta, output, "--heldout-text", HELDOUT_TEXT)) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert (output / "keep.txt").read_text() == "precious"


def test_bad_layer_list(tiny_roberta, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(convert_args(tiny_roberta, tmp_path / "o", "--layers", "first"))
    assert "layer indices like 0,2,4" in capsys.readouterr().err


def test_sliced_relu_options_reach_the_saved_config(tiny_roberta, tmp_path):
    output = tmp_path / "out"
    args = convert_args(tiny_roberta, output, "--heldout-text", HELDOUT_TEXT, "--num-slices", "2",
                        "--projection", "linear", "--no-affine-output")
    args[args.index("rela")] = "sliced_relu"
    assert main(args) == 0
    options = json.loads((output / "config.json").read_text())["hf_sliced_attn"]
    assert (options["num_slices"], options["projection"], options["affine_output"]) == (2, "linear", False)


def test_sliced_relu_options_with_rela_are_an_error(tiny_roberta, tmp_path, capsys):
    assert main(convert_args(tiny_roberta, tmp_path / "o", "--projection", "mlp")) == 1
    assert "--projection applies to sliced_relu only, not to rela." in capsys.readouterr().err


@pytest.mark.parametrize("model, expected", [
    ("/no/such/folder", "No local folder '/no/such/folder' exists, and the name cannot be a Hub model id"),
    ("someorg/no-such-model", "as a Hub model id it cannot be downloaded because the machine is offline"),
])
def test_a_missing_model_is_one_line_and_a_nonzero_exit(model, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["convert", "--model", model, "--attn", "rela", "--text", TRAIN_TEXT,
                 "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
