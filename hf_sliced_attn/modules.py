"""The small named modules the plugin adds to each converted attention layer.

Every new parameter lives in one of these, so that peft's ``modules_to_save`` can train
them by name and the model's ``_init_weights`` initialises them (see
:func:`hf_sliced_attn.integration.init_plugin_module`). They hold parameters and apply
them; the maths is in :mod:`hf_sliced_attn.ops`.
"""

from __future__ import annotations

import torch
from torch import nn

from .ops import gated_rms_norm


class SlicedProjection(nn.Module):
    """The learned directions of sliced ReLU attention: M per head.

    ``directions`` is (H, M, D). For queries (B, H, Tq, D) and keys (B, H, Tk, D) it gives
    the scalars s = <w_hm, q_i> (B, H, M, Tq) and t = <w_hm, k_j> (B, H, M, Tk); queries
    and keys share the same directions.
    """

    def __init__(self, num_heads: int, head_dim: int, num_slices: int = 1) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_slices = num_heads, head_dim, num_slices
        self.directions = nn.Parameter(torch.empty(num_heads, num_slices, head_dim))

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        directions = self.directions.to(query.dtype)
        return (
            torch.einsum("bhtd,hmd->bhmt", query, directions),
            torch.einsum("bhtd,hmd->bhmt", key, directions),
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_slices={self.num_slices}"


class GatedRMSNorm(nn.Module):
    """ReLA's gated RMSNorm over all heads together (arXiv 2104.07012, eq. 5).

    y = scale * x * rsqrt(mean(x^2) + eps) * sigmoid(gate * x), over the last dim of x
    (..., H*D). ``scale`` starts at ones; ``gate`` starts small and random (normal with
    the model's initializer_range), so the gate opens at about sigmoid(0) = 1/2 and learns
    per feature, as in the authors' code.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.scale = nn.Parameter(torch.empty(hidden_size))
        self.gate = nn.Parameter(torch.empty(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, self.scale, self.gate, self.eps)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.eps}"
