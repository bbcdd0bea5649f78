"""The checker of ``llmsched simulate``'s replay: the same replay written again in Python,
from the engine loop and the runner that assert what vLLM's assert (``llmsched.sim.Engine``,
``SimulatedModelRunner``), with the cost model's formula written out here from its
definition (``llmsched.sim.cost``). The core's replay (``llmsched._core.Replay``) must
agree with it on every request's times, the timeline and the step count."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from llmsched import SchedulerConfig, SchedulerOutput
from llmsched.outputs import ModelRunnerOutput
from llmsched.sim.cost import CostModel, warm_up_token_counts
from llmsched.sim.drafts import Drafts
from llmsched.sim.engine import Engine
from llmsched.sim.runner import SimulatedModelRunner
from llmsched.sim.workload import Workload
from llmsched.steps import StepShape


@dataclass
class Times:
    arrival: float
    scheduled: float = math.nan
    first_token: float = math.nan
    finished: float = math.nan
    num_output: int = 0
    preemptions: int = 0
    finish_reason: str | None = None


@dataclass
class ReferenceReplay:
    times: dict[str, Times] = field(default_factory=dict)
    timeline: dict[str, list[float]] = field(
        default_factory=lambda: {"time": [], "kv_usage": [], "running": [], "waiting": []}
    )
    num_steps: int = 0
    stats: dict[str, int] = field(default_factory=dict)


def step_shape(so: SchedulerOutput, kv_blocks: int) -> StepShape:
    """A step's shape, written out from its definition (``llmsched.steps``)."""
    n = so.num_scheduled_tokens.astype(np.int64)
    c = so.num_computed_tokens.astype(np.int64)
    decode = (n - so.num_spec_tokens) == 1
    n_p, c_p = n[~decode], c[~decode]
    return StepShape(
        prefill_requests=int((~decode).sum()),
        new_requests=len(so.new_req_ids) + len(so.resumed_req_ids),
        finished_requests=len(so.finished_req_ids),
        prefill_tokens=int(n_p.sum()),
        prefill_attention=int((n_p * c_p + n_p * (n_p + 1) // 2).sum()),
        decode_requests=int(decode.sum()),
        first_decodes=int((so.num_output_tokens[decode] == 1).sum()),
        decode_context=int((c[decode] + n[decode]).sum()),
        kv_blocks=kv_blocks,
    )


def step_ms(
    cost: CostModel, so: SchedulerOutput, kv_blocks: int, seen: set[tuple[int, int]]
) -> float:
    """A step's cost, written out from the cost model's definition."""
    shape = step_shape(so, kv_blocks)
    if shape.prefill_requests + shape.decode_requests == 0:
        return 0.0
    ms = cost.fixed_ms
    ms += cost.prefill_request_ms * shape.prefill_requests
    ms += cost.new_request_ms * shape.new_requests
    ms += cost.finished_request_ms * shape.finished_requests
    ms += cost.prefill_token_ms * shape.prefill_tokens
    ms += cost.prefill_attention_ms * shape.prefill_attention
    ms += cost.decode_request_ms * shape.decode_requests
    ms += cost.first_decode_ms * shape.first_decodes
    ms += cost.decode_context_ms * shape.decode_context
    ms += cost.kv_block_ms * shape.kv_blocks
    requests = shape.prefill_requests + shape.decode_requests
    tokens = shape.prefill_tokens + shape.decode_requests
    ms += cost.scheduler_step_ms + cost.scheduler_request_ms * requests
    ms += cost.scheduler_token_ms * tokens
    if (requests, tokens) not in seen:
        seen.add((requests, tokens))
        ms += cost.new_shape_ms
    return ms


class _TimedRunner:
    def __init__(self, runner: SimulatedModelRunner, cost: CostModel, config: SchedulerConfig):
        self.runner = runner
        self.config = runner.config
        self.cost = cost
        self.clock = 0.0
        self.step_end: dict[int, float] = {}
        self.engine: Engine | None = None
        self.record: ReferenceReplay | None = None
        warm = warm_up_token_counts(config.max_num_batched_tokens, config.max_model_len)
        self.seen = {(1, n) for n in warm}

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        assert self.engine is not None and self.record is not None
        scheduler = self.engine.scheduler
        start = self.clock
        for req_id in so.new_req_ids:
            self.record.times[req_id].scheduled = start
        for req_id in so.preempted_req_ids:
            self.record.times[req_id].preemptions += 1
        running, waiting = scheduler.get_request_counts()
        timeline = self.record.timeline
        timeline["time"].append(start)
        timeline["kv_usage"].append(scheduler.get_kv_cache_usage())
        timeline["running"].append(running)
        timeline["waiting"].append(waiting)
        self.clock += step_ms(self.cost, so, scheduler.num_used_blocks, self.seen) / 1000.0
        self.step_end[so.step_id] = self.clock
        return self.runner.execute_model(so)

    def take_draft_token_ids(self) -> Drafts | None:
        return self.runner.take_draft_token_ids()


def reference_replay(
    config: SchedulerConfig,
    workload: Workload,
    cost: CostModel,
    *,
    seed: int = 0,
    acceptance_rate: float = 0.7,
    time_scale: float = 1.0,
) -> ReferenceReplay:
    """``workload`` (already checked and fitted) replayed by the Python engine loop."""
    specs = sorted(workload.requests, key=lambda r: r.arrival_time)
    runner = _TimedRunner(
        SimulatedModelRunner(config, seed, acceptance_rate=acceptance_rate), cost, config
    )
    engine = Engine(config, runner, check_invariants=True)
    record = ReferenceReplay()
    runner.engine, runner.record = engine, record
    scheduler = engine.scheduler
    next_arrival = 0
    while next_arrival < len(specs) or scheduler.has_requests() or engine.num_steps_in_flight:
        taken_in = next_arrival
        while (
            next_arrival < len(specs)
            and specs[next_arrival].arrival_time * time_scale <= runner.clock
        ):
            if not scheduler.has_requests() and not engine.num_steps_in_flight:
                runner.clock += cost.wake_ms / 1000.0
            spec = specs[next_arrival]
            arrival = spec.arrival_time * time_scale
            record.times[spec.request_id] = Times(arrival)
            engine.add_request(
                spec.request_id,
                spec.prompt_token_ids(runner.runner.vocab_size),
                max_tokens=spec.output_len,
                arrival_time=arrival,
            )
            runner.clock += cost.add_request_ms / 1000.0
            next_arrival += 1
        if next_arrival > taken_in:  # once for all the requests taken in together
            runner.clock += cost.add_batch_ms / 1000.0
        if not scheduler.has_requests() and not engine.num_steps_in_flight:
            runner.clock = max(runner.clock, specs[next_arrival].arrival_time * time_scale)
            continue
        outputs = engine.step()
        if not outputs:
            continue
        step_id = engine.last_applied_step_id
        stamp = runner.step_end[step_id] if step_id is not None else runner.clock
        for output in outputs:
            times = record.times[output.request_id]
            if output.new_token_ids:
                if times.num_output == 0:
                    times.first_token = stamp
                times.num_output += len(output.new_token_ids)
            if output.finished:
                times.finished = stamp
                times.finish_reason = output.finish_reason
    record.num_steps = engine.num_steps
    record.stats = scheduler.stats()
    return record


def columns(record: ReferenceReplay) -> dict[str, np.ndarray]:
    """The reference's per-request times as the core's ``Replay.times()`` columns."""
    times = list(record.times.values())
    out = {f.name: np.array([getattr(t, f.name) for t in times]) for f in fields(Times)}
    return out
