"""Rectified linear attention on CPU: the C++ kernel ``csrc/rela_cpu.cpp`` as torch custom ops.

Per (batch, head), with S = scaling · Q K^T, the mask M (valid key and, with a window w,
|i - j| <= w - 1) and A = ReLU(S) ⊙ M, the forward gives O = A V and each query's total weight
N_i = sum_j A_ij (the normaliser :func:`.rela.rela` returns with ``return_denominator``), and the backward,
for the gradients dO of O and dN of N, recomputes A tile by tile:

    dV = A^T dO,   dS = (dO V^T + dN 1^T) ⊙ 1[A > 0],   dQ = scaling · dS K,   dK = scaling · dS^T Q.

The kernel goes over (query tile, key tile) pairs of 256 x 256 scores that stay in the core's
cache, each product one BLAS call (torch's own MKL ``sgemm_``/``dgemm_``), skipping the tiles the
window or the padding masks entirely; nothing pair-sized outlives a tile (see the source's header).

With a softmax window beside it (:func:`rela_window_kernel`, what :func:`.local_window_cpu.rela_local_window_cpu`
runs), the same pass gives each query's softmax over the keys with |i - j| <= band, and the backward adds that
window's score gradients into ReLA's before the products that make dQ and dK (see the source's header).

The ops are ``torch.library`` custom ops (``hf_sliced_attn::rela_cpu`` and its backward) with fake
implementations, so ``torch.compile(fullgraph=True)`` keeps them whole. :func:`.rela.rela` picks
this path for CPU tensors when the kernel builds (:func:`available`); its torch implementation
computes the same function on any device.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _native
from ._common import compute_dtype
from .sliced_relu_cpu import _output

__all__ = ["available", "rela_cpu"]

# step -> number of tensor arguments (the strides array excluded).
_STEPS = {"forward": 9, "backward": 12}


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels() is not None


@functools.cache
def _kernels() -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points with their argument types, keyed by ``<step>_<dtype>``; None without the library."""
    # (B, H, Tq, Tk, D), the halo, the softmax window's halo, the scaling.
    return _native.entry_points("rela_cpu", "rela", [ctypes.c_int64] * 7 + [ctypes.c_double], _STEPS)


def _rows(x: Tensor) -> Tensor:
    """x itself when its tokens are rows BLAS can read in place (a contiguous last dim, token stride
    >= D), else a contiguous copy."""
    return x if x.stride(-1) == 1 and x.stride(-2) >= x.shape[-1] else x.contiguous()


def _call(step: str, halo: int, band: int, scaling: float, tensors: tuple[Tensor | None, ...],
          rows: tuple[Tensor, ...], k_len: int) -> None:
    """Run ``step`` for the dtype of the (B, H, T, D) ``rows`` (passed with their (batch, head, token) strides);
    None among ``tensors`` is a null pointer (the window's tensors, without a window)."""
    batch, heads, q_len, dim = rows[0].shape
    suffix = {torch.float32: "f32", torch.float64: "f64"}[rows[0].dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(None if x is None else x.data_ptr()) for x in tensors]
    status = _kernels()[f"{step}_{suffix}"](
        batch, heads, q_len, k_len, dim, halo, band, scaling, *pointers, (ctypes.c_int64 * len(strides))(*strides),
    )
    if status:
        raise RuntimeError(f"the ReLA CPU kernel failed in its {step} (out of memory, or a stride beyond int32?)")


def rela_kernel(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float) -> tuple[Tensor, Tensor]:
    """The forward kernel's call, outside autograd: see :func:`_forward`."""
    # The output in (B, Tq, H, D) memory: what the layer reads next as (B, Tq, H * D) tokens, without a copy.
    out, total = _output(q, *q.shape), q.new_empty(q.shape[:3])
    if out.numel():
        _call("forward", halo, -1, scaling, (q, k, v, valid, out, total, None, None, None), (q, k, v, out, out),
              k.shape[2])
    else:  # D = 0: every score is 0
        total.zero_()
    return out, total


def rela_window_kernel(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, band: int,
                       scaling: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ReLA without a sliding window and a softmax window over the keys with |i - j| <= ``band`` (self-attention,
    D > 0), outside autograd: q, k, v (B, H, T, D) laid out for :func:`_rows`, valid (B, T) bool contiguous ->
    ReLA's output and total weights (as :func:`_forward`), the window's output local (B, H, T, D) laid out as
    (B, T, H, D), its log-normaliser lse (B, H, T) (-inf without a valid key) and weights p (B, H, T, 2 band + 1)
    (p[..., i, j - i + band]), contiguous."""
    batch, heads, length, _ = q.shape
    out, total, local = _output(q, *q.shape), q.new_empty(q.shape[:3]), _output(q, *q.shape)
    lse, weights = q.new_empty(q.shape[:3]), q.new_empty(batch, heads, length, 2 * band + 1)
    _call("forward", -1, band, scaling, (q, k, v, valid, out, total, local, lse, weights), (q, k, v, out, local),
          length)
    return out, total, local, lse, weights


@torch.library.custom_op("hf_sliced_attn::rela_cpu", mutates_args=(), device_types="cpu")
def _forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float) -> tuple[Tensor, Tensor]:
    """q (B, H, Tq, D), k, v (B, H, Tk, D) float32/64 laid out for :func:`_rows`, valid (B, Tk) bool
    contiguous, halo = w - 1 (-1 without a window) -> out (B, H, Tq, D) laid out as (B, Tq, H, D) and the total
    weights N (B, H, Tq), contiguous, in q's dtype."""
    return rela_kernel(q, k, v, valid, halo, scaling)


@_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float) -> tuple[Tensor, Tensor]:
    return _output(q, *q.shape), q.new_empty(q.shape[:3])


@torch.library.custom_op("hf_sliced_attn::rela_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(
    grad_out: Tensor, grad_total: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad_out (B, H, Tq, D) laid out for :func:`_rows` and grad_total (B, H, Tq) contiguous, in q's dtype, and
    the forward's inputs -> dL/dq, dL/dk, dL/dv in the layouts of q, k, v."""
    if not (q.numel() or k.numel()):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = (grad_out, grad_total, q, k, v, valid, dq, dk, dv, None, None, None)
    _call("backward", halo, -1, scaling, tensors, (grad_out, q, k, v, dq, dk, dv, dq), k.shape[2])
    return dq, dk, dv


def rela_window_backward(grad_out: Tensor, grad_total: Tensor, grad_local: Tensor, shift: Tensor, q: Tensor, k: Tensor,
                         v: Tensor, valid: Tensor, weights: Tensor, scaling: float) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of :func:`rela_window_kernel`, outside autograd: the gradients of ReLA's output and total
    weights (grad_out laid out for :func:`_rows`), of the window's output (grad_local, the same) and shift = dlse -
    grad_local . local (B, H, T) contiguous, with the forward's inputs and weights -> dq, dk, dv in the layouts of
    q, k, v: both attentions' gradients, from one pass."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    band = (weights.shape[-1] - 1) // 2
    tensors = (grad_out, grad_total, q, k, v, valid, dq, dk, dv, grad_local, shift, weights)
    _call("backward", -1, band, scaling, tensors, (grad_out, q, k, v, dq, dk, dv, grad_local), k.shape[2])
    return dq, dk, dv


@_backward.register_fake
def _(grad_out, grad_total, q, k, v, valid, halo, scaling) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, valid, ctx.halo, ctx.scaling = inputs
    ctx.save_for_backward(q, k, v, valid)


def _backward_rule(ctx, grad_out: Tensor | None, grad_total: Tensor | None) -> tuple[Tensor, Tensor, Tensor, None,
                                                                                      None, None]:
    q, k, v, valid = ctx.saved_tensors
    grad_out = q.new_zeros(q.shape) if grad_out is None else _rows(grad_out.to(q.dtype))
    grad_total = q.new_zeros(q.shape[:3]) if grad_total is None else grad_total.to(q.dtype).contiguous()
    dq, dk, dv = _backward(grad_out, grad_total, q, k, v, valid, ctx.halo, ctx.scaling)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def rela_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, *, sliding_window: int | None, scaling: float
) -> tuple[Tensor, Tensor]:
    """ReLA on CPU tensors with the C++ kernel (needs :func:`available`), and its normaliser: query (B, H, Tq,
    D), key and value (B, H, Tk, D), valid (B, Tk) bool (True = real key) -> the output (B, H, Tq, D) in query's
    dtype (float16/bfloat16 computed in float32), and each query's total weight D_i = sum_j A_ij (B, H, Tq) in
    the compute dtype, both differentiable."""
    dtype = compute_dtype(query.dtype)
    q, k, v = (_rows(x.to(dtype)) for x in (query, key, value))
    # A window wider than both sequences reaches every key: no halo needed.
    halo = -1 if sliding_window is None else min(sliding_window - 1, max(q.shape[2], k.shape[2]))
    out, denominator = _forward(q, k, v, valid.to(torch.bool).contiguous(), halo, float(scaling))
    return out.to(query.dtype), denominator
