"""Sliced ReLU attention on CPU: the C++ sweep kernel (``csrc/sliced_relu_cpu.cpp``) as torch custom ops.

Per (batch, head, slice) the kernel sorts the keys and the queries and makes one merge sweep
over both, carrying the prefix sums P_u, P_tu, P_t from query to query (see the source's
header for the maths). Nothing D-wide is stored beyond the inputs and the output, every sum
is accumulated in float64, and the (batch, head) groups are split over torch's intra-op
threads (``torch.set_num_threads`` applies). The backward is two more sweeps per slice, from the
orders and denominators the forward saved.

The ops are ``torch.library`` custom ops (``hf_sliced_attn::sliced_relu_cpu`` and its
backward), so ``torch.compile(fullgraph=True)`` keeps them whole, and autograd saves the
value tensor through ``save_for_backward`` (an in-place change before backward is caught).

:func:`.sliced_relu.sliced_relu` picks this path for CPU tensors when the kernel builds
(:func:`available`); the torch implementation there computes the same function on any device.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _native
from ._common import compute_dtype

__all__ = ["available", "sliced_relu_cpu"]

_LIBRARY = "sliced_relu_cpu"


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the C++ kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels() is not None


@functools.cache
def _kernels() -> dict[str, ctypes._CFuncPtr] | None:
    """The four entry points with their argument types, keyed by name; None without the library."""
    library = _native.load(_LIBRARY)
    if library is None:
        return None
    sizes = [ctypes.c_int64] * 6
    p = ctypes.c_void_p
    # (B, H, M, Tq, Tk, D), the tensors' data pointers, then the array of their strides.
    signatures = {"forward": [*sizes] + [p] * (8 + 1), "backward": [*sizes] + [p] * (11 + 1)}
    kernels = {}
    for step, argtypes in signatures.items():
        for suffix in ("f32", "f64"):
            function = getattr(library, f"sliced_relu_{step}_{suffix}")
            function.argtypes, function.restype = argtypes, ctypes.c_int
            kernels[f"{step}_{suffix}"] = function
    return kernels


def _call(
    step: str, v: Tensor, sizes: tuple[int, ...], tensors: tuple[Tensor, ...], rows: tuple[Tensor, ...]
) -> None:
    """Run the kernel ``step`` for v's dtype on CPU tensors; ``rows`` are the (B, H, T, D)
    tensors among them, passed with their (batch, head, token) strides (last dim contiguous)."""
    suffix = {torch.float32: "f32", torch.float64: "f64"}[v.dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in tensors]
    status = _kernels()[f"{step}_{suffix}"](*sizes, *pointers, (ctypes.c_int64 * len(strides))(*strides))
    if status:
        raise RuntimeError(f"the sliced ReLU CPU kernel failed in its {step} (out of memory?)")


def _output(v: Tensor, batch: int, heads: int, q_len: int, dim: int) -> Tensor:
    """An uninitialised (B, H, Tq, D) tensor in (B, Tq, H, D) memory."""
    return v.new_empty(batch, q_len, heads, dim).transpose(1, 2)


def _sizes(s: Tensor, v: Tensor) -> tuple[int, ...]:
    """(B, H, M, Tq, Tk, D) from s (B, H, M, Tq) and v (B, H, Tk, D)."""
    return (*s.shape, *v.shape[-2:])


@torch.library.custom_op("hf_sliced_attn::sliced_relu_cpu", mutates_args=(), device_types="cpu")
def _forward(s: Tensor, t: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """s (B, H, M, Tq), t (B, H, M, Tk) float64 and valid (B, Tk) bool, contiguous; v (B, H, Tk, D)
    float32/64 with a contiguous last dim -> out (B, H, Tq, D) in v's dtype, laid out as
    (B, Tq, H, D) (what attention layers reshape next), and for the backward key_order
    (B, H, M, Tk) int32, query_order (B, H, M, Tq) int32, den (B, H, M, Tq) float64."""
    sizes = _sizes(s, v)
    batch, heads, slices, q_len, k_len, dim = sizes
    out = _output(v, batch, heads, q_len, dim)
    key_order = torch.empty(batch, heads, slices, k_len, dtype=torch.int32)
    query_order = torch.empty(batch, heads, slices, q_len, dtype=torch.int32)
    den = torch.empty(batch, heads, slices, q_len, dtype=torch.float64)
    _call("forward", v, sizes, (s, t, v, valid, out, key_order, query_order, den), (v, out))
    return out, key_order, query_order, den


@_forward.register_fake
def _(s: Tensor, t: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    batch, heads, slices, q_len, k_len, dim = _sizes(s, v)
    return (
        _output(v, batch, heads, q_len, dim),
        s.new_empty(batch, heads, slices, k_len, dtype=torch.int32),
        s.new_empty(batch, heads, slices, q_len, dtype=torch.int32),
        s.new_empty(batch, heads, slices, q_len),
    )


@torch.library.custom_op("hf_sliced_attn::sliced_relu_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(
    grad: Tensor, s: Tensor, t: Tensor, v: Tensor, valid: Tensor, key_order: Tensor, query_order: Tensor,
    den: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad (B, H, Tq, D) in v's dtype with a contiguous last dim, and the forward's inputs and
    saved state -> dL/ds, dL/dt (float64) and dL/dv (v's dtype and layout)."""
    ds, dt, dv = torch.empty_like(s), torch.empty_like(t), torch.empty_like(v)
    tensors = (grad, s, t, v, valid, key_order, query_order, den, ds, dt, dv)
    _call("backward", v, _sizes(s, v), tensors, (grad, v, dv))
    return ds, dt, dv


@_backward.register_fake
def _(grad, s, t, v, valid, key_order, query_order, den) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(s), torch.empty_like(t), torch.empty_like(v)


def _rows(x: Tensor) -> Tensor:
    """x itself when its last dim is contiguous (any other layout is read in place), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _setup_context(ctx, inputs: tuple[Tensor, ...], output: tuple[Tensor, ...]) -> None:
    _, key_order, query_order, den = output
    ctx.mark_non_differentiable(key_order, query_order, den)
    ctx.save_for_backward(*inputs, key_order, query_order, den)


def _backward_rule(ctx, grad: Tensor, *_unused: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
    s, t, v, valid, key_order, query_order, den = ctx.saved_tensors
    ds, dt, dv = _backward(_rows(grad.to(v.dtype)), s, t, v, valid, key_order, query_order, den)
    return ds, dt, dv, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def sliced_relu_cpu(query_scalars: Tensor, key_scalars: Tensor, value: Tensor, valid: Tensor) -> Tensor:
    """Sliced ReLU attention on CPU tensors with the C++ kernel (needs :func:`available`).

    query_scalars (B, H, M, Tq), key_scalars (B, H, M, Tk), value (B, H, Tk, D), valid (B, Tk)
    bool (True = real key) -> (B, H, Tq, D) in value's dtype. The scalars are taken in float64,
    the values in float32 (float16/bfloat16) or their own dtype.
    """
    work = _rows(value.to(compute_dtype(value.dtype)))
    out, *_ = _forward(
        query_scalars.double().contiguous(), key_scalars.double().contiguous(), work,
        valid.to(torch.bool).contiguous(),
    )
    return out.to(value.dtype)
