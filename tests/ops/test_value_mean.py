"""Tests for :func:`hf_sliced_attn.ops.value_mean` against its float64 reference."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import value_mean
from hf_sliced_attn.ops.naive import value_mean_reference
from tests.helpers.comparisons import assert_matches_reference
from tests.helpers.op_inputs import attention_inputs


def _per_query(
    value: torch.Tensor, key_padding_mask: torch.Tensor | None, sliding_window: int | None
) -> torch.Tensor:
    """value_mean with one row per query, (B, H, T, D), as the reference gives it."""
    return value_mean(value, key_padding_mask, sliding_window=sliding_window).expand(value.shape)


@pytest.mark.parametrize("batch,heads,length,dim", [(2, 3, 50, 8), (3, 1, 7, 4), (2, 2, 1, 3)])
@pytest.mark.parametrize("window", [None, 1, 4, 65], ids=lambda w: f"w{w}")
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_value_mean_matches_reference(batch, heads, length, dim, window, padded):
    value, mask = attention_inputs(batch, heads, None, length, length, dim, scalars=False, padded_fraction=0.4,
                                   real_first_row=True, padded_last_row=True, seed=batch * 100 + length)
    mask = mask if padded else None
    expected_rows = 1 if window is None else length
    assert value_mean(value, mask, sliding_window=window).shape == (batch, heads, expected_rows, dim)
    out = assert_matches_reference(
        _per_query, value_mean_reference, {"value": value, "key_padding_mask": mask},
        differentiable=("value",), rtol=1e-6, grad_rtol=1e-6, sliding_window=window,
    )
    assert out.dtype == torch.float32
    if padded:
        assert (out[-1] == 0).all()  # no valid key: 0, not NaN


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_value_mean_half_precision_is_summed_in_float32(dtype):
    value, mask = attention_inputs(2, 2, None, 300, 300, 8, scalars=False, padded_fraction=0.4, real_first_row=True,
                                   padded_last_row=True, dtype=dtype, seed=500)
    out = assert_matches_reference(
        _per_query, value_mean_reference, {"value": value, "key_padding_mask": mask}, rtol=1e-2, sliding_window=65
    )
    assert out.dtype == dtype


def test_value_mean_window_covering_the_sequence_is_the_global_mean():
    value, mask = attention_inputs(2, 2, None, 20, 20, 4, scalars=False, padded_fraction=0.4, real_first_row=True,
                                   padded_last_row=True, dtype=torch.float64, seed=220)
    windowed = value_mean(value, mask, sliding_window=20)
    torch.testing.assert_close(windowed, value_mean(value, mask).expand_as(windowed))


@pytest.mark.parametrize(
    "shape,mask_shape,window,message",
    [
        ((2, 3, 5), None, None, r"value must be \(B, H, T, D\)"),
        ((2, 3, 5, 4), (2, 6), None, r"key_padding_mask must have shape \(B, Tk\) = \(2, 5\)"),
        ((2, 3, 5, 4), None, 0, "sliding_window must be None or an int >= 1"),
    ],
)
def test_value_mean_rejects_bad_input(shape, mask_shape, window, message):
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        value_mean(torch.zeros(shape), mask, sliding_window=window)
