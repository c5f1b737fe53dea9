"""ReLA's torch implementation (hf_sliced_attn.ops.rela in query blocks: what other devices run, and
CPUs without a compiler) against the float64 quadratic reference. The CPU kernel is turned off here;
tests/ops/test_rela_cpu.py checks it, against this implementation too."""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch

from hf_sliced_attn.ops import rela_cpu
from hf_sliced_attn.ops.naive import rela_reference
from hf_sliced_attn.ops.rela import rela
from tests.helpers.comparisons import assert_matches_reference, op_output_and_input_grads, relative_error

# (B, H, Tq, Tk, D)
SHAPES = [
    (2, 3, 64, 64, 32),
    (2, 2, 100, 37, 16),
    (1, 2, 37, 100, 16),
    (2, 2, 200, 200, 8),
    (1, 2, 66, 66, 8),  # one longer than the window 65: only the corner pairs fall outside
    (1, 1, 1, 1, 8),
    (2, 1, 1, 50, 4),
    (2, 1, 50, 1, 4),
]
BLOCK_SIZES = [16, 512]  # 16 < T: several blocks, T not a multiple of 16; 512: one block
WINDOWS = [None, 1, 3, 65]
QKV = ("query", "key", "value")  # the differentiable inputs


@pytest.fixture(autouse=True)
def torch_implementation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here runs the torch implementation: the kernel turned off, any use of it failing."""
    monkeypatch.setattr(rela_cpu, "available", lambda: False)
    monkeypatch.setattr(rela_cpu, "rela_cpu", None)


def make_inputs(
    batch: int, heads: int, q_len: int, k_len: int, dim: int, padded: bool,
    dtype: torch.dtype = torch.float32, seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    query, key, value = (
        torch.randn(batch, heads, t, dim, generator=gen).to(dtype) for t in (q_len, k_len, k_len)
    )
    mask = None
    if padded:
        mask = torch.rand(batch, k_len, generator=gen) > 0.3
        mask[0, 0] = True  # keep some real key so the reference is not all 0
        if batch > 1:
            mask[-1] = False  # a fully padded row
    return query, key, value, mask


def qkv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> dict[str, torch.Tensor | None]:
    """The keyword arguments of rela and rela_reference."""
    return {"query": query, "key": key, "value": value, "key_padding_mask": mask}


def rela_in_float32(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: torch.Tensor | None,
    **options,
) -> torch.Tensor:
    """rela on float32 copies of the inputs, its output rounded once to query's dtype."""
    return rela(query.float(), key.float(), value.float(), key_padding_mask, **options).to(query.dtype)


@pytest.mark.parametrize(
    "shape,block_size,window,padded",
    [
        pytest.param(shape, block, window, padded, id=f"{'x'.join(map(str, shape))}-bs{block}-w{window}-pad{padded:d}")
        for shape, block, window, padded in itertools.product(SHAPES, BLOCK_SIZES, WINDOWS, [False, True])
    ],
)
def test_matches_reference(
    shape: tuple[int, ...], block_size: int, window: int | None, padded: bool
) -> None:
    query, key, value, mask = make_inputs(*shape, padded=padded)
    out = assert_matches_reference(
        partial(rela, block_size=block_size), rela_reference, qkv(query, key, value, mask),
        differentiable=QKV, rtol=1e-5, grad_rtol=1e-4, sliding_window=window,
    )
    assert out.shape == query.shape and out.dtype == torch.float32


@pytest.mark.parametrize("block_size", [16, 512])
def test_explicit_scaling_and_noncontiguous(block_size: int) -> None:
    # (B, T, H, D) storage viewed as (B, H, T, D), as attention layers produce it.
    query, key, value = (torch.randn(2, 90, 3, 16).transpose(1, 2) for _ in range(3))
    assert not query.is_contiguous()
    assert_matches_reference(
        partial(rela, block_size=block_size), rela_reference, qkv(query, key, value, None),
        differentiable=QKV, rtol=1e-5, grad_rtol=1e-4, scaling=0.37, sliding_window=20,
    )


@pytest.mark.parametrize("block_size", [3, 64])
@pytest.mark.parametrize("window", [None, 3])
def test_gradcheck_float64(block_size: int, window: int | None) -> None:
    query, key, value, mask = make_inputs(2, 1, 8, 7, 3, padded=True, dtype=torch.float64, seed=1)
    inputs = [t.requires_grad_() for t in (query, key, value)]
    assert torch.autograd.gradcheck(
        lambda q, k, v: rela(q, k, v, mask, sliding_window=window, block_size=block_size), inputs
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 512])
def test_half_precision(dtype: torch.dtype, block_size: int) -> None:
    query, key, value, mask = make_inputs(2, 2, 70, 60, 16, padded=True, dtype=dtype)
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    out = assert_matches_reference(
        partial(rela, block_size=block_size), rela_reference, qkv(query, key, value, mask),
        differentiable=QKV, rtol=tol, grad_rtol=tol, sliding_window=9,
    )
    assert out.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 512])
def test_half_precision_accumulates_in_float32(dtype: torch.dtype, block_size: int) -> None:
    """Half inputs give the float32 computation on the upcast inputs, rounded once at the end."""
    query, key, value, mask = make_inputs(1, 2, 80, 80, 16, padded=True, dtype=dtype, seed=3)
    tensors = qkv(query, key, value, mask)
    out, grads = op_output_and_input_grads(rela, tensors, differentiable=QKV, sliding_window=33, block_size=block_size)
    out32, grads32 = op_output_and_input_grads(
        rela_in_float32, tensors, differentiable=QKV, sliding_window=33, block_size=block_size
    )
    assert out.dtype == dtype and all(grad.dtype == dtype for grad in grads.values())
    assert torch.equal(out, out32)
    for name in QKV:
        assert torch.equal(grads[name], grads32[name]), name


def test_float16_scores_beyond_float16_range() -> None:
    """Scores above 65504 are fine in float16 as long as the output fits."""
    query, key, value, _ = make_inputs(1, 1, 20, 20, 16, padded=False, dtype=torch.float32)
    query, key, value = (query.abs() * 200).half(), (key.abs() * 200).half(), (value * 1e-4).half()
    scores = query.double() @ key.double().transpose(-1, -2) * 16**-0.5
    assert scores.max() > 2 * torch.finfo(torch.float16).max  # the premise of this test
    out = rela(query, key, value)
    ref = rela_reference(query, key, value)
    assert torch.isfinite(out).all() and relative_error(out, ref) <= 1e-2


@pytest.mark.parametrize("block_size", [8, 512])
def test_masked_pairs_are_exactly_zero(block_size: int) -> None:
    query, key, value, mask = make_inputs(3, 2, 40, 40, 8, padded=True)
    window = 3
    out, grads = op_output_and_input_grads(
        rela, qkv(query, key, value, mask), differentiable=QKV, sliding_window=window, block_size=block_size
    )
    grad_q, grad_k, grad_v = (grads[name] for name in QKV)
    assert torch.all(out[-1] == 0) and torch.all(grad_q[-1] == 0)  # fully padded row
    padded = ~mask[:, None, :, None].expand_as(key)
    assert torch.all(grad_k[padded] == 0) and torch.all(grad_v[padded] == 0)
    # Huge values on padded keys, and on every key outside query 20's window, change nothing there.
    far = (torch.arange(40) - 20).abs() > window - 1
    poisoned_key = key.masked_fill(padded, 1e30)
    poisoned_value = value.masked_fill(padded, 1e30)
    poisoned_value[:, :, far] = 1e30
    poisoned_key[:, :, far] = -1e30
    poisoned = rela(query, poisoned_key, poisoned_value, mask, sliding_window=window, block_size=block_size)
    assert torch.equal(poisoned[:, :, 20], out[:, :, 20])


def test_no_grad_path_matches_autograd_path() -> None:
    query, key, value, mask = make_inputs(2, 2, 50, 50, 8, padded=True)
    with torch.no_grad():
        plain = rela(query, key, value, mask, sliding_window=7, block_size=16)
    tracked = rela(query.requires_grad_(), key, value, mask, sliding_window=7, block_size=16)
    assert torch.equal(plain, tracked.detach())


@pytest.mark.parametrize("block_size,window", [(32, None), (32, 5), (512, None)])
def test_saved_memory_is_linear_in_length(block_size: int, window: int | None) -> None:
    """Nothing the backward keeps holds more than block_size * Tk entries per (batch, head)."""
    batch, heads, length, dim = 1, 2, 300, 4
    query, key, value, _ = make_inputs(batch, heads, length, length, dim, padded=False)
    sizes: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        rela(query.requires_grad_(), key, value, sliding_window=window, block_size=block_size)
    assert sizes and max(sizes) <= batch * heads * max(min(block_size, length) * length, length * dim)
    if block_size < length:
        assert max(sizes) <= batch * heads * length * dim


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,mask_shape,match",
    [
        ((2, 3, 5), (2, 3, 5, 4), (2, 3, 5, 4), None, r"query must have shape \(B, H, Tq, D\)"),
        ((2, 3, 5, 4), (2, 3, 5, 8), (2, 3, 5, 4), None, r"key must have shape \(B, H, Tk, D\) = \(2, 3, Tk, 4\)"),
        ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 5, 4), None, r"value must have shape \(B, H, Tk, D\) = \(2, 3, 6, 4\)"),
        ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4), (2, 5), r"key_padding_mask must have shape \(B, Tk\) = \(2, 6\)"),
    ],
)
def test_shape_errors(
    q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
    mask_shape: tuple[int, ...] | None, match: str,
) -> None:
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=match):
        rela(torch.randn(q_shape), torch.randn(k_shape), torch.randn(v_shape), mask)


def test_argument_errors() -> None:
    query = torch.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="sliding_window"):
        rela(query, query, query, sliding_window=0)
    with pytest.raises(ValueError, match="block_size"):
        rela(query, query, query, block_size=0)
    with pytest.raises(ValueError, match="dtype"):
        rela(query, query.double(), query)
