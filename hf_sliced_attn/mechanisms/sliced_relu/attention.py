"""Sliced ReLU attention on one converted layer: its modules around the op."""

from __future__ import annotations

import torch
from torch import nn

from ...ops import sliced_relu, value_mean, windowed_sliced_relu
from .config import SlicedReluConfig
from .modules import SlicedMLPProjection, SlicedOutputAffine, SlicedProjection


def build_modules(options: SlicedReluConfig, num_heads: int, head_dim: int) -> dict[str, nn.Module]:
    """``sliced_projection`` (linear or MLP) and, with ``affine_output``, ``sliced_output``."""
    projection = SlicedMLPProjection if options.projection == "mlp" else SlicedProjection
    modules: dict[str, nn.Module] = {"sliced_projection": projection(num_heads, head_dim, options.num_slices)}
    if options.affine_output:
        modules["sliced_output"] = SlicedOutputAffine(num_heads)
    return modules


def attend(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_padding_mask: torch.Tensor | None, scaling: float | None,
           sliding_window: int | None) -> torch.Tensor:
    """Sliced ReLU attention with ``module.sliced_projection``, then ``module.sliced_output`` if the
    layer has one: (B, H, T, D) -> (B, T, H, D). ``scaling`` is unused (the kernel is scale-free)."""
    query_scalars, key_scalars = module.sliced_projection(query, key)
    if sliding_window is None:
        out = sliced_relu(query_scalars, key_scalars, value, key_padding_mask)
    else:
        out = windowed_sliced_relu(query_scalars, key_scalars, value, key_padding_mask, sliding_window=sliding_window)
    affine = getattr(module, "sliced_output", None)
    if affine is not None:
        out = affine(out, value_mean(value, key_padding_mask, sliding_window=sliding_window))
    return out.transpose(1, 2)
