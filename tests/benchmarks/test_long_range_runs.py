"""benchmarks/long_range_runs.py: runs of bench_long_range.py split over several commands pool into the report one
command would have written (the same accuracies and paired intervals), and folders that do not belong together
(another setting, other examples, a run given twice) are refused with the reason."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_long_range as bench
from benchmarks import long_range_runs as pool

TINY = ["--tasks", "listops", "--lengths", "64", "--steps", "3", "--hidden-size", "16", "--heads", "2",
        "--batch-size", "4", "--warmup-steps", "2", "--evaluations", "2", "--validation-examples", "8",
        "--test-examples", "8"]


def bench_folder(folder, seeds: str, contenders: str, *extra: str):
    """``folder`` written by a tiny bench_long_range.py run of ``seeds`` and ``contenders``."""
    assert bench.main([*TINY, "--seeds", seeds, "--contenders", contenders, *extra, "--output", str(folder)]) == 0
    return folder


def accuracy_summary(record: dict) -> list[tuple]:
    """The summary's accuracies and paired differences, the fields that do not depend on the machine's speed."""
    return [(row["task"], row["T"], row["contender"], row["seeds"], row["test_accuracy"],
             row["difference_to_reference"]) for row in record["summary"]]


@pytest.fixture(scope="module")
def whole_and_split(tmp_path_factory):
    """One command's runs of two contenders and two seeds, and the same runs made by three commands."""
    root = tmp_path_factory.mktemp("long_range_runs")
    whole = bench_folder(root / "whole", "0,1", "sdpa,sliced_relu")
    split = [bench_folder(root / "sdpa", "0,1", "sdpa"), bench_folder(root / "sliced_seed0", "0", "sliced_relu"),
             bench_folder(root / "sliced_seed1", "1", "sliced_relu")]
    return root, whole, split


def test_split_runs_pool_into_the_one_commands_report(whole_and_split):
    root, whole, split = whole_and_split
    assert pool.main([*map(str, reversed(split)), "--output", str(root / "pooled")]) == 0
    pooled = json.loads((root / "pooled" / "long_range.json").read_text())
    alone = json.loads((whole / "long_range.json").read_text())
    assert accuracy_summary(pooled) == accuracy_summary(alone)
    difference = pooled["summary"][1]["difference_to_reference"]
    assert pooled["summary"][1]["contender"] == "sliced_relu" and len(difference["values"]) == 2
    assert [(run["contender"], run["seed"], run["folder"]) for run in pooled["runs"]] == [
        ("sdpa", 0, str(split[0])), ("sliced_relu", 0, str(split[1])),
        ("sdpa", 1, str(split[0])), ("sliced_relu", 1, str(split[2]))]
    assert pooled["settings"]["seeds"] == [0, 1] and pooled["comparison"] == "equal steps"
    assert [entry["folder"] for entry in pooled["folders"]] == [str(folder) for folder in reversed(split)]
    markdown = (root / "pooled" / "long_range.md").read_text()
    assert "3 folders of bench_long_range.py, from 1 commit." in markdown
    assert f"| listops | 64 | sliced_relu | 1 | {pooled['runs'][3]['test_accuracy']:.3f} |" in markdown
    assert (root / "pooled" / "long_range.png").stat().st_size > 0


def test_a_setting_the_older_file_lacks_is_its_default(whole_and_split, tmp_path):
    root, _, split = whole_and_split
    record = json.loads((split[1] / "long_range.json").read_text())
    del record["settings"]["device"]  # an option added to the benchmark after the run
    older = tmp_path / "older"
    older.mkdir()
    (older / "long_range.json").write_text(json.dumps(record))
    assert pool.main([str(split[0]), str(older), "--output", str(tmp_path / "pooled")]) == 0


def test_folders_of_another_setting_are_refused(whole_and_split, tmp_path):
    root, _, split = whole_and_split
    other = bench_folder(tmp_path / "lr", "2", "sdpa", "--learning-rate", "1e-2")
    with pytest.raises(SystemExit, match=r"different settings \(learning_rate 0\.003 in .*, 0\.01 in .*lr\)"):
        pool.main([str(split[0]), str(other), "--output", str(tmp_path / "pooled")])


def test_a_run_given_twice_is_refused(whole_and_split, tmp_path):
    root, whole, split = whole_and_split
    with pytest.raises(SystemExit, match=r"listops T=64 sdpa seed 0 is in both .*whole and .*sdpa: give each run once"):
        pool.main([str(whole), str(split[0]), "--output", str(tmp_path / "pooled")])


def test_other_evaluation_examples_are_refused(whole_and_split, tmp_path):
    root, _, split = whole_and_split
    record = json.loads((split[1] / "long_range.json").read_text())
    record["chance"]["listops/64"]["test"]["majority_share"] += 0.125
    changed = tmp_path / "changed"
    changed.mkdir()
    (changed / "long_range.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match=r"listops at T = 64 has other validation or test examples in .*changed"):
        pool.main([str(split[0]), str(changed), "--output", str(tmp_path / "pooled")])


def test_a_folder_without_results_or_a_single_folder_is_refused(whole_and_split, tmp_path):
    root, whole, _ = whole_and_split
    with pytest.raises(SystemExit, match="long_range.json does not exist: give folders that bench_long_range.py"):
        pool.main([str(whole), str(tmp_path), "--output", str(tmp_path / "pooled")])
    with pytest.raises(SystemExit) as single:
        pool.main([str(whole), "--output", str(tmp_path / "pooled")])
    assert single.value.code == 2  # argparse's usage error


def test_a_pooled_report_is_refused_as_an_input(whole_and_split, tmp_path):
    root, _, split = whole_and_split
    assert pool.main([str(split[0]), str(split[1]), "--output", str(tmp_path / "pooled")]) == 0
    with pytest.raises(SystemExit, match=r"pooled.long_range.json is a pooled report .*: give the folders it pooled"):
        pool.main([str(split[2]), str(tmp_path / "pooled"), "--output", str(tmp_path / "again")])
