"""Conversion fidelity of one setting against a reference setting, paired by seed: runs of ``bench_conversion.py``.

    python benchmarks/conversion_seeds.py --reference benchmarks/results/mlp_width/width384/seed{0,1,2,3} \
        --contender width96 benchmarks/results/mlp_width/width96/seed{0,1,2,3} --margin 0.005 \
        --output benchmarks/results/mlp_width

Each folder holds the ``conversion.json`` of one ``bench_conversion.py`` run of one variant, with its seed among the
convert flags (``--convert_args "--seed 1"``; no ``--seed``: convert's default, 0). For each contender setting and
each fidelity figure (embedding cosine and pairwise Spearman against the original, on the short and the long tuning
texts and on the reporting text), the per-seed differences contender - reference of the seeds both ran, their mean
and 95% Student-t interval (n - 1 degrees of freedom), and the interval's verdict against ``-margin``:
"no worse than the margin" only when its lower end clears -margin, "worse" when its upper end is below it, else
"not resolved". The transfer's wall time is compared as the paired ratio contender / reference.

Settings are chosen on the tuning texts; the reporting text was never used for choosing. Results: printed and
written to ``<output>/conversion_seeds.md`` and ``.json``, with this command and each run's command and source.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks._harness import Environment, paired_interval, write_results  # noqa: E402

STEM = "conversion_seeds"
FIGURES = {
    "embedding_cosine": "tuning, short: cosine",
    "pairwise_spearman": "tuning, short: Spearman",
    "tuning_long_embedding_cosine": "tuning, long: cosine",
    "tuning_long_pairwise_spearman": "tuning, long: Spearman",
    "reporting_embedding_cosine": "reporting: cosine",
    "reporting_pairwise_spearman": "reporting: Spearman",
}
"""The fidelity figures of a ``conversion.json`` variant -> their label (tuning texts first, the reporting text
last)."""
VERDICTS = {"met": "no worse than the margin", "not met": "worse", "not resolved": "not resolved"}
""":meth:`PairedInterval.verdict` against -margin, in words."""


def seed_of(flags: str) -> int:
    """The ``--seed`` among a variant's convert flags; convert's default, 0, without one."""
    words = shlex.split(flags) if flags != "(defaults)" else []
    for i, word in enumerate(words):
        if word == "--seed" and i + 1 < len(words):
            return int(words[i + 1])
        if word.startswith("--seed="):
            return int(word.split("=", 1)[1])
    return 0


def load_setting(folders: list[Path]) -> dict[int, dict]:
    """Seed -> the run (its one variant's record and its environment) of each folder; one variant and one source
    across the folders, and one run per seed."""
    runs: dict[int, dict] = {}
    for folder in folders:
        path = folder / "conversion.json"
        if not path.is_file():
            raise SystemExit(f"{path} does not exist: give folders that bench_conversion.py wrote (--output)")
        record = json.loads(path.read_text())
        if len(record["variants"]) != 1:
            raise SystemExit(f"{path} holds {len(record['variants'])} variants: run one variant per folder")
        variant = record["variants"][0]
        seed = seed_of(variant["flags"])
        if seed in runs:
            raise SystemExit(f"seed {seed} twice: {runs[seed]['folder']} and {folder}")
        runs[seed] = {"folder": str(folder), "environment": record["environment"], **variant}
    for key in ("variant", "source"):
        values = {run[key] if key == "variant" else run["environment"][key] for run in runs.values()}
        if len(values) > 1:
            raise SystemExit(f"the runs of one setting differ in {key} ({', '.join(sorted(values))})")
    return runs


def compare(reference: dict[int, dict], contender: dict[int, dict], margin: float) -> dict:
    """The paired per-seed differences of every figure and the transfer's time ratio, over the shared seeds."""
    seeds = sorted(set(reference) & set(contender))
    if not seeds:
        raise SystemExit("the contender and the reference share no seed")
    figures = {}
    for key, label in FIGURES.items():
        interval = paired_interval(contender[s][key] - reference[s][key] for s in seeds)
        figures[key] = {"label": label, "reference_mean": statistics.fmean(reference[s][key] for s in seeds),
                        "contender_mean": statistics.fmean(contender[s][key] for s in seeds),
                        "difference": interval.record(), "verdict": VERDICTS[interval.verdict(-margin)]}
    time = paired_interval(contender[s]["transfer_time_s"] / reference[s]["transfer_time_s"] for s in seeds)
    return {"seeds": seeds, "figures": figures, "transfer_time_ratio": time.record()}


def report(environment: Environment, settings: dict[str, dict[int, dict]], comparisons: dict[str, dict],
           margin: float) -> str:
    """Markdown: the runs, then per contender the paired differences of every figure with their verdicts."""
    lines = ["# Conversion fidelity paired by seed", "", f"{environment.describe()}. Differences are contender - "
             f"reference on the same seed, mean [95% Student-t interval]; the verdict is the interval's against "
             f"-{margin:g} (no worse than the margin only when its lower end clears it).", "", "## Runs", "",
             "| setting | seed | variant | flags | command | source |", "|---|---:|---|---|---|---|"]
    for name, runs in settings.items():
        for seed, run in sorted(runs.items()):
            lines.append(f"| {name} | {seed} | {run['variant']} | `{run['flags']}` | `{run['environment']['command']}` "
                         f"| {run['environment']['source']} |")
    reference = next(iter(settings))
    for name, comparison in comparisons.items():
        seeds = ", ".join(map(str, comparison["seeds"]))
        time = comparison["transfer_time_ratio"]
        lines += ["", f"## {name} against {reference} (seeds {seeds})", "",
                  f"| figure | {reference} | {name} | difference | verdict |", "|---|---:|---:|---:|---|"]
        for figure in comparison["figures"].values():
            difference = figure["difference"]
            interval = "" if difference["low"] is None else f" [{difference['low']:+.4f}, {difference['high']:+.4f}]"
            lines.append(f"| {figure['label']} | {figure['reference_mean']:.4f} | {figure['contender_mean']:.4f} | "
                         f"{difference['mean']:+.4f}{interval} | {figure['verdict']} |")
        interval = "" if time["low"] is None else f" [{time['low']:.3f}, {time['high']:.3f}]"
        lines += ["", f"Transfer wall time, {name} / {reference}, paired by seed: {time['mean']:.3f}{interval}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, nargs="+", required=True,
                        help="the reference setting's bench_conversion.py --output folders, one per seed")
    parser.add_argument("--reference_name", default="reference", help="its name in the report (default reference)")
    parser.add_argument("--contender", nargs="+", action="append", required=True, metavar="NAME FOLDER",
                        help="a setting's name, then its folders, one per seed (repeatable)")
    parser.add_argument("--margin", type=float, default=0.005,
                        help="the largest loss of a figure that counts as no worse (default 0.005)")
    parser.add_argument("--output", type=Path, required=True, help="where to write conversion_seeds.{md,json}")
    args = parser.parse_args(argv)
    environment = Environment.now(Path(__file__).name, argv)
    settings = {args.reference_name: load_setting(args.reference)}
    for name, *folders in args.contender:
        if not folders:
            parser.error(f"--contender {name}: give the setting's folders after its name")
        if name in settings:
            parser.error(f"the setting name {name!r} is given twice")
        settings[name] = load_setting([Path(folder) for folder in folders])
    reference = settings[args.reference_name]
    comparisons = {name: compare(reference, runs, args.margin) for name, runs in settings.items()
                   if name != args.reference_name}
    markdown = report(environment, settings, comparisons, args.margin)
    print(markdown)
    write_results(args.output, STEM, markdown, {
        "environment": asdict(environment), "margin": args.margin,
        "runs": {name: {str(seed): run for seed, run in runs.items()} for name, runs in settings.items()},
        "comparisons": comparisons,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
