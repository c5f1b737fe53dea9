"""torch.compile(model, fullgraph=True) of converted encoders: one graph, eager's outputs and gradients.

``fullgraph=True`` turns any graph break (a tensor read as a Python value, a data-dependent
branch or shape) into an error, so every case below fails on one, forward or backward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from hf_sliced_attn.ops import sliced_relu, sliced_relu_bump

from tests.helpers.comparisons import relative_error, scaled_error
from tests.helpers.models import VOCAB, tiny_encoder
from tests.helpers.native import requires_compiler_for_inductor

MECHANISM_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sliced_relu": ("sliced_relu", {}),
    # The options conversions build sliced ReLU layers with.
    "sliced_relu-conversion": ("sliced_relu", {"projection": "mlp", "affine_output": True, "num_slices": 4}),
    "rela": ("rela", {}),
}
# Architecture -> (tiny_config overrides, mechanism options). Every BERT layer compiles to the
# same kernels, so one is enough. ModernBERT keeps its three layers and converts the global
# layer 0 and the local layer 1, so that the local layer 2 runs the plugin's windowed softmax:
# every attention path of the plugin is captured.
ARCHITECTURES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "bert": ({"num_hidden_layers": 1}, {}),
    "modernbert": ({}, {"layers": [0, 1]}),
}
# Inductor's C++ compile takes about a minute per sliced ReLU model on two busy cores, so it
# runs on two cases, one per architecture: sliced ReLU with the conversion options on BERT (the
# sorted kernel with its hand-written backward, the MLP projection, the output affine and value
# mean) and ReLA on ModernBERT (global and windowed, and the windowed softmax of layer 2). The
# other cases use backend "aot_eager": the same capture as inductor's (dynamo's graph, then AOT
# autograd's joint forward and backward graph), so a graph break fails them just the same, run
# with eager kernels.
INDUCTOR_CASES = {("bert", "sliced_relu-conversion"), ("modernbert", "rela")}
# The second sequence has 8 real tokens. 32 tokens in all, the hidden size: from there BERT's sliced ReLU
# layers fold their MLP projection into the query and key layers, so the BERT cases compile that path.
BATCH, LENGTH, PADDED_LENGTH = 2, 16, 8
OUTPUT_RTOL = 1e-5
# Inductor fuses and reorders float32 arithmetic, so the compiled gradients differ from eager's
# by float32 rounding, accumulated over the backward (observed up to ~2e-6 of the largest
# gradient of the parameter's module). Each gradient is compared on that scale, a Linear's
# weight and bias together: some gradients are exactly 0 in exact arithmetic and hold only
# rounding noise in both runs (the value bias of sliced ReLU, whose kernel acts on centred
# values; the output bias of its MLP projection, which shifts s and t together: observed up to
# ~1e-5 of their module's scale).
GRAD_RTOL = 1e-4


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Every case compiles from scratch and leaves no compiled code behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def padded_batch() -> dict[str, torch.Tensor]:
    """input_ids and attention_mask (BATCH, LENGTH), the second sequence padded after PADDED_LENGTH."""
    input_ids = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    attention_mask[1, PADDED_LENGTH:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def hidden_and_parameter_grads(
    model: PreTrainedModel, forward: Callable[..., Any], inputs: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """last_hidden_state h of ``forward(**inputs)`` and the gradients of every parameter of
    ``model`` for the loss sum(h * r), r a fixed random tensor (0 for a parameter the loss
    does not reach)."""
    model.zero_grad(set_to_none=True)
    hidden = forward(**inputs).last_hidden_state
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
    (hidden * weights).sum().backward()
    grads = {
        name: torch.zeros_like(param) if param.grad is None else param.grad.clone()
        for name, param in model.named_parameters()
    }
    return hidden.detach(), grads


def assert_grads_match(grads: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every gradient within GRAD_RTOL of eager's, on the scale of the largest eager gradient of
    its module (see GRAD_RTOL)."""
    assert grads.keys() == expected.keys()
    module_scales: dict[str, float] = {}
    for name, grad in expected.items():
        module = name.rpartition(".")[0]
        module_scales[module] = max(module_scales.get(module, 0.0), grad.abs().max().item())
    errors = {
        name: scaled_error(grads[name], grad, module_scales[name.rpartition(".")[0]])
        for name, grad in expected.items()
    }
    worst = max(errors, key=errors.get)
    assert errors[worst] <= GRAD_RTOL, f"d/d{worst}: relative error {errors[worst]:.3g} > {GRAD_RTOL}"


def assert_compiled_matches_eager(model: PreTrainedModel, backend: str) -> None:
    """``torch.compile(model, fullgraph=True, backend=backend)`` gives eager's output on a padded
    batch to OUTPUT_RTOL and its parameter gradients as :func:`assert_grads_match` says."""
    inputs = padded_batch()
    expected, expected_grads = hidden_and_parameter_grads(model, model, inputs)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    # Scalar C++ kernels compile in about half the time of vectorised ones; the captured graph
    # (so any graph break) and its maths are the same.
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        hidden, grads = hidden_and_parameter_grads(model, compiled, inputs)
    error = relative_error(hidden, expected)
    assert error <= OUTPUT_RTOL, f"output: relative error {error:.3g} > {OUTPUT_RTOL}"
    assert_grads_match(grads, expected_grads)


@pytest.mark.parametrize(("model_type", "case"), [
    pytest.param(model_type, case, marks=[requires_compiler_for_inductor] if (model_type, case) in INDUCTOR_CASES else [])
    for case in MECHANISM_CASES for model_type in ARCHITECTURES])
def test_compiled_model_matches_eager(model_type, case):
    mechanism, options = MECHANISM_CASES[case]
    overrides, architecture_options = ARCHITECTURES[model_type]
    model = tiny_encoder(model_type, mechanism, overrides, **{**architecture_options, **options})
    backend = "inductor" if (model_type, case) in INDUCTOR_CASES else "aot_eager"
    assert_compiled_matches_eager(model, backend)


def test_bump_kernel_compiles_as_one_graph():
    """The bump kernel, global and windowed (every ModernBERT layer converted)."""
    model = tiny_encoder("modernbert", "sliced_relu", kernel="bump", num_slices=2, layers="all")
    assert_compiled_matches_eager(model, "aot_eager")


def test_compiled_bump_op_still_checks_the_bandwidth():
    """Under compile the bandwidth's sign cannot be read while tracing; the graph checks it when
    it runs (a RuntimeError, where eager raises a ValueError)."""
    scalars, value = torch.randn(1, 2, 6), torch.randn(1, 2, 6, 4)
    compiled = torch.compile(sliced_relu_bump, fullgraph=True, backend="aot_eager")
    assert compiled(scalars, scalars, value, torch.ones(2)).shape == value.shape
    with pytest.raises(RuntimeError, match="bandwidth must be positive"):
        compiled(scalars, scalars, value, -torch.ones(2))


def test_a_graph_break_fails_the_compile(monkeypatch):
    """The check can fail: with the eager-only padding test of the sliced ops' torch
    implementation (a tensor read as a bool) used under compile as well, fullgraph=True refuses
    to compile the op."""
    module = importlib.import_module("hf_sliced_attn.ops.sliced_relu")
    monkeypatch.setattr(module.sliced_relu_cpu, "available", lambda: False)
    monkeypatch.setattr(module, "has_padding", lambda valid: not bool(valid.all()))
    scalars, value = torch.randn(1, 2, 6), torch.randn(1, 2, 6, 4)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        torch.compile(sliced_relu, fullgraph=True, backend="eager")(scalars, scalars, value)
