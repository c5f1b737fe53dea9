"""Fixtures of the conversion tests: tiny checkpoints and one finished conversion, shared per session."""

from __future__ import annotations

import pytest
import torch

from hf_sliced_attn.conversion.settings import TransferConfig
from hf_sliced_attn.convert import ConvertOptions, convert

from tests.helpers.models import HELDOUT_TEXT, TRAIN_TEXT, tiny_checkpoint
from tests.helpers.threads import one_thread  # noqa: F401  (autouse: every conversion test on one thread)


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory):
    return tiny_checkpoint("roberta", tmp_path_factory.mktemp("tiny-roberta"), num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_electra(tmp_path_factory):
    """A tiny ELECTRA discriminator, its embeddings (16 wide) projected to the hidden size (32)."""
    return tiny_checkpoint("electra", tmp_path_factory.mktemp("tiny-electra"), num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_distilbert(tmp_path_factory):
    """A tiny DistilBERT: its attention modules are numbered by its layer stack, not built with their index."""
    return tiny_checkpoint("distilbert", tmp_path_factory.mktemp("tiny-distilbert"), num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_modernbert(tmp_path_factory):
    return tiny_checkpoint("modernbert", tmp_path_factory.mktemp("tiny-modernbert"), global_attn_every_n_layers=2)


def tiny_options(model, output, **overrides) -> ConvertOptions:
    """Options for a quick conversion of a tiny model on the shipped text (stage 1 only, small LoRA,
    every selected layer converted; the mechanisms' own transfer defaults are for real checkpoints)."""
    transfer = dict(steps=40, stage2_steps=0, lora_r=8, lora_alpha=16, keep_softmax_layers=0, checkpoint_every=1000)
    transfer.update({name: overrides.pop(name) for name in list(overrides) if name in TransferConfig.__dataclass_fields__})
    settings = dict(model=str(model), mechanism="sliced_relu", output_dir=str(output), text=[TRAIN_TEXT],
                    heldout_text=[HELDOUT_TEXT], transfer=transfer, seed=0)
    return ConvertOptions(**{**settings, **overrides})


@pytest.fixture(scope="session")
def converted_roberta(tiny_roberta, tmp_path_factory):
    """A finished sliced_relu conversion of the tiny RoBERTa (the card names a Hub base model)."""
    torch.set_num_threads(1)
    output = tmp_path_factory.mktemp("converted") / "tiny-roberta-sliced-relu"
    return convert(tiny_options(tiny_roberta, output, base_model_id="FacebookAI/roberta-base"))
