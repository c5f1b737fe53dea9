"""Sliced ReLU layers of the BERT family and DistilBERT attend from their input, the projection folded into the query
and key layers (through peft's LoRA adapters too): the same outputs and gradients as forming q and k, and the
usual forward wherever the fold does not apply (hooked layers, a LoRA dropout in training, observed layers,
batches too small to gain)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import PreTrainedModel

import hf_sliced_attn
from hf_sliced_attn.attention import observe_attention
from hf_sliced_attn.mechanisms.sliced_relu import SlicedMLPProjection, SlicedProjection
from hf_sliced_attn.conversion.attention_taps import attention_modules
from hf_sliced_attn.models import spec_for

from tests.helpers.models import VOCAB, tiny_encoder

PROJECTIONS = {"mlp": SlicedMLPProjection, "linear": SlicedProjection,
               "mlp_narrow": functools.partial(SlicedMLPProjection, width=5)}
PROJECTION_OPTIONS = {"mlp": {"projection": "mlp"}, "linear": {"projection": "linear"},
                      "mlp_narrow": {"projection": "mlp", "mlp_ratio": 5 / 32}}
"""The options that build each of :data:`PROJECTIONS` in a model."""
FOLDING_TYPES = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert"]
"""The architectures whose attention forward is q, k, v of the input, the attention function (and an output layer)."""
BATCH, LENGTH = 3, 16  # 48 tokens: at least the hidden size (32), where the MLP projection folds


def _mask(batch: int, length: int) -> torch.Tensor:
    """(B, T) bool: the first row padded after 5 tokens, the last one fully padded."""
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, 5:] = False
    mask[-1] = False
    return mask


@pytest.mark.parametrize("biases", [(True, True), (False, False), (True, False)], ids=["bias", "nobias", "qbias"])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("projection_name", PROJECTIONS)
def test_project_input_equals_projecting_q_and_k(projection_name, compiled, masked, biases):
    """``project_input(x, query, key)`` gives ``forward(query(x), key(x))``: the scalars, and the gradients
    of x, of both Linear layers and of the projection; with or without the layers' biases, or with the
    query's alone (queries and keys go through one product)."""
    torch.manual_seed(0)
    batch, length, width, heads, dim, slices = 3, 7, 10, 2, 4, 3
    projection = PROJECTIONS[projection_name](heads, dim, slices)
    projection.init_weights(0.5)
    query, key = (nn.Linear(width, heads * dim, bias=bias) for bias in biases)
    x = torch.randn(batch, length, width)
    mask = _mask(batch, length) if masked else None
    weights = [torch.randn(batch, heads, slices, length) for _ in range(2)]
    parameters = [*query.parameters(), *key.parameters(), *projection.parameters()]

    def scalars_and_grads(project):
        inputs = x.clone().requires_grad_()
        scalars = project(inputs)
        loss = sum((s * w).sum() for s, w in zip(scalars, weights))
        return scalars, torch.autograd.grad(loss, [inputs, *parameters])

    def heads_of(linear_output: torch.Tensor) -> torch.Tensor:
        return linear_output.view(batch, length, heads, dim).transpose(1, 2)

    project_input = projection.project_input
    if compiled:
        torch._dynamo.reset()  # one code object compiled anew for each case, not against dynamo's recompile limit
        project_input = torch.compile(project_input, fullgraph=True, backend="aot_eager")
    got, got_grads = scalars_and_grads(lambda inputs: project_input(inputs, query, key, mask))
    want, want_grads = scalars_and_grads(lambda inputs: projection(heads_of(query(inputs)), heads_of(key(inputs)), mask))
    for g, w in zip(got, want):
        assert g.shape == (batch, heads, slices, length)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value_bias", [True, False], ids=["vbias", "novbias"])
@pytest.mark.parametrize("biases", [(True, True), (False, False)], ids=["qkbias", "noqkbias"])
def test_project_input_beside_equals_the_layers_beside_project_input(biases, value_bias):
    """The linear projection's ``project_input_beside(x, query, key, [query, value])`` gives ``query(x)``,
    ``value(x)`` and ``project_input(x, query, key)`` from one product: the same tensors and gradients."""
    torch.manual_seed(0)
    batch, length, width, heads, dim, slices = 3, 7, 10, 2, 4, 3
    projection = SlicedProjection(heads, dim, slices)
    projection.init_weights(0.5)
    query, key = (nn.Linear(width, heads * dim, bias=bias) for bias in biases)
    value = nn.Linear(width, heads * dim, bias=value_bias)
    x = torch.randn(batch, length, width)
    weights = [*(torch.randn(batch, length, heads * dim) for _ in range(2)),
               *(torch.randn(batch, heads, slices, length) for _ in range(2))]
    parameters = [*query.parameters(), *key.parameters(), *value.parameters(), *projection.parameters()]

    def outputs_and_grads(project):
        inputs = x.clone().requires_grad_()
        outputs = project(inputs)
        loss = sum((out * w).sum() for out, w in zip(outputs, weights))
        return outputs, torch.autograd.grad(loss, [inputs, *parameters])

    def beside(inputs):
        (queries, values), query_scalars, key_scalars = projection.project_input_beside(inputs, query, key,
                                                                                       [query, value])
        return queries, values, query_scalars, key_scalars

    got, got_grads = outputs_and_grads(beside)
    want, want_grads = outputs_and_grads(lambda inputs: (query(inputs), value(inputs),
                                                         *projection.project_input(inputs, query, key)))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("projection_name, in_features, folds_from",
                         [("mlp", 384, 384), ("linear", 384, 48), ("mlp_narrow", 384, 5)])
def test_the_fold_is_taken_where_it_costs_less(projection_name, in_features, folds_from):
    """The MLP's fold costs as much as projecting W tokens (W its width, ``in_features`` by default, where the
    layers are as wide as their input); the linear one's (H*M wide) far less."""
    projection = PROJECTIONS[projection_name](12, 32, 4)
    assert projection.folds(folds_from, in_features)
    assert not projection.folds(folds_from - 1, in_features)


def affine_sliced_relu_encoder(model_type: str, projection: str) -> PreTrainedModel:
    """The tiny ``model_type`` encoder converted to sliced ReLU with the ``projection`` (a name of
    :data:`PROJECTION_OPTIONS`), 2 slices and the output affine, that affine moved off its initial values."""
    model = tiny_encoder(model_type, "sliced_relu", **PROJECTION_OPTIONS[projection], num_slices=2, affine_output=True)
    with torch.no_grad():  # the output affine away from its initial values, so that every piece shows
        for module in attention_modules(model):
            module.sliced_output.gain.uniform_(0.5, 2.0)
            module.sliced_output.mean_weight.uniform_(-1.0, 1.0)
    return model


def batch(batch_size: int = BATCH, length: int = LENGTH) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(3, VOCAB, (batch_size, length), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones(batch_size, length, dtype=torch.long)
    attention_mask[0, 9:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@contextmanager
def linear_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[nn.Linear]]:
    """Records every ``nn.Linear`` that runs its forward within the block."""
    calls: list[nn.Linear] = []
    original = nn.Linear.forward

    def forward(self, x):
        calls.append(self)
        return original(self, x)

    with monkeypatch.context() as patch:
        patch.setattr(nn.Linear, "forward", forward)
        yield calls


def query_and_key(attention: nn.Module, model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The query and key layers of one of ``model``'s attention modules (``query``/``key``, DistilBERT's ``q_lin``/
    ``k_lin``)."""
    query, key, _ = spec_for(model.config.model_type).input_projections(attention)
    return query, key


def query_key_calls(model: nn.Module, calls: list[nn.Linear]) -> int:
    """How many of ``calls`` were attention query or key layers (peft-wrapped ones through their base layer)."""
    layers = {id(m.get_base_layer() if hasattr(m, "get_base_layer") else m)
              for a in attention_modules(model) for m in query_and_key(a, model)}
    return sum(id(call) in layers for call in calls)


def real_token_hidden_and_grads(
    model: nn.Module, inputs: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The last hidden states at real tokens, and the gradients of the encoder's trainable parameters by name."""
    hidden = model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(1))
    loss = (hidden * weights)[real].sum()
    parameters = {name: p for name, p in model.named_parameters() if p.requires_grad and "pooler" not in name}
    return hidden[real], dict(zip(parameters, torch.autograd.grad(loss, list(parameters.values()))))


def module_scales(grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each module's largest gradient, keyed by the module's name."""
    scale: dict[str, float] = {}
    for name, grad in grads.items():
        owner = name.rsplit(".", 1)[0]
        scale[owner] = max(scale.get(owner, 0.0), grad.abs().max().item())
    return scale


def vanishing_gradients(grads: dict[str, torch.Tensor], tolerance: float = 1e-9) -> set[str]:
    """The parameters whose gradient (from a float64 run) is 0 in exact arithmetic: within ``tolerance`` of its
    module's largest."""
    scale = module_scales(grads)
    return {name for name, grad in grads.items() if grad.abs().max().item() <= tolerance * scale[name.rsplit(".", 1)[0]]}


def assert_same(got: tuple, want: tuple, tolerance: float = 1e-4, exclude: set[str] = frozenset()) -> None:
    """Outputs equal to ``tolerance / 10``; each gradient to ``tolerance`` of its own size and of its module's
    largest gradient (float32 needs 1e-4: some gradients are 0 in exact arithmetic and hold only rounding noise,
    up to ~2e-5 of the scale on BERT: the MLP projection's output bias shifts s and t together), but those named
    in ``exclude``."""
    torch.testing.assert_close(got[0], want[0], rtol=tolerance / 10, atol=tolerance / 10)
    assert got[1].keys() == want[1].keys()
    scale = module_scales(want[1])
    for name, grad in got[1].items():
        if name not in exclude:
            torch.testing.assert_close(grad, want[1][name], rtol=tolerance,
                                       atol=tolerance * scale[name.rsplit(".", 1)[0]])


@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("model_type", FOLDING_TYPES)
def test_converted_layers_attend_from_their_input(model_type, projection, monkeypatch):
    """No converted layer runs its query or key layer, and the outputs and gradients are those of forming q and k
    (an observed forward forms them): in float64 to 1e-9, in float32 to rounding, but for the gradients that are
    0 in exact arithmetic (the float64 run shows which), where both paths hold only rounding noise, larger than
    BERT's where the layers' inputs are not normalised (ELECTRA projects its embeddings after their layer norm)."""
    runs = {}
    for dtype in (torch.float64, torch.float32):
        model, inputs = affine_sliced_relu_encoder(model_type, projection).to(dtype), batch()
        with linear_calls(monkeypatch) as calls:
            folded = real_token_hidden_and_grads(model, inputs)
        assert query_key_calls(model, calls) == 0
        with linear_calls(monkeypatch) as calls, observe_attention(lambda **_: None):
            formed = real_token_hidden_and_grads(model, inputs)
        assert query_key_calls(model, calls) == 2 * model.config.num_hidden_layers
        runs[dtype] = folded, formed
    assert_same(*runs[torch.float64], tolerance=1e-9)
    assert_same(*runs[torch.float32], exclude=vanishing_gradients(runs[torch.float64][1][1]))


def test_layers_kept_on_softmax_form_q_and_k(monkeypatch):
    model = tiny_encoder("bert", "sliced_relu", projection="mlp", layers=[1])
    with linear_calls(monkeypatch) as calls:
        model(**batch())
    formed = {id(m) for i, a in enumerate(attention_modules(model)) if i != 1 for m in (a.query, a.key)}
    assert sum(id(call) in formed for call in calls) == 4
    assert query_key_calls(model, calls) == 4


def test_a_small_batch_forms_q_and_k_with_an_mlp_projection(monkeypatch):
    """A batch of fewer tokens than the hidden size runs the query and key layers, with the same outputs
    as a folded forward."""
    model = affine_sliced_relu_encoder("bert", "mlp")
    small = batch(1, 20)
    with linear_calls(monkeypatch) as calls:
        formed = real_token_hidden_and_grads(model, small)
    assert query_key_calls(model, calls) == 2 * model.config.num_hidden_layers
    for module in attention_modules(model):
        module.sliced_projection.folds = lambda num_tokens, in_features: True
    with linear_calls(monkeypatch) as calls:
        folded = real_token_hidden_and_grads(model, small)
    assert query_key_calls(model, calls) == 0
    assert_same(folded, formed)


def test_a_hook_on_the_query_layer_is_honoured():
    """A forward hook on a query layer runs, and its change to q reaches the output."""
    model, inputs = affine_sliced_relu_encoder("bert", "linear"), batch()
    reference = model(**inputs).last_hidden_state
    query = attention_modules(model)[0].query
    handle = query.register_forward_hook(lambda module, args, output: output * 2.0)
    try:
        hooked = model(**inputs).last_hidden_state
    finally:
        handle.remove()
    assert not torch.allclose(hooked, reference)
    torch.testing.assert_close(model(**inputs).last_hidden_state, reference, rtol=0, atol=0)


def test_the_linear_projection_runs_in_the_value_layers_product(monkeypatch):
    """With the linear projection, a converted layer computes v and the scalars in one product: no query, key or
    value layer runs by itself; a forward hook on a value layer makes it run, and its change reaches the output."""
    model, inputs = affine_sliced_relu_encoder("bert", "linear"), batch()
    values = {id(a.value) for a in attention_modules(model)}
    with linear_calls(monkeypatch) as calls:
        reference = model(**inputs).last_hidden_state
    assert query_key_calls(model, calls) == 0
    assert sum(id(call) in values for call in calls) == 0
    value = attention_modules(model)[0].value
    handle = value.register_forward_hook(lambda module, args, output: output * 2.0)
    try:
        with linear_calls(monkeypatch) as calls:
            hooked = model(**inputs).last_hidden_state
    finally:
        handle.remove()
    assert sum(id(call) == id(value) for call in calls) == 1
    assert not torch.allclose(hooked, reference)
    torch.testing.assert_close(model(**inputs).last_hidden_state, reference, rtol=0, atol=0)


@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_lora_wrapped_layers_fold_through_their_adapters(model_type, projection, monkeypatch):
    """peft wraps the attention projections (as attention transfer does): the fold reads W_0 + s B A, so no query
    or key layer runs, nor their LoRA factors; the outputs and the gradients of every trainable parameter (the
    LoRA factors, the new modules, on DistilBERT the output layer's LoRA inside the attention module) are those of
    forming q and k; merging gives the same model, folded again."""
    model, inputs = affine_sliced_relu_encoder(model_type, projection), batch()
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=hf_sliced_attn.lora_target_modules(model),
                                            modules_to_save=hf_sliced_attn.modules_to_save(model), init_lora_weights=False))
    factors = {id(factor) for a in attention_modules(lora) for layer in query_and_key(a, lora)
               for factor in (*layer.lora_A.values(), *layer.lora_B.values())}
    assert len(factors) == 4 * model.config.num_hidden_layers
    with linear_calls(monkeypatch) as calls:
        folded = real_token_hidden_and_grads(lora, inputs)
    assert query_key_calls(lora, calls) == 0
    assert not any(id(call) in factors for call in calls)
    with linear_calls(monkeypatch) as calls, observe_attention(lambda **_: None):
        formed = real_token_hidden_and_grads(lora, inputs)
    assert query_key_calls(lora, calls) == 2 * model.config.num_hidden_layers
    assert_same(folded, formed)
    merged = lora.merge_and_unload()
    with linear_calls(monkeypatch) as calls:
        with torch.no_grad():
            merged_hidden = merged(**inputs).last_hidden_state
    assert query_key_calls(merged, calls) == 0
    torch.testing.assert_close(merged_hidden[inputs["attention_mask"].bool()], folded[0], rtol=1e-5, atol=1e-5)


def test_lora_dropout_in_training_runs_the_wrapped_layers(monkeypatch):
    """A LoRA dropout that is on (training, p > 0) is not an affine map: the wrapped query and key layers run."""
    model, inputs = affine_sliced_relu_encoder("bert", "linear"), batch()
    config = LoraConfig(r=4, lora_dropout=0.1, target_modules=hf_sliced_attn.lora_target_modules(model),
                        modules_to_save=hf_sliced_attn.modules_to_save(model))
    lora = get_peft_model(model, config)
    lora.train()
    with linear_calls(monkeypatch) as calls:
        lora(**inputs)
    assert query_key_calls(lora, calls) == 2 * model.config.num_hidden_layers
    lora.eval()
    with linear_calls(monkeypatch) as calls:
        lora(**inputs)
    assert query_key_calls(lora, calls) == 0
