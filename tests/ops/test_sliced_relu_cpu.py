"""The C++ CPU kernel of sliced ReLU attention: its custom ops, and how it is built and loaded.

Its values and gradients against the float64 reference are checked in test_sliced_relu.py
(every test there runs on both CPU implementations). The tests that need the kernel built are
marked ``requires_compiler``: skipped, with the reason, where no C++ compiler is found."""

from __future__ import annotations

import ctypes
import warnings

import pytest
import torch

from hf_sliced_attn.ops import _native, sliced_relu_cpu
from hf_sliced_attn.ops.naive import sliced_relu_reference
from hf_sliced_attn.ops.sliced_relu import sliced_relu
from tests.helpers.comparisons import relative_error
from tests.helpers.native import requires_compiler
from tests.helpers.op_inputs import attention_inputs

TINY_KERNEL = 'extern "C" int answer() { return 42; }\n'


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """_native.load with an empty cache of its own, and its memo cleared before and after."""
    monkeypatch.setenv("HF_SLICED_ATTN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_native, "_SOURCES", tmp_path)
    _native.load.cache_clear()
    yield tmp_path
    _native.load.cache_clear()


@requires_compiler
def test_the_kernel_builds_here():
    """CI has a C++ compiler: the fast path must be the one that runs."""
    assert sliced_relu_cpu.available()


@requires_compiler
def test_custom_op_registrations_pass_opcheck():
    """Schema, fake (meta) implementation, autograd registration and dispatch, as torch checks them."""
    s, t, v, mask = attention_inputs(2, 3, 2, 40, 50, 8, padded_fraction=0.2)
    args = (s.double().requires_grad_(), t.double().requires_grad_(), v.requires_grad_(), mask)
    torch.library.opcheck(torch.ops.hf_sliced_attn.sliced_relu_cpu.default, args)


def test_results_do_not_depend_on_the_thread_count():
    """Large enough that every (batch, head) group is one thread's share (the kernel runs calls
    under 2^16 D-wide element visits per thread on one thread)."""
    generator = torch.Generator().manual_seed(2)
    s, t = torch.randn(4, 8, 2, 512, generator=generator), torch.randn(4, 8, 2, 512, generator=generator)
    v, mask = torch.randn(4, 8, 512, 32, generator=generator), torch.rand(4, 512, generator=generator) > 0.1
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = sliced_relu(s, t, v, mask)
        torch.set_num_threads(max(2, threads))
        many = sliced_relu(s, t, v, mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, many)


@requires_compiler
def test_a_non_finite_scalar_gives_nan_in_its_group_only():
    """std::sort-style sorting needs a total order: the kernel checks, and the (batch, head) group
    with the NaN (or inf) gets NaN rather than undefined behaviour; the others are untouched."""
    s, t, v, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=3, padded_fraction=0.2)
    s[0, 1, 0, 5] = float("nan")
    t[1, 2, 1, 7] = float("inf")
    leaves = [x.requires_grad_() for x in (s, t, v)]
    out = sliced_relu(*leaves, mask)
    grads = torch.autograd.grad(out.sum(), leaves)
    expected = sliced_relu_reference(s.double(), t.double(), v.double(), mask)
    keep = torch.ones(2, 3, dtype=torch.bool)
    keep[0, 1] = keep[1, 2] = False
    for x in (out, *grads):
        assert x[~keep].isnan().all() and not x[keep].isnan().any()
    assert relative_error(out[keep], expected[keep]) <= 1e-5


def test_non_contiguous_inputs():
    """Attention layers pass transposed views; the op makes them contiguous itself."""
    s, t, v, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=4, padded_fraction=0.2)
    v_view = v.transpose(2, 3).contiguous().transpose(2, 3)
    s_view = s.transpose(2, 3).contiguous().transpose(2, 3)
    assert not v_view.is_contiguous() and not s_view.is_contiguous()
    assert torch.equal(sliced_relu(s_view, t, v_view, mask), sliced_relu(s, t, v, mask))


@requires_compiler
@pytest.mark.parametrize("length", [40, 200, 1000])
@pytest.mark.parametrize("layout", ["normal", "extreme", "ties"])
def test_the_saved_orders_sort_the_scalars(length, layout):
    """The orders the forward saves are the stable ascending orders of the valid keys (then the padded keys) and of
    the queries, whichever sort ran (insertion up to 64 scalars, buckets up to 512 unless they cluster, radix passes):
    for normal scalars, for float64 scalars whose range (+-1e308) overflows, and for ties with signed zeros; and the
    valid keys' mean value it saves for the backward."""
    generator = torch.Generator().manual_seed(length)
    s = torch.randn(2, 3, 2, length, dtype=torch.float64, generator=generator)
    t = torch.randn(2, 3, 2, length, dtype=torch.float64, generator=generator)
    if layout == "extreme":  # one scalar at each end: the range overflows, the sums (the centre) do not
        s[..., 3], s[..., 5], t[..., 2], t[..., 6] = 1e308, -1e308, -1e308, 1e308
    if layout == "ties":
        choices = torch.tensor([0.0, -0.0, 1.0], dtype=torch.float64)
        s, t = (choices[torch.randint(0, 3, x.shape, generator=generator)] for x in (s, t))
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, length // 2:] = False
    v = torch.randn(2, 3, length, 4, dtype=torch.float64, generator=generator)
    _, _, key_order, query_order, value_mean = sliced_relu_cpu._forward(s, t, v, valid)
    expected_mean = (v * valid[:, None, :, None]).sum(2) / valid.sum(1)[:, None, None]
    torch.testing.assert_close(value_mean, expected_mean)  # the backward's vbar, saved by the forward

    def stable_order(x: torch.Tensor) -> torch.Tensor:  # ascending, -0 before +0, ties in index order
        return torch.tensor(sorted(range(len(x)), key=lambda i: (x[i].item(), str(x[i].item())[0] != "-")))

    for b in range(2):
        keys = valid[b].nonzero().squeeze(1)
        for h in range(3):
            for m in range(2):
                expected_keys = keys[stable_order(t[b, h, m, keys])]
                n = len(keys)
                assert torch.equal(key_order[b, h, m, :n].long(), expected_keys)
                assert torch.equal(key_order[b, h, m, n:].long(), (~valid[b]).nonzero().squeeze(1))
                assert torch.equal(query_order[b, h, m].long(), stable_order(s[b, h, m]))


@requires_compiler
def test_token_major_layout_is_read_and_written_in_place():
    """Attention layers hold q, k, v as (B, T, H, D) buffers seen as (B, H, T, D): the kernel reads
    v and the output gradient in that layout, writes the output and dL/dv in it, and gives the
    results of contiguous inputs."""
    s, t, v, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=6, padded_fraction=0.2)
    token_major = v.transpose(1, 2).contiguous().requires_grad_()
    v_view = token_major.transpose(1, 2)
    out = sliced_relu(s, t, v_view, mask)
    assert out.transpose(1, 2).is_contiguous()  # (B, T, H, D) memory: reshaping to (B, T, H*D) is free
    grad_output = torch.randn(out.transpose(1, 2).shape).transpose(1, 2)
    (dv,) = torch.autograd.grad(out, token_major, grad_output)
    v_plain = v.clone().requires_grad_()
    expected = sliced_relu(s, t, v_plain, mask)
    (expected_dv,) = torch.autograd.grad(expected, v_plain, grad_output.contiguous())
    assert torch.equal(out, expected)
    assert torch.equal(dv.transpose(1, 2), expected_dv)


@requires_compiler
def test_builds_once_into_the_cache(fresh_loader):
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL)
    library = _native.load("tiny")
    assert library.answer() == 42
    built = list((fresh_loader / "cache" / "kernels").glob("tiny-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    _native.load.cache_clear()
    assert _native.load("tiny").answer() == 42
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt


@requires_compiler
def test_a_source_change_builds_a_new_library(fresh_loader):
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL)
    _native.load("tiny")
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL.replace("42", "43"))
    _native.load.cache_clear()
    assert _native.load("tiny").answer() == 43


def test_no_compiler_warns_with_the_fix(fresh_loader, monkeypatch):
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL)
    monkeypatch.setattr(_native, "_compiler", lambda: None)
    with pytest.warns(_native.NativeKernelWarning, match=r"no C\+\+ compiler was found \(install g\+\+, or set CXX\)"):
        assert _native.load("tiny") is None


@requires_compiler
def test_a_failing_build_warns_with_the_compiler_output(fresh_loader):
    (fresh_loader / "broken.cpp").write_text("this is not C++\n")
    with pytest.warns(_native.NativeKernelWarning, match=r"failed on broken\.cpp"):
        assert _native.load("broken") is None


@requires_compiler
def test_an_unwritable_cache_warns_with_the_fix(fresh_loader, monkeypatch):
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL)
    (fresh_loader / "file").write_text("")
    monkeypatch.setenv("HF_SLICED_ATTN_CACHE", str(fresh_loader / "file"))  # a file, not a folder
    with pytest.warns(_native.NativeKernelWarning, match="set HF_SLICED_ATTN_CACHE to a writable folder"):
        assert _native.load("tiny") is None


def test_turned_off_by_the_environment_without_a_warning(fresh_loader, monkeypatch):
    (fresh_loader / "tiny.cpp").write_text(TINY_KERNEL)
    monkeypatch.setenv("HF_SLICED_ATTN_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.load("tiny") is None


def test_without_the_kernel_the_op_runs_the_torch_implementation(monkeypatch):
    """Same function, other implementation: the op's output still matches the reference."""
    monkeypatch.setattr(sliced_relu_cpu, "available", lambda: False)
    monkeypatch.setattr(sliced_relu_cpu, "_forward", None)  # any use of the kernel would fail
    s, t, v, mask = attention_inputs(2, 3, 2, 40, 50, 8, seed=5, padded_fraction=0.2)
    expected = sliced_relu_reference(s.double(), t.double(), v.double(), mask)
    assert relative_error(sliced_relu(s, t, v, mask), expected) <= 1e-5


@requires_compiler
def test_the_library_exports_both_dtypes():
    library = _native.load("sliced_relu_cpu")
    assert isinstance(library, ctypes.CDLL)
    for name in ("forward_f32", "forward_f64", "backward_f32", "backward_f64"):
        assert hasattr(library, f"sliced_relu_{name}")
