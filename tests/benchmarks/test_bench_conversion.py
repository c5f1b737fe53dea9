"""The conversion benchmark's variants: the ``*_paragraphs`` ones (issue #24) train on the docstring paragraphs
alone, with their base variant's flags; the others on the glosses and the shipped sentences, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_conversion
from benchmarks.bench_conversion import (
    AFTERWARDS,
    PARAGRAPH_VARIANTS,
    PARAGRAPHS,
    VARIANTS,
    convert_command,
    training_text,
)
from benchmarks.bench_quality import HELDOUT


@pytest.fixture(autouse=True)
def _no_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_conversion, "minilm_folder", lambda: tmp_path / "minilm")


def text_arguments(command: list[str]) -> list[str]:
    start = command.index("--text") + 1
    return command[start:command.index("--heldout-text")]


@pytest.mark.parametrize("base", ["rela", "sliced_relu_window16_all_layers", "sliced_relu_window4_all_layers"])
def test_a_paragraphs_variant_trains_on_the_paragraphs_alone_with_its_base_flags(base, tmp_path):
    mechanism, flags = VARIANTS[f"{base}_paragraphs"]
    assert (mechanism, flags) == VARIANTS[base]
    text = training_text(f"{base}_paragraphs", tmp_path)
    assert text == [PARAGRAPHS] and PARAGRAPHS.name == "train_docstring_paragraphs.txt" and PARAGRAPHS.is_file()
    command = convert_command(mechanism, flags, text, tmp_path / "out")
    assert text_arguments(command) == [str(PARAGRAPHS)]
    assert command[command.index("--heldout-text") + 1] == str(HELDOUT)
    assert command[command.index("--attn") + 1] == mechanism and command[len(command) - len(flags):] == flags
    assert not {str(path) for path in AFTERWARDS.values()} & set(command)  # the tuning-long and reporting texts


def test_the_other_variants_still_train_on_the_glosses_and_the_shipped_sentences(tmp_path):
    text = training_text("sliced_relu_window16_all_layers", tmp_path)
    assert [path.name for path in text] == ["glosses.txt", "convert_train.txt"] and all(p.is_file() for p in text)
    assert PARAGRAPHS not in text
    for text_kind in ("paragraphs", "mixed"):  # one of each per base variant, none else
        assert {name for name in VARIANTS if name.endswith(f"_{text_kind}")} == {
            f"{base}_{text_kind}" for base in PARAGRAPH_VARIANTS}
    command = convert_command("rela", [], text, tmp_path / "out")
    assert text_arguments(command) == [str(path) for path in text]
    assert Path(command[command.index("--output") + 1]) == tmp_path / "out"


@pytest.mark.parametrize("base", ["sliced_relu", "rela", "sliced_relu_window16_all_layers"])
def test_a_mixed_variant_trains_on_the_usual_text_and_the_paragraphs(base, tmp_path):
    mechanism, flags = VARIANTS[f"{base}_mixed"]
    assert (mechanism, flags) == VARIANTS[base]
    text = training_text(f"{base}_mixed", tmp_path)
    assert [path.name for path in text] == ["glosses.txt", "convert_train.txt", PARAGRAPHS.name]
    assert text_arguments(convert_command(mechanism, flags, text, tmp_path / "out")) == [str(path) for path in text]
