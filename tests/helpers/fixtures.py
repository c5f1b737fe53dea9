"""Fixtures every test folder gets (the root conftest imports them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

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
