"""``hf-sliced-attn convert``: a softmax encoder checkpoint to ``sliced_relu`` or ``rela``, by attention transfer.

The steps, each in its own module: training text and the held-out split (:mod:`.text`), the
student built with the new attention and LoRA on the attention projections (here), the
transfer itself (:mod:`.transfer`), the fidelity report on held-out text (:mod:`.fidelity`),
and the converted folder with its card (:mod:`.artifacts`, :mod:`.cards`).

Training runs through :class:`accelerate.Accelerator` (CPU, one GPU or ``accelerate
launch`` with several processes). The batch of step ``s`` is a function of the seed and
``s`` alone, and the transfer's checkpoints keep the model, optimizer, scheduler and RNG
states, so an interrupted run resumed from its last checkpoint ends in the same state as an
uninterrupted one. Ctrl-C saves a checkpoint before leaving.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import set_seed
from peft import PeftModel
from transformers import AutoModel, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from .conversion.converted_folder import CHECKPOINT_DIR, REFERENCE_TEXTS, REPORT_NAME, save_converted
from .conversion.cards import base_model_license, render_conversion_card
from .distributed import cpu_process_group_kwargs
from .conversion.sentence_transformers_files import copy_sentence_transformers_files, sentence_transformers_folder
from .conversion.fidelity import measure_fidelity
from .conversion.hybrid import worst_layers
from .integration import prepare_config
from .mechanisms import CONFIG_KEY, MECHANISMS
from .models import spec_for
from .conversion.model_sources import hub_id_of, load_model_config, source_name
from .conversion.attention_taps import converted_layers
from .conversion.training_text import Batches, load_texts, split_heldout, tokenize
from .conversion.transfer import TransferSchedule, latest_checkpoint, transfer_attention, with_transfer_lora

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

TRANSFER_DEFAULTS: dict[str, Any] = {
    "steps": 300, "stage2_steps": 0, "stage2_loss": "mse", "lr": 1e-3, "stage2_lr": 1e-4, "lora_r": 8,
    "lora_alpha": 16, "keep_softmax_layers": 0,
}
"""The transfer settings of a mechanism that declares none (:attr:`Mechanism.transfer_defaults`)."""
PROBE_TEXTS = 64
"""Training passages on which the probe transfer ranks the layers (``keep_softmax_layers``)."""


@dataclass
class ConvertOptions:
    """Everything a conversion depends on (the CLI's ``convert`` flags)."""

    model: str
    """Path or Hub id of the softmax checkpoint (BERT, RoBERTa, XLM-R or ModernBERT)."""
    mechanism: str
    """A registered mechanism: "sliced_relu" or "rela"."""
    output_dir: str
    text: list[str]
    """Training text: text files (one passage per line), saved datasets or dataset names."""
    heldout_text: list[str] | None = None
    """Held-out text for the report; None: split ``heldout_fraction`` off ``text``."""
    mechanism_options: dict[str, Any] = field(default_factory=dict)
    """Options of the mechanism's config (``layers``, ``num_slices``, ...); those not given take the
    mechanism's ``conversion_defaults``, then its config's defaults."""
    text_column: str = "text"
    text_split: str = "train"
    heldout_fraction: float = 0.1
    # None below: the mechanism's measured best (Mechanism.transfer_defaults), else TRANSFER_DEFAULTS.
    steps: int | None = None
    """Stage 1 optimizer steps."""
    stage2_steps: int | None = None
    stage2_loss: str | None = None
    lr: float | None = None
    stage2_lr: float | None = None
    lora_r: int | None = None
    lora_alpha: int | None = None
    keep_softmax_layers: int | None = None
    """After a probe transfer (stage 1 on all layers), keep softmax attention on this many of the
    layers whose attention error stays worst, and convert the others (0: convert every layer that
    ``layers`` selects). The chosen layers are saved in config.json as an explicit ``layers`` list."""
    warmup_steps: int = 10
    batch_size: int = 8
    """Per process."""
    max_length: int = 128
    checkpoint_every: int = 100
    seed: int = 0
    adapter_only: bool = False
    overwrite: bool = False
    resume: bool = False
    base_model_id: str | None = None
    """The Hub id to name in the model card; None: found from the checkpoint (:func:`~hf_sliced_attn.conversion.model_sources.hub_id_of`)."""

    def __post_init__(self) -> None:
        mechanism = MECHANISMS.get_mechanism(self.mechanism)
        for name, default in TRANSFER_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, mechanism.transfer_defaults.get(name, default))
        self.resolved_options()  # a bad option fails here, saying what is valid
        if self.keep_softmax_layers < 0:
            raise ValueError(f"keep_softmax_layers must be >= 0, got {self.keep_softmax_layers}.")
        if self.keep_softmax_layers and isinstance(self.mechanism_options.get("layers"), list):
            raise ValueError("keep_softmax_layers chooses the layers itself: give it or a list of layers, not both "
                             "(--keep-softmax-layers 0 keeps the given list).")
        self.transfer_schedule()  # and so do bad step counts or an unknown stage-2 loss
        for name in ("batch_size", "max_length", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}.")

    def transfer_schedule(self) -> TransferSchedule:
        return TransferSchedule(steps=self.steps, stage2_steps=self.stage2_steps, lr=self.lr,
                                stage2_lr=self.stage2_lr, warmup_steps=self.warmup_steps,
                                stage2_loss=self.stage2_loss, checkpoint_every=self.checkpoint_every)

    def resolved_options(self) -> dict[str, Any]:
        """The options handed to :func:`hf_sliced_attn.prepare_config`: the given ones over the
        mechanism's conversion defaults (validated by the mechanism's config)."""
        mechanism = MECHANISMS.get_mechanism(self.mechanism)
        options = {**mechanism.conversion_defaults, **self.mechanism_options}
        mechanism.make_config(**options)
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


def _prepare_output(options: ConvertOptions, accelerator: Accelerator) -> None:
    """Check the output folder before anything is trained.

    Every process checks the same folder before any of them changes it (so all of them fail,
    or none); then the main one empties it (``overwrite``) while the others wait.
    """
    output = Path(options.output_dir)
    checkpoint = latest_checkpoint(output / CHECKPOINT_DIR)
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


def build_teacher(options: ConvertOptions) -> PreTrainedModel:
    """``options.model`` with sdpa attention, frozen, in eval mode."""
    return AutoModel.from_pretrained(options.model, attn_implementation="sdpa").eval().requires_grad_(False)


def build_student(options: ConvertOptions, config: PretrainedConfig, layers: list[int] | None = None) -> PeftModel:
    """``options.model`` with the new attention (on ``layers`` when given) and LoRA on its attention
    projections, in eval mode (no dropout: a step depends on its batch only). ``config`` is the
    checkpoint's config; it is copied, not changed."""
    chosen = options.resolved_options() if layers is None else {**options.resolved_options(), "layers": layers}
    config = prepare_config(copy.deepcopy(config), options.mechanism, **chosen)
    student = AutoModel.from_pretrained(options.model, config=config).eval()
    return with_transfer_lora(student, options.lora_r, options.lora_alpha)


def choose_layers(options: ConvertOptions, config: PretrainedConfig, teacher: PreTrainedModel,
                  accelerator: Accelerator, batches: Batches, probe: list[str],
                  tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], dict[str, float]]:
    """The layers to convert with ``keep_softmax_layers``: a probe transfer (stage 1 on every layer that
    ``layers`` selects), then the ``keep_softmax_layers`` layers whose attention error on ``probe``
    (training passages) stays largest keep softmax. Returns (layers to convert, error per layer)."""
    set_seed(options.seed)
    student = build_student(options, config).to(accelerator.device)
    layers = converted_layers(student)
    if options.keep_softmax_layers >= len(layers):  # before the probe's work, as worst_layers would after it
        raise ValueError(f"keep_softmax_layers={options.keep_softmax_layers} leaves none of the {len(layers)} "
                         "layers to convert: keep fewer.")
    schedule = dataclasses.replace(options.transfer_schedule(), stage2_steps=0)
    student, _ = transfer_attention(accelerator, teacher, student,
                                    batches.stream(0, accelerator.process_index, accelerator.num_processes),
                                    schedule, description="probe: rank the layers")
    errors = measure_fidelity(teacher, student.eval(), tokenizer, probe, layers=layers,
                              max_length=options.max_length)["attention_relative_error"]
    accelerator.free_memory()
    worst = worst_layers(errors, options.keep_softmax_layers)
    return [layer for layer in layers if layer not in worst], errors


def _texts(options: ConvertOptions) -> tuple[list[str], list[str], str | None]:
    """(training texts, held-out texts, a note on how the held-out part was split off, or None)."""
    texts = load_texts(options.text, column=options.text_column, split=options.text_split)
    heldout = (load_texts(options.heldout_text, column=options.text_column, split=options.text_split)
               if options.heldout_text else None)
    if options.heldout_text and not heldout:
        raise ValueError(f"The held-out text {options.heldout_text} is empty.")
    return split_heldout(texts, heldout, fraction=options.heldout_fraction, seed=options.seed)


def convert(options: ConvertOptions, on_step: Callable[[int, float], None] | None = None) -> ConversionResult:
    """Run the conversion described by ``options`` and write the output folder.

    ``on_step(step, loss)`` is called after each optimizer step (``step`` counts from 1).
    On KeyboardInterrupt (Ctrl-C, or raised by ``on_step``) a checkpoint of the last
    completed step is saved in ``output_dir/checkpoints`` and the interrupt propagates;
    ``resume=True`` continues from it.
    """
    config = load_model_config(options.model)
    spec_for(config.model_type)  # an unsupported architecture fails here, listing the supported ones
    train_texts, heldout_texts, heldout_note = _texts(options)
    accelerator = Accelerator(step_scheduler_with_optimizer=False, **cpu_process_group_kwargs(),
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    _prepare_output(options, accelerator)
    output = Path(options.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    teacher = build_teacher(options).to(accelerator.device)
    batches = Batches(tokenize(tokenizer, train_texts, options.max_length), tokenizer, options.batch_size,
                      options.seed)
    state: dict[str, Any] = {"fingerprint": options.fingerprint()}
    if options.resume:
        state["layers"] = _saved_state(output).get("layers")
    elif options.keep_softmax_layers:
        started = time.perf_counter()
        state["layers"], state["probe_attention_error"] = choose_layers(
            options, config, teacher, accelerator, batches, train_texts[:PROBE_TEXTS], tokenizer)
        state["probe_s"] = time.perf_counter() - started
    set_seed(options.seed)
    student = build_student(options, config, state.get("layers")).to(accelerator.device)
    layers = converted_layers(student)
    if not options.resume and accelerator.is_main_process:
        state["before"] = measure_fidelity(teacher, student, tokenizer, heldout_texts, layers=layers,
                                           max_length=options.max_length)
    student, state = transfer_attention(
        accelerator, teacher, student, batches.stream(0, accelerator.process_index, accelerator.num_processes),
        options.transfer_schedule(), checkpoint_dir=output / CHECKPOINT_DIR, resume=options.resume, state=state,
        on_step=on_step, description=f"convert to {options.mechanism}",
    )
    if accelerator.is_main_process:
        student.eval()
        after = measure_fidelity(teacher, student, tokenizer, heldout_texts, layers=layers,
                                 max_length=options.max_length)
        reference = save_converted(student, tokenizer, output, adapter_only=options.adapter_only,
                                   reference_texts=heldout_texts[:REFERENCE_TEXTS], max_length=options.max_length)
        report = _report(options, getattr(student.config, CONFIG_KEY), layers, state["before"], after,
                         len(train_texts), len(heldout_texts), heldout_note, accelerator.num_processes)
        report.update(reference=reference, wall_time_s=state["elapsed_s"] + state.get("probe_s", 0.0),
                      license=base_model_license(options.model),
                      sentence_transformers=_keep_sentence_transformers_files(options, output),
                      kept_softmax=_kept_softmax(options, state))
        (output / REPORT_NAME).write_text(json.dumps(report, indent=2))
        render_conversion_card(output, report=report)
        shutil.rmtree(output / CHECKPOINT_DIR)
    accelerator.wait_for_everyone()
    report = json.loads((output / REPORT_NAME).read_text())
    return ConversionResult(output, report, [heldout_note] if heldout_note else [])


def _saved_state(output: Path) -> dict[str, Any]:
    """The state saved with the latest checkpoint of an interrupted conversion (e.g. its chosen layers)."""
    return json.loads((latest_checkpoint(output / CHECKPOINT_DIR) / "progress.json").read_text())


def _kept_softmax(options: ConvertOptions, state: dict[str, Any]) -> dict[str, Any] | None:
    """What ``keep_softmax_layers`` chose, for the report: the count and the probe's error per layer."""
    if not options.keep_softmax_layers:
        return None
    return {"count": options.keep_softmax_layers, "probe_attention_error": state["probe_attention_error"]}


def _keep_sentence_transformers_files(options: ConvertOptions, output: Path) -> str | None:
    """"kept" when the checkpoint is a sentence-transformers model and its files were copied beside
    the merged weights; "adapter-only" when it is one but an adapter folder cannot carry them; None."""
    source = sentence_transformers_folder(options.model)
    if source is None:
        return None
    if options.adapter_only:
        return "adapter-only"
    copy_sentence_transformers_files(source, output)
    return "kept"


def _report(options: ConvertOptions, mechanism_options: dict[str, Any], layers: list[int], before: dict[str, Any], after: dict[str, Any],
            num_train: int, num_heldout: int, heldout_note: str | None, num_processes: int) -> dict[str, Any]:
    """The fidelity report (``fidelity.json``) without its reference outputs, wall time and license."""
    metrics = ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman")
    return {
        "base_model": options.base_model_id or hub_id_of(options.model),
        "mechanism": options.mechanism,
        "mechanism_options": mechanism_options,
        "adapter_only": options.adapter_only,
        "converted_layers": layers,
        "attention_relative_error": {"before": before["attention_relative_error"],
                                     "after": after["attention_relative_error"],
                                     "mean_before": before["attention_relative_error_mean"],
                                     "mean_after": after["attention_relative_error_mean"]},
        **{name: {"before": before[name], "after": after[name]} for name in metrics},
        "heldout": {"num_texts": num_heldout,
                    "source": [source_name(s) for s in options.heldout_text] if options.heldout_text else heldout_note},
        "training": {"num_texts": num_train, "text": [source_name(s) for s in options.text],
                     "datasets": [source for source in options.text if not Path(source).exists()],
                     "stage1_steps": options.steps,
                     "stage2_steps": options.stage2_steps, "stage2_loss": options.stage2_loss, "lr": options.lr,
                     "stage2_lr": options.stage2_lr, "lora_r": options.lora_r, "batch_size": options.batch_size,
                     "max_length": options.max_length, "seed": options.seed, "num_processes": num_processes},
    }


def convert_sentence_transformer(model: SentenceTransformer, mechanism: str, output_dir: str, text: list[str],
                                 **options: Any) -> ConversionResult:
    """Convert a loaded :class:`sentence_transformers.SentenceTransformer` like ``hf-sliced-attn
    convert``: ``options`` are the other fields of :class:`~hf_sliced_attn.convert.ConvertOptions`.
    The card names the model's Hub id when the object knows it (``model_card_data.base_model``),
    or ``base_model_id``. Load the result with ``SentenceTransformer(output_dir)``."""
    with tempfile.TemporaryDirectory(prefix="hf-sliced-attn-") as folder:
        model.save(folder)
        known = getattr(getattr(model, "model_card_data", None), "base_model", None)
        base = options.pop("base_model_id", None) or (hub_id_of(known) if isinstance(known, str) else None)
        return convert(ConvertOptions(model=folder, mechanism=mechanism, output_dir=output_dir, text=text,
                                      base_model_id=base, **options))
