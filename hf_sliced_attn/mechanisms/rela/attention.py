"""ReLA on one converted layer: the op, then its gated RMSNorm over all heads."""

from __future__ import annotations

import torch
from torch import nn

from ...ops import rela
from .config import RelaConfig
from .modules import GatedRMSNorm


def build_modules(options: RelaConfig, num_heads: int, head_dim: int, local: bool) -> dict[str, nn.Module]:
    """``rela_norm``, over the H*D features of all heads, on local and global layers alike."""
    return {"rela_norm": GatedRMSNorm(num_heads * head_dim, eps=options.norm_eps)}


def attend(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_padding_mask: torch.Tensor | None, scaling: float | None,
           sliding_window: int | None) -> torch.Tensor:
    """ReLA, then ``module.rela_norm`` over the concatenated heads: (B, H, T, D) -> (B, T, H, D)."""
    out = rela(query, key, value, key_padding_mask, scaling=scaling, sliding_window=sliding_window).transpose(1, 2)
    batch, length, heads, head_dim = out.shape
    return module.rela_norm(out.reshape(batch, length, heads * head_dim)).view(batch, length, heads, head_dim)
