"""Gated RMS norm, the normalisation applied to ReLA's output (arXiv 2104.07012, eq. 5).

Over the last dimension of x (..., D), with learnable scale g and gate w (both (D,) or any
shape broadcastable to x):

    y = g ⊙ x · rsqrt(mean_d(x_d^2) + eps) ⊙ sigmoid(w ⊙ x).

float16/bfloat16 inputs are computed in float32 and returned in x's dtype. With eps > 0 an
all-zero row gives exactly 0 (and finite gradients) rather than 0 · inf = NaN.
"""

from __future__ import annotations

import torch

from ._common import compute_dtype

__all__ = ["gated_rms_norm"]


def gated_rms_norm(
    x: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """y = scale * x * rsqrt(mean(x^2, -1) + eps) * sigmoid(gate * x); same shape and dtype as x.

    Args:
        x: (..., D).
        scale, gate: (D,) or broadcastable to x's shape.
        eps: added to the mean square; must be > 0.
    """
    if x.dim() == 0:
        raise ValueError("x must have shape (..., D), got a 0-d tensor")
    for name, param in (("scale", scale), ("gate", gate)):
        try:
            broadcast = torch.broadcast_shapes(param.shape, x.shape)
        except RuntimeError:
            broadcast = None
        if broadcast != x.shape:
            raise ValueError(
                f"{name} must have shape (D,) = ({x.shape[-1]},) or broadcast to x's shape "
                f"{tuple(x.shape)}, got {tuple(param.shape)}"
            )
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    dtype = compute_dtype(x.dtype)
    x_c = x.to(dtype)
    inv_rms = torch.rsqrt(x_c.pow(2).mean(-1, keepdim=True) + eps)
    y = x_c * inv_rms * scale.to(dtype) * torch.sigmoid(gate.to(dtype) * x_c)
    return y.to(x.dtype)
