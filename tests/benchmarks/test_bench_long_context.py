"""benchmarks/bench_long_context.py on a tiny encoder: every contender runs, the files are written,
and each contender's layers run what it claims (sdpa_global: softmax everywhere, no plugin module)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from benchmarks._harness import Budget, Point, Series, skip_reason

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_long_context.py"
LENGTHS = [128, 256]


def _load():
    spec = importlib.util.spec_from_file_location("bench_long_context", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _load()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    output = tmp_path_factory.mktemp("long_context")
    argv = ["--layers", "2", "--hidden-size", "64", "--heads", "4", "--intermediate-size", "96",
            "--lengths", ",".join(map(str, LENGTHS)), "--threads", "1", "--output", str(output)]
    assert bench.main(argv) == 0
    return output, json.loads((output / "long_context.json").read_text())


def test_every_contender_has_a_time_and_memory_at_every_length(results):
    output, raw = results
    for name in ("long_context.md", "long_context.json", "long_context.png"):
        assert (output / name).stat().st_size > 0
    points = {(p["contender"], p["T"]): p for p in raw["points"]}
    assert set(points) == {(c.name, t) for c in bench.CONTENDERS for t in LENGTHS}
    for point in points.values():
        assert point["seconds"] > 0 and point["peak_bytes"] > 0, point
    report = (output / "long_context.md").read_text()
    assert all(bar["verdict"] == "not measured" for bar in raw["bars"])
    assert report.count("**not measured**") == len(raw["bars"]) == 4  # two bars each, plain and windowed


def test_sdpa_global_is_softmax_everywhere_and_sliced_relu_global_only_on_global_layers(results):
    _, raw = results
    contenders = raw["contenders"]
    sdpa = contenders["sdpa_global"]
    assert [layer["type"] for layer in sdpa["layers"]] == ["full_attention", "sliding_attention"]
    assert all(layer["mode"] == "softmax" and not layer["plugin_modules"] for layer in sdpa["layers"])
    # The global layer went through transformers' SDPA, the local one through the banded windowed softmax.
    assert sdpa["calls"] == {"sdpa_attention_forward": 1, "windowed_softmax": 1, "mechanism": 0}
    sliced = {layer["type"]: layer for layer in contenders["sliced_relu_global"]["layers"]}
    assert sliced["full_attention"]["mode"] == "sliced_relu" and sliced["full_attention"]["plugin_modules"]
    assert sliced["sliding_attention"]["mode"] == "softmax" and not sliced["sliding_attention"]["plugin_modules"]
    assert contenders["sliced_relu_global"]["calls"] == {"sdpa_attention_forward": 0, "windowed_softmax": 1,
                                                         "mechanism": 1}
    # Same seed, same weights: the plugin's softmax path computes transformers' own ModernBERT.
    assert "sdpa_global output − sdpa_stock output" in raw["sanity"]
    assert float(raw["sanity"].split("= ")[1].split(" ")[0]) < 1e-5


def test_the_contenders_growth_decides_what_is_skipped():
    """From the same point, the quadratic contender is predicted over the limit where the sliced one is not."""
    sliced, stock = bench.BY_NAME["sliced_relu_global"], bench.BY_NAME["sdpa_stock"]
    series = Series({4096: Point(seconds=100.0, runs=[100.0], peak_bytes=2**20)})
    budget = Budget(seconds=900, memory_fraction=bench.MEMORY_FRACTION)
    assert skip_reason(series, 16384, sliced.growth, budget) is None  # 100 s x 4^1.1
    assert "predicted 1600 s > 900 s" in skip_reason(series, 16384, stock.growth, budget)  # 100 s x 4^2
