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

The sorting, ranking, blocked prefix scans and chunking are shared with the other sliced
kernels (:mod:`._sorted`); this module holds the ReLU kernel's coefficients and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._common import compute_dtype
from ._sorted import (
    SortedScalars,
    centred_values,
    check_scalar_shapes,
    chunks,
    exclusive_cumsum,
    has_padding,
    prefix_at,
    ranks_among_keys,
    ranks_among_queries,
    scratch,
    sort_scalars,
    to_key_order,
    valid_keys,
)

__all__ = ["sliced_relu"]


@dataclass
class _KeyOrder:
    """The sorted scalars and the ReLU kernel's float64 coefficients; shapes (B*H, M, ·)."""

    scalars: SortedScalars
    below: Tensor  # c: number of valid keys < s (.., Tq)
    at_or_below: Tensor  # c': number of valid keys <= s (.., Tq)
    relu_sum: Tensor  # sum_j ReLU(s - t_j) (.., Tq)
    den: Tensor  # sum_j |s - t_j| (.., Tq)
    inv: Tensor  # 1 / (M * den), 0 where den is 0 (.., Tq)


def _order_keys(s: Tensor, t: Tensor, valid: Tensor) -> _KeyOrder:
    """Centre s and t, sort the keys, rank the queries and form the denominators."""
    scalars = sort_scalars(s, t, valid)
    s64, n_valid, slices = scalars.s, scalars.n_valid, s.shape[2]
    below = ranks_among_keys(scalars)
    at_or_below = ranks_among_keys(scalars, right=True)
    prefix_t = exclusive_cumsum(scalars.t_sorted)
    relu_sum = s64 * below - prefix_t.gather(-1, below)
    above_sum = prefix_t[..., -1:] - prefix_t.gather(-1, at_or_below) - s64 * (n_valid - at_or_below)
    den = relu_sum + above_sum
    positive = den > 0
    inv = torch.where(positive, 1.0 / (slices * torch.where(positive, den, 1.0)), 0.0)
    return _KeyOrder(scalars, below, at_or_below, relu_sum, den, inv)


def _forward(
    s: Tensor, t: Tensor, v: Tensor, valid: Tensor, padded: bool, work: torch.dtype
) -> tuple[Tensor, _KeyOrder, Tensor, Tensor, list[Tensor]]:
    """out (B*H, Tq, D) in `work`, the scalar state, u, its residual mean and P at the queries."""
    order = _order_keys(s, t, valid)
    scalars = order.scalars
    u, mean = centred_values(v, valid, padded, work)
    # The mean that u keeps from rounding (about 1e-8 in fp32), (B*H, D); torch's cascade
    # sum is accurate enough for it.
    n_valid = valid.sum(-1).view(-1, 1, 1).clamp_min(1)
    residual = (u.sum(-2).double() / n_valid).to(work).view(-1, mean.shape[-1])
    rows_total, slices, q_len = scalars.s.shape
    k_len, dim = v.shape[-2:]
    u_flat = u.view(-1, dim)
    t_sorted = scalars.t_sorted.to(work)
    # out = sum_m (s P_u[c] - P_tu[c] - relu_sum * residual) / (M den)
    coef_u = (scalars.s * order.inv).to(work).unsqueeze(-1)  # (B*H, M, Tq, 1)
    coef_tu = order.inv.to(work).unsqueeze(-1)
    coef_r = (order.relu_sum * order.inv).sum(1).to(work).unsqueeze(-1)  # (B*H, Tq, 1)
    out = torch.empty(rows_total, q_len, dim, dtype=work, device=v.device)
    at_queries = []
    pieces = chunks(rows_total, slices * max(q_len, k_len) * dim)
    buffer = scratch(u, len(pieces[0]) * slices, k_len)
    for rows in pieces:
        lo, hi = rows.start, rows.stop
        # P_u[c] and P_tu[c] at each query's rank c, (2, len(rows), M, Tq, D).
        at_query = prefix_at(u_flat, scalars.perm[lo:hi], (None, t_sorted[lo:hi]), order.below[lo:hi], rows, buffer)
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
    buffers: tuple[Tensor, Tensor], du: Tensor, dt_part: Tensor,
) -> None:
    """For a chunk of rows, write dL/du_j = S_sw(j) - t_j S_w(j) into du (B*H, Tk, D) and
    -u_j . S_w(j) into dt_part (B*H, M, Tk), both in key order.

    S_w(j) sums w_i = g_i / (M den_i) and S_sw(j) sums s_i w_i over the queries above key j:
    prefix sums over the queries in descending order of s, read at above_count (B*H, M, Tk).
    """
    lo, hi = rows.start, rows.stop
    scalars = order.scalars
    slices = scalars.s.shape[1]
    k_len = u.shape[-2]
    descending = scalars.q_perm[lo:hi].flip(-1)
    inv = order.inv[lo:hi].gather(-1, descending)
    weights = inv.to(u.dtype), (scalars.s[lo:hi].gather(-1, descending) * inv).to(u.dtype)
    out = buffers[1][:, : len(rows) * slices * k_len]
    at_keys = prefix_at(grad_flat, descending, weights, above_count[lo:hi], rows, buffers[0], out=out)
    t_keys = scalars.t[lo:hi].to(u.dtype).unsqueeze(-1)
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
    scalars = order.scalars
    rows_total, slices, q_len = scalars.s.shape
    batch, heads, k_len, dim = u.shape
    grad = grad.reshape(rows_total, q_len, dim).to(u.dtype).contiguous()
    u = u.view(rows_total, k_len, dim)
    # Number of queries above each key, in key order.
    above_count = q_len - to_key_order(scalars, ranks_among_queries(scalars, right=True))

    dots = torch.empty(2, rows_total, slices, q_len, dtype=u.dtype, device=u.device)
    dt_part = torch.empty(rows_total, slices, k_len, dtype=u.dtype, device=u.device)
    du = torch.empty(rows_total, k_len, dim, dtype=u.dtype, device=u.device)
    pieces = chunks(rows_total, slices * max(q_len, k_len) * dim)
    groups = len(pieces[0]) * slices
    buffers = scratch(u, groups, q_len), scratch(u, groups, k_len)
    for rows, at_query in zip(pieces, at_queries):
        lo, hi = rows.start, rows.stop
        dots[:, lo:hi] = torch.einsum("kcmtd,ctd->kcmt", at_query, grad[lo:hi])
        _key_gradients(grad.view(-1, dim), u, order, above_count, rows, buffers, du, dt_part)

    # Scalar gradients, float64. g.N_i with N_i = s P_u[c] - P_tu[c] - relu_sum * residual.
    g_dot_u, g_dot_tu = dots.double()
    g_dot_r = (grad @ residual.unsqueeze(-1)).double().view(rows_total, 1, q_len)
    g_num = scalars.s * g_dot_u - g_dot_tu - order.relu_sum * g_dot_r
    # e_i = g_i . N_i / (M den_i^2); dL/ds_i = g_i . P_u[c] / (M den_i) - e_i sum_j sign(s_i - t_j).
    e = order.inv * g_num / torch.where(order.den > 0, order.den, 1.0)
    ds = order.inv * g_dot_u - e * (order.below + order.at_or_below - scalars.n_valid)
    # dL/dt_k = -u_k . S_w(k) + sum_{s_i > t_k} e_i - sum_{s_i < t_k} e_i, first in sorted order.
    e_by_below = torch.zeros(rows_total, slices, k_len + 1, dtype=e.dtype, device=e.device)
    e_by_below.scatter_add_(-1, order.below, e)
    e_by_at_or_below = torch.zeros_like(e_by_below).scatter_add_(-1, order.at_or_below, e)
    e_above = e.sum(-1, keepdim=True) - e_by_below.cumsum(-1)[..., :k_len]
    e_below = e_by_at_or_below.cumsum(-1)[..., :k_len]
    position = torch.arange(k_len, device=e.device)
    sign_part = torch.where(position < scalars.n_valid, e_above - e_below, 0.0)
    dt = to_key_order(scalars, sign_part)
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
        work = compute_dtype(v.dtype)
        padded = has_padding(valid)
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


def sliced_relu(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, key_padding_mask: Tensor | None = None
) -> Tensor:
    """Sliced ReLU attention; see the module docstring for the maths and shapes.

    query_scalars (B, H, Tq) or (B, H, M, Tq), key_scalars (B, H, Tk) or (B, H, M, Tk),
    value (B, H, Tk, D), key_padding_mask (B, Tk) bool (True = real token) or None
    -> (B, H, Tq, D) in value's dtype.
    """
    check_scalar_shapes(query_scalars, key_scalars, value, key_padding_mask)
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
    return _SlicedReLUFunction.apply(query_scalars, key_scalars, value, valid_keys(value, key_padding_mask))
