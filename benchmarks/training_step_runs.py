"""The training-step bars across several runs of ``bench_training_step.py`` at one commit: each run's mean paired
ratio is one observation.

    python benchmarks/training_step_runs.py benchmarks/results/training_step_default/rows100_run{1,2,3} \
        --output benchmarks/results/training_step_default/rows100_runs

Why: a run's interval (:func:`bench_training_step.paired_ratios`, its rounds' paired ratios ``sdpa_fused``'s step /
the contender's) covers the step-to-step noise within that run, not the state of the shared machine, which changes
from run to run: two 100-round runs of rela's default at one commit read 1.031 [1.023, 1.039] and 1.002 [0.990,
1.015], intervals that do not overlap. Here the unit is the run: for each bar, the runs' mean paired ratios, their
mean and 95% Student-t interval over the runs (n - 1 degrees of freedom), and that interval's verdict (met only
when its lower end clears the bar). Each run's own interval and verdict are listed beside it. The ceilings
(``bench_training_step.CEILINGS``: a contender that costs less than any contender it bounds) are pooled the same
way, and a bar they bound that lies above the upper end of their interval over the runs cannot be met on this model
and machine.

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

from benchmarks import bench_training_step as bench  # noqa: E402
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


def pooled_ceilings(runs: list[dict]) -> list[dict]:
    """Per ceiling and shape measured by two runs or more: each run's mean paired ratio (``sdpa_fused``'s step / the
    ceiling's, round by round), their interval over the runs, and the bars it bounds at that shape that lie above the
    interval's upper end (those cannot be met here)."""
    pooled = []
    for name, ceiling in bench.CEILINGS.items():
        for shape in dict.fromkeys(record["shape"] for run in runs for record in run["results"]):
            means = [_paired_mean(run, name, shape) for run in runs]
            means = [mean for mean in means if mean is not None]
            if len(means) < 2:
                continue
            across = paired_interval(means)
            bounded = [(contender, required) for contender, (batch, length), required in bench.BARS
                       if f"{batch}x{length}" == shape and ceiling.bounds_bar_of(contender)]
            pooled.append({
                "ceiling": name, "what": ceiling.what, "bounds": ceiling.bounds, "who": ceiling.who, "shape": shape,
                "across_runs": across.record(),
                "bars_above": [{"contender": contender, "required": required}
                               for contender, required in bounded if required > across.high],
                "bars_within": [{"contender": contender, "required": required}
                                for contender, required in bounded if required <= across.high],
            })
    return pooled


def _paired_mean(run: dict, name: str, shape: str) -> float | None:
    """The mean over a run's rounds of ``sdpa_fused``'s step / ``name``'s at ``shape``; None where not measured."""
    steps = {record["contender"]: record["step_s"] for record in run["results"] if record["shape"] == shape}
    if name not in steps or bench.BASELINES[0] not in steps:
        return None
    return paired_interval(base / step for base, step in zip(steps[bench.BASELINES[0]], steps[name], strict=True)).mean


def report(environment: Environment, runs: list[dict], bars: list[dict], ceilings: list[dict]) -> str:
    """Markdown: the header, the runs, per bar each run's interval and the interval over the runs, and per ceiling
    its interval over the runs and the bars above it."""
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
    if ceilings:
        lines += ["", "## Ceilings", "", "| ceiling | shape | across the runs | bounds | bars it bounds above its "
                  "interval (cannot be met here) | bars it bounds within or under it |", "|---|---|---:|---|---|---|"]
        for ceiling in ceilings:
            above, within = (_bar_list(ceiling[key]) for key in ("bars_above", "bars_within"))
            lines.append(f"| `{ceiling['ceiling']}`: {ceiling['what']} | {ceiling['shape'].replace('x', '×')} | "
                         f"{_interval(ceiling['across_runs']).describe('.3f')} | {ceiling['bounds']} | {above} | "
                         f"{within} |")
    return "\n".join(lines) + "\n"


def _bar_list(bars: list[dict]) -> str:
    """"a ≥ 1.3×, b ≥ 1.1×", or "none"."""
    return ", ".join(f"{bar['contender']} ≥ {bar['required']:g}×" for bar in bars) or "none"


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
    bars, ceilings = pooled_bars(runs), pooled_ceilings(runs)
    markdown = report(environment, runs, bars, ceilings)
    print(markdown)
    write_results(args.output, STEM, markdown, {
        "environment": asdict(environment),
        "runs": [{"folder": run["folder"], "environment": run["environment"]} for run in runs],
        "bars": bars,
        "ceilings": ceilings,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
