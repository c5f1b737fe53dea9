"""Tests for :mod:`hf_sliced_attn.ops.local_window` (a local softmax window combined with a global sliced
kernel, "gate" and "shared") against the float64 quadratic reference, values and gradients, and for the
opt-in returns it reads: ``windowed_softmax(return_lse=True)`` and ``sliced_relu(_bump)(return_denominator=True)``."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.ops import (
    WINDOW_COMBINES,
    local_window_attention,
    sliced_relu,
    sliced_relu_bump,
    sliced_relu_cpu,
    value_mean,
    windowed_softmax,
)
from hf_sliced_attn.ops._common import pair_mask
from hf_sliced_attn.ops.naive import local_window_reference, windowed_softmax_reference
from tests.helpers.comparisons import (
    assert_matches_reference,
    op_output_and_input_grads,
    relative_error,
)
from tests.helpers.memory import LargestTensor
from tests.helpers.op_inputs import key_padding, rows_with_gradient


def sliced_local_window(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, query_scalars: torch.Tensor,
    key_scalars: torch.Tensor, mix: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
    bandwidth: torch.Tensor | None = None, gain: torch.Tensor | None = None, mean_weight: torch.Tensor | None = None,
    *, window: int, combine: str, scaling: float | None = None,
) -> torch.Tensor:
    """The fast ops composed as a converted layer composes them: the sliced kernel (with its denominator),
    the output affine, then :func:`local_window_attention`; the signature of :func:`local_window_reference`."""
    if bandwidth is None:
        sliced, denominator = sliced_relu(query_scalars, key_scalars, value, key_padding_mask, return_denominator=True)
    else:
        sliced, denominator = sliced_relu_bump(query_scalars, key_scalars, value, bandwidth, key_padding_mask,
                                               return_denominator=True)
    if gain is not None:
        sliced = gain[:, None, None] * sliced + mean_weight[:, None, None] * value_mean(value, key_padding_mask)
    return local_window_attention(query, key, value, sliced, mix, key_padding_mask, window=window, combine=combine,
                                  denominator=denominator, scaling=scaling)


def inputs(
    batch: int, heads: int, slices: int | None, length: int, dim: int, *, combine: str, bump: bool, affine: bool,
    padded: bool, dtype: torch.dtype = torch.float32, seed: int = 0,
) -> dict[str, torch.Tensor | None]:
    """Random inputs of :func:`sliced_local_window`. The shared normaliser's gamma is drawn in [1/e, e]: for
    these q, k and scalars the window's softmax mass exp(lse_i) and D_i are of one order, so that both parts
    carry weight (alpha_i spreads around 1/2)."""
    gen = torch.Generator().manual_seed(seed)
    scalar_shape = (batch, heads, length) if slices is None else (batch, heads, slices, length)
    drawn = {
        "query": torch.randn(batch, heads, length, dim, generator=gen),
        "key": torch.randn(batch, heads, length, dim, generator=gen),
        "value": torch.randn(batch, heads, length, dim, generator=gen) + 0.5,
        "query_scalars": torch.randn(scalar_shape, generator=gen),
        "key_scalars": torch.randn(scalar_shape, generator=gen),
        "mix": (torch.sigmoid(torch.randn(heads, generator=gen)) if combine == "gate"
                else torch.exp(2 * torch.rand(heads, generator=gen) - 1)),
        "bandwidth": 0.5 + torch.rand(scalar_shape[1:-1], generator=gen) if bump else None,
        "gain": 1.0 + torch.rand(heads, generator=gen) if affine else None,
        "mean_weight": torch.randn(heads, generator=gen) if affine else None,
    }
    drawn = {name: None if x is None else x.to(dtype) for name, x in drawn.items()}
    drawn["key_padding_mask"] = (key_padding(batch, length, 0.3, generator=gen, real_first_row=True,
                                             padded_last_row=True) if padded else None)
    return drawn


def differentiable(tensors: dict[str, torch.Tensor | None]) -> tuple[str, ...]:
    """Every floating input given: q, k, v, the scalars, the learned mix and, when given, the bump's
    bandwidth and the output affine."""
    return tuple(name for name, x in tensors.items() if x is not None and x.is_floating_point())


# (B, H, M, T, D, w, affine): M None = (B, H, T) scalars.
CASES = [
    pytest.param(2, 3, None, 37, 8, 4, False, id="w4-T37"),
    pytest.param(2, 2, 2, 37, 5, 4, True, id="w4-T37-M2-affine"),
    pytest.param(2, 2, 2, 20, 4, 1, False, id="w1"),
    pytest.param(1, 2, None, 9, 4, 9, True, id="w-equals-T-affine"),
    pytest.param(2, 1, 3, 6, 3, 100, False, id="w-beyond-T-M3"),
    pytest.param(3, 2, None, 64, 6, 15, False, id="w15-T64"),
    pytest.param(2, 2, 2, 40, 32, 4, True, id="w4-D32-M2-affine"),  # the kernel's compiled-in head dims
    pytest.param(1, 3, None, 33, 64, 2, False, id="w2-D64"),
]


@pytest.mark.parametrize("batch,heads,slices,length,dim,window,affine", CASES)
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("kernel", ["relu", "bump"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_reference(batch, heads, slices, length, dim, window, affine, padded, kernel, combine, dtype,
                           window_implementation):
    tensors = inputs(batch, heads, slices, length, dim, combine=combine, bump=kernel == "bump", affine=affine,
                     padded=padded, dtype=dtype, seed=length * 7 + window)
    out = assert_matches_reference(
        sliced_local_window, local_window_reference, tensors, differentiable=differentiable(tensors),
        rtol=1e-5, grad_rtol=1e-4, window=window, combine=combine, scaling=0.6,
    )
    assert out.shape == (batch, heads, length, dim) and out.dtype == dtype
    if padded:
        assert (out[-1] == 0).all()  # a sequence with no real key: no window key, D = 0


@pytest.mark.parametrize("length,dim", [(37, 8), (40, 32)], ids=["T37", "D32"])
@pytest.mark.parametrize("rows", ["first", "scattered"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_tokens_without_gradient(length, dim, rows, combine, window_implementation):
    """A loss that reads some tokens only (a pooler's [CLS]): the reference's gradients in float64, and exact zeros
    in dq on the tokens without a gradient, in float32 too (the kernel skips them)."""
    selected = rows_with_gradient(length, rows)
    options = {"window": 4, "combine": combine, "scaling": 0.6, "grad_rows": selected}
    tensors = inputs(2, 2, 2, length, dim, combine=combine, bump=False, affine=True, padded=True,
                     dtype=torch.float64, seed=12)
    assert_matches_reference(sliced_local_window, local_window_reference, tensors,
                             differentiable=differentiable(tensors), rtol=1e-10, grad_rtol=1e-10, **options)
    for dtype in (torch.float32, torch.float64):
        _, grads = op_output_and_input_grads(sliced_local_window, tensors, differentiable=differentiable(tensors),
                                             dtype=dtype, **options)
        assert (grads["query"][:, :, ~selected] == 0).all()


@pytest.mark.parametrize("kernel", ["relu", "bump"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_bfloat16_is_computed_in_float32(kernel, combine, window_implementation):
    tensors = inputs(2, 2, 2, 30, 8, combine=combine, bump=kernel == "bump", affine=True, padded=True,
                     dtype=torch.bfloat16, seed=5)
    out = assert_matches_reference(
        sliced_local_window, local_window_reference, tensors, differentiable=differentiable(tensors),
        rtol=2e-2, grad_rtol=5e-2, window=3, combine=combine, scaling=0.6,
    )
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_both_parts_carry_weight(combine):
    """The test inputs mix the two parts: the output is neither the window's softmax nor the sliced term."""
    tensors = inputs(2, 3, None, 37, 8, combine=combine, bump=False, affine=False, padded=False, dtype=torch.float64)
    sliced = sliced_relu(tensors["query_scalars"], tensors["key_scalars"], tensors["value"])
    local = windowed_softmax(tensors["query"], tensors["key"], tensors["value"], scaling=0.6, sliding_window=5)
    out = sliced_local_window(**tensors, window=4, combine=combine, scaling=0.6)
    for part in (sliced, local):
        assert relative_error(out, part) > 0.05


def test_default_scaling_is_inverse_sqrt_dim():
    tensors = inputs(1, 2, None, 20, 16, combine="gate", bump=False, affine=False, padded=False)
    expected = local_window_reference(**{k: None if v is None else v.double() for k, v in tensors.items()},
                                      window=3, combine="gate", scaling=16 ** -0.5)
    assert relative_error(sliced_local_window(**tensors, window=3, combine="gate"), expected) <= 1e-5


@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("window", [1, 4, 40])
def test_windowed_softmax_returns_its_log_normaliser(window, padded):
    """``return_lse``: the same output as without it, and lse_i = log sum_j exp(scaling q_i . k_j) over the
    window's valid keys (-inf without one), values and gradients against float64."""
    gen = torch.Generator().manual_seed(window)
    q, k, v = (torch.randn(2, 3, 23, 5, generator=gen) for _ in range(3))
    mask = key_padding(2, 23, 0.3, generator=gen, padded_last_row=True) if padded else None

    def log_normaliser(query, key, value, key_padding_mask):
        scores = query.double() @ key.double().transpose(-1, -2) * 0.7
        allowed = pair_mask(2, 23, 23, key_padding_mask, window, query.device)
        return torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)

    def softmax_and_lse(query, key, value, key_padding_mask):
        out, lse = windowed_softmax(query, key, value, key_padding_mask, scaling=0.7, sliding_window=window,
                                    return_lse=True)
        return torch.cat([out, torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1).to(out.dtype)], -1)

    def reference(query, key, value, key_padding_mask):
        out = windowed_softmax_reference(query, key, value, key_padding_mask, scaling=0.7, sliding_window=window)
        lse = log_normaliser(query, key, value, key_padding_mask)
        return torch.cat([out, torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1)], -1)

    tensors = dict(query=q, key=k, value=v, key_padding_mask=mask)
    assert_matches_reference(softmax_and_lse, reference, tensors, differentiable=("query", "key", "value"))
    out, lse = windowed_softmax(q, k, v, mask, scaling=0.7, sliding_window=window, return_lse=True)
    torch.testing.assert_close(out, windowed_softmax(q, k, v, mask, scaling=0.7, sliding_window=window))
    assert lse.shape == (2, 3, 23) and lse.dtype == torch.float32
    if padded:
        assert (lse[-1] == float("-inf")).all() and (out[-1] == 0).all()


@pytest.mark.parametrize("implementation", ["cpu_kernel", "torch"])
@pytest.mark.parametrize("slices", [None, 3])
def test_sliced_relu_returns_its_denominator(slices, implementation, monkeypatch):
    """``return_denominator``: the same output as without it, and D_i = sum_l |s_i - t_l| over the valid
    keys in the scalars' shape, differentiable in them; on both CPU implementations."""
    if implementation == "torch":
        monkeypatch.setattr(sliced_relu_cpu, "available", lambda: False)
    elif not sliced_relu_cpu.available():
        pytest.skip("the C++ CPU kernel is not built here")
    gen = torch.Generator().manual_seed(1)
    shape = (2, 3, 19) if slices is None else (2, 3, slices, 19)
    s, t = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    v = torch.randn(2, 3, 19, 4, generator=gen)
    mask = key_padding(2, 19, 0.3, generator=gen, padded_last_row=True)

    def denominator(query_scalars, key_scalars, value, key_padding_mask):
        return sliced_relu(query_scalars, key_scalars, value, key_padding_mask, return_denominator=True)[1]

    def reference(query_scalars, key_scalars, value, key_padding_mask):
        keys = key_padding_mask[:, None, None, :] if query_scalars.dim() == 3 else key_padding_mask[:, None, None, None]
        return ((query_scalars[..., :, None] - key_scalars[..., None, :]).abs() * keys).sum(-1)

    tensors = dict(query_scalars=s, key_scalars=t, value=v, key_padding_mask=mask)
    den = assert_matches_reference(denominator, reference, tensors, differentiable=("query_scalars", "key_scalars"))
    assert den.shape == shape and den.dtype == torch.float32 and (den[-1] == 0).all()
    out, _ = sliced_relu(s, t, v, mask, return_denominator=True)
    torch.testing.assert_close(out, sliced_relu(s, t, v, mask), rtol=0, atol=0)


def test_bump_denominator_is_the_number_of_valid_keys():
    gen = torch.Generator().manual_seed(2)
    s, t = torch.randn(2, 3, 2, 11, generator=gen), torch.randn(2, 3, 2, 11, generator=gen)
    v, b = torch.randn(2, 3, 11, 4, generator=gen), 0.5 + torch.rand(3, 2, generator=gen)
    mask = key_padding(2, 11, 0.3, generator=gen)
    out, den = sliced_relu_bump(s, t, v, b, mask, return_denominator=True)
    torch.testing.assert_close(out, sliced_relu_bump(s, t, v, b, mask), rtol=0, atol=0)
    assert den.shape == s.shape and (den == mask.sum(-1).float()[:, None, None, None]).all()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"window": 0}, r"window must be an int >= 1"),
        ({"combine": "sum"}, r"combine='sum' is not valid: use one of \['gate', 'shared'\]"),
        ({"mix": torch.ones(2)}, r"mix must have shape \(H,\) = \(3,\)"),
        ({"combine": "shared", "denominator": None}, r"combine='shared' needs the sliced kernel's denominator"),
        ({"combine": "shared", "denominator": torch.ones(2, 3, 5)}, r"denominator must have shape"),
        ({"sliced": torch.ones(2, 3, 9, 5)}, r"sliced must have value's shape"),
    ],
)
def test_bad_arguments_are_refused(change, message):
    q = torch.randn(2, 3, 9, 4)
    arguments = dict(query=q, key=q, value=q, sliced=q, mix=torch.ones(3), window=2, combine="gate",
                     denominator=torch.ones(2, 3, 9))
    with pytest.raises(ValueError, match=message):
        local_window_attention(**{**arguments, **change})


@pytest.mark.parametrize("kernel", ["relu", "bump"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_long_sequence_makes_no_pairwise_tensor(combine, kernel):
    """T = 8192, forward and backward: every tensor made is at most the window's (T, 3w + 1) band or the
    sorted kernels' (4 M T, D) scan buffers per head, far below T^2, and the output is finite."""
    batch, heads, slices, length, dim, window = 1, 2, 2, 8192, 8, 16
    tensors = inputs(batch, heads, slices, length, dim, combine=combine, bump=kernel == "bump", affine=True,
                     padded=True)
    recorder = LargestTensor()
    with recorder:
        out, grads = op_output_and_input_grads(sliced_local_window, tensors, differentiable=differentiable(tensors),
                                               window=window, combine=combine)
    band = batch * heads * (length + window + 1) * (3 * window + 1)  # the softmax's blocks, T padded to whole blocks
    scans = 2 * (batch * heads * slices * 4 * length + 1) * dim  # the sorted kernels' prefix sums (4 ranks per query)
    assert 0 < recorder.largest <= max(band, scans) < length**2 // 20
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("kernel", ["relu", "bump"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_compiles_as_one_graph_forward_and_backward(combine, kernel):
    """torch.compile(fullgraph=True) of the composed ops (padding always masked under compile): eager's
    output and gradients."""
    tensors = inputs(2, 3, 2, 40, 8, combine=combine, bump=kernel == "bump", affine=True, padded=True, seed=3)
    torch._dynamo.reset()
    compiled = torch.compile(sliced_local_window, fullgraph=True, backend="aot_eager")
    names = differentiable(tensors)
    out, grads = op_output_and_input_grads(compiled, tensors, differentiable=names, window=4, combine=combine)
    expected, expected_grads = op_output_and_input_grads(sliced_local_window, tensors, differentiable=names,
                                                         window=4, combine=combine)
    assert relative_error(out, expected) <= 1e-6
    for name in names:
        assert relative_error(grads[name], expected_grads[name]) <= 1e-5, name
    torch._dynamo.reset()
