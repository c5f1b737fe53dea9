"""What every benchmark script shares: the environment header a results file opens with, timing
(one call, repeated calls with their peak memory, and contenders taking turns), skip prediction,
ratios, acceptance bars, paired per-seed differences with their intervals, number formats, log-log
plots and the results files themselves.

Imported as ``benchmarks._harness`` (each script puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
"""Where a script writes its results unless given ``--output``."""
SOURCES = ("hf_sliced_attn", "recipes", "benchmarks", ":(exclude)benchmarks/results")
"""The paths whose uncommitted changes a result names (everything that decides what is measured)."""
CPU = torch.device("cpu")
SKIPPED, FAILED = "skipped", "error"
"""What a series records at a T that has no point."""
Result = TypeVar("Result")


# --------------------------------------------------------------------------- the environment


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.rstrip()


def source_state() -> str:
    """The commit benchmarked, and the source files (see ``SOURCES``) that differ from it."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", *SOURCES).splitlines()
    changes = f" with uncommitted changes to {', '.join(line[3:] for line in dirty)}" if dirty else ""
    return f"commit {commit}{changes}"


def source_record() -> dict[str, object]:
    """The full commit (``git rev-parse HEAD``), whether the source files (see ``SOURCES``) differ from it,
    and which do: for a JSON results file."""
    changes = [line[3:] for line in _git("status", "--porcelain", "--", *SOURCES).splitlines()]
    return {"commit": _git("rev-parse", "HEAD") or "unknown", "dirty": bool(changes), "changes": changes}


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the machine type where it has none."""
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else platform.machine()


@dataclass(frozen=True)
class Environment:
    """What a result was measured with: the command that produced it, the source state, the date,
    the versions, the CPU, torch's threads and the RAM."""

    command: str
    source: str
    date: str
    torch: str
    transformers: str
    python: str
    cpu: str
    cpu_count: int
    threads: int
    ram_gib: float

    @classmethod
    def now(cls, script: str, argv: list[str] | None) -> Environment:
        """This process's environment; the command is ``python benchmarks/<script>`` with ``argv``
        (``sys.argv[1:]`` when None)."""
        return cls(
            command=shlex.join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)]),
            source=source_state(), date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            torch=torch.__version__, transformers=version("transformers"), python=platform.python_version(),
            cpu=cpu_name(), cpu_count=os.cpu_count() or 1, threads=torch.get_num_threads(),
            ram_gib=round(psutil.virtual_memory().total / 2**30, 1),
        )

    def describe(self) -> str:
        return (f"`{self.command}` — {self.source}, {self.date}; torch {self.torch}, transformers "
                f"{self.transformers}, Python {self.python}; {self.cpu}, {self.cpu_count} cores "
                f"({self.threads} torch thread{'s' * (self.threads != 1)}), {self.ram_gib:.0f} GiB RAM")


class Run:
    """One benchmark run: its environment (printed when the run starts), and from its start to
    :meth:`finish` its total time and the machine's 1-min load average at both ends (above the core
    count, other processes shared the cores)."""

    def __init__(self, script: str, argv: list[str] | None) -> None:
        self.environment = Environment.now(script, argv)
        self.load_start = os.getloadavg()[0]
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self.load_end: float | None = None
        print(f"{self.environment.describe()}; load average {self.load_start:.2f}", flush=True)

    def finish(self) -> None:
        self.seconds = time.perf_counter() - self.started
        self.load_end = os.getloadavg()[0]

    def header(self) -> str:
        """The paragraph a results file opens with (after :meth:`finish`)."""
        return (f"{self.environment.describe()}. Total {self.seconds:.0f} s; 1-min load average "
                f"{self.load_start:.2f} at the start, {self.load_end:.2f} at the end (a load above the core "
                "count means other processes shared the cores and times are inflated).")

    def record(self) -> dict[str, object]:
        """The header's facts for a JSON results file (after :meth:`finish`)."""
        return {**asdict(self.environment), "total_seconds": self.seconds,
                "load_average": {"start": self.load_start, "end": self.load_end}}


def write_results(output: Path, stem: str, markdown: str, data: dict[str, object]) -> None:
    """``<output>/<stem>.md`` and ``<stem>.json``."""
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{stem}.md").write_text(markdown)
    (output / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {output / stem}.md and {stem}.json", flush=True)


# --------------------------------------------------------------------------- command lines


def int_list(text: str) -> list[int]:
    """A comma-separated list of integers, sorted, each once."""
    return sorted({int(part) for part in text.split(",") if part.strip()})


def choice_list(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated, non-empty list of names from ``choices``, in the order given."""
    known = list(choices)

    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {unknown or 'empty list'}; choose from {', '.join(known)}")
        return names

    return parse


# --------------------------------------------------------------------------- timing and memory


def status_kib(name: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM, ...) in KiB."""
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{name}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def reset_peak() -> int:
    """Release freed memory to the kernel and reset VmHWM to VmRSS; returns that baseline in bytes.

    Python garbage is collected, ``malloc_trim(0)`` hands freed heap pages back and ``5`` written
    to ``/proc/self/clear_refs`` resets the kernel's high-water mark, so that after a run
    ``status_kib("VmHWM") * 1024 - baseline`` is its largest extra resident memory at any instant
    (the kernel updates the mark on every page fault: no sampling can miss a short peak)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return status_kib("VmRSS") * 1024


def timed(run: Callable[[], Result]) -> tuple[Result, float]:
    """``run()``'s result and its wall-clock seconds (``time.perf_counter``)."""
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def peak_run(run: Callable[[], object], device: torch.device = CPU) -> tuple[float, int]:
    """Seconds and peak memory growth in bytes of one call of ``run``: on CPU the resident set's
    (:func:`reset_peak`), on CUDA the allocator's, the device synchronised around the call."""
    if device.type == "cpu":
        baseline = reset_peak()
        _, seconds = timed(run)
        return seconds, max(0, status_kib("VmHWM") * 1024 - baseline)
    if device.type != "cuda":
        raise ValueError(f"no peak-memory measure for device {device}")

    def synchronized() -> None:
        run()
        torch.cuda.synchronize(device)

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    _, seconds = timed(synchronized)
    return seconds, torch.cuda.max_memory_allocated(device) - baseline


@dataclass
class Point:
    """One measurement: the median seconds per run, every timed run's seconds and, where it was
    measured, the largest peak-memory growth in bytes."""

    seconds: float
    runs: list[float] = field(default_factory=list)
    peak_bytes: int | None = None

    def describe(self) -> str:
        memory = "" if self.peak_bytes is None else f"  peak +{fmt_bytes(self.peak_bytes):>9s}"
        return f"{fmt_time(self.seconds):>9s}{memory}  ({len(self.runs)} run{'s' * (len(self.runs) > 1)})"


def measure_point(run: Callable[[], object], reps: int | Callable[[float], int], *, warm_up: bool = True,
                  prepare: Callable[[], None] | None = None, device: torch.device = CPU) -> Point:
    """Time ``run`` with its peak memory (:func:`peak_run`): one warm-up call, not counted, unless
    ``warm_up`` is False, then ``reps`` timed calls, or ``reps(seconds of the first)`` when it is a
    function; the point is their median time and largest peak. ``prepare`` runs before every call,
    outside the measurement."""

    def call() -> tuple[float, int]:
        if prepare is not None:
            prepare()
        return peak_run(run, device)

    if warm_up:
        call()  # measured like the others, and not counted
    first = call()
    count = reps(first[0]) if callable(reps) else reps
    measured = [first] + [call() for _ in range(count - 1)]
    seconds = [s for s, _ in measured]
    return Point(statistics.median(seconds), seconds, max(peak for _, peak in measured))


def interleaved(runs: dict[str, Callable[[], object]], rounds: int, label: str | None = None) -> dict[str, Point]:
    """Time contenders side by side: one warm-up call of each, then ``rounds`` rounds of one timed
    call of each, so that a slow period of a shared machine slows them alike. The order rotates from
    round to round (round r starts with the contender at position r mod n), so that over n rounds each
    contender runs once in each position, right after each of the others: what a call leaves behind
    (freed memory, evicted caches) weighs on every contender alike. With a ``label``, every warm-up and
    round is printed (in the given order)."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for name, run in runs.items():
        _, warm = timed(run)
        if label is not None:
            print(f"  {label} {name:22s} warm-up {warm * 1e3:8.1f} ms", flush=True)
    names = list(runs)
    for index in range(rounds):
        start = index % len(names)
        for name in names[start:] + names[:start]:
            seconds[name].append(timed(runs[name])[1])
        if label is not None:
            print(f"  {label} round {index + 1}/{rounds}: "
                  + ", ".join(f"{name} {times[-1] * 1e3:.1f} ms" for name, times in seconds.items()), flush=True)
    return {name: Point(statistics.median(times), times) for name, times in seconds.items()}


# --------------------------------------------------------------------------- series and skipping


@dataclass
class Series:
    """One contender's points over the sequence length T (in one mode): each T tried maps to its
    :class:`Point`, or to ``SKIPPED`` or ``FAILED`` with the reason in ``reasons``."""

    points: dict[int, Point | str] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)

    def get(self, length: int) -> Point | None:
        point = self.points.get(length)
        return point if isinstance(point, Point) else None

    def cell(self, length: int, formatter: Callable[[Point], str]) -> str:
        """A table cell: the formatted point, its status, or "–" where T was not tried."""
        point = self.points.get(length, "–")
        return formatter(point) if isinstance(point, Point) else point

    def previous(self, length: int) -> tuple[int, Point | str] | None:
        """The largest T below ``length`` that was tried, and what it gave."""
        tried = [t for t in self.points if t < length]
        return (max(tried), self.points[max(tried)]) if tried else None

    def curve(self, attr: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
        """The measured points' T and ``attr`` times ``scale``, by T."""
        lengths = sorted(t for t in self.points if self.get(t) is not None)
        return lengths, [getattr(self.get(t), attr) * scale for t in lengths]

    def within(self, lengths: Iterable[int]) -> Series:
        """The same series at ``lengths`` only."""
        keep = set(lengths)
        return Series({t: p for t, p in self.points.items() if t in keep},
                      {t: r for t, r in self.reasons.items() if t in keep})

    def records(self) -> list[dict[str, object]]:
        """Every T tried, for a JSON results file."""
        return [{"T": t, **(asdict(p) if isinstance(p, Point) else {"status": p, "reason": self.reasons[t]})}
                for t, p in self.points.items()]


@dataclass(frozen=True)
class Growth:
    """How a contender's cost grows with T: time ~ T^time, memory ~ T^memory."""

    time: float
    memory: float


@dataclass(frozen=True)
class Budget:
    """What one point may take: ``seconds`` per run, and ``memory_fraction`` of the RAM available
    just before it runs."""

    seconds: float
    memory_fraction: float


def skip_reason(series: Series, length: int, growth: Growth, budget: Budget) -> str | None:
    """Why the point at ``length`` is not run, predicted from the series' previous point by
    ``growth``; None to run it. Once a T is skipped, the larger ones are too."""
    previous = series.previous(length)
    if previous is None or previous[1] == FAILED:
        return None
    from_length, point = previous
    if not isinstance(point, Point):
        return "a smaller T was skipped"
    factor = length / from_length
    seconds = point.seconds * factor**growth.time
    memory = (point.peak_bytes or 0) * factor**growth.memory
    available = psutil.virtual_memory().available
    if seconds > budget.seconds:
        return f"predicted {seconds:.0f} s > {budget.seconds:.0f} s (time ~ T^{growth.time:g} from T={from_length})"
    if memory > budget.memory_fraction * available:
        return (f"predicted {memory / 2**30:.1f} GiB > {budget.memory_fraction:.0%} of {available / 2**30:.1f} GiB "
                f"available (memory ~ T^{growth.memory:g} from T={from_length})")
    return None


class CheckFailed(RuntimeError):
    """A contender does not run what it claims: the run stops (no point records it as failed)."""


def attempt(series: Series, length: int, measure: Callable[[], Point], growth: Growth, budget: Budget,
            label: str) -> Point | None:
    """Measure the point at ``length`` into ``series`` unless :func:`skip_reason` skips it; an
    exception other than :class:`CheckFailed` is recorded as ``FAILED`` and the run goes on."""
    reason = skip_reason(series, length, growth, budget)
    if reason is not None:
        series.points[length], series.reasons[length] = SKIPPED, reason
    else:
        try:
            series.points[length] = measure()
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (a failing contender must not stop the others)
            series.points[length], series.reasons[length] = FAILED, f"{type(error).__name__}: {error}"
    point = series.points[length]
    outcome = point.describe() if isinstance(point, Point) else f"{point}: {series.reasons[length]}"
    print(f"  {label} T={length:7d}  {outcome}", flush=True)
    return series.get(length)


# --------------------------------------------------------------------------- ratios, bars, formats


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator; None where either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def point_ratio(numerator: Point | None, denominator: Point | None, attr: str = "seconds") -> float | None:
    """The ratio of two points' ``attr`` (seconds or peak_bytes); None where either is missing."""
    if numerator is None or denominator is None:
        return None
    return ratio(getattr(numerator, attr), getattr(denominator, attr))


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def fmt_bytes(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


@dataclass
class Bar:
    """An acceptance bar: ``value`` must be >= ``threshold`` (``at_least``) or <= it; None: not measured."""

    description: str
    value: float | None
    threshold: float
    at_least: bool

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        ok = self.value >= self.threshold if self.at_least else self.value <= self.threshold
        return "PASS" if ok else "FAIL"

    def row(self) -> str:
        value = "–" if self.value is None else f"{self.value:.3g}"
        sign = "≥" if self.at_least else "≤"
        return f"| {self.description} | {value} | {sign} {self.threshold:g} | **{self.verdict}** |"

    def record(self) -> dict[str, object]:
        return {"bar": self.description, "value": self.value, "threshold": self.threshold,
                "at_least": self.at_least, "verdict": self.verdict}


def bars_table(bars: list[Bar]) -> str:
    """A "Bars" section: each bar's measured value, requirement and verdict."""
    lines = ["## Bars", "", "| bar | measured | required | verdict |", "|---|---:|---:|---|"]
    return "\n".join(lines + [bar.row() for bar in bars]) + "\n"


# --------------------------------------------------------------------------- paired differences


@dataclass(frozen=True)
class PairedInterval:
    """The mean of paired per-seed values (differences or ratios of a contender to its reference, same seed)
    and its two-sided Student-t confidence interval; ``low``/``high`` are None with fewer than two pairs."""

    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None
    confidence: float = 0.95

    def verdict(self, bar: float) -> str:
        """Against "at least ``bar``": "met" only when the interval's lower end clears it, "not met" when its upper
        end is below it, otherwise "not resolved" (more pairs are needed)."""
        if self.low is not None and self.low >= bar:
            return "met"
        if self.high is not None and self.high < bar:
            return "not met"
        return "not resolved"

    def describe(self, spec: str = "+.4f") -> str:
        """``mean [low, high]`` (the interval left out with fewer than two pairs), n pairs."""
        interval = "" if self.low is None else f" [{self.low:{spec}}, {self.high:{spec}}]"
        return f"{self.mean:{spec}}{interval} (n={len(self.values)})"

    def record(self) -> dict[str, object]:
        return asdict(self)


def paired_interval(values: Iterable[float], confidence: float = 0.95) -> PairedInterval:
    """:class:`PairedInterval` of per-seed paired ``values``: mean ± t_{(1+c)/2, n-1} · s / sqrt(n)."""
    from scipy.stats import t as student_t

    values = tuple(values)
    if not values:
        raise ValueError("paired_interval needs at least one pair")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return PairedInterval(values, mean, None, None, confidence)
    half = float(student_t.ppf((1 + confidence) / 2, len(values) - 1)) * statistics.stdev(values) / len(values) ** 0.5
    return PairedInterval(values, mean, mean - half, mean + half, confidence)


# --------------------------------------------------------------------------- plots


@dataclass
class Panel:
    """One log-log panel: a title, the y axis's label, the quantity drawn (``attr`` of the points:
    seconds, or peak_bytes drawn in MiB) and its lines (label -> series)."""

    title: str
    ylabel: str
    attr: str
    lines: dict[str, Series]


@dataclass
class CurvePanel:
    """One linear panel of curves: its title, axis labels, the curves (legend label or None, matplotlib colour,
    xs, ys) and optionally a dashed reference line (label, y)."""

    title: str
    xlabel: str
    ylabel: str
    curves: list[tuple[str | None, str, list[float], list[float]]]
    reference: tuple[str, float] | None = None


def plot_curves(path: Path, panels: list[CurvePanel]) -> Path:
    """A PNG of side-by-side linear panels of curves (e.g. accuracy against training time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), constrained_layout=True, squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label, color, xs, ys in panel.curves:
            ax.plot(xs, ys, marker="o", color=color, alpha=0.7, label=label)
        if panel.reference is not None:
            ax.axhline(panel.reference[1], color="gray", linestyle="--", label=panel.reference[0])
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loglog(path: Path, title: str, panels: list[Panel]) -> Path:
    """A PNG of side-by-side log-log panels against the sequence length T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), constrained_layout=True, squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        for label, series in panel.lines.items():
            xs, ys = series.curve(panel.attr, 2**-20 if panel.attr == "peak_bytes" else 1.0)
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
