"""Plumbing every op shares: the compute dtype, argument checks and the sliding window's pairs.

Conventions (the same in every op and reference of this package):

* ``key_padding_mask`` is a (B, Tk) bool tensor, True for a real token.
* ``sliding_window`` w keeps the pairs (i, j) with |i - j| <= w - 1, query i and key j
  indexed from 0 in their own sequences (what ModernBERT's local layers pass). None keeps
  every pair. Any other value than None or an int >= 1 is rejected, by every op, with the
  message of :func:`check_sliding_window`.
* float16 / bfloat16 inputs are computed in float32 and returned in their dtype.
"""

from __future__ import annotations

import torch

__all__ = [
    "band_mask",
    "check_key_padding_mask",
    "check_sliding_window",
    "compute_dtype",
    "key_range",
    "pair_mask",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an op computes in: float32 for float16/bfloat16, the dtype itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_sliding_window(sliding_window: int | None, *, required: bool = False) -> None:
    """Raise ValueError unless ``sliding_window`` is an int >= 1, or None when not ``required``.

    Every op raises the same message for the same bad value; a windowed op given None says that
    it needs a window.
    """
    if sliding_window is None:
        if required:
            raise ValueError("sliding_window is required by this windowed op: give an int >= 1 (it keeps the "
                             "pairs with |i - j| <= sliding_window - 1)")
        return
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
        raise ValueError(
            f"sliding_window must be None or an int >= 1 (it keeps the pairs with |i - j| <= sliding_window - 1), "
            f"got {sliding_window!r}"
        )


def check_key_padding_mask(key_padding_mask: torch.Tensor | None, batch: int, k_len: int) -> None:
    """Raise ValueError unless ``key_padding_mask`` is None or (B, Tk) = (batch, k_len)."""
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, k_len):
        raise ValueError(
            f"key_padding_mask must have shape (B, Tk) = {(batch, k_len)}, got {tuple(key_padding_mask.shape)}"
        )


def key_range(start: int, end: int, k_len: int, sliding_window: int | None) -> tuple[int, int]:
    """Keys [lo, hi) that queries [start, end) may reach (all Tk keys without a window)."""
    if sliding_window is None:
        return 0, k_len
    return max(0, start - sliding_window + 1), min(k_len, end + sliding_window - 1)


def band_mask(
    start: int, end: int, lo: int, hi: int, sliding_window: int | None, device: torch.device
) -> torch.Tensor | None:
    """(end - start, hi - lo) bool: True where query i in [start, end) and key j in [lo, hi)
    satisfy |i - j| <= w - 1. None when every pair of the block is inside (or no window)."""
    if sliding_window is None:
        return None
    if end - 1 - lo <= sliding_window - 1 and hi - 1 - start <= sliding_window - 1:
        return None
    i = torch.arange(start, end, device=device)[:, None]
    j = torch.arange(lo, hi, device=device)[None, :]
    return (i - j).abs() <= sliding_window - 1


def pair_mask(
    batch: int, q_len: int, k_len: int, key_padding_mask: torch.Tensor | None,
    sliding_window: int | None, device: torch.device,
) -> torch.Tensor:
    """(B, 1, Tq, Tk) bool: True where query i may interact with key j (real key, in the window)."""
    mask = torch.ones(batch, 1, q_len, k_len, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :].bool()
    band = band_mask(0, q_len, 0, k_len, sliding_window, device)
    return mask if band is None else mask & band
