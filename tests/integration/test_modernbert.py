"""ModernBERT: which layers convert, and local layers that respect their window exactly."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.attention import LAYER_MODE_ATTR

from tests.helpers.models import tiny_encoder

WINDOW = 5  # tiny_config("modernbert"): local_attention=8 -> |i - j| <= 4


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
@pytest.mark.parametrize(
    "layers, expected",
    [("global", ["{m}", "softmax", "softmax"]), ("all", ["{m}", "{m}", "{m}"]), ([1], ["softmax", "{m}", "softmax"])],
)
def test_layer_selection(mechanism, layers, expected):
    model = tiny_encoder("modernbert", mechanism, layers=layers)
    assert [layer.attn.sliding_window for layer in model.layers] == [None, WINDOW, WINDOW]
    assert [getattr(layer.attn, LAYER_MODE_ATTR) for layer in model.layers] == [e.format(m=mechanism) for e in expected]


@pytest.mark.parametrize(
    "mechanism, layers, options",
    [("sliced_relu", "all", {}), ("sliced_relu", "all", {"projection": "mlp", "affine_output": True}),
     ("rela", "all", {}), ("rela", "global", {})],
)
def test_local_layers_see_only_their_window(mechanism, layers, options):
    """Perturbing a token outside query i's window leaves the local layer's output at i unchanged."""
    model = tiny_encoder("modernbert", mechanism, layers=layers, **options)
    local = model.layers[1].attn
    length, query_pos, far = 24, 3, 15
    hidden = torch.randn(1, length, 32)
    position_ids = torch.arange(length)[None]
    position_embeddings = model.rotary_emb(hidden, position_ids, layer_type="sliding_attention")
    with torch.no_grad():
        before = local(hidden, position_embeddings=position_embeddings, attention_mask=None)[0]
        moved = hidden.clone()
        moved[0, far] += 10.0
        after = local(moved, position_embeddings=position_embeddings, attention_mask=None)[0]
        near = hidden.clone()
        near[0, query_pos + WINDOW - 1] += 10.0
        after_near = local(near, position_embeddings=position_embeddings, attention_mask=None)[0]
    torch.testing.assert_close(after[0, query_pos], before[0, query_pos], rtol=0, atol=1e-6)
    assert not torch.allclose(after_near[0, query_pos], before[0, query_pos])
