"""Attention taps: record (or replace) every attention layer's output, and compare token tensors
over real tokens. Attention transfer trains on them; the fidelity report measures with them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from ..attention import LAYER_MODE_ATTR, SOFTMAX
from ..models import spec_for


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a (possibly peft- or DDP-wrapped) supported model, in layer order."""
    config = model.config if hasattr(model, "config") else model.module.config
    classes = spec_for(config.model_type).attention_classes
    return [module for module in model.modules() if isinstance(module, classes)]


def converted_layers(student: nn.Module) -> list[int]:
    """Indices (into :func:`attention_modules`) of the layers that run the new mechanism."""
    return [i for i, m in enumerate(attention_modules(student)) if getattr(m, LAYER_MODE_ATTR, SOFTMAX) != SOFTMAX]


@contextmanager
def tap_attention(model: nn.Module, replace_with: Sequence[torch.Tensor] | None = None) -> Iterator[list[torch.Tensor]]:
    """Record each attention module's output tensor in the yielded list (one per layer, in order).

    With ``replace_with`` (tensors of the same shapes, same order), each module's output is
    replaced by the given one, so the rest of the model sees it (teacher forcing).
    """
    outputs: list[torch.Tensor] = []
    handles = []
    for index, module in enumerate(attention_modules(model)):
        def hook(module, args, output, index=index):
            outputs.append(output[0])
            if replace_with is not None:
                return (replace_with[index], *output[1:])
            return None

        handles.append(module.register_forward_hook(hook))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def token_mask(attention_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 mask -> (B, T, 1) float in ``like``'s dtype."""
    return attention_mask.to(like.dtype).unsqueeze(-1)


def masked_mse(student: torch.Tensor, teacher: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real tokens of (B, T, C) tensors."""
    mask = token_mask(attention_mask, student)
    return ((student - teacher).pow(2) * mask).sum() / (mask.sum() * student.shape[-1])


def masked_cosine_distance(student: torch.Tensor, teacher: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """1 - mean cosine similarity over the real tokens of (B, T, C) tensors."""
    cosine = nn.functional.cosine_similarity(student, teacher, dim=-1)
    mask = attention_mask.to(cosine.dtype)
    return 1.0 - (cosine * mask).sum() / mask.sum()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, C) hidden states -> (B, C) mean over real tokens."""
    mask = token_mask(attention_mask, hidden)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

