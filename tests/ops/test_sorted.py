"""The shared sorted-scan machinery: the sequence scan that every sliced kernel's prefix sums use."""

import pytest
import torch

from hf_sliced_attn.ops._sorted import prefix_sum_


@pytest.mark.parametrize("length", [1, 63, 64, 65, 129, 1000])
def test_prefix_sum_is_the_cumulative_sum_along_the_sequence(length):
    """Block boundaries (64 rows), a tail shorter than a block, and a single row."""
    x = torch.randn(2, 3, length, 5, dtype=torch.float64)
    out = x.clone()
    assert prefix_sum_(out) is out  # in place
    torch.testing.assert_close(out, x.cumsum(-2), rtol=1e-12, atol=1e-12)
