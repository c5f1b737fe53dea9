"""What the benchmark scripts share: peak-memory measurement, number formats, acceptance bars and
the source state a result was measured at. Imported as ``benchmarks._report`` (the scripts put
the repository root on ``sys.path``)."""

from __future__ import annotations

import ctypes
import gc
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LIBC = ctypes.CDLL("libc.so.6")


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM, ...) in KiB."""
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def reset_peak() -> int:
    """Release freed memory to the kernel and reset VmHWM to VmRSS; returns that baseline in bytes.
    After a run, ``status_kib("VmHWM") * 1024 - baseline`` is its largest extra resident memory."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return status_kib("VmRSS") * 1024


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
        if self.value is None or math.isnan(self.value):
            return "not measured"
        ok = self.value >= self.threshold if self.at_least else self.value <= self.threshold
        return "PASS" if ok else "FAIL"

    def row(self) -> str:
        value = "–" if self.value is None else f"{self.value:.3g}"
        sign = "≥" if self.at_least else "≤"
        return f"| {self.description} | {value} | {sign} {self.threshold:g} | **{self.verdict}** |"


def source_state() -> str:
    """The commit benchmarked, and the package files that differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.rstrip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "hf_sliced_attn").splitlines()
    return f"commit {commit}" + (f" with uncommitted changes to {', '.join(line[3:] for line in dirty)}" if dirty else "")


def environment(script: str, argv: list[str] | None) -> dict[str, object]:
    """What a result was measured with: the command (``python benchmarks/<script>`` and its
    arguments, ``sys.argv`` when ``argv`` is None), the torch, transformers and Python versions,
    torch's threads, the cores and :func:`source_state`."""
    import torch
    import transformers

    return {
        "command": shlex.join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)]),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "source": source_state(),
    }
