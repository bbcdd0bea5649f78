"""What every ``llmsched`` command shares: one-line errors, checked number flags, output
paths checked before any work, and ``SchedulerConfig``'s fields as flags (their help is the
fields' own documentation)."""

from __future__ import annotations

import argparse
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from llmsched._checks import Range
from llmsched._core import SchedulerConfig

__all__ = [
    "Formatter",
    "Parser",
    "add_config_flags",
    "config_from_flags",
    "default_of",
    "json_destination",
    "number",
    "one_line",
]


class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default; an option without one says so, or what its absence means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None and action.option_strings:
            help = action.help or ""
            return help if "default" in help else help + " (default: none)"
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line: ``PROG: error: MESSAGE (see PROG --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def number(bound: Range) -> Callable[[str], float]:
    """An argparse ``type``: the flag's text as a number in ``bound``."""

    def parse(text: str) -> float:
        try:
            return bound.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "int" if bound.integer else "float"
    return parse


def default_of(function: Callable[..., Any], name: str) -> Any:
    """The default of ``function``'s argument ``name``: the library's is the CLI's."""
    return inspect.signature(function).parameters[name].default


def one_line(error: BaseException) -> str:
    """An error as one line: its message with white space folded, or its class's name."""
    return " ".join(str(error).split()) or type(error).__name__


def json_destination(path: str | None, flag: str = "--json") -> Path | None:
    """Refuses, before any work, a JSON destination that could not be written."""
    if path is None:
        return None
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {path}: a folder; give a file name")
    folder = out.parent
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")
    return out


def field_summary(name: str) -> str:
    """The first sentence of the documentation of ``SchedulerConfig.<name>``."""
    doc = inspect.getdoc(getattr(SchedulerConfig, name)) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = paragraph.split(". ", 1)[0].rstrip(".")
    return sentence.replace("``", "")


def add_config_flags(
    parser: argparse.ArgumentParser, defaults: Mapping[str, Any], why_other_defaults: str
) -> None:
    """A flag per ``SchedulerConfig`` field (``--max-num-seqs N``, ``--[no-]async-scheduling``),
    helped by the field's documentation. ``defaults`` overrides the config's own defaults,
    and ``why_other_defaults`` says why; a derived field (None: derived) stays derived
    unless given."""
    library = SchedulerConfig().to_dict()
    signature = inspect.signature(SchedulerConfig)
    group = parser.add_argument_group(
        "scheduler (SchedulerConfig fields)",
        "Defaults are SchedulerConfig's (vLLM's)"
        + (f", except {', '.join(defaults)}: {why_other_defaults}" if defaults else "")
        + ". Derived fields follow the budgets unless given.",
    )
    for name, resolved in library.items():
        flag = "--" + name.replace("_", "-")
        help = field_summary(name)
        default = signature.parameters[name].default
        if name in defaults:
            help += f"; SchedulerConfig's default: {resolved:,}"
            default = defaults[name]
        if default is None:
            group.add_argument(
                flag, type=int, metavar="N", default=None, help=help + " (default: derived)"
            )
        elif isinstance(default, bool):
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=help
            )
        elif isinstance(default, int):
            group.add_argument(flag, type=int, metavar="N", default=default, help=help)
        elif isinstance(default, float):
            group.add_argument(flag, type=float, metavar="X", default=default, help=help)
        else:
            group.add_argument(flag, default=default, help=help)


def config_from_flags(args: argparse.Namespace) -> SchedulerConfig:
    """The validated ``SchedulerConfig`` of the flags :func:`add_config_flags` added."""
    values = {name: getattr(args, name) for name in SchedulerConfig().to_dict()}
    return SchedulerConfig(**{name: v for name, v in values.items() if v is not None})
