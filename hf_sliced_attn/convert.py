"""Attention transfer: convert a softmax encoder checkpoint to ``sliced_relu`` or ``rela``.

The LoLCATs recipe (Zhang et al., 2024), for encoders:

* **Stage 1.** The teacher is the frozen original model (sdpa). The student has the same
  weights with the new attention; only the new modules (peft ``modules_to_save``) and LoRA
  on the attention projections train. In one forward pass per model, forward hooks record
  every attention module's output (BERT family: (B, T, H·D) before
  ``attention.output.dense``; ModernBERT: (B, T, hidden) after ``Wo``). The student's
  hooks hand the teacher's output on to the next layer (teacher forcing), so each
  converted layer learns to match the teacher's attention output for the teacher's own
  inputs; the loss is the mean over converted layers of the MSE over real tokens.
* **Stage 2** (optional). End-to-end distillation of the final hidden states (MSE or
  1 - cosine over real tokens), the student running freely.
* Then the LoRA is merged (or kept as an adapter), the checkpoint, the tokenizer, the
  fidelity report (``fidelity.json``, measured on held-out text) and the model card are
  written to the output folder.

Training runs through :class:`accelerate.Accelerator` (CPU, one GPU or ``accelerate
launch`` with several processes). The batch of step ``s`` is a function of the seed and
``s`` alone, and :meth:`accelerate.Accelerator.save_state` keeps the model, optimizer,
scheduler and RNG states, so an interrupted run resumed from its last checkpoint ends in
the same state as an uninterrupted one. Ctrl-C saves a checkpoint before leaving.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import set_seed
from peft import LoraConfig, PeftModel, get_peft_model
from scipy.stats import spearmanr
from torch import nn
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .attention import LAYER_MODE_ATTR, SOFTMAX
from .config import CONFIG_KEY, MECHANISMS
from .distributed import cpu_process_group_kwargs
from .integration import lora_target_modules, modules_to_save, prepare_config
from .models import spec_for

logger = logging.getLogger(__name__)

REPORT_NAME = "fidelity.json"
"""The fidelity report in a converted folder (also the reference outputs that ``push`` checks)."""
CHECKPOINT_DIR = "checkpoints"
"""Where resumable training states live inside the output folder while a conversion runs."""
STAGE2_LOSSES = ("mse", "cosine")
REFERENCE_TEXTS = 4
"""How many held-out texts the report keeps, with their embeddings, to check a folder later."""
SLICED_RELU_OPTIONS = ("num_slices", "projection", "affine_output")
"""The :class:`ConvertOptions` fields that are sliced_relu options of the same names."""
SLICED_RELU_CONVERSION_DEFAULTS: dict[str, Any] = {"projection": "mlp", "affine_output": True}
"""The sliced_relu options a conversion uses unless told otherwise. The paper's plain formula
(a linear projection, no gain, centred values only) loses the mean value and half the weight
of a softmax layer; the authors' MLP projection and the learned gain and mean value
(:class:`hf_sliced_attn.config.SlicedReluConfig`) bring all-MiniLM-L6-v2 from an embedding
cosine of 0.93 to above 0.95 (README, "Conversion fidelity")."""


@dataclass
class ConvertOptions:
    """Everything a conversion depends on (the CLI's ``convert`` flags)."""

    model: str
    """Path or Hub id of the softmax checkpoint (BERT, RoBERTa, XLM-R or ModernBERT)."""
    mechanism: str
    """"sliced_relu" or "rela"."""
    output_dir: str
    text: list[str]
    """Training text: text files (one passage per line), saved datasets or dataset names."""
    heldout_text: list[str] | None = None
    """Held-out text for the report; None: split ``heldout_fraction`` off ``text``."""
    layers: str | list[int] = "global"
    num_slices: int | None = None
    """sliced_relu only: M directions per head (None: the plugin's default)."""
    projection: str | None = None
    """sliced_relu only: "linear" or "mlp" (None: "mlp", see :data:`SLICED_RELU_CONVERSION_DEFAULTS`)."""
    affine_output: bool | None = None
    """sliced_relu only: learned gain and mean value per head (None: True)."""
    text_column: str = "text"
    text_split: str = "train"
    heldout_fraction: float = 0.1
    steps: int = 300
    """Stage 1 optimizer steps."""
    stage2_steps: int = 0
    stage2_loss: str = "mse"
    lr: float = 1e-3
    stage2_lr: float = 1e-4
    warmup_steps: int = 10
    lora_r: int = 8
    lora_alpha: int = 16
    batch_size: int = 8
    """Per process."""
    max_length: int = 128
    checkpoint_every: int = 100
    seed: int = 0
    adapter_only: bool = False
    overwrite: bool = False
    resume: bool = False
    base_model_id: str | None = None
    """The Hub id to name in the model card when ``model`` is a local folder."""

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"Unknown attention {self.mechanism!r}: the valid ones are {list(MECHANISMS)}.")
        given = [name for name in SLICED_RELU_OPTIONS if getattr(self, name) is not None]
        if given and self.mechanism != "sliced_relu":
            raise ValueError(f"{', '.join(given)} apply to sliced_relu only.")
        if self.stage2_loss not in STAGE2_LOSSES:
            raise ValueError(f"Unknown stage-2 loss {self.stage2_loss!r}: the valid ones are {list(STAGE2_LOSSES)}.")
        for name in ("steps", "batch_size", "max_length", "checkpoint_every", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.stage2_steps < 0 or self.warmup_steps < 0:
            raise ValueError("stage2_steps and warmup_steps must be >= 0.")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}.")

    @property
    def total_steps(self) -> int:
        return self.steps + self.stage2_steps

    def mechanism_options(self) -> dict[str, Any]:
        """The options handed to :func:`hf_sliced_attn.prepare_config`."""
        options: dict[str, Any] = {"layers": self.layers}
        if self.mechanism == "sliced_relu":
            options.update(SLICED_RELU_CONVERSION_DEFAULTS)
        for name in SLICED_RELU_OPTIONS:
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options

    def fingerprint(self) -> str:
        """A hash of the options that determine the training trajectory (resuming checks it)."""
        excluded = {"output_dir", "overwrite", "resume", "checkpoint_every", "base_model_id"}
        relevant = {k: v for k, v in dataclasses.asdict(self).items() if k not in excluded}
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class ConversionResult:
    output_dir: Path
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- text


def load_texts(sources: Sequence[str], *, column: str = "text", split: str = "train") -> list[str]:
    """Passages from text files (one per non-empty line), saved datasets (``save_to_disk``
    folders) or dataset names/folders for :func:`datasets.load_dataset` (``column`` of ``split``)."""
    texts: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_file():
            texts += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            continue
        texts += [str(t).strip() for t in _dataset_column(source, column, split) if t and str(t).strip()]
    return texts


def _dataset_column(source: str, column: str, split: str) -> list[str]:
    import datasets

    path = Path(source)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            data = data[split]
    else:
        try:
            data = datasets.load_dataset(source, split=split)
        except Exception as error:  # noqa: BLE001 - datasets raises many types; the message is what matters
            raise ValueError(f"Cannot read text from {source!r}: not a file, and not a dataset ({error}).") from error
    if column not in data.column_names:
        raise ValueError(f"{source!r} has no column {column!r} (columns: {data.column_names}); pass --text-column.")
    return data[column]


def split_heldout(
    texts: list[str], heldout: list[str] | None, *, fraction: float, seed: int
) -> tuple[list[str], list[str], str | None]:
    """(train, heldout, a note saying how the held-out text was split off, or None if it was given).
    Held-out text must not overlap the training text.

    Without ``heldout``, a ``fraction`` of the distinct passages is split off, chosen by a
    seeded shuffle, so the same inputs always give the same split.
    """
    if not texts:
        raise ValueError("The training text is empty: give text files with one passage per line, or a dataset.")
    if heldout is not None:
        if len(heldout) < 2:
            raise ValueError("The held-out text needs at least 2 passages (the report correlates pairs).")
        overlap = set(texts) & set(heldout)
        if overlap:
            example = next(iter(overlap))
            raise ValueError(
                f"{len(overlap)} held-out passage(s) also appear in the training text (e.g. {example!r}): "
                "the fidelity report must be measured on unseen text."
            )
        return texts, heldout, None
    distinct = list(dict.fromkeys(texts))
    count = max(2, round(fraction * len(distinct)))
    if len(distinct) - count < 1:
        raise ValueError(f"Too little text to split off a held-out part ({len(distinct)} distinct passages).")
    order = list(range(len(distinct)))
    random.Random(seed).shuffle(order)
    held = {distinct[i] for i in order[:count]}
    note = (
        f"no held-out text given: {count} of {len(distinct)} distinct passages of the training text "
        f"(fraction {fraction}, seed {seed}) were split off and not trained on"
    )
    return [t for t in texts if t not in held], [distinct[i] for i in sorted(order[:count])], note


class Batches:
    """The deterministic stream of training batches.

    Passages are drawn epoch by epoch in a seeded permutation; the global batch of step
    ``s`` covers stream positions [s·G, (s+1)·G) with G = batch_size · num_processes, and
    process p takes its slice. A step's batch depends on (seed, s) only: resuming at step
    s needs no other data state.
    """

    def __init__(self, encodings: list[dict[str, list[int]]], tokenizer: PreTrainedTokenizerBase,
                 batch_size: int, seed: int) -> None:
        self.encodings, self.tokenizer, self.batch_size, self.seed = encodings, tokenizer, batch_size, seed
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.encodings))
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.encodings), generator=generator)
        return int(self._order[offset])

    def get(self, step: int, process_index: int = 0, num_processes: int = 1) -> dict[str, torch.Tensor]:
        """The (B, T) ``input_ids``/``attention_mask`` (and any other tokenizer fields) of ``step`` on this process."""
        start = (step * num_processes + process_index) * self.batch_size
        rows = [self.encodings[self._index(p)] for p in range(start, start + self.batch_size)]
        return self.tokenizer.pad(rows, return_tensors="pt")


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> list[dict[str, list[int]]]:
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)
    return [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]


# --------------------------------------------------------------------------- attention taps


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of a (possibly peft- or DDP-wrapped) supported model, in layer order."""
    config = model.config if hasattr(model, "config") else model.module.config
    classes = spec_for(config.model_type).attention_classes
    return [module for module in model.modules() if isinstance(module, classes)]


def converted_layers(student: nn.Module) -> list[int]:
    """Indices (into :func:`attention_modules`) of the layers that run the new mechanism."""
    return [i for i, m in enumerate(attention_modules(student)) if getattr(m, LAYER_MODE_ATTR, SOFTMAX) != SOFTMAX]


@contextmanager
def tap_attention(model: nn.Module, replace_with: Sequence[torch.Tensor] | None = None) -> Iterator[list[torch.Tensor]]:
    """Record each attention module's output tensor in the yielded list (one per layer, in order).

    With ``replace_with`` (tensors of the same shapes, same order), each module's output is
    replaced by the given one, so the rest of the model sees it (teacher forcing).
    """
    outputs: list[torch.Tensor] = []
    handles = []
    for index, module in enumerate(attention_modules(model)):
        def hook(module, args, output, index=index):
            outputs.append(output[0])
            if replace_with is not None:
                return (replace_with[index], *output[1:])
            return None

        handles.append(module.register_forward_hook(hook))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def _token_mask(attention_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 mask -> (B, T, 1) float in ``like``'s dtype."""
    return attention_mask.to(like.dtype).unsqueeze(-1)


def masked_mse(student: torch.Tensor, teacher: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real tokens of (B, T, C) tensors."""
    mask = _token_mask(attention_mask, student)
    return ((student - teacher).pow(2) * mask).sum() / (mask.sum() * student.shape[-1])


def masked_cosine_distance(student: torch.Tensor, teacher: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """1 - mean cosine similarity over the real tokens of (B, T, C) tensors."""
    cosine = nn.functional.cosine_similarity(student, teacher, dim=-1)
    mask = attention_mask.to(cosine.dtype)
    return 1.0 - (cosine * mask).sum() / mask.sum()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, C) hidden states -> (B, C) mean over real tokens."""
    mask = _token_mask(attention_mask, hidden)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


# --------------------------------------------------------------------------- losses


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


def lr_factor(step: int, options: ConvertOptions) -> float:
    """Multiplier of ``options.lr`` at ``step``: linear warmup then cosine decay in each stage;
    stage 2 starts again from ``stage2_lr``."""
    if step < options.steps:
        start, length, peak = 0, options.steps, 1.0
    else:
        start, length, peak = options.steps, options.stage2_steps, options.stage2_lr / options.lr
    position = step - start
    warmup = min(options.warmup_steps, max(length // 10, 1))
    if position < warmup:
        return peak * (position + 1) / (warmup + 1)
    progress = (position - warmup) / max(length - warmup, 1)
    return peak * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- fidelity


@torch.no_grad()
def measure_fidelity(teacher: nn.Module, student: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                     *, layers: Sequence[int], max_length: int, batch_size: int = 32) -> dict[str, Any]:
    """Compare ``student`` with ``teacher`` on ``texts`` (both in eval mode).

    Returns ``attention_relative_error`` (per layer in ``layers``: ‖s − t‖ / ‖t‖ over all
    real tokens, each layer fed the teacher's inputs), ``hidden_state_cosine`` (mean over
    real tokens of the cosine between final hidden states), ``embedding_cosine`` (mean over
    texts of the cosine between mean-pooled embeddings) and ``pairwise_spearman`` (Spearman
    correlation between the teacher's and the student's cosine similarities over all pairs
    of texts).
    """
    device = next(student.parameters()).device
    error_sq = torch.zeros(len(layers), dtype=torch.float64)
    reference_sq = torch.zeros(len(layers), dtype=torch.float64)
    token_cosine, token_count = 0.0, 0
    teacher_embeddings, student_embeddings = [], []
    encodings = tokenize(tokenizer, texts, max_length)
    for start in range(0, len(encodings), batch_size):
        padded = tokenizer.pad(encodings[start:start + batch_size], return_tensors="pt")
        batch = {k: v.to(device) for k, v in padded.items()}
        mask = batch["attention_mask"]
        with tap_attention(teacher) as targets:
            teacher_hidden = teacher(**batch).last_hidden_state
        with tap_attention(student, replace_with=targets) as predictions:
            student(**batch)
        for row, layer in enumerate(layers):
            token = _token_mask(mask, targets[layer])
            error_sq[row] += ((predictions[layer] - targets[layer]).pow(2) * token).sum().double().cpu()
            reference_sq[row] += (targets[layer].pow(2) * token).sum().double().cpu()
        student_hidden = student(**batch).last_hidden_state
        cosine = nn.functional.cosine_similarity(student_hidden, teacher_hidden, dim=-1)
        token_cosine += float((cosine * mask).sum())
        token_count += int(mask.sum())
        teacher_embeddings.append(mean_pool(teacher_hidden, mask).double().cpu())
        student_embeddings.append(mean_pool(student_hidden, mask).double().cpu())
    teacher_pooled, student_pooled = torch.cat(teacher_embeddings), torch.cat(student_embeddings)
    errors = (error_sq / reference_sq.clamp(min=1e-30)).sqrt().tolist()
    return {
        "attention_relative_error": {str(layer): e for layer, e in zip(layers, errors)},
        "attention_relative_error_mean": sum(errors) / max(len(errors), 1),
        "hidden_state_cosine": token_cosine / token_count,
        "embedding_cosine": float(nn.functional.cosine_similarity(student_pooled, teacher_pooled, dim=-1).mean()),
        "pairwise_spearman": _pairwise_spearman(teacher_pooled, student_pooled),
    }


def _pairwise_spearman(teacher: torch.Tensor, student: torch.Tensor) -> float:
    """Spearman correlation of the two models' cosine similarities over all pairs i < j of (N, C) embeddings."""
    def pair_cosines(x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.normalize(x, dim=-1)
        rows, cols = torch.triu_indices(len(x), len(x), offset=1)
        return (x @ x.T)[rows, cols]

    return float(spearmanr(pair_cosines(teacher).numpy(), pair_cosines(student).numpy()).statistic)


@torch.no_grad()
def embed(model: nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> torch.Tensor:
    """(N, C) mean-pooled final hidden states of ``texts``, in float64."""
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in tokenizer(list(texts), padding=True, truncation=True,
                                                   max_length=max_length, return_tensors="pt").items()}
    return mean_pool(model(**batch).last_hidden_state, batch["attention_mask"]).double().cpu()


# --------------------------------------------------------------------------- loading


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


# --------------------------------------------------------------------------- checkpoints


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


def _latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    return root / pointer.read_text().strip() if pointer.exists() else None


def _prepare_output(options: ConvertOptions, accelerator: Accelerator) -> Path | None:
    """Check the output folder; returns the checkpoint to resume from, if any.

    Every process checks the same folder before any of them changes it (so all of them fail,
    or none); then the main one empties it (``overwrite``) while the others wait.
    """
    output = Path(options.output_dir)
    checkpoint = _latest_checkpoint(output / CHECKPOINT_DIR)
    if options.resume and checkpoint is None:
        raise FileNotFoundError(f"--resume: {output / CHECKPOINT_DIR} holds no checkpoint to resume from.")
    occupied = not options.resume and output.exists() and any(output.iterdir())
    if occupied and not options.overwrite:
        hint = " (it holds an interrupted conversion: pass --resume to continue it)" if checkpoint else ""
        raise FileExistsError(f"The output folder {output} already exists and is not empty{hint}; "
                              "pass --overwrite to replace it.")
    accelerator.wait_for_everyone()
    if occupied and accelerator.is_main_process:
        shutil.rmtree(output)
    accelerator.wait_for_everyone()
    return checkpoint if options.resume else None


# --------------------------------------------------------------------------- conversion


def build_student(options: ConvertOptions, config: PretrainedConfig) -> tuple[PreTrainedModel, PreTrainedModel]:
    """(teacher, student): ``options.model`` with sdpa, and with the new attention (both in eval
    mode: no dropout, so a step depends on its batch only). ``config`` is the checkpoint's config."""
    config = prepare_config(config, options.mechanism, **options.mechanism_options())
    teacher = AutoModel.from_pretrained(options.model, attn_implementation="sdpa").eval().requires_grad_(False)
    student = AutoModel.from_pretrained(options.model, config=config).eval()
    return teacher, student


def convert(options: ConvertOptions, on_step: Callable[[int, float], None] | None = None) -> ConversionResult:
    """Run the conversion described by ``options`` and write the output folder.

    ``on_step(step, loss)`` is called after each optimizer step (``step`` counts from 1).
    On KeyboardInterrupt (Ctrl-C, or raised by ``on_step``) a checkpoint of the last
    completed step is saved in ``output_dir/checkpoints`` and the interrupt propagates;
    ``resume=True`` continues from it.
    """
    started = time.perf_counter()
    config = AutoConfig.from_pretrained(options.model)
    spec_for(config.model_type)  # an unsupported architecture fails here, listing the supported ones
    texts = load_texts(options.text, column=options.text_column, split=options.text_split)
    heldout = (load_texts(options.heldout_text, column=options.text_column, split=options.text_split)
               if options.heldout_text else None)
    if options.heldout_text and not heldout:
        raise ValueError(f"The held-out text {options.heldout_text} is empty.")
    train_texts, heldout_texts, heldout_note = split_heldout(texts, heldout, fraction=options.heldout_fraction,
                                                             seed=options.seed)
    accelerator = Accelerator(step_scheduler_with_optimizer=False, **cpu_process_group_kwargs(),
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    resume_from = _prepare_output(options, accelerator)
    output = Path(options.output_dir)
    checkpoints = output / CHECKPOINT_DIR
    set_seed(options.seed)
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    teacher, student = build_student(options, config)
    layers = converted_layers(student)
    lora = LoraConfig(r=options.lora_r, lora_alpha=options.lora_alpha, lora_dropout=0.0,
                      target_modules=lora_target_modules(student), modules_to_save=modules_to_save(student))
    student = get_peft_model(student, lora)
    teacher.to(accelerator.device)
    student.to(accelerator.device)

    state: dict[str, Any] = {"fingerprint": options.fingerprint(), "elapsed_s": 0.0}
    if resume_from is None and accelerator.is_main_process:
        state["before"] = measure_fidelity(teacher, student, tokenizer, heldout_texts, layers=layers,
                                           max_length=options.max_length)

    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=options.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, options))
    objective = DistillationObjective(student, teacher, layers, options.stage2_loss)
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)

    completed = 0
    if resume_from is not None:
        saved = json.loads((resume_from / "progress.json").read_text())
        if saved["fingerprint"] != state["fingerprint"]:
            raise ValueError(f"The checkpoint in {checkpoints} was made with other options; resume with the same "
                             "options, or start again with --overwrite.")
        accelerator.load_state(str(resume_from))
        state, completed = saved, saved.pop("step")
        logger.info("Resuming from %s (step %d of %d).", resume_from, completed, options.total_steps)

    batches = Batches(tokenize(tokenizer, train_texts, options.max_length), tokenizer, options.batch_size, options.seed)

    def checkpoint() -> None:
        _save_checkpoint(accelerator, checkpoints, completed,
                         {**state, "elapsed_s": state["elapsed_s"] + time.perf_counter() - started})

    progress = tqdm(total=options.total_steps, initial=completed, desc=f"convert to {options.mechanism}",
                    disable=not accelerator.is_local_main_process)
    try:
        while completed < options.total_steps:
            batch = {k: v.to(accelerator.device) for k, v in
                     batches.get(completed, accelerator.process_index, accelerator.num_processes).items()}
            optimizer.zero_grad()
            loss = objective(batch, stage=1 if completed < options.steps else 2)
            accelerator.backward(loss)
            with _deferred_interrupt():
                accelerator.clip_grad_norm_(objective.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                completed += 1
            progress.update(1)
            progress.set_postfix(stage=1 if completed <= options.steps else 2, loss=f"{loss.item():.4g}")
            if completed % options.checkpoint_every == 0 and completed < options.total_steps:
                checkpoint()
            if on_step is not None:
                on_step(completed, loss.item())
    except KeyboardInterrupt:
        checkpoint()
        logger.warning("Interrupted at step %d of %d; checkpoint saved in %s. Run again with --resume to continue.",
                       completed, options.total_steps, checkpoints)
        raise
    finally:
        progress.close()
    checkpoint()  # the finished state: if saving the result fails, --resume only redoes the saving

    if accelerator.is_main_process:
        student = accelerator.unwrap_model(objective).student
        report = _finish(options, student, teacher, tokenizer, layers, state["before"], train_texts, heldout_texts,
                         heldout_note, accelerator.num_processes)
        report["wall_time_s"] = state["elapsed_s"] + time.perf_counter() - started
        _write_outputs(options, report, output)
        shutil.rmtree(checkpoints)
    accelerator.wait_for_everyone()
    report = json.loads((output / REPORT_NAME).read_text())
    return ConversionResult(output, report, [heldout_note] if heldout_note else [])


def _finish(options: ConvertOptions, student: PeftModel, teacher: PreTrainedModel,
            tokenizer: PreTrainedTokenizerBase, layers: list[int], before: dict[str, Any],
            train_texts: list[str], heldout_texts: list[str], heldout_note: str | None,
            num_processes: int) -> dict[str, Any]:
    """Merge (or keep the adapter), save, reload through the plugin, and build the report."""
    output = Path(options.output_dir)
    student.eval()
    after = measure_fidelity(teacher, student, tokenizer, heldout_texts, layers=layers, max_length=options.max_length)
    reference_texts = heldout_texts[:REFERENCE_TEXTS]
    expected = embed(student, tokenizer, reference_texts, options.max_length)
    if options.adapter_only:
        student.save_pretrained(output)
        student.base_model.model.config.save_pretrained(output)
    else:
        student.merge_and_unload().save_pretrained(output)
    tokenizer.save_pretrained(output)
    reloaded = load_converted(output)
    reference = reference_outputs(reloaded, tokenizer, reference_texts, options.max_length)
    drift = float((torch.tensor(reference["embeddings"], dtype=torch.float64) - expected).abs().max())
    if drift > 1e-4:
        raise RuntimeError(f"The saved model in {output} gives outputs {drift:.3g} away from the trained one.")
    metrics = ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman")
    return {
        "base_model": options.base_model_id or options.model,
        "mechanism": options.mechanism,
        "mechanism_options": getattr(reloaded.config, CONFIG_KEY),
        "adapter_only": options.adapter_only,
        "converted_layers": layers,
        "attention_relative_error": {"before": before["attention_relative_error"],
                                     "after": after["attention_relative_error"],
                                     "mean_before": before["attention_relative_error_mean"],
                                     "mean_after": after["attention_relative_error_mean"]},
        **{name: {"before": before[name], "after": after[name]} for name in metrics},
        "heldout": {"num_texts": len(heldout_texts), "source": options.heldout_text or heldout_note},
        "training": {"num_texts": len(train_texts), "text": options.text,
                     "datasets": [source for source in options.text if not Path(source).exists()],
                     "stage1_steps": options.steps,
                     "stage2_steps": options.stage2_steps, "stage2_loss": options.stage2_loss, "lr": options.lr,
                     "stage2_lr": options.stage2_lr, "lora_r": options.lora_r, "batch_size": options.batch_size,
                     "max_length": options.max_length, "seed": options.seed, "num_processes": num_processes},
        "reference": reference,
    }


def _write_outputs(options: ConvertOptions, report: dict[str, Any], output: Path) -> None:
    from .hub import base_model_license, render_conversion_card

    report["license"] = base_model_license(options.model)
    (output / REPORT_NAME).write_text(json.dumps(report, indent=2))
    render_conversion_card(output, report=report)
