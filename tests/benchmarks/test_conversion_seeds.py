"""benchmarks/conversion_seeds.py: conversion runs of two settings paired by seed, each figure's difference judged by
its interval against the margin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import conversion_seeds as seeds

REFERENCE = {"embedding_cosine": 0.988, "pairwise_spearman": 0.983, "tuning_long_embedding_cosine": 0.957,
             "tuning_long_pairwise_spearman": 0.937, "reporting_embedding_cosine": 0.957,
             "reporting_pairwise_spearman": 0.939}


def write_run(folder: Path, flags: str, figures: dict[str, float], transfer_s: float = 200.0,
              source: str = "commit abc1234", variant: str = "sliced_relu_mixed") -> Path:
    """A conversion.json as bench_conversion.py writes it, of one variant run with ``flags``."""
    folder.mkdir(parents=True)
    environment = {"command": f"python benchmarks/bench_conversion.py --variants {variant}", "source": source}
    record = {"variant": variant, "flags": flags, "transfer_time_s": transfer_s, **figures}
    (folder / "conversion.json").write_text(json.dumps({"environment": environment, "variants": [record]}))
    return folder


def shifted(by: float) -> dict[str, float]:
    return {key: value + by for key, value in REFERENCE.items()}


def test_a_setting_is_paired_with_the_reference_by_seed(tmp_path):
    """Seed 0 is the default (no --seed); the contender loses 0.001, 0.002 and 0.003 on seeds 0, 1, 2: the mean
    difference is -0.002, its interval [-0.0045, +0.0005] clears -0.005 (no worse), not -0.001 (not resolved)."""
    reference = [write_run(tmp_path / "ref" / f"seed{s}", f"--seed {s}" if s else "(defaults)", shifted(0.01 * s))
                 for s in range(3)]
    contender = [write_run(tmp_path / "narrow" / f"seed{s}", f"--mlp-width 96 --seed {s}" if s else "--mlp-width 96",
                           shifted(0.01 * s - 0.001 * (s + 1)), transfer_s=100.0) for s in (2, 0, 1)]
    argv = ["--reference", *map(str, reference), "--reference_name", "mlp", "--contender", "width96",
            *map(str, contender), "--output", str(tmp_path / "out")]
    assert seeds.main(argv) == 0
    record = json.loads((tmp_path / "out" / "conversion_seeds.json").read_text())
    comparison = record["comparisons"]["width96"]
    assert comparison["seeds"] == [0, 1, 2]
    cosine = comparison["figures"]["tuning_long_embedding_cosine"]
    assert cosine["difference"]["values"] == pytest.approx([-0.001, -0.002, -0.003])
    assert cosine["difference"]["mean"] == pytest.approx(-0.002)
    assert cosine["difference"]["low"] == pytest.approx(-0.002 - 4.3027 * 0.001 / 3**0.5, abs=1e-6)
    assert cosine["verdict"] == "no worse than the margin"
    assert comparison["transfer_time_ratio"]["mean"] == pytest.approx(0.5)
    markdown = (tmp_path / "out" / "conversion_seeds.md").read_text()
    assert "## width96 against mlp (seeds 0, 1, 2)" in markdown
    row = "| tuning, long: cosine | 0.9670 | 0.9650 | -0.0020 [-0.0045, +0.0005] | no worse than the margin |"
    assert row in markdown

    assert seeds.main([*argv[:-2], "--margin", "0.001", "--output", str(tmp_path / "strict")]) == 0
    strict = json.loads((tmp_path / "strict" / "conversion_seeds.json").read_text())
    assert strict["comparisons"]["width96"]["figures"]["embedding_cosine"]["verdict"] == "not resolved"


def test_a_clear_loss_is_worse():
    reference = {s: {**shifted(0.0), "transfer_time_s": 1.0} for s in range(3)}
    contender = {s: {**shifted(-0.02 - 0.001 * s), "transfer_time_s": 1.0} for s in range(3)}
    comparison = seeds.compare(reference, contender, 0.005)
    assert {figure["verdict"] for figure in comparison["figures"].values()} == {"worse"}


@pytest.mark.parametrize("flags, seed", [("(defaults)", 0), ("--mlp-width 96", 0), ("--seed 3 --steps 2", 3),
                                         ("--steps 2 --seed=4", 4)])
def test_the_seed_is_read_from_the_flags(flags, seed):
    assert seeds.seed_of(flags) == seed


def test_runs_that_cannot_be_paired_are_refused(tmp_path):
    one = write_run(tmp_path / "a", "(defaults)", REFERENCE)
    same_seed = write_run(tmp_path / "b", "--seed 0", REFERENCE)
    with pytest.raises(SystemExit, match="seed 0 twice"):
        seeds.load_setting([one, same_seed])
    other_commit = write_run(tmp_path / "c", "--seed 1", REFERENCE, source="commit def5678")
    with pytest.raises(SystemExit, match=r"differ in source \(commit abc1234, commit def5678\)"):
        seeds.load_setting([one, other_commit])
    with pytest.raises(SystemExit, match="does not exist: give folders that bench_conversion.py wrote"):
        seeds.load_setting([tmp_path / "missing"])
    disjoint = {1: {**REFERENCE, "transfer_time_s": 1.0}}
    with pytest.raises(SystemExit, match="share no seed"):
        seeds.compare({0: {**REFERENCE, "transfer_time_s": 1.0}}, disjoint, 0.005)
    with pytest.raises(SystemExit):
        seeds.main(["--reference", str(one), "--contender", "lonely", "--output", str(tmp_path / "out")])
