"""Build the real-text task of the long-range benchmark (``benchmarks/bench_long_range.py``):
document matching on Python source files, in the spirit of Long Range Arena's retrieval task.

Nothing is downloaded: the documents are the source files of the Python standard library of the
interpreter that runs the script (CPython 3.11.7 here; PSF licence, see ``LICENSE.md``)::

    python benchmarks/data/long_range/build_retrieval_data.py      # writes retrieval.json.gz next to it

Options: ``--stdlib DIR`` (default: this interpreter's, ``sysconfig.get_paths()["stdlib"]``),
``--output FILE`` (default ``retrieval.json.gz`` next to this script), ``--seed`` (default 0). The output
is a function of the standard library and the seed: running it twice gives the same bytes.

1. **Documents.** Every ``*.py`` file under the standard library, in sorted path order, except
   ``site-packages/`` (not the standard library) and ``encodings/`` (generated codec tables, nearly
   identical to each other); a file that is not UTF-8, or whose text repeats an earlier file's, is
   skipped. A file is cut into tokens by ``TOKEN`` (identifiers, numbers, and every other non-space
   character alone; whitespace is dropped) and kept when it has at least ``2 * SEGMENT_TOKENS`` tokens,
   so that its first and last ``SEGMENT_TOKENS`` tokens never overlap: the longest input of the
   benchmark, T = 4096, is [CLS] + 2047 head tokens + [SEP] + 2047 tail tokens.
2. **Splits.** The kept documents are shuffled with ``random.Random(seed)``; the first
   ``TEST_SHARE`` go to test, the next ``VALIDATION_SHARE`` to validation, the rest to train: no
   document is in two splits.
3. **Pairs** ``[head document, tail document, label]``, label 1 when both are the same document. A
   split's pairs are made in rounds (``ROUNDS``: 8 for train, 1 for validation and test): each round
   pairs every document's head with its own tail (label 1) and with the tail of the next document in
   a fresh random order of the split (a cyclic shift, so never its own: label 0). Every head and every
   tail is then in as many positive as negative pairs, so neither half alone tells the label: the
   evidence is the agreement between the beginning and the end of a file (its names, imports, style),
   thousands of tokens apart. The pairs of a split are shuffled.
4. ``retrieval.json.gz`` (gzip without a timestamp or file name): ``documents`` (path relative to the standard
   library, ``tokens`` in the whole file, ``head`` and ``tail``: the first and last ``SEGMENT_TOKENS``
   tokens joined by single spaces) and ``splits`` (``train``, ``validation``, ``test``: lists of pairs).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import random
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|\S")
"""A token: an identifier, a number, or any other non-space character."""
SEGMENT_TOKENS = 2047
"""Tokens kept from each end of a document: half of the largest T (4096) less [CLS] and [SEP]."""
EXCLUDED_FOLDERS = ("site-packages", "encodings")
TEST_SHARE, VALIDATION_SHARE = 0.2, 0.2
ROUNDS = {"train": 8, "validation": 1, "test": 1}
HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "retrieval.json.gz"


def tokenize(text: str) -> list[str]:
    """The tokens of ``text`` (see ``TOKEN``)."""
    return TOKEN.findall(text)


def read_documents(stdlib: Path) -> list[dict[str, object]]:
    """The kept documents, in path order: ``path``, ``tokens`` (the file's count), ``head``, ``tail``."""
    documents, seen = [], set()
    for path in sorted(stdlib.rglob("*.py")):
        relative = path.relative_to(stdlib)
        if relative.parts[0] in EXCLUDED_FOLDERS:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).digest()
        tokens = tokenize(text)
        if digest in seen or len(tokens) < 2 * SEGMENT_TOKENS:
            continue
        seen.add(digest)
        documents.append({"path": relative.as_posix(), "tokens": len(tokens),
                          "head": " ".join(tokens[:SEGMENT_TOKENS]), "tail": " ".join(tokens[-SEGMENT_TOKENS:])})
    return documents


def split_documents(count: int, rng: random.Random) -> dict[str, list[int]]:
    """Document indices per split, disjoint (``TEST_SHARE`` and ``VALIDATION_SHARE`` of ``count``)."""
    order = list(range(count))
    rng.shuffle(order)
    test, validation = round(TEST_SHARE * count), round(VALIDATION_SHARE * count)
    return {"train": order[test + validation:], "validation": order[test:test + validation], "test": order[:test]}


def make_pairs(documents: list[int], rounds: int, rng: random.Random) -> list[list[int]]:
    """``rounds`` rounds of one positive and one negative pair per document (see the module docstring),
    shuffled: ``[head document, tail document, label]``."""
    if len(documents) < 2:
        raise ValueError("a split needs at least two documents to pair a head with another document's tail")
    pairs = []
    for _ in range(rounds):
        order = list(documents)
        rng.shuffle(order)
        pairs += [[index, index, 1] for index in documents]
        pairs += [[head, tail, 0] for head, tail in zip(order, order[1:] + order[:1])]
    rng.shuffle(pairs)
    return pairs


def build(stdlib: Path, seed: int) -> dict[str, object]:
    """The whole data set: the documents, the splits' pairs and how they were made."""
    documents = read_documents(stdlib)
    rng = random.Random(seed)
    splits = split_documents(len(documents), rng)
    return {
        "source": f"Python {platform.python_version()} standard library sources",
        "seed": seed, "segment_tokens": SEGMENT_TOKENS, "token_pattern": TOKEN.pattern,
        "documents": documents,
        "splits": {name: make_pairs(indices, ROUNDS[name], rng) for name, indices in splits.items()},
    }


def run_builder(argv: list[str] | None, description: str, output: Path,
                build_data: Callable[[Path, int], dict[str, Any]], summary: Callable[[dict[str, Any]], str]) -> int:
    """The command line the long-range builders share: ``--stdlib`` (the sources read), ``--output`` (default
    ``output``) and ``--seed``; writes ``build_data(stdlib, seed)`` as gzipped JSON (no timestamp, so the same
    sources give the same bytes) and prints ``summary(data)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--output", type=Path, default=output)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data = build_data(args.stdlib, args.seed)
    args.output.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0))
    print(f"{summary(data)}: wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_builder(argv, __doc__.split("\n\n")[0], OUTPUT, build, lambda data: (
        f"{len(data['documents'])} documents, pairs {({name: len(pairs) for name, pairs in data['splits'].items()})}"))


if __name__ == "__main__":
    raise SystemExit(main())
