"""ModernBERT: alternating global and local (sliding-window) layers, RoPE applied before attention.

``config.layer_types[i]`` is "sliding_attention" on local layers; transformers passes
them ``sliding_window = config.sliding_window + 1`` (pairs with |i - j| <= w - 1).
"""

from __future__ import annotations

from torch import nn
from transformers import ModernBertConfig
from transformers.models.modernbert.modeling_modernbert import ModernBertAttention, ModernBertPreTrainedModel

from .spec import ArchitectureSpec

# peft has no default targets for ModernBERT: the fused qkv projection and the output projection.
LORA_TARGETS = r".*\.attn\.(Wqkv|Wo)"


def _head_shape(module: nn.Module) -> tuple[int, int]:
    return module.config.num_attention_heads, module.head_dim


def _is_local_layer(config: ModernBertConfig, layer_idx: int) -> bool:
    return config.layer_types[layer_idx] == "sliding_attention"


SPECS = [
    ArchitectureSpec(
        "modernbert", ModernBertConfig, ModernBertPreTrainedModel, (ModernBertAttention,), LORA_TARGETS,
        _head_shape, _is_local_layer,
    )
]
