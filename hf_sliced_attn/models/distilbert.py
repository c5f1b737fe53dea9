"""DistilBERT: BERT distilled to half its layers (encoder; every layer is global).

Its self-attention module (``DistilBertSelfAttention``: ``q_lin``, ``k_lin``, ``v_lin``, the attention function,
then ``out_lin``) is built without its layer index, so the layer stack (``Transformer``) numbers the modules it
builds and gives them the new modules. The output layer inside the module keeps it off the input fold.
"""

from __future__ import annotations

from torch import nn
from transformers import DistilBertConfig
from transformers.models.distilbert.modeling_distilbert import (
    DistilBertPreTrainedModel,
    DistilBertSelfAttention,
    Transformer,
)

from .spec import ArchitectureSpec, every_layer_global

# q, k, v and the attention output projection; not the feed-forward's layers.
LORA_TARGETS = r".*\.attention\.(q_lin|k_lin|v_lin|out_lin)"


def _head_shape(module: nn.Module) -> tuple[int, int]:
    return module.n_heads, module.attention_head_size


def _attention_modules(stack: nn.Module) -> list[nn.Module]:
    return [block.attention for block in stack.layer]


SPECS = [
    ArchitectureSpec(
        "distilbert", DistilBertConfig, DistilBertPreTrainedModel, (DistilBertSelfAttention,), LORA_TARGETS,
        _head_shape, every_layer_global, layer_stack=(Transformer, _attention_modules),
    )
]
