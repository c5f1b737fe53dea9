"""Fast checks of the shipped quality-benchmark data (benchmarks/data/quality, built by
benchmarks/data/build_quality_data.py): present, balanced, disjoint, real text."""

import collections
import csv
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "quality"
SPLITS = {"train": 1600, "validation": 400, "test": 400, "test_large": 2000}
LABELS = {"noun.act", "noun.artifact", "noun.communication", "noun.person"}


def read_split(name):
    with (DATA / f"{name}.csv").open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["sentence", "label"]
        return [(row["sentence"], row["label"]) for row in reader]


@pytest.fixture(scope="module")
def splits():
    return {name: read_split(name) for name in SPLITS}


def normalise(text):
    return " ".join(text.lower().split())


def test_files_exist():
    for name in [*(f"{s}.csv" for s in SPLITS), "heldout_docstrings.txt", "reporting_reference.txt", "LICENSE.md"]:
        assert (DATA / name).is_file(), name
    note = (DATA / "LICENSE.md").read_text()
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in note
    assert "Python Software Foundation" in note
    assert "build_quality_data.py" in note


def test_sizes_and_balanced_labels(splits):
    for name, rows in splits.items():
        assert len(rows) == SPLITS[name]
        counts = collections.Counter(label for _, label in rows)
        assert set(counts) == LABELS
        assert set(counts.values()) == {SPLITS[name] // len(LABELS)}, (name, counts)


def test_no_duplicates_and_disjoint_splits(splits):
    seen = {}
    for name, rows in splits.items():
        texts = [normalise(sentence) for sentence, _ in rows]
        assert len(set(texts)) == len(texts), f"duplicates inside {name}"
        for other, other_texts in seen.items():
            assert not set(texts) & other_texts, f"{name} overlaps {other}"
        seen[name] = set(texts)


def test_text_is_not_templated(splits):
    rows = [row for rows in splits.values() for row in rows]
    prefixes = collections.Counter(" ".join(normalise(s).split()[:3]) for s, _ in rows)
    assert len(prefixes) > 0.6 * len(rows)  # mostly distinct openings
    assert prefixes.most_common(1)[0][1] <= 0.02 * len(rows)  # no opening dominates
    vocabulary = {word for s, _ in rows for word in normalise(s).split()}
    assert len(vocabulary) > 5000
    lengths = [len(s.split()) for s, _ in rows]
    assert min(lengths) >= 5 and max(lengths) <= 60
    assert len(set(lengths)) > 25
    assert not any('"' in s for s, _ in rows)  # definitions only, no quoted example sentences


def test_heldout_docstrings(splits):
    lines = (DATA / "heldout_docstrings.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300
    assert all(line.strip() == line and 8 <= len(line.split()) <= 60 for line in lines)
    assert len({normalise(line) for line in lines}) == len(lines)
    train = {normalise(s) for s, _ in splits["train"]}
    assert not train & {normalise(line) for line in lines}
    assert len({" ".join(normalise(line).split()[:3]) for line in lines}) > 200


def test_reporting_reference_is_other_text_than_all_the_rest(splits):
    """The conversion's reporting text shares no passage with the tuning text (the docstrings) or the glosses,
    and its passages are paragraphs, longer than the docstrings' first sentences."""
    lines = (DATA / "reporting_reference.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300
    assert all(line.strip() == line and 30 <= len(line.split()) <= 150 and line.endswith(".") for line in lines)
    reporting = {normalise(line) for line in lines}
    assert len(reporting) == len(lines)
    docstrings = {normalise(line) for line in (DATA / "heldout_docstrings.txt").read_text(encoding="utf-8").splitlines()}
    glosses = {normalise(s) for rows in splits.values() for s, _ in rows}
    assert not reporting & docstrings and not reporting & glosses
    words = sorted(len(line.split()) for line in lines)
    docstring_words = sorted(len(line.split()) for line in docstrings)
    assert words[len(words) // 2] >= 3 * docstring_words[len(docstring_words) // 2]


def test_the_long_tuning_text_is_docstring_paragraphs_apart_from_the_reporting_text():
    lines = (DATA / "tuning_docstring_paragraphs.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300 and len(set(map(normalise, lines))) == 300
    assert all(line.isascii() and 30 <= len(line.split()) <= 150 and line.endswith(".") for line in lines)
    reporting = {normalise(line) for line in (DATA / "reporting_reference.txt").read_text(encoding="utf-8").splitlines()}
    assert not reporting & {normalise(line) for line in lines}
    short = (DATA / "heldout_docstrings.txt").read_text(encoding="utf-8").splitlines()
    assert sorted(map(len, lines))[150] >= 3 * sorted(map(len, short))[150]


def read_lines(name):
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def test_the_training_paragraphs_share_no_passage_or_sentence_with_the_other_texts(splits):
    """train_docstring_paragraphs.txt (issue #24): connected text to train a conversion on, kept under the rules of
    the tuning paragraphs, and none of it in the glosses, the tuning texts or the reporting text."""
    from benchmarks.data.build_quality_data import sentences

    lines = read_lines("train_docstring_paragraphs.txt")
    assert 300 <= len(lines) <= 3000 and len(set(map(normalise, lines))) == len(lines)
    assert all(line.isascii() and line[0].isupper() and 30 <= len(line.split()) <= 150 and line.endswith(".")
               and ">>>" not in line for line in lines)
    held_out = [*read_lines("heldout_docstrings.txt"), *read_lines("tuning_docstring_paragraphs.txt"),
                *read_lines("reporting_reference.txt")]
    glosses = {normalise(s) for rows in splits.values() for s, _ in rows}
    assert not {normalise(line) for line in lines} & ({normalise(line) for line in held_out} | glosses)
    held_out_sentences = {s for passage in held_out for s in sentences(passage)}
    assert not [line for line in lines if held_out_sentences & set(sentences(line))]
    short = read_lines("heldout_docstrings.txt")
    assert sorted(map(len, lines))[len(lines) // 2] >= 3 * sorted(map(len, short))[150]
    assert "`train_docstring_paragraphs.txt` | " + str(len(lines)) in (DATA / "LICENSE.md").read_text()


PROVENANCE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import build_quality_data as b
read = lambda name: open(f"{sys.argv[2]}/{name}", encoding="utf-8").read().splitlines()
training = set(map(b.normalise, read("train_docstring_paragraphs.txt")))
contributing = b.contributing_modules(read("heldout_docstrings.txt"), read("tuning_docstring_paragraphs.txt"))
modules = sorted(set(b.stdlib_modules()) | set(b.stdlib_submodules()))
prose = {m: set(map(b.normalise, b.module_paragraphs(m) + b.kept_paragraphs(b.own_docstrings(m)))) for m in modules}
print(json.dumps({"contributing": contributing,
                  "training_modules": sorted(m for m in modules if prose[m] & training),
                  "unplaced": len(training - set().union(*prose.values()))}))
"""


def test_the_training_paragraphs_come_from_modules_apart_from_those_of_the_tuning_texts():
    """Disjoint by module: no paragraph of the training text is prose (a docstring paragraph) of a module that gave a
    passage to heldout_docstrings.txt or tuning_docstring_paragraphs.txt. Run in a subprocess: it imports the
    standard library."""
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", PROVENANCE, str(DATA.parent), str(DATA)], capture_output=True,
                            text=True, check=True)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(found["contributing"]) > 100  # the tuning texts drew on most top-level modules
    assert not set(found["contributing"]) & set(found["training_modules"])
    if "CPython " + ".".join(map(str, sys.version_info[:3])) in (DATA / "LICENSE.md").read_text():
        assert found["unplaced"] == 0 and len(found["training_modules"]) > 50  # the interpreter that built it
