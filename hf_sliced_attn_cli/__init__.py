"""The ``hf-sliced-attn`` console script, kept outside the ``hf_sliced_attn`` package so that it starts at once.

``import hf_sliced_attn`` registers the attentions with transformers, which imports torch and
transformers: seconds before anything is printed. This launcher imports neither: ``hf-sliced-attn
--help`` and a mistyped command are answered from :data:`COMMANDS` alone, and a command (``convert``,
``push``, ``analyze``, or its own ``--help``) is handed to :func:`hf_sliced_attn.cli.main`, which imports
what that command needs. :data:`COMMANDS` is the one list of the commands and their summaries.

One check runs here first: ``convert --model ID`` of a Hub model that is not cached while the Hub cannot be
used (offline, or no answer) fails in a fraction of a second with the conversion's own one-line error
(:func:`hub_access.uncached_hub_model`), not after seconds of imports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

PROG = "hf-sliced-attn"
DESCRIPTION = "Sliced ReLU attention and ReLA for Hugging Face transformers encoders."
COMMANDS = {
    "convert": "Convert a softmax encoder to sliced_relu or rela by attention transfer.",
    "push": "Check a converted folder and upload it to the Hugging Face Hub.",
    "analyze": "Measure a ReLA model's attention sparsity, null-attention rate and head diversity.",
}
"""Command name -> its one-line summary, as ``hf-sliced-attn --help`` lists them."""
EPILOG = f"Run `{PROG} COMMAND --help` for the options of a command."
EXIT_ERROR = 1
"""The exit status of a command that failed with its one-line error."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: the commands and their summaries, none of their options."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hf-sliced-attn`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints the help, or the usage error, and exits
    if argv[0] == "convert":
        model = _flag_value(argv[1:], "--model")
        if model is not None:
            from .hub_access import uncached_hub_model

            problem = uncached_hub_model(model)
            if problem is not None:
                print(f"{PROG} convert: error: {problem}", file=sys.stderr)
                return EXIT_ERROR
    from hf_sliced_attn.cli import main as run_command

    return run_command(argv)


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value given to ``flag`` in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``), else None; the command's
    own parser judges everything else, ``--help`` included."""
    if "-h" in argv or "--help" in argv:
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(flag)
    known, _ = parser.parse_known_args(argv)
    return getattr(known, flag.lstrip("-").replace("-", "_"))
