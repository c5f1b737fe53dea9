"""The hf-sliced-attn command line: a thin dispatcher over subcommands.

    hf-sliced-attn convert --model PATH_OR_ID --attn sliced_relu --text FILE... --output DIR
    hf-sliced-attn push DIR --repo-id USER/NAME [--dry-run]
    hf-sliced-attn analyze MODEL --text FILE

Each subcommand is an ``add_<name>_parser(subparsers)`` that sets its handler as ``func``
(``func(args) -> exit status``). Run it under ``accelerate launch`` for several processes.

The console script is :mod:`hf_sliced_attn_cli`, which answers ``--help`` without importing this
package; here too a command imports what it needs (torch, transformers, peft, datasets) only when it
is built or run, and the parser builds in full only the command that was asked for.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from hf_sliced_attn_cli import COMMANDS, DESCRIPTION, EPILOG, EXIT_ERROR, PROG

EXIT_INTERRUPTED = 130


CONVERT_SWITCHES = ("overwrite", "resume", "adapter_only")
"""The fields of :class:`~hf_sliced_attn.convert.ConvertOptions` that are on/off flags: the conversion's
errors name them as the Python API takes them (``overwrite=True``), the command line as ``--overwrite``."""


def add_convert_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``convert``: attention transfer from a softmax checkpoint (see :mod:`hf_sliced_attn.convert`)."""
    from .arguments import add_mechanism_arguments, add_transfer_arguments
    from .convert import ConvertOptions
    from .mechanisms import MECHANISMS

    d = ConvertOptions.__dataclass_fields__
    parser = subparsers.add_parser("convert", help=COMMANDS["convert"], description=COMMANDS["convert"])
    parser.add_argument("--model", required=True, help="path or Hub id of the softmax checkpoint")
    parser.add_argument("--attn", required=True, choices=list(MECHANISMS), help="the new attention")
    add_mechanism_arguments(parser.add_argument_group(
        "mechanism options", "Saved in config.json. Each default shown is the one conversions use: the mechanism's "
                             "measured best for converting a softmax checkpoint, over its config's own default."
    ), dashes=True, purpose="convert")
    add_transfer_arguments(parser.add_argument_group(
        "attention transfer", "Defaults: each mechanism's measured best for conversions."), dashes=True, purpose="convert")
    parser.add_argument("--text", nargs="+", required=True,
                        help="training text: text files (one passage per line), saved datasets or dataset names")
    parser.add_argument("--heldout-text", nargs="+",
                        help="held-out text for the fidelity report (default: split a part off --text)")
    parser.add_argument("--text-column", default=d["text_column"].default, help="dataset text column (default: text)")
    parser.add_argument("--text-split", default=d["text_split"].default, help="dataset split (default: train)")
    parser.add_argument("--heldout-fraction", type=float, default=d["heldout_fraction"].default,
                        help="fraction split off --text when no --heldout-text is given (default: %(default)s)")
    parser.add_argument("--max-length", type=int, default=d["max_length"].default,
                        help="tokens per passage (default: %(default)s)")
    parser.add_argument("--pack-tokens", type=int, default=d["pack_tokens"].default,
                        help="join consecutive training passages into rows of up to this many tokens (at most "
                             "--max-length), so the transfer trains on long inputs; 0: one passage a row "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d["seed"].default, help="random seed (default: %(default)s)")
    parser.add_argument("--output", required=True, help="output folder")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted conversion in --output")
    parser.add_argument("--adapter-only", action="store_true", help="save a peft adapter instead of merged weights")
    parser.add_argument("--base-model-id", help="the Hub id to name in the model card when --model is a local folder")
    parser.set_defaults(func=run_convert)
    return parser


def run_convert(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from .arguments import in_flag_terms, mechanism_options, transfer_settings
    from .convert import ConvertOptions, convert

    try:
        options = ConvertOptions(
            model=args.model, mechanism=args.attn, output_dir=args.output, text=args.text,
            heldout_text=args.heldout_text, mechanism_options=mechanism_options(args, args.attn, dashes=True),
            transfer=transfer_settings(args), text_column=args.text_column, text_split=args.text_split,
            heldout_fraction=args.heldout_fraction, max_length=args.max_length, pack_tokens=args.pack_tokens,
            seed=args.seed,
            adapter_only=args.adapter_only, overwrite=args.overwrite, resume=args.resume,
            base_model_id=args.base_model_id,
        )
        result = convert(options)
    except (ValueError, OSError) as error:  # said in the Python API's terms: name the flags instead
        message = in_flag_terms(str(error), dashes=True, switches=CONVERT_SWITCHES)
        if message == str(error):
            raise
        raise type(error)(message) from None
    if not PartialState().is_main_process:  # under `accelerate launch`, one process reports
        return 0
    for note in result.notes:
        print(f"Note: {note}.")
    report = result.report
    errors = report["attention_relative_error"]
    print(f"Wrote {result.output_dir} ({report['wall_time_s']:.0f} s): attention error "
          f"{errors['mean_before']:.3f} -> {errors['mean_after']:.3f}, embedding cosine "
          f"{report['embedding_cosine']['after']:.4f}, pairwise Spearman {report['pairwise_spearman']['after']:.4f}")
    return 0


def add_push_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``push``: check a converted folder and upload it to the Hub (see :func:`hf_sliced_attn.hub.push`)."""
    parser = subparsers.add_parser("push", help=COMMANDS["push"], description=COMMANDS["push"])
    parser.add_argument("folder", help="the folder written by `convert` (or a fine-tune with a model card)")
    parser.add_argument("--repo-id", required=True, help="USER/NAME of the model repository")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="branch to upload to (created if needed)")
    parser.add_argument("--dry-run", action="store_true", help="check and print the files and card, upload nothing")
    parser.add_argument("--token", help="Hugging Face token (default: the saved login or HF_TOKEN)")
    parser.set_defaults(func=run_push)
    return parser


class CommandError(Exception):
    """A command that cannot go on; :func:`main` prints the message as one line (exit status 1)."""


def run_push(args: argparse.Namespace) -> int:
    from .hub import PushError, push

    try:
        push(args.folder, args.repo_id, private=args.private, revision=args.revision, dry_run=args.dry_run,
             token=args.token)
    except PushError as error:
        raise CommandError(str(error)) from None
    return 0


def _add_analyze_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from .analyze_cli import add_analyze_parser

    return add_analyze_parser(subparsers)


PARSERS = {"convert": add_convert_parser, "push": add_push_parser, "analyze": _add_analyze_parser}
"""Each command of :data:`hf_sliced_attn_cli.COMMANDS` -> the function that adds its parser."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (``command`` None), or of ``command`` only: the others are listed with
    their summaries but not built (building a command's parser imports what its options need; "" builds none)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if command in (None, name):
            PARSERS[name](subparsers)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv and argv[0] in PARSERS else "").parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("hf_sliced_attn").setLevel(logging.INFO)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, FileExistsError, FileNotFoundError, CommandError) as error:
        print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
