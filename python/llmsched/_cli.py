"""What every ``llmsched`` command shares: one-line errors, checked number flags, output
paths checked before any work, and ``SchedulerConfig``'s fields as flags (their help is the
fields' own documentation)."""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import signal
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from llmsched._checks import Range
from llmsched._core import SchedulerConfig

__all__ = [
    "Formatter",
    "Parser",
    "StopOnInterrupt",
    "add_config_flags",
    "command_line",
    "config_from_flags",
    "default_of",
    "json_destination",
    "markdown_destination",
    "number",
    "one_line",
    "write_markdown_section",
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
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    why_other_defaults: str,
    omit: Collection[str] = (),
) -> None:
    """A flag per ``SchedulerConfig`` field (``--max-num-seqs N``, ``--[no-]async-scheduling``),
    helped by the field's documentation. ``defaults`` overrides the config's own defaults,
    and ``why_other_defaults`` says why; a derived field (None: derived) stays derived
    unless given. The fields in ``omit`` (those the command cannot exercise) get no flag
    and keep the config's default."""
    library = SchedulerConfig().to_dict()
    signature = inspect.signature(SchedulerConfig)
    group = parser.add_argument_group(
        "scheduler (SchedulerConfig fields)",
        "Defaults are SchedulerConfig's (vLLM's)"
        + (f", except {', '.join(defaults)}: {why_other_defaults}" if defaults else "")
        + ". Derived fields follow the budgets unless given.",
    )
    for name, resolved in library.items():
        if name in omit:
            continue
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
    values = {name: getattr(args, name, None) for name in SchedulerConfig().to_dict()}
    return SchedulerConfig(**{name: v for name, v in values.items() if v is not None})


def markdown_destination(path: str | None) -> Path | None:
    """Refuses, before any work, a page that could not be written (``--markdown``)."""
    out = json_destination(path, "--markdown")
    if out is not None and out.exists():
        try:
            out.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--markdown {path}: cannot read the page ({e})") from None
    return out


def command_line(prog: str, argv: Sequence[str], without: str = "--markdown") -> str:
    """``prog argv`` as typed, less the flag ``without`` and its value (where the output
    went is not part of what was measured)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == without:
            skip = True
        elif not arg.startswith(without + "="):
            kept.append(arg)
    return " ".join([prog, *kept])


def write_markdown_section(
    path: Path, key: str, command: str, lines: Sequence[str], images: Sequence[Path] = ()
) -> None:
    """Writes the section ``key`` of the page at ``path``, replacing the section of that key
    if the page has one, appending it otherwise: the command that measured it, when, what
    it printed, and the charts it drew (linked relative to the page). The rest of the page
    (its prose) is kept: a page so written holds only figures some command printed, each
    with the command that prints it again."""
    begin, end = f"<!-- section {key} -->", f"<!-- /section {key} -->"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join(
        [
            begin,
            f"`{command}` ({when}; Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, {platform.machine()}):",
            "",
            "```",
            *lines,
            "```",
            *(f"![{image.stem}]({os.path.relpath(image, path.parent)})" for image in images),
            end,
        ]
    )
    page = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in page and end in page:
        before, rest = page.split(begin, 1)
        page = before + section + rest.split(end, 1)[1]
    else:
        page = (page.rstrip("\n") + "\n\n" if page else "") + section + "\n"
    path.write_text(page, encoding="utf-8")


class StopOnInterrupt:
    """While active, a first SIGINT (Ctrl-C) sets ``requested`` instead of raising, so a
    replay can stop between two steps and report what it has; a second one raises
    ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def active(self, enabled: bool = True) -> Iterator[StopOnInterrupt]:
        """Catches the first SIGINT while the block runs (when ``enabled``, in the main
        thread, and SIGINT is not ignored); the previous handler is restored after."""
        if (
            not enabled
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # e.g. started with `&`
        ):
            yield self
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
