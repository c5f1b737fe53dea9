"""DistilBERT: BERT distilled to half its layers (encoder; every layer is global).

Its self-attention module (``DistilBertSelfAttention``: ``q_lin``, ``k_lin``, ``v_lin``, the attention function,
then ``out_lin``) is built without its layer index, so the layer stack (``Transformer``) numbers the modules it
builds and gives them the new modules. A mechanism may attend from the input, ``out_lin`` after it.
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


def _input_projections(module: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    return module.q_lin, module.k_lin, module.v_lin


def _output_layer(module: nn.Module) -> nn.Module:
    return module.out_lin


SPECS = [
    ArchitectureSpec(
        "distilbert", DistilBertConfig, DistilBertPreTrainedModel, (DistilBertSelfAttention,), LORA_TARGETS,
        _head_shape, every_layer_global, _input_projections, layer_stack=(Transformer, _attention_modules),
        output_layer=_output_layer,
    )
]
