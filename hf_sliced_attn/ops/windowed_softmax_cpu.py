"""Softmax attention within a sliding window on CPU: the C++ kernel ``csrc/windowed_softmax_cpu.cpp``
as torch custom ops.

For each (batch, head) and query i, over the valid keys j with |i - j| <= h = sliding_window - 1,
a_ij = scaling q_i . k_j, the kernel gives out_i = sum_j softmax(a_i)_j v_j and the log-normaliser
lse_i = log sum_j exp(a_ij) (0 and -inf for a query with no valid key, whose gradients are 0). Its
backward recomputes the weights from the saved lse, with dS_ij = P_ij (dO_i . v_j - dO_i . out_i + g_i)
for the gradients dO of out and g of lse. The work is O(T w D) per head and nothing pair-sized is
stored (see the source's header); the (batch, head) groups are split over torch's intra-op threads.

The ops are ``torch.library`` custom ops (``hf_sliced_attn::windowed_softmax_cpu`` and its backward)
with fake implementations, so ``torch.compile(fullgraph=True)`` keeps them whole.
:func:`.banded.windowed_softmax` picks this path for CPU tensors when the kernel builds
(:func:`available`); its torch implementation computes the same function on any device.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _native
from ._common import compute_dtype
from .sliced_relu_cpu import _output, _rows

__all__ = ["available", "windowed_softmax_cpu"]

# step -> number of tensor arguments (the strides array excluded).
_STEPS = {"forward": 6, "backward": 11}


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels() is not None


@functools.cache
def _kernels() -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points with their argument types, keyed by ``<step>_<dtype>``; None without the library."""
    # (B, H, 1, T, T, D), the halo, the scaling.
    return _native.entry_points("windowed_softmax_cpu", "windowed_softmax", [ctypes.c_int64] * 7 + [ctypes.c_double],
                                _STEPS)


def _call(step: str, halo: int, scaling: float, tensors: tuple[Tensor, ...], rows: tuple[Tensor, ...]) -> None:
    """Run ``step`` for the dtype of the (B, H, T, D) ``rows`` (passed with their (batch, head, token) strides)."""
    first = rows[0]
    batch, heads, length, dim = first.shape
    suffix = {torch.float32: "f32", torch.float64: "f64"}[first.dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in tensors]
    status = _kernels()[f"{step}_{suffix}"](
        batch, heads, 1, length, length, dim, halo, scaling, *pointers, (ctypes.c_int64 * len(strides))(*strides)
    )
    if status:
        raise RuntimeError(f"the windowed softmax CPU kernel failed in its {step} (out of memory?)")


@torch.library.custom_op("hf_sliced_attn::windowed_softmax_cpu", mutates_args=(), device_types="cpu")
def _forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float) -> tuple[Tensor, Tensor]:
    """q, k, v (B, H, T, D) float32/64 with a contiguous last dim, valid (B, T) bool contiguous
    -> out (B, H, T, D) laid out as (B, T, H, D), and lse (B, H, T) contiguous, in q's dtype."""
    batch, heads, length, dim = q.shape
    out = _output(v, batch, heads, length, dim)
    lse = q.new_empty(batch, heads, length)
    _call("forward", halo, scaling, (q, k, v, valid, out, lse), (q, k, v, out))
    return out, lse


@_forward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, halo: int, scaling: float) -> tuple[Tensor, Tensor]:
    batch, heads, length, dim = q.shape
    return _output(v, batch, heads, length, dim), q.new_empty(batch, heads, length)


@torch.library.custom_op("hf_sliced_attn::windowed_softmax_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(
    grad_out: Tensor, grad_lse: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, out: Tensor, lse: Tensor,
    halo: int, scaling: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad_out (B, H, T, D) with a contiguous last dim and grad_lse (B, H, T) contiguous, in q's dtype,
    and the forward's inputs and outputs -> dL/dq, dL/dk, dL/dv (the layouts of q, k, v)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = (grad_out, grad_lse, q, k, v, valid, out, lse, dq, dk, dv)
    _call("backward", halo, scaling, tensors, (grad_out, q, k, v, out, dq, dk, dv))
    return dq, dk, dv


@_backward.register_fake
def _(grad_out, grad_lse, q, k, v, valid, out, lse, halo, scaling) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, valid, ctx.halo, ctx.scaling = inputs
    ctx.save_for_backward(q, k, v, valid, *output)


def _backward_rule(ctx, grad_out: Tensor, grad_lse: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
    q, k, v, valid, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward(_rows(grad_out.to(q.dtype)), grad_lse.to(q.dtype).contiguous(), q, k, v, valid, out, lse,
                           ctx.halo, ctx.scaling)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def windowed_softmax_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, *, sliding_window: int, scaling: float
) -> tuple[Tensor, Tensor]:
    """Softmax attention within |i - j| <= sliding_window - 1 on CPU tensors with the C++ kernel (needs
    :func:`available`). query, key, value (B, H, T, D), valid (B, T) bool (True = real key) -> out
    (B, H, T, D) in query's dtype and lse (B, H, T) in the compute dtype (float32 for float16/bfloat16),
    -inf for a query with no valid key."""
    dtype = compute_dtype(query.dtype)
    q, k, v = (_rows(x.to(dtype)) for x in (query, key, value))
    halo = min(sliding_window - 1, query.shape[2])  # a wider window sees the same keys
    out, lse = _forward(q, k, v, valid.to(torch.bool).contiguous(), halo, float(scaling))
    return out.to(query.dtype), lse
