"""Gated RMS norm (hf_sliced_attn.ops.norm) against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops.naive import gated_rms_norm_reference
from hf_sliced_attn.ops.norm import gated_rms_norm
from tests.helpers.comparisons import assert_matches_reference, relative_error

SHAPES = [(2, 5, 16), (3, 64), (1, 1, 1), (2, 3, 4, 7)]


def make_inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype)
    scale = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(dtype)
    gate = torch.randn(shape[-1], generator=gen).to(dtype)
    return x, scale, gate


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_matches_reference(shape: tuple[int, ...], dtype: torch.dtype, eps: float) -> None:
    x, scale, gate = make_inputs(shape, dtype)
    out = assert_matches_reference(
        gated_rms_norm, gated_rms_norm_reference, {"x": x, "scale": scale, "gate": gate},
        differentiable=("x", "scale", "gate"), rtol=1e-6, grad_rtol=1e-5, eps=eps,
    )
    assert out.shape == x.shape and out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_zero_rows_give_zero_with_finite_grads(dtype: torch.dtype) -> None:
    x, scale, gate = make_inputs((3, 8), dtype)
    x[1] = 0  # one all-zero row next to ordinary ones
    inputs = [t.clone().requires_grad_() for t in (x, scale, gate)]
    out = gated_rms_norm(*inputs)
    assert torch.all(out[1] == 0) and torch.isfinite(out).all() and not torch.all(out == 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in inputs)
    zeros = torch.zeros(4, 8, dtype=dtype, requires_grad=True)
    out = gated_rms_norm(zeros, scale, gate)
    assert torch.all(out == 0)
    out.square().add(out).sum().backward()
    assert torch.isfinite(zeros.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype: torch.dtype) -> None:
    x, scale, gate = make_inputs((4, 32), dtype)
    out = gated_rms_norm(x, scale, gate)
    assert out.dtype == dtype
    assert relative_error(out, gated_rms_norm_reference(x.double(), scale.double(), gate.double())) <= 1e-2


def test_half_input_with_float32_params() -> None:
    x, scale, gate = make_inputs((4, 32), torch.float32)
    out = gated_rms_norm(x.bfloat16(), scale, gate)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, gated_rms_norm_reference(x.bfloat16().double(), scale.double(), gate.double())) <= 1e-2


def test_gradcheck_float64() -> None:
    x, scale, gate = make_inputs((3, 2, 6), torch.float64, seed=2)
    inputs = [t.requires_grad_() for t in (x, scale, gate)]
    assert torch.autograd.gradcheck(gated_rms_norm, inputs)


def test_errors() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"scale must have shape \(D,\) = \(8,\)"):
        gated_rms_norm(x, torch.ones(7), torch.ones(8))
    with pytest.raises(ValueError, match=r"gate must have shape \(D,\) = \(8,\)"):
        gated_rms_norm(x, torch.ones(8), torch.ones(3, 8))
    with pytest.raises(ValueError, match="eps"):
        gated_rms_norm(x, torch.ones(8), torch.ones(8), eps=0.0)
