"""Tests for hf_sliced_attn.ops.sliced_relu_bump against the float64 quadratic reference."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import sliced_relu_bump
from hf_sliced_attn.ops.naive import sliced_relu_bump_reference
from tests.helpers.comparisons import (
    assert_matches_reference,
    op_output_and_input_grads,
    relative_error,
)
from tests.helpers.memory import LargestTensor
from tests.helpers.op_inputs import attention_inputs, key_padding
from tests.ops.test_sliced_relu import SHAPES as SLICED_SHAPES

ALL_INPUTS = ("query_scalars", "key_scalars", "value", "bandwidth")


def _tensors(
    s: torch.Tensor, t: torch.Tensor, v: torch.Tensor, bandwidth: torch.Tensor, mask: torch.Tensor | None = None
) -> dict[str, torch.Tensor | None]:
    """The op's keyword inputs."""
    return {"query_scalars": s, "key_scalars": t, "value": v, "bandwidth": bandwidth, "key_padding_mask": mask}


SHAPES = SLICED_SHAPES
"""The sliced ReLU op's shapes; with 3-D scalars (slices None) the bandwidth is (H,)."""


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("batch,heads,slices,q_len,k_len,dim", SHAPES)
def test_matches_reference(batch, heads, slices, q_len, k_len, dim, padded):
    s, t, v, bandwidth = attention_inputs(batch, heads, slices, q_len, k_len, dim, bandwidth=True)
    mask = key_padding(batch, k_len, 0.3, padded_last_row=batch > 1) if padded else None
    out = assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference, _tensors(s, t, v, bandwidth, mask),
        differentiable=ALL_INPUTS, rtol=1e-5, grad_rtol=1e-4,
    )
    assert out.shape == (batch, heads, q_len, dim) and out.dtype == torch.float32


def test_windows_holding_every_key():
    s, t, v, bandwidth = attention_inputs(2, 2, 2, 50, 60, 4, seed=1, bandwidth=True)
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference,
        _tensors(s, t, v + 3, bandwidth * 100, key_padding(2, 60, 0.3, padded_last_row=True)),
        differentiable=ALL_INPUTS, rtol=1e-5, grad_rtol=1e-4,
    )


@pytest.mark.parametrize("bandwidth", [1e-2, 1e-3])
def test_narrow_windows_within_the_documented_error(bandwidth):
    """Windows of zero to a few keys. The float32 error grows like max|t| / b (the module
    docstring's bound: about 2e-6 max|t| / b relative); float64 inputs are computed in float64."""
    s, t, v = attention_inputs(2, 2, 2, 200, 300, 4, seed=1)
    mask = key_padding(2, 300, 0.3, padded_last_row=True)
    tensors = _tensors(s, t, v + 3, torch.full((2, 2), bandwidth), mask)
    bound = 2e-6 * t.abs().max().item() / bandwidth
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=ALL_INPUTS, rtol=bound,
        grad_rtol=10 * bound,
    )
    tensors = {name: x.double() if x is not None and x.is_floating_point() else x for name, x in tensors.items()}
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=ALL_INPUTS, rtol=1e-9,
        grad_rtol=1e-8,
    )


@pytest.mark.parametrize("slices", [None, 2])
def test_ties_and_keys_on_the_window_edges(slices):
    """Integer scalars and bandwidths: queries tied with keys, keys exactly at s +- b.

    The kernel has no derivative at those kinks (the scalars' and the bandwidth's gradients
    depend on the side taken), so the output and the value gradient are compared."""
    generator = torch.Generator().manual_seed(3)
    lead = (2, 3) if slices is None else (2, 3, slices)
    s = torch.randint(-4, 5, (*lead, 40), generator=generator).float()
    t = torch.randint(-4, 5, (*lead, 50), generator=generator).float()
    v = torch.randn(2, 3, 50, 6, generator=generator)
    bandwidth = torch.randint(1, 4, lead[1:], generator=generator).float()
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference,
        _tensors(s, t, v, bandwidth, key_padding(2, 50, 0.3, padded_last_row=True)),
        differentiable=("value",), rtol=1e-5, grad_rtol=1e-5,
    )


@pytest.mark.parametrize("slices", [None, 2])
def test_gradients_with_ties_at_the_peak(slices):
    """Integer scalars and a bandwidth of 1.5: queries tie with keys but no key sits on a
    window edge. A tie takes slope 0 (torch's |.|' at 0), as in the reference."""
    generator = torch.Generator().manual_seed(4)
    lead = (2, 3) if slices is None else (2, 3, slices)
    s = torch.randint(-4, 5, (*lead, 40), generator=generator).float()
    t = torch.randint(-4, 5, (*lead, 50), generator=generator).float()
    v = torch.randn(2, 3, 50, 6, generator=generator)
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference,
        _tensors(s, t, v, torch.full(lead[1:], 1.5), key_padding(2, 50, 0.3, padded_last_row=True)),
        differentiable=ALL_INPUTS,
        rtol=1e-5, grad_rtol=1e-4,
    )


def test_several_chunks_with_and_without_ties():
    """(batch, head) rows processed a few at a time, some with ties and some without;
    without autograd the output is the same."""
    s, t, v, bandwidth = attention_inputs(2, 3, 2, 64, 6000, 32, seed=9, bandwidth=True)
    s[0, 1], t[0, 1] = s[0, 1].round(), t[0, 1].round()
    tensors = _tensors(s, t, v, bandwidth, key_padding(2, 6000, 0.3, padded_last_row=True))
    out = assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=ALL_INPUTS, rtol=1e-5,
        grad_rtol=1e-4,
    )
    with torch.no_grad():
        assert torch.equal(sliced_relu_bump(**tensors), out.detach())


def test_fully_padded_row_gives_finite_zeros():
    s, t, v, bandwidth = attention_inputs(2, 2, 2, 20, 30, 4, bandwidth=True)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1] = False
    mask[0, :5] = False
    out, grads = op_output_and_input_grads(sliced_relu_bump, _tensors(s, t, v, bandwidth, mask),
                                           differentiable=ALL_INPUTS)
    ds, dt, dv, db = grads.values()
    assert torch.isfinite(out).all() and out[0].abs().max() > 0
    assert all(torch.isfinite(g).all() for g in grads.values()) and db.abs().max() > 0
    for x in (out[1], ds[1], dt[1], dv[1], dt[0, ..., :5], dv[0, :, :5]):
        assert torch.equal(x, torch.zeros_like(x))


@pytest.mark.parametrize("q_len,k_len", [(5, 0), (0, 5)])
@pytest.mark.parametrize("slices", [None, 2])
def test_no_keys_or_no_queries(slices, q_len, k_len):
    """Tk = 0: every query gets 0, and so do the gradients (the bandwidth's too); Tq = 0: an empty output."""
    s, t, v, bandwidth = attention_inputs(2, 3, slices, q_len, k_len, 4, bandwidth=True)
    out, grads = op_output_and_input_grads(sliced_relu_bump, _tensors(s, t, v, bandwidth), differentiable=ALL_INPUTS)
    assert out.shape == (2, 3, q_len, 4) and torch.equal(out, torch.zeros_like(out))
    for name, tensor in zip(ALL_INPUTS, (s, t, v, bandwidth)):
        assert grads[name].shape == tensor.shape and not grads[name].any()


def test_long_sequence_with_offsets():
    """T = 65536 with every scalar offset by 1000 and the values by 5: the error must not grow
    with T. Checked at 256 queries (random ones and the extremes) against all keys."""
    length = 65536
    generator = torch.Generator().manual_seed(4)
    s = torch.randn(1, 1, length, generator=generator) + 1000
    t = torch.randn(1, 1, length, generator=generator) + 1000
    v = torch.randn(1, 1, length, 8, generator=generator) + 5
    bandwidth = torch.tensor([0.5])
    out = sliced_relu_bump(s, t, v, bandwidth)
    queries = torch.cat([torch.randperm(length, generator=generator)[:252], s[0, 0].argsort()[[0, 1, -2, -1]]])
    expected = torch.cat(
        [sliced_relu_bump_reference(s[..., chunk], t, v, bandwidth) for chunk in queries.split(64)], dim=2
    )
    assert relative_error(out[:, :, queries], expected) <= 2e-5


def test_gradients_at_1024():
    s, t, v, bandwidth = attention_inputs(1, 2, 2, 1024, 1024, 16, seed=5, bandwidth=True)
    mask = torch.ones(1, 1024, dtype=torch.bool)
    mask[0, -100:] = False
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference, _tensors(s, t, v + 3, bandwidth, mask),
        differentiable=ALL_INPUTS, rtol=1e-5, grad_rtol=1e-4,
    )


@pytest.mark.parametrize("slices,padded", [(None, False), (2, False), (2, True), (1, True)])
def test_gradcheck(slices, padded):
    s, t, v, bandwidth = attention_inputs(2, 2, slices, 5, 7, 3, dtype=torch.float64, seed=6, bandwidth=True)
    mask = torch.tensor([[True] * 7, [True, False, True, True, False, True, False]]) if padded else None
    leaves = [x.requires_grad_() for x in (s, t, v, bandwidth)]
    assert torch.autograd.gradcheck(lambda *x: sliced_relu_bump(*x, key_padding_mask=mask), leaves)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision(dtype, tolerance):
    s, t, v, bandwidth = attention_inputs(2, 2, 2, 40, 50, 8, dtype=dtype, seed=7, bandwidth=True)
    tensors = _tensors(s, t, v, bandwidth, key_padding(2, 50, 0.3, padded_last_row=True))
    # Half-precision scalars tie often: compare the output and the value gradient.
    out, grads = op_output_and_input_grads(sliced_relu_bump, tensors, differentiable=("value",))
    ref, ref_grads = op_output_and_input_grads(
        sliced_relu_bump_reference, tensors, differentiable=("value",), dtype=torch.float64
    )
    assert out.dtype == dtype and grads["value"].dtype == dtype
    assert relative_error(out, ref) <= tolerance
    assert relative_error(grads["value"], ref_grads["value"]) <= tolerance


def test_memory_is_linear_in_length():
    """No (Tq, Tk) tensor in forward or backward: the largest is a few (M, T, D) buffers."""
    batch, heads, slices, length, dim = 1, 2, 2, 4096, 4
    s, t, v, bandwidth = attention_inputs(batch, heads, slices, length, length, dim, seed=8, bandwidth=True)
    leaves = [x.requires_grad_() for x in (s, t, v, bandwidth)]
    with LargestTensor() as mode:
        out = sliced_relu_bump(*leaves)
        torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert mode.largest <= 8 * batch * heads * slices * (length + 1) * dim < length * length


@pytest.mark.parametrize(
    "bandwidth_shape,slices,expected",
    [
        ((3, 1), None, r"bandwidth must have shape \(H,\) = \(3,\)"),
        ((2,), None, r"bandwidth must have shape \(H,\) = \(3,\)"),
        ((3,), 2, r"bandwidth must have shape \(H, M\) = \(3, 2\)"),
        ((2, 3), 2, r"bandwidth must have shape \(H, M\) = \(3, 2\)"),
    ],
)
def test_bandwidth_shape_errors(bandwidth_shape, slices, expected):
    s, t, v = attention_inputs(2, 3, slices, 5, 7, 4)
    with pytest.raises(ValueError, match=expected):
        sliced_relu_bump(s, t, v, torch.ones(bandwidth_shape))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bandwidth_must_be_positive(bad):
    s, t, v, bandwidth = attention_inputs(2, 3, None, 5, 7, 4, bandwidth=True)
    bandwidth[1] = bad
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        sliced_relu_bump(s, t, v, bandwidth)


def test_scalar_shape_errors_are_the_shared_ones():
    with pytest.raises(ValueError, match=r"key_scalars must have shape \(B, H, Tk\) = \(2, 3, 7\)"):
        sliced_relu_bump(torch.randn(2, 3, 5), torch.randn(2, 3, 6), torch.randn(2, 3, 7, 4), torch.ones(3))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Tk\) = \(2, 7\)"):
        sliced_relu_bump(
            torch.randn(2, 3, 5), torch.randn(2, 3, 7), torch.randn(2, 3, 7, 4), torch.ones(3),
            torch.ones(2, 6, dtype=torch.bool),
        )
