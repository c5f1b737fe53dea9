"""A new user's first errors (issue #23): each names the real problem and the remedy in the caller's own terms,
the command line's flags or the Python API's arguments."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from hf_sliced_attn.cli import main
from hf_sliced_attn.convert import ConvertOptions, convert

TRAIN_TEXT = str(files("hf_sliced_attn") / "data" / "text" / "convert_train.txt")


def _occupied(folder):
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    return folder


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_a_layer_the_model_lacks_is_named_with_the_valid_ones(tiny_roberta, tmp_path, capsys, mechanism):
    """A --layers list keeps no layer on softmax by itself: the error is that layer 99 does not exist."""
    assert main(["convert", "--model", str(tiny_roberta), "--attn", mechanism, "--text", TRAIN_TEXT,
                 "--output", str(tmp_path / "o"), "--layers", "99"]) == 1
    error = capsys.readouterr().err
    assert "[99]" in error and "2 layers" in error and "indices 0 to 1" in error, error
    assert "keep_softmax_layers" not in error and "keep-softmax-layers" not in error, error
    assert not (tmp_path / "o").exists()


def test_the_python_api_names_its_own_argument(tiny_roberta, tmp_path):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer, models

    from hf_sliced_attn.convert import convert_sentence_transformer

    transformer = models.Transformer(str(tiny_roberta), max_seq_length=32)
    model = SentenceTransformer(modules=[transformer, models.Pooling(transformer.get_embedding_dimension())],
                                device="cpu")
    output = _occupied(tmp_path / "o")
    with pytest.raises(FileExistsError) as error:
        convert_sentence_transformer(model, "rela", str(output), [TRAIN_TEXT])
    assert "pass overwrite=True to replace it" in str(error.value) and "--" not in str(error.value)
    assert (output / "keep.txt").read_text() == "precious"


def test_the_python_api_names_resume_as_it_takes_it(tiny_roberta, tmp_path):
    options = ConvertOptions(model=str(tiny_roberta), mechanism="rela", output_dir=str(tmp_path / "o"),
                             text=[TRAIN_TEXT], resume=True)
    with pytest.raises(FileNotFoundError, match=r"^resume=True: .* holds no checkpoint") as error:
        convert(options)
    assert "--resume" not in str(error.value)


def test_the_command_line_names_its_flags(tiny_roberta, tmp_path, capsys):
    common = ["convert", "--model", str(tiny_roberta), "--attn", "rela", "--text", TRAIN_TEXT]
    assert main([*common, "--output", str(_occupied(tmp_path / "o"))]) == 1
    error = capsys.readouterr().err
    assert "pass --overwrite to replace it" in error and "overwrite=True" not in error, error
    assert main([*common, "--output", str(tmp_path / "nothing"), "--resume"]) == 1
    error = capsys.readouterr().err
    assert re.search(r"error: --resume: .* holds no checkpoint", error) and "resume=True" not in error, error


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_analyze_names_the_text_file_it_cannot_read(tmp_path, capsys, kind):
    text = tmp_path / "nope.txt"
    if kind == "folder":
        text.mkdir()
    assert main(["analyze", str(tmp_path / "model"), "--text", str(text)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"hf-sliced-attn analyze: error: --text {text}: the file "), error
    assert ("does not exist" if kind == "missing" else "is a folder") in error
    assert "one text per line" in error and "Errno" not in error and len(error.splitlines()) == 1, error


def test_analyze_names_the_model_it_cannot_find(tmp_path, capsys):
    text = tmp_path / "texts.txt"
    text.write_text("one text\nanother text\n")
    assert main(["analyze", str(tmp_path / "no-model"), "--text", str(text)]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("hf-sliced-attn analyze: error: No local folder"), error
    assert len(error.splitlines()) == 1, error


def test_convert_help_shows_the_defaults_conversions_use(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    shown = {flag: re.search(rf" {flag}(?: [A-Z_]+| \{{[a-z,]+\}}|, --no-affine-output) .*?\(default: ([^)]*)\)", text)
             for flag in ("--num-slices", "--projection", "--affine-output", "--layers", "--norm-eps")}
    assert {flag: match and match.group(1) for flag, match in shown.items()} == {
        "--num-slices": "4", "--projection": "'mlp'", "--affine-output": "True", "--layers": "'global'",
        "--norm-eps": "1e-06"}
