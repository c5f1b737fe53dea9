"""What a projection layer computes, read from its parameters: x -> x W^T + b.

Sliced ReLU layers of the BERT family attend from their input (``InputAttention``): they fold their projection into
the query and key layers, and the linear projection into the value layer's product, by reading those layers'
weights instead of calling them. That is exact only where the parameters say all that calling the layer does:

* a plain ``nn.Linear`` with no hook and no replaced forward (not quantized, parametrized or offloaded);
* peft's LoRA ``Linear`` around one (attention transfer trains the attention projections with LoRA):
  W = W_0 + sum over the active adapters of s B A and b = b_0 (+ s b_B with ``lora_bias``), differentiable in
  A and B, where every active adapter is vanilla LoRA (no DoRA or other variant), its dropout is off (p = 0, or
  the layer is in eval mode) and its weights share W_0's dtype; merged, or with its adapters disabled, it is
  W_0 and b_0.

Anything else (another peft tuner, a hook, a dropout that is on) gives None, and the layer is called as written.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from .mechanisms.base import Affine

__all__ = ["Affine", "affine_of"]


def affine_of(layer: nn.Module) -> Affine | None:
    """The map calling ``layer`` applies, read from its parameters; None where those do not say all it does."""
    if _runs_as_written(layer):
        return Affine(layer.weight, layer.bias)
    lora = sys.modules.get("peft.tuners.lora")  # not imported here: a layer can be peft's only once peft is loaded
    if lora is not None and type(layer) is lora.Linear and _unhooked(layer):
        return _lora_affine(layer)
    return None


def _unhooked(layer: nn.Module) -> bool:
    """No forward hooks on ``layer`` or globally, and its class's forward."""
    return (
        "forward" not in vars(layer)
        and not (layer._forward_hooks or layer._forward_pre_hooks)
        and not (torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)
    )


def _runs_as_written(layer: nn.Module) -> bool:
    """A plain ``nn.Linear``, unhooked, with real (not meta) weights."""
    return type(layer) is nn.Linear and _unhooked(layer) and layer.weight.device.type != "meta"


def _lora_affine(layer: nn.Module) -> Affine | None:
    """W_0 + sum_a s_a B_a A_a and b_0 (+ s_a b_B,a) of a peft LoRA ``Linear`` (see the module docstring), or None."""
    base = layer.base_layer
    if not _runs_as_written(base) or layer.fan_in_fan_out:
        return None
    if layer.disable_adapters or layer.merged:
        return Affine(base.weight, base.bias)
    weight, bias = base.weight, base.bias
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        down, up, dropout = layer.lora_A[name], layer.lora_B[name], layer.lora_dropout[name]
        dropout_off = isinstance(dropout, nn.Identity) or (
            type(dropout) is nn.Dropout and (dropout.p == 0 or not dropout.training))
        plain = all(_runs_as_written(x) for x in (down, up)) and down.bias is None
        if name in layer.lora_variant or not dropout_off or not plain or up.weight.dtype != base.weight.dtype:
            return None
        scaling = layer.scaling[name]
        weight = weight + (up.weight @ down.weight) * scaling
        if up.bias is not None:
            bias = up.bias * scaling if bias is None else bias + up.bias * scaling
    return Affine(weight, bias)
