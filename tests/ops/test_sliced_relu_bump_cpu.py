"""The C++ CPU kernel of sliced ReLU bump attention (``csrc/sliced_relu_bump_cpu.cpp``): values and
gradients (scalars, values and the bandwidth) against the float64 reference and against the torch
implementation, in every dtype the op takes; its custom ops; and how ``sliced_relu_bump`` picks it.

``test_sliced_relu_bump.py`` runs the op's own tests on the implementation the op picks on CPU, which is
this kernel wherever a compiler is found. The tests that need the kernel built are marked
``requires_compiler``: skipped, with the reason, where no C++ compiler is found."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hf_sliced_attn.ops import _native, sliced_relu_bump, sliced_relu_cpu
from hf_sliced_attn.ops.naive import sliced_relu_bump_reference
from tests.helpers.comparisons import (
    assert_matches_reference,
    op_output_and_input_grads,
    relative_error,
)
from tests.helpers.native import requires_compiler
from tests.helpers.op_inputs import attention_inputs, key_padding

pytestmark = requires_compiler

ALL_INPUTS = ("query_scalars", "key_scalars", "value", "bandwidth")
# dtype -> (output tolerance, gradient tolerance), against the float64 reference: float32 as the op's
# other tests; float64 is computed in float64; half precision is computed in float32 and rounded.
TOLERANCES = {
    torch.float32: (1e-5, 1e-4),
    torch.float64: (1e-10, 1e-9),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (3e-2, 3e-2),
}
CASES = [
    # B, H, M (None: 3-D scalars and an (H,) bandwidth), Tq, Tk, D, dtype
    (1, 1, None, 1, 1, 3, torch.float32),
    (2, 3, None, 17, 17, 8, torch.float32),
    (1, 2, 1, 64, 64, 16, torch.float32),
    (2, 2, 3, 33, 70, 4, torch.float32),
    (3, 1, 3, 130, 9, 5, torch.float32),
    (2, 4, 2, 1, 200, 2, torch.float32),
    (1, 2, None, 300, 1, 7, torch.float32),
    (2, 3, 2, 257, 300, 64, torch.float32),
    (2, 3, None, 40, 50, 8, torch.float64),
    (1, 2, 2, 200, 150, 32, torch.float64),
]
HALF_CASES = [(2, 2, 2, 40, 50, 8, dtype) for dtype in (torch.float16, torch.bfloat16)] + [
    (1, 3, None, 100, 120, 64, dtype) for dtype in (torch.float16, torch.bfloat16)]


def _case_id(case: tuple) -> str:
    batch, heads, slices, q_len, k_len, dim, dtype = case
    return f"B{batch}-H{heads}-M{slices}-Tq{q_len}-Tk{k_len}-D{dim}-{str(dtype).split('.')[-1]}"


@pytest.fixture(autouse=True)
def kernel_built() -> None:
    """A compiler is found here, so the kernel must build: these tests check the kernel, not the fallback."""
    assert sliced_relu_cpu.bump_available(), "the C++ bump kernel did not build (see the NativeKernelWarning)"


@pytest.fixture
def torch_implementation(monkeypatch: pytest.MonkeyPatch) -> Callable[..., torch.Tensor]:
    """sliced_relu_bump on its torch implementation (what other devices run): the op as it runs
    where the kernel is not available."""

    def op(**kwargs) -> torch.Tensor:
        with monkeypatch.context() as patch:
            patch.setattr(sliced_relu_cpu, "bump_available", lambda: False)
            return sliced_relu_bump(**kwargs)

    return op


def _tensors(
    s: torch.Tensor, t: torch.Tensor, v: torch.Tensor, bandwidth: torch.Tensor, mask: torch.Tensor | None = None
) -> dict[str, torch.Tensor | None]:
    """The op's keyword inputs."""
    return {"query_scalars": s, "key_scalars": t, "value": v, "bandwidth": bandwidth, "key_padding_mask": mask}


def _assert_implementations_agree(
    tensors: dict[str, torch.Tensor | None], torch_implementation: Callable[..., torch.Tensor],
    differentiable: tuple[str, ...], rtol: float, grad_rtol: float,
) -> None:
    """The kernel's output and gradients against the torch implementation's, for one random output gradient."""
    out, grads = op_output_and_input_grads(sliced_relu_bump, tensors, differentiable=differentiable)
    expected, expected_grads = op_output_and_input_grads(torch_implementation, tensors, differentiable=differentiable)
    assert out.dtype == expected.dtype and relative_error(out, expected) <= rtol
    for name in differentiable:
        assert grads[name].dtype == expected_grads[name].dtype, name
        error = relative_error(grads[name], expected_grads[name])
        assert error <= grad_rtol, f"d/d{name}: relative error {error:.3g} > {grad_rtol}"


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("case", [pytest.param(case, id=_case_id(case)) for case in CASES])
def test_matches_the_reference_and_the_torch_implementation(case, padded, torch_implementation):
    batch, heads, slices, q_len, k_len, dim, dtype = case
    s, t, v, bandwidth = attention_inputs(batch, heads, slices, q_len, k_len, dim, bandwidth=True, dtype=dtype,
                                          value_offset=3.0)
    mask = key_padding(batch, k_len, 0.3, padded_last_row=batch > 1) if padded else None
    tensors = _tensors(s, t, v, bandwidth, mask)
    rtol, grad_rtol = TOLERANCES[dtype]
    out = assert_matches_reference(sliced_relu_bump, sliced_relu_bump_reference, tensors,
                                   differentiable=ALL_INPUTS, rtol=rtol, grad_rtol=grad_rtol)
    assert out.shape == (batch, heads, q_len, dim) and out.dtype == dtype
    _assert_implementations_agree(tensors, torch_implementation, ALL_INPUTS, rtol, grad_rtol)


@pytest.mark.parametrize("case", [pytest.param(case, id=_case_id(case)) for case in HALF_CASES])
def test_half_precision(case, torch_implementation):
    """Computed in float32, returned in the input's dtype. Half-precision scalars tie often, and at
    a tie or a window edge the reference's autograd takes another side than the op's documented
    slope 0: the output and the value gradient are compared with the reference, every gradient with
    the torch implementation (same conventions)."""
    batch, heads, slices, q_len, k_len, dim, dtype = case
    s, t, v, bandwidth = attention_inputs(batch, heads, slices, q_len, k_len, dim, bandwidth=True, dtype=dtype,
                                          seed=7)
    tensors = _tensors(s, t, v, bandwidth, key_padding(batch, k_len, 0.3, padded_last_row=batch > 1))
    rtol, grad_rtol = TOLERANCES[dtype]
    assert_matches_reference(sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=("value",),
                             rtol=rtol, grad_rtol=grad_rtol)
    _assert_implementations_agree(tensors, torch_implementation, ALL_INPUTS, rtol, grad_rtol)


@pytest.mark.parametrize("slices", [None, 2])
def test_ties_and_keys_on_the_window_edges(slices, torch_implementation):
    """Integer scalars and bandwidths: queries tied with keys, keys exactly at s +- b. The output and
    the value gradient match the reference; every gradient matches the torch implementation, whose
    conventions at the kinks (slope 0) the kernel follows."""
    s, t, v = attention_inputs(2, 3, slices, 40, 50, 6, seed=3)
    s, t = (3 * s).round(), (3 * t).round()
    bandwidth = (torch.arange(3 * (slices or 1)) % 3 + 1).float().view(3, -1).squeeze(-1)  # (H,) or (H, M)
    tensors = _tensors(s, t, v, bandwidth, key_padding(2, 50, 0.3, padded_last_row=True))
    assert_matches_reference(sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=("value",),
                             rtol=1e-5, grad_rtol=1e-5)
    _assert_implementations_agree(tensors, torch_implementation, ALL_INPUTS, 1e-5, 1e-5)


@pytest.mark.parametrize("bandwidth", [1e-2, 1e-3])
def test_narrow_windows_stay_at_float32_rounding(bandwidth):
    """The kernel's running sums are float64, so its float32 error does not grow like max|t| / b as
    the torch implementation's does (see the op's docstring): it stays at float32 rounding."""
    s, t, v = attention_inputs(2, 2, 2, 200, 300, 4, seed=1, value_offset=3.0)
    tensors = _tensors(s, t, v, torch.full((2, 2), bandwidth), key_padding(2, 300, 0.3, padded_last_row=True))
    assert_matches_reference(sliced_relu_bump, sliced_relu_bump_reference, tensors, differentiable=ALL_INPUTS,
                             rtol=1e-5, grad_rtol=1e-4)


def test_custom_op_registrations_pass_opcheck():
    """Schema, fake (meta) implementation, autograd registration and dispatch, as torch checks them."""
    s, t, v, bandwidth, mask = attention_inputs(2, 3, 2, 40, 50, 8, bandwidth=True, padded_fraction=0.2)
    args = (s.double().requires_grad_(), t.double().requires_grad_(), v.requires_grad_(),
            bandwidth.double().requires_grad_(), mask)
    torch.library.opcheck(torch.ops.hf_sliced_attn.sliced_relu_bump_cpu.default, args)


@pytest.mark.parametrize("padded", [False, True])
def test_compiles_as_one_graph_forward_and_backward(padded):
    """torch.compile(fullgraph=True) keeps the kernel's custom ops whole, forward and backward."""
    s, t, v, bandwidth = attention_inputs(2, 3, 2, 40, 50, 8, seed=8, bandwidth=True)
    mask = key_padding(2, 50, 0.3, seed=8, padded_last_row=True) if padded else None
    tensors = _tensors(s, t, v, bandwidth, mask)
    compiled = torch.compile(sliced_relu_bump, fullgraph=True, backend="aot_eager")
    out, grads = op_output_and_input_grads(compiled, tensors, differentiable=ALL_INPUTS)
    expected, expected_grads = op_output_and_input_grads(sliced_relu_bump, tensors, differentiable=ALL_INPUTS)
    assert torch.equal(out, expected)
    for name in ALL_INPUTS:
        assert torch.equal(grads[name], expected_grads[name]), name


def test_value_changed_in_place_before_backward_is_an_error():
    """The op saves the value tensor itself for its backward; autograd must catch a later in-place change."""
    s, t, v, bandwidth = attention_inputs(1, 2, 1, 8, 8, 4, bandwidth=True)
    v = (v.requires_grad_() * 1.0).contiguous()
    out = sliced_relu_bump(s, t, v, bandwidth)
    v.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_results_do_not_depend_on_the_thread_count():
    """Large enough that every (batch, head) group is one thread's share."""
    s, t, v, bandwidth, mask = attention_inputs(4, 8, 2, 512, 512, 32, seed=2, bandwidth=True, padded_fraction=0.1)
    leaves = [x.requires_grad_() for x in (s, t, v, bandwidth)]
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, max(2, threads)):
            torch.set_num_threads(count)
            out = sliced_relu_bump(*leaves, mask)
            results.append((out, *torch.autograd.grad(out, leaves, torch.ones_like(out))))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_non_finite_scalar_gives_nan_in_its_group_only():
    """The (batch, head) group with a NaN (or inf) scalar gets NaN outputs and gradients rather than
    undefined behaviour; the other groups are untouched, and the bandwidth's gradient is NaN only
    for the heads of those groups."""
    s, t, v, bandwidth, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=3, bandwidth=True, padded_fraction=0.2)
    s[0, 1, 0, 5] = float("nan")
    t[1, 2, 1, 7] = float("inf")
    leaves = [x.requires_grad_() for x in (s, t, v, bandwidth)]
    out = sliced_relu_bump(*leaves, mask)
    *grads, db = torch.autograd.grad(out, leaves, torch.ones_like(out))
    expected = sliced_relu_bump_reference(s.double(), t.double(), v.double(), bandwidth.double(), mask)
    keep = torch.ones(2, 3, dtype=torch.bool)
    keep[0, 1] = keep[1, 2] = False
    for x in (out, *grads):
        assert x[~keep].isnan().all() and not x[keep].isnan().any()
    assert db[[1, 2]].isnan().all() and not db[0].isnan().any()
    assert relative_error(out[keep], expected[keep]) <= 1e-5


def test_token_major_layout_is_read_and_written_in_place():
    """Attention layers hold v as a (B, T, H, D) buffer seen as (B, H, T, D): the kernel reads v and
    the output gradient in that layout, writes the output and dL/dv in it, with the results of
    contiguous inputs."""
    s, t, v, bandwidth, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=6, bandwidth=True, padded_fraction=0.2)
    token_major = v.transpose(1, 2).contiguous().requires_grad_()
    out = sliced_relu_bump(s, t, token_major.transpose(1, 2), bandwidth, mask)
    assert out.transpose(1, 2).is_contiguous()  # (B, T, H, D) memory: reshaping to (B, T, H*D) is free
    grad_output = torch.randn(out.transpose(1, 2).shape).transpose(1, 2)
    (dv,) = torch.autograd.grad(out, token_major, grad_output)
    v_plain = v.clone().requires_grad_()
    expected = sliced_relu_bump(s, t, v_plain, bandwidth, mask)
    (expected_dv,) = torch.autograd.grad(expected, v_plain, grad_output.contiguous())
    assert torch.equal(out, expected)
    assert torch.equal(dv.transpose(1, 2), expected_dv)


def test_without_the_kernel_the_op_runs_the_torch_implementation(monkeypatch):
    """The same dispatch rule as sliced_relu's: where the kernel is not available (no compiler, with
    the NativeKernelWarning; HF_SLICED_ATTN_NATIVE=0) the op runs its torch implementation."""
    monkeypatch.setattr(sliced_relu_cpu, "bump_available", lambda: False)
    monkeypatch.setattr(sliced_relu_cpu, "_bump_forward", None)  # any use of the kernel would fail
    s, t, v, bandwidth, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=5, bandwidth=True, padded_fraction=0.2)
    expected = sliced_relu_bump_reference(s.double(), t.double(), v.double(), bandwidth.double(), mask)
    assert relative_error(sliced_relu_bump(s, t, v, bandwidth, mask), expected) <= 1e-5


def test_the_library_exports_both_dtypes():
    library = _native.load("sliced_relu_bump_cpu")
    for name in ("forward_f32", "forward_f64", "backward_f32", "backward_f64"):
        assert hasattr(library, f"sliced_relu_bump_{name}")


@pytest.mark.slow
def test_benchmark_shape_matches_the_torch_implementation(torch_implementation):
    """The benchmarks' shape (B = 1, H = 12, T = 16384, D = 64, the authors' initial bandwidth ln 2),
    values and every gradient, against the torch implementation (the reference is quadratic)."""
    s, t, v = attention_inputs(1, 12, None, 16384, 16384, 64, seed=11)
    tensors = _tensors(s, t, v, torch.full((12,), 0.6931))
    _assert_implementations_agree(tensors, torch_implementation, ALL_INPUTS, 1e-5, 1e-4)
