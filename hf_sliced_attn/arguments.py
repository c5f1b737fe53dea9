"""Command-line flags generated from the mechanisms' option dataclasses.

``hf-sliced-attn convert`` and ``recipes/glue.py`` offer every option of every registered
mechanism (:data:`hf_sliced_attn.MECHANISMS`) as a flag, with the field's help text: a new
option, or a new mechanism, needs no new argparse code. Flags default to "not given"
(None), so that what the user did not say is left to the checkpoint's saved options or the
mechanism's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from .mechanisms import MECHANISMS


def _option_fields() -> dict[str, tuple[dataclasses.Field, type, list[str]]]:
    """Option name -> (its field, its type, the mechanisms that have it), in registry order."""
    options: dict[str, tuple[dataclasses.Field, type, list[str]]] = {}
    for mechanism in MECHANISMS.values():
        hints = typing.get_type_hints(mechanism.config_class)
        for option in dataclasses.fields(mechanism.config_class):
            if option.name in options:
                options[option.name][2].append(mechanism.name)
            else:
                options[option.name] = (option, hints[option.name], [mechanism.name])
    return options


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def flag_name(option: str, dashes: bool) -> str:
    """``--num-slices`` (dashes, the CLI's style) or ``--num_slices`` (the recipe's, as transformers' examples)."""
    return "--" + (option.replace("_", "-") if dashes else option)


def add_mechanism_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, dashes: bool) -> None:
    """Add one flag per option of the registered mechanisms (``--layers``, ``--num_slices``, ...)."""
    for name, (option, kind, owners) in _option_fields().items():
        every = len(owners) == len(MECHANISMS)
        prefix = "" if every else f"{', '.join(owners)}: "
        help_ = f"{prefix}{option.metadata.get('help', '')} (default: {option.default!r})"
        flags = {"dest": name, "default": None, "help": help_.replace("%", "%%")}
        if kind is bool:
            parser.add_argument(flag_name(name, dashes), action=argparse.BooleanOptionalAction, **flags)
            continue
        parse = option.metadata.get("parse", kind)
        parser.add_argument(flag_name(name, dashes), type=_argparse_type(parse),
                            choices=option.metadata.get("choices"), **flags)


def mechanism_options(args: argparse.Namespace, mechanism: str | None, *, dashes: bool) -> dict[str, Any]:
    """The options given on the command line for ``mechanism`` (None: a softmax run, which takes none).

    Raises ValueError for an option of another mechanism, naming the mechanisms it applies to.
    """
    given = {name: getattr(args, name) for name in _option_fields() if getattr(args, name, None) is not None}
    valid = set() if mechanism is None else {f.name for f in dataclasses.fields(MECHANISMS[mechanism].config_class)}
    foreign = {name: owners for name, (_, _, owners) in _option_fields().items() if name in given and name not in valid}
    if foreign:
        described = "; ".join(f"{flag_name(name, dashes)} applies to {', '.join(owners)} only"
                              for name, owners in foreign.items())
        raise ValueError(f"{described}, not to {mechanism or 'softmax attention'}.")
    return given
