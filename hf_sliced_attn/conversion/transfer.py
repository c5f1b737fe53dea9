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

:func:`train_stage` runs one stage on an existing :class:`accelerate.Accelerator`
(CPU, one GPU or ``accelerate launch`` with several processes) over the deterministic stream of
:class:`~hf_sliced_attn.conversion.training_text.Batches` (no labels); :mod:`.pipeline` runs the stages and the
choice of softmax layers between them. With a checkpoint folder it saves a
resumable state every ``checkpoint_every`` steps (:meth:`accelerate.Accelerator.save_state`:
model, optimizer, scheduler, RNG); Ctrl-C saves one before leaving.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoModel, PreTrainedModel

from ..integration import lora_target_modules, modules_to_save
from .attention_taps import converted_layers, masked_cosine_distance, masked_mse, tap_attention
from .settings import TransferConfig
from .training_text import Batches

logger = logging.getLogger(__name__)

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




def build_teacher(model: str) -> PreTrainedModel:
    """The softmax checkpoint ``model`` (a folder or Hub id) with sdpa attention, frozen, in eval mode."""
    return AutoModel.from_pretrained(model, attn_implementation="sdpa").eval().requires_grad_(False)


def with_transfer_lora(student: PreTrainedModel, r: int, alpha: int, seed: int) -> PeftModel:
    """``student`` with LoRA (rank ``r``) on its attention projections and the mechanism's modules
    trainable (peft ``modules_to_save``): what attention transfer trains. Everything else is frozen.
    The adapters' initial weights are drawn from ``seed`` (torch's generators are seeded with it), so a
    transfer's start does not depend on what the caller drew before (a task model's head, say).
    peft edits ``student`` in place, so a model that holds it (a task model around its encoder)
    gets the trained weights after ``merge_and_unload()``."""
    lora = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=lora_target_modules(student),
                      modules_to_save=modules_to_save(student))
    torch.manual_seed(seed)
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


def saved_progress(checkpoint_dir: Path, fingerprint: str) -> dict[str, Any]:
    """The state saved with the latest checkpoint of ``checkpoint_dir`` (its ``step``: the steps it completed).

    Raises FileNotFoundError when there is none, and ValueError when it was made with other settings
    (another ``fingerprint``)."""
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{checkpoint_dir} holds no checkpoint to resume from.")
    saved = json.loads((checkpoint / "progress.json").read_text())
    if saved.get("fingerprint") != fingerprint:
        raise ValueError(f"The checkpoint in {checkpoint_dir} was made with other settings; resume with the same "
                         "settings, or start again from scratch.")
    return saved


@contextmanager
def transfer_mode(accelerator: Accelerator) -> Iterator[None]:
    """``accelerator`` set up for a transfer, whoever built it, then restored.

    A transfer steps its schedule once per optimizer step (not once per process), scales no loss for
    gradient accumulation, and tells DDP that stage 1 leaves parameters unused (the LoRA after the last
    attention). accelerate fixes these when the Accelerator is built and has no call to change them, so
    they are set here, in the one place, and put back afterwards; the transfer's prepared objects are
    dropped on leaving, so that whatever is prepared next (fine-tuning) starts clean.
    """
    saved = accelerator.step_scheduler_with_optimizer, accelerator.gradient_accumulation_steps, accelerator.ddp_handler
    accelerator.step_scheduler_with_optimizer, accelerator.gradient_accumulation_steps = False, 1
    accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    try:
        yield
    finally:
        accelerator.step_scheduler_with_optimizer, accelerator.gradient_accumulation_steps = saved[:2]
        accelerator.ddp_handler = saved[2]
        accelerator.free_memory()


def train_stage(
    accelerator: Accelerator, teacher: nn.Module, student: nn.Module, batches: Batches, config: TransferConfig,
    stage: int, *, completed: int, resume: bool = False, checkpoint_dir: Path | None = None,
    state: dict[str, Any], on_step: Callable[[int, float], None] | None = None, description: str = "attention transfer",
) -> nn.Module:
    """Train ``student`` (its trainable parameters) to reproduce ``teacher`` (frozen) over stage ``stage``
    (1 or 2) of ``config``: from global step ``completed`` to the stage's end, one batch of ``batches``
    a step (its own slice on each process). Both models sit on ``accelerator.device``, in eval mode.

    ``resume``: first load the latest checkpoint of ``checkpoint_dir`` (``completed`` is its step). With
    ``checkpoint_dir``, a resumable state (model, optimizer, scheduler, RNG, and ``state``, JSON-ready)
    is saved every ``config.checkpoint_every`` steps, at the stage's end, and on KeyboardInterrupt
    (Ctrl-C, or raised by ``on_step``), which then propagates. ``on_step(step, loss)`` is called after
    each optimizer step (``step`` counts from 1). ``state["elapsed_s"]`` gains the training time.
    Returns the trained student (unwrapped).
    """
    first, stop = (0, config.steps) if stage == 1 else (config.steps, config.total_steps)
    started, elapsed = time.perf_counter(), state.get("elapsed_s", 0.0)
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: config.lr_factor(first + step))
    objective = DistillationObjective(student, teacher, converted_layers(student), config.stage2_loss)
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)
    if resume:
        accelerator.load_state(str(latest_checkpoint(checkpoint_dir)))
        logger.info("Resuming attention transfer from step %d.", completed)

    def checkpoint() -> None:
        state["elapsed_s"] = elapsed + time.perf_counter() - started
        if checkpoint_dir is not None:
            _save_checkpoint(accelerator, checkpoint_dir, completed, state)

    progress = tqdm(total=stop - first, initial=completed - first, desc=f"{description} (stage {stage})",
                    disable=not accelerator.is_local_main_process)
    try:
        for batch in batches.stream(completed, accelerator.process_index, accelerator.num_processes):
            if completed >= stop:
                break
            loss = _step(accelerator, objective, optimizer, scheduler, batch, stage)
            completed += 1
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.4g}")
            if completed % config.checkpoint_every == 0 and completed < stop:
                checkpoint()
            if on_step is not None:
                on_step(completed, loss)
    except KeyboardInterrupt:
        checkpoint()
        logger.warning("Interrupted at step %d of %d%s.", completed, config.total_steps,
                       f"; checkpoint saved in {checkpoint_dir}" if checkpoint_dir else "")
        raise
    finally:
        progress.close()
    checkpoint()  # the stage's finished state: if what follows fails, resuming only redoes that
    return accelerator.unwrap_model(objective).student


def _step(accelerator: Accelerator, objective: nn.Module, optimizer: torch.optim.Optimizer,
          scheduler: torch.optim.lr_scheduler.LRScheduler, batch: dict[str, torch.Tensor], stage: int) -> float:
    """One optimizer step on ``batch``; returns its loss. Ctrl-C waits until the update is whole."""
    batch = {k: v.to(accelerator.device) for k, v in batch.items()}
    optimizer.zero_grad()
    loss = objective(batch, stage=stage)
    accelerator.backward(loss)
    with _deferred_interrupt():
        accelerator.clip_grad_norm_(objective.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    return loss.item()
