"""Sliced ReLU attention on one converted layer: its modules around the op."""

from __future__ import annotations

import torch
from torch import nn

from ...ops import (
    local_window_attention,
    sliced_relu,
    sliced_relu_bump,
    value_mean,
    windowed_sliced_relu,
    windowed_sliced_relu_bump,
)
from ..base import Affine
from ..local_window import build_window_module, find_window_module
from .config import SlicedReluConfig
from .modules import (
    SlicedBandwidth,
    SlicedMLPProjection,
    SlicedOutputAffine,
    SlicedProjection,
    side_by_side_products,
)

WINDOW_PREFIX = "sliced"
"""The window module's attribute is ``sliced_window_gate`` or ``sliced_window_share``."""


def build_modules(options: SlicedReluConfig, num_heads: int, head_dim: int, local: bool) -> dict[str, nn.Module]:
    """``sliced_projection`` (linear or MLP), ``sliced_bandwidth`` for the bump kernel, with
    ``affine_output`` ``sliced_output``, and with a ``local_window`` the module of its ``window_combine``, on
    global layers only: a ``local`` layer (ModernBERT's sliding window) runs the windowed sliced kernel alone."""
    if options.projection == "mlp":
        projection = SlicedMLPProjection(num_heads, head_dim, options.num_slices,
                                         options.mlp_hidden_width(num_heads, head_dim))
    else:
        projection = SlicedProjection(num_heads, head_dim, options.num_slices)
    modules: dict[str, nn.Module] = {"sliced_projection": projection}
    if options.kernel == "bump":
        modules["sliced_bandwidth"] = SlicedBandwidth(num_heads, options.num_slices)
    if options.affine_output:
        modules["sliced_output"] = SlicedOutputAffine(num_heads)
    return modules | build_window_module(options, num_heads, local, WINDOW_PREFIX)


def attend(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_padding_mask: torch.Tensor | None, scaling: float | None,
           sliding_window: int | None) -> torch.Tensor:
    """Sliced ReLU attention with ``module.sliced_projection`` (the bump kernel when the layer has a
    ``sliced_bandwidth``), then ``module.sliced_output`` if the layer has one: (B, H, T, D) ->
    (B, T, H, D). On a global layer with a local-window module, that is combined with softmax over
    the keys within its window (:func:`~hf_sliced_attn.ops.local_window_attention`, with ``scaling``);
    otherwise ``scaling`` is unused (the kernels act on the projected scalars only). A local layer
    (``sliding_window``) runs the windowed sliced kernel; it has no local-window module."""
    query_scalars, key_scalars = module.sliced_projection(query, key, key_padding_mask)
    return _attend_projected(module, query, key, value, query_scalars, key_scalars, key_padding_mask, scaling,
                             sliding_window)


def folds_input(module: nn.Module, query: Affine, key: Affine, num_tokens: int) -> bool:
    """Whether :func:`attend_from_input` costs less than :func:`attend` after ``query`` and ``key`` on this layer:
    with a local window always (q, k and v come out of one product), else where the projection's fold pays."""
    if find_window_module(module, WINDOW_PREFIX) is not None:
        return True
    return module.sliced_projection.folds(num_tokens, query.in_features)


def attend_from_input(module: nn.Module, hidden_states: torch.Tensor, query: Affine, key: Affine,
                      value: Affine | nn.Module, key_padding_mask: torch.Tensor | None,
                      scaling: float | None) -> torch.Tensor:
    """:func:`attend` of q = ``query(hidden_states)``, k = ``key(hidden_states)`` and v = ``value(hidden_states)``
    (heads side by side) from the layer input (B, T, C) -> (B, T, H, D), on global layers without RoPE
    (:func:`folds_input`); ``value`` is its map (:class:`~hf_sliced_attn.mechanisms.base.Affine`) or, where its
    parameters do not say what it computes, the value module, called. Without a local window the projection folds
    into ``query`` and ``key`` (``sliced_projection.project_input``), q and k are never formed, and a linear
    projection's scalars come out of the value layer's product; with one, q, k, v (and a linear projection's
    scalars) come out of one product, and the window's softmax uses ``scaling``."""
    projection = module.sliced_projection
    batch, length, _ = hidden_states.shape
    windowed = find_window_module(module, WINDOW_PREFIX) is not None
    beside = ([query, key] if windowed else []) + ([value] if isinstance(value, Affine) else [])
    query_scalars = key_scalars = None
    if isinstance(projection, SlicedProjection):  # its scalars come out of the same product
        outputs, query_scalars, key_scalars = projection.project_input_beside(hidden_states, query, key, beside)
    else:
        outputs = side_by_side_products(hidden_states, beside) if beside else []

    def heads(tokens: torch.Tensor) -> torch.Tensor:  # (B, T, H*D) -> (B, H, T, D)
        return tokens.view(batch, length, projection.num_heads, projection.head_dim).transpose(1, 2)

    values = heads(outputs[-1] if isinstance(value, Affine) else value(hidden_states))
    if not windowed:
        if query_scalars is None:  # the MLP projection, folded into the query and key layers
            query_scalars, key_scalars = projection.project_input(hidden_states, query, key, key_padding_mask)
        return _attend_scalars(module, query_scalars, key_scalars, values, key_padding_mask, None)
    queries, keys = heads(outputs[0]), heads(outputs[1])
    if query_scalars is None:  # the MLP projection, on the q and k the window needs anyway
        query_scalars, key_scalars = projection(queries, keys, key_padding_mask)
    return _attend_projected(module, queries, keys, values, query_scalars, key_scalars, key_padding_mask, scaling,
                             None)


def _attend_projected(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      query_scalars: torch.Tensor, key_scalars: torch.Tensor, key_padding_mask: torch.Tensor | None,
                      scaling: float | None, sliding_window: int | None) -> torch.Tensor:
    """:func:`attend` once the scalars (B, H, M, T) are projected."""
    window = find_window_module(module, WINDOW_PREFIX)
    if window is None:
        return _attend_scalars(module, query_scalars, key_scalars, value, key_padding_mask, sliding_window)
    shared = window.combine == "shared"
    sliced = _sliced_term(module, query_scalars, key_scalars, value, key_padding_mask, None, shared)
    sliced, denominator = sliced if shared else (sliced, None)
    out = local_window_attention(query, key, value, sliced, window(), key_padding_mask,
                                 window=window.window, combine=window.combine, denominator=denominator,
                                 scaling=scaling)
    return out.transpose(1, 2)


def _sliced_term(module: nn.Module, query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor,
                 key_padding_mask: torch.Tensor | None, sliding_window: int | None,
                 return_denominator: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The kernel on the projected scalars (B, H, M, T), then ``module.sliced_output``: -> (B, H, T, D);
    with ``return_denominator`` (global layers only) also the kernel's normaliser (B, H, M, T)."""
    denominator = {"return_denominator": True} if return_denominator else {}
    bandwidth = getattr(module, "sliced_bandwidth", None)
    if bandwidth is not None:
        b = bandwidth().to(query_scalars.dtype)
        if sliding_window is None:
            out = sliced_relu_bump(query_scalars, key_scalars, value, b, key_padding_mask, **denominator)
        else:
            out = windowed_sliced_relu_bump(query_scalars, key_scalars, value, b, key_padding_mask,
                                            sliding_window=sliding_window)
    elif sliding_window is None:
        out = sliced_relu(query_scalars, key_scalars, value, key_padding_mask, **denominator)
    else:
        out = windowed_sliced_relu(query_scalars, key_scalars, value, key_padding_mask, sliding_window=sliding_window)
    out, den = out if return_denominator else (out, None)
    affine = getattr(module, "sliced_output", None)
    if affine is not None:
        out = affine(out, value_mean(value, key_padding_mask, sliding_window=sliding_window))
    return (out, den) if return_denominator else out


def _attend_scalars(module: nn.Module, query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor,
                    key_padding_mask: torch.Tensor | None, sliding_window: int | None) -> torch.Tensor:
    """The kernel on the projected scalars (B, H, M, T), then ``module.sliced_output``: -> (B, T, H, D)."""
    return _sliced_term(module, query_scalars, key_scalars, value, key_padding_mask, sliding_window).transpose(1, 2)
