"""The bump kernel (``kernel="bump"``) end to end on every architecture: called, padding-invariant,
saved and reloaded, its bandwidth initialised on conversion."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel

import hf_sliced_attn
from hf_sliced_attn.attention import LAYER_MODE_ATTR, attention_function
from hf_sliced_attn.mechanisms import SLICED_RELU
from hf_sliced_attn.mechanisms.sliced_relu import SlicedBandwidth, SlicedOutputAffine, SlicedProjection
from hf_sliced_attn.mechanisms.sliced_relu import attention as sliced_attention
from hf_sliced_attn.ops.naive import sliced_relu_bump_reference, value_mean_reference
from tests.helpers.models import MODEL_TYPES, VOCAB, tiny_config

OPTIONS = [
    {"kernel": "bump"},
    {"kernel": "bump", "num_slices": 2, "projection": "mlp", "affine_output": True},
]


def _bump_model(path, **options):
    config = AutoConfig.from_pretrained(path)
    layers = "all" if config.model_type == "modernbert" else "global"  # ModernBERT: the windowed kernel too
    return AutoModel.from_pretrained(path, config=hf_sliced_attn.prepare_config(config, "sliced_relu", layers=layers,
                                                                                 **options)).eval()


def _ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("softmax_checkpoint", MODEL_TYPES, indirect=True)
def test_the_bump_kernel_runs_and_ignores_padding(softmax_checkpoint, options, monkeypatch):
    model = _bump_model(softmax_checkpoint, **options)
    calls = {"full": 0, "windowed": 0}
    for name, key in (("sliced_relu_bump", "full"), ("windowed_sliced_relu_bump", "windowed")):
        op = getattr(sliced_attention, name)
        monkeypatch.setattr(sliced_attention, name,
                            lambda *a, _op=op, _key=key, **k: calls.__setitem__(_key, calls[_key] + 1) or _op(*a, **k))
    ids, mask = _ids(2, 17), torch.ones(2, 17, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).last_hidden_state
        alone = model(input_ids=ids[1:, :9]).last_hidden_state
    torch.testing.assert_close(batched[1:, :9], alone, atol=1e-5, rtol=1e-5)
    local = model.config.model_type == "modernbert"
    assert calls["full"] > 0 and (calls["windowed"] > 0) == local


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("softmax_checkpoint", MODEL_TYPES, indirect=True)
def test_save_and_load_select_the_bump_kernel_again(softmax_checkpoint, options, tmp_path):
    model = _bump_model(softmax_checkpoint, **options)
    bandwidths = [m for m in model.modules() if isinstance(m, SlicedBandwidth)]
    assert bandwidths and all(torch.equal(m.theta, torch.zeros_like(m.theta)) for m in bandwidths)  # initialised
    with torch.no_grad():
        for m in bandwidths:
            m.theta.uniform_(-1.0, 1.0)
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.to_dict()["hf_sliced_attn"]["kernel"] == "bump"
    assert reloaded.config._attn_implementation == "sliced_relu"
    ids = _ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).last_hidden_state,
                                   model(input_ids=ids).last_hidden_state, rtol=0, atol=0)
    assert {"sliced_bandwidth", "sliced_projection"} <= set(hf_sliced_attn.modules_to_save(model))


@pytest.mark.parametrize("sliding_window", [None, 4])
def test_a_bump_layer_is_the_kernel_with_its_bandwidth_scaled_plus_the_mean_value(sliding_window):
    torch.manual_seed(0)
    batch, heads, length, dim, slices = 2, 3, 12, 8, 2
    layer = torch.nn.Module()
    setattr(layer, LAYER_MODE_ATTR, "sliced_relu")
    layer.sliced_projection = SlicedProjection(heads, dim, slices)
    layer.sliced_bandwidth = SlicedBandwidth(heads, slices)
    layer.sliced_output = SlicedOutputAffine(heads)
    with torch.no_grad():
        layer.sliced_projection.directions.normal_()
        layer.sliced_bandwidth.theta.uniform_(-1.0, 2.0)
        layer.sliced_output.gain.copy_(torch.tensor([2.0, 0.5, -1.0]))
        layer.sliced_output.mean_weight.copy_(torch.tensor([1.0, 0.0, 3.0]))
    query, key, value = (torch.randn(batch, heads, length, dim) for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[1, 7:] = False
    out, _ = attention_function(SLICED_RELU)(layer, query, key, value, mask, sliding_window=sliding_window)
    with torch.no_grad():
        s, t = layer.sliced_projection(query, key)
        bandwidth = torch.nn.functional.softplus(layer.sliced_bandwidth.theta.double()) + 1e-4
    kernel = sliced_relu_bump_reference(s, t, value.double(), bandwidth, mask, sliding_window=sliding_window)
    mean = value_mean_reference(value.double(), mask, sliding_window=sliding_window)
    expected = (layer.sliced_output.gain.double()[:, None, None] * kernel
                + layer.sliced_output.mean_weight.double()[:, None, None] * mean).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match=r"kernel='gauss' is not valid: use one of \['relu', 'bump'\]"):
        hf_sliced_attn.prepare_config(tiny_config("bert"), "sliced_relu", kernel="gauss")


def test_the_card_names_the_kernel():
    options = SLICED_RELU.make_config(kernel="bump", num_slices=2)
    assert "bump kernel" in options.describe()
