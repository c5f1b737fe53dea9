"""benchmarks/bench_long_range.py end to end on tiny sizes (every task, every contender, the results files and
their fields), the ListOps generator against an independent evaluator, the document-matching builder's
labels and splits, the lookup task's examples against the data, and the topic builder and task (labels, splits,
windows) against the data."""

from __future__ import annotations

import gzip
import itertools
import json
import keyword
import platform
import random
import re
import statistics
import zlib
from collections import Counter

import pytest
import torch

from benchmarks import bench_long_range as bench
from benchmarks.data.long_range import build_retrieval_data as builder
from benchmarks.data.long_range import build_topic_data as topic_builder
from benchmarks.long_range_tasks import (
    CLS,
    LISTOPS,
    SEP,
    SPECIAL_TOKENS,
    TOPIC_DATA,
    ListOpsSpec,
    ListOpsTask,
    LookupTask,
    RetrievalTask,
    TopicTask,
    collate,
    generate_tree,
    hashed_ids,
    listops_example,
    make_task,
    retrieval_data,
    topic_data,
    tree_tokens,
)

SEEDS = [0, 1]


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    output = tmp_path_factory.mktemp("long_range")
    argv = ["--lengths", "64", "--steps", "3", "--seeds", ",".join(map(str, SEEDS)), "--hidden-size", "16",
            "--heads", "2", "--local-window", "16", "--batch-size", "4", "--warmup-steps", "2", "--evaluations", "2",
            "--validation-examples", "8", "--test-examples", "8", "--output", str(output)]
    assert bench.main(argv) == 0
    return output, json.loads((output / "long_range.json").read_text()), argv


def test_every_task_contender_and_seed_ran_with_its_curve(results):
    output, raw, _ = results
    for name in ("long_range.md", "long_range.json", "long_range.png"):
        assert (output / name).stat().st_size > 0
    runs = {(r["task"], r["length"], r["contender"], r["seed"]): r for r in raw["runs"]}
    assert set(runs) == {(task, 64, c.name, seed) for task in bench.TASKS for c in bench.CONTENDERS for seed in SEEDS}
    for run in runs.values():
        assert run["steps"] == 3 and run["stopped_by"] == "steps"
        assert [point["step"] for point in run["curve"]] == [2, 3]  # at progress 1/2 and 1
        assert all(0 <= point["validation_accuracy"] <= 1 for point in run["curve"])
        assert run["train_seconds"] > 0 and run["wall_seconds"] >= run["train_seconds"] and run["peak_bytes"] >= 0
        assert 0 <= run["test_accuracy"] <= 1
    assert raw["comparison"] == "equal steps"


def test_the_results_record_the_source_command_seeds_and_memory(results):
    output, raw, argv = results
    assert len(raw["source"]["commit"]) == 40 and isinstance(raw["source"]["dirty"], bool)
    assert raw["environment"]["command"].endswith(" ".join(argv)) and raw["settings"]["seeds"] == SEEDS
    report = (output / "long_range.md").read_text()
    assert "equal steps, T = 64" in report and "Not measured by it: equal wall time, and T = 1024, 4096" in report
    rows = {(row["task"], row["contender"]): row for row in raw["summary"]}
    assert len(rows) == len(bench.TASKS) * len(bench.CONTENDERS)
    for (task, contender), row in rows.items():
        assert row["seeds"] == SEEDS and row["peak_bytes_max"] > 0
        assert row["test_accuracy_mean"] == pytest.approx(statistics.fmean(row["test_accuracy"]))
        assert f"| {task} | 64 | {contender} | {row['test_accuracy_mean']:.3f}" in report
        assert row["chance"]["uniform"] == 1 / make_task(task, 64).num_labels
        assert raw["chance"][f"{task}/64"]["validation"]["examples"] == 8


def test_paired_differences_are_to_sdpa_of_the_same_seed(results):
    _, raw, _ = results
    accuracy = {(r["task"], r["contender"], r["seed"]): r["test_accuracy"] for r in raw["runs"]}
    for row in raw["summary"]:
        difference = row["difference_to_reference"]
        if row["contender"] == "sdpa":
            assert difference is None
            continue
        expected = [accuracy[row["task"], row["contender"], s] - accuracy[row["task"], "sdpa", s] for s in SEEDS]
        assert difference["values"] == pytest.approx(expected)
        assert difference["low"] <= difference["mean"] <= difference["high"]


def test_each_contender_runs_the_attention_it_claims(results):
    _, raw, _ = results
    modes = {r["contender"]: r["layer_modes"] for r in raw["runs"]}
    assert modes["sdpa"] == [None, None]
    assert modes["sliced_relu"] == modes["sliced_relu_tuned"] == modes["sliced_relu_window"] == ["sliced_relu"] * 2
    assert modes["rela"] == ["rela", "rela"]
    assert modes["hybrid"] == ["sliced_relu", "softmax"]  # layer 0 global, layer 1 local


def test_bad_names_are_refused_with_the_choices(capsys):
    for flag, name in (("--tasks", "imdb"), ("--contenders", "performer")):
        with pytest.raises(SystemExit):
            bench.parse_args([flag, name])
        error = capsys.readouterr().err
        assert f"unknown ['{name}']" in error and ("listops, retrieval" in error or "sdpa, sliced_relu" in error)
    with pytest.raises(ValueError, match="choose from listops, retrieval"):
        make_task("imdb", 64)


def test_the_defaults_are_the_setting_the_probes_chose():
    """600 steps of batch 8 at lr 3e-3, 8 evaluations on 128 examples, equal steps at T = 1024 (the script's
    docstring: "Budget")."""
    args = bench.parse_args([])
    assert (args.steps, args.batch_size, args.learning_rate, args.warmup_steps) == (600, 8, 3e-3, 20)
    assert (args.evaluations, args.validation_examples, args.seconds, args.lengths) == (8, 128, 0.0, [1024])
    assert (args.layers, args.hidden_size, args.heads, args.pooling, args.threads) == (2, 64, 4, "cls", 1)


def test_an_equal_time_run_stops_on_its_clock(tmp_path):
    argv = ["--tasks", "listops", "--contenders", "sdpa", "--lengths", "32", "--seeds", "0", "--steps", "100000",
            "--seconds", "0.05", "--hidden-size", "16", "--heads", "2", "--evaluations", "1",
            "--validation-examples", "4", "--test-examples", "4", "--output", str(tmp_path)]
    assert bench.main(argv) == 0
    raw = json.loads((tmp_path / "long_range.json").read_text())
    (run,) = raw["runs"]
    assert run["stopped_by"] == "seconds" and run["steps"] < 100000 and run["train_seconds"] >= 0.05
    assert raw["comparison"] == "equal wall time"


def test_runs_in_parallel_processes_match_runs_one_at_a_time(tmp_path):
    """--jobs 2 gives each run the seed, data and steps it gets alone: the same curves and test accuracies."""
    argv = ["--tasks", "listops", "--contenders", "sdpa,sliced_relu", "--lengths", "32", "--seeds", "0,1",
            "--steps", "3", "--hidden-size", "16", "--heads", "2", "--batch-size", "4", "--warmup-steps", "2",
            "--evaluations", "2", "--validation-examples", "8", "--test-examples", "8"]
    records = {}
    for jobs in (1, 2):
        assert bench.main([*argv, "--jobs", str(jobs), "--output", str(tmp_path / str(jobs))]) == 0
        raw = json.loads((tmp_path / str(jobs) / "long_range.json").read_text())
        records[jobs] = [(r["contender"], r["seed"], r["steps"], r["test_accuracy"],
                          [(p["step"], p["train_loss"], p["validation_accuracy"]) for p in r["curve"]])
                         for r in raw["runs"]]
        assert raw["settings"]["jobs"] == jobs
    assert records[1] == records[2]
    assert [(contender, seed) for contender, seed, *_ in records[2]] == [
        ("sdpa", 0), ("sliced_relu", 0), ("sdpa", 1), ("sliced_relu", 1)]
    assert "2 runs at a time, each in its own process" in (tmp_path / "2" / "long_range.md").read_text()


def test_parallel_runs_are_refused_at_equal_time_and_a_missing_gpu_is_named(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--jobs", "2", "--seconds", "60"])
    assert "more than 1 only at equal steps (--seconds 0)" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            bench.parse_args(["--device", "cuda"])
        assert "no CUDA GPU is visible to torch here" in capsys.readouterr().err


# --------------------------------------------------------------------------- ListOps


def python_expression(tokens: list[str]) -> str:
    """The token sequence in Python syntax: ``[MAX 2 [MIN 3 4 ] ]`` -> ``MAX(2, MIN(3, 4))``."""
    out = []
    for token in tokens:
        if out and token != "]" and not out[-1].endswith("("):
            out.append(", ")
        out.append(token[1:] + "(" if token.startswith("[") else ")" if token == "]" else token)
    return "".join(out)


FUNCTIONS = {"MAX": lambda *a: max(a), "MIN": lambda *a: min(a), "SM": lambda *a: sum(a) % 10,
             "MED": lambda *a: sorted(a)[(len(a) - 1) // 2] if len(a) % 2 else (sorted(a)[len(a) // 2 - 1]
                                                                                 + sorted(a)[len(a) // 2]) // 2}


def test_the_label_is_the_value_of_the_expression_written_in_python():
    rng = random.Random(7)
    operators = set()
    for _ in range(200):
        tokens, label = listops_example(LISTOPS, 128, rng)
        operators.update(t for t in tokens if t.startswith("["))
        assert label == eval(python_expression(tokens), {"__builtins__": {}}, FUNCTIONS)
    assert operators == set(LISTOPS.operators)


def test_the_python_evaluator_can_disagree():
    assert python_expression(["[MED", "1", "2", "[SM", "9", "4", "]", "8", "]"]) == "MED(1, 2, SM(9, 4), 8)"
    assert eval("MED(1, 2, SM(9, 4), 8)", {}, FUNCTIONS) == 2  # (2 + 3) // 2: the mean of the middle two, rounded down
    assert eval("MED(1, 2, SM(9, 4), 8)", {}, FUNCTIONS) != eval("MAX(1, 2, SM(9, 4), 8)", {}, FUNCTIONS)


def shape(tree, depth: int = 1) -> tuple[int, list[int]]:
    """An expression's deepest operator's depth (root 1; 0 for a digit) and every operator's argument count."""
    if isinstance(tree, int):
        return 0, []
    found = [shape(argument, depth + 1) for argument in tree[1]]
    return max([depth] + [deepest for deepest, _ in found]), [len(tree[1])] + [n for _, counts in found for n in counts]


def test_lengths_depth_and_arguments_follow_the_spec():
    spec = ListOpsSpec(max_depth=3, max_args=4)
    rng = random.Random(0)
    depths = set()
    for _ in range(300):
        tree, length = generate_tree(spec, rng)
        deepest, counts = shape(tree)
        depths.add(deepest)
        assert length == len(tree_tokens(tree)) and all(2 <= count <= spec.max_args for count in counts)
    assert depths == {0, 1, 2}  # operators below max_depth only: depth 3 is digits
    task = ListOpsTask(256)
    lengths = [len(ids) for ids, _ in task.evaluation("test", 50)]
    assert min(lengths) >= 1 + int(0.25 * 255) and max(lengths) <= 256
    assert task.evaluation("test", 50) == task.evaluation("test", 50) != task.evaluation("validation", 50)


# --------------------------------------------------------------------------- document matching


def check_pairs(data: dict) -> None:
    """Labels say "same document"; every split is balanced, every head and tail as often in a positive as in a
    negative pair; no document is in two splits."""
    documents = {}
    for name, pairs in data["splits"].items():
        assert all(label == int(head == tail) for head, tail, label in pairs)
        assert sum(label for *_, label in pairs) * 2 == len(pairs)
        for end in (0, 1):
            uses = Counter(pair[end] for pair in pairs)
            positives = Counter(pair[end] for pair in pairs if pair[2])
            assert all(positives[document] * 2 == count for document, count in uses.items())
        documents[name] = {head for head, _, _ in pairs}
    assert not documents["train"] & documents["validation"] and not documents["test"] & documents["validation"]
    assert not documents["train"] & documents["test"]


def test_builder_pairs_are_balanced_and_labelled_same_document(tmp_path):
    stdlib = tmp_path / "lib"
    for index in range(10):
        words = " ".join(f"name{index}_{k}" for k in range(2 * builder.SEGMENT_TOKENS + index))
        (stdlib / f"pkg{index}").mkdir(parents=True)
        (stdlib / f"pkg{index}" / "module.py").write_text(words)
    (stdlib / "short.py").write_text("x = 1\n")  # too short: left out
    (stdlib / "zz_copy.py").write_text((stdlib / "pkg0" / "module.py").read_text())  # a repeated text: left out
    data = builder.build(stdlib, seed=3)
    assert [d["path"] for d in data["documents"]] == [f"pkg{i}/module.py" for i in range(10)]
    assert data["documents"][4]["head"].split()[0] == "name4_0" and data["documents"][4]["tail"].split()[-1] == (
        f"name4_{2 * builder.SEGMENT_TOKENS + 3}")
    check_pairs(data)
    assert data == builder.build(stdlib, seed=3) != builder.build(stdlib, seed=4)
    data["splits"]["test"][0][2] ^= 1  # a wrong label is caught
    with pytest.raises(AssertionError):
        check_pairs(data)


def test_the_shipped_data_is_what_its_licence_file_says():
    data = retrieval_data()
    check_pairs(data)
    assert len(data["documents"]) == 414 and {k: len(v) for k, v in data["splits"].items()} == {
        "train": 3968, "validation": 166, "test": 166}
    assert all(d["tokens"] >= 2 * data["segment_tokens"] for d in data["documents"])
    assert all(len(d["head"].split(" ")) == len(d["tail"].split(" ")) == 2047 for d in data["documents"])


def test_a_retrieval_example_is_the_head_and_tail_of_its_pair():
    task = RetrievalTask(64)
    data = retrieval_data()
    ids, label = task.evaluation("test", 1)[0]
    head, tail, expected = data["splits"]["test"][0]
    assert label == expected and len(ids) == 64 and ids[0] == CLS and ids[32] == SEP
    assert ids[1:32] == hashed_ids(data["documents"][head]["head"])[:31]
    assert ids[33:] == hashed_ids(data["documents"][tail]["tail"])[-31:]
    assert {label for *_, label in data["splits"]["test"]} == {0, 1}
    with pytest.raises(ValueError, match="T up to 4096"):
        RetrievalTask(8192)


def crc_id(token: str) -> int:
    """The real-text tasks' id of a token, written out: CRC-32 into 4096 buckets after the special tokens."""
    return SPECIAL_TOKENS + zlib.crc32(token.encode()) % 4096


def test_retrieval_ids_are_the_crc32_of_each_token():
    data = retrieval_data()
    for (ids, label), (head, tail, expected) in zip(RetrievalTask(64).evaluation("test", 2), data["splits"]["test"]):
        head_tokens = data["documents"][head]["head"].split(" ")[:31]
        tail_tokens = data["documents"][tail]["tail"].split(" ")[-31:]
        assert ids == [CLS, *map(crc_id, head_tokens), SEP, *map(crc_id, tail_tokens)] and label == expected


# --------------------------------------------------------------------------- identifier lookup


def query_candidate_ids(tokens: list[str]) -> set[int]:
    """The ids of the tokens a lookup query may be: identifiers, not keywords, at least 3 characters."""
    return {crc_id(token) for token in tokens if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token)
            and not keyword.iskeyword(token) and len(token) >= 3}


def windows_of_split(split: str, length: int) -> dict[tuple[int, ...], set[int]]:
    """For each document of ``split`` (in its pairs), the ids of its first T - 3 head-then-tail tokens, mapped to
    the query ids of those windows (documents that begin alike share an entry)."""
    data, windows = retrieval_data(), {}
    for document in {index for pair in data["splits"][split] for index in pair[:2]}:
        tokens = (data["documents"][document]["head"] + " " + data["documents"][document]["tail"]).split(" ")
        window = tokens[:length - 3]
        windows.setdefault(tuple(map(crc_id, window)), set()).update(query_candidate_ids(window))
    return windows


@pytest.mark.parametrize(("length", "split", "count"), [(64, "train", 200), (1024, "train", 200), (64, "test", 50),
                                                        (1024, "validation", 50)])
def test_a_lookup_example_is_a_documents_beginning_and_a_query_it_holds_or_not(length, split, count):
    """[CLS], the first T - 3 tokens of a document of the split, [SEP], an identifier's id; label 1 exactly when the
    query's id is among the document's ids; a positive query is an identifier of the window, a negative one an
    identifier of another document's window of the same split."""
    task = LookupTask(length)
    examples = (itertools.islice(task.train_stream(3), count) if split == "train"
                else task.evaluation(split, count))
    windows = windows_of_split(split, length)
    labels = []
    for ids, label in examples:
        assert len(ids) == length and ids[0] == CLS and ids[length - 2] == SEP
        window, query = tuple(ids[1:length - 2]), ids[-1]
        assert min(window) >= SPECIAL_TOKENS and query >= SPECIAL_TOKENS
        assert label == int(query in window)
        assert window in windows  # the beginning of a document of this split
        if label:
            assert query in windows[window]
        else:
            assert any(query in queries for other, queries in windows.items() if other != window)
        labels.append(label)
    assert set(labels) == {0, 1}


def test_lookup_labels_are_balanced_and_positive_queries_are_not_dominated_by_frequent_names():
    examples = list(itertools.islice(LookupTask(1024).train_stream(0), 400))
    assert abs(statistics.fmean(label for _, label in examples) - 0.5) <= 0.1
    positives = Counter(ids[-1] for ids, label in examples if label)
    # drawn from the window's tokens instead of its distinct identifiers, `self` and its like take about 10%
    assert positives.most_common(1)[0][1] <= 0.05 * positives.total()
    assert abs(statistics.fmean(label for _, label in itertools.islice(LookupTask(64).train_stream(0), 400))
               - 0.5) <= 0.1


def test_lookup_evaluation_is_fixed_and_its_documents_are_not_trained_on():
    task = LookupTask(64)
    test = task.evaluation("test", 30)
    assert test == task.evaluation("test", 30) == LookupTask(64).evaluation("test", 30)
    assert test != task.evaluation("validation", 30) and test[:10] == task.evaluation("test", 10)
    first = list(itertools.islice(task.train_stream(0), 20))
    assert first == list(itertools.islice(task.train_stream(0), 20)) != list(itertools.islice(task.train_stream(1), 20))
    data = retrieval_data()
    documents = {split: set(task.documents(split)) for split in ("train", "validation", "test")}
    for split, used in documents.items():
        assert used <= {index for pair in data["splits"][split] for index in pair[:2]} and len(used) > 1
    assert not documents["train"] & (documents["validation"] | documents["test"])
    assert not documents["validation"] & documents["test"]
    document = task.documents("test")[0]
    assert task.window(document) is task.window(document)  # built once per document and T


def test_lookup_lengths_names_and_documents_without_a_window_are_refused(tmp_path):
    largest = max(len(d["head"].split(" ")) + len(d["tail"].split(" ")) for d in retrieval_data()["documents"]) + 3
    with pytest.raises(ValueError, match=f"T up to {largest}"):
        LookupTask(largest + 1)
    ((ids, _),) = LookupTask(largest).evaluation("test", 1)
    assert len(ids) == largest
    with pytest.raises(ValueError, match="too short"):
        LookupTask(7)
    task = make_task("lookup", 64)
    assert isinstance(task, LookupTask) and task.num_labels == 2 and task.vocab_size == RetrievalTask(64).vocab_size
    with pytest.raises(ValueError, match="choose from listops, retrieval, lookup"):
        make_task("lookups", 64)
    names = " ".join(f"name_{k}" for k in range(10))
    digits = " ".join(str(k) for k in range(10))
    data = {"documents": [{"head": names, "tail": names}, {"head": names, "tail": names},
                          {"head": digits, "tail": digits}, {"head": "abc x", "tail": "y z"}],
            "splits": {"train": [[0, 1, 0]], "validation": [[2, 2, 1]], "test": [[3, 3, 1]]}}
    path = tmp_path / "tiny.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    task = LookupTask(16, path)
    assert task.documents("train") == [0, 1]
    for split in ("validation", "test"):  # no identifier in 13 tokens; fewer than 13 tokens
        with pytest.raises(ValueError, match=f"the {split} split has 0 document"):
            task.evaluation(split, 1)


def test_the_training_step_fits_lookup_pairs_that_differ_only_in_the_query():
    """A control for the training path: 16 windows, each once with an absent query (label 0) and once with one of
    its own ids as the query (label 1). Fitting all 32 needs the query token and the labels under the key the loss
    reads; a query truncated or masked away, labels ignored or a frozen model leave the accuracy at 0.5."""
    task = LookupTask(16)
    negatives = [ids for ids, label in task.evaluation("validation", 64) if label == 0][:16]
    examples = [(ids, 0) for ids in negatives] + [([*ids[:-1], ids[5]], 1) for ids in negatives]
    assert all(label == int(ids[-1] in ids[1:-2]) for ids, label in examples)
    args = bench.parse_args(["--lengths", "16", "--hidden-size", "32", "--heads", "2"])
    model = bench.build_model(bench.BY_NAME["sdpa"], task, args, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(100):
        bench.training_step(model, optimizer, collate(examples))
    assert bench.accuracy(model, examples, batch_size=32, device=torch.device("cpu")) == 1.0


def test_collate_pads_and_masks():
    batch = collate([([CLS, 5, 6], 1), ([CLS, 7], 0)])
    assert batch["input_ids"].tolist() == [[CLS, 5, 6], [CLS, 7, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]] and batch["labels"].tolist() == [1, 0]


# --------------------------------------------------------------------------- topic classification


def body_bytes(body: str) -> bytes:
    """A body's ids (:func:`crc_id` of each token) as 2-byte big-endian integers, for substring search."""
    return b"".join(crc_id(token).to_bytes(2, "big") for token in body.split(" "))


def files_holding(window: list[int], bodies: dict[int, bytes]) -> set[int]:
    """The files whose body holds ``window`` as consecutive ids (an aligned match, at an even byte offset)."""
    needle = b"".join(token.to_bytes(2, "big") for token in window)
    found = set()
    for file, haystack in bodies.items():
        start = haystack.find(needle)
        while start >= 0 and start % 2:
            start = haystack.find(needle, start + 1)
        if start >= 0:
            found.add(file)
    return found


@pytest.mark.parametrize("length", [64, 1024])
def test_a_topic_example_is_a_window_of_a_file_of_its_group_and_split(length):
    """[CLS] and T - 1 consecutive ids of a file's body: a file of the split holds the window, and every file that
    holds it is of the group the label names (the label is a function of the file), for training and evaluation
    examples. (A file of another split may hold it too: some code is copied between files, e.g. http's status
    table in test_httplib; 0.5% of 63-token windows of validation and test files occur in a training file, a tenth
    of those in one of another group, none among these examples.)"""
    data, task = topic_data(), TopicTask(length)
    bodies = {file: body_bytes(data["files"][file]["body"]) for file in range(len(data["files"]))}
    split_of = {file: split for split, files in data["splits"].items() for file in files}
    streams = {"train": list(itertools.islice(task.train_stream(5), 40)),
               "validation": task.evaluation("validation", 27), "test": task.evaluation("test", 27)}
    for split, examples in streams.items():
        for ids, label in examples:
            assert len(ids) == length and ids[0] == CLS and min(ids[1:]) >= SPECIAL_TOKENS
            holders = files_holding(ids[1:], bodies)
            assert split in {split_of[file] for file in holders}
            assert {data["files"][file]["group"] for file in holders} == {data["groups"][label]}
    assert len({label for _, label in streams["train"]}) > 5


def test_topic_windows_start_anywhere_in_the_body_and_never_at_the_header():
    """Offsets are uniform over the body (not just its start); a body never starts with the header: no import, no
    docstring, no comment, no ``__all__``."""
    task, data = TopicTask(1024), topic_data()
    rng = random.Random(0)
    drawn = [task.example_of("test", label % 9, rng) for label in range(90)]
    for (ids, _), file, offset in drawn:
        assert ids[1:] == hashed_ids(data["files"][file]["body"])[offset:offset + 1023]
    offsets = [offset for *_, offset in drawn]
    assert sum(offset > 0 for offset in offsets) >= 80 and max(offsets) > 2000
    first = Counter(file["body"].split(" ")[0] for file in data["files"])
    assert not {"import", "from", "#", '"', "'", "__all__"} & set(first)


def test_topic_splits_are_disjoint_by_file_and_hold_every_group_at_1024_and_4096():
    data = topic_data()
    splits = {name: set(files) for name, files in data["splits"].items()}
    assert not splits["train"] & splits["validation"] and not splits["train"] & splits["test"]
    assert not splits["validation"] & splits["test"]
    assert set().union(*splits.values()) == set(range(len(data["files"])))
    counts = {}
    for length in (1024, 4096):
        task = TopicTask(length)
        for split, per_label in task.files.items():
            assert all(per_label) and all(data["groups"].index(data["files"][f]["group"]) == label
                                          for label, files in enumerate(per_label) for f in files)
            assert all(data["files"][f]["tokens"] >= length - 1 for files in per_label for f in files)
            counts[split, length] = sum(map(len, per_label))
    # the class docstring's counts
    assert [counts[split, 1024] for split in ("train", "validation", "test")] == [338, 112, 112]
    assert [counts[split, 4096] for split in ("train", "validation", "test")] == [145, 48, 48]


def test_topic_classes_are_balanced():
    task = TopicTask(256)
    assert task.num_labels == len(topic_builder.GROUPS) == 9
    for split in ("validation", "test"):
        counts = Counter(label for _, label in task.evaluation(split, 256))
        assert set(counts) == set(range(9)) and max(counts.values()) - min(counts.values()) <= 1
    counts = Counter(label for _, label in itertools.islice(task.train_stream(0), 900))
    assert set(counts) == set(range(9)) and all(60 <= count <= 140 for count in counts.values())
    test = task.evaluation("test", 30)
    assert test == TopicTask(256).evaluation("test", 30) != task.evaluation("validation", 30)


def test_the_topic_builder_keeps_bodies_after_the_header_and_groups_by_path(tmp_path):
    stdlib = tmp_path / "lib"
    body = "\n".join(f"    value_{k} = compute_{k}(value_{k - 1})" for k in range(1, 401))
    header = ('# Copyright mailbox licence\n"""mailbox: the module docstring."""\n\nimport os\nfrom email import '
              'message\n__all__ = ["Box"]\n__version__: str = "1"\n\n# a comment before the code\n')
    (stdlib / "email").mkdir(parents=True)
    (stdlib / "mailbox.py").write_text(header + "@decorate\nclass Box:\n" + body + "\n")
    (stdlib / "email" / "parser.py").write_text('"""parser"""\ndef parse():\n' + body + "\n")
    (stdlib / "email" / "short.py").write_text("def f():\n    return 1\n")  # a body under 1023 tokens
    (stdlib / "email" / "broken.py").write_text("def f(:\n" + body)  # does not parse
    (stdlib / "email" / "zz_copy.py").write_text((stdlib / "email" / "parser.py").read_text())  # a repeated text
    (stdlib / "colorsys.py").write_text("def f():\n" + body)  # in no group
    data = topic_builder.build(stdlib, seed=0)
    files = {file["path"]: file for file in data["files"]}
    assert set(files) == {"email/parser.py", "mailbox.py"} and {f["group"] for f in files.values()} == {"email"}
    tokens = files["mailbox.py"]["body"].split(" ")
    assert tokens[:6] == ["@", "decorate", "class", "Box", ":", "value_1"]
    assert not {"Copyright", "mailbox", "docstring", "import", "os", "__all__", "__version__", "comment"} & set(tokens)
    assert files["mailbox.py"]["tokens"] == len(tokens) == 5 + 400 * 6
    assert files["email/parser.py"]["body"].split(" ")[:2] == ["def", "parse"]
    assert data == topic_builder.build(stdlib, seed=0)
    assert topic_builder.group_of("test/test_email/test_utils.py") == "email"
    assert topic_builder.group_of("test/test_asyncio/test_tasks.py") == "concurrency"
    assert topic_builder.group_of("test/test_xmlrpc.py") == "network" and topic_builder.group_of("colorsys.py") is None


@pytest.mark.skipif(platform.python_version() != "3.11.7", reason="the shipped data is built from CPython 3.11.7")
def test_the_shipped_topic_data_is_what_its_builder_makes_from_this_standard_library(tmp_path):
    assert topic_builder.main(["--output", str(tmp_path / "topic.json.gz")]) == 0
    assert (tmp_path / "topic.json.gz").read_bytes() == TOPIC_DATA.read_bytes()
    data = topic_data()
    assert len(data["files"]) == 562 and all(f["tokens"] >= 1023 for f in data["files"])


def test_topic_lengths_and_splits_without_a_group_are_refused(tmp_path):
    with pytest.raises(ValueError, match="T up to 8193"):
        TopicTask(8194)
    files = [{"path": f"{k}.py", "group": group, "tokens": 20, "body": " ".join(["x"] * 20)}
             for k, group in enumerate(["a", "b", "a", "b", "a"])]
    data = {"groups": ["a", "b"], "body_tokens": 20, "files": files,
            "splits": {"train": [0, 1], "validation": [2, 3], "test": [4]}}
    path = tmp_path / "tiny.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    with pytest.raises(ValueError, match="no test file of group"):
        TopicTask(16, path)


def test_a_tiny_topic_run_of_the_benchmark_finishes(tmp_path):
    argv = ["--tasks", "topic", "--contenders", "sdpa,hybrid", "--lengths", "32", "--seeds", "0", "--steps", "3",
            "--hidden-size", "16", "--heads", "2", "--local-window", "8", "--evaluations", "1",
            "--validation-examples", "9", "--test-examples", "18", "--output", str(tmp_path)]
    assert bench.main(argv) == 0
    raw = json.loads((tmp_path / "long_range.json").read_text())
    assert [(run["task"], run["contender"], run["steps"]) for run in raw["runs"]] == [
        ("topic", "sdpa", 3), ("topic", "hybrid", 3)]
    assert raw["chance"]["topic/32"]["test"] == {"majority_label": 0, "majority_share": 2 / 18, "uniform": 1 / 9,
                                                 "examples": 18}
    assert "| topic | 32 | sdpa |" in (tmp_path / "long_range.md").read_text()
