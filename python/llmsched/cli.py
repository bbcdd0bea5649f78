"""The ``llmsched`` command line.

``llmsched simulate [WORKLOAD]`` replays a workload (a preset name, an Azure ``.csv`` or a
Mooncake ``.jsonl`` trace) through the engine and the simulated runner in virtual time and
reports throughput, latencies, preemptions, prefix-cache hits and KV usage. Every
``SchedulerConfig`` field is a flag (``--max-num-seqs 128``, ``--no-async-scheduling``...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from llmsched._core import LlmschedError, SchedulerConfig
from llmsched.simulate import CostModel, simulate, write_plots
from llmsched.workload import PRESETS, load_workload

__all__ = ["main"]

# The simulator's defaults where they differ from SchedulerConfig's (vLLM's class defaults
# are sized for small GPUs): a long context, a large batch, and a pool of 16,384 blocks
# (262k tokens, an 8B model's KV in about 34 GB).
SIMULATE_DEFAULTS: dict[str, Any] = {
    "max_model_len": 16384,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "num_gpu_blocks": 16384,
}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scheduler (SchedulerConfig fields)")
    for name, default in SchedulerConfig().to_dict().items():
        default = SIMULATE_DEFAULTS.get(name, default)
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif name in ("max_num_scheduled_tokens", "max_num_active_seqs"):
            group.add_argument(flag, type=int, default=None, help="default: derived")
        elif isinstance(default, int):
            group.add_argument(flag, type=int, default=default, help=f"default: {default}")
        elif isinstance(default, float):
            group.add_argument(flag, type=float, default=default, help=f"default: {default}")
        else:
            group.add_argument(flag, default=default, help=f"default: {default}")


def _config(args: argparse.Namespace) -> SchedulerConfig:
    values = {name: getattr(args, name) for name in SchedulerConfig().to_dict()}
    for name in ("max_num_scheduled_tokens", "max_num_active_seqs"):
        if values[name] is None:
            del values[name]
    return SchedulerConfig(**values)


def _simulate(args: argparse.Namespace) -> int:
    config = _config(args)
    workload = load_workload(
        args.workload, limit=args.limit, num_requests=args.num_requests, seed=args.seed
    )
    cost = CostModel(**{f.name: getattr(args, f.name) for f in fields(CostModel)})
    num = len(workload.requests)
    print(f"llmsched simulate: {workload.name} ({workload.source}), {num:,} requests")
    print(
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
    )
    print(report.table())
    if report.truncated_requests:
        print(f"  ({report.truncated_requests:,} requests truncated to max_model_len)")
    if args.json:
        Path(args.json).write_text(report.to_json())
        print(f"  report written to {args.json}")
    if args.plot:
        for path in write_plots(report, args.plot):
            print(f"  chart written to {path}")
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
    import os
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
    from llmsched.bench import CASES, run_benchmarks, vllm_available

    with_vllm = {"auto": None, "on": True, "off": False}[args.vllm]
    if with_vllm and not vllm_available():
        print(
            "llmsched: error: --vllm on, but vllm is not importable (make vllm-env)",
            file=sys.stderr,
        )
        return 2
    cases = args.case or list(CASES)
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        print(
            f"llmsched: error: unknown case(s) {unknown}; cases: {', '.join(CASES)}",
            file=sys.stderr,
        )
        return 2
    print(
        "llmsched bench: median per-step cost of schedule() + update_from_output() "
        f"over {args.steps} steps (vLLM 0.33.0 alongside when importable)"
    )
    results = run_benchmarks(
        cases, with_vllm=with_vllm, steps=args.steps, scaling=not args.no_scaling
    )
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"results written to {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmsched", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser(
        "simulate",
        help="replay a workload through the engine in virtual time and report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument(
        "workload",
        nargs="?",
        default="azure-conv-chat",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a trace file; default: azure-conv-chat",
    )
    sim.add_argument("--limit", type=int, help="replay only the first N requests of a trace")
    sim.add_argument("--num-requests", type=int, default=1000, help="requests of a preset")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--time-scale", type=float, default=1.0, help="stretch arrival times")
    sim.add_argument("--acceptance-rate", type=float, default=0.7, help="of draft tokens")
    sim.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    sim.add_argument("--plot", metavar="DIR", help="write PNG charts (needs matplotlib)")
    sim.add_argument("--no-progress", action="store_true")
    cost = sim.add_argument_group("cost model (milliseconds)")
    for f in fields(CostModel):
        cost.add_argument(
            "--" + f.name.replace("_", "-"),
            type=float,
            default=f.default,
            help=f"default: {f.default}",
        )
    _add_config_flags(sim)
    sim.set_defaults(run=_simulate)

    bench = commands.add_parser(
        "bench",
        help="per-step scheduler cost, against vLLM 0.33.0's scheduler when importable",
    )
    bench.add_argument("case", nargs="*", help="cases to run (default: all)")
    bench.add_argument("--steps", type=int, default=300, help="timed steps per case")
    bench.add_argument("--vllm", choices=("auto", "on", "off"), default="auto")
    bench.add_argument("--no-scaling", action="store_true", help="skip the scaling sweeps")
    bench.add_argument("--json", metavar="PATH", help="write the results as JSON")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        code: int = args.run(args)
    except (LlmschedError, ValueError, OSError) as e:
        print(f"llmsched: error: {e}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
