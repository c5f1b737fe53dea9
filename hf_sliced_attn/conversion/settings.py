"""The settings of an attention transfer, in one dataclass, and the one function that fills them in.

Attention transfer turns a softmax checkpoint into one with a new attention in two stages, as
LoLCATs does (Zhang et al., arXiv 2410.10254): stage 1 trains each converted layer to reproduce
its softmax layer's output on the teacher's own inputs (teacher forcing); stage 2, optional,
distils the final hidden states end to end. LoRA on the attention projections and the
mechanism's own modules train; everything else stays frozen.

:class:`TransferConfig` holds every setting, each field with its help text (the CLI's and the
recipe's flags are generated from them, :mod:`hf_sliced_attn.arguments`). Its defaults are
generic; each mechanism declares its measured best per purpose (``Mechanism.transfer_defaults``:
``"convert"`` for ``hf-sliced-attn convert``, ``"finetune"`` for the shorter transfer before
fine-tuning), and :func:`resolve_transfer_config` is the one place they are applied.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..mechanisms import MECHANISMS
from ..mechanisms.base import PURPOSES, Purpose, check_purpose

__all__ = ["PURPOSES", "STAGE2_LOSSES", "Purpose", "TransferConfig", "mechanism_transfer_defaults",
           "resolve_transfer_config"]
STAGE2_LOSSES = ("mse", "cosine")


@dataclass(frozen=True)
class TransferConfig:
    """How attention is transferred from a softmax checkpoint, and which layers keep softmax."""

    steps: int = field(default=300, metadata={"help": (
        "Stage 1 optimizer steps: each converted layer learns to reproduce its softmax layer's output on the "
        "teacher's inputs. 0: no transfer (the new attention starts from its fresh initialisation).")})
    stage2_steps: int = field(default=0, metadata={"help": (
        "Stage 2 optimizer steps after stage 1: end-to-end distillation of the final hidden states; 0 skips it.")})
    stage2_loss: str = field(default="mse", metadata={"help": "Stage 2 loss on the final hidden states.",
                                                      "choices": STAGE2_LOSSES})
    lr: float = field(default=1e-3, metadata={"help": "Stage 1 peak learning rate (warmup, then cosine decay)."})
    stage2_lr: float = field(default=1e-4, metadata={"help": "Stage 2 peak learning rate."})
    warmup_steps: int = field(default=10, metadata={"help": "Warmup steps of each stage (at most a tenth of it)."})
    lora_r: int = field(default=8, metadata={"help": "Rank of the LoRA on the attention projections (merged after)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha of those adapters."})
    batch_size: int | None = field(default=None, metadata={"help": (
        "Passages per transfer step and process. Not given: convert uses 8, the recipe its training batch size.")})
    keep_softmax_layers: int = field(default=0, metadata={"help": (
        "After stage 1, the converted layers whose attention error on training text stays largest go back to the "
        "checkpoint's softmax attention, this many of them (saved in config.json as an explicit layers list); "
        "stage 2 then trains the hybrid. 0: every selected layer stays converted. Not given: the mechanism's "
        "measured best, at most half the converted layers, and 0 when the layers to convert are listed or the model "
        "has local (sliding-window) layers, as ModernBERT: there a kept layer would be a global softmax layer."),
        "unprefixed": True})
    ranking_texts: int = field(default=64, metadata={"help": (
        "Training passages on which the layers are ranked for keep_softmax_layers.")})
    checkpoint_every: int = field(default=100, metadata={"help": "Save a resumable state every N transfer steps."})

    def __post_init__(self) -> None:
        if self.stage2_loss not in STAGE2_LOSSES:
            raise ValueError(f"Unknown stage-2 loss {self.stage2_loss!r}: the valid ones are {list(STAGE2_LOSSES)}.")
        for name in ("steps", "stage2_steps", "warmup_steps", "keep_softmax_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        for name in ("lora_r", "lora_alpha", "ranking_texts", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}.")
        if self.lr <= 0 or self.stage2_lr <= 0:
            raise ValueError(f"lr and stage2_lr must be > 0, got {self.lr} and {self.stage2_lr}.")
        if self.stage2_steps and not self.steps:
            raise ValueError("stage2_steps follows stage 1: it needs steps > 0.")
        if self.keep_softmax_layers and not self.steps:
            raise ValueError(f"keep_softmax_layers {self.keep_softmax_layers} ranks the layers by their attention "
                             "error after stage 1: it needs steps > 0 (or list the layers to convert instead).")

    @property
    def total_steps(self) -> int:
        return self.steps + self.stage2_steps

    def stage(self, step: int) -> int:
        """1 or 2: the stage of step ``step`` (counted from 0)."""
        return 1 if step < self.steps else 2

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` at ``step``: linear warmup then cosine decay to 5% in each stage; stage 2
        starts again from ``stage2_lr``."""
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

    def trajectory(self) -> dict[str, Any]:
        """The settings that fix the training trajectory (what a resumed transfer must share)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "checkpoint_every"}


def mechanism_transfer_defaults(mechanism: str, purpose: Purpose) -> dict[str, Any]:
    """The settings ``mechanism`` measured best for ``purpose``, over :class:`TransferConfig`'s own defaults."""
    check_purpose(purpose)
    generic = {f.name: f.default for f in dataclasses.fields(TransferConfig)}
    return {**generic, **MECHANISMS.get_mechanism(mechanism).transfer_defaults.get(purpose, {})}


def resolve_transfer_config(mechanism: str, purpose: Purpose, given: Mapping[str, Any], *,
                            converted_layers: int, layers_listed: bool,
                            has_local_layers: bool) -> TransferConfig:
    """The transfer settings of a run: those ``given`` over the mechanism's measured best for ``purpose``.

    ``keep_softmax_layers`` not given is the mechanism's default, capped at half of the
    ``converted_layers`` the model has, and 0 when the user listed the layers to convert
    (``layers_listed``) or when the model ``has_local_layers`` (sliding-window layers, as ModernBERT's):
    such a model is built for long inputs, and a layer kept on softmax would be a global softmax layer
    that makes it quadratic again (a count given explicitly still applies). Raises ValueError for an
    unknown setting, a bad value, a given count with a layer list, or a count that would leave no layer
    converted.
    """
    unknown = sorted(set(given) - {f.name for f in dataclasses.fields(TransferConfig)})
    if unknown:
        raise ValueError(f"Unknown transfer setting(s) {unknown}: the valid ones are "
                         f"{[f.name for f in dataclasses.fields(TransferConfig)]}.")
    settings = {**mechanism_transfer_defaults(mechanism, purpose), **given}
    keep = given.get("keep_softmax_layers")
    if keep and layers_listed:
        raise ValueError("keep_softmax_layers chooses the layers to keep on softmax itself: give it or a list of "
                         "layers to convert, not both (a layers list keeps every listed layer converted).")
    if keep is None:
        settings["keep_softmax_layers"] = 0 if layers_listed or has_local_layers or not settings["steps"] else min(
            settings["keep_softmax_layers"], converted_layers // 2)
    elif keep >= max(converted_layers, 1):
        raise ValueError(f"keep_softmax_layers {keep} leaves none of the {converted_layers} converted layers "
                         "converted: keep fewer (0 keeps them all converted).")
    return TransferConfig(**settings)
