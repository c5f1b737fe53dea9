"""Sorted-scan machinery shared by the sliced kernels (:mod:`.sliced_relu`, :mod:`.sliced_relu_bump`).

A sliced kernel attention reduces every (batch, head, slice) group to query scalars s (Tq),
key scalars t (Tk) and values v (Tk, D) shared by the slices of a head, and computes
out_i = sum_j k(s_i - t_j) v_j for a kernel k that is piecewise polynomial in s_i - t_j.
Sorting the keys once turns every sum over the keys on one side of a point p into a
prefix sum read at p's rank among the sorted keys:

    P[c] = sum_{k<c} x_k,   P_t[c] = sum_{k<c} t_k x_k,   c = #{valid keys < p} (or <= p),

keys in ascending order of t. A kernel's forward is a few such reads per query and its
coefficients; its backward needs the same sums with queries and keys swapped (prefix sums
over the queries sorted by s, read at the ranks of points among the queries). This module
does the shared part, every group at once:

* :func:`sort_scalars` centres s and t on the mean valid key in float64 (the kernels are
  shift-invariant, and centring keeps P_t small), sorts the keys (padded keys last) and
  the queries.
* :func:`ranks_among_keys` / :func:`ranks_among_queries`: ranks of s_i + offset among the
  sorted keys, or of t_j + offset among the sorted queries, searched in ascending order
  (cache-friendly) and returned in the original order.
* :func:`prefix_at`: the D-wide prefix sums (P, P_w) of rows taken in a sorted order, read
  at given ranks, a chunk of (batch, head) rows at a time.

Conventions: the scalar state has shapes (B*H, M, ·) in float64; D-wide tensors live in
the op's work dtype (float32, or float64 for float64 inputs). The float64 scalar work is
O(M·T) per head, never D-wide, so it stays cheap on GPUs with slow float64 too, and it is
what keeps the denominators exact at long T. Sequence scans (:func:`prefix_sum_`) pick
their implementation by device: a blocked scan (rows added one at a time inside blocks of
64, then block carries) on CPU, several times faster there than ``torch.cumsum`` along the
sequence, and ``torch.cumsum`` elsewhere. The D-wide work is done a few heads at a time
(:func:`chunks`) so that it stays in cache, in one scratch buffer per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ._common import check_key_padding_mask

__all__ = [
    "SortedScalars",
    "centred_values",
    "check_scalar_shapes",
    "chunks",
    "exclusive_cumsum",
    "has_padding",
    "prefix_at",
    "prefix_sum_",
    "ranks_among_keys",
    "ranks_among_queries",
    "scratch",
    "sort_scalars",
    "to_key_order",
    "valid_keys",
]

_SCAN_BLOCK = 64
# D-wide work is done for as many (batch, head) rows at a time as keep one (M, T, D)
# working tensor under this many elements, so that it stays in cache.
_CHUNK_ELEMENTS = 1 << 20


def check_scalar_shapes(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, key_padding_mask: Tensor | None
) -> None:
    """Raise ValueError naming the expected shape when an input does not fit: scalars
    (B, H, Tq) / (B, H, Tk) or (B, H, M, Tq) / (B, H, M, Tk), value (B, H, Tk, D),
    key_padding_mask (B, Tk) or None."""
    if value.dim() != 4:
        raise ValueError(f"value must have shape (B, H, Tk, D), got {tuple(value.shape)}")
    batch, heads, k_len, _ = value.shape
    if query_scalars.dim() not in (3, 4):
        raise ValueError(
            f"query_scalars must have shape (B, H, Tq) or (B, H, M, Tq), got {tuple(query_scalars.shape)}"
        )
    sliced = query_scalars.dim() == 4
    lead = (batch, heads, query_scalars.shape[2]) if sliced else (batch, heads)
    if tuple(query_scalars.shape[:-1]) != lead:
        name = "(B, H, M, Tq)" if sliced else "(B, H, Tq)"
        raise ValueError(
            f"query_scalars must have shape {name} with (B, H) = {(batch, heads)} from value, "
            f"got {tuple(query_scalars.shape)}"
        )
    expected = (*lead, k_len)
    if tuple(key_scalars.shape) != expected:
        name = "(B, H, M, Tk)" if sliced else "(B, H, Tk)"
        raise ValueError(f"key_scalars must have shape {name} = {expected}, got {tuple(key_scalars.shape)}")
    check_key_padding_mask(key_padding_mask, batch, k_len)


def valid_keys(value: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """(B, Tk) bool on value's device: True for a real key (all True without a mask)."""
    if key_padding_mask is None:
        return torch.ones(value.shape[0], value.shape[2], dtype=torch.bool, device=value.device)
    return key_padding_mask.to(device=value.device, dtype=torch.bool)


def has_padding(valid: Tensor) -> bool:
    """Whether any key of valid (B, Tk) bool is padded: the ops mask padded keys only then.

    Always True under ``torch.compile``: reading a tensor's value is a graph break there, and
    masking without padded keys changes nothing.
    """
    return torch.compiler.is_compiling() or not bool(valid.all())


def prefix_sum_(x: Tensor) -> Tensor:
    """Inclusive prefix sum of x (..., L, C) along dim -2, in place, by the scan that suits x's device.

    On CPU, :func:`_blocked_cumsum_`: ``torch.cumsum`` along a non-last dim scans each column
    at stride C there, several times slower than the blocked scan. On other devices (CUDA)
    ``torch.cumsum``, one parallel scan kernel, where the blocked scan's 64 sequential row
    additions would be 64 kernel launches. The caller never chooses.
    """
    if x.device.type != "cpu":
        return x.cumsum_(-2)
    return _blocked_cumsum_(x)


def _blocked_cumsum_(x: Tensor) -> Tensor:
    """Inclusive prefix sum of x (..., L, C) along dim -2, in place, for CPU.

    Rows are added one at a time inside blocks of _SCAN_BLOCK rows (each step adding the
    same row of every block), then every block gets the running total of the blocks before
    it.
    """
    length = x.shape[-2]
    n_blocks = length // _SCAN_BLOCK
    body = n_blocks * _SCAN_BLOCK
    total = None
    if n_blocks:
        blocks = x[..., :body, :].unflatten(-2, (n_blocks, _SCAN_BLOCK))
        for row in range(1, _SCAN_BLOCK):
            blocks[..., row, :] += blocks[..., row - 1, :]
        if n_blocks > 1:
            carries = blocks[..., :-1, -1, :].cumsum(-2)
            blocks[..., 1:, :, :] += carries.unsqueeze(-2)
        total = blocks[..., -1, -1, :]
    if body < length:
        tail = x[..., body:, :]
        tail.cumsum_(-2)
        if total is not None:
            tail += total.unsqueeze(-2)
    return x


def exclusive_cumsum(x: Tensor) -> Tensor:
    """(..., L) -> (..., L + 1) with a leading 0."""
    return torch.nn.functional.pad(x.cumsum(-1), (1, 0))


@dataclass
class SortedScalars:
    """Float64 scalar state of every (batch*head, slice) group; shapes (B*H, M, ·)."""

    s: Tensor  # centred query scalars (.., Tq)
    t: Tensor  # centred key scalars, padded keys 0 (.., Tk)
    t_sorted: Tensor  # the same in ascending order, padded keys last (.., Tk)
    t_search: Tensor  # t_sorted with +inf for the padded keys: what points are ranked among (.., Tk)
    perm: Tensor  # key index at each sorted position (.., Tk)
    s_sorted: Tensor  # query scalars in ascending order (.., Tq)
    q_perm: Tensor  # query index at each sorted position (.., Tq)
    n_valid: Tensor  # number of valid keys (.., 1)


def sort_scalars(s: Tensor, t: Tensor, valid: Tensor) -> SortedScalars:
    """Centre s (B, H, M, Tq) and t (B, H, M, Tk) on the mean valid key, in float64, and sort
    the keys (padded keys last) and the queries. valid: (B, Tk) bool."""
    batch, heads, slices, _ = s.shape
    k_len = t.shape[-1]
    valid = valid.view(batch, 1, 1, k_len)
    n_valid = valid.sum(-1, keepdim=True).expand(batch, heads, slices, 1)
    s64, t64 = s.double().contiguous(), t.double().contiguous()
    centre = torch.where(valid, t64, 0.0).sum(-1, keepdim=True) / n_valid.clamp_min(1)
    s64, t64 = s64 - centre, torch.where(valid, t64 - centre, 0.0)
    t_search, perm = t64.masked_fill(~valid, float("inf")).sort(-1)
    s_sorted, q_perm = s64.sort(-1)
    t_sorted = torch.where(torch.arange(k_len, device=t.device) < n_valid, t_search, 0.0)
    state = (s64, t64, t_sorted, t_search, perm, s_sorted, q_perm, n_valid)
    return SortedScalars(*(x.reshape(batch * heads, slices, -1) for x in state))


def ranks_among_keys(order: SortedScalars, offset: Tensor | None = None, *, right: bool = False) -> Tensor:
    """(B*H, M, Tq) long, in query order: the number of valid keys t_j < s_i + offset
    (<= with ``right``). offset broadcasts against (B*H, M, Tq); None is 0.

    The points are searched in ascending order of s (keeps the binary searches cache-friendly).
    """
    points = order.s_sorted if offset is None else order.s_sorted + offset
    ranks = torch.searchsorted(order.t_search, points, right=right)
    return torch.empty_like(ranks).scatter_(-1, order.q_perm, ranks)


def ranks_among_queries(order: SortedScalars, offset: Tensor | None = None, *, right: bool = False) -> Tensor:
    """(B*H, M, Tk) long, in sorted key order: the number of queries s_i < t_(k) + offset
    (<= with ``right``) for the key at sorted position k; Tq for the padded keys.
    offset broadcasts against (B*H, M, Tk); None is 0. :func:`to_key_order` reorders."""
    points = order.t_search if offset is None else order.t_search + offset
    return torch.searchsorted(order.s_sorted, points, right=right)


def to_key_order(order: SortedScalars, x: Tensor) -> Tensor:
    """x (B*H, M, Tk) in sorted key order -> the same in key order."""
    return torch.empty_like(x).scatter_(-1, order.perm, x)


def centred_values(v: Tensor, valid: Tensor, padded: bool, work: torch.dtype) -> tuple[Tensor, Tensor]:
    """u = v - vbar (B, H, Tk, D) in `work`, padded rows 0, and vbar (B, H, D), the mean of
    the valid keys' values in `work`: prefix sums of u stay small where those of v grow
    linearly in the number of keys."""
    batch, _, k_len, _ = v.shape
    valid_rows = valid.view(batch, 1, k_len, 1)
    n_valid = valid.sum(-1).view(batch, 1, 1).clamp_min(1)
    v = v.to(work).contiguous()
    if padded:
        v = v.masked_fill(~valid_rows, 0)
    mean = v.sum(-2) / n_valid
    u = v - mean.unsqueeze(-2)
    if padded:
        u.masked_fill_(~valid_rows, 0)
    return u, mean


def chunks(rows: int, per_row: int) -> list[range]:
    """Split range(rows) so that each piece holds about _CHUNK_ELEMENTS D-wide elements."""
    size = max(1, _CHUNK_ELEMENTS // max(per_row, 1))
    return [range(start, min(start + size, rows)) for start in range(0, rows, size)]


def _flat_rows(index: Tensor, rows: range) -> Tensor:
    """index (len(rows), M, L) into each (batch, head) row -> rows of a flat (B*H*L, D) view."""
    length = index.shape[-1]
    offsets = torch.arange(rows.start, rows.stop, device=index.device).view(-1, 1, 1) * length
    return (index + offsets).view(-1)


def _group_offsets(rows: range, slices: int, length: int, device: torch.device) -> Tensor:
    """(len(rows), M, 1) offsets of each group of a chunk in a flat (groups*length, ·) view."""
    return torch.arange(len(rows) * slices, device=device).view(len(rows), slices, 1) * length


def scratch(like: Tensor, rows: int, length: int) -> Tensor:
    """An uninitialised (2, rows*length + 1, D) buffer, reused by every chunk of a call
    (fresh large allocations are page-faulted on every use)."""
    return torch.empty(2, rows * length + 1, like.shape[-1], dtype=like.dtype, device=like.device)


def _select_rows(halves: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    """halves[:, index] for a (2, N, D) tensor, one flat index_select per half (index_select
    along dim 1 is several times slower on CPU)."""
    if out is None:
        out = torch.empty(2, index.numel(), halves.shape[-1], dtype=halves.dtype, device=halves.device)
    for half in range(2):
        torch.index_select(halves[half], 0, index, out=out[half])
    return out


def prefix_at(
    source: Tensor, order: Tensor, weights: tuple[Tensor | None, Tensor], ranks: Tensor, rows: range,
    buffer: Tensor, out: Tensor | None = None, centre: Tensor | None = None,
) -> Tensor:
    """Two weighted prefix sums of D-wide rows taken in a sorted order, read at ranks.

    For a chunk of (batch, head) rows and every slice m, with x_p the row order[p] of the
    (batch, head) row's block of ``source`` (a flat (B*H*L, D) view), minus that row's
    ``centre`` if given, and weights (a, w):

        P[c] = sum_{p<c} a_p x_p   (a = 1 when None),   P_w[c] = sum_{p<c} w_p x_p.

    order (len(rows), M, L) long; a, w (len(rows), M, L) in source's dtype, in sorted
    order; ranks (len(rows), M, K) long in [0, L]; buffer from :func:`scratch` with room
    for len(rows)*M groups of L; out, if given, (2, len(rows)*M*K, D); centre, if given,
    (len(rows), D), subtracted from the gathered rows while they are in cache (no centred
    copy of ``source`` is ever made).
    -> (2, len(rows), M, K, D): P and P_w at each rank.
    """
    slices, length = order.shape[1:]
    groups, dim = len(rows) * slices, source.shape[-1]
    # Row 0 of each half is the empty prefix; row 1 + g*L + p the prefix through position p.
    prefix = buffer[:, : groups * length + 1]
    prefix[:, 0] = 0
    torch.index_select(source, 0, _flat_rows(order, rows), out=prefix[0, 1:])
    if centre is not None:
        prefix[0, 1:].view(len(rows), slices * length, dim).sub_(centre.unsqueeze(1))
    torch.mul(prefix[0, 1:], weights[1].reshape(-1, 1), out=prefix[1, 1:])
    if weights[0] is not None:
        prefix[0, 1:].mul_(weights[0].reshape(-1, 1))
    prefix_sum_(prefix[:, 1:].unflatten(1, (groups, length)))
    at = torch.where(ranks > 0, _group_offsets(rows, slices, length, ranks.device) + ranks, 0)
    return _select_rows(prefix, at.view(-1), out).view(2, len(rows), slices, ranks.shape[-1], dim)
