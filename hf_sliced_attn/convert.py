"""``hf-sliced-attn convert``: a softmax encoder checkpoint to ``sliced_relu`` or ``rela``, by attention transfer.

The steps, each a call into :mod:`hf_sliced_attn.conversion`: the training text and its held-out
split, the teacher and the student (the checkpoint with the new attention and LoRA on its
attention projections), :func:`~hf_sliced_attn.conversion.pipeline.transfer_and_select` (the
transfer and the choice of softmax layers, shared with the GLUE recipe), the fidelity report on
held-out text, and the converted folder with its card.

Training runs through :class:`accelerate.Accelerator` (CPU, one GPU or ``accelerate launch``
with several processes). The batch of step ``s`` is a function of the seed and ``s`` alone, and
the transfer's checkpoints keep the model, optimizer, scheduler and RNG states, so an
interrupted run resumed from its last checkpoint ends in the same state as an uninterrupted
one. Ctrl-C saves a checkpoint before leaving.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import PeftModel
from transformers import AutoModel, AutoTokenizer, PretrainedConfig

from .conversion.cards import base_model_license, render_conversion_card
from .conversion.converted_folder import CHECKPOINT_DIR, REFERENCE_TEXTS, REPORT_NAME, save_converted
from .conversion.model_sources import hub_id_of, load_model_config, source_name
from .conversion.pipeline import TransferRecord, transfer_and_select
from .conversion.sentence_transformers_files import copy_sentence_transformers_files, sentence_transformers_folder
from .conversion.settings import TransferConfig, resolve_transfer_config
from .conversion.training_text import Batches, load_texts, pack_passages, split_heldout, tokenize
from .conversion.transfer import build_teacher, latest_checkpoint, with_transfer_lora
from .distributed import cpu_process_group_kwargs
from .integration import converted_layer_indices, has_local_layers, prepare_config
from .mechanisms import CONFIG_KEY, MECHANISMS

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

BATCH_SIZE = 8
"""Passages per transfer step and process when the transfer settings name no ``batch_size``."""


@dataclass
class ConvertOptions:
    """Everything a conversion depends on (the CLI's ``convert`` flags)."""

    model: str
    """Path or Hub id of the softmax checkpoint (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, DistilBERT or ModernBERT)."""
    mechanism: str
    """A registered mechanism: "sliced_relu" or "rela"."""
    output_dir: str
    text: list[str]
    """Training text: text files (one passage per line), saved datasets or dataset names."""
    heldout_text: list[str] | None = None
    """Held-out text for the report; None: split ``heldout_fraction`` off ``text``."""
    mechanism_options: dict[str, Any] = field(default_factory=dict)
    """Options of the mechanism's config (``layers``, ``num_slices``, ...); those not given take the
    mechanism's conversion defaults for "convert", then its config's defaults."""
    transfer: Mapping[str, Any] = field(default_factory=dict)
    """Transfer settings (fields of :class:`~hf_sliced_attn.conversion.settings.TransferConfig`: ``steps``,
    ``lora_r``, ``keep_softmax_layers``, ...); those not given take the mechanism's measured best."""
    text_column: str = "text"
    text_split: str = "train"
    heldout_fraction: float = 0.1
    max_length: int = 128
    pack_tokens: int = 0
    """Train on consecutive training passages joined into rows of up to this many tokens (at most ``max_length``;
    :func:`~hf_sliced_attn.conversion.training_text.pack_passages`), so the transfer sees inputs as long as the
    text the model will convert; 0: one passage a row. The held-out text is never packed."""
    seed: int = 0
    adapter_only: bool = False
    overwrite: bool = False
    resume: bool = False
    base_model_id: str | None = None
    """The Hub id to name in the model card; None: found from the checkpoint (:func:`~hf_sliced_attn.conversion.model_sources.hub_id_of`)."""

    def __post_init__(self) -> None:
        MECHANISMS.get_mechanism(self.mechanism)
        self.resolved_options()  # a bad option fails here, saying what is valid
        if self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}.")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}.")
        if not 0 <= self.pack_tokens <= self.max_length:
            raise ValueError(f"pack_tokens must be 0 (no packing) or at most max_length {self.max_length} (the "
                             f"longest row the transfer tokenizes), got {self.pack_tokens}.")

    def resolved_options(self) -> dict[str, Any]:
        """The options handed to :func:`hf_sliced_attn.prepare_config`: the given ones over the
        mechanism's conversion defaults (validated by the mechanism's config)."""
        mechanism = MECHANISMS.get_mechanism(self.mechanism)
        options = mechanism.conversion_options("convert", self.mechanism_options)
        mechanism.make_config(**options)
        return options

    def student_config(self, config: PretrainedConfig) -> PretrainedConfig:
        """A copy of the checkpoint's ``config`` asking for the mechanism with :meth:`resolved_options`."""
        return prepare_config(copy.deepcopy(config), self.mechanism, **self.resolved_options())

    def transfer_config(self, student_config: PretrainedConfig) -> TransferConfig:
        """The transfer settings: :attr:`transfer` over the mechanism's measured best for conversions."""
        config = resolve_transfer_config(self.mechanism, "convert", self.transfer,
                                         converted_layers=len(converted_layer_indices(student_config)),
                                         layers_listed=isinstance(self.mechanism_options.get("layers"), list),
                                         has_local_layers=has_local_layers(student_config))
        if not config.steps:
            raise ValueError("A conversion trains the new attention: steps must be >= 1.")
        return config

    def fingerprint_context(self) -> dict[str, Any]:
        """Where the model and the text come from, and the length: with the transfer settings, the student's
        options and the seed (which the transfer adds itself), what fixes the trajectory that resuming checks."""
        return {"model": self.model, "text": self.text, "heldout_text": self.heldout_text,
                "text_column": self.text_column, "text_split": self.text_split,
                "heldout_fraction": self.heldout_fraction, "max_length": self.max_length, "pack_tokens": self.pack_tokens}


@dataclass
class ConversionResult:
    output_dir: Path
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _prepare_output(options: ConvertOptions, accelerator: Accelerator) -> None:
    """Check the output folder before anything is trained.

    Every process checks the same folder before any of them changes it (so all of them fail,
    or none); then the main one empties it (``overwrite``) while the others wait. The errors name the
    options as this API takes them (``overwrite=True``); the command line names its flags instead.
    """
    output = Path(options.output_dir)
    checkpoint = latest_checkpoint(output / CHECKPOINT_DIR)
    if options.resume and checkpoint is None:
        raise FileNotFoundError(f"resume=True: {output / CHECKPOINT_DIR} holds no checkpoint to resume from.")
    occupied = not options.resume and output.exists() and any(output.iterdir())
    if occupied and not options.overwrite:
        hint = " (it holds an interrupted conversion: pass resume=True to continue it)" if checkpoint else ""
        raise FileExistsError(f"The output folder {output} already exists and is not empty{hint}; "
                              "pass overwrite=True to replace it.")
    accelerator.wait_for_everyone()
    if occupied and accelerator.is_main_process:
        shutil.rmtree(output)
    accelerator.wait_for_everyone()


def build_student(options: ConvertOptions, config: PretrainedConfig, transfer: TransferConfig) -> PeftModel:
    """``options.model`` built from ``config`` (prepared for the mechanism) with LoRA on its attention
    projections, in eval mode (no dropout: a step depends on its batch only)."""
    student = AutoModel.from_pretrained(options.model, config=copy.deepcopy(config)).eval()
    return with_transfer_lora(student, transfer.lora_r, transfer.lora_alpha, options.seed)


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
    source = load_model_config(options.model)
    config = options.student_config(source)  # an unsupported architecture fails here, listing the supported ones
    transfer = options.transfer_config(config)
    train_texts, heldout_texts, heldout_note = _texts(options)
    accelerator = Accelerator(**cpu_process_group_kwargs())
    _prepare_output(options, accelerator)
    output = Path(options.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    if options.pack_tokens:
        train_texts = pack_passages(tokenizer, train_texts, options.pack_tokens)
    teacher = build_teacher(options.model).to(accelerator.device)
    batches = Batches(tokenize(tokenizer, train_texts, options.max_length), tokenizer,
                      transfer.batch_size or BATCH_SIZE, options.seed)
    set_seed(options.seed)
    student = build_student(options, config, transfer).to(accelerator.device)
    student, record = transfer_and_select(
        accelerator, teacher, student, batches, transfer, tokenizer=tokenizer, ranking_texts=train_texts,
        max_length=options.max_length, context=options.fingerprint_context(), checkpoint_dir=output / CHECKPOINT_DIR,
        fidelity_texts=heldout_texts, resume=options.resume, on_step=on_step,
        description=f"convert to {options.mechanism}")
    if accelerator.is_main_process:
        reference = save_converted(student, tokenizer, output, adapter_only=options.adapter_only,
                                   reference_texts=heldout_texts[:REFERENCE_TEXTS], max_length=options.max_length)
        report = _report(options, getattr(student.config, CONFIG_KEY), record, len(train_texts), heldout_note,
                         accelerator.num_processes)
        report.update(reference=reference, license=base_model_license(options.model),
                      sentence_transformers=_keep_sentence_transformers_files(options, output))
        (output / REPORT_NAME).write_text(json.dumps(report, indent=2))
        render_conversion_card(output, report=report)
        shutil.rmtree(output / CHECKPOINT_DIR)
    accelerator.wait_for_everyone()
    report = json.loads((output / REPORT_NAME).read_text())
    return ConversionResult(output, report, [heldout_note] if heldout_note else [])


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


def _report(options: ConvertOptions, mechanism_options: dict[str, Any], record: TransferRecord, num_train: int,
            heldout_note: str | None, num_processes: int) -> dict[str, Any]:
    """The fidelity report (``fidelity.json``) without its reference outputs and license. "before" is the
    untrained student with every selected layer converted; "after" the result, on the layers kept converted."""
    before, after = record.fidelity["before"], record.fidelity["after"]
    metrics = ("hidden_state_cosine", "embedding_cosine", "pairwise_spearman")
    return {
        "base_model": options.base_model_id or hub_id_of(options.model),
        "mechanism": options.mechanism,
        "mechanism_options": mechanism_options,
        "adapter_only": options.adapter_only,
        "converted_layers": record.converted_layers,
        "kept_softmax": {"layers": record.softmax_layers, "ranking_attention_error": record.ranking_error},
        "attention_relative_error": {"before": before["attention_relative_error"],
                                     "after": after["attention_relative_error"],
                                     "mean_before": before["attention_relative_error_mean"],
                                     "mean_after": after["attention_relative_error_mean"]},
        **{name: {"before": before[name], "after": after[name]} for name in metrics},
        "heldout": {"num_texts": record.fidelity["texts"],
                    "source": [source_name(s) for s in options.heldout_text] if options.heldout_text else heldout_note},
        "training": {"num_texts": num_train, "text": [source_name(s) for s in options.text],
                     "datasets": [source for source in options.text if not Path(source).exists()],
                     "stage1_steps": record.config.steps, **record.config.trajectory(),
                     "max_length": options.max_length, "pack_tokens": options.pack_tokens, "seed": options.seed,
                     "num_processes": num_processes},
        "wall_time_s": record.wall_time_s,
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
