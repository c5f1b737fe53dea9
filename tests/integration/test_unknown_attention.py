"""A mistyped attn_implementation gets transformers' list of implementations and the plugin's mechanisms, with the
closest valid name (issue #23)."""

from __future__ import annotations

import pytest
from transformers import AutoModel, RobertaConfig

import hf_sliced_attn


def _config() -> RobertaConfig:
    return RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=100)


@pytest.mark.parametrize(("typed", "meant"), [("sliced_reluu", "sliced_relu"), ("rella", "rela"), ("sdpaa", "sdpa")])
def test_a_typo_names_the_mechanisms_and_the_closest_name(typed, meant):
    with pytest.raises(ValueError) as error:
        AutoModel.from_config(_config(), attn_implementation=typed)
    message = str(error.value)
    assert f'"{typed}"' in message and "sdpa" in message  # transformers' own words stay
    assert all(f'"{name}"' in message for name in hf_sliced_attn.MECHANISMS), message
    assert message.endswith(f'Did you mean attn_implementation="{meant}"?'), message


def test_a_name_like_none_lists_the_mechanisms_without_a_guess():
    with pytest.raises(ValueError) as error:
        AutoModel.from_config(_config(), attn_implementation="xyzzy")
    assert all(f'"{name}"' in str(error.value) for name in hf_sliced_attn.MECHANISMS)
    assert "Did you mean" not in str(error.value)


def test_valid_names_still_load():
    for name in ("sliced_relu", "rela", "eager", "sdpa"):
        assert AutoModel.from_config(_config(), attn_implementation=name).config._attn_implementation == name
