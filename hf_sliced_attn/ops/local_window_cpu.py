"""A small local softmax window combined with a global term on CPU: the C++ kernel ``csrc/local_window_cpu.cpp``
as torch custom ops.

For each token i and head h, over the valid keys j with |i - j| <= w, the kernel computes the window's softmax
(local_i, lse_i), the global term's rows y (ReLA's gated RMSNorm over all heads of x, or x itself) and their
combination out_i = alpha local_i + (1 - alpha) y_i, alpha = mix_h ("gate") or sigmoid(lse_i - log mix_h -
log den_i) ("shared"): the function :func:`.local_window.local_window_attention` and
:func:`.local_window.rela_local_window_attention` compute from their parts, in one pass over the tokens
instead of a banded softmax and a dozen elementwise passes. Its backward recomputes a token's window and norm
from the inputs and gives the gradients of q, k, v, x, den, the norm's scale and gate, and mix. The work is
O(T H w D), direct loops over each query's 2 w + 1 keys: for the few keys of a small window (:data:`MAX_WINDOW`,
:data:`MAX_WINDOW_NORMED`); wider windows go through :func:`.banded.windowed_softmax`, whose kernel blocks its
keys, and the combination's elementwise ops.

The ops are ``torch.library`` custom ops (``hf_sliced_attn::local_window_cpu``, and
``hf_sliced_attn::rela_local_window_cpu``, which runs ReLA's kernel first and whose backward adds ReLA's gradients
into the window's; each with its backward) with fake implementations, so ``torch.compile(fullgraph=True)`` keeps
them whole.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from . import _native, rela_cpu
from ._common import compute_dtype
from .sliced_relu_cpu import _output, _rows

__all__ = ["MAX_WINDOW", "MAX_WINDOW_NORMED", "available", "local_window_cpu", "rela_local_window_cpu"]

MAX_WINDOW = 4
"""The widest window (|i - j| <= w) the ops take this kernel for without the norm (the sliced kernel's window):
forward+backward measured faster than the banded kernel and the elementwise combination up to w = 4 (0.75-0.83
of their time at 32 x 128 x 12 heads x D 32 and 2 x 1024 x 12 x 64, at 5669191) and no faster from w = 8."""

MAX_WINDOW_NORMED = 16
"""The same with ReLA's norm, which the kernel fuses too (:func:`rela_local_window_cpu`): 0.65-0.8 of the
composed ops' time up to w = 16 at 32 x 128 x 12 x 32, 0.93-1.0 at 2 x 1024 x 12 x 64, slower from w = 32."""

# step -> number of tensor arguments (the strides array excluded).
_STEPS = {"forward": 10, "backward": 18}


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels() is not None


@functools.cache
def _kernels() -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points with their argument types, keyed by ``<step>_<dtype>``; None without the library."""
    # (B, H, T, D), the halo, shared, norm, the scaling, eps.
    return _native.entry_points("local_window_cpu", "local_window", [ctypes.c_int64] * 7 + [ctypes.c_double] * 2,
                                _STEPS)


def _call(step: str, options: tuple[int, bool, bool, float, float], tensors: tuple[Tensor, ...],
          rows: tuple[Tensor, ...]) -> None:
    """Run ``step`` for the dtype of the (B, H, T, D) ``rows`` (passed with their (batch, head, token) strides)."""
    halo, shared, norm, scaling, eps = options
    batch, heads, length, dim = rows[0].shape
    suffix = {torch.float32: "f32", torch.float64: "f64"}[rows[0].dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in tensors]
    status = _kernels()[f"{step}_{suffix}"](
        batch, heads, length, dim, halo, int(shared), int(norm), scaling, eps, *pointers,
        (ctypes.c_int64 * len(strides))(*strides),
    )
    if status:
        raise RuntimeError(f"the local window CPU kernel failed in its {step} (out of memory?)")


@torch.library.custom_op("hf_sliced_attn::local_window_cpu", mutates_args=(), device_types="cpu")
def _forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, x: Tensor, den: Tensor, scale: Tensor, gate: Tensor,
             mix: Tensor, halo: int, shared: bool, norm: bool, scaling: float, eps: float) -> Tensor:
    """q, k, v, x (B, H, T, D) with a contiguous last dim, valid (B, T) bool, den (B, H, T), scale and gate (H*D,)
    and mix (H,) contiguous, one float dtype -> out (B, H, T, D) laid out as (B, T, H, D)."""
    batch, heads, length, dim = q.shape
    out = _output(v, batch, heads, length, dim)
    if out.numel():
        tensors = (q, k, v, valid, x, den, scale, gate, mix, out)
        _call("forward", (halo, shared, norm, scaling, eps), tensors, (q, k, v, x, out))
    return out


@_forward.register_fake
def _(q, k, v, valid, x, den, scale, gate, mix, halo, shared, norm, scaling, eps) -> Tensor:
    return _output(v, *q.shape)


@torch.library.custom_op("hf_sliced_attn::local_window_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, x: Tensor, den: Tensor,
              scale: Tensor, gate: Tensor, mix: Tensor, halo: int, shared: bool, norm: bool, scaling: float,
              eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """grad_out (B, H, T, D) with a contiguous last dim and the forward's inputs -> the gradients of q, k, v, x
    (their layouts), den, scale, gate and mix."""
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(x),
             torch.empty_like(den), torch.empty_like(scale), torch.empty_like(gate), torch.empty_like(mix))
    if q.numel():
        tensors = (grad_out, q, k, v, valid, x, den, scale, gate, mix, *grads)
        _call("backward", (halo, shared, norm, scaling, eps), tensors, (grad_out, q, k, v, x, *grads[:4]))
    else:
        for grad in grads:
            grad.zero_()
    return grads


@_backward.register_fake
def _(grad_out, q, k, v, valid, x, den, scale, gate, mix, halo, shared, norm, scaling, eps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(x),
            torch.empty_like(den), torch.empty_like(scale), torch.empty_like(gate), torch.empty_like(mix))


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    *tensors, ctx.halo, ctx.shared, ctx.norm, ctx.scaling, ctx.eps = inputs
    ctx.save_for_backward(*tensors)


def _backward_rule(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, valid, x, den, scale, gate, mix = ctx.saved_tensors
    dq, dk, dv, dx, dden, dscale, dgate, dmix = _backward(
        _rows(grad_out.to(q.dtype)), q, k, v, valid, x, den, scale, gate, mix, ctx.halo, ctx.shared, ctx.norm,
        ctx.scaling, ctx.eps,
    )
    return dq, dk, dv, None, dx, dden, dscale, dgate, dmix, None, None, None, None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


@torch.library.custom_op("hf_sliced_attn::rela_local_window_cpu", mutates_args=(), device_types="cpu")
def _rela_forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, scale: Tensor, gate: Tensor, mix: Tensor,
                  halo: int, shared: bool, scaling: float, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """ReLA's kernel (no sliding window), then :func:`_forward` with the norm on its output: q, k, v (B, H, T, D)
    laid out for :func:`.rela_cpu._rows` -> out (B, H, T, D) laid out as (B, T, H, D), and ReLA's output and
    total weights (kept for the backward; not differentiable)."""
    numerator, denominator = rela_cpu.rela_kernel(q, k, v, valid, -1, scaling)
    out = _forward(q, k, v, valid, numerator, denominator, scale, gate, mix, halo, shared, True, scaling, eps)
    return out, numerator, denominator


@_rela_forward.register_fake
def _(q, k, v, valid, scale, gate, mix, halo, shared, scaling, eps) -> tuple[Tensor, Tensor, Tensor]:
    return _output(v, *q.shape), _output(q, *q.shape), q.new_empty(q.shape[:3])


@torch.library.custom_op("hf_sliced_attn::rela_local_window_cpu_backward", mutates_args=(), device_types="cpu")
def _rela_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, numerator: Tensor,
                   denominator: Tensor, scale: Tensor, gate: Tensor, mix: Tensor, halo: int, shared: bool,
                   scaling: float, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The window's and the norm's backward, then ReLA's for the gradients of its output and total weights,
    added into the window's dq, dk, dv -> the gradients of q, k, v, scale, gate and mix."""
    dq, dk, dv, dx, dden, dscale, dgate, dmix = _backward(grad_out, q, k, v, valid, numerator, denominator, scale,
                                                          gate, mix, halo, shared, True, scaling, eps)
    rela_cpu.backward_into(dx, dden, q, k, v, valid, -1, scaling, dq, dk, dv, accumulate=True)
    return dq, dk, dv, dscale, dgate, dmix


@_rela_backward.register_fake
def _(grad_out, q, k, v, valid, numerator, denominator, scale, gate, mix, halo, shared, scaling, eps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(scale),
            torch.empty_like(gate), torch.empty_like(mix))


def _rela_setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> None:
    *tensors, ctx.halo, ctx.shared, ctx.scaling, ctx.eps = inputs
    _, numerator, denominator = output
    ctx.mark_non_differentiable(numerator, denominator)
    ctx.set_materialize_grads(False)  # no zero-filled (B, H, T, D) gradient for the kept numerator
    ctx.save_for_backward(*tensors, numerator, denominator)


def _rela_backward_rule(ctx, grad_out: Tensor | None, *_) -> tuple[Tensor | None, ...]:
    q, k, v, valid, scale, gate, mix, numerator, denominator = ctx.saved_tensors
    if grad_out is None:  # gradients are not materialised: none flowed into the output
        grad_out = q.new_zeros(q.shape)
    dq, dk, dv, dscale, dgate, dmix = _rela_backward(
        _rows(grad_out.to(q.dtype)), q, k, v, valid, numerator, denominator, scale, gate, mix, ctx.halo, ctx.shared,
        ctx.scaling, ctx.eps,
    )
    return dq, dk, dv, None, dscale, dgate, dmix, None, None, None, None


_rela_forward.register_autograd(_rela_backward_rule, setup_context=_rela_setup_context)


def local_window_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, global_term: Tensor, denominator: Tensor | None,
    mix: Tensor, *, window: int, combine: str, scaling: float, norm_scale: Tensor | None = None,
    norm_gate: Tensor | None = None, norm_eps: float = 1e-6,
) -> Tensor:
    """The window's softmax combined with ``global_term`` (B, H, T, D) on CPU tensors with the C++ kernel (needs
    :func:`available`): through ReLA's gated RMSNorm over all heads when ``norm_scale`` and ``norm_gate`` (H*D,)
    are given, as it is otherwise. query, key, value (B, H, T, D), valid (B, T) bool (True = real key),
    denominator (B, H, T) (needed by ``combine="shared"``), mix (H,) -> (B, H, T, D) in global_term's dtype
    (float16/bfloat16 computed in float32); differentiable in every tensor but ``valid``."""
    dtype = compute_dtype(global_term.dtype)
    q, k, v, x = (_rows(t.to(dtype)) for t in (query, key, value, global_term))
    batch, heads, length, dim = q.shape
    norm = norm_scale is not None
    if norm:
        scale, gate = (p.to(dtype).contiguous() for p in (norm_scale, norm_gate))
    else:  # unread by the kernel, given for its signature
        scale = gate = q.new_zeros(heads * dim)
    den = q.new_zeros(batch, heads, length) if denominator is None else denominator.to(dtype).contiguous()
    halo = min(window, max(length - 1, 0))
    out = _forward(q, k, v, valid.to(torch.bool).contiguous(), x, den, scale, gate, mix.to(dtype).contiguous(),
                   halo, combine == "shared", norm, float(scaling), float(norm_eps))
    return out.to(global_term.dtype)


def rela_local_window_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, mix: Tensor, *, window: int, combine: str,
    scaling: float, norm_scale: Tensor, norm_gate: Tensor, norm_eps: float = 1e-6,
) -> Tensor:
    """ReLA (no sliding window) after its gated RMSNorm, combined with the window's softmax, on CPU tensors with
    the ReLA and window kernels (needs :func:`available` and :func:`.rela_cpu.available`), as one autograd node:
    the backward runs the window's and the norm's, then adds ReLA's gradients into the same dq, dk, dv. query, key,
    value (B, H, T, D), valid (B, T) bool, mix (H,), norm_scale and norm_gate (H*D,) -> (B, H, T, D) in value's
    dtype (float16/bfloat16 computed in float32)."""
    dtype = compute_dtype(value.dtype)
    q, k, v = (rela_cpu._rows(t.to(dtype)) for t in (query, key, value))
    scale, gate, mix = (p.to(dtype).contiguous() for p in (norm_scale, norm_gate, mix))
    halo = min(window, max(q.shape[2] - 1, 0))
    out, _, _ = _rela_forward(q, k, v, valid.to(torch.bool).contiguous(), scale, gate, mix, halo, combine == "shared",
                              float(scaling), float(norm_eps))
    return out.to(value.dtype)
