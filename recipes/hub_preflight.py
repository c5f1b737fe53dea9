"""What ``glue.py`` must fetch from the Hub, checked before the recipe imports torch, transformers and datasets.

Without the Hub (``HF_HUB_OFFLINE``, or an endpoint that does not answer), a run that needs the GLUE dataset or a
model that is not in the local caches fails here, in a fraction of a second, with the same one line the recipe's own
loading would print after seconds of imports. Everything else (local files, the bundled checkpoint, cached Hub
files, a reachable Hub) goes on to the recipe, which judges it as before. The presets live here because the check
reads them too: a preset can name the task and the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_sliced_attn_cli.hub_access import dataset_cached, hub_unreachable, uncached_hub_model

GLUE_HUB_DATASET = "nyu-mll/glue"
PRESETS_FILE = Path(__file__).resolve().parent / "configs" / "presets.json"
EXIT_BAD_INPUT = 2
"""The recipe's exit status for input it cannot use (argparse's, for a bad flag)."""


def load_presets() -> dict[str, dict]:
    """The hyperparameter presets of :data:`PRESETS_FILE`, by name (entries starting with ``_`` are comments)."""
    with PRESETS_FILE.open() as f:
        return {name: preset for name, preset in json.load(f).items() if not name.startswith("_")}


def glue_task_unavailable(task: str, why: str) -> str:
    """The one line for a GLUE task that cannot be loaded from the Hub, and the local-files remedy."""
    return (f"Cannot load GLUE task {task!r} from the Hub dataset {GLUE_HUB_DATASET}: {why}. "
            f"Use local files instead: --train_file/--validation_file (csv, tsv or json in GLUE format) "
            f"with --task_name {task} to keep the task's metric.")


def hub_problem(argv: Sequence[str]) -> str | None:
    """Why the run ``argv`` cannot get what it needs from the Hub, or None when nothing stands in its way.

    Reads only ``--task_name``, ``--train_file``, ``--model_name_or_path`` and ``--preset`` (spelled out), as
    :func:`glue.parse_args` combines them: explicit flags over the preset, and local files drop the preset's task.
    """
    if "-h" in argv or "--help" in argv:
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--task_name", "--train_file", "--model_name_or_path", "--preset"):
        parser.add_argument(flag)
    args, _ = parser.parse_known_args(argv)
    preset = load_presets().get(args.preset or "", {}).get("args", {})
    task = args.task_name or (None if args.train_file else preset.get("task_name"))
    model = args.model_name_or_path or preset.get("model_name_or_path")
    if task and not args.train_file and not dataset_cached(GLUE_HUB_DATASET):
        unreachable = hub_unreachable()
        if unreachable:
            return glue_task_unavailable(task, f"{unreachable} and it is not in the local datasets cache")
    return uncached_hub_model(model) if model else None


def exit_if_the_hub_is_needed_and_unusable(argv: Sequence[str]) -> None:
    """Print ``glue.py: error: ...`` and exit with :data:`EXIT_BAD_INPUT` when :func:`hub_problem` finds one."""
    problem = hub_problem(argv)
    if problem is not None:
        print(f"glue.py: error: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)
