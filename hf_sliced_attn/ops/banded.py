"""Sliding-window (banded) attention ops in O(T * w) time and memory.

ModernBERT's local layers let query i see key j only when |i - j| <= w - 1, with
w = ``sliding_window``. The ops here never build the (T, T) pair matrix. The T queries
are cut into ``nb = ceil(T / block)`` blocks of ``block`` queries; block n holds the
queries ``n * block + r`` (r < block), and every key any of them can see lies in the
band of ``L = block + 2 (w - 1)`` positions starting at ``n * block - (w - 1)``. The band
of every block is gathered at once with padding + :meth:`torch.Tensor.unfold` (a view),
so each op is a few batched tensor ops on (..., nb, block, L) tensors, with no Python
loop over blocks. Query r of a block and band position l of the same block are the pair
(i, j) = (n * block + r, n * block - (w - 1) + l); it is valid when

    0 <= l - r <= 2 (w - 1)          (the window: |i - j| <= w - 1),
    0 <= j < T                        (the sequence ends),
    key_padding_mask[b, j]            (a real key).

Pairs and gathered bands number B * H * nb * block * L = O(T * w) per head (and slice),
and the gathered values B * H * nb * L * D = O(T * D * (1 + 2 (w - 1) / block)).

Ops (self-attention only: queries and keys share the length T):

* :func:`windowed_sliced_relu`, the sliced ReLU kernel (arXiv 2512.11411) in the window.
  With s the query scalars and t the key scalars of one head and slice,

      out_i = sum_j ReLU(s_i - t_j) (v_j - vbar_i) / sum_l |s_i - t_l|,

  j and l over the valid keys of i's window, vbar_i their mean value; a zero denominator
  gives 0.
* :func:`windowed_sliced_relu_bump`, the sliced bump kernel (SiwanB/Sliced_ReLU_Attention)
  in the window. With b > 0 the bandwidth of the head (and slice),

      out_i = (1 / n_i) sum_j max(0, 1 - |s_i - t_j| / b) v_j,

  j over the valid keys of i's window and n_i their number; a query with no valid key
  gives 0. Its bandwidth is (H,) for (B, H, T) scalars, (H, M) for (B, H, M, T).

  Both sliced ops share the band gathering: from the in-band differences d_ij = s_i - t_j
  a small kernel function gives the (B, H, nb, block, L) weights W, the M slices averaged,
  and out_i = sum_j W_ij v_j, one batched product. For the ReLU kernel
  W_ij = c_ij - (sum_l c_il) / n_i with c_ij = mean_m ReLU(d_mij) / sum_l |d_mil| (the
  second term subtracts vbar_i); for the bump kernel W_ij = mean_m max(0, 1 - |d_mij| / b_m) / n_i;
  both 0 on invalid pairs. Shapes: scalars (B, H, T) or (B, H, M, T), value (B, H, T, D)
  -> (B, H, T, D).
* :func:`windowed_softmax`, softmax(q k^T * scaling) v over the valid keys of the window;
  a query with no valid key gives 0. Shapes: (B, H, T, D) each -> (B, H, T, D). With
  ``return_lse`` it also gives each query's log-normaliser log sum_j exp(q_i . k_j * scaling),
  (B, H, T), which :mod:`.local_window` combines with a global kernel. On CPU it runs the C++
  kernel of :mod:`.windowed_softmax_cpu` (one pass over each query's window, no gathered band)
  where that builds; the band gathering above is its torch implementation, for other devices.

``key_padding_mask`` is (B, T), True for a real token. float16 / bfloat16 inputs are
computed in float32 and returned in their dtype; float32 and float64 are computed as is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from . import windowed_softmax_cpu
from ._common import band_mask, check_key_padding_mask, check_sliding_window, compute_dtype

__all__ = ["windowed_sliced_relu", "windowed_sliced_relu_bump", "windowed_softmax"]


def _band(x: torch.Tensor, block: int, halo: int, dim: int) -> torch.Tensor:
    """Key bands of every query block along ``dim`` (size T) of ``x``.

    Pads ``dim`` with ``halo`` zeros (False for bool) in front and up to
    ``nb * block + halo`` behind, then unfolds it: ``dim`` becomes the two dims
    (nb, L = block + 2 halo), band n being positions [n * block - halo, n * block + block + halo).
    A view of the padded tensor.
    """
    dim = dim % x.dim()
    length = x.shape[dim]
    n_blocks = -(-length // block)
    pad = [0, 0] * (x.dim() - 1 - dim) + [halo, n_blocks * block - length + halo]
    padded = F.pad(x, pad) if x.dtype != torch.bool else F.pad(x.to(torch.uint8), pad).bool()
    return padded.unfold(dim, block + 2 * halo, block).movedim(-1, dim + 1)


def _blocks(x: torch.Tensor, block: int, dim: int) -> torch.Tensor:
    """Split ``dim`` (size T) of ``x`` into (nb, block), zero-padding T up to nb * block."""
    return _band(x, block, 0, dim)


def _valid_pairs(
    key_padding_mask: torch.Tensor | None, batch: int, length: int, window: int, block: int,
    device: torch.device,
) -> torch.Tensor:
    """(B or 1, nb, block, L) bool: True where query r of block n may see band position l."""
    halo = window - 1
    keys = torch.ones(1, length, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        keys = key_padding_mask.bool()
    key_ok = _band(keys, block, halo, dim=1)[:, :, None, :]  # (B, nb, 1, L); False outside [0, T)
    # Query r of a block sits at band position halo + r: the window is |halo + r - l| <= w - 1.
    in_window = band_mask(halo, halo + block, 0, block + 2 * halo, window, device)  # (block, L) or None
    return key_ok.expand(-1, -1, block, -1) if in_window is None else key_ok & in_window


def _check(
    q_len: int, k_len: int, value: torch.Tensor, key_padding_mask: torch.Tensor | None,
    sliding_window: int, block_size: int | None,
) -> int:
    """Validate the arguments every op shares; return the block size."""
    check_sliding_window(sliding_window, required=True)
    block = sliding_window if block_size is None else block_size
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block!r}")
    if q_len != k_len:
        raise ValueError(
            f"queries and keys must have the same length (self-attention only), got Tq={q_len}, Tk={k_len}"
        )
    if value.dim() != 4 or value.shape[2] != k_len:
        raise ValueError(f"value must be (B, H, T, D) with T={k_len}, got {tuple(value.shape)}")
    check_key_padding_mask(key_padding_mask, value.shape[0], k_len)
    return block


def _check_scalars(
    query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor,
    key_padding_mask: torch.Tensor | None, sliding_window: int, block_size: int | None,
) -> int:
    """Validate the arguments of the scalar-kernel ops; return the block size."""
    if query_scalars.dim() != key_scalars.dim() or query_scalars.dim() not in (3, 4):
        raise ValueError(
            "query_scalars and key_scalars must both be (B, H, T) or (B, H, M, T), "
            f"got {tuple(query_scalars.shape)} and {tuple(key_scalars.shape)}"
        )
    block = _check(query_scalars.shape[-1], key_scalars.shape[-1], value, key_padding_mask, sliding_window, block_size)
    if query_scalars.shape != key_scalars.shape or query_scalars.shape[:2] != value.shape[:2]:
        raise ValueError(
            f"scalars {tuple(query_scalars.shape)} / {tuple(key_scalars.shape)} do not match "
            f"value (B, H, T, D) = {tuple(value.shape)}"
        )
    return block


def _scalar_kernel_attention(
    query_scalars: torch.Tensor, key_scalars: torch.Tensor, value: torch.Tensor,
    key_padding_mask: torch.Tensor | None, sliding_window: int, block: int,
    weights: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """out_i = sum_j W_ij v_j over the band of i's block, for checked arguments.

    ``weights(diff, valid)`` gives W (B, H, nb, block, L) from the in-band differences
    diff = s_i - t_j (B, H, M, nb, block, L), 0 on invalid pairs, and the pair validity
    valid (B, 1, 1, nb, block, L) bool; it averages the M slices and must be 0 on invalid
    pairs. Returns (B, H, T, D) in value's dtype.
    """
    dtype = compute_dtype(value.dtype)
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
    batch, _, length, _ = value.shape
    halo = sliding_window - 1
    s = _blocks(query_scalars.to(dtype), block, dim=-1)  # (B, H, M, nb, block)
    t = _band(key_scalars.to(dtype), block, halo, dim=-1)  # (B, H, M, nb, L)
    v = _band(value.to(dtype), block, halo, dim=2)  # (B, H, nb, L, D)
    valid = _valid_pairs(key_padding_mask, batch, length, sliding_window, block, value.device)
    valid = valid[:, None, None]  # (B, 1, 1, nb, block, L)
    diff = torch.where(valid, s[..., :, None] - t[..., None, :], 0.0)  # (B, H, M, nb, block, L)
    out = weights(diff, valid) @ v  # (B, H, nb, block, D)
    return out.flatten(2, 3)[:, :, :length].to(value.dtype)


def _sliced_relu_weights(diff: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """W_ij = c_ij - (sum_l c_il) [j valid] / n_i with c_ij = mean_m ReLU(d_mij) / sum_l |d_mil|,
    so that sum_j W_ij v_j = sum_j c_ij (v_j - vbar_i); shapes as in :func:`_scalar_kernel_attention`."""
    relu = diff.clamp_min(0)
    # sum_l |d_l| = 2 sum_l ReLU(d_l) - sum_l d_l, without a third pair-sized tensor.
    denominator = 2 * relu.sum(-1, keepdim=True) - diff.sum(-1, keepdim=True)  # (B, H, M, nb, block, 1)
    inverse = torch.where(denominator > 0, denominator.clamp_min(torch.finfo(diff.dtype).tiny).reciprocal(), 0.0)
    weights = (relu * inverse).mean(2)  # (B, H, nb, block, L)
    valid = valid[:, :, 0].to(diff.dtype)  # (B, 1, nb, block, L)
    share = valid / valid.sum(-1, keepdim=True).clamp_min(1)  # 1 / n_i on the valid keys
    return weights - weights.sum(-1, keepdim=True) * share


def _bump_weights(diff: torch.Tensor, valid: torch.Tensor, bandwidth: torch.Tensor) -> torch.Tensor:
    """W_ij = mean_m max(0, 1 - |d_mij| / b_m) / n_i on the valid pairs, 0 elsewhere; bandwidth
    (1, H, M, 1, 1, 1), other shapes as in :func:`_scalar_kernel_attention`."""
    bump = torch.where(valid, (1 - diff.abs() / bandwidth).clamp_min(0), 0.0)  # (B, H, M, nb, block, L)
    count = valid[:, :, 0].sum(-1, keepdim=True).clamp_min(1)  # n_i, (B, 1, nb, block, 1)
    return bump.mean(2) / count


def windowed_sliced_relu(
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    sliding_window: int,
    block_size: int | None = None,
) -> torch.Tensor:
    """Sliced ReLU attention restricted to |i - j| <= sliding_window - 1 (see the module doc).

    query_scalars, key_scalars: (B, H, T) or (B, H, M, T); value (B, H, T, D);
    key_padding_mask (B, T) bool, True = real. ``block_size`` (default ``sliding_window``) is
    the query block size. Returns (B, H, T, D) in value's dtype.
    """
    block = _check_scalars(query_scalars, key_scalars, value, key_padding_mask, sliding_window, block_size)
    return _scalar_kernel_attention(
        query_scalars, key_scalars, value, key_padding_mask, sliding_window, block, _sliced_relu_weights
    )


def windowed_sliced_relu_bump(
    query_scalars: torch.Tensor,
    key_scalars: torch.Tensor,
    value: torch.Tensor,
    bandwidth: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    sliding_window: int,
    block_size: int | None = None,
) -> torch.Tensor:
    """Sliced bump-kernel attention restricted to |i - j| <= sliding_window - 1 (see the module doc).

    query_scalars, key_scalars: (B, H, T) or (B, H, M, T); value (B, H, T, D); bandwidth
    b > 0 of shape (H,) for (B, H, T) scalars, (H, M) for (B, H, M, T); key_padding_mask
    (B, T) bool, True = real. ``block_size`` (default ``sliding_window``) is the query block
    size. Returns (B, H, T, D) in value's dtype; differentiable in the scalars, the values
    and the bandwidth.
    """
    block = _check_scalars(query_scalars, key_scalars, value, key_padding_mask, sliding_window, block_size)
    expected = tuple(query_scalars.shape[1:-1])  # (H,) or (H, M)
    if tuple(bandwidth.shape) != expected:
        raise ValueError(
            f"bandwidth must have shape {'(H,)' if len(expected) == 1 else '(H, M)'} = {expected} for scalars "
            f"of shape {tuple(query_scalars.shape)}, got {tuple(bandwidth.shape)}"
        )
    bandwidth = bandwidth.to(compute_dtype(value.dtype)).reshape(1, expected[0], -1, 1, 1, 1)  # (1, H, M, 1, 1, 1)
    return _scalar_kernel_attention(
        query_scalars, key_scalars, value, key_padding_mask, sliding_window, block,
        partial(_bump_weights, bandwidth=bandwidth),
    )


def _softmax_and_log_normaliser(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scaling) v over the band pairs ``attend`` and its log-normaliser
    lse = log sum_j exp(q . k_j * scaling), written out (SDPA does not return lse): q (N, H, block, D),
    k and v (N, H, L, ·), attend (N, 1, block, L) bool with at least one True per row
    -> (N, H, block, Dv) and (N, H, block). The (N, H, block, L) scores are O(T * w) per head."""
    scores = (q @ k.transpose(-1, -2) * scaling).masked_fill(~attend, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def _unblock(x: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """(B * nb, H, block, ...) -> (B, H, T, ...): the query blocks back in sequence order."""
    return x.unflatten(0, (batch, -1)).transpose(1, 2).flatten(2, 3)[:, :, :length]


def windowed_softmax(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    sliding_window: int,
    block_size: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention restricted to |i - j| <= sliding_window - 1 (see the module doc).

    query, key, value: (B, H, T, D); key_padding_mask (B, T) bool, True = real; scaling
    defaults to D^-1/2; ``block_size`` (default ``sliding_window``) is the query block size.
    A query with no valid key gets 0. Returns (B, H, T, D) in query's dtype.

    With ``return_lse``, also the log-normaliser lse_i = log sum_j exp(q_i . k_j * scaling) over
    the valid keys of i's window, (B, H, T) in float32 (float64 for float64 inputs), -inf for a
    query with no valid key; differentiable like the output.

    On CPU, where the C++ kernel builds (:func:`.windowed_softmax_cpu.available`, the rule and the
    ``HF_SLICED_ATTN_NATIVE`` switch of the sliced kernels), both forms run
    :func:`.windowed_softmax_cpu.windowed_softmax_cpu`, which is faster than either torch form
    (``block_size`` does not apply to it). Elsewhere the band is gathered by query blocks: without
    ``return_lse`` into SDPA's fused kernel, with it into plain tensor ops (SDPA does not return lse).
    """
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(f"query and key must be (B, H, T, D), got {tuple(query.shape)} and {tuple(key.shape)}")
    block = _check(query.shape[2], key.shape[2], value, key_padding_mask, sliding_window, block_size)
    if query.shape != key.shape or key.shape[:3] != value.shape[:3]:
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
            "must share (B, H, T) and query/key their D"
        )
    batch, heads, length, _ = query.shape
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if query.device.type == "cpu" and windowed_softmax_cpu.available():
        valid = torch.ones(batch, length, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
        out, lse = windowed_softmax_cpu.windowed_softmax_cpu(query, key, value, valid, sliding_window=sliding_window,
                                                             scaling=scaling)
        return (out, lse) if return_lse else out
    dtype = compute_dtype(query.dtype)
    halo = sliding_window - 1
    # SDPA's fused CPU kernel takes 4-D inputs: the blocks go to the batch dim, (B * nb, H, ., D).
    q = _blocks(query.to(dtype), block, dim=2).transpose(1, 2).flatten(0, 1)  # (B * nb, H, block, D)
    k = _band(key.to(dtype), block, halo, dim=2).transpose(1, 2).flatten(0, 1)  # (B * nb, H, L, D)
    v = _band(value.to(dtype), block, halo, dim=2).transpose(1, 2).flatten(0, 1)  # (B * nb, H, L, Dv)
    valid = _valid_pairs(key_padding_mask, batch, length, sliding_window, block, query.device)
    valid = valid.expand(batch, -1, -1, -1).flatten(0, 1)  # (B * nb, block, L)
    has_key = valid.any(-1, keepdim=True)  # (B * nb, block, 1)
    # A row without any valid key is unmasked (SDPA would give NaN there) and its output
    # zeroed, so that its gradient is exactly 0 as well.
    attend = (valid | ~has_key)[:, None]  # (B * nb, 1, block, L)
    if return_lse:
        out, lse = _softmax_and_log_normaliser(q, k, v, attend, scaling)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, scale=scaling)
    out = _unblock(torch.where(has_key[:, None], out, 0.0), batch, length).to(query.dtype)  # (B, H, T, Dv)
    if not return_lse:
        return out
    return out, _unblock(torch.where(has_key[:, None, :, 0], lse, float("-inf")), batch, length)
