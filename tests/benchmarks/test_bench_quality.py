"""The quality benchmark's summary: runs paired with sdpa's run of the same seed, intervals and parity verdicts."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pytest

from benchmarks.bench_quality import DATA, PARITY_FLOOR, markdown, recipe_command, split_size, summarise
from benchmarks._harness import Run


def _runs(flow: str, accuracies: dict[int, float], wall: float = 100.0) -> list[dict]:
    return [{"flow": flow, "seed": seed, "status": 0, "wall_s": wall, "accuracy": accuracy}
            for seed, accuracy in accuracies.items()]


SOFTMAX = {0: 0.905, 1: 0.9075, 2: 0.9225, 3: 0.91, 4: 0.90}


def test_pairs_are_by_seed_and_a_flow_at_parity_meets_its_bar():
    close = {seed: accuracy + 0.001 * (-1) ** seed for seed, accuracy in SOFTMAX.items()}
    runs = _runs("sdpa", SOFTMAX) + _runs("sliced_relu", dict(reversed(close.items())), wall=150.0)
    paired = summarise(runs, ["sdpa", "sliced_relu"], runs)["sliced_relu"]["paired"]
    differences = [close[seed] - SOFTMAX[seed] for seed in paired["seeds"]]
    assert paired["difference"]["values"] == pytest.approx(differences)
    assert paired["difference"]["mean"] == pytest.approx(statistics.fmean(differences))
    assert paired["wall_ratio"]["mean"] == pytest.approx(1.5)
    assert paired["parity"]["verdict"] == "met"


def test_a_wide_interval_is_not_resolved_and_a_clear_loss_is_not_met():
    noisy = {0: 0.915, 1: 0.8875, 2: 0.9025}  # the issue's +0.010, -0.020, -0.020: no verdict follows
    runs = _runs("sdpa", SOFTMAX) + _runs("sliced_relu", noisy) + _runs("rela", {s: a - 0.05 for s, a in SOFTMAX.items()})
    summary = summarise(runs, ["sdpa", "sliced_relu", "rela"], runs)
    assert summary["sliced_relu"]["paired"]["ratio"]["low"] < PARITY_FLOOR
    assert summary["sliced_relu"]["paired"]["parity"]["verdict"] == "not resolved"
    assert summary["rela"]["paired"]["parity"]["verdict"] == "not met"
    assert "parity" not in summarise(runs, ["sdpa", "sliced_relu_direct"], runs + _runs("sliced_relu_direct", SOFTMAX)
                                     ).get("sliced_relu_direct", {}).get("paired", {})


def test_pairs_come_from_a_reference_run_and_the_table_names_it():
    reference = _runs("sdpa", SOFTMAX)
    runs = _runs("sliced_relu", {0: 0.90, 1: 0.91})
    summary = summarise(runs, ["sliced_relu"], reference)
    assert summary["sliced_relu"]["paired"]["seeds"] == [0, 1]
    settings = {"split": "validation", "seeds": [0, 1], "epochs": 3, "learning_rate": 1e-4, "batch_size": 32,
                "max_length": 96, "max_train_steps": None, "recipe_args": "", "reference": "ref/quality.json"}
    run = Run("bench_quality.py", [])
    run.finish()
    report = markdown(run, settings, summary, None)
    assert "sdpa's runs from `ref/quality.json`" in report
    assert "| sliced_relu | 0, 1 | -0.0012" in report


@pytest.mark.parametrize("split", ["validation", "test", "test_large"])
def test_each_split_is_its_own_file_and_the_table_gives_its_size(split):
    """The recipe evaluates on the split's csv, and the table states how many examples that held."""
    args = argparse.Namespace(split=split, max_length=96, epochs=3, learning_rate=1e-4, batch_size=32,
                              max_train_steps=None, recipe_args="")
    command = recipe_command(args, "sdpa", 0, Path("/tmp/run"))
    assert command[command.index("--validation_file") + 1] == str(DATA / f"{split}.csv")
    lines = (DATA / f"{split}.csv").read_text(encoding="utf-8").splitlines()
    assert split_size(split) == len(lines) - 1  # one header line
    settings = {"split": split, "seeds": [0], "epochs": 3, "learning_rate": 1e-4, "batch_size": 32,
                "max_length": 96, "max_train_steps": None, "recipe_args": ""}
    run = Run("bench_quality.py", [])
    run.finish()
    runs = _runs("sdpa", {0: 0.9})
    report = markdown(run, settings, summarise(runs, ["sdpa"], runs), None)
    assert f"train 1600, {split} {split_size(split)})" in report


@pytest.mark.parametrize("flow", ["sliced_relu_all_layers", "rela_all_layers"])
def test_every_layer_flows_convert_every_layer_and_get_a_verdict(flow):
    """The flows of issue #24's verdicts keep no layer on softmax, spell out their window, and are judged by their
    mechanism's bar."""
    args = argparse.Namespace(split="test_large", max_length=96, epochs=3, learning_rate=1e-4, batch_size=32,
                              max_train_steps=None, recipe_args="")
    command = recipe_command(args, flow, 0, Path("/tmp/run"))
    assert command[command.index("--keep_softmax_layers") + 1] == "0"
    window = command[command.index("--local_window") + 1]
    assert window == ("4" if flow.startswith("sliced_relu") else "0")  # each flow stays what it measured
    runs = _runs("sdpa", SOFTMAX) + _runs(flow, {seed: accuracy - 0.05 for seed, accuracy in SOFTMAX.items()})
    parity = summarise(runs, ["sdpa", flow], runs)[flow]["paired"]["parity"]
    assert parity["mean_ratio_at_least"] == (0.99 if flow.startswith("sliced_relu") else 0.995)
    assert parity["verdict"] != "met"


def test_an_interrupted_benchmark_leaves_its_finished_runs_summarised(tmp_path, monkeypatch):
    """Results are written after every run, marked partial; the last write is complete."""
    import json

    from benchmarks import bench_quality

    accuracies = iter([0.91, 0.90, 0.92])

    def fake_run(args, flow, seed):
        accuracy = next(accuracies, None)
        if accuracy is None:
            raise KeyboardInterrupt  # the machine stopped during the fourth run
        return {"flow": flow, "seed": seed, "status": 0, "wall_s": 10.0, "accuracy": accuracy}

    monkeypatch.setattr(bench_quality, "run_recipe", fake_run)
    argv = ["--flows", "sdpa,sliced_relu", "--seeds", "0,1", "--output", str(tmp_path), "--work_dir", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        bench_quality.main(argv)
    record = json.loads((tmp_path / "quality.json").read_text())
    assert (record["complete"], record["runs_done"], record["runs_total"]) == (False, 3, 4)
    assert "**Partial: 3 of 4 runs done when this was written.**" in (tmp_path / "quality.md").read_text()
    accuracies = iter([0.91, 0.90, 0.92, 0.91])
    bench_quality.main(argv)
    record = json.loads((tmp_path / "quality.json").read_text())
    assert record["complete"] and record["runs_done"] == 4
    assert "Partial" not in (tmp_path / "quality.md").read_text()


def test_resume_runs_only_what_is_missing_and_refuses_other_settings(tmp_path, monkeypatch):
    """--resume keeps the finished runs of the partial file, runs the missing pairs, and names where the kept
    ones came from; a file measured with other settings is refused."""
    import json

    from benchmarks import bench_quality

    ran = []

    def fake_run(args, flow, seed):
        ran.append((flow, seed))
        if len(ran) == 3:
            raise KeyboardInterrupt
        return {"flow": flow, "seed": seed, "status": 0, "wall_s": 10.0, "accuracy": 0.9 + 0.01 * seed}

    monkeypatch.setattr(bench_quality, "run_recipe", fake_run)
    argv = ["--flows", "sdpa,sliced_relu", "--seeds", "0,1", "--output", str(tmp_path), "--work_dir", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        bench_quality.main(argv)
    ran.clear()
    bench_quality.main([*argv, "--resume"])
    assert ran == [("sdpa", 1), ("sliced_relu", 1)]  # the two finished seed-0 runs were kept
    record = json.loads((tmp_path / "quality.json").read_text())
    assert record["complete"] and record["runs_done"] == 4 and len(record["resumed_from"]) == 1
    assert "Resumed: 2 runs come from the partial run at" in (tmp_path / "quality.md").read_text()
    with pytest.raises(SystemExit, match="other settings \\(epochs\\)"):
        bench_quality.main([*argv, "--resume", "--epochs", "5"])


def test_an_interval_wholly_below_the_bar_is_not_met_even_when_it_straddles_the_floor():
    """rela_all_layers on test_large's first seeds: ratio 0.9785 [0.9644, 0.9926], bar 0.995, floor 0.98."""
    from benchmarks._harness import paired_interval
    from benchmarks.bench_quality import parity_verdict

    below_bar = paired_interval([0.9005 / 0.9265, 0.9015 / 0.918, 0.903 / 0.92])  # (rela, sdpa) seeds 0, 1, 2
    assert below_bar.low < PARITY_FLOOR < below_bar.high < 0.995
    assert parity_verdict(below_bar, 0.995) == "not met"
    assert parity_verdict(below_bar, 0.97) == "not resolved"  # the same pairs against a bar inside the interval
    assert parity_verdict(paired_interval([0.999, 1.001, 1.0]), 0.995) == "met"
    assert parity_verdict(paired_interval([0.990, 0.991, 0.992]), 0.995) == "not met"  # floor met, mean short
