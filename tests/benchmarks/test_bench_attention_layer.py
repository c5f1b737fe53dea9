"""benchmarks/bench_attention_layer.py at a tiny shape: every piece of the contenders' layers is timed, on the
modules each contender claims (a linear projection, the conversion's MLP and output, a local window), beside
SDPA's layer."""

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
    every = ("projection", "projection_formed", "op", "layer", "layer_formed", "sdpa_fused_layer")
    windowed = (*every, "output", "window", "window_combined")
    assert pieces == ({("sliced_relu", p) for p in every} | {("sliced_relu_converted", p) for p in (*every, "output")}
                      | {("sliced_relu_window4_linear1", p) for p in windowed})
    assert all(r["layer_s"] > 0 and r["step_s"] == r["layer_s"] * r["layers"] for r in records)
    markdown = (tmp_path / "attention_layer.md").read_text()
    assert "| sliced_relu_converted | 2x16 | output |" in markdown
    window_layer = {r["piece"]: r for r in records if r["contender"] == "sliced_relu_window4_linear1"}
    layer, sdpa = window_layer["layer"], window_layer["sdpa_fused_layer"]
    assert f"| layer | {layer['layer_s'] * 1e3:.1f} ms | {layer['step_s'] * 1e3:.0f} ms | " \
        f"{sdpa['layer_s'] / layer['layer_s']:.2f}× |" in markdown


def test_layer_inputs_are_layer_0s_with_its_mask():
    model = bench.build_model("sliced_relu_converted")
    batch = bench.make_batch(4, 12, model.config.vocab_size, model.config.pad_token_id)
    inputs = bench.layer_inputs(model, batch)
    assert inputs["module"] is model.bert.encoder.layer[0].attention.self
    assert type(inputs["module"].sliced_projection).__name__ == "SlicedMLPProjection"
    assert inputs["hidden_states"].shape == (4, 12, 384)
    assert inputs["value"].shape == (4, 12, 12, 32)
    assert inputs["attention_mask"].equal(batch["attention_mask"].bool())


def test_window_pieces_run_the_layers_window_and_combination(monkeypatch):
    """The window pieces time the layer's own window (its size and combination) on its q and k."""
    model = bench.build_model("sliced_relu_window4_linear1")
    batch = bench.make_batch(2, 10, model.config.vocab_size, model.config.pad_token_id)
    inputs = bench.layer_inputs(model, batch)
    window = bench.find_window_module(inputs["module"], bench.WINDOW_PREFIX)
    assert (window.window, window.combine) == (4, "shared")
    seen = []
    original = bench.local_window_attention

    def spy(*args, **kwargs):
        seen.append((kwargs["window"], kwargs["combine"], kwargs["scaling"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(bench, "local_window_attention", spy)
    bench.pieces(inputs)["window_combined"]()
    assert seen == [(4, "shared", inputs["module"].scaling)]
