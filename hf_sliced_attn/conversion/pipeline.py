"""Attention transfer and the choice of softmax layers: the one call behind ``hf-sliced-attn convert``
and the GLUE recipe.

:func:`transfer_and_select` runs, on the caller's student (the checkpoint with the new attention
and LoRA on its attention projections, :func:`~hf_sliced_attn.conversion.transfer.with_transfer_lora`):

1. stage 1 on every converted layer (:func:`~hf_sliced_attn.conversion.transfer.train_stage`);
2. with ``keep_softmax_layers`` = k > 0, the k converted layers whose attention error on ``ranking_texts``
   training passages stays largest go back to softmax, in place
   (:func:`~hf_sliced_attn.conversion.hybrid.restore_softmax_layers`);
3. stage 2, when the config has one, on the resulting model.

Stage 1 teacher-forces each layer, so the layers that stay converted keep what they learned when
their neighbours go back to softmax, and stage 2 then trains the model that is kept.

The whole call is resumable: its checkpoints (in ``checkpoint_dir``) record the global step and the
layers chosen, and ``resume=True`` continues from the latest, whichever stage it was in.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..mechanisms import CONFIG_KEY
from .attention_taps import converted_layers
from .fidelity import measure_fidelity
from .hybrid import restore_softmax_layers, worst_layers
from .settings import TransferConfig
from .training_text import MIN_HELDOUT_TEXTS, Batches
from .transfer import saved_progress, train_stage, transfer_mode


FIDELITY_MEASURES = ("attention_relative_error_mean", "hidden_state_cosine", "embedding_cosine", "pairwise_spearman")
"""The fidelity measures a summary keeps, before and after."""


@dataclass
class TransferRecord:
    """What a transfer did: its settings, the layers it left converted and on softmax, and its time."""

    config: TransferConfig
    converted_layers: list[int]
    """Layers that run the new attention after the choice."""
    softmax_layers: list[int]
    """Converted layers returned to softmax (empty with ``keep_softmax_layers`` 0)."""
    ranking_error: dict[str, float] | None
    """Attention error per converted layer after stage 1, on the ranking passages (None without a choice)."""
    wall_time_s: float
    """Training and ranking time, over every resumed run."""
    fidelity: dict[str, Any] | None = None
    """On the caller's ``fidelity_texts``: ``{"texts": N, "before": ..., "after": ...}``, each a
    :func:`~hf_sliced_attn.conversion.fidelity.measure_fidelity` report (before: the fresh student, every
    layer converted; after: the layers kept converted). None with fewer than ``MIN_HELDOUT_TEXTS``."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe_fidelity(self) -> str:
        """One line: each fidelity measure before -> after, or that none was measured."""
        if self.fidelity is None:
            return "no fidelity measured"
        changes = ", ".join(f"{name} {self.fidelity['before'][name]:.4f} -> {self.fidelity['after'][name]:.4f}"
                            for name in FIDELITY_MEASURES)
        return f"fidelity on {self.fidelity['texts']} held-out texts: {changes}"

    def summary(self) -> dict[str, Any]:
        """The flat record a fine-tuning run keeps (all_results.json, its model card): the steps, the main
        settings, the time, and the layers returned to softmax with the ranking behind them."""
        config = self.config
        summary = {"steps": config.steps, "stage2_steps": config.stage2_steps, "lr": config.lr,
                   "lora_r": config.lora_r, "batch_size": config.batch_size, "wall_time_s": round(self.wall_time_s, 2)}
        if self.softmax_layers:
            summary["softmax_layers"] = {"layers": self.softmax_layers, "attention_relative_error": self.ranking_error,
                                         "ranking_texts": config.ranking_texts}
        if self.fidelity is not None:
            summary["fidelity_texts"] = self.fidelity["texts"]
            summary.update({name: {"before": self.fidelity["before"][name], "after": self.fidelity["after"][name]}
                            for name in FIDELITY_MEASURES})
        return summary


def transfer_fingerprint(config: TransferConfig, student: PeftModel, batches: Batches, context: Mapping[str, Any],
                         accelerator: Accelerator) -> str:
    """A hash of what fixes a transfer's trajectory: its settings, the student's mechanism and options, the batches'
    seed, the caller's ``context`` (JSON-ready: where the model and the text come from, the lengths) and the
    processes and precision."""
    fixed = {"config": config.trajectory(), "attention": student.config._attn_implementation,
             "options": getattr(student.config, CONFIG_KEY, None), "seed": batches.seed,
             "context": dict(context), "processes": accelerator.num_processes,
             "precision": str(accelerator.mixed_precision)}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def transfer_and_select(
    accelerator: Accelerator, teacher: nn.Module, student: PeftModel, batches: Batches, config: TransferConfig, *,
    tokenizer: PreTrainedTokenizerBase, ranking_texts: Sequence[str | tuple[str, str]], max_length: int,
    context: Mapping[str, Any], fidelity_texts: Sequence[str | tuple[str, str]] = (),
    checkpoint_dir: Path | None = None, resume: bool = False,
    on_step: Callable[[int, float], None] | None = None, description: str = "attention transfer",
) -> tuple[PeftModel, TransferRecord]:
    """Transfer ``teacher``'s attention to ``student`` and keep softmax on the layers that transfer worst.

    ``teacher`` (frozen, sdpa) and ``student`` sit on ``accelerator.device``; ``batches`` gives each step's
    passages; ``ranking_texts`` (at least ``config.ranking_texts`` when available, training text) rank the
    layers; ``fidelity_texts`` (held-out) measure the student before and after (:attr:`TransferRecord.fidelity`);
    ``context`` (where the model and text come from) joins ``config``, the student's options and the batches'
    seed in the fingerprint that a resumed run must match. Returns the
    trained student (still peft-wrapped: the caller merges or saves the adapter) and the record.
    Raises FileNotFoundError (``resume`` without a checkpoint) or ValueError (other settings).
    """
    fingerprint = transfer_fingerprint(config, student, batches, context, accelerator)
    state = saved_progress(checkpoint_dir, fingerprint) if resume else {"fingerprint": fingerprint, "step": 0}
    completed = state.pop("step")
    measurable = len(fidelity_texts) >= MIN_HELDOUT_TEXTS

    def fidelity() -> dict[str, Any]:
        return measure_fidelity(teacher, student.eval(), tokenizer, list(fidelity_texts),
                                layers=converted_layers(student), max_length=max_length)

    before = fidelity() if measurable else None
    with transfer_mode(accelerator):
        if completed <= config.steps:
            student = train_stage(accelerator, teacher, student.eval(), batches, config, 1, completed=completed,
                                  resume=resume, checkpoint_dir=checkpoint_dir, state=state, on_step=on_step,
                                  description=description)
    if config.keep_softmax_layers and "softmax_layers" not in state:
        started = time.perf_counter()
        errors = measure_fidelity(teacher, student.eval(), tokenizer, list(ranking_texts)[:config.ranking_texts],
                                  layers=converted_layers(student), max_length=max_length)["attention_relative_error"]
        state["ranking_error"] = broadcast_object_list([errors])[0]  # every process keeps the same layers
        state["softmax_layers"] = worst_layers(state["ranking_error"], config.keep_softmax_layers)
        state["elapsed_s"] = state.get("elapsed_s", 0.0) + time.perf_counter() - started
    kept = state.get("softmax_layers", [])
    remaining = restore_softmax_layers(student, kept) if kept else converted_layers(student)
    if config.stage2_steps:
        with transfer_mode(accelerator):
            student = train_stage(accelerator, teacher, student.eval(), batches, config, 2,
                                  completed=max(completed, config.steps), resume=resume and completed > config.steps,
                                  checkpoint_dir=checkpoint_dir, state=state, on_step=on_step, description=description)
    record = TransferRecord(config, remaining, kept, state.get("ranking_error"), state.get("elapsed_s", 0.0),
                            {"texts": len(fidelity_texts), "before": before, "after": fidelity()} if measurable else None)
    return student.eval(), record
