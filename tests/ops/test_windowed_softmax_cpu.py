"""windowed_softmax and its log-normaliser on both implementations, the C++ CPU kernel
(``csrc/windowed_softmax_cpu.cpp``) and the torch band gathering (what other devices run, and CPUs
without a compiler): values and gradients (q, k, v, and through lse) against the float64 reference
and against each other, in every dtype the op takes; the kernel's custom ops under
``torch.compile(fullgraph=True)``; and how ``windowed_softmax`` picks the kernel.

The kernel's cases are marked ``requires_compiler``: skipped, with the reason, where no C++ compiler
is found; the torch implementation's run everywhere."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hf_sliced_attn.ops import _native, local_window_attention, windowed_softmax, windowed_softmax_cpu
from hf_sliced_attn.ops.naive import windowed_softmax_reference
from tests.helpers.comparisons import assert_matches_reference, op_output_and_input_grads, relative_error
from tests.helpers.native import requires_compiler, requires_compiler_for_inductor
from tests.helpers.op_inputs import key_padding
from tests.ops.test_sliced_relu_bump_cpu import TOLERANCES  # the CPU kernels' tolerances by dtype

QKV = ("query", "key", "value")
CASES = [
    # B, H, T, D, sliding_window, dtype
    (1, 1, 1, 3, 1, torch.float32),
    (2, 3, 23, 5, 1, torch.float32),
    (2, 3, 37, 8, 5, torch.float32),
    (1, 2, 70, 16, 65, torch.float32),
    (3, 2, 131, 64, 9, torch.float32),
    (2, 1, 50, 7, 200, torch.float32),  # wider than T: every key
    (1, 4, 257, 32, 33, torch.float32),
    (2, 2, 45, 12, 6, torch.float64),
    (1, 3, 99, 33, 150, torch.float64),
]
HALF_CASES = [(2, 3, 41, 16, 7, dtype) for dtype in (torch.float16, torch.bfloat16)]


def _case_id(case: tuple) -> str:
    batch, heads, length, dim, window, dtype = case
    return f"B{batch}-H{heads}-T{length}-D{dim}-w{window}-{str(dtype).split('.')[-1]}"


@pytest.fixture(params=[pytest.param("kernel", marks=requires_compiler), "torch"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """windowed_softmax runs the C++ kernel ("kernel"; it must build where a compiler is found) or,
    with the kernel turned off, its torch implementation ("torch")."""
    if request.param == "kernel":
        assert windowed_softmax_cpu.available(), "the C++ windowed softmax kernel did not build (see the warning)"
    else:
        monkeypatch.setattr(windowed_softmax_cpu, "available", lambda: False)
        monkeypatch.setattr(windowed_softmax_cpu, "_forward", None)  # any use of the kernel would fail
    return request.param


def _inputs(case: tuple, padded: bool, seed: int = 0) -> dict[str, torch.Tensor | None]:
    """q, k, v (B, H, T, D) standard normal in the case's dtype and, when ``padded``, a key padding mask
    with every key of the last sequence padded (B > 1: a sequence with no valid key)."""
    batch, heads, length, dim, _, dtype = case
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(batch, heads, length, dim, generator=gen).to(dtype) for name in QKV}
    tensors["key_padding_mask"] = key_padding(batch, length, 0.3, generator=gen, padded_last_row=batch > 1) \
        if padded else None
    return tensors


def _with_lse(op: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> Callable[..., torch.Tensor]:
    """op's output and its lse (0 where -inf) as one (B, H, T, D + 1) tensor, so that a gradient flows
    through both."""

    def joined(**kwargs) -> torch.Tensor:
        out, lse = op(**kwargs, return_lse=True)
        return torch.cat([out, torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1).to(out.dtype)], -1)

    return joined


@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("case", [pytest.param(case, id=_case_id(case)) for case in CASES])
def test_matches_the_reference(case, padded, implementation):
    """Values and the gradients of q, k, v, through the output and through lse, against float64."""
    tensors = _inputs(case, padded)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    options = {"scaling": 0.7, "sliding_window": case[4]}
    out = assert_matches_reference(windowed_softmax, windowed_softmax_reference, tensors, differentiable=QKV,
                                   rtol=rtol, grad_rtol=grad_rtol, **options)
    assert out.dtype == case[-1]
    assert_matches_reference(_with_lse(windowed_softmax), _with_lse(windowed_softmax_reference), tensors,
                             differentiable=QKV, rtol=rtol, grad_rtol=grad_rtol, seed=1, **options)
    _, lse = windowed_softmax(**tensors, **options, return_lse=True)
    assert lse.dtype == (torch.float64 if case[-1] == torch.float64 else torch.float32)
    if padded and case[0] > 1:
        assert (lse[-1] == float("-inf")).all()


def test_peaked_scores_match_the_reference(implementation):
    """Scores spread over hundreds of units: weights from 1 down to float underflow within one window, values
    and gradients against float64."""
    case = (2, 3, 61, 16, 17, torch.float32)
    tensors = _inputs(case, padded=True, seed=3)
    rtol, grad_rtol = TOLERANCES[torch.float32]
    assert_matches_reference(_with_lse(windowed_softmax), _with_lse(windowed_softmax_reference), tensors,
                             differentiable=QKV, rtol=rtol, grad_rtol=grad_rtol, scaling=12.0, sliding_window=case[4])


@pytest.mark.parametrize("case", [pytest.param(case, id=_case_id(case)) for case in HALF_CASES])
def test_half_precision(case, implementation):
    """Computed in float32, returned in the input's dtype."""
    tensors = _inputs(case, padded=True, seed=5)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    out = assert_matches_reference(_with_lse(windowed_softmax), _with_lse(windowed_softmax_reference), tensors,
                                   differentiable=QKV, rtol=rtol, grad_rtol=grad_rtol, sliding_window=case[4])
    assert out.dtype == case[-1]


@requires_compiler
@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("case", [pytest.param(case, id=_case_id(case)) for case in [*CASES, *HALF_CASES]])
def test_kernel_matches_the_torch_implementation(case, return_lse, monkeypatch):
    """Both forms (with and without lse), values and gradients, to the rounding of the compute dtype."""
    _assert_kernel_matches_torch(case, return_lse, monkeypatch)


def _assert_kernel_matches_torch(case: tuple, return_lse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """windowed_softmax's output (with lse, if ``return_lse``) and q, k, v gradients on the kernel against the
    torch implementation, padded inputs."""
    tensors = _inputs(case, padded=True, seed=2)
    op = _with_lse(windowed_softmax) if return_lse else windowed_softmax
    options = {"sliding_window": case[4], "differentiable": QKV}
    out, grads = op_output_and_input_grads(op, tensors, **options)
    with monkeypatch.context() as patch:
        patch.setattr(windowed_softmax_cpu, "available", lambda: False)
        expected, expected_grads = op_output_and_input_grads(op, tensors, **options)
    rtol = 1e-12 if case[-1] == torch.float64 else 1e-5 if case[-1] == torch.float32 else TOLERANCES[case[-1]][0]
    assert out.dtype == expected.dtype and relative_error(out, expected) <= rtol
    # On the scale of the largest gradient: a window of one key gives dq = 0 in exact arithmetic.
    scale = max(1e-6, *(g.abs().max().item() for g in expected_grads.values()))
    for name in QKV:
        assert grads[name].dtype == expected_grads[name].dtype
        assert relative_error(grads[name], expected_grads[name], floor=scale) <= 10 * rtol, name


@requires_compiler
def test_a_query_without_keys_gets_zero_and_zero_gradients():
    """A fully padded sequence: output 0, lse -inf, and exactly zero gradients (not NaN)."""
    q, k, v = (torch.randn(2, 2, 19, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[1] = False
    out, lse = windowed_softmax(q, k, v, mask, sliding_window=4, return_lse=True)
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all() and torch.isfinite(lse[0]).all()
    (out.sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all() and (x.grad[1] == 0).all()


@requires_compiler
def test_reads_strided_inputs_in_place():
    """(B, T, H, D) buffers seen as (B, H, T, D), as attention layers pass them, give what contiguous ones do."""
    q, k, v = (torch.randn(2, 30, 3, 8).transpose(1, 2) for _ in range(3))
    out, lse = windowed_softmax(q, k, v, sliding_window=6, return_lse=True)
    expected, expected_lse = windowed_softmax_reference(q, k, v, sliding_window=6, return_lse=True)
    assert relative_error(out, expected) <= 1e-5 and relative_error(lse, expected_lse) <= 1e-5


@requires_compiler
def test_dispatch(monkeypatch):
    """CPU tensors take the kernel, in both forms, when it is available; without it, the torch implementation."""
    calls = []
    kernel = windowed_softmax_cpu.windowed_softmax_cpu
    monkeypatch.setattr(windowed_softmax_cpu, "windowed_softmax_cpu", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    q = k = v = torch.randn(1, 2, 10, 4)
    windowed_softmax(q, k, v, sliding_window=3)
    windowed_softmax(q, k, v, sliding_window=3, return_lse=True)
    assert len(calls) == 2
    monkeypatch.setattr(windowed_softmax_cpu, "available", lambda: False)
    windowed_softmax(q, k, v, sliding_window=3, return_lse=True)
    assert len(calls) == 2


@requires_compiler
def test_the_library_is_loaded_by_the_shared_loader():
    """Built and loaded by _native.load (so HF_SLICED_ATTN_NATIVE and the missing-compiler fallback apply as to
    the sliced kernels), with both dtypes and both steps."""
    library = _native.load("windowed_softmax_cpu")
    for name in ("forward_f32", "forward_f64", "backward_f32", "backward_f64"):
        assert hasattr(library, f"windowed_softmax_{name}")


@pytest.mark.slow
@requires_compiler
def test_benchmark_shape_matches_the_torch_implementation(monkeypatch):
    """The benchmark's shape (B = 1, H = 12, T = 4096, D = 64, window 64), both forms at once, against the
    torch implementation (the reference is quadratic)."""
    _assert_kernel_matches_torch((1, 12, 4096, 64, 65, torch.float32), True, monkeypatch)


@requires_compiler
@requires_compiler_for_inductor
def test_compiles_whole_inside_local_window_attention():
    """torch.compile(fullgraph=True) of local_window_attention ("shared", which reads lse) keeps the
    kernel's custom ops whole: no graph break, the eager values and gradients."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, sliced = (torch.randn(2, 3, 40, 8, generator=gen, requires_grad=True) for _ in range(4))
    denominator = torch.rand(2, 3, 40, generator=gen) + 0.5
    mix = torch.ones(3)
    mask = key_padding(2, 40, 0.3, generator=gen)

    def op(q, k, v, sliced):
        return local_window_attention(q, k, v, sliced, mix, mask, window=4, combine="shared", denominator=denominator)

    compiled = torch.compile(op, fullgraph=True, backend="aot_eager")  # one graph through AOT autograd, as the op tests compile
    expected = op(q, k, v, sliced)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v, sliced))
    out = compiled(q, k, v, sliced)
    grads = torch.autograd.grad(out.sum(), (q, k, v, sliced))
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
