"""The shared plumbing of :mod:`hf_sliced_attn.ops._common`, and every op's use of it."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from hf_sliced_attn.ops import rela, value_mean, windowed_sliced_relu, windowed_sliced_relu_bump, windowed_softmax
from hf_sliced_attn.ops._common import band_mask, check_sliding_window, key_range, pair_mask

BATCH, HEADS, LENGTH, DIM = 2, 2, 6, 4


def _qkv() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {name: torch.randn(BATCH, HEADS, LENGTH, DIM, generator=gen) for name in ("query", "key", "value")}


def _scalars() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {
        "query_scalars": torch.randn(BATCH, HEADS, LENGTH, generator=gen),
        "key_scalars": torch.randn(BATCH, HEADS, LENGTH, generator=gen),
        "value": torch.randn(BATCH, HEADS, LENGTH, DIM, generator=gen),
    }


# (op, its valid inputs but sliding_window, whether sliding_window is required (None rejected))
WINDOWED_OPS: list[tuple[Callable[..., torch.Tensor], Callable[[], dict[str, torch.Tensor]], bool]] = [
    (rela, _qkv, False),
    (value_mean, lambda: {"value": _qkv()["value"]}, False),
    (windowed_softmax, _qkv, True),
    (windowed_sliced_relu, _scalars, True),
    (windowed_sliced_relu_bump, lambda: {**_scalars(), "bandwidth": torch.ones(HEADS)}, True),
]
OP_IDS = [op.__name__ for op, _, _ in WINDOWED_OPS]


def _message(sliding_window: object) -> str:
    """The one message every op raises for a bad ``sliding_window``."""
    return (
        "sliding_window must be None or an int >= 1 (it keeps the pairs with |i - j| <= sliding_window - 1), "
        f"got {sliding_window!r}"
    )


@pytest.mark.parametrize("sliding_window", [0, -1, 2.0, True, "3"], ids=repr)
@pytest.mark.parametrize("op,inputs,required", WINDOWED_OPS, ids=OP_IDS)
def test_every_op_rejects_a_bad_window_with_one_message(op, inputs, required, sliding_window):
    with pytest.raises(ValueError) as error:
        op(**inputs(), sliding_window=sliding_window)
    assert str(error.value) == _message(sliding_window)


@pytest.mark.parametrize("op,inputs,required", WINDOWED_OPS, ids=OP_IDS)
def test_every_op_accepts_the_same_windows(op, inputs, required):
    for sliding_window in (1, 2, LENGTH + 5):
        assert torch.isfinite(op(**inputs(), sliding_window=sliding_window)).all()
    if required:
        with pytest.raises(ValueError) as error:
            op(**inputs(), sliding_window=None)
        assert "sliding_window is required by this windowed op" in str(error.value)
    else:
        assert torch.isfinite(op(**inputs(), sliding_window=None)).all()


def test_check_sliding_window_none():
    check_sliding_window(None)
    with pytest.raises(ValueError, match="sliding_window is required by this windowed op"):
        check_sliding_window(None, required=True)


def _in_window(i: int, j: int, sliding_window: int | None) -> bool:
    return sliding_window is None or abs(i - j) <= sliding_window - 1


WINDOWS = [None, 1, 2, 3, 7, 40]


@pytest.mark.parametrize("sliding_window", WINDOWS)
@pytest.mark.parametrize("k_len", [1, 5, 12])
def test_key_range_is_the_reachable_keys(k_len, sliding_window):
    for start, end in itertools.combinations(range(15), 2):
        lo, hi = key_range(start, end, k_len, sliding_window)
        reachable = [j for j in range(k_len) if any(_in_window(i, j, sliding_window) for i in range(start, end))]
        if reachable:
            assert (lo, hi) == (reachable[0], reachable[-1] + 1), (start, end)
            assert reachable == list(range(lo, hi))
        else:
            assert lo >= hi, (start, end)


@pytest.mark.parametrize("sliding_window", WINDOWS)
def test_band_mask_is_the_window(sliding_window):
    for start, end in itertools.combinations(range(10), 2):
        for lo, hi in itertools.combinations(range(12), 2):
            band = band_mask(start, end, lo, hi, sliding_window, torch.device("cpu"))
            expected = torch.tensor(
                [[_in_window(i, j, sliding_window) for j in range(lo, hi)] for i in range(start, end)]
            )
            if band is None:  # only when every pair of the block is inside the window
                assert expected.all(), (start, end, lo, hi)
            else:
                assert band.dtype == torch.bool and torch.equal(band, expected), (start, end, lo, hi)


@pytest.mark.parametrize("sliding_window", WINDOWS)
@pytest.mark.parametrize("q_len,k_len", [(7, 7), (4, 9), (9, 4), (1, 1)])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_pair_mask_is_padding_and_window(q_len, k_len, sliding_window, padded):
    batch = 3
    key_padding_mask = None
    if padded:
        key_padding_mask = torch.rand(batch, k_len, generator=torch.Generator().manual_seed(k_len)) > 0.4
        key_padding_mask[-1] = False
    mask = pair_mask(batch, q_len, k_len, key_padding_mask, sliding_window, torch.device("cpu"))
    expected = torch.tensor([
        [[(key_padding_mask is None or bool(key_padding_mask[b, j])) and _in_window(i, j, sliding_window)
          for j in range(k_len)] for i in range(q_len)]
        for b in range(batch)
    ]).reshape(batch, 1, q_len, k_len)
    assert torch.equal(mask, expected)
