"""What the plugin needs to know about one architecture."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


def every_layer_global(config: PretrainedConfig, layer_idx: int) -> bool:
    """``is_local_layer`` of an architecture without sliding-window layers."""
    return False


@dataclass(frozen=True)
class ArchitectureSpec:
    """How to convert one transformers architecture.

    Attributes:
        model_type: ``config.model_type`` of the architecture.
        config_class: its config class (its ``to_dict`` gains the saved ``attn_implementation``).
        pretrained_class: its ``PreTrainedModel`` base (its ``_init_weights`` initialises the new modules).
        attention_classes: the self-attention classes; their modules gain the new modules at construction.
        lora_target_modules: peft ``target_modules`` for the attention projections.
        head_shape: (module) -> (num_heads, head_dim) of a built attention module.
        is_local_layer: (config, layer_idx) -> whether that layer attends within a sliding window.
        input_projections: (module) -> its query, key and value layers, for architectures whose attention
            forward is only: q, k, v = these layers of the input viewed as (B, H, T, D), the attention
            function, and its (B, T, H*D) output with no weights (or that output through ``output_layer``).
            Mechanisms with an :class:`~hf_sliced_attn.mechanisms.InputAttention` then attend from the input.
            None where q and k are transformed before attention (RoPE).
        layer_stack: for architectures whose attention modules are built without their layer index (``layer_idx``):
            the module class that builds the layers, and (that module) -> its attention modules in layer order.
            Its construction then numbers them and gives them the new modules; None where each attention module
            is built with its ``layer_idx`` (its own construction gives it the new modules).
        output_layer: (module) -> the layer its forward applies to the attention's (B, T, H*D) output before
            returning it (DistilBERT's ``out_lin``); None where it returns that output as it is.
    """

    model_type: str
    config_class: type[PretrainedConfig]
    pretrained_class: type[PreTrainedModel]
    attention_classes: tuple[type[nn.Module], ...]
    lora_target_modules: str
    head_shape: Callable[[nn.Module], tuple[int, int]]
    is_local_layer: Callable[[PretrainedConfig, int], bool]
    input_projections: Callable[[nn.Module], tuple[nn.Module, nn.Module, nn.Module]] | None = None
    layer_stack: tuple[type[nn.Module], Callable[[nn.Module], Sequence[nn.Module]]] | None = None
    output_layer: Callable[[nn.Module], nn.Module] | None = None
