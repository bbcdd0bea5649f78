"""Replay a workload through the engine and the simulated runner, in virtual time.

Requests arrive at their trace times. Each executed step advances a virtual clock by the
cost model's estimate of the GPU step; a request's tokens are stamped with the end time of
the step that produced them. The scheduler's own decisions are real: only the model's
tokens and the step durations are simulated.

Cost model (defaults sized for an 8B-parameter model on one datacenter GPU; every term can
be overridden):

    step = fixed + prefill_token * prefill tokens + decode_request * decode requests
                 + kv_token * context tokens read by attention

A scheduled request counts as a decode request when its step is one sampled position plus
its draft slots; every other scheduled token counts as a prefill token.
"""

from __future__ import annotations

import json
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from llmsched._checks import Range
from llmsched._core import InvalidRequestError, Scheduler, SchedulerConfig, SchedulerOutput
from llmsched.engine import Engine
from llmsched.outputs import ModelRunnerOutput
from llmsched.runner import Int32Array, SimulatedModelRunner
from llmsched.status import RequestStatus
from llmsched.workload import RequestSpec, Workload, WorkloadError, fit_to_max_model_len

__all__ = [
    "ACCEPTANCE_RATE",
    "COST_TERM",
    "TIME_SCALE",
    "CostModel",
    "SimulationReport",
    "chart_paths",
    "check_workload",
    "simulate",
    "write_plots",
]

COST_TERM = Range(0)
"""Every cost-model term, in milliseconds."""
TIME_SCALE = Range(0, low_open=True)
"""Arrival times are multiplied by this."""
ACCEPTANCE_RATE = Range(0, 1)
"""The probability that the simulated runner accepts a draft token."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Virtual duration of one model step, in milliseconds per unit."""

    fixed_ms: float = 6.0
    prefill_token_ms: float = 0.06
    decode_request_ms: float = 0.08
    kv_token_ms: float = 0.00002

    def __post_init__(self) -> None:
        for f in fields(self):
            COST_TERM.check(f.name, getattr(self, f.name))

    def step_seconds(self, so: SchedulerOutput) -> float:
        n = so.num_scheduled_tokens.astype(np.int64)
        if len(n) == 0:
            return 0.0
        decode = (n - so.num_spec_tokens) == 1
        prefill_tokens = int(n[~decode].sum())
        context_tokens = int((so.num_computed_tokens + n).sum())
        ms = (
            self.fixed_ms
            + self.prefill_token_ms * prefill_tokens
            + self.decode_request_ms * int(decode.sum())
            + self.kv_token_ms * context_tokens
        )
        return ms / 1000.0


@dataclass
class _RequestTimes:
    arrival: float
    prompt_len: int
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    num_output: int = 0
    preemptions: int = 0
    status: str = "unfinished"


class _TimedRunner:
    """Wraps a runner: each executed step advances the virtual clock by its cost."""

    def __init__(self, runner: SimulatedModelRunner, cost: CostModel) -> None:
        self.runner = runner
        self.config = runner.config
        self.cost = cost
        self.clock = 0.0
        self.step_end: dict[int, float] = {}
        self.on_execute: Callable[[SchedulerOutput, float, float], None] | None = None

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        start = self.clock
        self.clock += self.cost.step_seconds(so)
        self.step_end[so.step_id] = self.clock
        if self.on_execute is not None:
            self.on_execute(so, start, self.clock)
        return self.runner.execute_model(so)

    def take_draft_token_ids(self) -> tuple[list[str], Int32Array, Int32Array] | None:
        return self.runner.take_draft_token_ids()


def _percentiles(values: list[float]) -> dict[str, float]:
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if finite.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    return {
        "mean": float(finite.mean()),
        "p50": float(np.percentile(finite, 50)),
        "p90": float(np.percentile(finite, 90)),
        "p99": float(np.percentile(finite, 99)),
    }


@dataclass
class SimulationReport:
    workload: str
    source: str
    config: dict[str, Any]
    cost_model: dict[str, float]
    num_requests: int
    num_finished: int
    truncated_requests: int
    finish_reasons: dict[str, int]
    virtual_seconds: float
    wall_seconds: float
    scheduler_seconds: float
    num_steps: int
    prompt_tokens: int
    output_tokens: int
    throughput: dict[str, float]
    latency_seconds: dict[str, dict[str, float]]
    num_preemptions: int
    prefix_cache: dict[str, float]
    spec_decode: dict[str, float]
    kv_usage: dict[str, float]
    timeline: dict[str, list[float]] = field(repr=False)
    latencies: dict[str, list[float]] = field(repr=False)
    partial: bool = False
    """The replay was interrupted: the figures cover what was replayed until then."""

    def to_json(self) -> str:
        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value

        return json.dumps(clean(asdict(self)), indent=1)

    def rows(self) -> list[tuple[str, str]]:
        """The report as (heading, figures) rows."""
        lat = self.latency_seconds
        finished = f"{self.num_finished:,} finished of {self.num_requests:,}"
        if self.partial:
            finished += " (partial: the replay was interrupted)"
        rows: list[tuple[str, str]] = [
            ("requests", finished),
            (
                "finish reasons",
                ", ".join(f"{k} {v:,}" for k, v in sorted(self.finish_reasons.items())),
            ),
            ("virtual time", f"{self.virtual_seconds:,.1f} s over {self.num_steps:,} steps"),
            (
                "throughput",
                f"{self.throughput['output_tokens_per_s']:,.0f} output tok/s, "
                f"{self.throughput['total_tokens_per_s']:,.0f} total tok/s, "
                f"{self.throughput['requests_per_s']:.2f} req/s",
            ),
        ]
        for name, label in (
            ("ttft", "TTFT"),
            ("tpot", "TPOT"),
            ("e2e", "end-to-end"),
            ("queue", "queue time"),
        ):
            stats = lat[name]
            unit, scale = ("ms", 1000.0) if name == "tpot" else ("s", 1.0)
            rows.append(
                (
                    f"{label} ({unit})",
                    "p50 {:.2f}  p90 {:.2f}  p99 {:.2f}  mean {:.2f}".format(
                        *(scale * stats[k] for k in ("p50", "p90", "p99", "mean"))
                    ),
                )
            )
        rows += [
            ("preemptions", f"{self.num_preemptions:,}"),
            (
                "prefix cache",
                f"hit rate {self.prefix_cache['hit_rate']:.1%} "
                f"({self.prefix_cache['hits']:,.0f} of {self.prefix_cache['queries']:,.0f} "
                "prompt tokens)",
            ),
            (
                "KV cache usage",
                f"mean {self.kv_usage['mean']:.1%}, peak {self.kv_usage['peak']:.1%}",
            ),
        ]
        if self.spec_decode["draft_tokens"]:
            rows.append(
                (
                    "spec decode",
                    f"acceptance {self.spec_decode['acceptance_rate']:.1%} of "
                    f"{self.spec_decode['draft_tokens']:,.0f} drafts",
                )
            )
        rows.append(
            (
                "scheduler CPU",
                f"{self.scheduler_seconds:.2f} s "
                f"({1e6 * self.scheduler_seconds / max(self.num_steps, 1):.1f} us/step), "
                f"wall {self.wall_seconds:.1f} s",
            )
        )
        return rows

    def table(self) -> str:
        """The report as plain text, one row a line."""
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


class _Progress:
    """A progress bar on stderr (rich's), updated at most ten times a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.last = 0.0
        self.bar: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            TextColumn("  replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests finished, virtual {task.fields[clock]:,.0f} s"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("replay", total=total, clock=0.0)
        self.bar.start()

    def update(self, done: int, clock: float) -> None:
        if self.bar is None:
            return
        now = time.monotonic()
        if now - self.last >= 0.1:
            self.last = now
            self.bar.update(self.task, completed=done, clock=clock)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class _Interrupt:
    """While active, a first SIGINT (Ctrl-C) sets ``requested`` instead of raising, so the
    replay can stop between two steps; a second one raises ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.requested = False

    @contextmanager
    def active(self, enabled: bool) -> Iterator[_Interrupt]:
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


def check_workload(config: SchedulerConfig, workload: Workload) -> Workload:
    """``workload`` fitted to ``config.max_model_len``, every request checked against the
    scheduler's own rules before a replay: ``WorkloadError`` names the first request (by
    its file and line) that ``add_request`` would refuse, e.g. one whose KV could outgrow
    the pool."""
    if not workload.requests:
        raise WorkloadError(f"workload {workload.name!r} has no requests")
    workload = fit_to_max_model_len(
        workload, config.max_model_len, config.num_sampled_tokens_per_step
    )
    probe = Scheduler(config)
    longest = max(spec.prompt_len for spec in workload.requests)
    prompt = np.ones(longest, dtype=np.int32)
    for spec in workload.requests:
        try:
            probe.add_request("probe", prompt[: spec.prompt_len], max_tokens=spec.output_len)
        except InvalidRequestError as e:
            raise WorkloadError(f"{spec.origin or spec.request_id}: {e}") from None
        probe.finish_requests("probe", RequestStatus.FINISHED_ABORTED)
    return workload


def simulate(
    config: SchedulerConfig,
    workload: Workload,
    *,
    cost: CostModel | None = None,
    seed: int = 0,
    acceptance_rate: float = 0.7,
    time_scale: float = 1.0,
    progress: bool = False,
    check_invariants: bool = False,
    interruptible: bool = False,
    on_start: Callable[[Workload], None] | None = None,
) -> SimulationReport:
    """Replay ``workload`` (arrivals stretched by ``time_scale``) and report what happened.

    The workload is checked first (``check_workload``); ``on_start`` is then called with
    the workload as replayed. With ``interruptible``, Ctrl-C (SIGINT, in the main thread)
    ends the replay after the current step and the report, of what was replayed so far,
    is marked ``partial``."""
    cost = cost or CostModel()
    time_scale = TIME_SCALE.check("time_scale", time_scale)
    acceptance_rate = ACCEPTANCE_RATE.check("acceptance_rate", acceptance_rate)
    workload = check_workload(config, workload)
    if on_start is not None:
        on_start(workload)
    specs = sorted(workload.requests, key=lambda r: r.arrival_time)
    runner = _TimedRunner(SimulatedModelRunner(config, seed, acceptance_rate=acceptance_rate), cost)
    engine = Engine(config, runner, check_invariants=check_invariants)
    scheduler = engine.scheduler
    times: dict[str, _RequestTimes] = {}
    timeline: dict[str, list[float]] = {"time": [], "kv_usage": [], "running": [], "waiting": []}

    def on_execute(so: SchedulerOutput, start: float, _end: float) -> None:
        for req_id in so.new_req_ids:
            times[req_id].scheduled = start
        for req_id in so.preempted_req_ids:
            times[req_id].preemptions += 1
        running, waiting = scheduler.get_request_counts()
        timeline["time"].append(start)
        timeline["kv_usage"].append(scheduler.get_kv_cache_usage())
        timeline["running"].append(running)
        timeline["waiting"].append(waiting)

    runner.on_execute = on_execute
    interrupt = _Interrupt()
    with interrupt.active(interruptible):
        bar = _Progress(len(specs), progress)
        try:
            started = time.perf_counter()
            _replay(specs, time_scale, runner, engine, times, bar, interrupt)
            wall = time.perf_counter() - started
        finally:
            bar.close()
    report = _report(config, workload, cost, engine, times, timeline, wall)
    report.partial = interrupt.requested
    report.num_requests = len(specs)
    if report.partial:
        report.finish_reasons["not arrived"] = len(specs) - len(times)
    return report


def _replay(
    specs: list[RequestSpec],
    time_scale: float,
    runner: _TimedRunner,
    engine: Engine,
    times: dict[str, _RequestTimes],
    bar: _Progress,
    interrupt: _Interrupt,
) -> None:
    scheduler = engine.scheduler
    next_arrival = 0
    num_finished = 0
    while next_arrival < len(specs) or scheduler.has_requests() or engine.num_steps_in_flight:
        if interrupt.requested:
            return
        while (
            next_arrival < len(specs)
            and specs[next_arrival].arrival_time * time_scale <= runner.clock
        ):
            spec = specs[next_arrival]
            arrival = spec.arrival_time * time_scale
            times[spec.request_id] = _RequestTimes(arrival, spec.prompt_len)
            engine.add_request(
                spec.request_id,
                spec.prompt_token_ids(runner.runner.vocab_size),
                max_tokens=spec.output_len,
                arrival_time=arrival,
            )
            next_arrival += 1
        if not scheduler.has_requests() and not engine.num_steps_in_flight:
            runner.clock = max(runner.clock, specs[next_arrival].arrival_time * time_scale)
            continue
        outputs = engine.step()
        if not outputs:
            continue
        step_id = engine.last_applied_step_id
        stamp = runner.step_end[step_id] if step_id is not None else runner.clock
        for output in outputs:
            record = times[output.request_id]
            if output.new_token_ids:
                if record.num_output == 0:
                    record.first_token = stamp
                record.num_output += len(output.new_token_ids)
            if output.finished:
                record.finished = stamp
                record.status = output.finish_reason or "finished"
                num_finished += 1
        bar.update(num_finished, runner.clock)


def _report(
    config: SchedulerConfig,
    workload: Workload,
    cost: CostModel,
    engine: Engine,
    times: dict[str, _RequestTimes],
    timeline: dict[str, list[float]],
    wall: float,
) -> SimulationReport:
    stats = engine.scheduler.stats()
    records = list(times.values())
    ttft = [r.first_token - r.arrival for r in records]
    e2e = [r.finished - r.arrival for r in records]
    queue = [r.scheduled - r.arrival for r in records]
    tpot = [(r.finished - r.first_token) / (r.num_output - 1) for r in records if r.num_output > 1]
    makespan = max((r.finished for r in records if math.isfinite(r.finished)), default=0.0)
    first = min((r.arrival for r in records), default=0.0)
    span = max(makespan - first, 1e-9)
    output_tokens = sum(r.num_output for r in records)
    prompt_tokens = sum(r.prompt_len for r in records)
    finished = [r for r in records if math.isfinite(r.finished)]
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r.status] = reasons.get(r.status, 0) + 1
    usage = np.asarray(timeline["kv_usage"] or [0.0])
    queries = stats["prefix_cache_queries"] + stats["prefix_cache_preempted_queries"]
    hits = stats["prefix_cache_hits"] + stats["prefix_cache_preempted_hits"]
    drafts, accepted = stats["num_draft_tokens"], stats["num_accepted_tokens"]
    return SimulationReport(
        workload=workload.name,
        source=workload.source,
        config=config.to_dict(),
        cost_model=asdict(cost),
        num_requests=len(records),
        num_finished=len(finished),
        truncated_requests=workload.truncated,
        finish_reasons=reasons,
        virtual_seconds=span,
        wall_seconds=wall,
        scheduler_seconds=engine.scheduler_seconds,
        num_steps=engine.num_steps,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        throughput={
            "output_tokens_per_s": output_tokens / span,
            "total_tokens_per_s": (output_tokens + prompt_tokens) / span,
            "requests_per_s": len(finished) / span,
        },
        latency_seconds={
            "ttft": _percentiles(ttft),
            "tpot": _percentiles(tpot),
            "e2e": _percentiles(e2e),
            "queue": _percentiles(queue),
        },
        num_preemptions=stats["num_preemptions"],
        prefix_cache={
            "queries": float(queries),
            "hits": float(hits),
            "hit_rate": hits / queries if queries else 0.0,
            "first_admission_hit_rate": (
                stats["prefix_cache_hits"] / stats["prefix_cache_queries"]
                if stats["prefix_cache_queries"]
                else 0.0
            ),
        },
        spec_decode={
            "draft_tokens": float(drafts),
            "accepted_tokens": float(accepted),
            "acceptance_rate": accepted / drafts if drafts else 0.0,
        },
        kv_usage={"mean": float(usage.mean()), "peak": float(usage.max())},
        timeline=timeline,
        latencies={"ttft": ttft, "tpot": tpot, "e2e": e2e, "queue": queue},
    )


PLOT_HINT = "pip install 'llmsched[plot]'"
"""How to install what ``write_plots`` needs (the README's words)."""


def chart_paths(directory: str | Path, workload: str) -> tuple[Path, Path]:
    """Where ``write_plots`` puts a workload's two charts: file names carry the workload's
    name, so that replays of several workloads into one folder keep every chart."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", workload).strip("._") or "workload"
    out = Path(directory)
    return out / f"{stem}_kv_and_queues.png", out / f"{stem}_latency_cdfs.png"


def write_plots(report: SimulationReport, directory: str | Path) -> list[Path]:
    """PNG charts: KV usage and queue length over time, latency CDFs (``chart_paths``).
    Needs matplotlib (``ImportError`` saying how to install it otherwise)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"the charts need matplotlib: {PLOT_HINT}") from e
    kv_path, cdf_path = chart_paths(directory, report.workload)
    kv_path.parent.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    t = np.asarray(report.timeline["time"])

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.plot(t, 100 * np.asarray(report.timeline["kv_usage"]), lw=0.8)
    ax1.set_ylabel("KV cache usage (%)")
    ax1.set_ylim(0, 105)
    ax2.plot(t, report.timeline["running"], lw=0.8, label="running")
    ax2.plot(t, report.timeline["waiting"], lw=0.8, label="waiting")
    ax2.set_ylabel("requests")
    ax2.set_xlabel("virtual time (s)")
    ax2.legend(loc="upper left")
    fig.suptitle(f"{report.workload}: KV usage and queues")
    fig.tight_layout()
    paths.append(kv_path)
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (name, label, scale) in zip(
        axes,
        (("ttft", "TTFT (s)", 1.0), ("tpot", "TPOT (ms)", 1000.0), ("e2e", "end-to-end (s)", 1.0)),
        strict=True,
    ):
        values = np.sort([scale * v for v in report.latencies[name] if math.isfinite(v)])
        if values.size:
            ax.plot(values, np.arange(1, values.size + 1) / values.size)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report.workload}: latency CDFs")
    fig.tight_layout()
    paths.append(cdf_path)
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
