"""The ``llmsched`` command line: ``llmsched simulate`` runs a workload through the engine."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from llmsched._core import SchedulerConfig
from llmsched.engine import Engine
from llmsched.runner import SimulatedModelRunner
from llmsched.workload import PRESETS, synthetic

__all__ = ["main"]


def _simulate(args: argparse.Namespace) -> int:
    config = SchedulerConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        num_speculative_tokens=args.num_speculative_tokens,
        async_scheduling=not args.sync,
    )
    specs = synthetic(
        args.preset,
        num_requests=args.num_requests,
        max_model_len=config.max_model_len,
        seed=args.seed,
    )
    runner = SimulatedModelRunner(config, seed=args.seed)
    engine = Engine(config, runner)
    for spec in specs:
        engine.add_request(
            spec.request_id,
            spec.prompt_token_ids,
            max_tokens=spec.max_tokens,
            arrival_time=spec.arrival_time,
        )
    peak_usage = 0.0
    peak_running = 0
    started = time.perf_counter()
    scheduler = engine.scheduler
    while scheduler.has_requests() or engine.num_steps_in_flight:
        engine.step()
        running, _ = scheduler.get_request_counts()
        peak_running = max(peak_running, running)
        peak_usage = max(peak_usage, scheduler.get_kv_cache_usage())
    wall = time.perf_counter() - started

    results = engine.results.values()
    finished = sum(r.finished for r in results)
    by_reason: dict[str, int] = {}
    for r in results:
        by_reason[r.finish_reason or "unfinished"] = (
            by_reason.get(r.finish_reason or "unfinished", 0) + 1
        )
    stats = scheduler.stats()
    steps = engine.num_steps
    prompt_tokens = sum(len(s.prompt_token_ids) for s in specs)
    output_tokens = sum(len(r.output_token_ids) for r in results)
    mode = "sync" if args.sync else "async"
    source = PRESETS[args.preset].source
    print(f"llmsched simulate: {len(specs)} requests, preset {args.preset} ({source})")
    print(
        f"  {mode} scheduling, K={config.num_speculative_tokens}, "
        f"max_model_len={config.max_model_len}, max_num_seqs={config.max_num_seqs}, "
        f"max_num_batched_tokens={config.max_num_batched_tokens}, "
        f"num_gpu_blocks={config.num_gpu_blocks} x {config.block_size} tokens"
    )
    rows = [
        (
            "requests finished",
            f"{finished:,} / {len(specs):,}  "
            + ", ".join(f"{k}: {v:,}" for k, v in sorted(by_reason.items())),
        ),
        ("engine steps", f"{steps:,}"),
        ("prompt tokens", f"{prompt_tokens:,}"),
        ("output tokens", f"{output_tokens:,}"),
        ("preemptions", f"{stats['num_preemptions']:,}"),
        ("peak running requests", f"{peak_running:,}"),
        ("peak KV cache usage", f"{peak_usage:.1%}"),
        ("wall time", f"{wall:.2f} s"),
        (
            "scheduler time",
            f"{engine.scheduler_seconds:.3f} s, "
            f"{1e6 * engine.scheduler_seconds / max(steps, 1):.1f} us/step",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return 0 if finished == len(specs) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmsched", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="replay a workload through the engine and report")
    sim.add_argument("--preset", choices=sorted(PRESETS), default="azure-conv")
    sim.add_argument("--num-requests", type=int, default=1000)
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--max-model-len", type=int, default=16384)
    sim.add_argument("--max-num-seqs", type=int, default=256)
    sim.add_argument("--max-num-batched-tokens", type=int, default=8192)
    sim.add_argument("--num-gpu-blocks", type=int, default=8192)
    sim.add_argument("--block-size", type=int, default=16)
    sim.add_argument("--num-speculative-tokens", type=int, default=0)
    sim.add_argument("--sync", action="store_true", help="sync scheduling (default: async)")
    sim.set_defaults(run=_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
