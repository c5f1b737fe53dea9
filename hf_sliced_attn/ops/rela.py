"""Rectified linear attention (ReLA, arXiv 2104.07012): on CPU the C++ kernel, elsewhere query blocks.

Per batch element and head, with scores S = Q K^T * scaling (scaling defaults to D^-1/2):

    A = ReLU(S) ⊙ M,    O = A V,

where M is 1 for the pairs (i, j) that may interact and 0 otherwise: key j is a real
token (``key_padding_mask[b, j]`` is True) and, with a sliding window w, |i - j| <= w - 1
(i and j indexed from 0 in their own sequences, as ModernBERT's local layers do). There is
no softmax and no normalisation; masked pairs contribute exactly 0.

Shapes: query (B, H, Tq, D), key and value (B, H, Tk, D), key_padding_mask (B, Tk) bool
-> output (B, H, Tq, D) in the input dtype (float16/bfloat16 are computed in float32).

Implementations. On CPU, where the C++ kernel builds (:func:`.rela_cpu.available`, the rule and the
``HF_SLICED_ATTN_NATIVE`` switch of the package's other kernels), :func:`rela` runs
:func:`.rela_cpu.rela_cpu`: (query tile, key tile) pairs of scores that stay in cache, each product a
BLAS call, several times faster than the torch implementation below (which it computes exactly, up
to rounding) and at least as fast as SDPA's CPU flash kernel. On other devices, and on CPUs without
a compiler, the torch implementation of this module runs.

Memory of the torch implementation. The queries are processed ``block_size`` rows at a time, so only a
(B, H, block, Tk) slab of scores exists at once (with a window, only the keys of the band
[start - w + 1, end + w - 2] are touched; the others are skipped). The backward pass is a
custom :class:`torch.autograd.Function` that recomputes each block's weights
(flash-attention style, but ReLU needs no running max):

    dV = A^T dO,   dA = dO V^T,   dS = dA ⊙ 1[A > 0],   dQ = scaling · dS K,   dK = dS^T (scaling · Q).

When all queries fit in one block the weights A ((B, H, Tq, Tk), no more than a block's
worth) are kept from the forward pass instead, saving one matmul on the fast short path.
Key padding is applied by zeroing the padded key rows, which makes their scores exactly 0,
so ReLU gives 0 weight and 0 gradient without a (Tq, Tk) mask.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import rela_cpu
from ._common import band_mask, check_key_padding_mask, check_sliding_window, compute_dtype, key_range

__all__ = ["rela"]


def _block_weights(
    q_scaled: torch.Tensor, key: torch.Tensor, start: int, end: int, lo: int, hi: int,
    sliding_window: int | None,
) -> torch.Tensor:
    """A for queries [start, end) and keys [lo, hi): ReLU(Q_b K_b^T * scaling), out-of-window pairs 0."""
    weights = torch.matmul(q_scaled[:, :, start:end], key[:, :, lo:hi].transpose(-1, -2)).relu_()
    band = band_mask(start, end, lo, hi, sliding_window, weights.device)
    if band is not None:
        weights.masked_fill_(~band, 0.0)
    return weights


def _forward(
    q_scaled: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    sliding_window: int | None, block_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """O = A V block by block; also returns A when the queries fit in one block (else None)."""
    q_len, k_len = q_scaled.shape[2], key.shape[2]
    if q_len <= block_size:
        lo, hi = key_range(0, q_len, k_len, sliding_window)
        weights = _block_weights(q_scaled, key, 0, q_len, lo, hi, sliding_window)
        return torch.matmul(weights, value[:, :, lo:hi]), weights
    blocks = []
    for start in range(0, q_len, block_size):
        end = min(start + block_size, q_len)
        lo, hi = key_range(start, end, k_len, sliding_window)
        if lo >= hi:
            blocks.append(value.new_zeros(*value.shape[:2], end - start, value.shape[3]))
            continue
        weights = _block_weights(q_scaled, key, start, end, lo, hi, sliding_window)
        blocks.append(torch.matmul(weights, value[:, :, lo:hi]))
    return torch.cat(blocks, dim=2), None


def _prepare(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    key_padding_mask: torch.Tensor | None, scaling: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compute-dtype copies: scaling * Q, K with padded rows zeroed, V."""
    dtype = compute_dtype(query.dtype)
    q_scaled = query.to(dtype) * scaling
    key = key.to(dtype)
    if key_padding_mask is not None:
        key = key.masked_fill(~key_padding_mask[:, None, :, None], 0.0)
    return q_scaled, key, value.to(dtype)


class _ReLAFunction(torch.autograd.Function):
    """ReLA with a backward pass that recomputes block weights; see the module docstring."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        key_padding_mask: torch.Tensor | None, scaling: float,
        sliding_window: int | None, block_size: int,
    ) -> torch.Tensor:
        q_scaled, key_c, value_c = _prepare(query, key, value, key_padding_mask, scaling)
        out, weights = _forward(q_scaled, key_c, value_c, sliding_window, block_size)
        ctx.save_for_backward(q_scaled, key_c, value_c, key_padding_mask, weights)
        ctx.scaling, ctx.sliding_window, ctx.block_size = scaling, sliding_window, block_size
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        return out.to(query.dtype)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        q_scaled, key, value, key_padding_mask, saved_weights = ctx.saved_tensors
        scaling, sliding_window, block_size = ctx.scaling, ctx.sliding_window, ctx.block_size
        grad_out = grad_out.to(q_scaled.dtype)
        q_len, k_len = q_scaled.shape[2], key.shape[2]
        grad_k = torch.zeros_like(key)
        grad_v = torch.zeros_like(value)
        grad_q_blocks = []
        for start in range(0, q_len, block_size):
            end = min(start + block_size, q_len)
            lo, hi = key_range(start, end, k_len, sliding_window)
            if lo >= hi:
                grad_q_blocks.append(q_scaled.new_zeros(*q_scaled.shape[:2], end - start, q_scaled.shape[3]))
                continue
            weights = (
                saved_weights if saved_weights is not None
                else _block_weights(q_scaled, key, start, end, lo, hi, sliding_window)
            )
            grad_o = grad_out[:, :, start:end]
            grad_v[:, :, lo:hi] += torch.matmul(weights.transpose(-1, -2), grad_o)
            grad_s = torch.matmul(grad_o, value[:, :, lo:hi].transpose(-1, -2))
            # dS = dA ⊙ 1[A > 0], written over dA (ReLU's own backward kernel, in place)
            torch.ops.aten.threshold_backward.grad_input(grad_s, weights, 0, grad_input=grad_s)
            del weights
            grad_q_blocks.append(torch.matmul(grad_s, key[:, :, lo:hi]))
            grad_k[:, :, lo:hi] += torch.matmul(grad_s.transpose(-1, -2), q_scaled[:, :, start:end])
        if len(grad_q_blocks) == 1:
            grad_q = grad_q_blocks[0]
        else:  # no blocks when Tq = 0
            grad_q = torch.cat(grad_q_blocks, dim=2) if grad_q_blocks else torch.zeros_like(q_scaled)
        grad_q.mul_(scaling)
        if key_padding_mask is not None:
            grad_k.masked_fill_(~key_padding_mask[:, None, :, None], 0.0)
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        return grad_q.to(q_dtype), grad_k.to(k_dtype), grad_v.to(v_dtype), None, None, None, None


def _validate(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    key_padding_mask: torch.Tensor | None, sliding_window: int | None, block_size: int,
) -> None:
    if query.dim() != 4:
        raise ValueError(f"query must have shape (B, H, Tq, D), got {tuple(query.shape)}")
    batch, heads, _, dim = query.shape
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 4 or (tensor.shape[0], tensor.shape[1], tensor.shape[3]) != (batch, heads, dim):
            raise ValueError(
                f"{name} must have shape (B, H, Tk, D) = ({batch}, {heads}, Tk, {dim}) to match "
                f"query {tuple(query.shape)}, got {tuple(tensor.shape)}"
            )
    if value.shape[2] != key.shape[2]:
        raise ValueError(
            f"value must have shape (B, H, Tk, D) = {tuple(key.shape)} like key, got {tuple(value.shape)}"
        )
    if not (query.dtype == key.dtype == value.dtype) or not query.is_floating_point():
        raise ValueError(
            f"query, key and value must share one floating dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    check_key_padding_mask(key_padding_mask, batch, key.shape[2])
    check_sliding_window(sliding_window)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def rela(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
    block_size: int = 512,
    return_denominator: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rectified linear attention: O = (ReLU(Q K^T * scaling) ⊙ M) V, without materialising (Tq, Tk).

    Args:
        query: (B, H, Tq, D).
        key, value: (B, H, Tk, D), same dtype as query.
        key_padding_mask: optional (B, Tk) bool, True for a real token; padded keys get weight 0.
        scaling: score scale, D^-1/2 by default.
        sliding_window: w keeps the pairs with |i - j| <= w - 1; None keeps all.
        block_size: queries per block of the torch implementation. Scores exist (B, H, block_size,
            Tk) at a time in the forward and backward passes; sequences up to this length run as
            one block. The CPU kernel tiles by itself (256 x 256 scores per thread) and ignores it.
        return_denominator: also return each query's total weight D_i = sum_j A_ij (the normaliser
            the shared normalisation of :mod:`.local_window` needs).

    Returns:
        (B, H, Tq, D) in query's dtype. Queries with no allowed key get 0. With ``return_denominator``,
        also D (B, H, Tq) in float32 (float64 for float64 inputs), differentiable in query and key.
    """
    _validate(query, key, value, key_padding_mask, sliding_window, block_size)
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(device=key.device, dtype=torch.bool)
    if query.device.type == "cpu" and rela_cpu.available():
        valid = (torch.ones(key.shape[0], key.shape[2], dtype=torch.bool) if key_padding_mask is None
                 else key_padding_mask)
        out, denominator = rela_cpu.rela_cpu(query, key, value, valid, sliding_window=sliding_window, scaling=scaling)
        return (out, denominator) if return_denominator else out
    if return_denominator:
        return _with_denominator(query, key, value, key_padding_mask, scaling, sliding_window, block_size)
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        return _ReLAFunction.apply(query, key, value, key_padding_mask, scaling, sliding_window, block_size)
    q_scaled, key_c, value_c = _prepare(query, key, value, key_padding_mask, scaling)
    return _forward(q_scaled, key_c, value_c, sliding_window, block_size)[0].to(query.dtype)


def _with_denominator(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: torch.Tensor | None,
    scaling: float, sliding_window: int | None, block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and D = A 1 in one pass of the torch implementation (the CPU kernel returns D itself): a zero feature
    appended to the queries and keys leaves every score as it is, and a feature of ones appended to the values
    makes A's row sums O's last column. Computed in float32 for half inputs, so that D (a sum over every key)
    cannot overflow."""
    work = compute_dtype(value.dtype)

    def extended(x: torch.Tensor, fill: float) -> torch.Tensor:
        x = x.to(work)
        return torch.cat([x, x.new_full((*x.shape[:-1], 1), fill)], dim=-1)

    out = rela(extended(query, 0.0), extended(key, 0.0), extended(value, 1.0), key_padding_mask,
               scaling=scaling, sliding_window=sliding_window, block_size=block_size)
    return out[..., :-1].to(query.dtype), out[..., -1]
