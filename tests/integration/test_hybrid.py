"""hf_sliced_attn.conversion.hybrid: choosing the layers to keep on softmax, and returning layers to softmax in place."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel

import hf_sliced_attn
from hf_sliced_attn.conversion.hybrid import restore_softmax_layers, worst_layers
from hf_sliced_attn.conversion.attention_taps import attention_modules, converted_layers
from hf_sliced_attn.conversion.transfer import with_transfer_lora
from tests.helpers.models import tiny_config


def test_worst_layers_are_the_largest_errors_sorted_by_index():
    errors = {"0": 0.2, "2": 0.9, "3": 0.5, "5": 0.1}
    assert worst_layers(errors, 2) == [2, 3]
    assert worst_layers(errors, 0) == []
    with pytest.raises(ValueError, match="leaves none of the 4"):
        worst_layers(errors, 4)
    with pytest.raises(ValueError, match=">= 0"):
        worst_layers(errors, -1)


def _transferred(model_type: str, mechanism: str, **options):
    """(the softmax original, a converted copy as a transfer leaves it: LoRA on the attention projections with
    trained, non-zero adapters, and trained plugin modules; the base weights frozen, the original's)."""
    torch.manual_seed(0)
    original = AutoModel.from_config(tiny_config(model_type), attn_implementation="sdpa").eval()
    config = hf_sliced_attn.prepare_config(tiny_config(model_type), mechanism, **options)
    model = AutoModel.from_config(config).eval()
    model.load_state_dict(original.state_dict(), strict=False)
    model = with_transfer_lora(model, r=4, alpha=8, seed=0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name or parameter.requires_grad:
                parameter.add_(0.05)
    return original, model


@pytest.mark.parametrize("model_type, mechanism, options", [
    ("bert", "sliced_relu", {"projection": "mlp", "affine_output": True, "num_slices": 2}),
    ("modernbert", "rela", {"layers": "all"}),
])
def test_restored_layers_are_the_checkpoints_softmax_layers(model_type, mechanism, options):
    original, model = _transferred(model_type, mechanism, **options)
    assert converted_layers(model) == [0, 1, 2]
    assert restore_softmax_layers(model, [1]) == [0, 2]
    assert converted_layers(model) == [0, 2]
    assert getattr(model.config, hf_sliced_attn.CONFIG_KEY)["layers"] == [0, 2]
    names = hf_sliced_attn.MECHANISMS[mechanism].module_names
    assert not any(name in dict(attention_modules(model)[1].named_children()) for name in names)
    assert any(name in dict(attention_modules(model)[0].named_children()) for name in names)
    # The restored layer computes the checkpoint's softmax attention: with the converted layers restored too, and
    # the LoRA outside the attention modules (ModernBERT's Wo) zeroed, the whole model is the original
    # (ModernBERT's local layer within its window); merged, its attention weights are the original's.
    restore_softmax_layers(model, [0, 2])
    adapters = {name: parameter for name, parameter in model.named_parameters() if "lora_B" in name}
    projections = [p for name, p in adapters.items() if any(f".{n}." in name for n in ("query", "key", "value", "Wqkv"))]
    assert projections and not any(p.any() for p in projections)  # reset by the restore
    with torch.no_grad():
        for parameter in adapters.values():  # BERT's output.dense lies outside the attention module: still trained
            parameter.zero_()
        ids, mask = torch.randint(5, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
        mask[1, 9:] = 0
        expected = original(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = model(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(actual[real], expected[real], rtol=1e-5, atol=1e-5)
    merged = attention_modules(model.merge_and_unload())
    for restored, kept in zip(merged, attention_modules(original)):
        assert restored.state_dict().keys() == kept.state_dict().keys()  # no plugin module, no adapter left
        assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(), kept.state_dict().values()))


def test_restoring_a_layer_that_is_not_converted_is_an_error():
    original, model = _transferred("modernbert", "sliced_relu")  # "global": layer 0 only, of 3
    assert converted_layers(model) == [0]
    with pytest.raises(ValueError, match=r"Layers \[1\] do not run 'sliced_relu' \(converted layers: \[0\]\)"):
        restore_softmax_layers(model, [1])
    with pytest.raises(ValueError, match="not built for a mechanism"):
        restore_softmax_layers(original, [0])
