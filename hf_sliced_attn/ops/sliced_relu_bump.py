"""Sliced ReLU bump attention (the second kernel of arXiv 2512.11411's code) in O(n log n) time
and O(n) memory.

For one (batch, head, slice), with query scalars s (Tq), key scalars t (Tk), values
v (Tk, D) and the slice's bandwidth b > 0:

    out_i = (1 / n) sum_j k(s_i - t_j) v_j,    k(d) = max(0, 1 - |d| / b),

where j runs over the n valid keys (``key_padding_mask`` True). A row without a valid key
gets 0. With M slices (a bandwidth per head and slice) the M outputs are averaged.

Shapes: query_scalars (B, H, Tq) with bandwidth (H,), or (B, H, M, Tq) with bandwidth
(H, M); key_scalars (B, H, Tk) or (B, H, M, Tk); value (B, H, Tk, D); key_padding_mask
(B, Tk) bool, True for a real token -> (B, H, Tq, D) in value's dtype. fp16/bf16 are
computed in fp32. The bandwidth is b itself (positive); its parametrisation (softplus)
belongs to the module that learns it.

Algorithm. The keys are sorted once (padded keys last, outside every window). For a query
s, let l, c, r be the numbers of keys t <= s - b, t < s and t < s + b: the keys of the
window (s - b, s + b) sit at the sorted positions [l, r), those left of s at [l, c). With
prefix sums over the sorted keys P_v[k] = sum_{p<k} v_p and P_tv[k] = sum_{p<k} t_p v_p,

    left  = ((b - s) (P_v[c] - P_v[l]) + (P_tv[c] - P_tv[l])) / b       (t <= s)
    right = ((b + s) (P_v[r] - P_v[c]) - (P_tv[r] - P_tv[c])) / b       (t >= s)

and out = (left + right) / n; in the form computed here, with W the window's sum of v,
A = sum_{t>s} v - sum_{t<s} v and E = sum |s - t| v over the window,

    sum_j k(s - t_j) v_j = W - E / b,    E = (P_tv[r] + P_tv[l] - 2 P_tv[c]) - s A.

The edges of the window carry weight 0, so open or closed windows give the same values.
s and t are centred on the mean valid key (the kernel is shift-invariant) and the scalar
work is done in float64. The prefix sums are taken of u = v - vbar, whose partial sums do
not grow with the number of keys, and vbar is added back times the kernel's mass
sum_j k(s - t_j), computed in float64 from the same ranks and prefix sums of t.

Precision. A window sum is a difference of prefix sums over all the keys, so in float32
E carries an absolute error of about eps |P_tu|, which E / b divides by b: measured
against the float64 reference (max error / max output), the error is about 1e-6 for b of
the order of the scalars' spread sigma_t, and grows like sigma_t / b below that (about
1e-4 at b = sigma_t / 100, 1e-3 to 6e-3 at sigma_t / 1000, for T = 1k ... 64k). It does
not grow with offsets of the scalars or values, and hardly with T. float64 inputs are
computed in float64 (about 1e-11 at b = sigma_t / 1000).

The backward is written by hand (no autograd through sort, scan or gather); with
G_i = g_i / (M n) and the same window sums,

    dL/ds_i = G_i . A_i / b,     dL/db = sum_i G_i . E_i / b^2,
    dL/dv_j = sum_i k(s_i - t_j) G_i,     dL/dt_j = v_j . (sum_{s_i>t_j} G_i - sum_{s_i<t_j} G_i) / b,

the sums over i running over the queries within b of t_j. The kernel is symmetric, so
dL/dv and dL/dt are the forward's window sums with the roles swapped: prefix sums of g and
s g over the queries sorted by s, read at the ranks of t_j - b, t_j and t_j + b among the
queries. At a kink the gradient takes slope 0: a key tied with a query (|.|'s convention in
torch) and a key exactly at s +- b (ReLU's). The sorting, ranking, blocked prefix scans
and chunking are shared with :mod:`.sliced_relu` (:mod:`._sorted`).

Implementations. :func:`sliced_relu_bump` picks one by device, as :func:`.sliced_relu.sliced_relu`
does, never by a flag of the caller's: on CPU the C++ sweep kernel of :mod:`.sliced_relu_cpu`
(the same function and conventions, with no D-wide prefix tensors: three cursors through the
sorted keys carry the window's running sums in float64, so its float32 error does not grow as
the bandwidth narrows), where it builds; on other devices, and on CPU where no C++ compiler is
found (with a warning), the torch implementation above.

Departures from the authors' code (``models/sliced_relu_bump_attention.py`` of
github.com/SiwanB/Sliced_ReLU_Attention), which computes the same kernel:

* Numerics. The authors sort keys and queries together in float32 and take prefix sums of
  v and z v without centring either, so that (1 - z/b) P_v + P_zv / b cancels more as |z|/b
  and the sequence length grow. Here the scalars are centred in float64 and the values on
  their mean, which keeps the float32 error flat in T and in offsets of the scalars.
* Padding. The authors multiply the values by a 0/1 attention mask (a 4-D mask is read at
  ``[:, 0, :, 0]``, and an additive mask would be taken as weights) and keep the padded
  tokens' scalars in the sort; the output is the same, but padded tokens still get
  gradients through their scalars' ranks. Here a bool ``key_padding_mask`` removes padded
  keys from every window: their output weight and their gradients are exactly 0.
* Normalisation. The authors divide by the number of real tokens of the sequence, which in
  their self-attention is n, the number of valid keys, as here (also for Tq != Tk).
* Bandwidth. The authors learn b = softplus(p) + 1e-4 per head inside the attention; here
  b is an input, per head or per (head, slice), and M slices are averaged (the authors
  use one scalar per head).
* Gradients. The authors rely on autograd through cumsum and gather, which stores several
  (2T, D) tensors per head; the backward here keeps O(T) scalars and two (Tq, D) tensors
  per slice, and names its convention at the kinks (above).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import sliced_relu_cpu
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

__all__ = ["sliced_relu_bump"]

# Rank sets per point: l, c, r (points <= p - b, < p, < p + b) and c' (points <= p).
_LEFT, _BELOW, _RIGHT, _AT_OR_BELOW = range(4)


@dataclass
class _Windows:
    """Float64 scalar state of every (batch*head, slice) group; shapes (B*H, M, ·)."""

    scalars: SortedScalars
    b: Tensor  # bandwidth (.., 1)
    q: Tensor  # 1 / (M n), 0 without a valid key (B*H, 1, 1)
    ranks: Tensor  # l, c, r, c' of each query among the sorted keys (.., 4, Tq)
    sign_count: Tensor  # #{t > s} - #{t < s} over the window (.., Tq)
    abs_sum: Tensor  # sum |s - t| over the window (.., Tq)
    mass: Tensor  # sum_j k(s - t_j) (.., Tq)


def _window_ranks(rank: Callable[..., Tensor], b: Tensor) -> Tensor:
    """(.., 4, L) long: the ranks l, c, r, c' of points p (see _LEFT...) from rank(offset,
    right=...), the number of sorted entries < p + offset (<= with right). l <= c and
    r >= c' even where p +- b rounds to p."""
    below, at_or_below = rank(), rank(right=True)
    left = torch.minimum(rank(-b, right=True), below)
    right = torch.maximum(rank(b), at_or_below)
    return torch.stack([left, below, right, at_or_below], dim=-2)


def _find_windows(s: Tensor, t: Tensor, valid: Tensor, bandwidth: Tensor) -> _Windows:
    """Centre and sort the scalars, find every query's window, and its scalar sums."""
    scalars = sort_scalars(s, t, valid)
    rows, slices = scalars.s.shape[:2]
    b = bandwidth.double().expand(rows // bandwidth.shape[0], *bandwidth.shape).reshape(rows, slices, 1)
    n_valid = scalars.n_valid[:, :1].double()
    q = torch.where(n_valid > 0, 1.0 / (slices * n_valid.clamp_min(1)), 0.0)
    ranks = _window_ranks(lambda offset=None, right=False: ranks_among_keys(scalars, offset, right=right), b)
    left, below, right, at_or_below = ranks.unbind(-2)
    prefix_t = exclusive_cumsum(scalars.t_sorted)
    t_window = prefix_t.gather(-1, right) + prefix_t.gather(-1, left) - 2 * prefix_t.gather(-1, below)
    abs_sum = t_window - scalars.s * (right + left - 2 * below)
    sign_count = right - at_or_below - (below - left)
    mass = (right - left) - abs_sum / b
    return _Windows(scalars, b, q, ranks, sign_count, abs_sum, mass)


def _chunk_ranks(ranks: Tensor, lo: int, hi: int) -> Tensor:
    """The ranks of rows [lo, hi) to read, (hi - lo, M, K, L): l, c, r, and c' only when
    the chunk has a tie (c' > c). Under ``torch.compile`` c' is always read: whether there is
    a tie is data-dependent (a graph break), and the tie correction is 0 without one."""
    ranks = ranks[lo:hi]
    tied = torch.compiler.is_compiling() or bool((ranks[:, :, _AT_OR_BELOW] > ranks[:, :, _BELOW]).any())
    return ranks if tied else ranks[:, :, :_AT_OR_BELOW]


def _window_sums(at: Tensor, centre: Tensor, out: Tensor) -> Tensor:
    """Window sums of rows x at positions y around points p, from their prefix sums.

    at (2, R, M, K, L, D): P[k] = sum_{p<k} x_p and P_y[k] = sum_{p<k} y_p x_p read at the
    ranks l, c, r (and c' when K = 4) of the L points p (centre, (R, M, L)). Writes

        A = sum_{y>p} x - sum_{y<p} x,     E = sum |p - y| x,

    over the window, into out (2, R, M, L, D), and returns W = sum x over the window, a
    view of ``at`` (which it overwrites).
    """
    p_left, p_below, p_right = at[0, :, :, _LEFT], at[0, :, :, _BELOW], at[0, :, :, _RIGHT]
    y_left, y_below, y_right = at[1, :, :, _LEFT], at[1, :, :, _BELOW], at[1, :, :, _RIGHT]
    a, e = out
    p_right.sub_(p_below)  # sum over [c, r)
    p_left.sub_(p_below)  # minus the sum over [l, c)
    torch.add(p_right, p_left, out=a)
    y_right.sub_(y_below)
    y_left.sub_(y_below)
    torch.add(y_right, y_left, out=e)
    e.addcmul_(a, centre.unsqueeze(-1), value=-1)
    if at.shape[3] > _AT_OR_BELOW:
        # The positions tied with p, [c, c'), were counted right of it; a tie has sign 0.
        a.sub_(at[0, :, :, _AT_OR_BELOW].sub_(at[0, :, :, _BELOW]))
    return p_right.sub_(p_left)


def _kernel_sum(w: Tensor, e: Tensor, inv_b: Tensor, out: Tensor) -> Tensor:
    """out (R, L, D) = sum_m (W_m - E_m / b_m), W and E (R, M, L, D), inv_b (R, M, 1, 1)."""
    torch.addcmul(w[:, 0], e[:, 0], inv_b[:, 0], value=-1, out=out)
    for m in range(1, w.shape[1]):
        out += w[:, m]
        out.addcmul_(e[:, m], inv_b[:, m], value=-1)
    return out


def _forward(
    s: Tensor, t: Tensor, v: Tensor, bandwidth: Tensor, valid: Tensor, padded: bool, work: torch.dtype,
    keep: bool,
) -> tuple[Tensor, _Windows, Tensor, Tensor, list[Tensor]]:
    """out (B*H, Tq, D) in `work`, the scalar state, u = v - vbar, vbar (B*H, 1, D) and, per
    chunk of rows, A and E at the queries (2, rows, M, Tq, D), kept for the backward when
    ``keep`` (otherwise one buffer serves every chunk)."""
    windows = _find_windows(s, t, valid, bandwidth)
    scalars = windows.scalars
    u, mean = centred_values(v, valid, padded, work)
    rows_total, slices, q_len = scalars.s.shape
    k_len, dim = v.shape[-2:]
    u_flat, mean = u.view(-1, dim), mean.view(rows_total, 1, dim)
    t_sorted, s_work = scalars.t_sorted.to(work), scalars.s.to(work)
    inv_b = (1.0 / windows.b).to(work).unsqueeze(-1)  # (B*H, M, 1, 1)
    q = windows.q.to(work)  # (B*H, 1, 1)
    coef_mean = (windows.q * windows.mass).sum(1).to(work).unsqueeze(-1)  # (B*H, Tq, 1)
    out = torch.empty(rows_total, q_len, dim, dtype=work, device=v.device)
    saved: list[Tensor] = []
    pieces = chunks(rows_total, 3 * slices * max(q_len, k_len) * dim)
    groups = len(pieces[0]) * slices
    buffer, gathered = scratch(u, groups, k_len), scratch(u, groups, 4 * q_len)
    shared = None if keep else torch.empty(2, len(pieces[0]), slices, q_len, dim, dtype=work, device=v.device)
    for rows in pieces:
        lo, hi = rows.start, rows.stop
        ranks = _chunk_ranks(windows.ranks, lo, hi)
        at = prefix_at(
            u_flat, scalars.perm[lo:hi], (None, t_sorted[lo:hi]), ranks.flatten(-2), rows, buffer,
            out=gathered[:, : ranks.numel()],
        ).unflatten(3, ranks.shape[-2:])
        if shared is None:
            sums = torch.empty(2, len(rows), slices, q_len, dim, dtype=work, device=v.device)
            saved.append(sums)
        else:
            sums = shared[:, : len(rows)]
        w = _window_sums(at, s_work[lo:hi], sums)
        out_rows = _kernel_sum(w, sums[1], inv_b[lo:hi], out[lo:hi])
        out_rows.mul_(q[lo:hi]).addcmul_(coef_mean[lo:hi], mean[lo:hi])
    return out, windows, u, mean, saved


def _backward(
    grad: Tensor, windows: _Windows, u: Tensor, mean: Tensor, saved: list[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """dL/ds (B*H, M, Tq), dL/dt (B*H, M, Tk), dL/db (B*H, M) in float64 and dL/dv
    (B*H, Tk, D) in u's dtype."""
    scalars = windows.scalars
    rows_total, slices, q_len = scalars.s.shape
    k_len, dim = u.shape[-2:]
    work = u.dtype
    grad = grad.reshape(rows_total, q_len, dim).to(work).contiguous()
    grad_flat, u = grad.view(-1, dim), u.view(rows_total, k_len, dim)
    # l, c, r, c' of each key among the queries, in key order (Tq for padded keys: no window).
    ranks = _window_ranks(
        lambda offset=None, right=False: to_key_order(scalars, ranks_among_queries(scalars, offset, right=right)),
        windows.b,
    )
    s_sorted, t_work = scalars.s_sorted.to(work), scalars.t.to(work)
    inv_b = (1.0 / windows.b).to(work).unsqueeze(-1)

    dots = torch.empty(2, rows_total, slices, q_len, dtype=work, device=u.device)
    key_dots = torch.empty(2, rows_total, slices, k_len, dtype=work, device=u.device)
    dv = torch.empty(rows_total, k_len, dim, dtype=work, device=u.device)
    pieces = chunks(rows_total, 3 * slices * max(q_len, k_len) * dim)
    groups = len(pieces[0]) * slices
    buffer, gathered = scratch(u, groups, q_len), scratch(u, groups, 4 * k_len)
    sums = torch.empty(2, groups * k_len, dim, dtype=work, device=u.device)
    for rows, at_queries in zip(pieces, saved):
        lo, hi = rows.start, rows.stop
        # g_i . A_i and g_i . E_i, A and E of the forward's windows (u part).
        dots[:, lo:hi] = torch.einsum("kcmtd,ctd->kcmt", at_queries, grad[lo:hi])
        # The same window sums with the roles swapped: x = g over the queries sorted by s.
        chunk_ranks = _chunk_ranks(ranks, lo, hi)
        at = prefix_at(
            grad_flat, scalars.q_perm[lo:hi], (None, s_sorted[lo:hi]), chunk_ranks.flatten(-2), rows, buffer,
            out=gathered[:, : chunk_ranks.numel()],
        ).unflatten(3, chunk_ranks.shape[-2:])
        key_sums = sums[:, : len(rows) * slices * k_len].view(2, len(rows), slices, k_len, dim)
        w = _window_sums(at, t_work[lo:hi], key_sums)
        _kernel_sum(w, key_sums[1], inv_b[lo:hi], dv[lo:hi]).mul_(windows.q[lo:hi].to(work))
        # v_j . A_j with v = u + vbar: the sum of g over the queries right of t_j minus left.
        key_dots[0, lo:hi] = torch.einsum("cmkd,ckd->cmk", key_sums[0], u[lo:hi])
        key_dots[1, lo:hi] = torch.einsum("cmkd,cd->cmk", key_sums[0], mean[lo:hi, 0])

    g_dot_a, g_dot_e = dots.double()
    g_dot_mean = (grad @ mean.transpose(-1, -2)).double().view(rows_total, 1, q_len)  # g_i . vbar
    scale = windows.q / windows.b  # (B*H, M, 1)
    ds = scale * (g_dot_a + windows.sign_count * g_dot_mean)
    db = (scale / windows.b * (g_dot_e + windows.abs_sum * g_dot_mean)).sum(-1)
    dt = scale * key_dots.double().sum(0)
    return ds, dt, db, dv


class _SlicedReLUBumpFunction(torch.autograd.Function):
    """Sliced ReLU bump attention on 4-D scalars and an (H, M) bandwidth, with the
    hand-written backward above; ``keep``: whether to keep what the backward needs."""

    @staticmethod
    def forward(ctx, s: Tensor, t: Tensor, v: Tensor, bandwidth: Tensor, valid: Tensor, keep: bool) -> Tensor:
        work = compute_dtype(v.dtype)
        padded = has_padding(valid)
        out, windows, u, mean, saved = _forward(s, t, v, bandwidth, valid, padded, work, keep)
        if keep:
            ctx.state = (windows, u, mean, saved)
            ctx.dtypes = (s.dtype, t.dtype, v.dtype, bandwidth.dtype)
        batch, heads = v.shape[:2]
        return out.view(batch, heads, *out.shape[1:]).to(v.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None, None]:
        windows, u, mean, saved = ctx.state
        ds, dt, db, dv = _backward(grad, windows, u, mean, saved)
        batch, heads = u.shape[:2]
        s_dtype, t_dtype, v_dtype, b_dtype = ctx.dtypes
        return (
            ds.view(batch, heads, *ds.shape[1:]).to(s_dtype),
            dt.view(batch, heads, *dt.shape[1:]).to(t_dtype),
            dv.view(u.shape).to(v_dtype),
            db.view(batch, heads, -1).sum(0).to(b_dtype),
            None,
            None,
        )


def _check_bandwidth(bandwidth: Tensor, query_scalars: Tensor) -> None:
    """Raise ValueError unless bandwidth is (H,) for (B, H, Tq) scalars or (H, M) for
    (B, H, M, Tq) scalars, and positive. Under ``torch.compile`` the sign is checked by the
    graph when it runs (a RuntimeError): reading the values while tracing is a graph break."""
    expected = tuple(query_scalars.shape[1:-1])
    if tuple(bandwidth.shape) != expected:
        name = "(H,)" if len(expected) == 1 else "(H, M)"
        raise ValueError(
            f"bandwidth must have shape {name} = {expected} for query_scalars of shape "
            f"{tuple(query_scalars.shape)}, got {tuple(bandwidth.shape)}"
        )
    positive = "bandwidth must be positive (it is the kernel's half-width b itself, not a pre-softplus parameter)"
    if torch.compiler.is_compiling():
        torch._assert_async((bandwidth > 0).all(), positive)
    elif not bool((bandwidth > 0).all()):
        raise ValueError(f"{positive}, got a minimum of {bandwidth.min().item()}")


def sliced_relu_bump(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, bandwidth: Tensor,
    key_padding_mask: Tensor | None = None, *, return_denominator: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Sliced ReLU bump attention; see the module docstring for the maths and shapes.

    query_scalars (B, H, Tq) or (B, H, M, Tq), key_scalars (B, H, Tk) or (B, H, M, Tk),
    value (B, H, Tk, D), bandwidth b > 0 (H,) or (H, M), key_padding_mask (B, Tk) bool
    (True = real token) or None -> (B, H, Tq, D) in value's dtype.

    With ``return_denominator``, also the kernel's normaliser: the number n of valid keys,
    by which the sum of k(s_i - t_j) v_j is divided, in query_scalars' shape, in float32
    (float64 for float64 values); a constant, with no gradient. It is what the shared
    normalisation of :mod:`.local_window` reads, as :func:`.sliced_relu.sliced_relu` gives its D.
    """
    if return_denominator:
        out = sliced_relu_bump(query_scalars, key_scalars, value, bandwidth, key_padding_mask)
        n_valid = valid_keys(value, key_padding_mask).sum(-1).to(compute_dtype(value.dtype))
        return out, n_valid.view(-1, *[1] * (query_scalars.dim() - 1)).expand(query_scalars.shape)
    check_scalar_shapes(query_scalars, key_scalars, value, key_padding_mask)
    _check_bandwidth(bandwidth, query_scalars)
    if query_scalars.dim() == 3:
        query_scalars, key_scalars = query_scalars.unsqueeze(2), key_scalars.unsqueeze(2)
        bandwidth = bandwidth.unsqueeze(1)
    bandwidth = bandwidth.to(value.device)
    valid = valid_keys(value, key_padding_mask)
    if value.device.type == "cpu" and sliced_relu_cpu.bump_available():
        return sliced_relu_cpu.sliced_relu_bump_cpu(query_scalars, key_scalars, value, bandwidth, valid)
    # What the backward needs is kept only when there will be one (not under no_grad).
    keep = torch.is_grad_enabled() and any(x.requires_grad for x in (query_scalars, key_scalars, value, bandwidth))
    return _SlicedReLUBumpFunction.apply(query_scalars, key_scalars, value, bandwidth, valid, keep)
