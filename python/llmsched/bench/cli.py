"""llmsched bench [CASE...] times schedule() + update_from_output() in steady states, warm
and cold, and vLLM 0.33.0's own scheduler and the plug-in on the same workloads when vLLM
is importable (make vllm-env)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from llmsched._checks import COUNT
from llmsched._cli import (
    Formatter,
    Parser,
    command_line,
    default_of,
    json_destination,
    markdown_destination,
    number,
    write_markdown_section,
)
from llmsched.bench.step import CASES, COLD_MIB, run_benchmarks, vllm_available

__all__ = ["main", "parser"]


# Thread pools of the numeric libraries (numpy's OpenBLAS; torch's OpenMP, once vLLM is
# imported) spin on the second core after their first use; on a small machine that slowed
# llmsched's measured step by 1.6-1.8x. Both schedulers are single-threaded, so the
# benchmark runs with one thread per pool; the variables must be set before the libraries
# load, hence a fresh interpreter.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    bench = Parser(
        prog="llmsched bench", description=__doc__, formatter_class=Formatter, allow_abbrev=False
    )
    bench.add_argument("case", nargs="*", help="cases to run (default: all)", default=None)
    bench.add_argument(
        "--steps", type=number(COUNT), metavar="N", default=300, help="timed steps per case"
    )
    bench.add_argument(
        "--vllm",
        choices=("auto", "on", "off"),
        default="auto",
        help="compare with vLLM's scheduler (auto: when importable)",
    )
    bench.add_argument(
        "--cold-mib",
        type=number(COLD_MIB),
        metavar="N",
        default=default_of(run_benchmarks, "cold_mib"),
        help="also time each call cold, after writing every cache line of N MiB (0: warm only)",
    )
    bench.add_argument("--no-scaling", action="store_true", help="skip the scaling sweeps")
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    bench.add_argument(
        "--markdown",
        metavar="PAGE",
        help="also write the table as the section 'bench' of the markdown page PAGE "
        "(the page's other sections and prose are kept)",
    )
    return bench


def _in_single_threaded_interpreter(argv: list[str]) -> int | None:
    """Reruns ``llmsched bench`` in a child with the pools at one thread; ``None`` if this
    interpreter already is one (or the user set the variables)."""
    if all(var in os.environ for var in _THREAD_VARS):
        return None
    env = dict(os.environ)
    for var in _THREAD_VARS:
        env.setdefault(var, "1")
    # A Ctrl-C reaches the child too (one process group): it reports the interruption, once;
    # a Python handler (not SIG_IGN, which the child would inherit) keeps this one quiet.
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        return subprocess.call([sys.executable, "-m", "llmsched", "bench", *argv], env=env)
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv: list[str]) -> int:
    """Runs ``llmsched bench ARGV``; returns the exit status. Bad input raises, for the
    caller to report."""
    args = parser().parse_args(argv)
    code = _in_single_threaded_interpreter(argv)
    if code is not None:
        return code
    with_vllm = {"auto": None, "on": True, "off": False}[args.vllm]
    if with_vllm and not vllm_available():
        raise ValueError("--vllm on, but vllm is not importable (make vllm-env)")
    cases = args.case or list(CASES)
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    json_path = json_destination(args.json)
    page = markdown_destination(args.markdown)
    lines: list[str] = []

    def print_row(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    print_row(
        "llmsched bench: median per-step cost of schedule() + update_from_output() "
        f"over {args.steps} steps, warm and cold (after {args.cold_mib} MiB of other work), "
        "vLLM 0.33.0 alongside when importable"
    )
    results = run_benchmarks(
        cases,
        with_vllm=with_vllm,
        steps=args.steps,
        scaling=not args.no_scaling,
        cold_mib=args.cold_mib,
        print_row=print_row,
    )
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=1))
        print(f"results written to {json_path}")
    if page is not None:
        write_markdown_section(page, "bench", command_line("llmsched bench", argv), lines)
        print(f"section 'bench' written to {page}")
    return 0
