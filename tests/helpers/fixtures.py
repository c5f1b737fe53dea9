"""Fixtures every test folder gets (the root conftest imports them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hf_sliced_attn import MECHANISMS

from tests.helpers.models import tiny_config


@pytest.fixture
def softmax_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised (seed 0) softmax checkpoint of the tiny config of the model type
    ``request.param`` (``@pytest.mark.parametrize("softmax_checkpoint", [...], indirect=True)``),
    saved with a sequence classification head, so that it loads as ``AutoModel`` too."""
    model_type = request.param
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(model_type)
    AutoModelForSequenceClassification.from_config(tiny_config(model_type)).save_pretrained(path)
    return path


@pytest.fixture
def rela_keeps_two_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """ReLA's measured best before fine-tuning as it stood before issue #24 (2 layers kept on softmax), for the
    tests of how a mechanism's default count of softmax layers applies (none of the shipped defaults keeps one)."""
    rela = MECHANISMS["rela"]
    finetune = {**rela.transfer_defaults["finetune"], "keep_softmax_layers": 2}
    monkeypatch.setitem(MECHANISMS._mechanisms, "rela",
                        dataclasses.replace(rela, transfer_defaults={**rela.transfer_defaults, "finetune": finetune}))
