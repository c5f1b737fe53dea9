"""The training-step bars across several runs of ``bench_training_step.py`` at one commit: each run's mean paired
ratio is one observation.

    python benchmarks/training_step_runs.py benchmarks/results/training_step_default/rows100_run{1,2,3} \
        --output benchmarks/results/training_step_default/rows100_runs

Why: a run's interval (:func:`bench_training_step.paired_ratios`, its rounds' paired ratios ``sdpa_fused``'s step /
the contender's) covers the step-to-step noise within that run, not the state of the shared machine, which changes
from run to run: two 100-round runs of rela's default at one commit read 1.031 [1.023, 1.039] and 1.002 [0.990,
1.015], intervals that do not overlap. Here the unit is the run: for each bar, the runs' mean paired ratios, their
mean and 95% Student-t interval over the runs (n - 1 degrees of freedom), and that interval's verdict (met only
when its lower end clears the bar). Each run's own interval and verdict are listed beside it.

The runs must come from one commit (their ``source``); a bar counts the runs that measured it. Results: printed
and written to ``<output>/training_step_runs.md`` and ``.json``, with this command and each run's command, date
and load averages.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks._harness import Environment, PairedInterval, paired_interval, write_results  # noqa: E402

STEM = "training_step_runs"


def load_runs(folders: list[Path]) -> list[dict]:
    """Each folder's ``training_step.json``, checked to come from one commit."""
    runs = []
    for folder in folders:
        path = folder / "training_step.json"
        if not path.is_file():
            raise SystemExit(f"{path} does not exist: give folders that bench_training_step.py wrote (--output)")
        runs.append({"folder": str(folder), **json.loads(path.read_text())})
    sources = sorted({run["environment"]["source"] for run in runs})
    if len(sources) > 1:
        raise SystemExit(f"the runs come from different source states ({', '.join(sources)}): pool runs of one "
                         "commit only")
    return runs


def pooled_bars(runs: list[dict]) -> list[dict]:
    """Per bar measured by two runs or more: each run's paired ratio (mean, interval, verdict) and the interval
    of the runs' means with its verdict, in the benchmark's order of bars."""
    pooled = []
    for bar in runs[0]["bars"]:
        same = [(run["folder"], record) for run in runs for record in run["bars"]
                if (record["contender"], record["shape"], record["required"]) == (bar["contender"], bar["shape"],
                                                                                 bar["required"])]
        measured = [(folder, record) for folder, record in same if record["paired_ratio"]]
        if len(measured) < 2:
            continue
        across = paired_interval(record["paired_ratio"]["mean"] for _, record in measured)
        pooled.append({
            "contender": bar["contender"], "shape": bar["shape"], "required": bar["required"],
            "runs": [{"folder": folder, "paired_ratio": record["paired_ratio"], "verdict": record["interval_verdict"]}
                     for folder, record in measured],
            "across_runs": across.record(), "verdict": across.verdict(bar["required"]),
        })
    return pooled


def report(environment: Environment, runs: list[dict], bars: list[dict]) -> str:
    """Markdown: the header, the runs, and per bar each run's interval and the interval over the runs."""
    lines = ["# Training-step bars across runs (CPU): all-MiniLM-L6-v2, sequence classification", "",
             f"{environment.describe()}. The runs' source: {runs[0]['environment']['source']}. Each run's mean paired "
             "ratio (sdpa_fused's step / the contender's, same round) is one observation; the bar's verdict is that "
             "of their 95% Student-t interval over the runs.", "", "## Runs", "",
             "| run | command | date | 1-min load, start / end |", "|---|---|---|---|"]
    for run in runs:
        env = run["environment"]
        lines.append(f"| `{run['folder']}` | `{env['command']}` | {env['date']} | "
                     f"{env['load_average']['start']:.2f} / {env['load_average']['end']:.2f} |")
    lines += ["", "## Bars", "", "| bar | each run: mean [95% interval], verdict | across the runs | required | "
              "verdict |", "|---|---|---:|---:|---|"]
    for bar in bars:
        each = "; ".join(f"{_interval(r['paired_ratio']).describe('.3f')} {r['verdict']}" for r in bar["runs"])
        lines.append(f"| {bar['contender']} at {bar['shape'].replace('x', '×')} | {each} | "
                     f"{_interval(bar['across_runs']).describe('.3f')} | ≥ {bar['required']:g} | "
                     f"**{bar['verdict']}** |")
    return "\n".join(lines) + "\n"


def _interval(record: dict) -> PairedInterval:
    """The :class:`PairedInterval` a JSON record holds."""
    return PairedInterval(**{**record, "values": tuple(record["values"])})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="the --output folders of bench_training_step.py runs")
    parser.add_argument("--output", type=Path, required=True, help="where to write training_step_runs.{md,json}")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give two runs or more: one run's interval is bench_training_step.py's own")
    environment = Environment.now(Path(__file__).name, argv)
    runs = load_runs(args.runs)
    bars = pooled_bars(runs)
    markdown = report(environment, runs, bars)
    print(markdown)
    write_results(args.output, STEM, markdown, {
        "environment": asdict(environment),
        "runs": [{"folder": run["folder"], "environment": run["environment"]} for run in runs],
        "bars": bars,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
