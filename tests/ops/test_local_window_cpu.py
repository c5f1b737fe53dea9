"""The fused C++ kernel of :mod:`hf_sliced_attn.ops.local_window_cpu` beyond the reference tests of
``test_local_window.py`` and ``test_rela_local_window.py`` (which run it and the composed ops against the float64
reference): which windows take it, the parameters' gradients independent of the thread count, inputs in the
layout attention layers pass, and its buffer reused across calls of different sizes."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import local_window_attention, local_window_cpu, rela_local_window_attention
from tests.helpers.comparisons import op_output_and_input_grads, relative_error
from tests.helpers.native import requires_compiler
from tests.ops.test_rela_local_window import DIFFERENTIABLE
from tests.ops.test_rela_local_window import inputs as rela_inputs

pytestmark = requires_compiler


def rela_grads(tensors: dict, window: int, combine: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return op_output_and_input_grads(rela_local_window_attention, tensors, differentiable=DIFFERENTIABLE,
                                     window=window, combine=combine)


@pytest.mark.parametrize(
    "op,limit", [("sliced", "MAX_WINDOW"), ("rela", "MAX_WINDOW_NORMED")], ids=["sliced", "rela"])
def test_windows_up_to_the_limit_take_the_kernel(op, limit, monkeypatch):
    """CPU windows up to the limit run the kernel, wider ones the composed ops (and never the kernel)."""
    widest = getattr(local_window_cpu, limit)
    calls = []
    name = "_forward" if op == "sliced" else "_rela_forward"
    kernel = getattr(local_window_cpu, name)
    monkeypatch.setattr(local_window_cpu, name, lambda *a: calls.append(1) or kernel(*a))
    tensors = rela_inputs(1, 2, 3 * widest, 8, combine="shared", padded=True, seed=1)
    q, k, v, mix = tensors["query"], tensors["key"], tensors["value"], tensors["mix"]
    for window, expected in ((widest, [1]), (widest + 1, [])):
        calls.clear()
        if op == "sliced":
            local_window_attention(q, k, v, v, mix, tensors["key_padding_mask"], window=window, combine="shared",
                                   denominator=torch.ones(q.shape[:3]))
        else:
            rela_local_window_attention(**tensors, window=window, combine="shared")
        assert calls == expected, window


@pytest.mark.parametrize("combine", ["gate", "shared"])
def test_gradients_do_not_depend_on_the_thread_count(combine):
    """The parameters' gradients are summed per fixed chunk of tokens, then over the chunks in order: bitwise
    the same output and gradients on 1 thread and on 2."""
    tensors = rela_inputs(3, 4, 70, 32, combine=combine, padded=True, seed=7)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rela_grads(tensors, 4, combine)
        torch.set_num_threads(2)
        two = rela_grads(tensors, 4, combine)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0])
    for name in DIFFERENTIABLE:
        assert torch.equal(one[1][name], two[1][name]), name


def test_token_major_inputs_are_read_in_place():
    """q, k, v as attention layers pass them, (B, H, T, D) views of (B, T, H, D) memory: the results of their
    contiguous copies."""
    tensors = rela_inputs(2, 3, 30, 32, combine="shared", padded=True, seed=2)
    token_major = dict(tensors)
    for name in ("query", "key", "value"):
        token_major[name] = tensors[name].transpose(1, 2).contiguous().transpose(1, 2)
        assert not token_major[name].is_contiguous()
    out, grads = rela_grads(token_major, 4, "shared")
    expected, expected_grads = rela_grads(tensors, 4, "shared")
    assert relative_error(out, expected) <= 1e-6
    for name in DIFFERENTIABLE:
        assert relative_error(grads[name], expected_grads[name]) <= 1e-5, name


def test_a_smaller_call_after_a_larger_one(monkeypatch):
    """The backward keeps its coefficient buffer between calls: a small call after a large one (the buffer
    larger than it needs) gives the composed ops' gradients."""
    large = rela_inputs(2, 4, 200, 16, combine="shared", padded=True, seed=3)
    small = rela_inputs(1, 2, 9, 16, combine="shared", padded=False, seed=4)
    rela_grads(large, 16, "shared")
    out, grads = rela_grads(small, 2, "shared")
    monkeypatch.setattr(local_window_cpu, "available", lambda: False)
    expected, expected_grads = rela_grads(small, 2, "shared")
    assert relative_error(out, expected) <= 1e-5
    for name in DIFFERENTIABLE:
        assert relative_error(grads[name], expected_grads[name]) <= 1e-4, name
