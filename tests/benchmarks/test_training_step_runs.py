"""benchmarks/training_step_runs.py: the bars judged across runs, each run's mean paired ratio one observation, on
runs the benchmark itself wrote and on runs whose means straddle a bar; runs of different commits are refused."""

from __future__ import annotations

import json
import statistics

import pytest
from scipy.stats import t as student_t

from benchmarks import bench_training_step as bench
from benchmarks import training_step_runs as pool
from benchmarks._harness import paired_interval


def write_run(folder, source: str, ratios: dict[str, list[float]], steps: dict[str, list[float]] | None = None) -> None:
    """A training_step.json as the benchmark writes it, with the paired ratios of the bars in ``ratios``
    (contender -> per-round ratios at 32x128; the other bars not measured) and the step times ``steps`` at 32x128
    (contender -> seconds per round)."""
    bars = []
    for name, (batch, length), required in bench.BARS:
        values = ratios.get(name) if (batch, length) == (32, 128) else None
        interval = None if values is None else paired_interval(values)
        bars.append({"contender": name, "shape": f"{batch}x{length}", "required": required,
                     "paired_ratio": None if interval is None else interval.record(),
                     "interval_verdict": None if interval is None else interval.verdict(required)})
    environment = {"command": "python benchmarks/bench_training_step.py", "source": source, "date": "2026-12-05",
                   "load_average": {"start": 0.5, "end": 1.9}}
    folder.mkdir()
    results = [{"contender": name, "shape": "32x128", "step_s": seconds} for name, seconds in (steps or {}).items()]
    (folder / "training_step.json").write_text(json.dumps({"environment": environment, "results": results,
                                                           "bars": bars}))


def test_the_runs_means_make_the_interval(tmp_path):
    """Three runs whose own intervals clear 1.0 in two: the verdict is that of the runs' means' t-interval."""
    rounds = {"rela_window4": [[1.03, 1.04, 1.02, 1.03], [0.99, 1.01, 1.00, 1.01], [1.02, 1.03, 1.025, 1.02]],
              "sliced_relu_window4_linear1": [[1.02, 1.03, 1.02, 1.025], [1.01, 1.02, 1.015, 1.02],
                                              [1.02, 1.02, 1.03, 1.025]]}
    folders = [tmp_path / f"run{i}" for i in range(3)]
    for i, folder in enumerate(folders):
        write_run(folder, "commit abc1234", {name: runs[i] for name, runs in rounds.items()})
    record = json.loads((folders[1] / "training_step.json").read_text())
    record["bars"].reverse()  # bars are matched by contender and shape, not by position
    (folders[1] / "training_step.json").write_text(json.dumps(record))
    assert pool.main([*map(str, folders), "--output", str(tmp_path / "pooled")]) == 0
    record = json.loads((tmp_path / "pooled" / "training_step_runs.json").read_text())
    assert [bar["contender"] for bar in record["bars"]] == ["sliced_relu_window4_linear1", "rela_window4"]
    for bar in record["bars"]:
        means = [statistics.fmean(run) for run in rounds[bar["contender"]]]
        half = student_t.ppf(0.975, 2) * statistics.stdev(means) / 3 ** 0.5
        across = bar["across_runs"]
        assert across["mean"] == pytest.approx(statistics.fmean(means))
        assert (across["low"], across["high"]) == pytest.approx((statistics.fmean(means) - half,
                                                                 statistics.fmean(means) + half))
        assert bar["verdict"] == ("met" if across["low"] >= 1.0 else "not resolved")
        assert [run["verdict"] for run in bar["runs"]] == [
            paired_interval(run).verdict(1.0) for run in rounds[bar["contender"]]]
    verdicts = {bar["contender"]: bar["verdict"] for bar in record["bars"]}
    assert verdicts == {"sliced_relu_window4_linear1": "met", "rela_window4": "not resolved"}
    markdown = (tmp_path / "pooled" / "training_step_runs.md").read_text()
    assert "| rela_window4 at 32×128 |" in markdown and "**not resolved**" in markdown and "**met**" in markdown


def test_a_ceiling_pooled_over_the_runs_says_which_bars_lie_above_it(tmp_path):
    """The plain kernel's ceiling over three runs: its paired means' interval, the plain bar (1.3) above its upper
    end, and no other bar bounded by it."""
    ceiling = bench.CEILING_PLAIN_KERNEL
    rounds = [([1.7, 1.8, 1.75], [1.36, 1.40, 1.37]), ([1.6, 1.7, 1.65], [1.30, 1.33, 1.31]),
              ([1.8, 1.75, 1.7], [1.43, 1.38, 1.36])]
    folders = [tmp_path / f"run{i}" for i in range(3)]
    for folder, (baseline, steps) in zip(folders, rounds):
        write_run(folder, "commit abc1234", {}, {"sdpa_fused": baseline, ceiling: steps, "sliced_relu": steps})
    assert pool.main([*map(str, folders), "--output", str(tmp_path / "pooled")]) == 0
    record = json.loads((tmp_path / "pooled" / "training_step_runs.json").read_text())
    (pooled,) = record["ceilings"]  # sliced_relu is no ceiling; the others were not measured
    means = [statistics.fmean(b / c for b, c in zip(baseline, steps)) for baseline, steps in rounds]
    assert pooled["ceiling"] == ceiling and pooled["shape"] == "32x128"
    assert pooled["across_runs"]["values"] == pytest.approx(means)
    assert pooled["across_runs"]["high"] < 1.3
    assert pooled["bars_above"] == [{"contender": "sliced_relu", "required": 1.3}] and pooled["bars_within"] == []
    markdown = (tmp_path / "pooled" / "training_step_runs.md").read_text()
    assert f"| `{ceiling}`: sliced_relu with a sliced kernel that costs nothing | 32×128 |" in markdown
    assert "| sliced_relu ≥ 1.3× | none |" in markdown


def test_runs_of_different_commits_are_refused(tmp_path):
    write_run(tmp_path / "a", "commit abc1234", {"rela_window4": [1.0, 1.1]})
    write_run(tmp_path / "b", "commit def5678", {"rela_window4": [1.0, 1.1]})
    with pytest.raises(SystemExit, match="different source states"):
        pool.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="does not exist"):
        pool.main([str(tmp_path / "a"), str(tmp_path / "missing"), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit):  # one run: the benchmark's own interval
        pool.main([str(tmp_path / "a"), "--output", str(tmp_path / "out")])


def test_pools_the_benchmarks_own_runs(tmp_path, monkeypatch):
    """Two tiny runs of the benchmark (a bar at their tiny shape): each run's paired ratio read back from its JSON
    file."""
    monkeypatch.setattr(bench, "BARS", [("rela_window4", (2, 16), 1.0)])
    folders = [tmp_path / f"run{i}" for i in range(2)]
    for folder in folders:
        argv = ["--shapes", "2x16", "--steps", "2", "--threads", "1", "--contenders", "rela_window4",
                "--output", str(folder)]
        assert bench.main(argv) == 0
    assert pool.main([*map(str, folders), "--output", str(tmp_path / "pooled")]) == 0
    record = json.loads((tmp_path / "pooled" / "training_step_runs.json").read_text())
    (bar,) = record["bars"]
    assert bar["contender"] == "rela_window4" and len(bar["runs"]) == 2
    means = [json.loads((f / "training_step.json").read_text())["bars"][0]["paired_ratio"]["mean"] for f in folders]
    assert bar["across_runs"]["values"] == means
