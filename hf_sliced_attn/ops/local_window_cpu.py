"""A small local softmax window combined with a global term on CPU: the C++ kernel ``csrc/local_window_cpu.cpp``
as torch custom ops.

For each token i and head h, over the valid keys j with |i - j| <= w, the window's softmax (local_i, lse_i) is
combined with the global term's rows y (ReLA's gated RMSNorm over all heads of x, or x itself):
out_i = alpha local_i + (1 - alpha) y_i, alpha = mix_h ("gate") or sigmoid(lse_i - log mix_h - log den_i)
("shared"): the function :func:`.local_window.local_window_attention` and
:func:`.local_window.rela_local_window_attention` compute from their parts, in one pass over the tokens instead
of a banded softmax and a dozen elementwise passes.

* :func:`local_window_cpu` (the sliced kernel's window, no norm): the kernel computes the window from q, k, v, its
  backward recomputes it. The work is O(T H w D), direct loops over each query's 2 w + 1 keys: for the few keys of
  a small window (:data:`MAX_WINDOW`); wider windows go through :func:`.banded.windowed_softmax`, whose kernel
  blocks its keys, and the combination's elementwise ops.
* :func:`rela_local_window_cpu`: ReLA's kernel computes the window beside its own scores
  (:func:`.rela_cpu.rela_window_kernel`, weights kept for the backward); this kernel's combination entry points
  apply the norm and combine; the combination's backward gives the window output's gradient, and ReLA's backward
  adds the window's score gradients into its own (:func:`.rela_cpu.rela_window_backward`): one pass for both
  attentions' q, k, v gradients.

The ops are ``torch.library`` custom ops (``hf_sliced_attn::local_window_cpu`` and
``hf_sliced_attn::rela_local_window_cpu``, each with its backward) with fake implementations, so
``torch.compile(fullgraph=True)`` keeps them whole.
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

MAX_WINDOW_NORMED = 32
"""The widest window ReLA's kernel computes beside its scores (:func:`rela_local_window_cpu`): forward+backward
measured at 0.69-0.72 of the composed ops' time (ReLA's kernel, the norm, the banded softmax kernel and the
combination) for w = 4, 16 and 32 at 32 x 128 x 12 x 32, 0.81-0.88 at 2 x 1024 x 12 x 64 (one thread); wider
windows, not measured, go through the composed ops."""

# step -> number of tensor arguments (the strides array excluded), of the window computed and of the window given.
_STEPS = {"forward": 8, "backward": 14}
_COMBINE_STEPS = {"forward": 8, "backward": 15}


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel is built and loaded (built on the first call; see :mod:`._native`)."""
    return _kernels() is not None


@functools.cache
def _kernels() -> dict[str, ctypes._CFuncPtr] | None:
    """The entry points with their argument types, keyed by ``<step>_<dtype>`` (the window computed) and
    ``combine_<step>_<dtype>`` (the window given); None without the library."""
    # (B, H, T, D), the halo, shared, the scaling.
    computed = _native.entry_points("local_window_cpu", "local_window", [ctypes.c_int64] * 6 + [ctypes.c_double],
                                    _STEPS)
    if computed is None:
        return None
    # (B, H, T, D), shared, the norm's eps.
    given = _native.entry_points("local_window_cpu", "local_window_combine", [ctypes.c_int64] * 5 + [ctypes.c_double],
                                 _COMBINE_STEPS)
    return computed | {f"combine_{name}": function for name, function in given.items()}


def _call(step: str, scalars: tuple[int | float, ...], tensors: tuple[Tensor, ...], rows: tuple[Tensor, ...]) -> None:
    """Run ``step`` (a key of :func:`_kernels` without its dtype) with the sizes (B, H, T, D) of the (B, H, T, D)
    ``rows`` (passed with their (batch, head, token) strides), then ``scalars``, for their dtype."""
    suffix = {torch.float32: "f32", torch.float64: "f64"}[rows[0].dtype]
    strides = [stride for x in rows for stride in x.stride()[:3]]
    pointers = [ctypes.c_void_p(x.data_ptr()) for x in tensors]
    status = _kernels()[f"{step}_{suffix}"](*rows[0].shape, *scalars, *pointers,
                                            (ctypes.c_int64 * len(strides))(*strides))
    if status:
        raise RuntimeError(f"the local window CPU kernel failed in its {step} (out of memory?)")


@torch.library.custom_op("hf_sliced_attn::local_window_cpu", mutates_args=(), device_types="cpu")
def _forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, x: Tensor, den: Tensor, mix: Tensor, halo: int,
             shared: bool, scaling: float) -> Tensor:
    """q, k, v, x (B, H, T, D) with a contiguous last dim, valid (B, T) bool, den (B, H, T) and mix (H,)
    contiguous, one float dtype -> out (B, H, T, D) laid out as (B, T, H, D)."""
    out = _output(v, *q.shape)
    if out.numel():
        _call("forward", (halo, int(shared), scaling), (q, k, v, valid, x, den, mix, out), (q, k, v, x, out))
    return out


@_forward.register_fake
def _(q, k, v, valid, x, den, mix, halo, shared, scaling) -> Tensor:
    return _output(v, *q.shape)


@torch.library.custom_op("hf_sliced_attn::local_window_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, x: Tensor, den: Tensor, mix: Tensor,
              halo: int, shared: bool, scaling: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """grad_out (B, H, T, D) with a contiguous last dim and the forward's inputs -> the gradients of q, k, v, x
    (their layouts), den and mix."""
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(x),
             torch.empty_like(den), torch.empty_like(mix))
    if q.numel():
        tensors = (grad_out, q, k, v, valid, x, den, mix, *grads)
        _call("backward", (halo, int(shared), scaling), tensors, (grad_out, q, k, v, x, *grads[:4]))
    else:
        for grad in grads:
            grad.zero_()
    return grads


@_backward.register_fake
def _(grad_out, q, k, v, valid, x, den, mix, halo, shared, scaling):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(x),
            torch.empty_like(den), torch.empty_like(mix))


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    *tensors, ctx.halo, ctx.shared, ctx.scaling = inputs
    ctx.save_for_backward(*tensors)


def _backward_rule(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, valid, x, den, mix = ctx.saved_tensors
    dq, dk, dv, dx, dden, dmix = _backward(_rows(grad_out.to(q.dtype)), q, k, v, valid, x, den, mix, ctx.halo,
                                           ctx.shared, ctx.scaling)
    return dq, dk, dv, None, dx, dden, dmix, None, None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


@torch.library.custom_op("hf_sliced_attn::rela_local_window_cpu", mutates_args=(), device_types="cpu")
def _rela_forward(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, scale: Tensor, gate: Tensor, mix: Tensor,
                  halo: int, shared: bool, scaling: float,
                  eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """ReLA's kernel (no sliding window) with the window beside it, then the norm of ReLA's output and the
    combination: q, k, v (B, H, T, D) laid out for :func:`.rela_cpu._rows`, D > 0 -> out (B, H, T, D) laid out as
    (B, T, H, D), and what the backward reads (not differentiable): ReLA's output and total weights, the window's
    output, log-normaliser and weights (:func:`.rela_cpu.rela_window_kernel`)."""
    if not q.numel():  # no token, or D = 0 (every output 0, every weight of ReLA 0): nothing for the kernels
        rows = [_output(q, *q.shape).zero_() for _ in range(3)]
        return (rows[0], rows[1], q.new_zeros(q.shape[:3]), rows[2], q.new_zeros(q.shape[:3]),
                q.new_zeros(*q.shape[:3], 2 * halo + 1))
    numerator, denominator, local, lse, weights = rela_cpu.rela_window_kernel(q, k, v, valid, halo, scaling)
    out = _output(v, *q.shape)
    _call("combine_forward", (int(shared), eps), (numerator, denominator, local, lse, scale, gate, mix, out),
          (numerator, local, out))
    return out, numerator, denominator, local, lse, weights


@_rela_forward.register_fake
def _(q, k, v, valid, scale, gate, mix, halo, shared, scaling, eps):
    rows = _output(q, *q.shape)
    return (_output(v, *q.shape), rows, q.new_empty(q.shape[:3]), torch.empty_like(rows), q.new_empty(q.shape[:3]),
            q.new_empty(*q.shape[:3], 2 * halo + 1))


@torch.library.custom_op("hf_sliced_attn::rela_local_window_cpu_backward", mutates_args=(), device_types="cpu")
def _rela_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, numerator: Tensor,
                   denominator: Tensor, local: Tensor, lse: Tensor, weights: Tensor, scale: Tensor, gate: Tensor,
                   mix: Tensor, shared: bool, scaling: float,
                   eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The combination's and the norm's backward, then ReLA's with the window's for the gradients of ReLA's output
    and total weights and of the window's output -> the gradients of q, k, v, scale, gate and mix."""
    if not q.numel():
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(scale),
                torch.zeros_like(gate), torch.zeros_like(mix))
    dx, dlocal = _output(q, *q.shape), _output(q, *q.shape)
    dden, shift = torch.empty_like(denominator), torch.empty_like(lse)
    dscale, dgate, dmix = torch.empty_like(scale), torch.empty_like(gate), torch.empty_like(mix)
    _call("combine_backward", (int(shared), eps),
          (grad_out, numerator, denominator, local, lse, scale, gate, mix, dx, dden, dscale, dgate, dmix, dlocal,
           shift),
          (grad_out, numerator, local, dx, dlocal))
    dq, dk, dv = rela_cpu.rela_window_backward(dx, dden, dlocal, shift, q, k, v, valid, weights, scaling)
    return dq, dk, dv, dscale, dgate, dmix


@_rela_backward.register_fake
def _(grad_out, q, k, v, valid, numerator, denominator, local, lse, weights, scale, gate, mix, shared, scaling, eps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(scale),
            torch.empty_like(gate), torch.empty_like(mix))


def _rela_setup_context(ctx, inputs: tuple, output: tuple[Tensor, ...]) -> None:
    q, k, v, valid, scale, gate, mix, _, ctx.shared, ctx.scaling, ctx.eps = inputs
    _, *kept = output
    ctx.mark_non_differentiable(*kept)
    ctx.set_materialize_grads(False)  # no zero-filled gradients for the kept tensors
    ctx.save_for_backward(q, k, v, valid, *kept, scale, gate, mix)


def _rela_backward_rule(ctx, grad_out: Tensor | None, *_) -> tuple[Tensor | None, ...]:
    q, k, v, valid, *kept, scale, gate, mix = ctx.saved_tensors
    if grad_out is None:  # gradients are not materialised: none flowed into the output
        grad_out = q.new_zeros(q.shape)
    dq, dk, dv, dscale, dgate, dmix = _rela_backward(
        _rows(grad_out.to(q.dtype)), q, k, v, valid, *kept, scale, gate, mix, ctx.shared, ctx.scaling, ctx.eps,
    )
    return dq, dk, dv, None, dscale, dgate, dmix, None, None, None, None


_rela_forward.register_autograd(_rela_backward_rule, setup_context=_rela_setup_context)


def local_window_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, global_term: Tensor, denominator: Tensor | None,
    mix: Tensor, *, window: int, combine: str, scaling: float,
) -> Tensor:
    """The window's softmax combined with ``global_term`` (B, H, T, D) on CPU tensors with the C++ kernel (needs
    :func:`available`). query, key, value (B, H, T, D), valid (B, T) bool (True = real key), denominator (B, H, T)
    (needed by ``combine="shared"``), mix (H,) -> (B, H, T, D) in global_term's dtype (float16/bfloat16 computed
    in float32); differentiable in every tensor but ``valid``."""
    dtype = compute_dtype(global_term.dtype)
    q, k, v, x = (_rows(t.to(dtype)) for t in (query, key, value, global_term))
    batch, heads, length, _ = q.shape
    den = q.new_zeros(batch, heads, length) if denominator is None else denominator.to(dtype).contiguous()
    halo = min(window, max(length - 1, 0))
    out = _forward(q, k, v, valid.to(torch.bool).contiguous(), x, den, mix.to(dtype).contiguous(), halo,
                   combine == "shared", float(scaling))
    return out.to(global_term.dtype)


def rela_local_window_cpu(
    query: Tensor, key: Tensor, value: Tensor, valid: Tensor, mix: Tensor, *, window: int, combine: str,
    scaling: float, norm_scale: Tensor, norm_gate: Tensor, norm_eps: float = 1e-6,
) -> Tensor:
    """ReLA (no sliding window) after its gated RMSNorm, combined with the window's softmax, on CPU tensors with
    the ReLA and window kernels (needs :func:`available` and :func:`.rela_cpu.available`), as one autograd node
    whose backward gives both attentions' q, k, v gradients from one pass of ReLA's. query, key, value (B, H, T, D),
    valid (B, T) bool, mix (H,), norm_scale and norm_gate (H*D,) -> (B, H, T, D) in value's dtype
    (float16/bfloat16 computed in float32)."""
    dtype = compute_dtype(value.dtype)
    q, k, v = (rela_cpu._rows(t.to(dtype)) for t in (query, key, value))
    scale, gate, mix = (p.to(dtype).contiguous() for p in (norm_scale, norm_gate, mix))
    halo = min(window, max(q.shape[2] - 1, 0))
    out, *_ = _rela_forward(q, k, v, valid.to(torch.bool).contiguous(), scale, gate, mix, halo, combine == "shared",
                            float(scaling), float(norm_eps))
    return out.to(value.dtype)
