"""ReLA on one converted layer: the op, then its gated RMSNorm over all heads; with a local window, the window's
softmax combined per head with that normalised output."""

from __future__ import annotations

import torch
from torch import nn

from ...ops import rela, rela_local_window_attention
from ..local_window import build_window_module, find_window_module
from .config import RelaConfig
from .modules import GatedRMSNorm

WINDOW_PREFIX = "rela"
"""The window module's attribute is ``rela_window_gate`` or ``rela_window_share``."""


def build_modules(options: RelaConfig, num_heads: int, head_dim: int, local: bool) -> dict[str, nn.Module]:
    """``rela_norm``, over the H*D features of all heads, on local and global layers alike; with a
    ``local_window``, the module of its ``window_combine`` on global layers."""
    return ({"rela_norm": GatedRMSNorm(num_heads * head_dim, eps=options.norm_eps)}
            | build_window_module(options, num_heads, local, WINDOW_PREFIX))


def attend(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_padding_mask: torch.Tensor | None, scaling: float | None,
           sliding_window: int | None) -> torch.Tensor:
    """ReLA, then ``module.rela_norm`` over the concatenated heads; on a layer with a window module, that
    normalised output combined with softmax within the window (the norm never rescales the window's softmax):
    (B, H, T, D) -> (B, T, H, D). A local layer (``sliding_window``) has no window module."""
    norm = module.rela_norm
    window = find_window_module(module, WINDOW_PREFIX)
    if window is not None:
        out = rela_local_window_attention(query, key, value, window(), key_padding_mask, norm_scale=norm.scale,
                                          norm_gate=norm.gate, norm_eps=norm.eps, window=window.window,
                                          combine=window.combine, scaling=scaling)
        return out.transpose(1, 2)
    out = rela(query, key, value, key_padding_mask, scaling=scaling, sliding_window=sliding_window).transpose(1, 2)
    batch, length, heads, head_dim = out.shape
    return norm(out.reshape(batch, length, heads * head_dim)).view(batch, length, heads, head_dim)
