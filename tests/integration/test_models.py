"""sliced_relu and rela inside real transformers encoders: masks, persistence, peft, errors."""

from __future__ import annotations

import dataclasses

import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, GPT2Config, GPT2Model

import hf_sliced_attn
from hf_sliced_attn.attention import LAYER_MODE_ATTR, attention_function
from hf_sliced_attn.mechanisms import SLICED_RELU
from hf_sliced_attn.mechanisms.sliced_relu import SlicedMLPProjection, SlicedOutputAffine
from hf_sliced_attn.ops.naive import sliced_relu_reference, value_mean_reference

from tests.helpers.models import MODEL_TYPES, VOCAB, tiny_config

MECHANISMS = ["sliced_relu", "rela"]
MODULE = {"sliced_relu": "sliced_projection", "rela": "rela_norm"}


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, LAYER_MODE_ATTR)]


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("softmax_checkpoint", MODEL_TYPES, indirect=True)
def test_padding_invariance(softmax_checkpoint, mechanism):
    model = AutoModel.from_pretrained(softmax_checkpoint, attn_implementation=mechanism).eval()
    lengths = [19, 7, 13]
    ids = tokens(3, 19)
    mask = torch.zeros(3, 19, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, length in enumerate(lengths):
            alone = model(input_ids=ids[row : row + 1, :length]).last_hidden_state
            torch.testing.assert_close(batched[row : row + 1, :length], alone, atol=1e-5, rtol=1e-5)
            # Appending padding to a single sequence changes none of its real tokens.
            padded = model(input_ids=ids[row : row + 1], attention_mask=mask[row : row + 1]).last_hidden_state
            torch.testing.assert_close(padded[:, :length], alone, atol=1e-5, rtol=1e-5)
        fully_padded = model(input_ids=ids[:1], attention_mask=torch.zeros(1, 19, dtype=torch.long)).last_hidden_state
    assert torch.isfinite(fully_padded).all()


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("softmax_checkpoint", MODEL_TYPES, indirect=True)
def test_convert_save_load_round_trip(softmax_checkpoint, mechanism, tmp_path):
    vanilla = AutoModelForSequenceClassification.from_pretrained(softmax_checkpoint)
    converted = AutoModelForSequenceClassification.from_pretrained(softmax_checkpoint,
                                                                   attn_implementation=mechanism).eval()
    assert converted.config._attn_implementation == mechanism

    # The original weights are kept, and the new modules are initialised (not left as empty memory).
    vanilla_state = vanilla.state_dict()
    for name, tensor in converted.state_dict().items():
        if name in vanilla_state:
            torch.testing.assert_close(tensor, vanilla_state[name], rtol=0, atol=0)
    new_modules = [getattr(m, MODULE[mechanism]) for m in attention_modules(converted) if hasattr(m, MODULE[mechanism])]
    assert new_modules
    for module in new_modules:
        if mechanism == "sliced_relu":
            expected_std = module.head_dim**-0.5
            assert 0.5 * expected_std < module.directions.std().item() < 1.5 * expected_std
        else:
            torch.testing.assert_close(module.scale, torch.ones_like(module.scale))
            assert 0.005 < module.gate.std().item() < 0.05

    converted.save_pretrained(tmp_path)
    reloaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config._attn_implementation == mechanism
    ids, mask = tokens(2, 11), torch.ones(2, 11, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.eval()(input_ids=ids, attention_mask=mask).logits,
            converted(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0,
        )
        softmax_logits = vanilla.eval()(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(softmax_logits, reloaded(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("softmax_checkpoint", ["roberta", "modernbert"], indirect=True)
def test_lora_with_modules_to_save_trains_and_merges(softmax_checkpoint, mechanism, tmp_path):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(softmax_checkpoint, attn_implementation=mechanism)
    names = hf_sliced_attn.modules_to_save(model)
    assert names == [MODULE[mechanism]]
    peft_model = get_peft_model(
        model,
        LoraConfig(r=4, target_modules=hf_sliced_attn.lora_target_modules(model), modules_to_save=[*names, "classifier"]),
    )
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable)
    assert any(MODULE[mechanism] in n for n in trainable)
    assert all("lora_" in n or MODULE[mechanism] in n or "classifier" in n for n in trainable)

    ids, labels = tokens(4, 12), torch.tensor([0, 1, 0, 1])
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        loss = peft_model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]

    merged = peft_model.merge_and_unload().eval()
    trained = {n: p.detach().clone() for n, p in merged.named_parameters() if MODULE[mechanism] in n}
    assert trained
    merged.save_pretrained(tmp_path)
    reloaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    reloaded_params = dict(reloaded.named_parameters())
    fresh = AutoModelForSequenceClassification.from_pretrained(softmax_checkpoint, attn_implementation=mechanism)
    fresh_params = dict(fresh.named_parameters())
    for name, value in trained.items():
        torch.testing.assert_close(reloaded_params[name], value, rtol=0, atol=0)
    assert any(not torch.equal(trained[n], fresh_params[n]) for n in trained), "the new modules did not train"
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).logits, merged(input_ids=ids).logits)


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_loading_without_the_plugin_refuses_instead_of_running_softmax(softmax_checkpoint, tmp_path):
    AutoModel.from_pretrained(softmax_checkpoint, attn_implementation="sliced_relu").save_pretrained(tmp_path)
    script = f"from transformers import AutoModel; AutoModel.from_pretrained({str(tmp_path)!r})"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode != 0
    assert 'attn_implementation="sliced_relu"' in result.stderr


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_a_converted_model_refuses_another_attention(softmax_checkpoint, tmp_path):
    model = AutoModel.from_pretrained(softmax_checkpoint, attn_implementation="rela")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="converted to 'rela'"):
        AutoModel.from_pretrained(tmp_path, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="converted to 'rela'"):
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("softmax_checkpoint", ["bert", "distilbert", "modernbert"], indirect=True)
def test_set_attn_implementation_attaches_initialised_modules(softmax_checkpoint, mechanism):
    model = AutoModel.from_pretrained(softmax_checkpoint).eval()
    ids = tokens(1, 10)
    with torch.no_grad():
        softmax_out = model(input_ids=ids).last_hidden_state
    model.set_attn_implementation(mechanism)
    assert model.config.to_dict()["hf_sliced_attn"]["mechanism"] == mechanism
    new = [getattr(m, MODULE[mechanism]) for m in attention_modules(model) if hasattr(m, MODULE[mechanism])]
    assert new and all(torch.isfinite(p).all() for module in new for p in module.parameters())
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
    assert torch.isfinite(out).all() and not torch.allclose(out, softmax_out)


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_a_model_built_without_the_modules_never_runs(softmax_checkpoint):
    model = AutoModel.from_pretrained(softmax_checkpoint)
    model.config._attn_implementation_internal = "sliced_relu"  # bypassing set_attn_implementation
    with pytest.raises(RuntimeError, match="built without the modules"):
        model(input_ids=tokens(1, 5))


def test_unsupported_architecture_lists_the_supported_ones():
    supported = "bert, roberta, xlm-roberta, camembert, electra, distilbert, modernbert"
    with pytest.raises(ValueError, match=f"Supported architectures: {supported}"):
        GPT2Model._from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2), attn_implementation="sliced_relu")


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_options_are_saved_and_select_layers(softmax_checkpoint, tmp_path):
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(softmax_checkpoint), "sliced_relu", num_slices=3,
                                           layers=[0, 2])
    model = AutoModel.from_pretrained(softmax_checkpoint, config=config)
    modes = [getattr(m, LAYER_MODE_ATTR) for m in attention_modules(model)]
    assert modes == ["sliced_relu", "softmax", "sliced_relu"]
    assert model.encoder.layer[0].attention.self.sliced_projection.directions.shape == (4, 3, 8)
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert reloaded.config.hf_sliced_attn == {"mechanism": "sliced_relu", "num_slices": 3, "layers": [0, 2],
                                              "kernel": "relu", "projection": "linear", "affine_output": False}
    assert [getattr(m, LAYER_MODE_ATTR) for m in attention_modules(reloaded)] == modes


@pytest.mark.parametrize(
    "mechanism, options, message",
    [
        ("sliced_relu", {"layers": "local"}, "layers='local' is not valid"),
        ("sliced_relu", {"num_slices": 0}, "num_slices=0 is not valid"),
        ("sliced_relu", {"projection": "conv"}, r"projection='conv' is not valid: use one of \['linear', 'mlp'\]"),
        ("sliced_relu", {"affine_output": "yes"}, "affine_output='yes' is not valid: it must be True or False"),
        ("sliced_relu", {"projection": "mlp", "mlp_ratio": 0}, r"mlp_ratio=0 is not valid: it must be a number > 0"),
        ("sliced_relu", {"projection": "mlp", "mlp_ratio": "half"}, r"mlp_ratio='half' is not valid"),
        ("sliced_relu", {"projection": "mlp", "mlp_ratio": float("nan")}, r"mlp_ratio=nan is not valid"),
        ("sliced_relu", {"mlp_ratio": 0.5}, r"mlp_ratio=0.5 applies to projection='mlp' only, not projection='linear'"),
        ("rela", {"projection": "mlp"}, r"Unknown option\(s\) \['projection'\] for 'rela'"),
        ("rela", {"num_slices": 2}, r"Unknown option\(s\) \['num_slices'\] for 'rela'"),
        ("softmax", {}, r"valid ones are \['sliced_relu', 'rela'\]"),
    ],
)
def test_bad_options_are_refused(mechanism, options, message):
    with pytest.raises(ValueError, match=message):
        hf_sliced_attn.prepare_config(tiny_config("bert"), mechanism, **options)


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, {"projection": "mlp", "mlp_ratio": 0.25, "num_slices": 4}),
        ({"mlp_ratio": 0.5}, {"projection": "mlp", "mlp_ratio": 0.5, "num_slices": 4}),
        ({"projection": "linear"}, {"projection": "linear", "num_slices": 4}),
        ({"projection": "linear", "mlp_ratio": 0.25}, {"projection": "linear", "mlp_ratio": 0.25, "num_slices": 4}),
    ],
)
def test_a_default_mlp_ratio_goes_with_the_mlp(given, expected):
    """A transfer's default width of the MLP does not outlive a linear projection the user asks for; a width the
    user gives with it stays, and is refused."""
    mechanism = dataclasses.replace(hf_sliced_attn.MECHANISMS["sliced_relu"], conversion_defaults={
        "convert": {"projection": "mlp", "mlp_ratio": 0.25, "num_slices": 4}})
    options = mechanism.conversion_options("convert", given)
    assert options == expected
    if "mlp_ratio" in given and given.get("projection") == "linear":
        with pytest.raises(ValueError, match="mlp_ratio=0.25 applies to projection='mlp' only"):
            mechanism.make_config(**options)
    else:
        mechanism.make_config(**options)


def test_the_card_names_a_narrower_mlp():
    mechanism = hf_sliced_attn.MECHANISMS["sliced_relu"]
    narrow = mechanism.make_config(projection="mlp", mlp_ratio=0.25).describe()
    assert "mlp projection (hidden width 0.25 x H*D)" in narrow
    assert "mlp projection" in mechanism.make_config(projection="mlp").describe()


def test_given_options_override_the_transfer_defaults():
    mechanism = hf_sliced_attn.MECHANISMS["rela"]
    defaults = mechanism.conversion_options("convert")
    assert mechanism.conversion_options("convert", {"local_window": 3}) == {**defaults, "local_window": 3}


def test_layer_indices_out_of_range_are_refused():
    config = hf_sliced_attn.prepare_config(tiny_config("bert"), "rela", layers=[5])
    with pytest.raises(ValueError, match="the model has 3 layers"):
        AutoModel.from_config(config)


def test_decoders_are_refused():
    config = tiny_config("bert")
    config.is_decoder = True
    with pytest.raises(ValueError, match="is for encoders"):
        AutoModel.from_config(config, attn_implementation="rela")


CONVERSION_OPTIONS = {"projection": "mlp", "affine_output": True, "num_slices": 2}


@pytest.mark.parametrize("softmax_checkpoint", MODEL_TYPES, indirect=True)
def test_mlp_projection_and_affine_output_are_built_initialised_and_saved(softmax_checkpoint, tmp_path):
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(softmax_checkpoint), "sliced_relu",
                                           **CONVERSION_OPTIONS)
    model = AutoModel.from_pretrained(softmax_checkpoint, config=config).eval()
    converted = [m for m in attention_modules(model) if getattr(m, LAYER_MODE_ATTR) == "sliced_relu"]
    assert converted
    for attention in converted:
        projection, affine = attention.sliced_projection, attention.sliced_output
        assert isinstance(projection, SlicedMLPProjection) and isinstance(affine, SlicedOutputAffine)
        width = projection.num_heads * projection.head_dim
        assert projection.to_scalars.weight.shape == (projection.num_heads * 2, width)
        assert 0.01 < projection.hidden.weight.std().item() < 0.03 and (projection.hidden.bias == 0).all()
        assert (affine.gain == 2).all() and (affine.mean_weight == 1).all()
    assert hf_sliced_attn.modules_to_save(model) == ["sliced_output", "sliced_projection"]

    with torch.no_grad():  # move the new parameters off their initial values, to see them saved
        for attention in converted:
            attention.sliced_output.gain.uniform_(0.5, 3.0)
            attention.sliced_output.mean_weight.uniform_(-1.0, 1.0)
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.hf_sliced_attn == {"mechanism": "sliced_relu", "layers": "global", "kernel": "relu",
                                              **CONVERSION_OPTIONS}
    ids, mask = tokens(2, 11), torch.ones(2, 11, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, rtol=0, atol=0)


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_a_narrower_mlp_is_built_saved_and_reloaded_with_its_width(softmax_checkpoint, tmp_path):
    """mlp_ratio 0.15 of H*D = 32 is 4.8: 5 wide."""
    options = {**CONVERSION_OPTIONS, "mlp_ratio": 0.15}
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(softmax_checkpoint), "sliced_relu", **options)
    model = AutoModel.from_pretrained(softmax_checkpoint, config=config).eval()
    projection = model.encoder.layer[0].attention.self.sliced_projection
    features = projection.num_heads * projection.head_dim
    assert projection.hidden.weight.shape == (5, features) and projection.to_scalars.weight.shape == (8, 5)
    assert "width=5" in repr(projection)
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.hf_sliced_attn["mlp_ratio"] == 0.15
    ids = tokens(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).last_hidden_state,
                                   model(input_ids=ids).last_hidden_state, rtol=0, atol=0)


@pytest.mark.parametrize("sliding_window", [None, 3], ids=["global", "window3"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_sliced_relu_layer_is_the_kernel_scaled_plus_the_mean_value(sliding_window, padded):
    """The attention function with an MLP projection and affine output equals its float64 composition,
    in which padded tokens get the scalar 0 (the MLP runs on the real tokens only)."""
    torch.manual_seed(0)
    batch, heads, length, dim, slices = 2, 3, 9, 4, 2
    layer = torch.nn.Module()
    setattr(layer, LAYER_MODE_ATTR, "sliced_relu")
    layer.sliced_projection = SlicedMLPProjection(heads, dim, slices)
    layer.sliced_output = SlicedOutputAffine(heads)
    with torch.no_grad():
        layer.sliced_output.gain.copy_(torch.tensor([2.0, 0.5, -1.0]))
        layer.sliced_output.mean_weight.copy_(torch.tensor([1.0, 0.0, 3.0]))
    query, key, value = (torch.randn(batch, heads, length, dim) for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool)
    if padded:
        mask[1, 5:] = False

    out, _ = attention_function(SLICED_RELU)(layer, query, key, value, mask, sliding_window=sliding_window)
    with torch.no_grad():
        s, t = (x.masked_fill(~mask[:, None, None, :], 0.0) for x in layer.sliced_projection(query, key))
    kernel = sliced_relu_reference(s, t, value.double(), mask, sliding_window=sliding_window)
    mean = value_mean_reference(value.double(), mask, sliding_window=sliding_window)
    gain = layer.sliced_output.gain.double()[:, None, None]
    weight = layer.sliced_output.mean_weight.double()[:, None, None]
    expected = (gain * kernel + weight * mean).transpose(1, 2)
    assert out.shape == (batch, length, heads, dim)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def _projection_and_grads(projection, query, key, mask, weights):
    """The scalars (s, t) with padded tokens' set to 0, and the gradients of <s, a> + <t, b> for
    query, key and the projection's parameters."""
    inputs = [x.detach().requires_grad_() for x in (query, key)]
    scalars = projection(*inputs, mask)
    loss = sum((x * w).sum() for x, w in zip(scalars, weights))
    grads = torch.autograd.grad(loss, [*inputs, *projection.parameters()])
    return scalars, grads


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_mlp_projection_skips_padded_tokens(compiled):
    """With a token mask the MLP runs on the real tokens only: their scalars and every gradient
    are those of projecting every token, the padded tokens' scalars are 0 and they get no gradient."""
    torch.manual_seed(0)
    batch, heads, length, dim, slices = 3, 2, 7, 4, 2
    projection = SlicedMLPProjection(heads, dim, slices)
    projection.init_weights(0.5)
    query, key = (torch.randn(batch, length, heads, dim).transpose(1, 2) for _ in range(2))
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2] = False  # a fully padded row
    weights = [torch.randn(batch, heads, slices, length) for _ in range(2)]
    run = torch.compile(projection, fullgraph=True, backend="aot_eager") if compiled else projection
    (s, t), grads = _projection_and_grads(run, query, key, mask, weights)
    padded = ~mask[:, None, None, :]
    (s_all, t_all), expected = _projection_and_grads(
        projection, query, key, None, [w.masked_fill(padded, 0.0) for w in weights])
    for x, every in ((s, s_all), (t, t_all)):
        assert torch.equal(x.masked_select(padded), torch.zeros(int(padded.sum()) * slices * heads))
        torch.testing.assert_close(x.masked_select(~padded), every.masked_select(~padded), rtol=1e-6, atol=1e-6)
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-6)
    for grad in grads[:2]:  # dL/dq, dL/dk: (B, H, T, D)
        assert not grad.transpose(1, 2)[~mask].any() and grad.transpose(1, 2)[mask].abs().sum() > 0


def test_mlp_projection_token_mask_must_match_the_tokens():
    projection = SlicedMLPProjection(2, 4, 1)
    query = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"token_mask is for self-attention: it must be \(B, T\)"):
        projection(query, query, torch.ones(1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"same T tokens, got \(1, 5\) for queries \(1, 2, 5, 4\) and keys \(1, 2, 6, 4\)"):
        projection(query, torch.randn(1, 2, 6, 4), torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"got \(1, 6\) for an input \(1, 5, 8\)"):
        projection.project_input(torch.randn(1, 5, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8),
                                 torch.ones(1, 6, dtype=torch.bool))


@pytest.mark.parametrize("softmax_checkpoint", ["roberta"], indirect=True)
def test_prepare_config_keeps_the_options_of_a_converted_checkpoint(softmax_checkpoint, tmp_path):
    config = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(softmax_checkpoint), "sliced_relu",
                                           **CONVERSION_OPTIONS)
    AutoModel.from_pretrained(softmax_checkpoint, config=config).save_pretrained(tmp_path)
    saved = AutoConfig.from_pretrained(tmp_path).hf_sliced_attn
    for options in ({}, {"projection": "mlp"}, {"num_slices": 2, "affine_output": True}):
        kept = hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(tmp_path), "sliced_relu", **options)
        assert kept.hf_sliced_attn == saved
    with pytest.raises(ValueError, match=r"cannot take \{'projection': 'linear'\}: these options shape the trained"):
        hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(tmp_path), "sliced_relu", projection="linear")
    with pytest.raises(ValueError, match="converted to 'sliced_relu'; it cannot be prepared for 'rela'"):
        hf_sliced_attn.prepare_config(AutoConfig.from_pretrained(tmp_path), "rela")


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_config_object_is_not_poisoned(model_type, mechanism):
    """Building a plugin model and then a softmax baseline from the same config object works, and the
    baseline runs softmax: no plugin module, and the outputs of a model from an untouched config."""
    config = tiny_config(model_type)
    converted = AutoModel.from_config(config, attn_implementation=mechanism)
    assert hf_sliced_attn.modules_to_save(converted)
    assert not hasattr(config, hf_sliced_attn.CONFIG_KEY)
    torch.manual_seed(0)
    baseline = AutoModel.from_config(config, attn_implementation="eager").eval()
    torch.manual_seed(0)
    untouched = AutoModel.from_config(tiny_config(model_type), attn_implementation="eager").eval()
    assert hf_sliced_attn.modules_to_save(baseline) == []
    assert all(getattr(m, LAYER_MODE_ATTR, None) is None for m in attention_modules(baseline))
    ids = tokens(2, 9)
    with torch.no_grad():
        torch.testing.assert_close(baseline(input_ids=ids).last_hidden_state, untouched(input_ids=ids).last_hidden_state)
    assert "hf_sliced_attn" not in baseline.config.to_dict()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_layer_list_converts_exactly_those_layers(model_type):
    """``layers=[0, 2]`` of three: the first and last attention modules (in layer order) run the mechanism and
    have its modules, the middle one keeps softmax, on every architecture, those whose attention modules are
    built without their layer index (DistilBERT: its layer stack numbers them) included."""
    config = hf_sliced_attn.prepare_config(tiny_config(model_type), "sliced_relu", layers=[0, 2])
    model = AutoModel.from_config(config)
    layers = attention_modules(model)
    assert [m.layer_idx for m in layers] == [0, 1, 2]
    assert [getattr(m, LAYER_MODE_ATTR) for m in layers] == ["sliced_relu", "softmax", "sliced_relu"]
    assert [hasattr(m, "sliced_projection") for m in layers] == [True, False, True]
