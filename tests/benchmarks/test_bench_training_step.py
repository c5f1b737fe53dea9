"""benchmarks/bench_training_step.py: every contender (the attention-free ceilings included) takes a step at a tiny
size and runs what it claims, and the report names the bars that lie above each ceiling."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_training_step as bench
from benchmarks._harness import Point
from hf_sliced_attn.attention import LAYER_MODE_ATTR


def test_every_contender_takes_a_step(tmp_path):
    assert bench.main(["--shapes", "2x16", "--steps", "1", "--threads", "1", "--output", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "training_step.json").read_text())
    assert {r["contender"] for r in record["results"]} == set(bench.CONTENDERS)
    assert all(r["median_s"] > 0 for r in record["results"])
    markdown = (tmp_path / "training_step.md").read_text()
    assert "- 2x16: sdpa_fused / attention_free = " in markdown
    assert all(f"| 2x16 | {name} | " in markdown for name in bench.CONTENDERS if name != "sdpa_fused")
    assert "- 2x16: sdpa_fused / attention_free_no_qk = " in markdown


def test_a_subset_of_contenders_is_measured_beside_both_baselines(tmp_path):
    argv = ["--shapes", "2x16", "--steps", "1", "--threads", "1", "--output", str(tmp_path), "--contenders",
            "sliced_relu_hybrid"]
    assert bench.main(argv) == 0
    record = json.loads((tmp_path / "training_step.json").read_text())
    assert [r["contender"] for r in record["results"]] == ["sdpa_fused", "sdpa", "sliced_relu_hybrid"]
    assert {bar["verdict"] for bar in record["bars"]} == {"not measured"}
    with pytest.raises(SystemExit):
        bench.main(["--contenders", "softmax"])


@pytest.mark.parametrize("name", ["attention_free", "sliced_relu_converted", "sliced_relu_converted_mlp384",
                                  "sliced_relu_converted_window4",
                                  "sliced_relu_window4_linear1", "sliced_relu_window4_linear4", "sliced_relu_hybrid",
                                  "rela_window4"])
def test_a_contender_runs_its_attention(name):
    model = bench.build_model(name)
    assert model.config._attn_implementation == bench.CONTENDERS[name].implementation
    if name == "rela_window4":
        layers = [layer.attention.self for layer in model.bert.encoder.layer]
        assert [getattr(layer, LAYER_MODE_ATTR) for layer in layers] == ["rela"] * 6
        assert all(layer.rela_window_share.window == 4 for layer in layers)
    if name.startswith("sliced_relu_"):
        modes = [getattr(layer.attention.self, LAYER_MODE_ATTR) for layer in model.bert.encoder.layer]
        converted = [0, 3, 4, 5] if name == "sliced_relu_hybrid" else range(6)
        assert modes == ["sliced_relu" if i in converted else "softmax" for i in range(6)]
        windows = [hasattr(layer.attention.self, "sliced_window_share") for layer in model.bert.encoder.layer]
        assert windows == ["window4" in name] * len(windows)
        widths = {getattr(layer.attention.self.sliced_projection, "width", None) for layer in model.bert.encoder.layer
                  if hasattr(layer.attention.self, "sliced_projection")}
        assert widths == ({96} if name == "sliced_relu_converted" else {384} if "converted" in name or "hybrid" in name
                          else {None})


def test_the_converted_contender_is_what_convert_builds():
    options = bench.hf_sliced_attn.MECHANISMS["sliced_relu"].conversion_options("convert")
    assert {key: value for key, value in options.items() if key != "local_window"} == bench.CONVERTED
    assert options["local_window"] > 0


def test_every_contender_is_paired_with_the_fused_baseline_round_by_round():
    times = {"32x32": {"sdpa_fused": Point(1.0, [1.0, 1.2, 0.8]), "sdpa": Point(1.1, [1.1, 1.2, 0.9]),
                       "rela_window4": Point(1.25, [1.25, 1.5, 1.0])}}
    lines = bench.paired_table(times)
    assert "| 32x32 | rela_window4 | 0.800 [0.800, 0.800] (n=3) |" in lines
    assert not any("| sdpa_fused |" in line for line in lines)
    assert [line for line in lines if line.startswith("| 32x32 | sdpa |")][0].startswith("| 32x32 | sdpa | 0.9")
    assert bench.paired_table({"32x32": {"sdpa_fused": Point(1.0), "sdpa": Point(1.1)}}) == []


def test_the_ceiling_of_every_attention_has_no_query_or_key_layer():
    model = bench.build_model("attention_free_no_qk")
    layers = [layer.attention.self for layer in model.bert.encoder.layer]
    assert all(isinstance(layer.query, bench.FreeProjection) and isinstance(layer.key, bench.FreeProjection)
               for layer in layers)
    assert not any(".query." in name or ".key." in name for name, _ in model.named_parameters())
    hidden = bench.torch.randn(2, 5, model.config.hidden_size)
    assert bench.torch.equal(layers[0].query(hidden), bench.torch.zeros(2, 5, model.config.hidden_size))
    batch = bench.make_batch(2, 8, model.config.vocab_size, model.config.pad_token_id)
    model(**batch).loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_the_ceiling_attention_returns_each_tokens_value():
    value = bench.torch.randn(2, 3, 5, 4)
    out, weights = bench.attention_free(None, value + 1, value - 1, value, None)
    assert weights is None and out.shape == (2, 5, 3, 4)
    assert bench.torch.equal(out, value.transpose(1, 2))


def test_bars_above_the_ceiling_are_named():
    def points(ceiling_s: float) -> dict[str, Point]:
        return {"sdpa_fused": Point(3.0), bench.CEILING: Point(ceiling_s)}

    lines = bench.ceiling_lines({"32x128": points(2.0), "8x512": points(1.6), "4x32": points(2.9)})
    by_shape = {line.split(":")[0].lstrip("- "): line for line in lines if line.startswith("- ")}
    assert "the bars it bounds do not lie above it" in by_shape["32x128"]  # ceiling 1.5 clears converted's 1.1
    assert "sliced_relu_converted ≥ 1.7×" not in by_shape["8x512"]  # ceiling 1.875 clears 1.7
    assert "sliced_relu_converted ≥ 1.1×" in bench.ceiling_lines({"32x128": points(2.9)})[-1]  # ceiling 1.03
    # Plain sliced_relu folds q and k away: its bar (2x at 8x512) is not bounded by a 1.875x ceiling.
    assert "sliced_relu ≥ 2×" not in by_shape["8x512"]
    assert "it bounds no bar at this shape" in by_shape["4x32"]


def test_the_ceiling_of_every_attention_bounds_plain_sliced_relu_too():
    points = {"sdpa_fused": Point(3.0), bench.CEILING: Point(2.0), bench.CEILING_ANY: Point(1.8)}
    lines = bench.ceiling_lines({"8x512": points})
    (projects, any_attention) = [line for line in lines if line.startswith("- 8x512")]
    assert "sliced_relu ≥ 2×" not in projects and "no attention that projects q and k" in projects
    assert "sliced_relu ≥ 2×" in any_attention and "sliced_relu_converted ≥ 1.7×" in any_attention
    assert "; no attention can meet them here" in any_attention
    assert lines.index(f"## Ceiling: `{bench.CEILING_ANY}` (an attention that costs nothing, no query or key layer "
                       "at all)") > lines.index(projects)


def test_a_bar_is_above_a_ceiling_only_above_its_interval():
    """Medians 3.0 / 1.9 = 1.58 put a 1.7 bar above the ceiling; the rounds' paired ratios reach 1.8, so they do not."""
    rounds = {"sdpa_fused": Point(3.0, [3.0, 3.6, 2.4, 3.0]), bench.CEILING: Point(1.9, [1.9, 1.9, 1.9, 1.9])}
    (line,) = [line for line in bench.ceiling_lines({"8x512": rounds}) if line.startswith("- 8x512")]
    assert "paired per round: 1.579 [" in line and "sliced_relu_converted ≥ 1.7×" not in line
    steady = {"sdpa_fused": Point(3.0, [3.0] * 4), bench.CEILING: Point(1.9, [1.9] * 4)}
    (line,) = [line for line in bench.ceiling_lines({"8x512": steady}) if line.startswith("- 8x512")]
    assert "bars above it: sliced_relu_converted ≥ 1.7×" in line


def test_a_bar_is_judged_by_its_interval_not_by_the_medians():
    """Medians 2.05 / 1.95 = 1.05 would pass a 1.0 bar; the paired interval straddles 1.0, so the bar does not."""
    times = {"32x128": {"sdpa_fused": Point(2.05, [2.0, 2.2, 1.9, 2.1]),
                        "rela_window4": Point(1.95, [1.9, 2.3, 1.95, 2.05])}}
    run = bench.Run("bench_training_step.py", [])
    run.finish()
    _, bars = bench.report(run, 4, times)
    (bar,) = [bar for bar in bars if bar.description.startswith("rela_window4 at 32×128")]
    assert bar.value == bench.paired_ratios(times, "rela_window4", "32x128").low < 1.0
    assert bar.verdict == "FAIL"


def test_bars_carry_the_paired_interval_of_the_steps():
    """Each measured bar gets the round-by-round ratios' mean and 95% interval, judged by the interval: met only
    when its lower end clears the bar."""
    def times(contender_runs: list[float]) -> dict[str, dict[str, Point]]:
        baseline = [2.0, 2.2, 1.9, 2.1]
        return {"32x128": {"sdpa_fused": Point(2.05, baseline), "rela_window4": Point(0.0, contender_runs)}}

    faster = bench.paired_ratios(times([1.6, 1.8, 1.5, 1.7]), "rela_window4", "32x128")
    assert faster.values == pytest.approx((2.0 / 1.6, 2.2 / 1.8, 1.9 / 1.5, 2.1 / 1.7))
    assert faster.low > 1.0 and faster.verdict(1.0) == "met"
    level = bench.paired_ratios(times([1.9, 2.3, 1.95, 2.05]), "rela_window4", "32x128")
    assert level.low < 1.0 < level.high and level.verdict(1.0) == "not resolved"
    assert bench.paired_ratios(times([1.6, 1.8, 1.5, 1.7]), "sliced_relu", "32x128") is None
    rows = [line for line in bench.paired_lines(times([2.5, 2.7, 2.4, 2.6])) if line.startswith("| rela_window4")]
    assert len(rows) == 1 and rows[0].endswith("**not met** |")


def test_the_results_record_each_bars_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "BARS", [("rela_window4", (2, 16), 1.0), ("sliced_relu", (8, 512), 2.0)])
    argv = ["--shapes", "2x16", "--steps", "3", "--threads", "1", "--output", str(tmp_path), "--contenders",
            "rela_window4"]
    assert bench.main(argv) == 0
    measured, unmeasured = json.loads((tmp_path / "training_step.json").read_text())["bars"]
    assert len(measured["paired_ratio"]["values"]) == 3
    assert measured["paired_ratio"]["mean"] == pytest.approx(sum(measured["paired_ratio"]["values"]) / 3)
    assert measured["interval_verdict"] in {"met", "not met", "not resolved"}
    # The bar's own verdict is the interval's: PASS exactly when its lower end clears the bar.
    assert (measured["verdict"] == "PASS") == (measured["interval_verdict"] == "met")
    assert measured["speedup_vs_sdpa_fused"] > 0  # the ratio of the medians, beside it
    assert unmeasured["paired_ratio"] is None and unmeasured["interval_verdict"] is None
    assert unmeasured["verdict"] == "not measured"
    markdown = (tmp_path / "training_step.md").read_text()
    assert f"| rela_window4 at 2×16 | {measured['paired_ratio']['mean']:.3f} [" in markdown


def test_the_free_kernel_returns_the_values_and_zero_scalar_gradients():
    query_scalars, key_scalars = (bench.torch.randn(2, 3, 4, 5, requires_grad=True) for _ in range(2))
    value = bench.torch.randn(2, 3, 5, 6, requires_grad=True)
    out = bench.free_sliced_relu(query_scalars, key_scalars, value, None)
    assert bench.torch.equal(out, value)
    grad = bench.torch.randn_like(out)
    out.backward(grad)
    assert bench.torch.equal(value.grad, grad)
    assert bench.torch.equal(query_scalars.grad, bench.torch.zeros(2, 3, 4, 5))
    assert bench.torch.equal(key_scalars.grad, bench.torch.zeros(2, 3, 4, 5))


def test_the_kernel_ceiling_runs_the_converted_layer_but_its_kernel():
    """Every converted layer calls the free kernel instead of the sliced ReLU op (which does not run), and the
    projection's backward runs: its parameters get (zero) gradients, materialised."""
    model = bench.build_model(bench.CEILING_KERNEL)
    batch = bench.make_batch(4, 16, model.config.vocab_size, model.config.pad_token_id)
    calls = bench.free_sliced_relu.calls
    real = bench.SLICED_ATTENTION.sliced_relu
    with bench.free_kernel(model.config.num_hidden_layers):
        model(**batch).loss.backward()
    assert bench.free_sliced_relu.calls - calls == model.config.num_hidden_layers
    assert bench.SLICED_ATTENTION.sliced_relu is real
    projection = model.bert.encoder.layer[0].attention.self.sliced_projection
    assert all(p.grad is not None and not p.grad.any() for p in projection.parameters())
    value = model.bert.encoder.layer[0].attention.self.value
    assert value.weight.grad is not None and value.weight.grad.any()


def test_the_plain_kernel_ceiling_runs_the_folded_projection_but_not_the_kernel():
    """Plain sliced_relu under the free kernel: every layer calls it (the real op does not run), and the projection
    folded into the value layer's product still runs backward: the query and key weights get (zero) gradients."""
    model = bench.build_model(bench.CEILING_PLAIN_KERNEL)
    assert bench.CONTENDERS[bench.CEILING_PLAIN_KERNEL].free_kernel
    batch = bench.make_batch(4, 16, model.config.vocab_size, model.config.pad_token_id)
    calls = bench.free_sliced_relu.calls
    with bench.free_kernel(model.config.num_hidden_layers):
        model(**batch).loss.backward()
    assert bench.free_sliced_relu.calls - calls == model.config.num_hidden_layers
    layer = model.bert.encoder.layer[0].attention.self
    for weights in (layer.query.weight, layer.key.weight, *layer.sliced_projection.parameters()):
        assert weights.grad is not None and not weights.grad.any()
    assert layer.value.weight.grad is not None and layer.value.weight.grad.any()


def test_the_free_kernel_must_replace_the_kernel_of_every_layer():
    model = bench.build_model("sliced_relu")  # converted layers: 6 calls, not 7
    batch = bench.make_batch(2, 8, model.config.vocab_size, model.config.pad_token_id)
    with pytest.raises(RuntimeError, match="the free kernel ran 6 times for 7 converted layers"):
        with bench.free_kernel(7):
            model(**batch)
    assert bench.SLICED_ATTENTION.sliced_relu is bench.hf_sliced_attn.ops.sliced_relu


def test_the_kernel_ceiling_bounds_the_converted_bars_only():
    points = {"sdpa_fused": Point(3.0), bench.CEILING_KERNEL: Point(2.9)}
    (line,) = [line for line in bench.ceiling_lines({"32x128": points}) if line.startswith("- 32x128")]
    assert "bars above it: sliced_relu_converted ≥ 1.1×; no sliced kernel with this projection can meet" in line
    assert "sliced_relu ≥ 1.3×" not in line and "window4" not in line


def test_the_plain_kernel_ceiling_bounds_the_plain_bars_only():
    points = {"sdpa_fused": Point(3.0), bench.CEILING_PLAIN_KERNEL: Point(2.4)}
    (line,) = [line for line in bench.ceiling_lines({"32x128": points}) if line.startswith("- 32x128")]
    assert "bars above it: sliced_relu ≥ 1.3×; no sliced kernel with this projection can meet" in line
    assert "sliced_relu_converted" not in line and "window4" not in line
