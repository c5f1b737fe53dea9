"""benchmarks/gpu_check.py on CPU at a tiny size: every op it times (the new kernels' torch paths' callers
included) runs forward and forward+backward, and the table gives each its ratio to SDPA."""

from __future__ import annotations

import json

from benchmarks import gpu_check


def test_every_op_runs_both_passes_on_cpu(tmp_path):
    gpu_check.main(["--device", "cpu", "--lengths", "48", "--repeats", "1", "--output", str(tmp_path)])
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    ops = {"sdpa", "sliced_relu", "sliced_relu_bump", f"windowed_softmax_w{gpu_check.WINDOW}",
           f"sliced_relu_window{gpu_check.WINDOW}", "rela"}
    assert {(r["op"], r["pass"]) for r in rows} == {(op, p) for op in ops for p in ("fwd", "fwd+bwd")}
    assert all(r["seconds"] > 0 for r in rows)
    table = (tmp_path / "gpu_check.md").read_text()
    assert f"| 48 | sliced_relu_window{gpu_check.WINDOW} | fwd+bwd |" in table
