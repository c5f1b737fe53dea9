"""Sliced ReLU attention (arXiv 2512.11411) in O(n log n) time and O(n) memory.

For one (batch, head, slice), with query scalars s (Tq), key scalars t (Tk) and values
v (Tk, D):

    out_i = sum_j ReLU(s_i - t_j) (v_j - vbar) / sum_l |s_i - t_l|,

where j and l run over the valid keys (``key_padding_mask`` True) and vbar is the mean of
their values. Ties contribute 0; a query whose denominator is 0 (all keys equal to it, or
no valid key) gets 0. With M slices the M outputs are averaged.

Shapes: query_scalars (B, H, Tq) or (B, H, M, Tq); key_scalars (B, H, Tk) or
(B, H, M, Tk); value (B, H, Tk, D); key_padding_mask (B, Tk) bool, True for a real token
-> (B, H, Tq, D) in value's dtype. fp16/bf16 are computed in fp32.

Algorithm. Only the keys are sorted (padded keys go last and carry zero value). With
u = v - vbar and the keys in sorted order, prefix sums P_u[c] = sum_{k<c} u_k,
P_tu[c] = sum_{k<c} t_k u_k and P_t[c] = sum_{k<c} t_k give, for a query with c keys
strictly below it and n valid keys,

    numerator   = s P_u[c] - P_tu[c]
    denominator = (s c - P_t[c]) + (P_t[n] - P_t[c']) - s (n - c'),

c' counting the keys <= s (so ties contribute exactly 0). s and t are centred on the mean
valid key (the kernel is shift-invariant), scalar work is done in float64, and the fp32
residual mean r of u is removed by subtracting (s c - P_t[c]) r from the numerator, which
keeps the error flat in the sequence length.

The backward is written by hand (no autograd through sort, scan or gather). With
w_i = g_i / (M den_i), the key at sorted position k gets

    dL/du_k = sum_{c_i > k} (s_i - t_k) w_i = S_sw(k) - t_k S_w(k),

where S_w and S_sw are prefix sums of w_i and s_i w_i over the queries in descending order
of s, read at the number of queries above key k. dL/dv is dL/du minus its mean over the
valid keys; dL/ds and dL/dt follow in closed form from the same ranks (a tie counts as
sign 0 and ReLU slope 0).

Sequence scans use a blocked scan (rows added one at a time inside blocks of 64, then
block carries), several times faster on CPU than ``torch.cumsum`` along the sequence, and
the D-wide work is done a few heads at a time so that it stays in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["sliced_relu"]

_SCAN_BLOCK = 64
# D-wide work is done for as many (batch, head) rows at a time as keep one (M, T, D)
# working tensor under this many elements, so that it stays in cache.
_CHUNK_ELEMENTS = 1 << 20


def _blocked_cumsum_(x: Tensor) -> Tensor:
    """Inclusive prefix sum of x (..., L, C) along dim -2, in place.

    Rows are added one at a time inside blocks of _SCAN_BLOCK rows (each step adding the
    same row of every block), then every block gets the running total of the blocks before
    it. torch.cumsum along a non-last dim is several times slower on CPU.
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


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """(..., L) -> (..., L + 1) with a leading 0."""
    return torch.nn.functional.pad(x.cumsum(-1), (1, 0))


@dataclass
class _KeyOrder:
    """Float64 scalar state of every (batch*head, slice) group; shapes (B*H, M, ·)."""

    s: Tensor  # centred query scalars (.., Tq)
    t: Tensor  # centred key scalars, padded keys 0 (.., Tk)
    t_sorted: Tensor  # the same in ascending order, padded keys last (.., Tk)
    perm: Tensor  # key index at each sorted position (.., Tk)
    q_perm: Tensor  # query indices in ascending order of s (.., Tq)
    below: Tensor  # c: number of valid keys < s (.., Tq)
    at_or_below: Tensor  # c': number of valid keys <= s (.., Tq)
    n_valid: Tensor  # (.., 1)
    relu_sum: Tensor  # sum_j ReLU(s - t_j) (.., Tq)
    den: Tensor  # sum_j |s - t_j| (.., Tq)
    inv: Tensor  # 1 / (M * den), 0 where den is 0 (.., Tq)


def _order_keys(s: Tensor, t: Tensor, valid: Tensor) -> _KeyOrder:
    """Centre s and t, sort the keys, rank the queries and form the denominators."""
    batch, heads, slices, q_len = s.shape
    k_len = t.shape[-1]
    valid = valid.view(batch, 1, 1, k_len)
    n_valid = valid.sum(-1, keepdim=True).expand(batch, heads, slices, 1)
    s64, t64 = s.double().contiguous(), t.double().contiguous()
    centre = torch.where(valid, t64, 0.0).sum(-1, keepdim=True) / n_valid.clamp_min(1)
    s64, t64 = s64 - centre, torch.where(valid, t64 - centre, 0.0)
    t_sorted, perm = t64.masked_fill(~valid, float("inf")).sort(-1)
    # Ranking the queries in ascending order keeps the binary searches cache-friendly.
    s_sorted, q_perm = s64.sort(-1)
    below = torch.empty_like(q_perm).scatter_(-1, q_perm, torch.searchsorted(t_sorted, s_sorted))
    at_or_below = torch.searchsorted(t_sorted, s_sorted, right=True)
    at_or_below = torch.empty_like(q_perm).scatter_(-1, q_perm, at_or_below)
    t_sorted = torch.where(torch.arange(k_len, device=t.device) < n_valid, t_sorted, 0.0)
    prefix_t = _exclusive_cumsum(t_sorted)
    relu_sum = s64 * below - prefix_t.gather(-1, below)
    above_sum = prefix_t[..., -1:] - prefix_t.gather(-1, at_or_below) - s64 * (n_valid - at_or_below)
    den = relu_sum + above_sum
    positive = den > 0
    inv = torch.where(positive, 1.0 / (slices * torch.where(positive, den, 1.0)), 0.0)
    state = (s64, t64, t_sorted, perm, q_perm, below, at_or_below, n_valid, relu_sum, den, inv)
    return _KeyOrder(*(x.reshape(batch * heads, slices, -1) for x in state))


def _chunks(rows: int, per_row: int) -> list[range]:
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


def _centred_values(v: Tensor, valid: Tensor, padded: bool, work: torch.dtype) -> tuple[Tensor, Tensor]:
    """u = v - vbar over the valid keys (padded rows 0), and the mean that u keeps from
    rounding (about 1e-8 in fp32), (B*H, D). torch's cascade sum is accurate enough for it.
    """
    batch, heads, k_len, dim = v.shape
    valid_rows = valid.view(batch, 1, k_len, 1)
    n_valid = valid.sum(-1).view(batch, 1, 1).clamp_min(1)
    v = v.to(work).contiguous()
    if padded:
        v = v.masked_fill(~valid_rows, 0)
    u = v - (v.sum(-2) / n_valid).unsqueeze(-2)
    if padded:
        u.masked_fill_(~valid_rows, 0)
    residual = u.sum(-2).double() / n_valid
    return u, residual.to(work).view(batch * heads, dim)


def _scratch(like: Tensor, rows: int, length: int) -> Tensor:
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


def _prefix_at_queries(
    u_flat: Tensor, order: _KeyOrder, t_sorted: Tensor, rows: range, scratch: Tensor
) -> Tensor:
    """(2, len(rows), M, Tq, D): P_u[c] and P_tu[c] at each query's rank c, for a chunk."""
    slices, k_len = order.perm.shape[1:]
    q_len, dim = order.s.shape[-1], u_flat.shape[-1]
    groups = len(rows) * slices
    # Row 0 of each half is the empty prefix; row 1 + g*Tk + k the prefix through key k.
    prefix = scratch[:, : groups * k_len + 1]
    prefix[:, 0] = 0
    torch.index_select(u_flat, 0, _flat_rows(order.perm[rows.start:rows.stop], rows), out=prefix[0, 1:])
    torch.mul(prefix[0, 1:], t_sorted[rows.start:rows.stop].reshape(-1, 1), out=prefix[1, 1:])
    _blocked_cumsum_(prefix[:, 1:].unflatten(1, (groups, k_len)))
    below = order.below[rows.start:rows.stop]
    query_rows = torch.where(below > 0, _group_offsets(rows, slices, k_len, below.device) + below, 0)
    return _select_rows(prefix, query_rows.view(-1)).view(2, len(rows), slices, q_len, dim)


def _forward(
    s: Tensor, t: Tensor, v: Tensor, valid: Tensor, padded: bool, work: torch.dtype
) -> tuple[Tensor, _KeyOrder, Tensor, Tensor, list[Tensor]]:
    """out (B*H, Tq, D) in `work`, the scalar state, u, its residual mean and P at the queries."""
    order = _order_keys(s, t, valid)
    u, residual = _centred_values(v, valid, padded, work)
    rows_total, slices, q_len = order.s.shape
    dim = v.shape[-1]
    u_flat = u.view(-1, dim)
    t_sorted = order.t_sorted.to(work)
    # out = sum_m (s P_u[c] - P_tu[c] - relu_sum * residual) / (M den)
    coef_u = (order.s * order.inv).to(work).unsqueeze(-1)  # (B*H, M, Tq, 1)
    coef_tu = order.inv.to(work).unsqueeze(-1)
    coef_r = (order.relu_sum * order.inv).sum(1).to(work).unsqueeze(-1)  # (B*H, Tq, 1)
    out = torch.empty(rows_total, q_len, dim, dtype=work, device=v.device)
    at_queries = []
    chunks = _chunks(rows_total, slices * max(q_len, order.perm.shape[-1]) * dim)
    scratch = _scratch(u, len(chunks[0]) * slices, order.perm.shape[-1])
    for rows in chunks:
        at_query = _prefix_at_queries(u_flat, order, t_sorted, rows, scratch)
        lo, hi = rows.start, rows.stop
        out_rows = out[lo:hi]
        torch.mul(at_query[0, :, 0], coef_u[lo:hi, 0], out=out_rows)
        out_rows.addcmul_(at_query[1, :, 0], coef_tu[lo:hi, 0], value=-1)
        for m in range(1, slices):
            out_rows.addcmul_(at_query[0, :, m], coef_u[lo:hi, m])
            out_rows.addcmul_(at_query[1, :, m], coef_tu[lo:hi, m], value=-1)
        out_rows.addcmul_(coef_r[lo:hi], residual[lo:hi].unsqueeze(1), value=-1)
        at_queries.append(at_query)
    return out, order, u, residual, at_queries


def _key_gradients(
    grad_flat: Tensor, u: Tensor, order: _KeyOrder, above_count: Tensor, rows: range,
    scratch: tuple[Tensor, Tensor], du: Tensor, dt_part: Tensor,
) -> None:
    """For a chunk of rows, write dL/du_j = S_sw(j) - t_j S_w(j) into du (B*H, Tk, D) and
    -u_j . S_w(j) into dt_part (B*H, M, Tk), both in key order.

    S_w(j) sums w_i = g_i / (M den_i) and S_sw(j) sums s_i w_i over the queries above key j:
    prefix sums over the queries in descending order of s, read at above_count (B*H, M, Tk).
    """
    lo, hi = rows.start, rows.stop
    slices, q_len = order.s.shape[1:]
    k_len, dim = u.shape[-2:]
    groups = len(rows) * slices
    descending = order.q_perm[lo:hi].flip(-1)
    inv = order.inv[lo:hi].gather(-1, descending)
    # Row 0 of each half is the empty sum; row 1 + g*Tq + p the sum over the top p+1 queries.
    acc = scratch[0][:, : groups * q_len + 1]
    acc[:, 0] = 0
    torch.index_select(grad_flat, 0, _flat_rows(descending, rows), out=acc[1, 1:])
    torch.mul(acc[1, 1:], inv.to(u.dtype).view(-1, 1), out=acc[0, 1:])
    acc[1, 1:].mul_((order.s[lo:hi].gather(-1, descending) * inv).to(u.dtype).view(-1, 1))
    _blocked_cumsum_(acc[:, 1:].unflatten(1, (groups, q_len)))
    count = above_count[lo:hi]
    key_rows = torch.where(count > 0, _group_offsets(rows, slices, q_len, count.device) + count, 0)
    at_keys = _select_rows(acc, key_rows.view(-1), out=scratch[1][:, : groups * k_len])
    at_keys = at_keys.view(2, len(rows), slices, k_len, dim)
    t_keys = order.t[lo:hi].to(u.dtype).unsqueeze(-1)
    du_rows = du[lo:hi]
    torch.addcmul(at_keys[1, :, 0], at_keys[0, :, 0], t_keys[:, 0], value=-1, out=du_rows)
    for m in range(1, slices):
        du_rows += at_keys[1, :, m]
        du_rows.addcmul_(at_keys[0, :, m], t_keys[:, m], value=-1)
    torch.neg(torch.einsum("cmkd,ckd->cmk", at_keys[0], u[lo:hi]), out=dt_part[lo:hi])


def _backward(
    grad: Tensor, order: _KeyOrder, u: Tensor, residual: Tensor, at_queries: list[Tensor], valid: Tensor,
    padded: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """dL/ds (B*H, M, Tq), dL/dt (B*H, M, Tk) in float64 and dL/dv (B, H, Tk, D) in u's dtype."""
    rows_total, slices, q_len = order.s.shape
    batch, heads, k_len, dim = u.shape
    grad = grad.reshape(rows_total, q_len, dim).to(u.dtype).contiguous()
    u = u.view(rows_total, k_len, dim)
    # Number of queries above the key at each sorted position, then in key order.
    by_rank = torch.zeros(rows_total, slices, k_len + 1, dtype=torch.long, device=u.device)
    by_rank.scatter_add_(-1, order.below, torch.ones_like(order.below))
    above_count = torch.empty_like(order.perm).scatter_(-1, order.perm, q_len - by_rank.cumsum(-1)[..., :k_len])

    dots = torch.empty(2, rows_total, slices, q_len, dtype=u.dtype, device=u.device)
    dt_part = torch.empty(rows_total, slices, k_len, dtype=u.dtype, device=u.device)
    du = torch.empty(rows_total, k_len, dim, dtype=u.dtype, device=u.device)
    chunks = _chunks(rows_total, slices * max(q_len, k_len) * dim)
    groups = len(chunks[0]) * slices
    scratch = _scratch(u, groups, q_len), _scratch(u, groups, k_len)
    for rows, at_query in zip(chunks, at_queries):
        lo, hi = rows.start, rows.stop
        dots[:, lo:hi] = torch.einsum("kcmtd,ctd->kcmt", at_query, grad[lo:hi])
        _key_gradients(grad.view(-1, dim), u, order, above_count, rows, scratch, du, dt_part)

    # Scalar gradients, float64. g.N_i with N_i = s P_u[c] - P_tu[c] - relu_sum * residual.
    g_dot_u, g_dot_tu = dots.double()
    g_dot_r = (grad @ residual.unsqueeze(-1)).double().view(rows_total, 1, q_len)
    g_num = order.s * g_dot_u - g_dot_tu - order.relu_sum * g_dot_r
    # e_i = g_i . N_i / (M den_i^2); dL/ds_i = g_i . P_u[c] / (M den_i) - e_i sum_j sign(s_i - t_j).
    e = order.inv * g_num / torch.where(order.den > 0, order.den, 1.0)
    ds = order.inv * g_dot_u - e * (order.below + order.at_or_below - order.n_valid)
    # dL/dt_k = -u_k . S_w(k) + sum_{s_i > t_k} e_i - sum_{s_i < t_k} e_i, first in sorted order.
    e_by_below = torch.zeros(rows_total, slices, k_len + 1, dtype=e.dtype, device=e.device)
    e_by_below.scatter_add_(-1, order.below, e)
    e_by_at_or_below = torch.zeros_like(e_by_below).scatter_add_(-1, order.at_or_below, e)
    e_above = e.sum(-1, keepdim=True) - e_by_below.cumsum(-1)[..., :k_len]
    e_below = e_by_at_or_below.cumsum(-1)[..., :k_len]
    position = torch.arange(k_len, device=e.device)
    sign_part = torch.where(position < order.n_valid, e_above - e_below, 0.0)
    dt = torch.empty_like(sign_part).scatter_(-1, order.perm, sign_part)
    dt += dt_part.double()

    # v enters through u = v - vbar: dL/dv is dL/du minus its mean over the valid keys.
    n_valid = valid.sum(-1).view(batch, 1, 1).clamp_min(1)
    du = du.view(batch, heads, k_len, dim)
    du -= (du.sum(-2) / n_valid).unsqueeze(-2)
    if padded:
        du.masked_fill_(~valid.view(batch, 1, k_len, 1), 0)
    return ds, dt, du


class _SlicedReLUFunction(torch.autograd.Function):
    """Sliced ReLU attention on 4-D scalars, with the hand-written backward above."""

    @staticmethod
    def forward(ctx, s: Tensor, t: Tensor, v: Tensor, valid: Tensor) -> Tensor:
        work = torch.float64 if v.dtype == torch.float64 else torch.float32
        padded = not bool(valid.all())
        out, order, u, residual, at_queries = _forward(s, t, v, valid, padded, work)
        if any(ctx.needs_input_grad[:3]):
            ctx.state = (order, u, residual, at_queries, valid, padded)
            ctx.dtypes = (s.dtype, t.dtype, v.dtype)
        batch, heads = v.shape[:2]
        return out.view(batch, heads, *out.shape[1:]).to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        order, u, residual, at_queries, valid, padded = ctx.state
        ds, dt, dv = _backward(grad, order, u, residual, at_queries, valid, padded)
        batch, heads = dv.shape[:2]
        ds = ds.view(batch, heads, *ds.shape[1:])
        dt = dt.view(batch, heads, *dt.shape[1:])
        s_dtype, t_dtype, v_dtype = ctx.dtypes
        return ds.to(s_dtype), dt.to(t_dtype), dv.to(v_dtype), None


def _check_shapes(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, key_padding_mask: Tensor | None
) -> None:
    """Raise ValueError naming the expected shape when an input does not fit."""
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
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (batch, k_len):
        raise ValueError(
            f"key_padding_mask must have shape (B, Tk) = {(batch, k_len)}, got {tuple(key_padding_mask.shape)}"
        )


def sliced_relu(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, key_padding_mask: Tensor | None = None
) -> Tensor:
    """Sliced ReLU attention; see the module docstring for the maths and shapes.

    query_scalars (B, H, Tq) or (B, H, M, Tq), key_scalars (B, H, Tk) or (B, H, M, Tk),
    value (B, H, Tk, D), key_padding_mask (B, Tk) bool (True = real token) or None
    -> (B, H, Tq, D) in value's dtype.
    """
    _check_shapes(query_scalars, key_scalars, value, key_padding_mask)
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
    if key_padding_mask is None:
        valid = torch.ones(value.shape[0], value.shape[2], dtype=torch.bool, device=value.device)
    else:
        valid = key_padding_mask.to(device=value.device, dtype=torch.bool)
    return _SlicedReLUFunction.apply(query_scalars, key_scalars, value, valid)
