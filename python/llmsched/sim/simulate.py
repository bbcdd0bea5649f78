"""Replay a workload through the engine and the simulated runner, in virtual time.

Requests arrive at their trace times. Each executed step advances a virtual clock by the
cost model's estimate of the GPU step (``llmsched.sim.cost``); a request's tokens are
stamped with the end time of the step that produced them. The scheduler's own decisions
are real: only the model's tokens and the step durations are simulated.

The replay runs in the core (``llmsched._core.Replay``): a simulated step costs a few
microseconds there, against a few hundred through the Python engine loop and runner
(``Engine``, ``SimulatedModelRunner``), which the tests replay beside it as its checker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import numpy.typing as npt

from llmsched._checks import Range
from llmsched._cli import StopOnInterrupt
from llmsched._core import InvalidRequestError, Replay, Scheduler, SchedulerConfig
from llmsched.sim.cost import CostModel, warm_up_token_counts
from llmsched.sim.report import RequestTimes, SimulationReport, build_report
from llmsched.sim.workload import (
    U64_MASK,
    RequestSpec,
    Workload,
    WorkloadError,
    fit_to_max_model_len,
)
from llmsched.status import RequestStatus

__all__ = ["ACCEPTANCE_RATE", "TIME_SCALE", "check_workload", "simulate"]

TIME_SCALE = Range(0, low_open=True)
"""Arrival times are multiplied by this."""
ACCEPTANCE_RATE = Range(0, 1)
"""The probability that the simulated runner accepts a draft token."""
VOCAB_SIZE = 32000
"""The simulated model's vocabulary (the workloads' prompts and the sampled tokens)."""
_SLICE_SECONDS = 0.1
"""The replay returns to Python this often: to draw the progress bar, and to see Ctrl-C."""


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


def check_workload(config: SchedulerConfig, workload: Workload) -> Workload:
    """``workload`` fitted to ``config.max_model_len``, every request checked against the
    scheduler's own rules before a replay: ``WorkloadError`` names the first request (by
    its file and line) that ``add_request`` would refuse, or whose KV would outgrow the
    pool (the scheduler would stop it short of its output, at ``config.max_request_len``:
    a replay would not show the trace's traffic)."""
    if not workload.requests:
        raise WorkloadError(f"workload {workload.name!r} has no requests")
    workload = fit_to_max_model_len(
        workload, config.max_model_len, config.num_sampled_tokens_per_step
    )
    probe = Scheduler(config)
    longest = max(spec.prompt_len for spec in workload.requests)
    prompt = np.ones(longest, dtype=np.int32)
    for spec in workload.requests:
        where = spec.origin or spec.request_id
        try:
            probe.add_request("probe", prompt[: spec.prompt_len], max_tokens=spec.output_len)
        except InvalidRequestError as e:
            raise WorkloadError(f"{where}: {e}") from None
        probe.finish_requests("probe", RequestStatus.FINISHED_ABORTED)
        if spec.prompt_len + spec.output_len > config.max_request_len:
            raise WorkloadError(
                f"{where}: max_tokens={spec.output_len} after a prompt of {spec.prompt_len} "
                f"tokens outgrows the KV pool: its {config.num_gpu_blocks - 1} usable blocks "
                f"hold a request of at most {config.max_request_len} tokens (raise "
                "num_gpu_blocks)"
            )
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
    ends the replay within a tenth of a second and the report, of what was replayed so
    far, is marked ``partial``. With ``check_invariants``, the scheduler's invariants are
    checked after every ``schedule`` and every update (slow: for tests)."""
    cost = cost or CostModel()
    time_scale = TIME_SCALE.check("time_scale", time_scale)
    acceptance_rate = ACCEPTANCE_RATE.check("acceptance_rate", acceptance_rate)
    workload = check_workload(config, workload)
    if on_start is not None:
        on_start(workload)
    specs = sorted(workload.requests, key=lambda r: r.arrival_time)
    arrivals = np.array([spec.arrival_time for spec in specs], dtype=np.float64) * time_scale
    replay = _replay_of(config, cost, specs, arrivals, seed, acceptance_rate, check_invariants)
    interrupt = StopOnInterrupt()
    with interrupt.active(interruptible):
        bar = _Progress(len(specs), progress)
        try:
            started = time.perf_counter()
            while not replay.run(_SLICE_SECONDS) and not interrupt.requested:
                bar.update(replay.num_finished, replay.clock)
            wall = time.perf_counter() - started
        finally:
            bar.close()
    arrived = specs[: replay.num_arrived]
    times = replay.times()
    reasons = times["finish_reason"]
    records = [
        RequestTimes(
            float(arrivals[i]),
            spec.prompt_len,
            scheduled=float(times["scheduled"][i]),
            first_token=float(times["first_token"][i]),
            finished=float(times["finished"][i]),
            num_output=int(times["num_output"][i]),
            preemptions=int(times["preemptions"][i]),
            status=reasons[i] or "unfinished",
        )
        for i, spec in enumerate(arrived)
    ]
    timeline = {name: column.tolist() for name, column in replay.timeline().items()}
    report = build_report(
        config,
        workload,
        cost,
        records,
        timeline,
        stats=replay.stats(),
        num_steps=replay.num_steps,
        scheduler_seconds=replay.scheduler_seconds,
        wall=wall,
    )
    report.partial = interrupt.requested and not replay.done
    report.num_requests = len(specs)
    if report.partial:
        report.finish_reasons["not arrived"] = len(specs) - len(arrived)
    return report


def _replay_of(
    config: SchedulerConfig,
    cost: CostModel,
    specs: list[RequestSpec],
    arrivals: npt.NDArray[np.float64],
    seed: int,
    acceptance_rate: float,
    check_invariants: bool,
) -> Replay:
    """The core's replay of ``specs`` (in arrival order, arriving at ``arrivals``), as
    columns."""
    blocks = [block for spec in specs for block in spec.prefix_blocks]
    warm = warm_up_token_counts(config.max_num_batched_tokens, config.max_model_len)
    return Replay(
        config,
        asdict(cost),
        [spec.request_id for spec in specs],
        arrivals,
        [spec.prompt_len for spec in specs],
        [spec.output_len for spec in specs],
        [spec.key & U64_MASK for spec in specs],
        [len(spec.prefix_blocks) for spec in specs],
        [block & U64_MASK for block in blocks],
        seed=seed & U64_MASK,
        vocab_size=VOCAB_SIZE,
        acceptance_rate=acceptance_rate,
        check_invariants=check_invariants,
        warm_up_tokens=len(warm),
    )
