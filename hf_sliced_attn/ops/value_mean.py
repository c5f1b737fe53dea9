"""The mean value each query can see, in O(T * D): vbar_i = mean of v_j over the valid keys of i.

Without a window, every query sees every valid key and vbar is one (B, H, 1, D) row. With
``sliding_window`` w, query i sees the valid keys with |i - j| <= w - 1; prefix sums of
the masked values and of the key counts give each window's sum as a difference of two
rows, so the cost stays O(T * D) whatever w is. A query with no valid key gets 0.

Shapes: value (B, H, T, D); key_padding_mask (B, T) bool, True = real ->
(B, H, 1, D) without a window, (B, H, T, D) with one; in value's dtype (fp16/bf16 are
summed in fp32). Plain torch ops: autograd gives the gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import check_key_padding_mask, check_sliding_window, compute_dtype

__all__ = ["value_mean"]


def value_mean(
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Mean of ``value`` over the valid keys each query sees (see the module doc)."""
    if value.dim() != 4:
        raise ValueError(f"value must be (B, H, T, D), got {tuple(value.shape)}")
    batch, _, length, _ = value.shape
    check_key_padding_mask(key_padding_mask, batch, length)
    check_sliding_window(sliding_window)
    dtype = compute_dtype(value.dtype)
    v = value.to(dtype)
    if sliding_window is None:
        return _global_mean(v, key_padding_mask).to(value.dtype)
    if key_padding_mask is None:
        keys = torch.ones(1, 1, length, 1, dtype=dtype, device=value.device)
    else:
        keys = key_padding_mask.to(dtype)[:, None, :, None]  # (B, 1, T, 1)
        v = v * keys
    total, count = _window_sums(v, sliding_window), _window_sums(keys, sliding_window)
    return (total / count.clamp_min(1)).to(value.dtype)


def _global_mean(v: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, H, 1, D): the mean of v (B, H, T, D) over the valid keys, as one (1, T) @ (T, H*D)
    product per batch on the tokens (a view of the (B, T, H, D) buffers attention layers hold):
    no masked or transposed copy of v."""
    if key_padding_mask is None:
        return v.mean(2, keepdim=True)
    batch, heads, length, dim = v.shape
    keys = key_padding_mask.to(v.dtype)  # (B, T)
    weights = keys / keys.sum(-1, keepdim=True).clamp_min(1)
    tokens = v.transpose(1, 2).reshape(batch, length, heads * dim)
    return torch.bmm(weights[:, None, :], tokens).view(batch, 1, heads, dim).transpose(1, 2)


def _window_sums(x: torch.Tensor, window: int) -> torch.Tensor:
    """Row i of the result is the sum of x's rows j (dim 2, size T) with |i - j| <= window - 1."""
    length = x.shape[2]
    prefix = F.pad(x.cumsum(2), (0, 0, 1, 0))  # (..., T + 1, C): prefix[k] = sum of rows < k
    rows = torch.arange(length, device=x.device)
    end = (rows + window).clamp(max=length)  # one past the last row in the window
    start = (rows - window + 1).clamp(min=0)
    return prefix.index_select(2, end) - prefix.index_select(2, start)
