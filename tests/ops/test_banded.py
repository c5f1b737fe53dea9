"""Tests for :mod:`hf_sliced_attn.ops.banded` against the float64 quadratic references."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from hf_sliced_attn.ops.banded import (
    windowed_sliced_relu,
    windowed_sliced_relu_bump,
    windowed_softmax,
)
from hf_sliced_attn.ops.naive import (
    sliced_relu_bump_reference,
    sliced_relu_reference,
    windowed_softmax_reference,
)
from tests.helpers.comparisons import (
    assert_matches_reference,
    op_output_and_input_grads,
    relative_error,
)
from tests.helpers.memory import LargestTensor
from tests.helpers.op_inputs import key_padding

# (B, H, M, T, D, w, block): M None = (B, H, T) scalars; block None = the default (w).
CASES = [
    pytest.param(2, 3, None, 300, 8, 65, None, id="w65-T300"),
    pytest.param(2, 2, 3, 300, 4, 65, None, id="w65-T300-M3"),
    pytest.param(2, 2, None, 5, 4, 65, None, id="T-smaller-than-w"),
    pytest.param(3, 2, 2, 37, 5, 3, None, id="w3-T-not-multiple"),
    pytest.param(2, 2, None, 37, 5, 9, 8, id="w9-block8-T-not-multiple"),
    pytest.param(2, 1, 2, 23, 3, 6, 1, id="w6-block1"),
    pytest.param(2, 2, 2, 20, 3, 1, None, id="w1"),
]


@pytest.mark.parametrize("batch,heads,slices,length,dim,window,block", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_windowed_sliced_relu_matches_reference(batch, heads, slices, length, dim, window, block, padded):
    gen = torch.Generator().manual_seed(length * 31 + window)
    shape = (batch, heads, length) if slices is None else (batch, heads, slices, length)
    # Continuous random scalars: exact ties s_i == t_j have probability 0.
    s = torch.randn(shape, generator=gen)
    t = torch.randn(shape, generator=gen)
    v = torch.randn(batch, heads, length, dim, generator=gen)
    mask = key_padding(batch, length, 0.3, generator=gen, real_first_row=True, padded_last_row=True) if padded else None

    out = assert_matches_reference(
        partial(windowed_sliced_relu, block_size=block), sliced_relu_reference,
        dict(query_scalars=s, key_scalars=t, value=v, key_padding_mask=mask),
        differentiable=("query_scalars", "key_scalars", "value"), rtol=1e-5, grad_rtol=1e-4,
        sliding_window=window,
    )
    assert out.shape == (batch, heads, length, dim) and out.dtype == torch.float32
    if padded:
        assert (out[-1] == 0).all()


def _bandwidth(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Bandwidths in [0.5, 1.5] of shape (H,) or (H, M): the bumps of N(0, 1) scalars overlap."""
    return 0.5 + torch.rand(shape, generator=generator)


BUMP_INPUTS = ("query_scalars", "key_scalars", "value", "bandwidth")  # the differentiable inputs


@pytest.mark.parametrize("batch,heads,slices,length,dim,window,block", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_windowed_sliced_relu_bump_matches_reference(batch, heads, slices, length, dim, window, block, padded):
    gen = torch.Generator().manual_seed(length * 23 + window)
    shape = (batch, heads, length) if slices is None else (batch, heads, slices, length)
    # Continuous random scalars: |s_i - t_j| hits 0 or b (the bump's kinks) with probability 0.
    s = torch.randn(shape, generator=gen)
    t = torch.randn(shape, generator=gen)
    v = torch.randn(batch, heads, length, dim, generator=gen)
    b = _bandwidth(shape[1:-1], gen)
    mask = key_padding(batch, length, 0.3, generator=gen, real_first_row=True, padded_last_row=True) if padded else None

    out = assert_matches_reference(
        partial(windowed_sliced_relu_bump, block_size=block), sliced_relu_bump_reference,
        dict(query_scalars=s, key_scalars=t, value=v, bandwidth=b, key_padding_mask=mask),
        differentiable=BUMP_INPUTS, rtol=1e-5, grad_rtol=1e-4, sliding_window=window,
    )
    assert out.shape == (batch, heads, length, dim) and out.dtype == torch.float32
    if padded:
        assert (out[-1] == 0).all()


def test_bump_fully_padded_row_gives_zeros_and_finite_gradients():
    gen = torch.Generator().manual_seed(4)
    s, t = torch.randn(2, 3, 2, 10, generator=gen), torch.randn(2, 3, 2, 10, generator=gen)
    v = torch.randn(2, 3, 10, 4, generator=gen)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1] = False
    out, grads = op_output_and_input_grads(
        partial(windowed_sliced_relu_bump, sliding_window=3, block_size=4),
        dict(query_scalars=s, key_scalars=t, value=v, bandwidth=_bandwidth((3, 2), gen), key_padding_mask=mask),
        differentiable=BUMP_INPUTS,
    )
    assert (out[1] == 0).all() and torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads.values())
    for name in ("query_scalars", "key_scalars", "value"):
        assert (grads[name][1] == 0).all(), name


@pytest.mark.parametrize(
    "scalar_shape,bandwidth_shape,match",
    [
        ((2, 3, 8), (3, 1), r"bandwidth must have shape \(H,\) = \(3,\)"),
        ((2, 3, 8), (), r"bandwidth must have shape \(H,\) = \(3,\)"),
        ((2, 3, 4, 8), (3,), r"bandwidth must have shape \(H, M\) = \(3, 4\)"),
        ((2, 3, 4, 8), (4, 3), r"bandwidth must have shape \(H, M\) = \(3, 4\)"),
    ],
)
def test_bump_rejects_bad_bandwidth_shape(scalar_shape, bandwidth_shape, match):
    s = torch.randn(scalar_shape)
    with pytest.raises(ValueError, match=match):
        windowed_sliced_relu_bump(s, s, torch.randn(2, 3, 8, 5), torch.ones(bandwidth_shape), sliding_window=3)


@pytest.mark.parametrize("batch,heads,slices,length,dim,window,block", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_windowed_softmax_matches_reference(batch, heads, slices, length, dim, window, block, padded):
    del slices
    gen = torch.Generator().manual_seed(length * 17 + window)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=gen) for _ in range(3))
    mask = key_padding(batch, length, 0.3, generator=gen, real_first_row=True, padded_last_row=True) if padded else None

    out = assert_matches_reference(
        partial(windowed_softmax, block_size=block), windowed_softmax_reference,
        dict(query=q, key=k, value=v, key_padding_mask=mask),
        differentiable=("query", "key", "value"), rtol=1e-5, grad_rtol=1e-4, scaling=0.7, sliding_window=window,
    )
    assert out.shape == (batch, heads, length, dim) and out.dtype == torch.float32
    if padded:
        assert (out[-1] == 0).all()


def test_default_scaling_is_inverse_sqrt_dim():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 30, 16, generator=gen) for _ in range(3))
    ref = windowed_softmax_reference(q.double(), k.double(), v.double(), sliding_window=5)
    assert relative_error(windowed_softmax(q, k, v, sliding_window=5), ref) <= 1e-5


@pytest.mark.parametrize("block", [1, 2, 7, 64])
def test_result_does_not_depend_on_block(block):
    gen = torch.Generator().manual_seed(block)
    s, t = torch.randn(2, 2, 3, 50, generator=gen), torch.randn(2, 2, 3, 50, generator=gen)
    q, k, v = (torch.randn(2, 2, 50, 6, generator=gen) for _ in range(3))
    mask = key_padding(2, 50, 0.3, generator=gen, real_first_row=True, padded_last_row=True)
    b = _bandwidth((2, 3), gen)
    base_relu = windowed_sliced_relu(s, t, v, mask, sliding_window=7)
    base_bump = windowed_sliced_relu_bump(s, t, v, b, mask, sliding_window=7)
    base_soft = windowed_softmax(q, k, v, mask, sliding_window=7)
    torch.testing.assert_close(windowed_sliced_relu(s, t, v, mask, sliding_window=7, block_size=block), base_relu)
    torch.testing.assert_close(
        windowed_sliced_relu_bump(s, t, v, b, mask, sliding_window=7, block_size=block), base_bump
    )
    torch.testing.assert_close(windowed_softmax(q, k, v, mask, sliding_window=7, block_size=block), base_soft)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[True, True, False, True, True, False], [False] * 6])
    s, t = (torch.randn(2, 1, 2, 6, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    q, k, v = (torch.randn(2, 1, 6, 2, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(
        lambda s, t, v: windowed_sliced_relu(s, t, v, mask, sliding_window=3, block_size=2), (s, t, v)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: windowed_softmax(q, k, v, mask, sliding_window=3, block_size=2), (q, k, v)
    )
    b = (0.5 + torch.rand(1, 2, generator=gen, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda s, t, v, b: windowed_sliced_relu_bump(s, t, v, b, mask, sliding_window=3, block_size=2), (s, t, v, b)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype):
    gen = torch.Generator().manual_seed(2)
    s, t = (torch.randn(2, 2, 40, generator=gen).to(dtype) for _ in range(2))
    q, k, v = (torch.randn(2, 2, 40, 8, generator=gen).to(dtype) for _ in range(3))
    mask = key_padding(2, 40, 0.3, generator=gen, real_first_row=True, padded_last_row=True)
    out = windowed_sliced_relu(s, t, v, mask, sliding_window=9)
    ref = sliced_relu_reference(s, t, v.double(), mask, sliding_window=9)
    assert out.dtype == dtype and relative_error(out, ref) <= 1e-2
    out = windowed_softmax(q, k, v, mask, sliding_window=9)
    ref = windowed_softmax_reference(q, k, v.double(), mask, sliding_window=9)
    assert out.dtype == dtype and relative_error(out, ref) <= 1e-2
    b = _bandwidth((2,), gen).to(dtype)
    out = windowed_sliced_relu_bump(s, t, v, b, mask, sliding_window=9)
    ref = sliced_relu_bump_reference(s, t, v.double(), b, mask, sliding_window=9)
    assert out.dtype == dtype and relative_error(out, ref) <= 1e-2


def test_zero_denominator_gives_zero():
    # Query 0 sees keys 0 and 1 only (w=2), both with t == s: denominator 0, output 0.
    s = torch.tensor([[[1.0, 0.0, 5.0, -2.0]]], requires_grad=True)
    t = torch.tensor([[[1.0, 1.0, 3.0, 4.0]]], requires_grad=True)
    v = torch.randn(1, 1, 4, 3, requires_grad=True)
    out = windowed_sliced_relu(s, t, v, sliding_window=2)
    ref = sliced_relu_reference(s.double(), t.double(), v.double(), sliding_window=2)
    assert (out[0, 0, 0] == 0).all()
    torch.testing.assert_close(out.double(), ref)
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (s, t, v))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 2.0}, "sliding_window"),
        ({"sliding_window": 3, "block_size": 0}, "block_size must be"),
        ({"sliding_window": 3, "key_length": 9}, "same length"),
        ({"sliding_window": 3, "mask": torch.ones(2, 9, dtype=torch.bool)}, "key_padding_mask"),
    ],
)
def test_invalid_arguments(kwargs, match):
    kwargs = dict(kwargs)
    key_length = kwargs.pop("key_length", 8)
    mask = kwargs.pop("mask", None)
    with pytest.raises(ValueError, match=match):
        windowed_softmax(
            torch.randn(2, 2, 8, 4), torch.randn(2, 2, key_length, 4), torch.randn(2, 2, key_length, 4),
            mask, **kwargs,
        )
    with pytest.raises(ValueError, match=match):
        windowed_sliced_relu(
            torch.randn(2, 2, 8), torch.randn(2, 2, key_length), torch.randn(2, 2, key_length, 4),
            mask, **kwargs,
        )
    with pytest.raises(ValueError, match=match):
        windowed_sliced_relu_bump(
            torch.randn(2, 2, 8), torch.randn(2, 2, key_length), torch.randn(2, 2, key_length, 4),
            torch.ones(2), mask, **kwargs,
        )


@pytest.mark.parametrize("op", ["sliced_relu", "sliced_relu_bump", "softmax"])
def test_memory_is_linear_in_length(op):
    """Every tensor made in forward and backward is at most the (T_pad, L) pair band, far below T^2."""
    batch, heads, slices, length, dim, window = 1, 2, 2, 4096, 4, 8
    band = length * (window + 2 * (window - 1))  # T_pad * L per head (and slice); T_pad = T here
    gen = torch.Generator().manual_seed(3)
    if op == "softmax":
        inputs = [torch.randn(batch, heads, length, dim, generator=gen) for _ in range(2)]
        bound = batch * heads * band
    else:
        inputs = [torch.randn(batch, heads, slices, length, generator=gen) for _ in range(2)]
        bound = batch * heads * slices * band
    inputs.append(torch.randn(batch, heads, length, dim, generator=gen))
    if op == "sliced_relu_bump":
        inputs.append(_bandwidth((heads, slices), gen))
    inputs = [x.requires_grad_() for x in inputs]
    mask = torch.rand(batch, length, generator=gen) > 0.2
    fn = {"sliced_relu": windowed_sliced_relu, "sliced_relu_bump": windowed_sliced_relu_bump,
          "softmax": windowed_softmax}[op]

    recorder = LargestTensor()
    with recorder:
        out = fn(*inputs, mask, sliding_window=window)
        forward_calls = recorder.calls
        out.sum().backward()
    assert recorder.calls > forward_calls  # the backward ops were recorded too
    assert all(x.grad is not None for x in inputs)
    assert 0 < recorder.largest <= bound < batch * heads * length**2 // 50
