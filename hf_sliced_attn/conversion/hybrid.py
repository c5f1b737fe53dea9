"""Hybrid encoders: softmax attention kept on the layers whose attention transfers worst.

After attention transfer, each converted layer ``l`` has a relative attention error
e_l = ‖a_l − â_l‖ / ‖â_l‖ against its softmax teacher (fed the teacher's inputs; see
:func:`hf_sliced_attn.conversion.fidelity.measure_fidelity`). Keeping the ``k`` layers of largest e_l on
softmax closes most of the accuracy gap at the cost of ``k`` quadratic layers.
:func:`worst_layers` chooses them (``hf-sliced-attn convert --keep-softmax-layers`` and the GLUE
recipe's ``--keep_softmax_layers`` both call it); :func:`restore_softmax_layers` turns chosen
layers of a converted model back into the checkpoint's softmax layers, in place. The converted
layers that remain are saved in config.json as an explicit ``layers`` list, like every option.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def restore_softmax_layers(model: nn.Module, original: nn.Module, layers: Sequence[int]) -> list[int]:
    """Return the attention layers ``layers`` of ``model`` (built for a mechanism) to softmax attention.

    Each such layer loses the mechanism's modules, is marked softmax (it then runs transformers'
    SDPA, within its window on ModernBERT's local layers) and takes back the attention weights of
    ``original``, the softmax checkpoint (the same architecture: its attention modules are matched
    by layer index). ``model.config``'s saved options get the remaining converted layers as an
    explicit ``layers`` list. Returns that list.
    """
    config = model.config
    saved = getattr(config, CONFIG_KEY, None)
    if saved is None:
        raise ValueError("The model is not built for a mechanism of hf_sliced_attn: it has no layer to restore.")
    modules, originals = attention_modules(model), attention_modules(original)
    converted = converted_layers(model)
    unknown = sorted(set(layers) - set(converted))
    if unknown:
        raise ValueError(f"Layers {unknown} do not run {saved['mechanism']!r} (converted layers: {converted}).")
    plugin_names, restored = MECHANISMS.module_names(), set(layers)
    for index in sorted(restored):
        attention = modules[index]
        for name in plugin_names & set(dict(attention.named_children())):
            delattr(attention, name)
        setattr(attention, LAYER_MODE_ATTR, SOFTMAX)
        attention.load_state_dict(originals[index].state_dict())
    remaining = [index for index in converted if index not in restored]
    setattr(config, CONFIG_KEY, {**saved, "layers": remaining})
    return remaining
