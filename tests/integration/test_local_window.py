"""``local_window`` end to end: a softmax window combined with sliced ReLU attention, or with ReLA, on the global
layers of RoBERTa and ModernBERT, built and initialised on conversion, saved in config.json and reloaded, each
layer equal to the float64 reference on its own q, k and v; the fold off; the flags and the option's checks."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel

import hf_sliced_attn
from hf_sliced_attn.arguments import add_mechanism_arguments, mechanism_options
from hf_sliced_attn.attention import observe_attention
from hf_sliced_attn.conversion.attention_taps import attention_modules
from hf_sliced_attn.mechanisms import MECHANISMS
from hf_sliced_attn.mechanisms.local_window import WINDOW_CLASSES, find_window_module, window_attributes
from hf_sliced_attn.mechanisms.rela import attention as rela_attention
from hf_sliced_attn.mechanisms.sliced_relu import attention as sliced_attention
from hf_sliced_attn.mechanisms.sliced_relu import folds_input
from hf_sliced_attn.models import spec_for
from hf_sliced_attn.ops import WINDOW_COMBINES, windowed_softmax
from hf_sliced_attn.ops.naive import local_window_reference, rela_local_window_reference
from tests.helpers.comparisons import relative_error
from tests.helpers.models import VOCAB, tiny_config

WINDOW = 3
# Every other option of the sliced attention with the window: the bump kernel, slices, the MLP projection and
# the output affine (which the shared normaliser applies to the sliced term before combining); and ReLA.
OPTIONS = [pytest.param(("sliced_relu", {}), id="sliced_relu"),
           pytest.param(("sliced_relu", {"kernel": "bump", "num_slices": 2, "projection": "mlp",
                                         "affine_output": True}), id="sliced_relu-all"),
           pytest.param(("rela", {}), id="rela")]
# Each mechanism's attention module, the name of the op it combines the window with there, its window modules'
# attribute prefix.
COMBINING = {"sliced_relu": (sliced_attention, "local_window_attention", "sliced"),
             "rela": (rela_attention, "rela_local_window_attention", "rela")}
INITIAL = {"gate": ("theta", 0.0), "shared": ("rho", math.log(math.expm1(1.0)))}  # g = 1/2; gamma = 1


@pytest.fixture(scope="module", params=["roberta", "modernbert"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random softmax checkpoint of hidden size 64 (4 heads of 16). ModernBERT's layer 0 is global, 1 and 2
    local (the tiny config's window of 5)."""
    model_type = request.param
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(model_type)
    AutoModel.from_config(tiny_config(model_type, hidden_size=64, intermediate_size=128)).save_pretrained(path)
    return path


def convert(path: Path, mechanism: str, **options) -> PreTrainedModel:
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(path), mechanism, **options)
    return AutoModel.from_pretrained(path, config=config).eval()


def window_modules(model: nn.Module, combine: str, mechanism: str = "sliced_relu") -> list[nn.Module]:
    name = window_attributes(COMBINING[mechanism][2])[combine]
    return [getattr(m, name) for m in attention_modules(model) if hasattr(m, name)]


def padded_batch(batch: int = 2, length: int = 13) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[-1, 8:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@contextmanager
def recorded_layers(monkeypatch: pytest.MonkeyPatch, mechanism: str = "sliced_relu") -> Iterator[list[dict]]:
    """Within the block, each converted layer's attention inputs (from :func:`observe_attention`) with the
    output of its window-combining op (``local_window_attention``, ``rela_local_window_attention``, whose
    output is the layer's attention output), if it called it."""
    layers: list[dict] = []
    attention_module, op_name, _ = COMBINING[mechanism]
    combine = getattr(attention_module, op_name)

    def recording(*args, **kwargs):
        out = combine(*args, **kwargs)
        layers[-1]["output"] = out
        return out

    with monkeypatch.context() as patch, observe_attention(lambda **seen: layers.append(seen)):
        patch.setattr(attention_module, op_name, recording)
        yield layers


def reference_output(seen: dict, mechanism: str = "sliced_relu") -> torch.Tensor:
    """:func:`local_window_reference` (sliced_relu) on a layer's observed q, k, v, its scalars and its learned
    parameters, or :func:`rela_local_window_reference` (rela) on its q, k, v, window weights and norm."""
    module = seen["module"]
    window = find_window_module(module, COMBINING[mechanism][2])
    if mechanism == "rela":
        norm = module.rela_norm
        return rela_local_window_reference(seen["query"], seen["key"], seen["value"], window().detach(),
                                           seen["key_padding_mask"], norm_scale=norm.scale.detach(),
                                           norm_gate=norm.gate.detach(), norm_eps=norm.eps, window=window.window,
                                           combine=window.combine, scaling=seen["scaling"])
    with torch.no_grad():
        query_scalars, key_scalars = module.sliced_projection(seen["query"], seen["key"], seen["key_padding_mask"])
        extra = {}
        if hasattr(module, "sliced_bandwidth"):
            extra["bandwidth"] = module.sliced_bandwidth()
        if hasattr(module, "sliced_output"):
            extra.update(gain=module.sliced_output.gain, mean_weight=module.sliced_output.mean_weight)
        return local_window_reference(
            seen["query"], seen["key"], seen["value"], query_scalars, key_scalars, window(), seen["key_padding_mask"],
            window=window.window, combine=window.combine, scaling=seen["scaling"], **extra,
        )


@contextmanager
def init_calls(model_type: str, combine: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """Within the block, the window modules whose ``init_weights`` ran, each with the module the model's own
    ``_init_weights`` was then initialising (None when called from elsewhere)."""
    pretrained_class = spec_for(model_type).pretrained_class
    window_class = WINDOW_CLASSES[combine]
    original_init_weights, original_init = pretrained_class._init_weights, window_class.init_weights
    current: list[nn.Module] = []
    calls: list[tuple[nn.Module, nn.Module | None]] = []

    def tracing_init_weights(self, module):
        current.append(module)
        try:
            return original_init_weights(self, module)
        finally:
            current.pop()

    def init_weights(self, initializer_range):
        calls.append((self, current[-1] if current else None))
        return original_init(self, initializer_range)

    with monkeypatch.context() as patch:
        patch.setattr(pretrained_class, "_init_weights", tracing_init_weights)
        patch.setattr(window_class, "init_weights", init_weights)
        yield calls


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
@pytest.mark.parametrize("options", OPTIONS)
def test_built_initialised_saved_reloaded_and_equal_to_the_reference(checkpoint, options, combine, tmp_path,
                                                                     monkeypatch):
    mechanism, options = options
    model_type = AutoConfig.from_pretrained(checkpoint).model_type
    with init_calls(model_type, combine, monkeypatch) as calls:
        model = convert(checkpoint, mechanism, local_window=WINDOW, window_combine=combine, **options)
    modules = window_modules(model, combine, mechanism)
    assert len(modules) == (1 if model_type == "modernbert" else 3)  # the global layers
    assert {id(m) for m, _ in calls} == {id(m) for m in modules}
    assert all(initialising is m for m, initialising in calls)  # called by the model's own _init_weights(m)
    parameter, initial = INITIAL[combine]
    assert all(torch.equal(getattr(m, parameter), torch.full((4,), initial)) for m in modules)
    assert all(m.window == WINDOW and m.combine == combine for m in modules)
    assert window_attributes(COMBINING[mechanism][2])[combine] in hf_sliced_attn.modules_to_save(model)

    with torch.no_grad():  # off their initial values, to see them saved
        for m in modules:
            getattr(m, parameter).uniform_(-1.5, 1.5)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())[hf_sliced_attn.CONFIG_KEY]
    assert (saved["local_window"], saved["window_combine"]) == (WINDOW, combine)
    reloaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    reloaded.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.hf_sliced_attn == saved
    for before, after in zip(modules, window_modules(reloaded, combine, mechanism)):
        assert torch.equal(getattr(before, parameter), getattr(after, parameter))

    with torch.no_grad(), recorded_layers(monkeypatch, mechanism) as layers:
        out = reloaded(**padded_batch()).last_hidden_state
    with torch.no_grad(), observe_attention(lambda **_: None):  # observed too: layers that form q and k, as above
        expected = model(**padded_batch()).last_hidden_state
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert len(layers) == len(modules)
    for seen in layers:
        assert seen["sliding_window"] is None and seen["key_padding_mask"] is not None
        assert relative_error(seen["output"], reference_output(seen, mechanism)) <= 1e-5


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_modernbert_local_layers_keep_windowed_rela(combine, monkeypatch):
    """With ``layers="all"``, ModernBERT's local layers run ReLA within their sliding window as without the
    option, with no window module; only the global layer combines ReLA with a softmax window."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config("modernbert"), "rela", layers="all",
                                           local_window=WINDOW, window_combine=combine)
    model = AutoModel.from_config(config).eval()
    with torch.no_grad(), recorded_layers(monkeypatch, "rela") as layers:
        model(**padded_batch())
    assert [seen["sliding_window"] is None for seen in layers] == [True, False, False]
    assert ["output" in seen for seen in layers] == [True, False, False]
    assert relative_error(layers[0]["output"], reference_output(layers[0], "rela")) <= 1e-5
    window_module = window_attributes("rela")[combine]
    assert [hasattr(layer.attn, window_module) for layer in model.layers] == [True, False, False]


def test_rela_layer_with_the_window_holding_the_mass_gives_the_checkpoints_softmax(monkeypatch):
    """ReLA's gated RMSNorm acts on ReLA's term only: with gamma -> 0 (the window's softmax holds each query's
    mass) and the norm's scale at 3, a converted layer's attention output is the window's softmax of its q, k
    and v, not that softmax normalised per token."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config("bert"), "rela", local_window=WINDOW)
    model = AutoModel.from_config(config).eval()
    with torch.no_grad():
        for module in attention_modules(model):
            find_window_module(module, "rela").rho.fill_(-80.0)  # gamma = softplus(-80) ~ 2e-35
            module.rela_norm.scale.fill_(3.0)
    returned = []  # each attention module's output, (B, T, H*D)
    for module in attention_modules(model):
        module.register_forward_hook(lambda _module, _args, output: returned.append(output[0]))
    with torch.no_grad(), recorded_layers(monkeypatch, "rela") as layers:
        model(**padded_batch())
    assert len(returned) == len(layers) == config.num_hidden_layers
    real = padded_batch()["attention_mask"].bool()
    for seen, out in zip(layers, returned):
        local = windowed_softmax(seen["query"], seen["key"], seen["value"], seen["key_padding_mask"],
                                 scaling=seen["scaling"], sliding_window=WINDOW + 1)
        assert relative_error(out[real], local.transpose(1, 2).flatten(2)[real]) <= 1e-6


@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_modernbert_local_layers_keep_the_windowed_sliced_kernel(combine, monkeypatch):
    """With ``layers="all"``, ModernBERT's local layers run the windowed sliced kernel as without the option,
    and have no window module (none of their weights goes unused); only the global layer combines with a
    softmax window."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config("modernbert"), "sliced_relu", layers="all",
                                           local_window=WINDOW, window_combine=combine)
    model = AutoModel.from_config(config).eval()
    calls = []
    windowed = sliced_attention.windowed_sliced_relu
    monkeypatch.setattr(sliced_attention, "windowed_sliced_relu", lambda *a, **k: calls.append(1) or windowed(*a, **k))
    with torch.no_grad(), recorded_layers(monkeypatch) as layers:
        model(**padded_batch())
    assert [seen["sliding_window"] is None for seen in layers] == [True, False, False]
    assert ["output" in seen for seen in layers] == [True, False, False] and len(calls) == 2
    assert relative_error(layers[0]["output"], reference_output(layers[0])) <= 1e-5
    window_module = window_attributes("sliced")[combine]
    assert [hasattr(layer.attn, window_module) for layer in model.layers] == [True, False, False]


@contextmanager
def query_key_calls(model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[nn.Linear]]:
    """Within the block, the attention query and key layers that ran (patched on the class: hooks on the
    layers themselves would turn the fold off)."""
    layers = {id(m) for a in attention_modules(model) for m in (a.query, a.key)}
    calls: list[nn.Linear] = []
    original = nn.Linear.forward

    def forward(self, x):
        if id(self) in layers:
            calls.append(self)
        return original(self, x)

    with monkeypatch.context() as patch:
        patch.setattr(nn.Linear, "forward", forward)
        yield calls


@pytest.mark.parametrize("projection", ["linear", "mlp"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_a_window_layer_attends_from_its_input_in_one_product(combine, projection, monkeypatch):
    """With a window, BERT layers attend from their input too: q, k, v (and a linear projection's scalars) come
    out of one product, so no query or key layer runs by itself, whatever the batch size; the output and every
    parameter's gradient are those of forming q and k (an observed forward forms them)."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config("roberta"), "sliced_relu", local_window=WINDOW,
                                           window_combine=combine, projection=projection)
    model = AutoModel.from_config(config).eval()
    for windowed in attention_modules(model):
        assert folds_input(windowed, windowed.query, windowed.key, 1)
    batch = padded_batch(4, 16)
    weights = torch.randn(4, 16, config.hidden_size, generator=torch.Generator().manual_seed(1))
    parameters = [p for p in model.parameters() if p.requires_grad]

    def output_and_grads():
        out = model(**batch).last_hidden_state
        return out, torch.autograd.grad((out * weights).sum(), parameters, allow_unused=True)

    with query_key_calls(model, monkeypatch) as calls:
        got = output_and_grads()
    assert not calls
    with query_key_calls(model, monkeypatch) as calls, observe_attention(lambda **_: None):
        want = output_and_grads()
    assert len(calls) == 2 * config.num_hidden_layers
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1], want[1], strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
@pytest.mark.parametrize("combine", WINDOW_COMBINES)
def test_compiles_as_one_graph(combine, mechanism):
    """torch.compile(fullgraph=True) of a BERT layer with a window: one graph, eager's output and gradients."""
    torch.manual_seed(0)
    config = hf_sliced_attn.prepare_config(tiny_config("bert", num_hidden_layers=1), mechanism,
                                           local_window=WINDOW, window_combine=combine)
    model = AutoModel.from_config(config).eval()
    batch = padded_batch(2, 16)
    window = window_modules(model, combine, mechanism)[0]

    def output_and_grad(run):
        model.zero_grad()
        out = run(**batch).last_hidden_state
        out.square().sum().backward()
        return out.detach(), next(window.parameters()).grad.clone()

    torch._dynamo.reset()
    try:
        got = output_and_grad(torch.compile(model, fullgraph=True, backend="aot_eager"))
    finally:
        torch._dynamo.reset()
    want = output_and_grad(model)
    assert relative_error(got[0], want[0]) <= 1e-5 and relative_error(got[1], want[1]) <= 1e-4


@pytest.mark.parametrize(
    "options, message",
    [
        ({"local_window": -1}, r"local_window=-1 is not valid: it must be an integer >= 0"),
        ({"local_window": 2.5}, r"local_window=2.5 is not valid"),
        ({"local_window": True}, r"local_window=True is not valid"),
        ({"local_window": 4, "window_combine": "sum"},
         r"window_combine='sum' is not valid: use one of \['gate', 'shared'\]"),
        ({"window_combine": "gate"}, r"window_combine='gate' needs a local window: set local_window to a positive"),
    ],
)
@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_bad_options_are_refused(options, message, mechanism):
    with pytest.raises(ValueError, match=message):
        hf_sliced_attn.prepare_config(tiny_config("bert"), mechanism, **options)


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_without_a_window_the_saved_options_are_those_of_earlier_versions(mechanism):
    """local_window=0 (the default) saves neither option: config.json is what earlier versions wrote and load."""
    chosen = MECHANISMS[mechanism]
    assert chosen.make_config(local_window=0, window_combine="shared") == chosen.make_config()
    saved = chosen.make_config().to_dict()
    assert "local_window" not in saved and "window_combine" not in saved
    assert hf_sliced_attn.MECHANISMS.config_from_dict(saved) == chosen.make_config()
    for combine in ("shared", "gate"):
        with_window = chosen.make_config(local_window=8, window_combine=combine)
        assert with_window.to_dict()["window_combine"] == combine  # saved, so a later default cannot change it
        assert hf_sliced_attn.MECHANISMS.config_from_dict(with_window.to_dict()) == with_window


def test_the_flags_come_from_the_options():
    parser = argparse.ArgumentParser()
    add_mechanism_arguments(parser, dashes=True)
    args = parser.parse_args(["--local-window", "16", "--window-combine", "shared"])
    for mechanism in ("sliced_relu", "rela"):
        assert mechanism_options(args, mechanism, dashes=True) == {"local_window": 16, "window_combine": "shared"}
    with pytest.raises(ValueError, match="--local-window applies to sliced_relu, rela only"):
        mechanism_options(args, None, dashes=True)
    helps = {action.dest: action.help for action in parser._actions}
    assert "2410.10254" in helps["local_window"] and "2506.15545" in helps["local_window"]
    assert "2410.10254" in helps["window_combine"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--window-combine", "sum"])


@pytest.mark.parametrize("mechanism", ["sliced_relu", "rela"])
def test_the_card_names_the_window(mechanism):
    chosen = MECHANISMS[mechanism]
    phrases = chosen.make_config(local_window=8, window_combine="shared").describe()
    assert "softmax within 8 tokens of each query, combined by a shared normaliser (LoLCATs)" in phrases
    assert not any("softmax within" in p for p in chosen.make_config().describe())


@pytest.mark.parametrize("converted, asked", [(0, 4), (4, 0)])
def test_changing_the_window_of_a_converted_checkpoint_is_refused(converted, asked):
    config = hf_sliced_attn.prepare_config(tiny_config("bert"), "sliced_relu", local_window=converted)
    with pytest.raises(ValueError, match="it cannot take"):
        hf_sliced_attn.prepare_config(config, "sliced_relu", local_window=asked)
