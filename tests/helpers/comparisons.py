"""How the tests measure errors, and one way to compare a fast op with its float64 reference, values and
gradients, for every op test.

``relative_error`` is the error relative to the expected tensor's own scale; ``scaled_error`` the error on
a scale the caller chooses (a module's largest gradient, say).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch


def relative_error(actual: torch.Tensor, expected: torch.Tensor, floor: float = 1e-6) -> float:
    """max |actual - expected| / max |expected|, in float64.

    The scale is floored at ``floor`` so that tensors that are 0 in exact arithmetic (every
    gradient when there is a single key, a fully padded row) compare by absolute error.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    if not expected.numel():
        return 0.0
    expected = expected.double()
    scale = expected.abs().max().clamp_min(floor)
    return ((actual.double() - expected).abs().max() / scale).item()


def scaled_error(actual: torch.Tensor, expected: torch.Tensor, scale: float) -> float:
    """max |actual - expected| / ``scale``: the error on a scale the caller chooses, such as the
    largest gradient of a parameter's module (the absolute error where ``scale`` is 0)."""
    error = (actual - expected).abs().max().item()
    return error / scale if scale > 0 else error


def op_output_and_input_grads(
    op: Callable[..., torch.Tensor], tensors: Mapping[str, torch.Tensor | None], *,
    differentiable: Sequence[str] = (), dtype: torch.dtype | None = None, seed: int = 0,
    grad_rows: torch.Tensor | None = None, **options,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """op(**tensors, **options), and the gradients of <op(...), g> for the ``differentiable``
    inputs, g a standard normal tensor drawn from ``seed`` (the same g for the same shape).

    ``dtype`` (float64 for a reference) casts the floating inputs first; other tensors
    (masks) and None pass as they are. ``grad_rows``, a bool (T,) over the output's token dim (-2), keeps g on
    those rows and sets it to 0 elsewhere: a loss that reads some tokens only (a pooler's first token, say).
    """
    leaves = {}
    for name, x in tensors.items():
        if x is not None and x.is_floating_point():
            x = x.detach().to(dtype or x.dtype).requires_grad_(name in differentiable)
        leaves[name] = x
    out = op(**leaves, **options)
    if not differentiable:
        return out, {}
    grad_output = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if grad_rows is not None:
        grad_output = grad_output * grad_rows[:, None]
    grads = torch.autograd.grad(out, [leaves[n] for n in differentiable], grad_output.to(out.device, out.dtype),
                                allow_unused=True)
    return out, {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(differentiable, grads)}


def assert_matches_reference(
    op: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
    tensors: Mapping[str, torch.Tensor | None], *, differentiable: Sequence[str] = (),
    rtol: float = 1e-5, grad_rtol: float = 1e-4, seed: int = 0, grad_rows: torch.Tensor | None = None,
    **options,
) -> torch.Tensor:
    """Run ``op`` on ``tensors`` and ``reference`` on their float64 copies (same ``options``).
    Assert that the outputs agree to ``rtol`` and that the gradients of the ``differentiable``
    inputs, for one random output gradient (0 outside ``grad_rows``, see :func:`op_output_and_input_grads`),
    agree to ``grad_rtol`` (both by :func:`relative_error`). A gradient that is exactly 0 in the reference (a
    window of one key: the softmax weight is 1 whatever q and k are) is compared to the scale of the other
    gradients, since float32 arithmetic leaves rounding noise there. Returns the op's output."""
    out, grads = op_output_and_input_grads(op, tensors, differentiable=differentiable, seed=seed,
                                           grad_rows=grad_rows, **options)
    ref, ref_grads = op_output_and_input_grads(reference, tensors, differentiable=differentiable,
                                               dtype=torch.float64, seed=seed, grad_rows=grad_rows, **options)
    error = relative_error(out, ref)
    assert error <= rtol, f"output: relative error {error:.3g} > {rtol}"
    grad_scale = max((g.abs().max().item() for g in ref_grads.values() if g.numel()), default=0.0)
    for name in differentiable:
        exact_zero = not ref_grads[name].count_nonzero()
        error = relative_error(grads[name], ref_grads[name], floor=max(grad_scale, 1e-6) if exact_zero else 1e-6)
        assert error <= grad_rtol, f"d/d{name}: relative error {error:.3g} > {grad_rtol}"
    return out
