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

Algorithm. Only the keys are sorted (padded keys go last and are never summed). With
u = v - vbar (formed in cache as the rows are gathered; no centred copy of v is made) and
the keys in sorted order, prefix sums P_u[c] = sum_{k<c} u_k,
P_tu[c] = sum_{k<c} t_k u_k and P_t[c] = sum_{k<c} t_k give, for a query with c keys
strictly below it and n valid keys,

    numerator   = s P_u[c] - P_tu[c]
    denominator = (s c - P_t[c]) + (P_t[n] - P_t[c']) - s (n - c'),

c' counting the keys <= s (so ties contribute exactly 0). s and t are centred on the mean
valid key (the kernel is shift-invariant), scalar work is done in float64, and the mean
r = P_u[n] / n that rounding leaves in the fp32 rows u (read from each slice's own prefix
sums) is removed by subtracting (s c - P_t[c]) r from the numerator, which keeps the
error flat in the sequence length.

The backward is written by hand (no autograd through sort, scan or gather). With
w_i = g_i / (M den_i), the key at sorted position k gets

    dL/du_k = sum_{c_i > k} (s_i - t_k) w_i = S_sw(k) - t_k S_w(k),

where S_w and S_sw are prefix sums of w_i and s_i w_i over the queries in descending order
of s, read at the number of queries above key k. dL/dv is dL/du minus its mean over the
valid keys; dL/ds and dL/dt follow in closed form from the same ranks (a tie counts as
sign 0 and ReLU slope 0).

The sorting, ranking, blocked prefix scans and chunking are shared with the other sliced
kernels (:mod:`._sorted`); this module holds the ReLU kernel's coefficients and gradients.

Implementations. :func:`sliced_relu` picks one by device, never by a flag of the caller's:
on CPU the C++ sweep kernel of :mod:`.sliced_relu_cpu` (the same function, with no D-wide
prefix tensors at all, several times faster at every length), where it builds; on other
devices, and on CPU where no C++ compiler is found (with a warning), the torch
implementation above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import sliced_relu_cpu
from ._common import compute_dtype
from ._sorted import (
    SortedScalars,
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


def _kernel_sums(scalars: SortedScalars) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ranks c, c' of every query among the sorted keys, sum_j ReLU(s - t_j) and the
    denominator sum_j |s - t_j| (float64, (B*H, M, Tq)), from prefix sums of the sorted t:

        relu_sum = s c - P_t[c],    den = relu_sum + (P_t[n] - P_t[c']) - s (n - c').

    Plain torch ops: autograd differentiates den in s and t (a tie has sign 0)."""
    s64, n_valid = scalars.s, scalars.n_valid
    below = ranks_among_keys(scalars)
    at_or_below = ranks_among_keys(scalars, right=True)
    prefix_t = exclusive_cumsum(scalars.t_sorted)
    relu_sum = s64 * below - prefix_t.gather(-1, below)
    above_sum = prefix_t[..., -1:] - prefix_t.gather(-1, at_or_below) - s64 * (n_valid - at_or_below)
    return below, at_or_below, relu_sum, relu_sum + above_sum


def _order_keys(s: Tensor, t: Tensor, valid: Tensor) -> _KeyOrder:
    """Centre s and t, sort the keys, rank the queries and form the denominators."""
    scalars = sort_scalars(s, t, valid)
    slices = s.shape[2]
    below, at_or_below, relu_sum, den = _kernel_sums(scalars)
    positive = den > 0
    inv = torch.where(positive, 1.0 / (slices * torch.where(positive, den, 1.0)), 0.0)
    return _KeyOrder(scalars, below, at_or_below, relu_sum, den, inv)


def _value_centre(v: Tensor, valid: Tensor, padded: bool) -> Tensor:
    """vbar (B*H, D): the mean of the valid keys' values of v (B, H, Tk, D), in v's dtype,
    without a copy of v. Any centre would do (the rounding it leaves is measured per slice,
    see :func:`_forward`); this one keeps the prefix sums small."""
    batch, _, k_len, dim = v.shape
    if padded:
        total = torch.matmul(valid.to(v.dtype).view(batch, 1, 1, k_len), v).squeeze(-2)
    else:
        total = v.sum(-2)
    return (total / valid.sum(-1).view(batch, 1, 1).clamp_min(1)).view(-1, dim)


def _forward(
    s: Tensor, t: Tensor, v: Tensor, valid: Tensor, padded: bool, for_backward: bool
) -> tuple[Tensor, _KeyOrder, Tensor, Tensor, list[Tensor]]:
    """out (B*H, Tq, D) in v's dtype (the work dtype), the scalar state, the centre vbar
    (B*H, D), the residual means r (B*H, M, D) and P at the queries (kept only ``for_backward``).

    u_j = fl(v_j - vbar) is formed in the gathered rows; r_m = P_u[n] / n, the mean that
    rounding left in them (about 1e-8 |vbar| in fp32), is read from slice m's own prefix
    sums and removed from its numerator in closed form, which keeps the error flat in the
    sequence length.
    """
    order = _order_keys(s, t, valid)
    scalars = order.scalars
    centre = _value_centre(v, valid, padded)
    rows_total, slices, q_len = scalars.s.shape
    k_len, dim = v.shape[-2:]
    work = v.dtype
    v_flat = v.view(-1, dim)
    t_sorted = scalars.t_sorted.to(work)
    # The queries' ranks, then n (valid keys) per group, where P_u[n] = n r_m is read.
    ranks = torch.cat([order.below, scalars.n_valid], -1)
    n_inv = (1.0 / scalars.n_valid.clamp_min(1)).to(work)  # (B*H, M, 1)
    # out = sum_m (s P_u[c] - P_tu[c] - relu_sum r_m) / (M den); the prefix sums read only
    # sorted positions < n, so padded rows never enter them.
    coef_u = (scalars.s * order.inv).to(work).unsqueeze(-1)  # (B*H, M, Tq, 1)
    coef_tu = order.inv.to(work).unsqueeze(-1)
    coef_r = (order.relu_sum * order.inv).to(work).transpose(1, 2)  # (B*H, Tq, M)
    out = torch.empty(rows_total, q_len, dim, dtype=work, device=v.device)
    residual = torch.empty(rows_total, slices, dim, dtype=work, device=v.device)
    at_queries = []
    pieces = chunks(rows_total, slices * max(q_len, k_len) * dim)
    buffer = scratch(v, len(pieces[0]) * slices, k_len)
    # Without a backward, one buffer for P at the queries serves every chunk (fresh memory
    # is page-faulted on first use).
    reused = None if for_backward else scratch(v, len(pieces[0]) * slices, q_len + 1)[:, 1:]
    for rows in pieces:
        lo, hi = rows.start, rows.stop
        # P_u and P_tu at each query's rank and at n, (2, len(rows), M, Tq + 1, D).
        target = None if reused is None else reused[:, : len(rows) * slices * (q_len + 1)]
        at_query = prefix_at(
            v_flat, scalars.perm[lo:hi], (None, t_sorted[lo:hi]), ranks[lo:hi], rows, buffer,
            out=target, centre=centre[lo:hi],
        )
        torch.mul(at_query[0, :, :, q_len], n_inv[lo:hi], out=residual[lo:hi])
        out_rows = out[lo:hi]
        torch.mul(at_query[0, :, 0, :q_len], coef_u[lo:hi, 0], out=out_rows)
        out_rows.addcmul_(at_query[1, :, 0, :q_len], coef_tu[lo:hi, 0], value=-1)
        for m in range(1, slices):
            out_rows.addcmul_(at_query[0, :, m, :q_len], coef_u[lo:hi, m])
            out_rows.addcmul_(at_query[1, :, m, :q_len], coef_tu[lo:hi, m], value=-1)
        out_rows.baddbmm_(coef_r[lo:hi], residual[lo:hi], alpha=-1)
        if for_backward:
            at_queries.append(at_query[..., :q_len, :])
    return out, order, centre, residual, at_queries


def _key_gradients(
    grad_flat: Tensor, v: Tensor, centre: Tensor, order: _KeyOrder, above_count: Tensor, rows: range,
    buffers: tuple[Tensor, Tensor], du: Tensor, dt_part: Tensor,
) -> None:
    """For a chunk of rows, write dL/du_j = S_sw(j) - t_j S_w(j) into du (B*H, Tk, D) and
    -u_j . S_w(j) = (vbar - v_j) . S_w(j) into dt_part (B*H, M, Tk), both in key order;
    v (B*H, Tk, D), centre vbar (B*H, D).

    S_w(j) sums w_i = g_i / (M den_i) and S_sw(j) sums s_i w_i over the queries above key j:
    prefix sums over the queries in descending order of s, read at above_count (B*H, M, Tk).
    """
    lo, hi = rows.start, rows.stop
    scalars = order.scalars
    slices = scalars.s.shape[1]
    k_len = v.shape[-2]
    descending = scalars.q_perm[lo:hi].flip(-1)
    inv = order.inv[lo:hi].gather(-1, descending)
    weights = inv.to(v.dtype), (scalars.s[lo:hi].gather(-1, descending) * inv).to(v.dtype)
    out = buffers[1][:, : len(rows) * slices * k_len]
    at_keys = prefix_at(grad_flat, descending, weights, above_count[lo:hi], rows, buffers[0], out=out)
    t_keys = scalars.t[lo:hi].to(v.dtype).unsqueeze(-1)
    du_rows = du[lo:hi]
    torch.addcmul(at_keys[1, :, 0], at_keys[0, :, 0], t_keys[:, 0], value=-1, out=du_rows)
    for m in range(1, slices):
        du_rows += at_keys[1, :, m]
        du_rows.addcmul_(at_keys[0, :, m], t_keys[:, m], value=-1)
    dt_part[lo:hi] = (
        torch.einsum("cmkd,cd->cmk", at_keys[0], centre[lo:hi]) - torch.einsum("cmkd,ckd->cmk", at_keys[0], v[lo:hi])
    )


def _backward(
    grad: Tensor, order: _KeyOrder, v: Tensor, centre: Tensor, residual: Tensor, at_queries: list[Tensor],
    valid: Tensor, padded: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """dL/ds (B*H, M, Tq), dL/dt (B*H, M, Tk) in float64 and dL/dv (B, H, Tk, D) in v's dtype."""
    scalars = order.scalars
    rows_total, slices, q_len = scalars.s.shape
    batch, heads, k_len, dim = v.shape
    grad = grad.reshape(rows_total, q_len, dim).to(v.dtype).contiguous()
    v = v.view(rows_total, k_len, dim)
    # Number of queries above each key, in key order.
    above_count = q_len - to_key_order(scalars, ranks_among_queries(scalars, right=True))

    dots = torch.empty(2, rows_total, slices, q_len, dtype=v.dtype, device=v.device)
    dt_part = torch.empty(rows_total, slices, k_len, dtype=v.dtype, device=v.device)
    du = torch.empty(rows_total, k_len, dim, dtype=v.dtype, device=v.device)
    pieces = chunks(rows_total, slices * max(q_len, k_len) * dim)
    groups = len(pieces[0]) * slices
    buffers = scratch(v, groups, q_len), scratch(v, groups, k_len)
    for rows, at_query in zip(pieces, at_queries):
        lo, hi = rows.start, rows.stop
        dots[:, lo:hi] = torch.einsum("kcmtd,ctd->kcmt", at_query, grad[lo:hi])
        _key_gradients(grad.view(-1, dim), v, centre, order, above_count, rows, buffers, du, dt_part)
    if padded:  # u_j is 0 on a padded key; v_j - vbar is not
        dt_part.view(batch, heads, slices, k_len).masked_fill_(~valid.view(batch, 1, 1, k_len), 0)

    # Scalar gradients, float64. g.N_i with N_i = s P_u[c] - P_tu[c] - relu_sum * residual.
    g_dot_u, g_dot_tu = dots.double()
    g_dot_r = torch.bmm(residual, grad.transpose(1, 2)).double()  # (B*H, M, Tq)
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
        padded = has_padding(valid)
        for_backward = any(ctx.needs_input_grad[:3])
        work = v.to(compute_dtype(v.dtype)).contiguous()
        out, order, centre, residual, at_queries = _forward(s, t, work, valid, padded, for_backward)
        if for_backward:
            # v itself may be the caller's tensor: save_for_backward guards it against in-place changes.
            ctx.save_for_backward(work)
            ctx.state = (order, centre, residual, at_queries, valid, padded)
            ctx.dtypes = (s.dtype, t.dtype, v.dtype)
        batch, heads = v.shape[:2]
        return out.view(batch, heads, *out.shape[1:]).to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        (v,) = ctx.saved_tensors
        order, centre, residual, at_queries, valid, padded = ctx.state
        ds, dt, dv = _backward(grad, order, v, centre, residual, at_queries, valid, padded)
        batch, heads = dv.shape[:2]
        ds = ds.view(batch, heads, *ds.shape[1:])
        dt = dt.view(batch, heads, *dt.shape[1:])
        s_dtype, t_dtype, v_dtype = ctx.dtypes
        return ds.to(s_dtype), dt.to(t_dtype), dv.to(v_dtype), None


def _denominator(s: Tensor, t: Tensor, valid: Tensor) -> Tensor:
    """D = sum_l |s_i - t_l| over the valid keys, (B, H, M, Tq), for s (B, H, M, Tq), t (B, H, M, Tk)
    and valid (B, Tk), on the torch path: the sort and ranks of :mod:`._sorted` and the prefix sums
    of :func:`_kernel_sums`, O(Tk log Tk + Tq log Tk) scalar work with no D-wide tensor,
    differentiable by autograd (:class:`_SlicedReLUFunction` returns only its output; the C++
    kernel returns D itself)."""
    return _kernel_sums(sort_scalars(s, t, valid))[3].view(s.shape)


def sliced_relu(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, key_padding_mask: Tensor | None = None, *,
    return_denominator: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Sliced ReLU attention; see the module docstring for the maths and shapes.

    query_scalars (B, H, Tq) or (B, H, M, Tq), key_scalars (B, H, Tk) or (B, H, M, Tk),
    value (B, H, Tk, D), key_padding_mask (B, Tk) bool (True = real token) or None
    -> (B, H, Tq, D) in value's dtype.

    With ``return_denominator``, also the kernel's normaliser D_i = sum_l |s_i - t_l| over the
    valid keys, in query_scalars' shape ((B, H, Tq) or (B, H, M, Tq)), in float32 (float64 for
    float64 values), differentiable in the scalars: per slice, out_i = N_i / D_i with N_i the
    unnormalised numerator sum_j ReLU(s_i - t_j) (v_j - vbar) (0 where D_i = 0). The shared
    normalisation of :mod:`.local_window` needs it.
    """
    check_scalar_shapes(query_scalars, key_scalars, value, key_padding_mask)
    shape = query_scalars.shape
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
    valid = valid_keys(value, key_padding_mask)
    if value.device.type == "cpu" and sliced_relu_cpu.available():
        out, den = sliced_relu_cpu.sliced_relu_cpu(query_scalars, key_scalars, value, valid)
    else:
        out = _SlicedReLUFunction.apply(query_scalars, key_scalars, value, valid)
        den = _denominator(query_scalars, key_scalars, valid) if return_denominator else None
    if not return_denominator:
        return out
    return out, den.to(compute_dtype(value.dtype)).view(shape)
