"""Command-line flags generated from dataclasses: the mechanisms' options and the transfer settings.

``hf-sliced-attn convert`` and ``recipes/glue.py`` offer every option of every registered
mechanism (:data:`hf_sliced_attn.MECHANISMS`) and every field of
:class:`~hf_sliced_attn.conversion.settings.TransferConfig` as a flag, with the field's help
text: a new option, setting or mechanism needs no new argparse code. Flags default to "not
given" (None), so that what the user did not say is left to the checkpoint's saved options or
the mechanism's measured defaults, which ``--help`` shows per mechanism.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Callable
from typing import Any

from .conversion.settings import Purpose, TransferConfig, mechanism_transfer_defaults
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


def _shown_default(name: str, owners: list[str], purpose: Purpose | None) -> str:
    """The default of option ``name`` for the mechanisms ``owners``: its config's, or with a ``purpose`` the one
    transfers for it use (``Mechanism.conversion_options`` over it); one value when they agree, else one per
    mechanism."""
    values = {}
    for owner in owners:
        mechanism = MECHANISMS[owner]
        value = mechanism.config_class.__dataclass_fields__[name].default
        values[owner] = mechanism.conversion_options(purpose).get(name, value) if purpose else value
    if len(set(map(repr, values.values()))) == 1:
        return repr(next(iter(values.values())))
    return ", ".join(f"{owner} {value!r}" for owner, value in values.items())


def add_mechanism_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, dashes: bool,
                            purpose: Purpose | None = None) -> None:
    """Add one flag per option of the registered mechanisms (``--layers``, ``--num_slices``, ...). Each help ends
    with the option's default per mechanism: its config's, or with a ``purpose`` the one its transfers use."""
    for name, (option, kind, owners) in _option_fields().items():
        every = len(owners) == len(MECHANISMS)
        prefix = "" if every else f"{', '.join(owners)}: "
        help_ = f"{prefix}{option.metadata.get('help', '')} (default: {_shown_default(name, owners, purpose)})"
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


def _transfer_dest(name: str, prefix: str) -> str:
    """The argparse destination of the flag of transfer setting ``name`` (fields marked ``unprefixed`` keep theirs)."""
    return name if TransferConfig.__dataclass_fields__[name].metadata.get("unprefixed", False) else prefix + name


def add_transfer_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, dashes: bool,
                           purpose: Purpose, prefix: str = "", exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per :class:`TransferConfig` field but ``exclude``: ``--lora-r``, or the recipe's
    ``--attention_transfer_lora_r`` with ``prefix="attention_transfer_"`` (fields marked ``unprefixed``,
    ``--keep_softmax_layers``, keep their name). Each flag's help ends with every mechanism's default for
    ``purpose``."""
    hints = typing.get_type_hints(TransferConfig)
    for setting in dataclasses.fields(TransferConfig):
        if setting.name in exclude:
            continue
        values = {name: mechanism_transfer_defaults(name, purpose)[setting.name] for name in MECHANISMS}
        defaults = ", ".join(f"{name} {value}" for name, value in values.items())
        shown = f" (default: {defaults})" if any(value is not None for value in values.values()) else ""
        kind = next(t for t in typing.get_args(hints[setting.name]) or (hints[setting.name],) if t is not type(None))
        dest = _transfer_dest(setting.name, prefix)
        parser.add_argument(flag_name(dest, dashes), dest=dest, type=kind, default=None,
                            choices=setting.metadata.get("choices"),
                            help=(setting.metadata["help"] + shown).replace("%", "%%"))


def transfer_settings(args: argparse.Namespace, *, prefix: str = "", exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The transfer settings given on the command line by :func:`add_transfer_arguments`' flags (those left
    out are not in the result)."""
    given = {f.name: getattr(args, _transfer_dest(f.name, prefix), None) for f in dataclasses.fields(TransferConfig)
             if f.name not in exclude}
    return {name: value for name, value in given.items() if value is not None}


def in_flag_terms(message: str, *, dashes: bool, prefix: str = "", switches: tuple[str, ...] = ()) -> str:
    """``message`` (an error of :mod:`hf_sliced_attn.conversion.settings`, or of a Python API with on/off
    keyword arguments ``switches``) with each transfer setting named by its flag (``steps`` ->
    ``--attention_transfer_steps``) and each ``switch=True`` by its flag (``overwrite=True`` -> ``--overwrite``),
    so that the user reads the words they typed. The API's errors stay in the API's terms; this is the one
    translation."""
    for switch in switches:
        message = re.sub(rf"(?<![\w-]){switch}=True\b", flag_name(switch, dashes), message)
    names = sorted((f.name for f in dataclasses.fields(TransferConfig)), key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(" + "|".join(names) + r")\b")
    return pattern.sub(lambda m: flag_name(_transfer_dest(m.group(1), prefix), dashes), message)
