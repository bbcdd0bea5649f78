"""Replay a workload through the engine and the simulated runner, in virtual time.

Requests arrive at their trace times. Each executed step advances a virtual clock by the
cost model's estimate of the GPU step (``llmsched.sim.cost``); a request's tokens are
stamped with the end time of the step that produced them. The scheduler's own decisions
are real: only the model's tokens and the step durations are simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from llmsched._checks import Range
from llmsched._cli import StopOnInterrupt
from llmsched._core import InvalidRequestError, Scheduler, SchedulerConfig, SchedulerOutput
from llmsched.outputs import ModelRunnerOutput
from llmsched.sim.cost import CostModel, ShapesRun
from llmsched.sim.drafts import Drafts
from llmsched.sim.engine import Engine
from llmsched.sim.report import RequestTimes, SimulationReport, build_report
from llmsched.sim.runner import SimulatedModelRunner
from llmsched.sim.workload import RequestSpec, Workload, WorkloadError, fit_to_max_model_len
from llmsched.status import RequestStatus

__all__ = ["ACCEPTANCE_RATE", "TIME_SCALE", "check_workload", "simulate"]

TIME_SCALE = Range(0, low_open=True)
"""Arrival times are multiplied by this."""
ACCEPTANCE_RATE = Range(0, 1)
"""The probability that the simulated runner accepts a draft token."""


class _TimedRunner:
    """Wraps a runner: each executed step advances the virtual clock by its cost."""

    def __init__(
        self, runner: SimulatedModelRunner, cost: CostModel, config: SchedulerConfig
    ) -> None:
        self.runner = runner
        self.config = runner.config
        self.cost = cost
        self.clock = 0.0
        self.step_end: dict[int, float] = {}
        self.on_execute: Callable[[SchedulerOutput, float, float], None] | None = None
        self.scheduler: Scheduler | None = None
        """The engine's scheduler: its KV blocks in use are part of a step's cost."""
        self.shapes_run = ShapesRun(config.max_num_batched_tokens, config.max_model_len)
        """The batch shapes the engine has run: a step of a new one costs more."""

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        assert self.scheduler is not None, "the engine's scheduler is set before a step"
        start = self.clock
        self.clock += self.cost.step_seconds(so, self.scheduler.num_used_blocks, self.shapes_run)
        self.step_end[so.step_id] = self.clock
        if self.on_execute is not None:
            self.on_execute(so, start, self.clock)
        return self.runner.execute_model(so)

    def take_draft_token_ids(self) -> Drafts | None:
        return self.runner.take_draft_token_ids()


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
    runner = _TimedRunner(
        SimulatedModelRunner(config, seed, acceptance_rate=acceptance_rate), cost, config
    )
    engine = Engine(config, runner, check_invariants=check_invariants)
    scheduler = engine.scheduler
    times: dict[str, RequestTimes] = {}
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
    runner.scheduler = scheduler
    interrupt = StopOnInterrupt()
    with interrupt.active(interruptible):
        bar = _Progress(len(specs), progress)
        try:
            started = time.perf_counter()
            _replay(specs, time_scale, runner, engine, times, bar, interrupt)
            wall = time.perf_counter() - started
        finally:
            bar.close()
    report = build_report(config, workload, cost, engine, times, timeline, wall)
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
    times: dict[str, RequestTimes],
    bar: _Progress,
    interrupt: StopOnInterrupt,
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
            if not scheduler.has_requests() and not engine.num_steps_in_flight:
                # An idle engine wakes up for the arrival: its next step starts cold.
                runner.clock += runner.cost.wake_ms / 1000.0
            spec = specs[next_arrival]
            arrival = spec.arrival_time * time_scale
            times[spec.request_id] = RequestTimes(arrival, spec.prompt_len)
            engine.add_request(
                spec.request_id,
                spec.prompt_token_ids(runner.runner.vocab_size),
                max_tokens=spec.output_len,
                arrival_time=arrival,
            )
            # The engine's own work to take the request in delays the next step.
            runner.clock += runner.cost.add_request_ms / 1000.0
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
