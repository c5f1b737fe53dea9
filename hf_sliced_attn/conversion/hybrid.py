"""Hybrid encoders: softmax attention kept on the layers whose attention transfers worst.

After stage 1 of attention transfer, each converted layer ``l`` has a relative attention error
e_l = ‖a_l − â_l‖ / ‖â_l‖ against its softmax teacher (fed the teacher's inputs; see
:func:`hf_sliced_attn.conversion.fidelity.measure_fidelity`). Keeping the ``k`` layers of largest
e_l on softmax closes most of the accuracy gap at the cost of ``k`` quadratic layers.
:func:`worst_layers` chooses them; :func:`restore_softmax_layers` turns them back into the
checkpoint's softmax layers, in place. The converted layers that remain are saved in
config.json as an explicit ``layers`` list, like every option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from peft.tuners.lora import LoraLayer
from torch import nn

from ..attention import LAYER_MODE_ATTR, SOFTMAX
from ..mechanisms import CONFIG_KEY, MECHANISMS
from .attention_taps import attention_modules, converted_layers


def worst_layers(errors: Mapping[str, float], count: int) -> list[int]:
    """The ``count`` layers of largest attention error (``errors``: layer index as a string -> error,
    as :func:`~hf_sliced_attn.conversion.fidelity.measure_fidelity` reports it), sorted by index.

    Raises ValueError when ``count`` would leave no converted layer, or is negative."""
    if count < 0:
        raise ValueError(f"The number of layers to keep on softmax must be >= 0, got {count}.")
    if count >= len(errors):
        raise ValueError(f"Keeping {count} layer(s) on softmax leaves none of the {len(errors)} converted layers "
                         "to convert: keep fewer.")
    ranked = sorted(errors, key=lambda layer: errors[layer], reverse=True)
    return sorted(int(layer) for layer in ranked[:count])


def restore_softmax_layers(model: nn.Module, layers: Sequence[int]) -> list[int]:
    """Return the attention layers ``layers`` of ``model`` (built for a mechanism; peft-wrapped or not)
    to the checkpoint's softmax attention, in place.

    Each such layer loses the mechanism's modules and is marked softmax (it then runs transformers'
    SDPA, within its window on ModernBERT's local layers). LoRA adapters inside it are reset to zero
    (peft's initialisation), so with frozen base weights, as attention transfer keeps them, the layer
    computes the checkpoint's attention again. ``model.config``'s saved options get the remaining
    converted layers as an explicit ``layers`` list. Returns that list.
    """
    config = model.config if hasattr(model, "config") else model.module.config
    saved = getattr(config, CONFIG_KEY, None)
    if saved is None:
        raise ValueError("The model is not built for a mechanism of hf_sliced_attn: it has no layer to restore.")
    modules, converted = attention_modules(model), converted_layers(model)
    unknown = sorted(set(layers) - set(converted))
    if unknown:
        raise ValueError(f"Layers {unknown} do not run {saved['mechanism']!r} (converted layers: {converted}).")
    plugin_names, restored = MECHANISMS.module_names(), set(layers)
    for index in sorted(restored):
        attention = modules[index]
        for name in plugin_names & set(dict(attention.named_children())):
            delattr(attention, name)
        setattr(attention, LAYER_MODE_ATTR, SOFTMAX)
        for adapted in attention.modules():
            if isinstance(adapted, LoraLayer):
                for adapter in adapted.active_adapters:
                    adapted.reset_lora_parameters(adapter, True)
    remaining = [index for index in converted if index not in restored]
    setattr(config, CONFIG_KEY, {**saved, "layers": remaining})
    return remaining
