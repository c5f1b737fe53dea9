"""Sliced attention on CPU: the C++ sweep kernels (``csrc/``) as torch custom ops.

Two kernels, one library each, sharing the sorting and sweeping machinery (``csrc/sorted_sweep.h``):

* ReLU (``csrc/sliced_relu_cpu.cpp``, :func:`sliced_relu_cpu`). Per (batch, head, slice) the kernel
  sorts the keys and the queries and makes one merge sweep over both, carrying the prefix sums
  P_u, P_tu, P_t from query to query. The backward is two more sweeps per slice, from the orders,
  denominators and mean value the forward saved; each D-wide row is written by a sweep, never
  filled or reread.
* Bump (``csrc/sliced_relu_bump_cpu.cpp``, :func:`sliced_relu_bump_cpu`). The same sweep with three
  cursors l <= c <= r through the sorted keys, the window (s - b, s + b) of each query, each carrying
  its running sums of v and t v. The backward is the same sweep again (dL/ds, dL/db), and one over
  the keys with the roles swapped (dL/dv, dL/dt), from the orders the forward saved.

See the sources' headers for the maths. Nothing D-wide is stored beyond the inputs and the output,
every sum is accumulated in float64, and the (batch, head) groups are split over torch's intra-op
threads (``torch.set_num_threads`` applies).

The ops are ``torch.library`` custom ops (``hf_sliced_attn::sliced_relu_cpu``,
``hf_sliced_attn::sliced_relu_bump_cpu`` and their backwards), so ``torch.compile(fullgraph=True)``
keeps them whole, and autograd saves the value tensor through ``save_for_backward`` (an in-place
change before backward is caught).

:func:`.sliced_relu.sliced_relu` and :func:`.sliced_relu_bump.sliced_relu_bump` pick this path for
CPU tensors when the kernel builds (:func:`available`, :func:`bump_available`); their torch
implementations compute the same functions on any device.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _native
from ._common import compute_dtype

__all__ = ["available", "bump_available", "sliced_relu_bump_cpu", "sliced_relu_cpu"]

# kernel -> (library csrc/<library>.cpp, entry-point prefix, {step: number of tensor arguments}).
_LIBRARIES = {
    "relu": ("sliced_relu_cpu", "sliced_relu", {"forward": 9, "backward": 13}),
    "bump": ("sliced_relu_bump_cpu", "sliced_relu_bump", {"forward": 8, "backward": 12}),
}


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the ReLU kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels("relu") is not None


@torch.compiler.assume_constant_result
def bump_available() -> bool:
    """Whether the bump kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels("bump") is not None


@functools.cache
def _kernels(kernel: str) -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points of ``kernel`` ("relu" or "bump") with their argument types, keyed by
    ``<step>_<dtype>``; None without the library."""
    name, prefix, steps = _LIBRARIES[kernel]
    return _native.entry_points(name, prefix, [ctypes.c_int64] * 6, steps)  # (B, H, M, Tq, Tk, D)


def _call(
    kernel: str, step: str, v: Tensor, sizes: tuple[int, ...], tensors: tuple[Tensor, ...], rows: tuple[Tensor, ...]
) -> None:
    """Run ``step`` of ``kernel`` for v's dtype on CPU tensors; ``rows`` are the (B, H, T, D)
    tensors among them, passed with their (batch, head, token) strides (last dim contiguous)."""
    suffix = {torch.float32: "f32", torch.float64: "f64"}[v.dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in tensors]
    status = _kernels(kernel)[f"{step}_{suffix}"](*sizes, *pointers, (ctypes.c_int64 * len(strides))(*strides))
    if status:
        raise RuntimeError(f"the sliced {kernel} CPU kernel failed in its {step} (out of memory?)")


def _output(v: Tensor, batch: int, heads: int, q_len: int, dim: int) -> Tensor:
    """An uninitialised (B, H, Tq, D) tensor in (B, Tq, H, D) memory."""
    return v.new_empty(batch, q_len, heads, dim).transpose(1, 2)


def _sizes(s: Tensor, v: Tensor) -> tuple[int, ...]:
    """(B, H, M, Tq, Tk, D) from s (B, H, M, Tq) and v (B, H, Tk, D)."""
    return (*s.shape, *v.shape[-2:])


@torch.library.custom_op("hf_sliced_attn::sliced_relu_cpu", mutates_args=(), device_types="cpu")
def _forward(s: Tensor, t: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """s (B, H, M, Tq), t (B, H, M, Tk) float64 and valid (B, Tk) bool, contiguous; v (B, H, Tk, D)
    float32/64 with a contiguous last dim -> out (B, H, Tq, D) in v's dtype, laid out as
    (B, Tq, H, D) (what attention layers reshape next), den (B, H, M, Tq) float64 (the kernel's
    normaliser, differentiable), and for the backward key_order (B, H, M, Tk) int32, query_order
    (B, H, M, Tq) int32 and value_mean (B, H, D) float64 (the valid keys' mean value)."""
    sizes = _sizes(s, v)
    batch, heads, slices, q_len, k_len, dim = sizes
    out = _output(v, batch, heads, q_len, dim)
    key_order = torch.empty(batch, heads, slices, k_len, dtype=torch.int32)
    query_order = torch.empty(batch, heads, slices, q_len, dtype=torch.int32)
    den = torch.empty(batch, heads, slices, q_len, dtype=torch.float64)
    value_mean = torch.empty(batch, heads, dim, dtype=torch.float64)
    _call("relu", "forward", v, sizes, (s, t, v, valid, out, key_order, query_order, den, value_mean), (v, out))
    return out, den, key_order, query_order, value_mean


@_forward.register_fake
def _(s: Tensor, t: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    batch, heads, slices, q_len, k_len, dim = _sizes(s, v)
    return (
        _output(v, batch, heads, q_len, dim),
        s.new_empty(batch, heads, slices, q_len),
        s.new_empty(batch, heads, slices, k_len, dtype=torch.int32),
        s.new_empty(batch, heads, slices, q_len, dtype=torch.int32),
        s.new_empty(batch, heads, dim),
    )


@torch.library.custom_op("hf_sliced_attn::sliced_relu_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(
    grad: Tensor, grad_den: Tensor, s: Tensor, t: Tensor, v: Tensor, valid: Tensor, key_order: Tensor,
    query_order: Tensor, den: Tensor, value_mean: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad (B, H, Tq, D) in v's dtype with a contiguous last dim, grad_den (B, H, M, Tq) float64 contiguous (the
    gradient in den), and the forward's inputs and saved state -> dL/ds, dL/dt (float64) and dL/dv (v's dtype and
    layout)."""
    ds, dt, dv = torch.empty_like(s), torch.empty_like(t), torch.empty_like(v)
    tensors = (grad, grad_den, s, t, v, valid, key_order, query_order, den, value_mean, ds, dt, dv)
    _call("relu", "backward", v, _sizes(s, v), tensors, (grad, v, dv))
    return ds, dt, dv


@_backward.register_fake
def _(grad, grad_den, s, t, v, valid, key_order, query_order, den, value_mean) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(s), torch.empty_like(t), torch.empty_like(v)


def _rows(x: Tensor) -> Tensor:
    """x itself when its last dim is contiguous (any other layout is read in place), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _setup_context(ctx, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    """The bump kernel: save the inputs and the orders the forward returned after its output (not
    differentiable)."""
    _, *orders = output
    ctx.mark_non_differentiable(*orders)
    ctx.save_for_backward(*inputs, *orders)


def _relu_setup_context(ctx, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    """The ReLU kernel: as :func:`_setup_context`, with den, after the output, differentiable and saved, and the
    value mean (not differentiable) saved after it."""
    _, den, *orders, value_mean = output
    ctx.mark_non_differentiable(*orders, value_mean)
    ctx.save_for_backward(*inputs, *orders, den, value_mean)


def _backward_rule(ctx, grad: Tensor, grad_den: Tensor | None, *_unused: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
    s, t, v, valid, key_order, query_order, den, value_mean = ctx.saved_tensors
    grad_den = torch.zeros_like(den) if grad_den is None else grad_den.to(den.dtype).contiguous()
    ds, dt, dv = _backward(_rows(grad.to(v.dtype)), grad_den, s, t, v, valid, key_order, query_order, den, value_mean)
    return ds, dt, dv, None


_forward.register_autograd(_backward_rule, setup_context=_relu_setup_context)


def sliced_relu_cpu(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, valid: Tensor
) -> tuple[Tensor, Tensor]:
    """Sliced ReLU attention on CPU tensors with the C++ kernel (needs :func:`available`), and its normaliser.

    query_scalars (B, H, M, Tq), key_scalars (B, H, M, Tk), value (B, H, Tk, D), valid (B, Tk)
    bool (True = real key) -> the output (B, H, Tq, D) in value's dtype, and D_i = sum_l |s_i - t_l|
    over the valid keys (B, H, M, Tq) float64, both differentiable. The scalars are taken in float64,
    the values in float32 (float16/bfloat16) or their own dtype.
    """
    work = _rows(value.to(compute_dtype(value.dtype)))
    out, den, *_ = _forward(
        query_scalars.double().contiguous(), key_scalars.double().contiguous(), work,
        valid.to(torch.bool).contiguous(),
    )
    return out.to(value.dtype), den


@torch.library.custom_op("hf_sliced_attn::sliced_relu_bump_cpu", mutates_args=(), device_types="cpu")
def _bump_forward(s: Tensor, t: Tensor, v: Tensor, bandwidth: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """s (B, H, M, Tq), t (B, H, M, Tk), bandwidth (H, M) float64 and valid (B, Tk) bool, contiguous;
    v (B, H, Tk, D) float32/64 with a contiguous last dim -> out (B, H, Tq, D) in v's dtype, laid out
    as (B, Tq, H, D), and for the backward key_order (B, H, M, Tk) and query_order (B, H, M, Tq) int32."""
    sizes = _sizes(s, v)
    batch, heads, slices, q_len, k_len, dim = sizes
    out = _output(v, batch, heads, q_len, dim)
    key_order = torch.empty(batch, heads, slices, k_len, dtype=torch.int32)
    query_order = torch.empty(batch, heads, slices, q_len, dtype=torch.int32)
    _call("bump", "forward", v, sizes, (s, t, v, bandwidth, valid, out, key_order, query_order), (v, out))
    return out, key_order, query_order


@_bump_forward.register_fake
def _(s: Tensor, t: Tensor, v: Tensor, bandwidth: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    batch, heads, slices, q_len, k_len, dim = _sizes(s, v)
    return (
        _output(v, batch, heads, q_len, dim),
        s.new_empty(batch, heads, slices, k_len, dtype=torch.int32),
        s.new_empty(batch, heads, slices, q_len, dtype=torch.int32),
    )


@torch.library.custom_op("hf_sliced_attn::sliced_relu_bump_cpu_backward", mutates_args=(), device_types="cpu")
def _bump_backward(
    grad: Tensor, s: Tensor, t: Tensor, v: Tensor, bandwidth: Tensor, valid: Tensor, key_order: Tensor,
    query_order: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """grad (B, H, Tq, D) in v's dtype with a contiguous last dim, and the forward's inputs and
    saved orders -> dL/ds, dL/dt, dL/db (float64; dL/db (H, M), summed over the batch) and dL/dv
    (v's dtype and layout)."""
    ds, dt, dv = torch.empty_like(s), torch.empty_like(t), torch.empty_like(v)
    db = s.new_empty(s.shape[:3])  # (B, H, M): each (batch, head) group writes its own
    tensors = (grad, s, t, v, bandwidth, valid, key_order, query_order, ds, dt, dv, db)
    _call("bump", "backward", v, _sizes(s, v), tensors, (grad, v, dv))
    return ds, dt, db.sum(0), dv


@_bump_backward.register_fake
def _(grad, s, t, v, bandwidth, valid, key_order, query_order) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return torch.empty_like(s), torch.empty_like(t), torch.empty_like(bandwidth), torch.empty_like(v)


def _bump_backward_rule(ctx, grad: Tensor, *_unused: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:
    s, t, v, bandwidth, valid, key_order, query_order = ctx.saved_tensors
    ds, dt, db, dv = _bump_backward(_rows(grad.to(v.dtype)), s, t, v, bandwidth, valid, key_order, query_order)
    return ds, dt, dv, db, None


_bump_forward.register_autograd(_bump_backward_rule, setup_context=_setup_context)


def sliced_relu_bump_cpu(
    query_scalars: Tensor, key_scalars: Tensor, value: Tensor, bandwidth: Tensor, valid: Tensor
) -> Tensor:
    """Sliced ReLU bump attention on CPU tensors with the C++ kernel (needs :func:`bump_available`).

    query_scalars (B, H, M, Tq), key_scalars (B, H, M, Tk), value (B, H, Tk, D), bandwidth (H, M)
    positive, valid (B, Tk) bool (True = real key) -> (B, H, Tq, D) in value's dtype. The scalars and
    the bandwidth are taken in float64, the values in float32 (float16/bfloat16) or their own dtype.
    """
    work = _rows(value.to(compute_dtype(value.dtype)))
    out, *_ = _bump_forward(
        query_scalars.double().contiguous(), key_scalars.double().contiguous(), work,
        bandwidth.double().contiguous(), valid.to(torch.bool).contiguous(),
    )
    return out.to(value.dtype)
