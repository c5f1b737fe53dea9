"""Tests for :func:`hf_sliced_attn.ops.rela_local_window_attention` (a local softmax window combined with global
ReLA after its gated RMSNorm, "gate" and "shared") against the float64 quadratic reference, values and
gradients, and for the opt-in return it reads: ``rela(return_denominator=True)``, on the C++ kernel and the
torch path."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import (
    WINDOW_COMBINES,
    gated_rms_norm,
    rela,
    rela_cpu,
    rela_local_window_attention,
    windowed_softmax,
)
from hf_sliced_attn.ops.naive import rela_local_window_reference, rela_reference, rela_weights_reference
from tests.helpers.comparisons import assert_matches_reference, op_output_and_input_grads, relative_error
from tests.helpers.op_inputs import key_padding, rows_with_gradient


def inputs(batch: int, heads: int, length: int, dim: int, *, combine: str, padded: bool,
           dtype: torch.dtype = torch.float32, seed: int = 0) -> dict[str, torch.Tensor | None]:
    """Random q, k, v, per-head mix (a gate in (0, 1), or gamma in [1/e, e]) and the norm's scale and gate over
    the H*D features, with a padded last row."""
    gen = torch.Generator().manual_seed(seed)
    drawn = {
        "query": torch.randn(batch, heads, length, dim, generator=gen),
        "key": torch.randn(batch, heads, length, dim, generator=gen),
        "value": torch.randn(batch, heads, length, dim, generator=gen) + 0.5,
        "mix": (torch.sigmoid(torch.randn(heads, generator=gen)) if combine == "gate"
                else torch.exp(2 * torch.rand(heads, generator=gen) - 1)),
        "norm_scale": 1 + 0.5 * torch.randn(heads * dim, generator=gen),
        "norm_gate": torch.randn(heads * dim, generator=gen),
    }
    drawn = {name: x.to(dtype) for name, x in drawn.items()}
    drawn["key_padding_mask"] = (key_padding(batch, length, 0.3, generator=gen, real_first_row=True,
                                             padded_last_row=True) if padded else None)
    return drawn


DIFFERENTIABLE = ("query", "key", "value", "mix", "norm_scale", "norm_gate")

# (B, H, T, D, w)
CASES = [
    pytest.param(2, 3, 37, 8, 4, id="w4-T37"),
    pytest.param(2, 2, 20, 4, 1, id="w1"),
    pytest.param(1, 2, 9, 4, 9, id="w-equals-T"),
    pytest.param(3, 2, 64, 6, 15, id="w15-T64"),
    pytest.param(2, 3, 40, 32, 4, id="w4-D32"),  # the kernel's compiled-in head dims
    pytest.param(1, 2, 33, 64, 16, id="w16-D64"),
    pytest.param(2, 2, 300, 8, 4, id="w4-T300"),  # ReLA's kernel's tiles of 256 keys: windows across a tile's edge
]


@pytest.mark.parametrize("batch,heads,length,dim,window", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_reference(batch, heads, length, dim, window, padded, combine, dtype, window_implementation):
    tensors = inputs(batch, heads, length, dim, combine=combine, padded=padded, dtype=dtype, seed=length + window)
    out = assert_matches_reference(
        rela_local_window_attention, rela_local_window_reference, tensors, differentiable=DIFFERENTIABLE,
        rtol=1e-5, grad_rtol=1e-4, window=window, combine=combine, scaling=0.6,
    )
    assert out.shape == (batch, heads, length, dim) and out.dtype == dtype
    if padded:
        assert (out[-1] == 0).all()  # a sequence with no real key: no window key, D = 0


@pytest.mark.parametrize("length,dim", [(300, 8), (40, 32)], ids=["T300", "D32"])
@pytest.mark.parametrize("rows", ["first", "scattered"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_tokens_without_gradient(length, dim, rows, combine, window_implementation):
    """A loss that reads some tokens only (a pooler's [CLS]): the reference's gradients in float64 (in float32 the
    norm's gate gradient, summed over so few tokens, cancels to the rounding's scale), and exact zeros in dq on the
    tokens without a gradient, in float32 too (the kernels skip them)."""
    selected = rows_with_gradient(length, rows)
    options = {"window": 4, "combine": combine, "scaling": 0.6, "grad_rows": selected}
    tensors = inputs(2, 2, length, dim, combine=combine, padded=True, dtype=torch.float64, seed=11)
    assert_matches_reference(rela_local_window_attention, rela_local_window_reference, tensors,
                             differentiable=DIFFERENTIABLE, rtol=1e-10, grad_rtol=1e-10, **options)
    for dtype in (torch.float32, torch.float64):
        _, grads = op_output_and_input_grads(rela_local_window_attention, tensors, differentiable=DIFFERENTIABLE,
                                             dtype=dtype, **options)
        assert (grads["query"][:, :, ~selected] == 0).all()


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_bfloat16_is_computed_in_float32(combine, window_implementation):
    tensors = inputs(2, 2, 30, 8, combine=combine, padded=True, dtype=torch.bfloat16, seed=5)
    out = assert_matches_reference(
        rela_local_window_attention, rela_local_window_reference, tensors, differentiable=DIFFERENTIABLE,
        rtol=2e-2, grad_rtol=5e-2, window=3, combine=combine, scaling=0.6,
    )
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_both_parts_carry_weight(combine):
    """The test inputs mix the two parts: the output is neither the window's softmax nor ReLA's normalised term."""
    tensors = inputs(2, 3, 37, 8, combine=combine, padded=False, dtype=torch.float64)
    q, k, v = tensors["query"], tensors["key"], tensors["value"]
    numerator = (rela_weights_reference(q, k, scaling=0.6) @ v).transpose(1, 2).reshape(2, 37, 24)
    global_term = gated_rms_norm(numerator, tensors["norm_scale"], tensors["norm_gate"]).view(2, 37, 3, 8)
    local = windowed_softmax(q, k, v, scaling=0.6, sliding_window=5)
    out = rela_local_window_attention(**tensors, window=4, combine=combine, scaling=0.6)
    for part in (global_term.transpose(1, 2), local):
        assert relative_error(out, part) > 0.05


def test_window_softmax_is_not_normalised():
    """Where the shared normaliser gives the window all the mass (gamma -> 0), the output is the window's
    softmax itself, which the norm (here a gain of 3) does not rescale; the gate at g = 1 likewise."""
    for combine, mix in (("shared", 1e-30), ("gate", 1.0)):
        tensors = inputs(2, 3, 37, 8, combine=combine, padded=False, dtype=torch.float64, seed=4)
        tensors["mix"] = torch.full((3,), mix, dtype=torch.float64)
        tensors["norm_scale"] = torch.full((24,), 3.0, dtype=torch.float64)
        q, k, v = tensors["query"], tensors["key"], tensors["value"]
        out = rela_local_window_attention(**tensors, window=4, combine=combine, scaling=0.6)
        local = windowed_softmax(q, k, v, scaling=0.6, sliding_window=5)
        assert relative_error(out, local) <= 1e-12, combine


@pytest.mark.parametrize("native", [True, False], ids=["cpu-kernel", "torch"])
@pytest.mark.parametrize("sliding_window", [None, 5])
def test_rela_returns_its_denominator(native, sliding_window, monkeypatch):
    """``return_denominator``: O as without it and D_i = sum_j ReLU(a_ij) over the allowed keys, float32 for
    half inputs, with gradients in q and k; on the C++ kernel and on the torch path."""
    if native and not rela_cpu.available():
        pytest.skip("the ReLA C++ kernel does not build here")
    if not native:
        monkeypatch.setattr(rela_cpu, "available", lambda: False)
    tensors = inputs(2, 3, 29, 8, combine="gate", padded=True, dtype=torch.float64, seed=11)
    q, k, v, mask = tensors["query"], tensors["key"], tensors["value"], tensors["key_padding_mask"]

    def with_denominator(query, key, value, key_padding_mask):
        out, den = rela(query, key, value, key_padding_mask, scaling=0.6, sliding_window=sliding_window,
                        return_denominator=True)
        return torch.cat([out, den.unsqueeze(-1)], dim=-1)

    def reference(query, key, value, key_padding_mask):
        out = rela_reference(query, key, value, key_padding_mask, scaling=0.6, sliding_window=sliding_window)
        den = rela_weights_reference(query, key, key_padding_mask, scaling=0.6, sliding_window=sliding_window)
        return torch.cat([out, den.sum(-1, keepdim=True)], dim=-1)

    assert_matches_reference(with_denominator, reference, {"query": q, "key": k, "value": v, "key_padding_mask": mask},
                             differentiable=("query", "key", "value"), rtol=1e-10, grad_rtol=1e-10)
    half = rela(q.half(), k.half(), v.half(), mask, scaling=0.6, return_denominator=True)
    assert half[0].dtype == torch.float16 and half[1].dtype == torch.float32


@pytest.mark.parametrize("shape", [(2, 3, 0, 8), (0, 3, 5, 8)], ids=["no-token", "no-sequence"])
def test_empty_inputs_give_empty_outputs_and_zero_gradients(shape, window_implementation):
    """No token or no sequence: the output has value's shape, and every gradient is zero (the parameters' too)."""
    heads, dim = shape[1], shape[3]
    tensors = {"query": torch.randn(shape), "key": torch.randn(shape), "value": torch.randn(shape),
               "mix": torch.ones(heads), "norm_scale": torch.ones(heads * dim), "norm_gate": torch.zeros(heads * dim)}
    out, grads = op_output_and_input_grads(rela_local_window_attention, tensors, differentiable=DIFFERENTIABLE,
                                           window=4, combine="shared")
    assert out.shape == shape and not out.any()
    assert all(grads[name].shape == tensors[name].shape and not grads[name].any() for name in DIFFERENTIABLE)


def test_bad_combine_is_refused_before_any_work():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"combine='sum' is not valid: use one of \['gate', 'shared'\]"):
        rela_local_window_attention(q, q, q, torch.ones(2), norm_scale=torch.ones(8), norm_gate=torch.ones(8),
                                    window=2, combine="sum")


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_compiles_as_one_graph_forward_and_backward(combine):
    """torch.compile(fullgraph=True): eager's output and gradients."""
    tensors = inputs(2, 3, 40, 8, combine=combine, padded=True, seed=3)
    torch._dynamo.reset()
    compiled = torch.compile(rela_local_window_attention, fullgraph=True, backend="aot_eager")
    out, grads = op_output_and_input_grads(compiled, tensors, differentiable=DIFFERENTIABLE, window=4, combine=combine)
    expected, expected_grads = op_output_and_input_grads(rela_local_window_attention, tensors,
                                                         differentiable=DIFFERENTIABLE, window=4, combine=combine)
    assert relative_error(out, expected) <= 1e-6
    for name in DIFFERENTIABLE:
        assert relative_error(grads[name], expected_grads[name]) <= 1e-5, name
    torch._dynamo.reset()
