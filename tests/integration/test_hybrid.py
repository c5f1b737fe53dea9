"""hf_sliced_attn.conversion.hybrid: choosing the layers to keep on softmax, and returning layers to softmax in place."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel

import hf_sliced_attn
from hf_sliced_attn.conversion.hybrid import restore_softmax_layers, worst_layers
from hf_sliced_attn.conversion.attention_taps import attention_modules, converted_layers
from tests.tiny_models import tiny_config


def test_worst_layers_are_the_largest_errors_sorted_by_index():
    errors = {"0": 0.2, "2": 0.9, "3": 0.5, "5": 0.1}
    assert worst_layers(errors, 2) == [2, 3]
    assert worst_layers(errors, 0) == []
    with pytest.raises(ValueError, match="leaves none of the 4"):
        worst_layers(errors, 4)
    with pytest.raises(ValueError, match=">= 0"):
        worst_layers(errors, -1)


def _converted(model_type: str, mechanism: str, **options):
    torch.manual_seed(0)
    original = AutoModel.from_config(tiny_config(model_type), attn_implementation="sdpa").eval()
    config = hf_sliced_attn.prepare_config(tiny_config(model_type), mechanism, **options)
    model = AutoModel.from_config(config).eval()
    model.load_state_dict(original.state_dict(), strict=False)
    with torch.no_grad():  # as a transfer leaves them: every attention projection changed
        for attention in attention_modules(model):
            for parameter in attention.parameters():
                parameter.add_(0.01)
    return original, model


@pytest.mark.parametrize("model_type, mechanism, options", [
    ("bert", "sliced_relu", {"projection": "mlp", "affine_output": True, "num_slices": 2}),
    ("modernbert", "rela", {"layers": "all"}),
])
def test_restored_layers_are_the_checkpoints_softmax_layers(model_type, mechanism, options):
    original, model = _converted(model_type, mechanism, **options)
    assert converted_layers(model) == [0, 1, 2]
    assert restore_softmax_layers(model, original, [1]) == [0, 2]
    assert converted_layers(model) == [0, 2]
    assert getattr(model.config, hf_sliced_attn.CONFIG_KEY)["layers"] == [0, 2]
    restored, kept = attention_modules(model)[1], attention_modules(original)[1]
    assert restored.state_dict().keys() == kept.state_dict().keys()  # no plugin module left
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), kept.state_dict().values()))
    assert any(name in dict(attention_modules(model)[0].named_children())
               for name in hf_sliced_attn.MECHANISMS[mechanism].module_names)
    # The restored layer computes the checkpoint's softmax attention: with the converted layers restored too,
    # the whole model is the original (ModernBERT's local layer within its window).
    restore_softmax_layers(model, original, [0, 2])
    with torch.no_grad():
        model.embeddings.load_state_dict(original.embeddings.state_dict())
        ids, mask = torch.randint(5, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
        mask[1, 9:] = 0
        expected = original(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(actual[real], expected[real], rtol=1e-5, atol=1e-5)


def test_restoring_a_layer_that_is_not_converted_is_an_error():
    original, model = _converted("modernbert", "sliced_relu")  # "global": layer 0 only, of 3
    assert converted_layers(model) == [0]
    with pytest.raises(ValueError, match=r"Layers \[1\] do not run 'sliced_relu' \(converted layers: \[0\]\)"):
        restore_softmax_layers(model, original, [1])
    with pytest.raises(ValueError, match="not built for a mechanism"):
        restore_softmax_layers(original, original, [0])
