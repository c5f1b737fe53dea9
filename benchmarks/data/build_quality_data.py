#!/usr/bin/env python
"""Build the real-text data of the quality benchmark (``benchmarks/bench_quality.py``).

It needs Debian's WordNet 3.0 database (installed as root; nothing else is downloaded)::

    apt-get update && apt-get install -y wordnet-base      # Debian's WordNet 3.0 database
    python benchmarks/data/build_quality_data.py            # writes benchmarks/data/quality/

Options: ``--wordnet DIR`` (default ``/usr/share/wordnet``), ``--output DIR`` (default
``benchmarks/data/quality`` next to this script), ``--seed`` (default 0). The output is a
function of the WordNet files, the Python standard library of the interpreter that runs the
script and the seed: running it twice gives the same bytes.

1. **Supersense classification of WordNet noun glosses** (``train.csv``, ``validation.csv``,
   ``test.csv``; columns ``sentence,label``). Every synset line of ``data.noun`` carries its
   lexicographer file (``lex_filenum``, see ``lexnames(5WN)``), i.e. its supersense, and after
   ``|`` its gloss: the definition written by WordNet's lexicographers, then optional example
   sentences in double quotes. The text is the definition alone, the examples are dropped:
   they are present for only part of the synsets, often contain the headword itself (a lexical
   clue that is not in the definition) and are a different kind of text (usage, not meaning).
   The four classes are the four most populated noun supersenses once ``noun.plant`` and
   ``noun.animal`` are left out (their glosses are largely taxonomic formulas such as "a genus
   of ..." / "any of various ..." and would make the task a keyword test): ``noun.artifact``,
   ``noun.person``, ``noun.act`` and ``noun.communication``. Acts and communications
   overlap in meaning (speech acts, documents, performances), persons and artifacts are told
   apart by the whole definition rather than by a single word.

   Kept: definitions of 5 to 60 words whose normalised text (lower case, single spaces)
   occurs in exactly one noun synset of WordNet (a definition shared by synsets, possibly of
   different supersenses, is dropped everywhere, so no text is in two splits or has two
   labels). Per class the candidates (in file order) are shuffled with ``random.Random(seed +
   lex_filenum)`` and taken in that order, skipping a candidate whose first three words
   (lower case) already start ``PREFIX_CAP`` taken definitions of the class: "the act of"
   starts 18% of noun.act, "a person who" 6% of noun.person, and the cap keeps such openings
   from deciding the label. The first 400 taken go to train, the next 100 to validation, the
   next 100 to test, the next 500 to test_large (1100 per class: train 1600, validation 400, test
   400, test_large 2000, balanced); each split's rows are then shuffled with ``random.Random(seed)``.
   ``test.csv`` and ``test_large.csv`` are for final figures only, never for tuning. test_large was
   added after the other splits (which it leaves byte for byte as they were) because 400 test
   examples leave one seed's paired accuracy difference with about ±2 points of sampling noise, too
   wide for a verdict on a 1-point bar.

2. **Held-out text of another kind** (``heldout_docstrings.txt``, one passage per line) for
   the conversion fidelity report: first sentences of docstrings of the Python standard
   library. Modules are the public (no leading underscore) names of ``sys.stdlib_module_names``
   in sorted order, minus those with side effects on import or a GUI (``EXCLUDED_MODULES``);
   the passages of a module are its own docstring, then the docstrings of its public classes
   and functions defined in it, by name. From each docstring (``inspect.getdoc``) the first
   paragraph that is not a call signature is taken, whitespace collapsed, cut at the end of
   its first sentence; kept when it has 8 to 60 words, ends with a period, is ASCII and does
   not hold doctest prompts. Modules are then visited round-robin (the first passage of every
   module, then the second, ...) until ``HELDOUT_PASSAGES`` distinct passages are taken, so the
   text covers the library rather than a few large modules.

3. **Reporting text for the conversion fidelity** (``reporting_reference.txt``, one passage per
   line), never used to choose a setting: the docstrings are the tuning texts (the converter's
   defaults are chosen on them, see 4), these paragraphs report. They are paragraphs of the Python
   Language Reference as the interpreter ships it for ``help()`` (``pydoc_data.topics``): topics
   in sorted order, each topic's text cut into paragraphs at blank lines, whitespace collapsed;
   kept when a paragraph has ``REPORTING_MIN_WORDS`` to ``REPORTING_MAX_WORDS`` words, starts with
   a capital (so no list item), ends with a period and holds no doctest prompt. Topics are visited
   round-robin, as modules above, until ``REPORTING_PASSAGES`` distinct paragraphs are taken. They
   are prose of a few sentences (75 all-MiniLM-L6-v2 tokens at the median, 141 at the 90th
   percentile), four times the docstrings' first sentences (17), so attention reaches well past
   a small local window.

4. **Long tuning text** (``tuning_docstring_paragraphs.txt``): the first sentences of 2 are short
   (17 tokens at the median), so a setting chosen on them alone says little about passages long
   enough for attention to reach past a local window. These are whole paragraphs of the same
   docstrings (modules and their public classes and functions as in 2), kept under the rules of
   the reporting text (``REPORTING_MIN_WORDS`` to ``REPORTING_MAX_WORDS`` words, a capital first, a
   period last, ASCII, no doctest prompt), none equal to a reporting paragraph, taken round-robin
   over the modules until ``REPORTING_PASSAGES``.

5. **Training paragraphs for the conversion** (``train_docstring_paragraphs.txt``, issue #24): connected text as
   long as the long tuning text, to train the attention transfer on instead of the short glosses. Whole docstring
   paragraphs under the rules of 4 (``kept_paragraphs``), from modules disjoint from every module that gave a
   passage to 2 or 4: the modules of 2 that contributed none (none of them holds a paragraph) and the public
   submodules of the packages among them (``pkgutil.walk_packages``, every dotted component public, no test
   package; not ``distutils``, which resolves to setuptools' copy where setuptools is installed). To have text
   enough, a module's docstrings here also take the public methods and properties of its classes, and each is
   the object's own docstring, never one inherited from a base class (``inspect.getdoc`` would lend prose of the
   tuning modules, such as ``codecs``', to the ``encodings`` submodules). Left out: every paragraph of a
   contributing module, any paragraph equal to a gloss and any that shares a sentence with a passage of 2, 3 or
   4. Taken round-robin over the modules, every one of them up to ``TRAINING_PASSAGES``: Python 3.11 gives 344
   paragraphs from 74 modules, far from the cap, because the tuning texts drew on nearly every top-level module.

6. ``LICENSE.md``: the WordNet 3.0 license (quoted from the header of ``data.noun``), the PSF
   license of the docstrings and the reference, how the files were built (this command, the WordNet package
   version, the SHA-256 of ``data.noun``, the Python version) and the class counts.
"""

from __future__ import annotations

import argparse
import collections
import csv
import hashlib
import importlib
import inspect
import io
import pkgutil
import random
import re
import subprocess
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "quality"
DEFAULT_WORDNET = Path("/usr/share/wordnet")

CLASSES = {4: "noun.act", 6: "noun.artifact", 10: "noun.communication", 18: "noun.person"}
"""lex_filenum -> supersense (lexnames(5WN)) of the four classes."""
SPLITS = (("train", 400), ("validation", 100), ("test", 100), ("test_large", 500))
"""Split sizes per class, taken in this order (``test_large`` comes after the others, so adding it left them as
they were)."""
MIN_WORDS, MAX_WORDS = 5, 60
PREFIX_CAP = 12
"""At most this many definitions of a class (of 1100) start with the same three words."""

HELDOUT_PASSAGES = 300
HELDOUT_MIN_WORDS, HELDOUT_MAX_WORDS = 8, 60
REPORTING_PASSAGES = 300
REPORTING_MIN_WORDS, REPORTING_MAX_WORDS = 30, 150
EXCLUDED_MODULES = {
    "antigravity", "this",                                   # open a browser / print on import
    "idlelib", "tkinter", "turtle", "turtledemo",            # GUI
    "ensurepip", "venv", "pydoc_data", "lib2to3",            # tooling, data, deprecated
    "msilib", "msvcrt", "winreg", "winsound", "nt",          # Windows only
}


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# ----------------------------------------------------------------------------- WordNet glosses
def read_noun_definitions(data_noun: Path) -> list[tuple[int, int, str]]:
    """(synset offset, lex_filenum, definition) for every synset of ``data.noun`` (wndb(5WN)):
    ``offset lex_filenum ss_type w_cnt word lex_id ... p_cnt pointers ... | gloss``."""
    rows = []
    for line in data_noun.read_text(encoding="ascii").splitlines():
        if line.startswith("  "):  # the license header
            continue
        fields, _, gloss = line.partition(" | ")
        offset, lex_filenum, ss_type = fields.split()[:3]
        if ss_type != "n":
            continue
        # the definition ends where the first quoted example begins
        definition = gloss.split('"', 1)[0].strip().rstrip(";").strip()
        rows.append((int(offset), int(lex_filenum), " ".join(definition.split())))
    return rows


def build_gloss_splits(rows: list[tuple[int, int, str]], seed: int) -> tuple[dict[str, list[tuple[str, str]]], dict]:
    occurrences = collections.Counter(normalise(d) for _, _, d in rows)
    per_class = sum(n for _, n in SPLITS)
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name, _ in SPLITS}
    counts = {}
    for lex_filenum, label in sorted(CLASSES.items()):
        synsets = sum(1 for _, lex, _ in rows if lex == lex_filenum)
        candidates = [d for _, lex, d in rows
                      if lex == lex_filenum and occurrences[normalise(d)] == 1
                      and MIN_WORDS <= len(d.split()) <= MAX_WORDS]
        random.Random(seed + lex_filenum).shuffle(candidates)
        taken, prefixes = [], collections.Counter()
        for definition in candidates:
            prefix = " ".join(normalise(definition).split()[:3])
            if prefixes[prefix] >= PREFIX_CAP:
                continue
            prefixes[prefix] += 1
            taken.append(definition)
            if len(taken) == per_class:
                break
        if len(taken) < per_class:
            raise SystemExit(f"{label}: only {len(taken)} usable definitions, {per_class} needed.")
        start = 0
        for name, size in SPLITS:
            splits[name] += [(d, label) for d in taken[start:start + size]]
            start += size
        counts[label] = {"synsets": synsets, "candidates": len(candidates)}
    for name in splits:
        random.Random(seed).shuffle(splits[name])
    return splits, counts


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)


# ----------------------------------------------------------------------------- stdlib docstrings
SIGNATURE = re.compile(r"^[\w.]+\(.*\)")
SENTENCE_END = re.compile(r"(?<=[a-z0-9)'\"`][.!?])\s+(?=[A-Z(`'\"])")


def first_sentence(doc: str | None) -> str | None:
    if not doc:
        return None
    for paragraph in doc.split("\n\n"):
        text = " ".join(paragraph.split())
        if not text or SIGNATURE.match(text):
            continue
        sentence = SENTENCE_END.split(text, maxsplit=1)[0]
        words = sentence.split()
        if (HELDOUT_MIN_WORDS <= len(words) <= HELDOUT_MAX_WORDS and sentence.endswith(".")
                and sentence.isascii() and ">>>" not in sentence):
            return sentence
        return None
    return None


def import_quietly(name: str):
    """Module ``name``, imported with its warnings and output silenced; None when it cannot be imported here."""
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - platform-specific or optional modules
        return None


def public_definitions(module, name: str) -> list:
    """The public classes and functions defined in ``module`` (named ``name``), by name."""
    return [obj for attr, obj in sorted(vars(module).items())
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj))
            and getattr(obj, "__module__", None) == name]


def module_docstrings(name: str) -> list[str]:
    """The docstrings of module ``name``: its own, then those of its public classes and functions defined in it,
    by name (``inspect.getdoc``); none for a module that cannot be imported here."""
    module = import_quietly(name)
    if module is None:
        return []
    docs = [inspect.getdoc(module)] + [inspect.getdoc(obj) for obj in public_definitions(module, name)]
    return [doc for doc in docs if doc]


def module_passages(name: str) -> list[str]:
    passages = []
    for doc in module_docstrings(name):
        sentence = first_sentence(doc)
        if sentence and sentence not in passages:
            passages.append(sentence)
    return passages


def module_paragraphs(name: str) -> list[str]:
    """The whole paragraphs of ``name``'s docstrings that :func:`build_docstring_paragraphs` keeps."""
    return kept_paragraphs(module_docstrings(name))


def kept_paragraphs(docs: list[str]) -> list[str]:
    """The paragraphs of ``docs`` (split at blank lines, whitespace collapsed) of ``REPORTING_MIN_WORDS`` to
    ``REPORTING_MAX_WORDS`` words, a capital first, a period last, ASCII, no doctest prompt; each once."""
    kept = []
    for doc in docs:
        for paragraph in doc.split("\n\n"):
            paragraph = " ".join(paragraph.split())
            if (REPORTING_MIN_WORDS <= len(paragraph.split()) <= REPORTING_MAX_WORDS and paragraph[0].isupper()
                    and paragraph.endswith(".") and paragraph.isascii() and ">>>" not in paragraph
                    and paragraph not in kept):
                kept.append(paragraph)
    return kept


def round_robin(per_source: list[list[str]], count: int, exclude: set[str], what: str,
                required: bool = True) -> list[str]:
    """``count`` distinct passages, the first of every source, then the second, ..., skipping any whose
    normalised text is in ``exclude`` or already taken: the text covers all sources, not a few large ones.
    Fewer than ``count`` is an error unless ``required`` is false (then every passage, up to ``count``)."""
    taken: list[str] = []
    seen = set(exclude)
    for depth in range(max(map(len, per_source), default=0)):
        for passages in per_source:
            if depth < len(passages) and normalise(passages[depth]) not in seen:
                seen.add(normalise(passages[depth]))
                taken.append(passages[depth])
                if len(taken) == count:
                    return taken
    if not required:
        return taken
    raise SystemExit(f"Only {len(taken)} {what} found, {count} needed.")


def stdlib_modules() -> list[str]:
    return sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in EXCLUDED_MODULES)


def build_docstrings(exclude: set[str]) -> list[str]:
    return round_robin([module_passages(m) for m in stdlib_modules()], HELDOUT_PASSAGES, exclude, "docstring passages")


def build_docstring_paragraphs(exclude: set[str]) -> list[str]:
    return round_robin([module_paragraphs(m) for m in stdlib_modules()], REPORTING_PASSAGES, exclude,
                       "docstring paragraphs")


# ----------------------------------------------------------------------------- training paragraphs
TRAINING_PASSAGES = 3000
"""At most this many training paragraphs (``train_docstring_paragraphs.txt``)."""
TRAINING_EXCLUDED_PACKAGES = {"distutils"}
"""Resolved to setuptools' copy (``_distutils_hack``) where setuptools is installed: not this interpreter's text."""


def stdlib_submodules() -> list[str]:
    """The public submodules (every dotted component public, none a test package) of the packages among
    :func:`stdlib_modules`, found with ``pkgutil.walk_packages``, sorted."""
    names = []
    for top in stdlib_modules():
        package = None if top in TRAINING_EXCLUDED_PACKAGES else import_quietly(top)
        if package is None or not hasattr(package, "__path__"):
            continue
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            found = [info.name for info in pkgutil.walk_packages(package.__path__, top + ".", onerror=lambda _: None)]
        names += [name for name in found if not any(
            part.startswith("_") or part in ("test", "tests") or part.startswith("test_") for part in name.split("."))]
    return sorted(names)


def own_doc(obj) -> str | None:
    """``obj``'s own docstring, cleaned; unlike ``inspect.getdoc`` never one inherited from a base class (of a
    module that may have contributed to the tuning texts)."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else None


def own_docstrings(name: str) -> list[str]:
    """The own docstrings of module ``name``: its own, those of its public classes and functions defined in it
    (as :func:`module_docstrings`), and those of the public methods and properties each of those classes defines."""
    module = import_quietly(name)
    if module is None:
        return []
    docs = [own_doc(module)]
    for obj in public_definitions(module, name):
        docs.append(own_doc(obj))
        members = sorted(vars(obj).items()) if inspect.isclass(obj) else []
        for member_name, member in members:
            member = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
            if not member_name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)
                                                    or inspect.ismethoddescriptor(member)):
                docs.append(own_doc(member))
    return [doc for doc in docs if doc]


def sentences(passage: str) -> list[str]:
    return [normalise(s) for s in SENTENCE_END.split(passage)]


def contributing_modules(docstrings: list[str], paragraphs: list[str]) -> list[str]:
    """The modules of :func:`stdlib_modules` with a first sentence in ``docstrings`` or a paragraph in
    ``paragraphs`` (a passage two modules share counts for both)."""
    short, long = set(map(normalise, docstrings)), set(map(normalise, paragraphs))
    return [m for m in stdlib_modules()
            if short & set(map(normalise, module_passages(m))) or long & set(map(normalise, module_paragraphs(m)))]


def build_training_paragraphs(glosses: set[str], docstrings: list[str], reference: list[str],
                              paragraphs: list[str]) -> tuple[list[str], int]:
    """Whole docstring paragraphs to train a conversion on (issue #24), and how many modules gave them. The modules are
    :func:`stdlib_modules` and :func:`stdlib_submodules` less :func:`contributing_modules` (those of the tuning texts);
    a module's passages are the paragraphs of :func:`own_docstrings` kept by :func:`kept_paragraphs`. Left out: any
    paragraph of a contributing module, one equal to a gloss (normalised) and one sharing a sentence with a tuning or
    reporting passage. Round-robin over the modules, at most ``TRAINING_PASSAGES``."""
    contributing = contributing_modules(docstrings, paragraphs)
    modules = sorted(set(stdlib_modules()) - set(contributing) | set(stdlib_submodules()))
    exclude = set(glosses)
    for module in contributing:
        exclude |= set(map(normalise, module_paragraphs(module) + kept_paragraphs(own_docstrings(module))))
    held_out = {sentence for passage in docstrings + reference + paragraphs for sentence in sentences(passage)}
    per_module = [[p for p in kept_paragraphs(own_docstrings(m)) if not held_out & set(sentences(p))] for m in modules]
    training = round_robin(per_module, TRAINING_PASSAGES, exclude, "training paragraphs", required=False)
    return training, sum(1 for passages in per_module if set(passages) & set(training))


# ----------------------------------------------------------------------------- the language reference
def reference_paragraphs(text: str) -> list[str]:
    """The paragraphs of one ``pydoc_data.topics`` topic that :func:`build_reporting_text` keeps."""
    kept = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if (REPORTING_MIN_WORDS <= len(paragraph.split()) <= REPORTING_MAX_WORDS and paragraph[0].isupper()
                and paragraph.endswith(".") and ">>>" not in paragraph):
            kept.append(paragraph)
    return kept


def build_reporting_text(exclude: set[str]) -> list[str]:
    from pydoc_data.topics import topics

    per_topic = [reference_paragraphs(topics[name]) for name in sorted(topics)]
    return round_robin(per_topic, REPORTING_PASSAGES, exclude, "reference paragraphs")


# ----------------------------------------------------------------------------- license note
def wordnet_license(data_noun: Path) -> str:
    # header lines: two spaces, the line number, a space, the text
    header = [re.sub(r"^\s+\d+ ?", "", line).rstrip() for line in data_noun.read_text(encoding="ascii").splitlines()
              if line.startswith("  ")]
    return "\n".join(("> " + line).rstrip() for line in header).strip()


def package_version(name: str) -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def license_note(data_noun: Path, counts: dict, seed: int, training: int) -> str:
    digest = hashlib.sha256(data_noun.read_bytes()).hexdigest()
    python = ".".join(map(str, sys.version_info[:3]))
    table = "\n".join(f"| {label} | {c['synsets']} | {c['candidates']} | 400 / 100 / 100 / 500 |"
                      for label, c in sorted(counts.items()))
    return f"""# Quality benchmark data: sources and licenses

Built by `python benchmarks/data/build_quality_data.py --seed {seed}` (after
`apt-get install -y wordnet-base`); the script's docstring describes every step, and running
it again gives the same files.

| file | rows | content |
|---|---|---|
| `train.csv` | 1600 | WordNet noun definitions, `sentence,label` (label: the supersense) |
| `validation.csv` | 400 | same, for tuning and the default benchmark split |
| `test.csv` | 400 | same, held out: final figures only |
| `test_large.csv` | 2000 | same, held out: final figures only (the next 500 definitions of each class) |
| `heldout_docstrings.txt` | {HELDOUT_PASSAGES} | first sentences of Python {python} standard-library docstrings (conversion: tuning text) |
| `tuning_docstring_paragraphs.txt` | {REPORTING_PASSAGES} | whole paragraphs of Python {python} standard-library docstrings (conversion: long tuning text) |
| `train_docstring_paragraphs.txt` | {training} | whole paragraphs of Python {python} standard-library docstrings from modules disjoint from those of the two tuning files (conversion: training text, issue #24) |
| `reporting_reference.txt` | {REPORTING_PASSAGES} | paragraphs of the Python {python} Language Reference, `pydoc_data.topics` (conversion: reporting text, never used for choosing) |

Inputs: Debian package `wordnet-base` {package_version('wordnet-base')}, `data.noun` SHA-256
`{digest}`; CPython {python}.

## Classes

The four most populated noun supersenses apart from `noun.plant` and `noun.animal` (whose
glosses are mostly taxonomic formulas such as "a genus of ..."). Synsets in WordNet 3.0,
usable definitions (5-60 words, text unique among all noun synsets), and taken per split
(train / validation / test / test_large), at most {PREFIX_CAP} per class with the same first three words:

| label | synsets | usable | taken |
|---|---|---|---|
{table}

## WordNet 3.0 license (`train.csv`, `validation.csv`, `test.csv`)

The definitions are WordNet glosses, copied verbatim (example sentences removed). WordNet
is distributed by Princeton University under a permissive license: use, copying,
modification and distribution for any purpose, without fee, provided the copyright notice,
the statements and the disclaimer below appear on all copies; Princeton's name may not be
used in advertising. The license, as it stands at the top of `data.noun`:

{wordnet_license(data_noun)}

Reference: George A. Miller (1995). WordNet: A Lexical Database for English.
Communications of the ACM 38(11): 39-41. Christiane Fellbaum (1998, ed.) WordNet: An
Electronic Lexical Database. Cambridge, MA: MIT Press.

## Python Software Foundation License (`heldout_docstrings.txt`, `tuning_docstring_paragraphs.txt`, `train_docstring_paragraphs.txt`, `reporting_reference.txt`)

The passages are excerpts of the docstrings of the CPython {python} standard library and of the
Python Language Reference as it ships with CPython {python} (`pydoc_data.topics`),
Copyright (c) 2001 Python Software Foundation; All Rights Reserved, used under the PSF
License Agreement for Python (version 2), which grants a "nonexclusive, royalty-free,
world-wide license to reproduce, analyze, test, perform and/or display publicly, prepare
derivative works, distribute, and otherwise use Python alone or in any derivative version,
provided, however, that PSF's License Agreement and PSF's notice of copyright ... are
retained in Python alone or in any derivative version prepared by Licensee". The full text
is in the `LICENSE` file of every Python distribution and at the end of the Python
documentation ("History and License").
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wordnet", type=Path, default=DEFAULT_WORDNET, help="folder holding data.noun")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    data_noun = args.wordnet / "data.noun"
    if not data_noun.is_file():
        raise SystemExit(f"{data_noun} not found: `apt-get update && apt-get install -y wordnet-base` first.")

    splits, counts = build_gloss_splits(read_noun_definitions(data_noun), args.seed)
    args.output.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        write_csv(args.output / f"{name}.csv", rows)
    glosses = {normalise(s) for rows in splits.values() for s, _ in rows}
    docstrings = build_docstrings(exclude=glosses)
    (args.output / "heldout_docstrings.txt").write_text("\n".join(docstrings) + "\n", encoding="utf-8")
    reference = build_reporting_text(exclude=glosses | {normalise(d) for d in docstrings})
    (args.output / "reporting_reference.txt").write_text("\n".join(reference) + "\n", encoding="utf-8")
    paragraphs = build_docstring_paragraphs(exclude={normalise(r) for r in reference})
    (args.output / "tuning_docstring_paragraphs.txt").write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    training, modules = build_training_paragraphs(glosses, docstrings, reference, paragraphs)
    (args.output / "train_docstring_paragraphs.txt").write_text("\n".join(training) + "\n", encoding="utf-8")
    (args.output / "LICENSE.md").write_text(license_note(data_noun, counts, args.seed, len(training)), encoding="utf-8")
    for label, c in sorted(counts.items()):
        print(f"{label:20s} synsets {c['synsets']:6d}  usable {c['candidates']:6d}")
    print(f"wrote {', '.join(f'{n} {len(r)}' for n, r in splits.items())}, "
          f"{len(docstrings)} docstring passages, {len(reference)} reference paragraphs, {len(paragraphs)} docstring "
          f"paragraphs, {len(training)} training paragraphs from {modules} modules to {args.output}")


if __name__ == "__main__":
    main()
