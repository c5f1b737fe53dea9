"""The registry is the one list of mechanisms: registering a third one is enough for transformers,
conversion options, cards and the command line to offer it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch
from torch import nn
from transformers import AutoModel
from transformers import initialization as init

import hf_sliced_attn
from hf_sliced_attn import MECHANISMS, Mechanism, MechanismConfig
from hf_sliced_attn.cli import build_parser
from hf_sliced_attn.mechanisms import Paper, PluginModule

from tests.helpers.models import tiny_config


@dataclass
class MeanConfig(MechanismConfig):
    mechanism: ClassVar[str] = "mean_value"
    strength: float = field(default=1.0, metadata={"help": "how much of the mean value each head takes"})


class HeadGain(PluginModule):
    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.empty(num_heads))

    def init_weights(self, initializer_range: float) -> None:
        init.ones_(self.gain)


CALLS: list[int] = []


def _attend(module, query, key, value, key_padding_mask, scaling, sliding_window):
    """Every query gets gain_h * the mean of the valid values: (B, H, T, D) -> (B, T, H, D)."""
    CALLS.append(1)
    valid = torch.ones(value.shape[0], value.shape[2]) if key_padding_mask is None else key_padding_mask.float()
    mean = (value * valid[:, None, :, None]).sum(2, keepdim=True) / valid.sum(-1)[:, None, None, None]
    out = mean.expand_as(value) * module.mean_gain.gain[:, None, None]
    return out.transpose(1, 2)


def _build(options: MeanConfig, num_heads: int, head_dim: int, local: bool) -> dict[str, nn.Module]:
    return {"mean_gain": HeadGain(num_heads)}


MEAN_VALUE = Mechanism(
    config_class=MeanConfig, module_names=("mean_gain",), build_modules=_build, attend=_attend,
    title="Mean-value attention", tag="mean-value", paper=Paper(arxiv_id="0000.00000", authors="Nobody"),
    description="Every token takes the mean value.",
)


@pytest.fixture
def third_mechanism():
    hf_sliced_attn.register_mechanism(MEAN_VALUE)
    yield MEAN_VALUE
    MECHANISMS.unregister(MEAN_VALUE.name)


def test_one_registration_gives_a_working_from_pretrained(third_mechanism, tmp_path):
    assert list(MECHANISMS) == ["sliced_relu", "rela", "mean_value"]
    model = AutoModel.from_config(tiny_config("bert"), attn_implementation="mean_value").eval()
    assert hf_sliced_attn.modules_to_save(model) == ["mean_gain"]
    assert torch.equal(model.encoder.layer[0].attention.self.mean_gain.gain, torch.ones(4))
    CALLS.clear()
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
    assert len(CALLS) == 3  # one call per layer
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert reloaded.config._attn_implementation == "mean_value"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).last_hidden_state, out)


def test_one_registration_gives_cli_choices_and_flags(third_mechanism):
    args = build_parser().parse_args(
        ["convert", "--model", "m", "--attn", "mean_value", "--text", "t.txt", "--output", "o", "--strength", "0.5"]
    )
    assert (args.attn, args.strength) == ("mean_value", 0.5)


def test_unregistered_mechanism_is_not_offered():
    assert "mean_value" not in MECHANISMS
    with pytest.raises(SystemExit):
        build_parser().parse_args(["convert", "--model", "m", "--attn", "mean_value", "--text", "t", "--output", "o"])


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        MECHANISMS.register(MECHANISMS["rela"])
