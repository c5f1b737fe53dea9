"""Tests for :func:`hf_sliced_attn.ops.value_mean` against its float64 reference."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import value_mean
from hf_sliced_attn.ops.naive import value_mean_reference


def _inputs(batch: int, heads: int, length: int, dim: int, padded: bool, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(batch * 100 + length)
    value = torch.randn(batch, heads, length, dim, generator=gen).to(dtype).requires_grad_()
    mask = None
    if padded:
        mask = torch.rand(batch, length, generator=gen) > 0.4
        mask[0] = True
        mask[-1] = False  # a row with no valid key
    return value, mask, torch.randn(batch, heads, length, dim, generator=gen)


@pytest.mark.parametrize("batch,heads,length,dim", [(2, 3, 50, 8), (3, 1, 7, 4), (2, 2, 1, 3)])
@pytest.mark.parametrize("window", [None, 1, 4, 65], ids=lambda w: f"w{w}")
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_value_mean_matches_reference(batch, heads, length, dim, window, padded):
    value, mask, grad_out = _inputs(batch, heads, length, dim, padded, torch.float32)
    out = value_mean(value, mask, sliding_window=window)
    expected_rows = 1 if window is None else length
    assert out.shape == (batch, heads, expected_rows, dim) and out.dtype == torch.float32
    out = out.expand(batch, heads, length, dim)
    (grad,) = torch.autograd.grad(out, value, grad_out)

    v64 = value.detach().double().requires_grad_()
    ref = value_mean_reference(v64, mask, sliding_window=window)
    (ref_grad,) = torch.autograd.grad(ref, v64, grad_out.double())
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-6, rtol=1e-5)
    if padded:
        assert (out[-1] == 0).all()  # no valid key: 0, not NaN


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_value_mean_half_precision_is_summed_in_float32(dtype):
    value, mask, _ = _inputs(2, 2, 300, 8, True, dtype)
    out = value_mean(value.detach(), mask, sliding_window=65)
    assert out.dtype == dtype
    ref = value_mean_reference(value.detach(), mask, sliding_window=65)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-2, rtol=1e-2)


def test_value_mean_window_covering_the_sequence_is_the_global_mean():
    value, mask, _ = _inputs(2, 2, 20, 4, True, torch.float64)
    windowed = value_mean(value, mask, sliding_window=20)
    torch.testing.assert_close(windowed, value_mean(value, mask).expand_as(windowed))


@pytest.mark.parametrize(
    "shape,mask_shape,window,message",
    [
        ((2, 3, 5), None, None, r"value must be \(B, H, T, D\)"),
        ((2, 3, 5, 4), (2, 6), None, r"key_padding_mask must be \(B, T\) = \(2, 5\)"),
        ((2, 3, 5, 4), None, 0, "sliding_window must be an int >= 1"),
    ],
)
def test_value_mean_rejects_bad_input(shape, mask_shape, window, message):
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        value_mean(torch.zeros(shape), mask, sliding_window=window)
