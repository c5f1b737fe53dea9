"""benchmarks/bench_attention_layer.py at a tiny shape: every piece of both contenders' layers is
timed, on the modules each contender claims (a linear projection, or the conversions' MLP and output)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_attention_layer.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_attention_layer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_every_piece_is_timed_on_the_contenders_modules(tmp_path):
    assert bench.main(["--shapes", "2x16", "--repeats", "2", "--threads", "1", "--output", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "attention_layer.json").read_text())["results"]
    pieces = {(r["contender"], r["piece"]) for r in records}
    both = ("projection", "projection_formed", "op", "layer", "layer_formed")
    assert pieces == {("sliced_relu", p) for p in both} | {("sliced_relu_converted", p) for p in (*both, "output")}
    assert all(r["layer_s"] > 0 and r["step_s"] == r["layer_s"] * r["layers"] for r in records)
    assert "| sliced_relu_converted | 2x16 | output |" in (tmp_path / "attention_layer.md").read_text()


def test_layer_inputs_are_layer_0s_with_its_mask():
    model = bench.build_model("sliced_relu_converted")
    batch = bench.make_batch(4, 12, model.config.vocab_size, model.config.pad_token_id)
    inputs = bench.layer_inputs(model, batch)
    assert inputs["module"] is model.bert.encoder.layer[0].attention.self
    assert type(inputs["module"].sliced_projection).__name__ == "SlicedMLPProjection"
    assert inputs["hidden_states"].shape == (4, 12, 384)
    assert inputs["value"].shape == (4, 12, 12, 32)
    assert inputs["attention_mask"].equal(batch["attention_mask"].bool())
