"""``hf-sliced-attn analyze``: the ReLA sparsity analysis (:mod:`hf_sliced_attn.mechanisms.rela.analysis`) from the shell.

    hf-sliced-attn analyze MODEL --text FILE [--output DIR] [--max-length N] [--batch-size B]

MODEL is a ReLA checkpoint (a path or a hub id, with its tokenizer); FILE holds one text per
line (blank lines are skipped). Prints the markdown table and writes ``analysis.json`` and
``heatmap.png`` (sparsity and null rate, layers × heads) into DIR.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hf_sliced_attn_cli import COMMANDS

JSON_NAME = "analysis.json"
HEATMAP_NAME = "heatmap.png"


def add_analyze_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``analyze`` subcommand to ``subparsers``; its handler is set as ``func``."""
    parser = subparsers.add_parser(
        "analyze",
        help=COMMANDS["analyze"],
        description=(
            "Run a ReLA model over text and report, per layer and head, the fraction of exactly-zero attention "
            "weights, the fraction of queries that attend to nothing, and head diversity."
        ),
    )
    parser.add_argument("model", help="path or hub id of a model converted to ReLA (with its tokenizer)")
    parser.add_argument("--text", required=True, type=Path, help="text file, one text per line")
    parser.add_argument("--output", type=Path, default=Path("rela-analysis"),
                        help=f"directory for {JSON_NAME} and {HEATMAP_NAME} (default: ./rela-analysis)")
    parser.add_argument("--max-length", type=int, default=512, help="truncate texts to N tokens (default: 512)")
    parser.add_argument("--batch-size", type=int, default=8, help="texts per forward pass (default: 8)")
    parser.set_defaults(func=run_analyze)
    return parser


def run_analyze(args: argparse.Namespace) -> int:
    """Run the analysis described by ``args``; returns the exit status.

    Raises a ValueError or FileNotFoundError (which ``hf-sliced-attn`` prints as an error) if the
    text file is missing or holds no text, or if the model cannot be found or is not ReLA, before
    its weights are loaded.
    """
    if not args.text.is_file():
        what = "is a folder" if args.text.is_dir() else "does not exist"
        raise FileNotFoundError(f"--text {args.text}: the file {what}; --text takes a text file, one text per line.")
    texts = [line.strip() for line in args.text.read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError(f"--text {args.text} has no text: --text takes a text file, one text per line.")
    from transformers import AutoModel, AutoTokenizer

    from .conversion.model_sources import load_model_config
    from .mechanisms.rela.analysis import analyze_rela, check_rela_config

    check_rela_config(load_model_config(args.model))
    model = AutoModel.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    result = analyze_rela(model, tokenizer, texts, batch_size=args.batch_size, max_length=args.max_length)
    print(result.to_markdown())
    json_path = result.to_json(args.output / JSON_NAME)
    heatmap_path = result.plot_heatmap(args.output / HEATMAP_NAME)
    print(f"Wrote {json_path} and {heatmap_path}")
    return 0
