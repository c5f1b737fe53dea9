"""benchmarks/_harness.py on synthetic numbers: skip prediction, ratios, the timing loops, the
environment header every results file opens with, and that the scripts leave these to it."""

from __future__ import annotations

import argparse
import ast
import functools
import re
import subprocess
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from benchmarks._harness import (
    FAILED,
    SKIPPED,
    Budget,
    CheckFailed,
    Growth,
    Panel,
    Point,
    Run,
    Series,
    attempt,
    choice_list,
    interleaved,
    measure_point,
    paired_interval,
    plot_loglog,
    point_ratio,
    skip_reason,
)

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
QUADRATIC = Growth(time=2.0, memory=1.0)
BUDGET = Budget(seconds=100.0, memory_fraction=0.5)


def point(seconds: float, peak_bytes: int = 2**20) -> Point:
    return Point(seconds, [seconds], peak_bytes)


# --------------------------------------------------------------------------- skip prediction


def test_the_time_is_predicted_from_the_largest_smaller_t_by_the_growth():
    series = Series({256: point(0.001), 1024: point(10.0)})
    assert skip_reason(series, 2048, QUADRATIC, BUDGET) is None  # 10 s x 2^2 = 40 s
    reason = skip_reason(series, 4096, QUADRATIC, BUDGET)  # 10 s x 4^2 = 160 s
    assert reason is not None and "predicted 160 s > 100 s" in reason and "from T=1024" in reason
    assert skip_reason(series, 4096, Growth(time=1.0, memory=1.0), BUDGET) is None  # 10 s x 4 = 40 s


def test_the_memory_is_predicted_against_the_available_ram():
    available = psutil.virtual_memory().available
    series = Series({1024: point(0.001, peak_bytes=available // 3)})
    assert skip_reason(series, 1024 + 1, QUADRATIC, BUDGET) is None  # about a third < half
    reason = skip_reason(series, 2048, QUADRATIC, BUDGET)  # two thirds > half
    assert reason is not None and "GiB available" in reason


def test_after_a_skip_the_larger_t_are_skipped_and_after_an_error_they_run():
    assert skip_reason(Series({1024: SKIPPED}), 4096, QUADRATIC, BUDGET) == "a smaller T was skipped"
    assert skip_reason(Series({1024: FAILED}), 4096, QUADRATIC, BUDGET) is None
    assert skip_reason(Series(), 4096, QUADRATIC, BUDGET) is None


def test_attempt_records_points_skips_and_errors_and_stops_on_a_failed_check():
    series = Series()
    assert attempt(series, 1024, lambda: point(60.0), QUADRATIC, BUDGET, "c") == point(60.0)
    assert attempt(series, 2048, lambda: pytest.fail("a skipped point must not run"), QUADRATIC, BUDGET, "c") is None

    def broken() -> Point:
        raise ValueError("out of luck")

    other = Series()
    assert attempt(other, 1024, broken, QUADRATIC, BUDGET, "c") is None
    assert other.points == {1024: FAILED} and other.reasons[1024] == "ValueError: out of luck"

    def wrong() -> Point:
        raise CheckFailed("not what it claims")

    with pytest.raises(CheckFailed):
        attempt(Series(), 1024, wrong, QUADRATIC, BUDGET, "c")
    assert series.points[2048] == SKIPPED and "predicted 240 s" in series.reasons[2048]
    assert [r["T"] for r in series.records()] == [1024, 2048] and series.records()[1]["status"] == SKIPPED


# --------------------------------------------------------------------------- ratios


def test_point_ratio_divides_the_chosen_quantity_and_is_none_without_both_points():
    fast, slow = Point(0.5, [0.5], 3 * 2**20), Point(2.0, [2.0], 2**20)
    assert point_ratio(slow, fast) == pytest.approx(4.0)
    assert point_ratio(fast, slow, "peak_bytes") == pytest.approx(3.0)
    assert point_ratio(slow, None) is None and point_ratio(None, fast) is None
    assert point_ratio(slow, Point(0.0, [0.0])) is None


# --------------------------------------------------------------------------- timing


def test_measure_point_warms_up_prepares_every_call_and_sees_the_peak_memory():
    calls: list[str] = []
    size = 64 * 2**20

    def run() -> None:
        calls.append("run")
        torch.ones(size // 4, dtype=torch.float32)  # 64 MiB, written, then freed

    point = measure_point(run, lambda first: 3, prepare=lambda: calls.append("prepare"))
    assert calls == ["prepare", "run"] * 4  # the warm-up and 3 timed runs
    assert len(point.runs) == 3 and point.seconds == sorted(point.runs)[1]
    assert size * 0.9 < point.peak_bytes < size * 1.5


def test_interleaved_runs_take_turns_after_one_warm_up_each_in_rotating_order():
    calls: list[str] = []
    points = interleaved({name: functools.partial(calls.append, name) for name in "abc"}, rounds=4)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab") + list("abc")
    assert {name: len(p.runs) for name, p in points.items()} == {"a": 4, "b": 4, "c": 4}


# --------------------------------------------------------------------------- environment, files, command line


def test_the_header_names_the_commit_and_the_command():
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    run = Run("bench_something.py", ["--lengths", "1,2", "--note", "two words"])
    run.finish()
    command = "python benchmarks/bench_something.py --lengths 1,2 --note 'two words'"
    assert f"`{command}`" in run.header() and f"commit {commit}" in run.header()
    assert f"torch {torch.__version__}" in run.header() and re.search(r"\d{4}-\d\d-\d\d", run.header())
    record = run.record()
    assert record["command"] == command and record["source"].startswith(f"commit {commit}")
    assert record["total_seconds"] >= 0 and set(record["load_average"]) == {"start", "end"}


def test_choice_list_keeps_the_order_given_and_rejects_unknown_names():
    parse = choice_list(["x", "y", "z"])
    assert parse("z, x,z") == ["z", "x"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown"):
        parse("x,w")


def test_a_plot_draws_the_measured_points_only(tmp_path):
    series = Series({256: point(0.01), 1024: point(0.1), 4096: SKIPPED}, {4096: "predicted"})
    assert series.curve("peak_bytes", 2**-20) == ([256, 1024], [1.0, 1.0])
    path = plot_loglog(tmp_path / "plot.png", "t", [Panel("time", "s", "seconds", {"c": series})])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- the scripts use the harness


SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_function_is_over_80_lines(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80]
    assert not long, long


HARNESS_MODULES = {"time", "matplotlib", "platform", "psutil"}
HARNESS_CALLS = {"perf_counter", "getloadavg", "memory_allocated", "max_memory_allocated", "malloc_trim"}


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.name != "_harness.py"], ids=lambda p: p.name)
def test_every_script_leaves_timing_plots_and_the_environment_to_the_harness(path):
    nodes = list(ast.walk(ast.parse(path.read_text())))
    imported = {alias.name.split(".")[0] for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in nodes if isinstance(node, ast.ImportFrom) and node.module}
    called = {node.attr for node in nodes if isinstance(node, ast.Attribute)}
    if "__main__" in path.read_text():  # a script (not a module of data a script imports) opens with the harness
        assert "benchmarks" in imported
    assert not imported & HARNESS_MODULES and not called & HARNESS_CALLS, (imported & HARNESS_MODULES,
                                                                           called & HARNESS_CALLS)


def test_paired_interval_matches_the_t_interval_and_judges_bars():
    from scipy import stats

    values = [0.010, -0.0075, -0.020, 0.004, -0.001]
    interval = paired_interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert interval.mean == pytest.approx(np.mean(values))
    assert (interval.low, interval.high) == (pytest.approx(low), pytest.approx(high))
    assert interval.verdict(interval.low - 1e-9) == "met"
    assert interval.verdict(interval.high + 1e-9) == "not met"
    assert interval.verdict(interval.mean) == "not resolved"
    single = paired_interval([0.5])
    assert single.low is None and single.verdict(0.0) == "not resolved" and single.describe() == "+0.5000 (n=1)"
    with pytest.raises(ValueError, match="at least one pair"):
        paired_interval([])
