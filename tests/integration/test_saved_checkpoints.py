"""Checkpoints saved by an earlier release still load, select their mechanism and give the same outputs.

``tests/fixtures/checkpoints_0_1_0`` holds tiny models saved by hf-sliced-attn 0.1.0 (commit 677e74f,
before the mechanism registry), each with an input batch and the last hidden state that release
computed for it (``expected.pt``). Every position is compared, except with the MLP projection:
it now skips padded tokens, so only the real tokens' outputs are 0.1.0's (no head reads the others).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModel

import hf_sliced_attn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints_0_1_0"
CHECKPOINTS = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())


def test_fixtures_are_present():
    assert len(CHECKPOINTS) == 5


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_saved_checkpoint_loads_with_the_same_outputs(name):
    folder = FIXTURES / name
    model, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    saved = model.config.to_dict()[hf_sliced_attn.CONFIG_KEY]
    assert model.config._attn_implementation == saved["mechanism"]
    expected = torch.load(folder / "expected.pt")
    with torch.no_grad():
        out = model.eval()(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"]).last_hidden_state
    real = expected["attention_mask"].bool()
    assert not real.all(), "the fixture's batch must be padded, so that padding is exercised"
    if saved.get("projection") != "mlp":
        real = torch.ones_like(real)
    torch.testing.assert_close(out[real], expected["last_hidden_state"][real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()
