"""Tests for hf_sliced_attn.ops.sliced_relu against the float64 quadratic reference."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import _sorted, sliced_relu_cpu
from hf_sliced_attn.ops.naive import sliced_relu_reference
from hf_sliced_attn.ops.sliced_relu import sliced_relu
from tests.helpers.comparisons import assert_matches_reference, op_output_and_input_grads, relative_error
from tests.helpers.native import requires_compiler
from tests.helpers.op_inputs import attention_inputs, key_padding

SCALARS_AND_VALUE = ("query_scalars", "key_scalars", "value")


@pytest.fixture(autouse=True, params=[pytest.param("cpu_kernel", marks=requires_compiler), "torch"])
def implementation(request, monkeypatch) -> str:
    """Every test runs on both CPU implementations: the C++ sweep kernel (which must build wherever a
    compiler is found) and the torch implementation (what other devices run)."""
    if request.param == "cpu_kernel":
        assert sliced_relu_cpu.available(), "the C++ CPU kernel did not build (see the NativeKernelWarning)"
    else:
        monkeypatch.setattr(sliced_relu_cpu, "available", lambda: False)
    return request.param


def _tensors(
    s: torch.Tensor, t: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> dict[str, torch.Tensor | None]:
    """The op's keyword inputs."""
    return {"query_scalars": s, "key_scalars": t, "value": v, "key_padding_mask": mask}


SHAPES = [
    # batch, heads, slices (None: 3-D scalars), q_len, k_len, dim
    (2, 3, None, 17, 17, 8),
    (1, 2, 1, 64, 64, 16),
    (2, 2, 3, 33, 70, 4),
    (3, 1, 3, 130, 9, 5),
    (1, 1, None, 1, 1, 3),
    (2, 4, 2, 1, 200, 2),
    (1, 2, None, 300, 1, 7),
]


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("batch,heads,slices,q_len,k_len,dim", SHAPES)
def test_matches_reference(batch, heads, slices, q_len, k_len, dim, padded):
    s, t, v = attention_inputs(batch, heads, slices, q_len, k_len, dim)
    mask = key_padding(batch, k_len, 0.3, padded_last_row=True) if padded else None
    out = assert_matches_reference(
        sliced_relu, sliced_relu_reference, _tensors(s, t, v, mask), differentiable=SCALARS_AND_VALUE,
        rtol=1e-5, grad_rtol=1e-5,
    )
    assert out.shape == (batch, heads, q_len, dim) and out.dtype == torch.float32


@pytest.mark.parametrize("padded", [False, True])
def test_many_chunks(monkeypatch, padded):
    """With one (batch, head) row per chunk of the torch implementation, the forward without a
    backward (one reused buffer for the prefix sums at the queries) and the forward + backward
    both match the reference."""
    monkeypatch.setattr(_sorted, "_CHUNK_ELEMENTS", 1)
    s, t, v = attention_inputs(3, 4, 2, 20, 25, 6, seed=1)
    mask = key_padding(3, 25, 0.3, seed=1, padded_last_row=True) if padded else None
    with torch.no_grad():
        out = sliced_relu(s, t, v, mask)
    expected = sliced_relu_reference(s.double(), t.double(), v.double(), mask)
    assert relative_error(out.double(), expected) < 1e-5
    assert_matches_reference(
        sliced_relu, sliced_relu_reference, _tensors(s, t, v, mask), differentiable=SCALARS_AND_VALUE,
        rtol=1e-5, grad_rtol=1e-5,
    )


@pytest.mark.parametrize("padded", [False, True])
def test_compiles_as_one_graph_forward_and_backward(padded):
    """torch.compile(fullgraph=True): the CPU kernel as opaque custom ops, the torch
    implementation traced through (with padding always masked under compile)."""
    s, t, v = attention_inputs(2, 3, 2, 40, 50, 8, seed=8)
    mask = key_padding(2, 50, 0.3, seed=8, padded_last_row=True) if padded else None
    compiled = torch.compile(sliced_relu, fullgraph=True, backend="aot_eager")
    out, grads = op_output_and_input_grads(compiled, _tensors(s, t, v, mask), differentiable=SCALARS_AND_VALUE)
    expected, expected_grads = op_output_and_input_grads(sliced_relu, _tensors(s, t, v, mask),
                                                         differentiable=SCALARS_AND_VALUE)
    assert relative_error(out, expected) <= 1e-6
    for name in SCALARS_AND_VALUE:
        assert relative_error(grads[name], expected_grads[name]) <= 1e-5, name


def test_value_changed_in_place_before_backward_is_an_error():
    """The op saves the value tensor itself for its backward; autograd must catch a later in-place change."""
    s, t, v = attention_inputs(1, 2, 1, 8, 8, 4)
    v = (v.requires_grad_() * 1.0).contiguous()
    out = sliced_relu(s, t, v)
    v.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_fully_padded_row_gives_finite_zeros():
    s, t, v = attention_inputs(2, 2, 2, 20, 30, 4)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1] = False
    mask[0, :5] = False
    out, grads = op_output_and_input_grads(sliced_relu, _tensors(s, t, v, mask), differentiable=SCALARS_AND_VALUE)
    ds, dt, dv = grads.values()
    assert torch.isfinite(out).all() and out[0].abs().max() > 0
    for x in (out[1], ds[1], dt[1], dv[1], dt[0, ..., :5], dv[0, :, :5]):
        assert torch.equal(x, torch.zeros_like(x))


@pytest.mark.parametrize("q_len,k_len", [(5, 0), (0, 5)])
@pytest.mark.parametrize("slices", [None, 2])
def test_no_keys_or_no_queries(slices, q_len, k_len):
    """Tk = 0 (cross-attention to an empty memory): every query gets 0, and so do the gradients;
    Tq = 0: an empty output."""
    s, t, v = attention_inputs(2, 3, slices, q_len, k_len, 4)
    out, grads = op_output_and_input_grads(sliced_relu, _tensors(s, t, v, None), differentiable=SCALARS_AND_VALUE)
    assert out.shape == (2, 3, q_len, 4) and torch.equal(out, torch.zeros_like(out))
    for name, tensor in zip(SCALARS_AND_VALUE, (s, t, v)):
        assert grads[name].shape == tensor.shape and not grads[name].any()


@pytest.mark.parametrize("slices", [None, 3])
@pytest.mark.parametrize("q_len,k_len", [(40, 50), (100, 130)])
def test_ties(slices, q_len, k_len):
    """Integer scalars with many repeats, queries tied with keys; ties contribute 0. The lengths take
    the CPU kernel's insertion sort (up to 64 scalars) and its radix passes (more: the ties overfill its buckets).

    ReLU and |.| have no derivative at a tie, so only the value gradient is compared."""
    generator = torch.Generator().manual_seed(3)
    lead = (2, 3) if slices is None else (2, 3, slices)
    s = torch.randint(-3, 4, (*lead, q_len), generator=generator).float()
    t = torch.randint(-3, 4, (*lead, k_len), generator=generator).float()
    v = torch.randn(2, 3, k_len, 6, generator=generator)
    assert_matches_reference(
        sliced_relu, sliced_relu_reference, _tensors(s, t, v, key_padding(2, k_len, 0.3, padded_last_row=True)),
        differentiable=("value",), rtol=1e-5, grad_rtol=1e-5,
    )


@pytest.mark.parametrize("layout", ["spread", "outlier", "signed_zeros"])
def test_every_sort_of_the_kernel(layout):
    """200 scalars per slice, sorted by the CPU kernel's bucket sort ("spread": normal scalars) or, where the
    buckets would fill unevenly, its radix passes ("outlier": one scalar 1e6 away from a cluster; "signed_zeros":
    +0 and -0 beside two values, all ties); the same order and results either way."""
    generator = torch.Generator().manual_seed(5)
    s, t, v = attention_inputs(2, 3, 2, 200, 200, 4, seed=5)
    if layout == "outlier":
        s, t = s * 1e-3, t * 1e-3
        s[..., 7], t[..., 11] = 1e6, -1e6
    if layout == "signed_zeros":
        choices = torch.tensor([0.0, -0.0, 1.0, -1.0])
        s = choices[torch.randint(0, 4, s.shape, generator=generator)]
        t = choices[torch.randint(0, 4, t.shape, generator=generator)]
    differentiable = SCALARS_AND_VALUE if layout == "spread" else ("value",)  # ties: no scalar derivative
    assert_matches_reference(
        sliced_relu, sliced_relu_reference, _tensors(s, t, v, key_padding(2, 200, 0.3, padded_last_row=True)),
        differentiable=differentiable, rtol=1e-5, grad_rtol=1e-5,
    )


def test_all_keys_equal_gives_zero():
    s = torch.tensor([[[0.5, 2.0, 2.0, 3.0]]])
    t = torch.full((1, 1, 5), 2.0)
    v = torch.randn(1, 1, 5, 3) + 10
    out = sliced_relu(s, t, v)
    expected = sliced_relu_reference(s.double(), t.double(), v.double())
    assert torch.isfinite(out).all()
    assert (out - expected).abs().max() <= 1e-5
    assert torch.equal(out[0, 0, 1:3], torch.zeros(2, 3))


def _chunked_reference(s: torch.Tensor, t: torch.Tensor, v: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """The float64 reference at the given query indices, a few queries at a time."""
    parts = [
        sliced_relu_reference(s[..., chunk].double(), t.double(), v.double()) for chunk in queries.split(128)
    ]
    return torch.cat(parts, dim=2)


def test_long_sequence_with_offsets():
    """T = 65536 with scalars offset by 100 and values by 5: the error must not grow with T.

    Checked at 1024 random queries plus the extreme ones, against a chunked reference."""
    length = 65536
    generator = torch.Generator().manual_seed(4)
    s = torch.randn(1, 1, length, generator=generator) + 100
    t = torch.randn(1, 1, length, generator=generator) + 100
    v = torch.randn(1, 1, length, 8, generator=generator) + 5
    out = sliced_relu(s, t, v)
    queries = torch.cat([torch.randperm(length, generator=generator)[:1024], s[0, 0].argsort()[[0, 1, -2, -1]]])
    expected = _chunked_reference(s, t, v, queries)
    assert relative_error(out[:, :, queries], expected) <= 2e-5


def test_gradients_at_1024():
    s, t, v = attention_inputs(1, 2, 2, 1024, 1024, 16, seed=5)
    mask = torch.ones(1, 1024, dtype=torch.bool)
    mask[0, -100:] = False
    assert_matches_reference(
        sliced_relu, sliced_relu_reference, _tensors(s, t, v + 3, mask), differentiable=SCALARS_AND_VALUE,
        rtol=1e-5, grad_rtol=1e-4,
    )


@pytest.mark.parametrize("slices,padded", [(None, False), (2, False), (2, True), (1, True)])
def test_gradcheck(slices, padded):
    s, t, v = attention_inputs(2, 2, slices, 5, 7, 3, dtype=torch.float64, seed=6)
    mask = torch.tensor([[True] * 7, [True, False, True, True, False, True, False]]) if padded else None
    leaves = [x.requires_grad_() for x in (s, t, v)]
    assert torch.autograd.gradcheck(lambda *x: sliced_relu(*x, key_padding_mask=mask), leaves)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision(dtype, tolerance):
    s, t, v = attention_inputs(2, 2, 2, 40, 50, 8, dtype=dtype, seed=7)
    tensors = _tensors(s, t, v, key_padding(2, 50, 0.3, padded_last_row=True))
    out, grads = op_output_and_input_grads(sliced_relu, tensors, differentiable=SCALARS_AND_VALUE)
    ref, ref_grads = op_output_and_input_grads(
        sliced_relu_reference, tensors, differentiable=SCALARS_AND_VALUE, dtype=torch.float64
    )
    for name, a, e in [("out", out, ref)] + [(n, grads[n], ref_grads[n]) for n in SCALARS_AND_VALUE]:
        assert a.dtype == dtype, name
        assert relative_error(a, e) <= tolerance, (name, relative_error(a, e))


@pytest.mark.parametrize(
    "s_shape,t_shape,v_shape,mask_shape,expected",
    [
        ((2, 3, 5), (2, 3, 7), (2, 3, 7), None, r"value must have shape \(B, H, Tk, D\)"),
        ((2, 3), (2, 3, 7), (2, 3, 7, 4), None, r"query_scalars must have shape \(B, H, Tq\)"),
        ((2, 4, 5), (2, 4, 7), (2, 3, 7, 4), None, r"query_scalars must have shape \(B, H, Tq\)"),
        ((2, 3, 5), (2, 3, 6), (2, 3, 7, 4), None, r"key_scalars must have shape \(B, H, Tk\) = \(2, 3, 7\)"),
        ((2, 3, 2, 5), (2, 3, 3, 7), (2, 3, 7, 4), None, r"key_scalars must have shape \(B, H, M, Tk\)"),
        ((2, 3, 2, 5), (2, 3, 7), (2, 3, 7, 4), None, r"key_scalars must have shape \(B, H, M, Tk\)"),
        ((2, 3, 5), (2, 3, 7), (2, 3, 7, 4), (2, 6), r"key_padding_mask must have shape \(B, Tk\) = \(2, 7\)"),
    ],
)
def test_shape_errors(s_shape, t_shape, v_shape, mask_shape, expected):
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=expected):
        sliced_relu(torch.randn(s_shape), torch.randn(t_shape), torch.randn(v_shape), mask)
