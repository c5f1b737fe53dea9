"""The data side of ``glue.py``: the GLUE tasks, their files (from the Hub or local csv/tsv/json in any task's
format), the text and label columns inferred from them, and the official metric that fits them.

Kept beside the recipe as transformers' examples keep ``utils_qa.py`` beside ``run_qa.py``; ``glue.py`` imports
it by name (the script's folder is on ``sys.path``). Bad data raises :class:`DataError`, whose message says what
was found and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import datasets
import evaluate
from accelerate.logging import get_logger
from datasets import DatasetDict, load_dataset

from hf_sliced_attn.conversion.model_sources import hub_unreachable

from hub_preflight import GLUE_HUB_DATASET, glue_task_unavailable

logger = get_logger(__name__)

RECIPES_DIR = Path(__file__).resolve().parent
GLUE_METRIC_DIR = RECIPES_DIR / "metrics" / "glue"
"""The official GLUE metric as a local ``evaluate`` module (the Hub's ``glue`` metric, offline)."""
SAMPLE_DIR = RECIPES_DIR / "data" / "glue_sample"
"""The bundled GLUE-format sample (``recipes/data/make_glue_sample.py``), the main job's data."""


class DataError(Exception):
    """Data the recipe cannot use; the message names what was found and what was expected."""


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



FILE_BUILDERS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".json": ("json", {}), ".jsonl": ("json", {})}



@dataclass
class GlueData:
    """The raw splits and what the recipe inferred from them."""

    raw: DatasetDict
    keys: tuple[str, str | None]  # the text column(s)
    is_regression: bool
    label_list: list | None  # the raw label values, sorted; None for regression
    num_labels: int
    metric_config: str  # the GLUE task whose official metric is computed


def load_raw_datasets(args) -> DatasetDict:
    """Splits: train, validation (MNLI: matched), optional validation_mismatched and test."""
    if args.task_name and not args.train_file:
        # Offline, or the Hub does not answer (then the process goes offline): the datasets cache answers at once.
        unreachable = hub_unreachable()
        try:
            raw = load_dataset(GLUE_HUB_DATASET, args.task_name)
        except Exception as err:  # offline, DNS failure, timeout, missing from the cache ...
            why = (f"{unreachable} and it is not in the local datasets cache" if unreachable else
                   f"it could not be downloaded ({type(err).__name__}: {err})")
            raise DataError(glue_task_unavailable(args.task_name, why)) from err
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


def load_local_file(path: str) -> datasets.Dataset:
    """A csv, tsv or json(l) file as one dataset split."""
    builder, kwargs = FILE_BUILDERS[Path(path).suffix.lower()]
    try:
        return load_dataset(builder, data_files={"data": str(path)}, split="data", **kwargs)
    except Exception as err:
        raise DataError(f"Could not read {path} as {builder}: {type(err).__name__}: {err}") from err


def resolve_text_columns(args, raw: DatasetDict) -> tuple[str, str | None]:
    """The text column(s): --text_columns, the task's GLUE names, or the first known GLUE pair found."""
    expected = " | ".join("+".join(c for c in pair if c) for pair in COLUMN_CANDIDATES)
    found = raw["train"].column_names
    if args.text_columns:
        names = [c.strip() for c in args.text_columns.split(",") if c.strip()]
        if not 1 <= len(names) <= 2:
            raise DataError(f"--text_columns takes one or two column names, got {args.text_columns!r}.")
        keys = (names[0], names[1] if len(names) == 2 else None)
    elif args.task_name and all(k is None or k in found for k in TASK_TO_KEYS[args.task_name]):
        keys = TASK_TO_KEYS[args.task_name]
    else:
        keys = next((pair for pair in COLUMN_CANDIDATES if all(k is None or k in found for k in pair)), None)
        if keys is None:
            raise DataError(
                f"Cannot find the text columns in the training data: found columns {found}; expected one of "
                f"{expected} (GLUE names) plus a {args.label_column!r} label column, or pass --text_columns a,b "
                f"and --label_column."
            )
    for split, ds in raw.items():
        needed = [k for k in keys if k] + ([] if split == "test" else [args.label_column])
        missing = [c for c in needed if c not in ds.column_names]
        if missing:
            raise DataError(
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
                raise DataError(f"The {split} data has labels {unknown} that never occur in training ({label_list}).")
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


def load_metric(args, config_name: str, process_index: int):
    """The official GLUE metric of ``config_name``: the local copy, or the Hub's with --metric_source hub."""
    # keep_in_memory: every process computes on the gathered predictions without sharing a cache file.
    if args.metric_source == "hub":
        try:
            return evaluate.load("glue", config_name, keep_in_memory=True)
        except Exception as err:
            raise DataError(f"Cannot load the GLUE metric from the Hub ({type(err).__name__}: {err}); "
                              f"use --metric_source local (the default).") from err
    return evaluate.load(str(GLUE_METRIC_DIR), config_name=config_name, keep_in_memory=True,
                         experiment_id=f"glue-{os.getpid()}-{process_index}")


def label_names(args, label_list) -> list[str]:
    """A name per label value (in label_list order): the GLUE names for integer labels of a known task."""
    if args.task_name in TASK_LABEL_NAMES and label_list == list(range(len(TASK_LABEL_NAMES[args.task_name]))):
        return list(TASK_LABEL_NAMES[args.task_name])
    return [str(l) for l in label_list]


def local_dataset_name(train_file: str) -> str:
    """How a model card names local training data: the bundled sample, or the file's name."""
    path = Path(train_file).resolve()
    if SAMPLE_DIR.resolve() in path.parents:
        return (f"the template-generated {path.parent.name.upper()}-format sample bundled with hf-sliced-attn "
                f"(glue_sample/{path.parent.name}; not GLUE data, so its scores say nothing about GLUE)")
    return f"local files ({path.name})"


def prepare_data(args) -> GlueData:
    """The raw splits, their text and label columns, the labels and the GLUE metric that fits them."""
    raw = load_raw_datasets(args)
    keys = resolve_text_columns(args, raw)
    is_regression, label_list = resolve_labels(args, raw)
    num_labels = 1 if is_regression else len(label_list)
    metric_config = glue_metric_config(args, keys, is_regression, num_labels, raw)
    logger.info(f"text columns {keys}, label column {args.label_column!r}, "
                f"{'regression' if is_regression else f'{num_labels} labels {label_list}'}, GLUE metric of {metric_config!r}")
    return GlueData(raw, keys, is_regression, label_list, num_labels, metric_config)
