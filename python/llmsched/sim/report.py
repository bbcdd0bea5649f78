"""What a replay reports: per-request times, their percentiles, throughput, KV use."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llmsched._core import SchedulerConfig
from llmsched.sim.cost import CostModel
from llmsched.sim.workload import Workload

__all__ = ["RequestMetrics", "RequestTimes", "SimulationReport", "build_report", "request_metrics"]


@dataclass
class RequestTimes:
    """When one request arrived, was first scheduled, got its first token, finished."""

    arrival: float
    prompt_len: int
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    num_output: int = 0
    preemptions: int = 0
    status: str = "unfinished"


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
    clock: str = "virtual"
    """Whose clock the times are on: ``"virtual"`` (a simulation's) or ``"engine"`` (a real
    engine's, ``llmsched replay-engine``)."""
    measured: list[dict[str, Any]] | None = None
    """With ``simulate --measured``: the engine's figures beside these, with the error of
    each (``llmsched.sim.compare.comparison``)."""

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
            (f"{self.clock} time", f"{self.virtual_seconds:,.1f} s over {self.num_steps:,} steps"),
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
        for row in self.measured or ():
            error = "-" if row["error"] is None else f"{row['error']:+.1%}"
            rows.append(
                (
                    f"measured {row['metric']}",
                    f"{row['measured']:.4g} (predicted {row['predicted']:.4g}, error {error})",
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
        wall = f"wall {self.wall_seconds:.3g} s"
        if self.clock == "virtual" and self.wall_seconds > 0:
            wall += f" ({self.virtual_seconds / self.wall_seconds:,.0f}x real time)"
        rows.append(
            (
                "scheduler CPU",
                f"{self.scheduler_seconds:.2f} s "
                f"({1e6 * self.scheduler_seconds / max(self.num_steps, 1):.1f} us/step), {wall}",
            )
        )
        return rows

    def table(self) -> str:
        """The report as plain text, one row a line."""
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


@dataclass
class RequestMetrics:
    """What the requests' times show, however they were obtained (a simulation, an engine):
    the figures a report gives per request and over the replay."""

    num_finished: int
    finish_reasons: dict[str, int]
    span: float
    """From the first arrival to the last finish (seconds)."""
    prompt_tokens: int
    output_tokens: int
    throughput: dict[str, float]
    latency_seconds: dict[str, dict[str, float]]
    latencies: dict[str, list[float]]


def request_metrics(records: list[RequestTimes]) -> RequestMetrics:
    """TTFT, TPOT, end-to-end and queue times (their percentiles), throughput over the span
    from the first arrival to the last finish, and finish reasons."""
    ttft = [r.first_token - r.arrival for r in records]
    e2e = [r.finished - r.arrival for r in records]
    queue = [r.scheduled - r.arrival for r in records]
    tpot = [(r.finished - r.first_token) / (r.num_output - 1) for r in records if r.num_output > 1]
    makespan = max((r.finished for r in records if math.isfinite(r.finished)), default=0.0)
    first = min((r.arrival for r in records), default=0.0)
    span = max(makespan - first, 1e-9)
    output_tokens = sum(r.num_output for r in records)
    prompt_tokens = sum(r.prompt_len for r in records)
    num_finished = sum(1 for r in records if math.isfinite(r.finished))
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r.status] = reasons.get(r.status, 0) + 1
    return RequestMetrics(
        num_finished=num_finished,
        finish_reasons=reasons,
        span=span,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        throughput={
            "output_tokens_per_s": output_tokens / span,
            "total_tokens_per_s": (output_tokens + prompt_tokens) / span,
            "requests_per_s": num_finished / span,
        },
        latency_seconds={
            "ttft": _percentiles(ttft),
            "tpot": _percentiles(tpot),
            "e2e": _percentiles(e2e),
            "queue": _percentiles(queue),
        },
        latencies={"ttft": ttft, "tpot": tpot, "e2e": e2e, "queue": queue},
    )


def build_report(
    config: SchedulerConfig,
    workload: Workload,
    cost: CostModel,
    records: list[RequestTimes],
    timeline: dict[str, list[float]],
    *,
    stats: dict[str, int],
    num_steps: int,
    scheduler_seconds: float,
    wall: float,
) -> SimulationReport:
    """The report of a replay: its requests' times (those that arrived), the scheduler's
    state at each step (``timeline``) and counters (``stats``, ``Scheduler.stats()``'s)."""
    metrics = request_metrics(records)
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
        num_finished=metrics.num_finished,
        truncated_requests=workload.truncated,
        finish_reasons=metrics.finish_reasons,
        virtual_seconds=metrics.span,
        wall_seconds=wall,
        scheduler_seconds=scheduler_seconds,
        num_steps=num_steps,
        prompt_tokens=metrics.prompt_tokens,
        output_tokens=metrics.output_tokens,
        throughput=metrics.throughput,
        latency_seconds=metrics.latency_seconds,
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
        latencies=metrics.latencies,
    )
