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


class SlicedMLPProjection(nn.Module):
    """The projection of the authors' code (SiwanB/Sliced_ReLU_Attention): one MLP over all heads.

    The queries of a token, concatenated over heads (H*D), go through
    ``hidden`` Linear(H*D, H*D) -> GELU -> ``to_scalars`` Linear(H*D, H*M), which gives the M
    scalars of every head; keys go through the same MLP. For queries (B, H, Tq, D) and keys
    (B, H, Tk, D) it returns s (B, H, M, Tq) and t (B, H, M, Tk), like :class:`SlicedProjection`.
    The order it induces on the keys is a nonlinear function of all heads' keys.
    """

    def __init__(self, num_heads: int, head_dim: int, num_slices: int = 1) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.num_slices = num_heads, head_dim, num_slices
        width = num_heads * head_dim
        self.hidden = nn.Linear(width, width)
        self.activation = nn.GELU()
        self.to_scalars = nn.Linear(width, num_heads * num_slices)

    def _scalars(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, D) -> (B, H, M, T)."""
        batch, heads, length, head_dim = x.shape
        tokens = x.transpose(1, 2).reshape(batch, length, heads * head_dim)
        scalars = self.to_scalars(self.activation(self.hidden(tokens)))  # (B, T, H*M)
        return scalars.view(batch, length, heads, self.num_slices).permute(0, 2, 3, 1)

    def forward(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._scalars(query), self._scalars(key)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, num_slices={self.num_slices}"


class SlicedOutputAffine(nn.Module):
    """A learned per-head gain on the sliced ReLU output, plus a learned share of the mean value.

    out_h = gain_h * attention_h + mean_weight_h * vbar_h, with attention (B, H, T, D), vbar
    (B, H, T or 1, D) the mean value the query sees, and ``gain``, ``mean_weight`` (H,).
    The kernel weights ReLU(s_i - t_j) / sum_l |s_i - t_l| add up to at most 1 (1/2 for a
    median query) and act on centred values, while softmax weights add up to 1 and keep
    the mean value: ``gain`` starts at 2, the constant of the authors' code, and
    ``mean_weight`` at 1, so a converted layer starts from the full mean value.
    """

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.gain = nn.Parameter(torch.empty(num_heads))
        self.mean_weight = nn.Parameter(torch.empty(num_heads))

    def forward(self, attention: torch.Tensor, value_mean: torch.Tensor) -> torch.Tensor:
        gain = self.gain.to(attention.dtype)[:, None, None]
        mean_weight = self.mean_weight.to(attention.dtype)[:, None, None]
        return gain * attention + mean_weight * value_mean

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


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
