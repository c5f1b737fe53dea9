"""Attention transfer: train a converted student to reproduce its softmax teacher.

The LoLCATs recipe (Zhang et al., 2024), for encoders:

* **Stage 1.** The teacher is the frozen original model (sdpa). The student has the same
  weights with the new attention; only what the caller left trainable (the mechanism's
  modules and LoRA on the attention projections, for a conversion) trains. In one forward
  pass per model, forward hooks record every attention module's output (BERT family:
  (B, T, H·D) before ``attention.output.dense``; ModernBERT: (B, T, hidden) after ``Wo``).
  The student's hooks hand the teacher's output on to the next layer (teacher forcing), so
  each converted layer learns to match the teacher's attention output for the teacher's own
  inputs; the loss is the mean over converted layers of the MSE over real tokens.
* **Stage 2** (optional). End-to-end distillation of the final hidden states (MSE or
  1 - cosine over real tokens), the student running freely.

:func:`transfer_attention` runs both stages on an existing :class:`accelerate.Accelerator`
(CPU, one GPU or ``accelerate launch`` with several processes) over any iterable of
batches (``input_ids``/``attention_mask``, no labels). With a checkpoint folder it saves a
resumable state every ``checkpoint_every`` steps (:meth:`accelerate.Accelerator.save_state`:
model, optimizer, scheduler, RNG); Ctrl-C saves one before leaving.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..integration import lora_target_modules, modules_to_save
from .attention_taps import converted_layers, masked_cosine_distance, masked_mse, tap_attention

logger = logging.getLogger(__name__)

STAGE2_LOSSES = ("mse", "cosine")


@dataclass(frozen=True)
class TransferSchedule:
    """The numbers of a transfer: steps, learning rates and the stage-2 loss."""

    steps: int = 300
    """Stage 1 optimizer steps."""
    stage2_steps: int = 0
    """Stage 2 optimizer steps (0 skips it)."""
    lr: float = 1e-3
    stage2_lr: float = 1e-4
    warmup_steps: int = 10
    stage2_loss: str = "mse"
    checkpoint_every: int = 100
    """Save a resumable state every N steps (with a checkpoint folder)."""

    def __post_init__(self) -> None:
        if self.stage2_loss not in STAGE2_LOSSES:
            raise ValueError(f"Unknown stage-2 loss {self.stage2_loss!r}: the valid ones are {list(STAGE2_LOSSES)}.")
        for name in ("steps", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.stage2_steps < 0 or self.warmup_steps < 0:
            raise ValueError("stage2_steps and warmup_steps must be >= 0.")

    @property
    def total_steps(self) -> int:
        return self.steps + self.stage2_steps

    def stage(self, step: int) -> int:
        """1 or 2: the stage of step ``step`` (counted from 0)."""
        return 1 if step < self.steps else 2

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` at ``step``: linear warmup then cosine decay in each stage;
        stage 2 starts again from ``stage2_lr``."""
        if step < self.steps:
            start, length, peak = 0, self.steps, 1.0
        else:
            start, length, peak = self.steps, self.stage2_steps, self.stage2_lr / self.lr
        position = step - start
        warmup = min(self.warmup_steps, max(length // 10, 1))
        if position < warmup:
            return peak * (position + 1) / (warmup + 1)
        progress = (position - warmup) / max(length - warmup, 1)
        return peak * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def attention_transfer_loss(teacher: nn.Module, student: nn.Module, batch: dict[str, torch.Tensor],
                            layers: Sequence[int]) -> torch.Tensor:
    """Stage 1: mean over ``layers`` of the MSE between the student's and teacher's attention outputs."""
    with torch.no_grad(), tap_attention(teacher) as targets:
        teacher(**batch)
    with tap_attention(student, replace_with=targets) as predictions:
        student(**batch)
    mask = batch["attention_mask"]
    return torch.stack([masked_mse(predictions[i], targets[i], mask) for i in layers]).mean()


def hidden_state_loss(teacher: nn.Module, student: nn.Module, batch: dict[str, torch.Tensor],
                      kind: str) -> torch.Tensor:
    """Stage 2: MSE or 1 - cosine between the final hidden states (B, T, C), over real tokens."""
    with torch.no_grad():
        target = teacher(**batch).last_hidden_state
    prediction = student(**batch).last_hidden_state
    loss = masked_mse if kind == "mse" else masked_cosine_distance
    return loss(prediction, target, batch["attention_mask"])


class DistillationObjective(nn.Module):
    """The training loss of a conversion as one module: ``forward(batch, stage)`` returns the loss.

    Under several processes accelerate wraps it in DistributedDataParallel, which then sees
    the loss as the output of its forward, and so finds which trainable parameters the loss
    reaches (stage 1 leaves the LoRA after the attention unused). Wrapping the student alone
    would not do: in stage 1 its output does not depend on its attention, whose outputs are
    replaced by the teacher's (teacher forcing). The frozen teacher is not a submodule, so
    neither DDP nor the checkpoints carry it.
    """

    def __init__(self, student: nn.Module, teacher: nn.Module, layers: Sequence[int], stage2_loss: str) -> None:
        super().__init__()
        self.student = student
        self.__dict__["teacher"] = teacher
        self.layers, self.stage2_loss = list(layers), stage2_loss

    def forward(self, batch: dict[str, torch.Tensor], stage: int) -> torch.Tensor:
        if stage == 1:
            return attention_transfer_loss(self.teacher, self.student, batch, self.layers)
        return hidden_state_loss(self.teacher, self.student, batch, self.stage2_loss)




def with_transfer_lora(student: PreTrainedModel, r: int, alpha: int) -> PeftModel:
    """``student`` with LoRA (rank ``r``) on its attention projections and the mechanism's modules
    trainable (peft ``modules_to_save``): what attention transfer trains. Everything else is frozen.
    peft edits ``student`` in place, so a model that holds it (a task model around its encoder)
    gets the trained weights after ``merge_and_unload()``."""
    lora = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_target_modules(student),
                      modules_to_save=modules_to_save(student))
    return get_peft_model(student, lora)


@contextmanager
def _deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C until the block ends, so an optimizer update is never cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


def _save_checkpoint(accelerator: Accelerator, root: Path, step: int, state: dict[str, Any]) -> None:
    """Write ``root/step-N`` (model, optimizer, scheduler, RNG; ``progress.json``), then point
    ``root/latest`` at it and drop older ones. A crash mid-write leaves the previous checkpoint valid."""
    target = root / f"step-{step:07d}"
    accelerator.save_state(str(target))
    if accelerator.is_main_process:
        (target / "progress.json").write_text(json.dumps({**state, "step": step}))
        pointer = root / "latest.tmp"
        pointer.write_text(target.name)
        pointer.replace(root / "latest")
        for old in root.glob("step-*"):
            if old != target:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint saved in ``root``, or None."""
    pointer = root / "latest"
    return root / pointer.read_text().strip() if pointer.exists() else None


def _resume(accelerator: Accelerator, checkpoint_dir: Path, state: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Load the latest checkpoint of ``checkpoint_dir``: (its saved state, the steps it completed)."""
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{checkpoint_dir} holds no checkpoint to resume from.")
    saved = json.loads((checkpoint / "progress.json").read_text())
    if saved.get("fingerprint") != state.get("fingerprint"):
        raise ValueError(f"The checkpoint in {checkpoint_dir} was made with other options; resume with the same "
                         "options, or start again from scratch.")
    accelerator.load_state(str(checkpoint))
    completed = saved.pop("step")
    logger.info("Resuming attention transfer from %s (step %d).", checkpoint, completed)
    return saved, completed


def transfer_attention(
    accelerator: Accelerator, teacher: nn.Module, student: nn.Module, batches: Iterable[dict[str, torch.Tensor]],
    schedule: TransferSchedule, *, checkpoint_dir: Path | None = None, resume: bool = False,
    state: dict[str, Any] | None = None, on_step: Callable[[int, float], None] | None = None,
    description: str = "attention transfer",
) -> tuple[nn.Module, dict[str, Any]]:
    """Train ``student`` (its trainable parameters) to reproduce ``teacher`` (frozen), ``schedule``'s
    steps over ``batches`` (one batch a step, on this process; the first ``step`` batches are
    skipped on resuming). Both models must sit on ``accelerator.device``, in eval mode.

    With ``checkpoint_dir``, a resumable state is saved there every ``schedule.checkpoint_every``
    steps, at the end, and on KeyboardInterrupt (Ctrl-C, or raised by ``on_step``), which then
    propagates; ``state`` (JSON-ready, with a ``fingerprint`` of what fixes the trajectory) is
    saved with it, and ``resume=True`` continues from the latest one if its fingerprint matches.
    ``on_step(step, loss)`` is called after each optimizer step (``step`` counts from 1).

    Returns the trained student (unwrapped) and the state, its ``elapsed_s`` counting the
    training time over every run.
    """
    started = time.perf_counter()
    state = {"elapsed_s": 0.0, **(state or {})}
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=schedule.lr,
                                  weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.lr_factor)
    objective = DistillationObjective(student, teacher, converted_layers(student), schedule.stage2_loss)
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    completed = 0
    if resume:
        state, completed = _resume(accelerator, checkpoint_dir, state)

    def checkpoint() -> None:
        if checkpoint_dir is not None:
            _save_checkpoint(accelerator, checkpoint_dir, completed,
                             {**state, "elapsed_s": state["elapsed_s"] + time.perf_counter() - started})

    progress = tqdm(total=schedule.total_steps, initial=completed, desc=description,
                    disable=not accelerator.is_local_main_process)
    try:
        for batch in itertools.islice(iter(batches), completed, schedule.total_steps):
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            optimizer.zero_grad()
            loss = objective(batch, stage=schedule.stage(completed))
            accelerator.backward(loss)
            with _deferred_interrupt():
                accelerator.clip_grad_norm_(objective.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                completed += 1
            progress.update(1)
            progress.set_postfix(stage=schedule.stage(completed - 1), loss=f"{loss.item():.4g}")
            if completed % schedule.checkpoint_every == 0 and completed < schedule.total_steps:
                checkpoint()
            if on_step is not None:
                on_step(completed, loss.item())
    except KeyboardInterrupt:
        checkpoint()
        logger.warning("Interrupted at step %d of %d%s.", completed, schedule.total_steps,
                       f"; checkpoint saved in {checkpoint_dir}" if checkpoint_dir else "")
        raise
    finally:
        progress.close()
    if completed < schedule.total_steps:
        raise ValueError(f"The batches ran out after {completed} of {schedule.total_steps} transfer steps.")
    checkpoint()  # the finished state: if what follows fails, resuming only redoes that
    state["elapsed_s"] += time.perf_counter() - started
    return accelerator.unwrap_model(objective).student, state
