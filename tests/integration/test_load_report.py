"""Loading a softmax checkpoint with a mechanism: the plugin's new modules are named in one log line, not in
transformers' MISSING table, while other missing weights stay in it and ``output_loading_info`` keeps them all."""

from __future__ import annotations

import pytest
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification

import hf_sliced_attn  # noqa: F401

from tests.helpers.models import tiny_checkpoint


@pytest.fixture
def transformers_log(caplog):
    """transformers' warnings, captured by caplog (the suite otherwise keeps transformers at errors only)."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    transformers.logging.enable_propagation()
    yield caplog
    transformers.logging.disable_propagation()
    transformers.logging.set_verbosity(verbosity)


def test_fresh_modules_get_one_line_and_other_missing_weights_stay_in_the_table(tmp_path, transformers_log):
    folder = tiny_checkpoint("roberta", tmp_path / "softmax", num_hidden_layers=2)
    with transformers_log.at_level("WARNING"):
        _, info = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="sliced_relu",
                                                                     output_loading_info=True)
    notes = [r.getMessage() for r in transformers_log.records if "hf_sliced_attn:" in r.getMessage()]
    report = "\n".join(r.getMessage() for r in transformers_log.records if "LOAD REPORT" in r.getMessage())
    assert len(notes) == 1 and "sliced_projection" in notes[0] and "of 2 attention layers" in notes[0]
    assert "classifier." in report and "MISSING" in report  # the task head is not the plugin's
    assert "sliced_projection" not in report
    assert any("sliced_projection" in key for key in info["missing_keys"])  # still reported to the caller


def test_a_converted_checkpoint_missing_some_of_its_modules_keeps_them_in_the_table(tmp_path, transformers_log):
    softmax = tiny_checkpoint("roberta", tmp_path / "softmax", num_hidden_layers=2)
    converted = tmp_path / "converted"
    AutoModel.from_pretrained(softmax, attn_implementation="rela").save_pretrained(converted)
    weights = load_file(converted / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("encoder.layer.1.") or "rela_norm" not in k},
              converted / "model.safetensors", metadata={"format": "pt"})
    transformers_log.clear()
    with transformers_log.at_level("WARNING"):
        AutoModel.from_pretrained(converted)
    messages = "\n".join(r.getMessage() for r in transformers_log.records)
    assert "hf_sliced_attn:" not in messages
    assert "rela_norm" in messages and "MISSING" in messages
