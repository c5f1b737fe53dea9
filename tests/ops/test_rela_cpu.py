"""ReLA's C++ CPU kernel (``csrc/rela_cpu.cpp``, what :func:`rela` runs on CPU): values and gradients
(q, k, v), and of its normaliser D = sum_j A_ij, against the float64 reference and against the torch
implementation (what other devices run), in every dtype the op takes, with key padding (a sequence with no valid key, a key tile all padded)
and sliding windows (tiles skipped, tiles cut by the band); the custom ops under
``torch.compile(fullgraph=True)``; and how :func:`rela` picks the kernel.

Every case here needs the kernel: skipped, with the reason, where no C++ compiler is found (a compiler
that fails to build it fails them). tests/ops/test_rela.py checks the torch implementation alone."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import _native, rela, rela_cpu
from hf_sliced_attn.ops.naive import rela_reference, rela_weights_reference
from tests.helpers.comparisons import assert_matches_reference, op_output_and_input_grads, relative_error
from tests.helpers.native import requires_compiler
from tests.helpers.op_inputs import key_padding, rows_with_gradient
from tests.ops.test_sliced_relu_bump_cpu import TOLERANCES  # the CPU kernels' tolerances by dtype

pytestmark = requires_compiler

QKV = ("query", "key", "value")
TILE = 256  # the kernel's query and key tiles (kQueryTile, kKeyTile)
CASES = [
    # B, H, Tq, Tk, D, sliding_window, dtype
    (1, 1, 1, 1, 3, None, torch.float32),
    (2, 3, 23, 23, 5, None, torch.float32),
    (2, 2, 300, 300, 16, None, torch.float32),  # two tiles each way, the second partial
    (1, 2, 100, 37, 8, None, torch.float32),  # Tq != Tk
    (2, 1, 37, 300, 8, 7, torch.float32),
    (2, 2, 600, 600, 8, 65, torch.float32),  # tiles out of every window skipped, tiles cut by the band
    (1, 1, 520, 520, 4, 1, torch.float32),  # a window of one key: the diagonal
    (2, 1, 50, 50, 7, 200, torch.float32),  # wider than T: every key
    (2, 2, 45, 45, 12, 6, torch.float64),
    (1, 3, 270, 99, 33, None, torch.float64),
    (2, 2, 40, 40, 32, None, torch.float32),  # the head dims compiled in
    (1, 2, 70, 70, 64, 9, torch.float64),
]
HALF_CASES = [(2, 3, 41, 41, 16, 7, dtype) for dtype in (torch.float16, torch.bfloat16)]


def _case_id(case: tuple) -> str:
    batch, heads, q_len, k_len, dim, window, dtype = case
    return f"B{batch}-H{heads}-Tq{q_len}-Tk{k_len}-D{dim}-w{window}-{str(dtype).split('.')[-1]}"


def _params(cases: list[tuple]) -> list:
    return [pytest.param(case, id=_case_id(case)) for case in cases]


@pytest.fixture(autouse=True)
def kernel_built() -> None:
    """The kernel must build wherever a compiler is found."""
    assert rela_cpu.available(), "the C++ ReLA kernel did not build (see the warning)"


def _inputs(case: tuple, padded: bool, seed: int = 0) -> dict[str, torch.Tensor | None]:
    """q (B, H, Tq, D), k, v (B, H, Tk, D) standard normal in the case's dtype and, when ``padded``, a key
    padding mask with every key of the last sequence padded (B > 1: a sequence with no valid key)."""
    batch, heads, q_len, k_len, dim, _, dtype = case
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(batch, heads, t, dim, generator=gen).to(dtype)
               for name, t in zip(QKV, (q_len, k_len, k_len), strict=True)}
    tensors["key_padding_mask"] = key_padding(batch, k_len, 0.3, generator=gen, padded_last_row=batch > 1) \
        if padded else None
    return tensors


def _torch_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rela_cpu, "available", lambda: False)


@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("case", _params(CASES))
def test_matches_the_reference(case, padded):
    tensors = _inputs(case, padded)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    out = assert_matches_reference(rela, rela_reference, tensors, differentiable=QKV, rtol=rtol,
                                   grad_rtol=grad_rtol, scaling=0.3, sliding_window=case[5])
    assert out.dtype == case[-1]


@pytest.mark.parametrize("case", _params([CASES[2], CASES[4], CASES[5], CASES[8]]))
def test_the_kernel_returns_the_normaliser_with_its_gradient(case):
    """``return_denominator`` on the kernel: D_i = sum_j A_ij over tiles, windows and padding, and its gradient
    in q and k when D alone reaches the loss (the kernel's backward gets no gradient of O)."""
    tensors = _inputs(case, padded=True, seed=8)
    q, k = (tensors[name].requires_grad_() for name in ("query", "key"))
    mask, window = tensors["key_padding_mask"], case[5]
    denominator = rela(**tensors, scaling=0.3, sliding_window=window, return_denominator=True)[1]
    weights = rela_weights_reference(q, k, mask, scaling=0.3, sliding_window=window)
    expected = weights.sum(-1)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    assert denominator.dtype == case[-1] and relative_error(denominator, expected) <= rtol
    probe = torch.randn_like(expected)
    grads = torch.autograd.grad((denominator * probe).sum(), (q, k))
    expected_grads = torch.autograd.grad((expected * probe).sum(), (q, k))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert relative_error(grad, expected_grad) <= grad_rtol


@pytest.mark.parametrize("rows", ["first", "scattered"])
@pytest.mark.parametrize("case", _params([CASES[2], CASES[4], CASES[5], CASES[8]]))
def test_rows_without_gradient(case, rows):
    """A loss that reads some query rows only: the reference's gradients, and exact zeros in dq on the rows
    without a gradient (the backward trims each query tile to the span of the rows with one, and skips a tile
    with none)."""
    tensors = _inputs(case, padded=True, seed=6)
    selected = rows_with_gradient(case[2], rows)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    assert_matches_reference(rela, rela_reference, tensors, differentiable=QKV, rtol=rtol, grad_rtol=grad_rtol,
                             grad_rows=selected, scaling=0.3, sliding_window=case[5])
    _, grads = op_output_and_input_grads(rela, tensors, differentiable=QKV, grad_rows=selected,
                                         sliding_window=case[5])
    assert (grads["query"][:, :, ~selected] == 0).all()


@pytest.mark.parametrize("case", _params(HALF_CASES))
def test_half_precision(case):
    """Computed in float32, returned (with the gradients) in the input's dtype."""
    tensors = _inputs(case, padded=True, seed=5)
    rtol, grad_rtol = TOLERANCES[case[-1]]
    out = assert_matches_reference(rela, rela_reference, tensors, differentiable=QKV, rtol=rtol,
                                   grad_rtol=grad_rtol, sliding_window=case[5])
    assert out.dtype == case[-1]


@pytest.mark.parametrize("case", _params([*CASES, *HALF_CASES]))
def test_matches_the_torch_implementation(case, monkeypatch):
    """Values and gradients, padded inputs, to the rounding of the compute dtype."""
    tensors = _inputs(case, padded=True, seed=2)
    options = {"sliding_window": case[5], "differentiable": QKV}
    out, grads = op_output_and_input_grads(rela, tensors, **options)
    with monkeypatch.context() as patch:
        _torch_implementation(patch)
        expected, expected_grads = op_output_and_input_grads(rela, tensors, **options)
    rtol = 1e-12 if case[-1] == torch.float64 else 1e-5 if case[-1] == torch.float32 else TOLERANCES[case[-1]][0]
    assert out.dtype == expected.dtype and relative_error(out, expected) <= rtol
    for name in QKV:
        assert grads[name].dtype == expected_grads[name].dtype
        assert relative_error(grads[name], expected_grads[name]) <= 10 * rtol, name


@pytest.mark.parametrize("window", [None, 100])
def test_padded_tiles_and_poisoned_keys_give_exact_zeros(window):
    """A whole key tile padded (skipped, with valid keys after it), scattered padding, padding on both ends of a
    sequence (the keys the kernel trims off), a window: padded keys and the keys outside a query's window may hold
    anything finite, and change nothing; their gradients are exactly 0, and a sequence without valid keys gets 0 and
    zero gradients."""
    batch, heads, length, dim = 3, 2, 2 * TILE + 40, 8
    gen = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(batch, heads, length, dim, generator=gen) for _ in range(3))
    mask = key_padding(batch, length, 0.2, generator=gen, padded_last_row=True)
    mask[0, TILE:2 * TILE] = False
    mask[1, :TILE + 3] = mask[1, -70:] = False
    tensors = {"query": query, "key": key, "value": value, "key_padding_mask": mask}
    out, grads = op_output_and_input_grads(rela, tensors, differentiable=QKV, sliding_window=window)
    assert (out[-1] == 0).all() and (grads["query"][-1] == 0).all()
    padded = ~mask[:, None, :, None].expand_as(key)
    assert (grads["key"][padded] == 0).all() and (grads["value"][padded] == 0).all()
    assert relative_error(out, rela_reference(**tensors, sliding_window=window)) <= 1e-5
    at = 300  # a query whose window [201, 399] leaves out keys on both sides
    far = (torch.arange(length) - at).abs() > (length if window is None else window - 1)
    poisoned_key, poisoned_value = key.masked_fill(padded, 1e30), value.masked_fill(padded, 1e30)
    poisoned_key[:, :, far], poisoned_value[:, :, far] = -1e30, 1e30
    poisoned = rela(query, poisoned_key, poisoned_value, mask, sliding_window=window)
    assert torch.equal(poisoned[:, :, at], out[:, :, at])


def test_gradcheck_float64():
    tensors = _inputs((2, 1, 9, 7, 3, 3, torch.float64), padded=True, seed=1)
    inputs = [tensors[name].requires_grad_() for name in QKV]
    mask = tensors["key_padding_mask"]
    assert torch.autograd.gradcheck(lambda q, k, v: rela(q, k, v, mask, sliding_window=3), inputs)


def test_reads_strided_inputs_in_place():
    """(B, T, H, D) buffers seen as (B, H, T, D), as attention layers pass them, give what contiguous ones do."""
    query, key, value = (torch.randn(2, 70, 3, 8).transpose(1, 2) for _ in range(3))
    assert not query.is_contiguous() and rela_cpu._rows(query) is query
    expected = rela(query.contiguous(), key.contiguous(), value.contiguous(), sliding_window=9)
    assert torch.equal(rela(query, key, value, sliding_window=9), expected)


def test_no_grad_path_matches_autograd_path():
    tensors = _inputs((2, 2, 50, 50, 8, 7, torch.float32), padded=True)
    with torch.no_grad():
        plain = rela(**tensors, sliding_window=7)
    tracked = rela(**{**tensors, "query": tensors["query"].clone().requires_grad_()}, sliding_window=7)
    assert torch.equal(plain, tracked.detach())


def test_saves_no_pair_sized_tensor():
    """The backward keeps q, k, v and the mask: nothing with Tq * Tk entries."""
    sizes: list[int] = []
    query, key, value = (torch.randn(1, 2, 300, 4, requires_grad=True) for _ in range(3))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        rela(query, key, value)
    assert sizes and max(sizes) <= 2 * 300 * 4


def test_dispatch(monkeypatch):
    """CPU tensors take the kernel when it is available; without it, the torch implementation."""
    calls = []
    kernel = rela_cpu.rela_cpu
    monkeypatch.setattr(rela_cpu, "rela_cpu", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    q = torch.randn(1, 2, 10, 4)
    rela(q, q, q)
    assert len(calls) == 1
    monkeypatch.setattr(rela_cpu, "available", lambda: False)
    rela(q, q, q)
    assert len(calls) == 1


def test_without_the_library_the_torch_implementation_runs(monkeypatch):
    """Where _native.load gives None (no compiler: it warns once), available() is False and rela still gives
    the reference's values through its torch implementation."""
    monkeypatch.setattr(rela_cpu, "_kernels", lambda: None)
    monkeypatch.setattr(rela_cpu, "_forward", None)  # any use of the kernel would fail
    assert not rela_cpu.available()
    tensors = _inputs((2, 2, 30, 30, 8, 5, torch.float32), padded=True)
    assert relative_error(rela(**tensors, sliding_window=5), rela_reference(**tensors, sliding_window=5)) <= 1e-5


def test_the_library_is_loaded_by_the_shared_loader():
    """Built and loaded by _native.load (HF_SLICED_ATTN_NATIVE and the missing-compiler fallback apply),
    with both dtypes and both steps."""
    library = _native.load("rela_cpu")
    for name in ("forward_f32", "forward_f64", "backward_f32", "backward_f64"):
        assert hasattr(library, f"rela_{name}")


@pytest.mark.parametrize("window", [None, 5])
def test_compiles_whole(window):
    """torch.compile(fullgraph=True) keeps the kernel's custom ops whole: no graph break, the eager values
    and gradients."""
    tensors = _inputs((2, 3, 40, 40, 8, window, torch.float32), padded=True, seed=6)
    inputs = [tensors[name].requires_grad_() for name in QKV]
    mask = tensors["key_padding_mask"]

    def op(q, k, v):
        return rela(q, k, v, mask, sliding_window=window)

    compiled = torch.compile(op, fullgraph=True, backend="aot_eager")  # inductor's header fails in the full suite
    expected = op(*inputs)
    expected_grads = torch.autograd.grad(expected.sum(), inputs)
    out = compiled(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
