"""Runs of ``bench_long_range.py`` made with one setting, pooled into one report: the seeds and contenders of a
comparison may come from several commands (a run too long for one sitting split by contender and seed, or seeds
added later), and the paired differences to softmax are taken over every seed that both ran.

    python benchmarks/long_range_runs.py benchmarks/results/long_range_listops_sliced_3000 \
        /work/runs/listops3000/sdpa_seed0 /work/runs/listops3000/rela_seed0 \
        --output benchmarks/results/long_range_listops_3000

Each input is a folder that bench_long_range.py wrote (``--output``). The folders must agree on every setting that
shapes a run (:data:`RUN_SETTINGS`: model, optimiser, steps, seconds, batch, evaluation sizes, threads, device);
their tasks, lengths, seeds and contenders may differ. A (task, T, contender, seed) may appear in one folder only,
and a task at a T must have the same chance levels (the same validation and test examples) in every folder.

The folders may come from different commits. Each run is listed with its folder's commit, and the report says how
many commits it pools: pool runs of several commits only where the code they ran computes the same thing (say so
beside the result, with the check that shows it).

Written: ``<output>/long_range.{md,json,png}``, the benchmark's table, curves and run records, with a section on
the pooled folders (each one's command, commit, date, machine and runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks import bench_long_range as bench  # noqa: E402
from benchmarks._harness import Environment, plot_curves, write_results  # noqa: E402

RUN_SETTINGS = ("steps", "seconds", "batch_size", "learning_rate", "warmup_steps", "evaluations",
                "validation_examples", "test_examples", "layers", "hidden_size", "heads", "intermediate_size",
                "local_window", "pooling", "threads", "device")
"""The settings of bench_long_range.py that the pooled folders must share (the others say which runs a command
made, or how many ran at a time)."""


def load_folder(folder: Path) -> dict[str, Any]:
    """``folder``'s ``long_range.json`` with the folder's name added. A setting the file lacks (an option added to
    the benchmark after that run) is given its default, which is what the run used."""
    path = folder / f"{bench.STEM}.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: give folders that bench_long_range.py wrote (its --output)")
    entry = {"folder": str(folder), **json.loads(path.read_text())}
    if "folders" in entry:
        raise SystemExit(f"{path} is a pooled report (long_range_runs.py's): give the folders it pooled instead")
    entry["settings"] = {**vars(bench.parse_args([])), **entry["settings"]}
    return entry


def check_poolable(folders: list[dict[str, Any]]) -> None:
    """Raises SystemExit naming the first setting, chance level or run that stops ``folders`` from pooling."""
    first = folders[0]
    for other in folders[1:]:
        differ = [f"{name} {first['settings'][name]!r} in {first['folder']}, {other['settings'][name]!r} in "
                  f"{other['folder']}" for name in RUN_SETTINGS if first["settings"][name] != other["settings"][name]]
        if differ:
            raise SystemExit(f"the folders were run with different settings ({'; '.join(differ)}): pool runs of one "
                             "setting only")
    chance: dict[str, tuple[str, Any]] = {}
    for entry in folders:
        for key, levels in entry["chance"].items():
            seen = chance.setdefault(key, (entry["folder"], levels))
            if seen[1] != levels:
                raise SystemExit(f"{key.replace('/', ' at T = ')} has other validation or test examples in "
                                 f"{entry['folder']} than in {seen[0]}: pool runs of the same examples only")
    owner: dict[tuple[str, int, str, int], str] = {}
    for entry in folders:
        for run in entry["runs"]:
            key = (run["task"], run["length"], run["contender"], run["seed"])
            if key in owner:
                raise SystemExit(f"{key[0]} T={key[1]} {key[2]} seed {key[3]} is in both {owner[key]} and "
                                 f"{entry['folder']}: give each run once")
            owner[key] = entry["folder"]


def pooled_records(folders: list[dict[str, Any]]) -> list[tuple[bench.RunRecord, str]]:
    """Every run with its folder, ordered by task, T, seed and the benchmark's order of contenders."""
    order = list(bench.BY_NAME)
    records = [(bench.RunRecord(**run), entry["folder"]) for entry in folders for run in entry["runs"]]
    return sorted(records, key=lambda pair: (pair[0].task, pair[0].length, pair[0].seed,
                                             order.index(pair[0].contender)))


def pooled_settings(folders: list[dict[str, Any]], records: list[bench.RunRecord]) -> argparse.Namespace:
    """The shared settings, with the tasks, lengths, seeds and contenders of all the runs (one run at a time: each
    folder's command says how its runs shared the machine)."""
    def present(attribute: str) -> list[Any]:
        return list(dict.fromkeys(getattr(record, attribute) for record in records))

    return argparse.Namespace(**{name: folders[0]["settings"][name] for name in RUN_SETTINGS},
                              tasks=present("task"), lengths=present("length"), seeds=sorted(present("seed")),
                              contenders=[name for name in bench.BY_NAME if name in present("contender")], jobs=1)


def short_commit(entry: dict[str, Any]) -> str:
    """The folder's commit, abbreviated, and whether its sources differed from it."""
    source = entry["source"]
    return source["commit"][:7] + (f" with changes to {', '.join(source['changes'])}" if source["dirty"] else "")


def folders_section(folders: list[dict[str, Any]], records: list[tuple[bench.RunRecord, str]]) -> list[str]:
    """Markdown: each pooled folder's command, commit, date, machine and runs; then every run's test accuracy with
    its folder and commit."""
    commits = {entry["source"]["commit"] for entry in folders}
    lines = ["## Pooled folders", "",
             f"{len(folders)} folders of bench_long_range.py, from {len(commits)} commit{'s' * (len(commits) > 1)}.",
             "", "| folder | command | commit | date | machine | runs |", "|---|---|---|---|---|---|"]
    commit_of = {entry["folder"]: short_commit(entry) for entry in folders}
    for entry in folders:
        env = entry["environment"]
        runs = ", ".join(f"{run['contender']} seed {run['seed']}" for run in entry["runs"])
        lines.append(f"| `{entry['folder']}` | `{env['command']}` | {commit_of[entry['folder']]} | {env['date']} | "
                     f"{env['cpu']}, {env['threads']} thread{'s' * (env['threads'] != 1)} | {runs} |")
    lines += ["", "| task | T | contender | seed | test accuracy | steps | training s | folder | commit |",
              "|---|---:|---|---:|---:|---:|---:|---|---|"]
    for record, folder in records:
        lines.append(f"| {record.task} | {record.length} | {record.contender} | {record.seed} | "
                     f"{record.test_accuracy:.3f} | {record.steps} | {record.train_seconds:.0f} | `{folder}` | "
                     f"{commit_of[folder]} |")
    return lines + [""]


def report(environment: Environment, args: argparse.Namespace, folders: list[dict[str, Any]],
           records: list[tuple[bench.RunRecord, str]], rows: list[dict[str, Any]],
           chance: dict[str, dict[str, Any]]) -> str:
    """The markdown results file: the benchmark's sections over the pooled runs, then the folders."""
    runs = [record for record, _ in records]
    contenders = [f"- `{name}`: {bench.BY_NAME[name].description}" for name in args.contenders]
    return "\n".join(["# Quality at long range: small encoders trained from scratch, pooled runs (issue #25)", "",
                      f"{environment.describe()}.", "", *bench.scope_lines(args, runs), bench.settings_line(args), "",
                      *contenders, "", *bench.results_table(rows), *bench.curve_table(runs, chance),
                      *folders_section(folders, records),
                      f"Curves: `{bench.STEM}.png`; every run, its curve and folder: `{bench.STEM}.json`.", ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="the --output folders of bench_long_range.py runs")
    parser.add_argument("--output", type=Path, required=True, help=f"where to write {bench.STEM}.{{md,json,png}}")
    args = parser.parse_args(argv)
    if len(args.folders) < 2:
        parser.error("give two folders or more: one folder's report is bench_long_range.py's own")
    environment = Environment.now(Path(__file__).name, argv)
    folders = [load_folder(folder) for folder in args.folders]
    check_poolable(folders)
    records = pooled_records(folders)
    runs = [record for record, _ in records]
    chance = {key: levels for entry in folders for key, levels in entry["chance"].items()}
    settings = pooled_settings(folders, runs)
    rows = bench.summarize(runs, chance)
    markdown = report(environment, settings, folders, records, rows, chance)
    print(markdown)
    write_results(args.output, bench.STEM, markdown, {
        "environment": asdict(environment), "comparison": bench.comparison(runs),
        "folders": [{key: entry[key] for key in ("folder", "environment", "source", "settings")} for entry in folders],
        "settings": vars(settings), "contenders": {name: asdict(bench.BY_NAME[name]) for name in settings.contenders},
        "chance": chance, "summary": rows, "runs": [asdict(record) | {"folder": folder} for record, folder in records]})
    plot_curves(args.output / f"{bench.STEM}.png", bench.curve_panels(runs, chance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
