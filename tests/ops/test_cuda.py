"""The ops on a CUDA GPU against their float64 references, values and gradients.

Marked ``cuda``: skipped without a GPU (CI has none); ``benchmarks/gpu_check.sh`` runs them.
The CPU-only paths (the blocked scan) are not taken there: :func:`prefix_sum_` picks
``torch.cumsum`` on CUDA, which the scan test checks against the CPU scan.
"""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import (
    gated_rms_norm,
    rela,
    sliced_relu,
    sliced_relu_bump,
    value_mean,
    windowed_sliced_relu,
    windowed_softmax,
)
from hf_sliced_attn.ops._sorted import prefix_sum_
from hf_sliced_attn.ops.naive import (
    gated_rms_norm_reference,
    local_window_reference,
    rela_reference,
    sliced_relu_bump_reference,
    sliced_relu_reference,
    value_mean_reference,
    windowed_softmax_reference,
)
from tests.helpers.comparisons import assert_matches_reference
from tests.ops.test_local_window import differentiable, inputs, sliced_local_window
from tests.helpers.op_inputs import attention_inputs

pytestmark = pytest.mark.cuda
SHAPES = [(2, 3, 1, 17, 8), (1, 4, 4, 300, 16), (1, 2, 2, 2048, 64)]  # B, H, M, T, D


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_sliced_relu_on_cuda(shape, padded):
    batch, heads, slices, length, dim = shape
    s, t, v, mask = attention_inputs(batch, heads, slices, length, length, dim, seed=length, value_offset=3.0,
                                     padded_fraction=0.3, real_first_row=True, device="cuda")
    mask = mask if padded else None
    out = assert_matches_reference(
        sliced_relu, sliced_relu_reference, dict(query_scalars=s, key_scalars=t, value=v, key_padding_mask=mask),
        differentiable=("query_scalars", "key_scalars", "value"), rtol=1e-5, grad_rtol=1e-4)
    assert out.is_cuda


@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_sliced_relu_bump_on_cuda(shape):
    batch, heads, slices, length, dim = shape
    s, t, v, mask = attention_inputs(batch, heads, slices, length, length, dim, seed=length, value_offset=3.0,
                                     padded_fraction=0.3, real_first_row=True, device="cuda")
    bandwidth = torch.full((heads, slices), 0.7, device="cuda")
    assert_matches_reference(
        sliced_relu_bump, sliced_relu_bump_reference,
        dict(query_scalars=s, key_scalars=t, value=v, bandwidth=bandwidth, key_padding_mask=mask),
        differentiable=("query_scalars", "key_scalars", "value", "bandwidth"), rtol=1e-5, grad_rtol=1e-4)


def test_windowed_sliced_relu_on_cuda():
    s, t, v, mask = attention_inputs(1, 2, 2, 200, 200, 16, seed=200, value_offset=3.0, padded_fraction=0.3,
                                     real_first_row=True, device="cuda")
    assert_matches_reference(
        windowed_sliced_relu, sliced_relu_reference,
        dict(query_scalars=s, key_scalars=t, value=v, key_padding_mask=mask),
        differentiable=("query_scalars", "key_scalars", "value"), rtol=1e-5, grad_rtol=1e-4, sliding_window=65)


@pytest.mark.parametrize("window", [None, 65])
def test_rela_and_value_mean_on_cuda(window):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 300, 32, generator=gen).cuda() for _ in range(3))
    mask = (torch.rand(2, 300, generator=gen) > 0.2).cuda()
    assert_matches_reference(rela, rela_reference, dict(query=q, key=k, value=v, key_padding_mask=mask),
                             differentiable=("query", "key", "value"), rtol=1e-5, grad_rtol=1e-4,
                             sliding_window=window)
    assert_matches_reference(value_mean_per_query, value_mean_reference, dict(value=v, key_padding_mask=mask),
                             differentiable=("value",), rtol=1e-5, grad_rtol=1e-4, sliding_window=window)


def value_mean_per_query(value: torch.Tensor, key_padding_mask: torch.Tensor | None,
                         sliding_window: int | None) -> torch.Tensor:
    """value_mean with one row per query, (B, H, T, D), as the reference gives it (without a window it
    returns the one shared row, (B, H, 1, D))."""
    return value_mean(value, key_padding_mask, sliding_window=sliding_window).expand(value.shape)


@pytest.mark.parametrize("return_lse", [False, True], ids=["out", "out-lse"])
def test_windowed_softmax_on_cuda(return_lse):
    """The torch implementation (the CPU kernel is CPU-only), through the output and, with lse, through both."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 300, 32, generator=gen).cuda() for _ in range(3))
    mask = (torch.rand(2, 300, generator=gen) > 0.2).cuda()

    def joined(op):
        def call(**kwargs):
            if not return_lse:
                return op(**kwargs)
            out, lse = op(**kwargs, return_lse=True)
            return torch.cat([out, torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1).to(out.dtype)], -1)
        return call

    out = assert_matches_reference(joined(windowed_softmax), joined(windowed_softmax_reference),
                                   dict(query=q, key=k, value=v, key_padding_mask=mask),
                                   differentiable=("query", "key", "value"), rtol=1e-5, grad_rtol=1e-4,
                                   sliding_window=65)
    assert out.is_cuda


@pytest.mark.parametrize("kernel", ["relu", "bump"])
@pytest.mark.parametrize("combine", ["gate", "shared"])
def test_local_window_attention_on_cuda(kernel, combine):
    """The window's softmax with the global sliced term (every learned input differentiated), on the GPU."""
    tensors = inputs(2, 3, 2, 200, 16, combine=combine, bump=kernel == "bump", affine=True, padded=True, seed=4)
    tensors = {name: None if x is None else x.cuda() for name, x in tensors.items()}
    out = assert_matches_reference(sliced_local_window, local_window_reference, tensors,
                                   differentiable=differentiable(tensors), rtol=1e-5, grad_rtol=1e-4, window=16,
                                   combine=combine, scaling=0.6)
    assert out.is_cuda


def test_gated_rms_norm_on_cuda():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 50, 96, generator=gen).cuda()
    scale, gate = (torch.randn(96, generator=gen).cuda() for _ in range(2))
    assert_matches_reference(gated_rms_norm, gated_rms_norm_reference, dict(x=x, scale=scale, gate=gate),
                             differentiable=("x", "scale", "gate"), rtol=1e-5, grad_rtol=1e-4)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 1000])
def test_the_cuda_scan_is_the_cpu_scan(length):
    x = torch.randn(3, length, 8, dtype=torch.float64)
    torch.testing.assert_close(prefix_sum_(x.cuda().clone()).cpu(), prefix_sum_(x.clone()))
