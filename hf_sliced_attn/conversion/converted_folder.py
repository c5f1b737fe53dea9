"""A converted folder: saving it, loading it through the plugin, and checking that it still
reproduces the outputs recorded when it was made (``fidelity.json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from peft import PeftModel
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .fidelity import embed
from ..mechanisms import CONFIG_KEY, MECHANISMS

REPORT_NAME = "fidelity.json"
"""The fidelity report in a converted folder (also the reference outputs that ``push`` checks)."""
CHECKPOINT_DIR = "checkpoints"
"""Where resumable training states live inside an output folder while a conversion runs."""
REFERENCE_TEXTS = 4
"""How many held-out texts the report keeps, with their embeddings, to check a folder later."""


def load_converted(folder: str | Path) -> PreTrainedModel | PeftModel:
    """Load a converted folder through the plugin, in eval mode: a checkpoint (as the class in
    its ``config.architectures``), or a peft adapter (``adapter_config.json``) on its base model,
    with the plugin config saved beside it.

    Raises ValueError if any weight is missing or unexpected, or if the mechanism was not selected.
    """
    folder = Path(folder)
    if (folder / "adapter_config.json").exists():
        adapter = json.loads((folder / "adapter_config.json").read_text())
        config = AutoConfig.from_pretrained(folder)
        base = AutoModel.from_pretrained(adapter["base_model_name_or_path"], config=config)
        model = PeftModel.from_pretrained(base, folder)
    else:
        architectures = AutoConfig.from_pretrained(folder).architectures or []
        model_class = getattr(transformers, architectures[0], AutoModel) if architectures else AutoModel
        model, info = model_class.from_pretrained(folder, output_loading_info=True)
        problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if problems:
            raise ValueError(f"{folder} does not load cleanly: {problems}")
    config = model.config
    mechanism = getattr(config, CONFIG_KEY, {}).get("mechanism")
    if mechanism not in MECHANISMS or config._attn_implementation != mechanism:
        raise ValueError(
            f"{folder} did not select a plugin attention on load (attn_implementation="
            f"{config._attn_implementation!r}, {CONFIG_KEY}={getattr(config, CONFIG_KEY, None)!r})."
        )
    return model.eval()


def reference_outputs(model: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                      max_length: int) -> dict[str, Any]:
    """Texts and their embeddings, kept in the report so that the folder can be checked later."""
    return {"texts": list(texts), "max_length": max_length,
            "embeddings": embed(model, tokenizer, texts, max_length).tolist()}


def check_reference(folder: str | Path, *, atol: float = 1e-4) -> float:
    """Load ``folder`` and compare its embeddings of the report's reference texts with the
    stored ones. Returns the largest absolute difference; raises ValueError above ``atol``."""
    folder = Path(folder)
    report_path = folder / REPORT_NAME
    if not report_path.exists():
        raise ValueError(f"{folder} has no {REPORT_NAME}: it was not written by `hf-sliced-attn convert`.")
    reference = json.loads(report_path.read_text())["reference"]
    model = load_converted(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    got = embed(model, tokenizer, reference["texts"], reference["max_length"])
    difference = float((got - torch.tensor(reference["embeddings"], dtype=torch.float64)).abs().max())
    if difference > atol:
        raise ValueError(
            f"{folder} loads, but its outputs differ from the ones recorded at conversion time by {difference:.3g} "
            f"(tolerance {atol}): the folder was modified or does not load as it was saved."
        )
    return difference



def save_converted(student: PeftModel, tokenizer: PreTrainedTokenizerBase, output: Path, *, adapter_only: bool,
                   reference_texts: Sequence[str], max_length: int) -> dict[str, Any]:
    """Merge the LoRA of ``student`` (or keep it as an adapter), save it with the tokenizer to ``output``,
    reload it through the plugin and check that it gives the trained model's outputs.

    Returns the reference outputs for the report (:func:`reference_outputs` of the reloaded model).
    """
    expected = embed(student, tokenizer, reference_texts, max_length)
    if adapter_only:
        student.save_pretrained(output)
        student.base_model.model.config.save_pretrained(output)
    else:
        student.merge_and_unload().save_pretrained(output)
    tokenizer.save_pretrained(output)
    reference = reference_outputs(load_converted(output), tokenizer, reference_texts, max_length)
    drift = float((torch.tensor(reference["embeddings"], dtype=torch.float64) - expected).abs().max())
    if drift > 1e-4:
        raise RuntimeError(f"The saved model in {output} gives outputs {drift:.3g} away from the trained one.")
    return reference
