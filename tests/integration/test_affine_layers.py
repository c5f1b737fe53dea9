"""``affine_of`` reads what a projection layer computes from its parameters, and only where those say all of it:
a plain Linear, or peft's LoRA Linear around one (vanilla adapters, dropout off); otherwise None."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from hf_sliced_attn.affine_layers import affine_of


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def lora_layer(**options) -> nn.Module:
    torch.manual_seed(0)
    model = get_peft_model(Holder(), LoraConfig(r=2, target_modules=["proj"], init_lora_weights=False, **options))
    return model.base_model.model.proj


def assert_reads_the_call(layer: nn.Module) -> None:
    """The map gives the layer's output, and the same gradients of x and of every parameter (None for both where
    the call does not use it: a merged or disabled adapter)."""
    affine = affine_of(layer)
    assert affine is not None
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    parameters = [p for p in layer.parameters() if p.requires_grad]

    def output_and_grads(run):
        inputs = x.clone().requires_grad_()
        out = run(inputs)
        return out, torch.autograd.grad((out * weights).sum(), [inputs, *parameters], allow_unused=True)

    got = output_and_grads(lambda inputs: nn.functional.linear(inputs, affine.weight, affine.bias))
    want = output_and_grads(layer)
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w)


def test_a_plain_linear_layer():
    layer = nn.Linear(6, 5)
    assert affine_of(layer).weight is layer.weight
    assert_reads_the_call(layer)


def test_a_hook_or_a_replaced_forward_is_called_instead():
    layer = nn.Linear(6, 5)
    handle = layer.register_forward_hook(lambda module, args, output: output * 2)
    assert affine_of(layer) is None
    handle.remove()
    layer.forward = lambda x: x
    assert affine_of(layer) is None


@pytest.mark.parametrize("options", [{}, {"lora_bias": True}, {"lora_dropout": 0.1}], ids=["lora", "bias", "dropout"])
def test_a_lora_layer_reads_base_plus_its_update(options):
    """W_0 + s B A (and s b_B with lora_bias), differentiable in A and B; a dropout counts as off in eval mode."""
    layer = lora_layer(**options)
    layer.eval()
    assert_reads_the_call(layer)


def test_a_lora_dropout_in_training_is_called():
    layer = lora_layer(lora_dropout=0.1)
    layer.train()
    assert affine_of(layer) is None


def test_merged_or_disabled_adapters_read_the_base_layer():
    layer = lora_layer()
    layer.merge()
    assert affine_of(layer).weight is layer.base_layer.weight
    assert_reads_the_call(layer)
    layer.unmerge()
    layer.enable_adapters(False)
    assert affine_of(layer).weight is layer.base_layer.weight
    assert_reads_the_call(layer)


def test_a_lora_variant_is_called():
    """DoRA rescales the update by the weight's norm: not W_0 + s B A."""
    assert affine_of(lora_layer(use_dora=True)) is None
