"""Stateful fuzzing: random configs, random requests, aborts, steps and drafts, checked every step.

A hypothesis ``RuleBasedStateMachine`` drives a ``Scheduler`` and a ``SimulatedModelRunner``
built from one random ``SchedulerConfig`` (every knob: ``max_model_len`` down to a few blocks,
``K`` in 0..4, lookahead and draft slots, tight and loose token budgets, ``max_num_seqs``
1..64, few and many KV blocks, chunked prefill on and off, the long-prefill threshold, sync and
async, fcfs and priority, prefix caching, watermark). Rules add requests (prompts up to the
``M - 1`` boundary, shared prefixes, arrivals with computed tokens, random stop conditions,
priorities, arrival-time ties and cache salts, numpy prompts), abort live and unknown ids,
schedule and execute steps (up to three in flight under async scheduling, applied in order),
apply outputs, hand drafts back (sync spec decode), inject arbitrary drafts and reset the
prefix cache.

After every call: ``check_invariants()`` (spec Appendix A over the whole state),
``check_scheduler_output`` on every step, the runner's own assertions (vLLM's), and a Python
model of every request (tokens delivered, stop conditions, statuses, new / resumed /
finished ids). Teardown drains everything and checks that every request finished exactly
once with a correct status, at most ``max_tokens`` outputs and ``M`` tokens (``max_model_len``,
or the longest request a small pool holds), and that every KV block is free again.

Liveness (the ``drain`` rule and teardown). With no new arrivals and a KV pool that can hold
any one request (each stops at the longest the pool holds, ``M``), draining ``R``
live requests with at most ``D`` steps in flight takes at most ``liveness_bound`` steps::

    sum_i (ceil(Np_i / tau) + O_i)  +  R * (2D + 3)  +  2D + 3

    Np_i   prompt length of request i
    O_i    min(max_tokens_i, M - Np_i): its most output tokens (0 when s = 0, pooling)
    tau    min(max_num_scheduled_tokens, max_num_batched_tokens - draft_slots,
               long_prefill_token_threshold if set): the chunk a request gets when it is
               scheduled first in a step

Proof sketch (FCFS). Call the oldest running request the head. Every step starts with a
positive token budget and ``input_budget > draft_slots``, and the running loop serves the
head first, so it gets ``min(tokens left, tau)`` prefill tokens or one decode step, which
yields at least one output token (accepted drafts plus the bonus token). The head is never
preempted: the FCFS victim is the newest running request, and a request alone fits the pool
(cached blocks are evictable). Preemption keeps output tokens, so when a request becomes the
head it has ``Np + o`` tokens to recompute, ``ceil((Np + o) / tau) <= ceil(Np / tau) + o``
steps, then ``O - o`` decode steps: ``ceil(Np / tau) + O`` in all, plus up to ``D`` steps whose
outputs are still in flight (the async "already done" skip and ``n <= 0`` at ``M``). A step
with no running request admits the waiting head (an empty pool fits it; the watermark only
applies when something runs), after at most ``D`` steps of stale output from a preemption.
So each request accounts for at most ``ceil(Np / tau) + O + 2D + 3`` steps.

Under priority the best running request is not a victim while others run (ties aside), but
requests ahead of it in running order may use the budget first, so the argument does not
carry over. For both policies the drain also respects a bound that counts its preemptions
``P``::

    sum_i (Np_i + 2 O_i)  +  P * (M + D)  +  R * (2D + 3)  +  2D + 3

Every step schedules at least one request, except while the running ones all wait for
output in flight (``D`` steps per request) or the waiting head waits for the stale output
of its preemption (``D`` steps per preemption); a request alone fits the pool, so a step
cannot preempt every running request. A scheduled prefill chunk computes at least one
token: at most ``Np + O`` of them per request, plus at most ``M`` recomputed after each
preemption. A scheduled decode step yields at least one output token, never lost (stale
output is delivered). Under priority the test also asserts ``(R + 1)`` times the FCFS
bound, as a livelock detector (not proved).
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, assume, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from llmsched import (
    ConfigError,
    Engine,
    InvalidRequestError,
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SimulatedModelRunner,
    UnknownRequestError,
)
from llmsched.sim.checks import check_scheduler_output

SLOW = os.environ.get("HYPOTHESIS_PROFILE", "fast") == "slow"
VOCAB = 24  # small, so that EOS and stop tokens are sampled often
FINISHED_STATUSES = [s for s in RequestStatus if s.is_finished]
ARRIVAL_TIMES = [1.0, 2.0, 3.0]  # a few fixed values: ties in (priority, arrival_time)
TOTALS: Counter[str] = Counter()  # examples, steps, requests and drains run in this process


# ------------------------------------------------------------------------------ configs


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    """A random valid ``SchedulerConfig`` over every knob."""
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    if draw(st.integers(0, 7)) == 0:
        max_model_len = draw(st.integers(64, 300))
    else:
        max_model_len = max(2, block_size * draw(st.integers(1, 10)) + draw(st.integers(0, 3)))
    sampled = 0 if draw(st.integers(0, 15)) == 0 else 1  # 0: a pooling runner
    k = draw(st.integers(0, 4)) if sampled else 0
    lookahead = draw(st.integers(0, k + 1)) if k else 0
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 4, 8, 64]))
    chunked = draw(st.booleans())
    floor = max(max_num_seqs, max_model_len) if not chunked else max_num_seqs
    if draw(st.booleans()):  # tight
        batched = draw(st.integers(floor, floor + 2 * block_size + 4))
    else:
        batched = draw(st.integers(max(floor, max_model_len), 4 * max(floor, max_model_len)))
    draft_slots = draw(st.integers(0, min(k, batched - 1))) if k and draw(st.booleans()) else 0
    scheduled = draw(st.none() | st.integers(1, batched))
    active = draw(st.none() | st.integers(1, max_num_seqs))
    one_request = math.ceil(max_model_len / block_size)
    if draw(st.booleans()):  # few blocks: one long request, or a few short ones
        num_gpu_blocks = draw(st.integers(max(2, one_request // 2), 2 * one_request + 1))
    else:
        num_gpu_blocks = draw(st.integers(one_request + 1, 16 * one_request + 1))
    threshold = draw(st.sampled_from([0, 0, 1, 2]) | st.integers(1, max_model_len))
    kwargs: dict[str, Any] = {
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": batched,
        "max_num_scheduled_tokens": scheduled,
        "max_num_active_seqs": active,
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": threshold,
        "long_prefill_token_threshold_adaptive": draw(st.booleans()),
        "num_speculative_tokens": k,
        "num_lookahead_tokens": lookahead,
        "max_num_new_slots_for_drafting": draft_slots,
        "num_sampled_tokens_per_step": sampled,
        "async_scheduling": draw(st.booleans()),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.3])),
        "scheduler_reserve_full_isl": draw(st.integers(0, 4)) > 0,
        "enable_prefix_caching": draw(st.booleans()),
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
    }
    try:
        return SchedulerConfig(**kwargs)
    except ConfigError:  # pragma: no cover - the draws above are meant to be valid
        assume(False)
        raise


# ------------------------------------------------------------------------------ the model


@dataclass
class Req:
    """What the test knows of one request (one life of an id)."""

    rid: str
    prompt: list[int]
    max_tokens: int
    eos: int | None
    stop: tuple[int, ...]
    outputs: list[int] = field(default_factory=list)
    state: str = "waiting"  # waiting (never scheduled) | running | preempted
    status: RequestStatus | None = None  # the finished status, once finished
    finish_count: int = 0
    dropped: bool = False  # preempted by reset_prefix_cache with output in flight
    aborted: bool = False  # finished by finish_requests


def expected_stop(req: Req, max_model_len: int) -> tuple[RequestStatus, int | None] | None:
    """vLLM's ``check_stop`` on the last output token (spec 4.3), in its order."""
    last = req.outputs[-1]
    if req.eos is not None and last == req.eos:
        return RequestStatus.FINISHED_STOPPED, None
    if last in req.stop:
        return RequestStatus.FINISHED_STOPPED, last
    if len(req.prompt) + len(req.outputs) >= max_model_len or len(req.outputs) >= req.max_tokens:
        return RequestStatus.FINISHED_LENGTH_CAPPED, None
    return None


def chunk_size(config: SchedulerConfig) -> int:
    """``tau``: the fewest prefill tokens the first running request gets in a step."""
    tau = min(
        config.max_num_scheduled_tokens,
        config.max_num_batched_tokens - config.max_num_new_slots_for_drafting,
    )
    if config.long_prefill_token_threshold > 0:
        tau = min(tau, config.long_prefill_token_threshold)
    return tau


def liveness_bound(reqs: list[Req], config: SchedulerConfig, in_flight: int) -> int:
    """The drain's step bound under FCFS, stated in the module docstring."""
    tau, m = chunk_size(config), longest_request(config)
    work = sum(
        -(-len(r.prompt) // tau)
        + (min(r.max_tokens, m - len(r.prompt)) if config.num_sampled_tokens_per_step else 0)
        for r in reqs
    )
    return work + len(reqs) * (2 * in_flight + 3) + 2 * in_flight + 3


def work_bound(reqs: list[Req], config: SchedulerConfig, in_flight: int, preemptions: int) -> int:
    """The drain's step bound under any policy, given its preemptions (module docstring)."""
    m = longest_request(config)
    outputs = sum(
        min(r.max_tokens, m - len(r.prompt)) if config.num_sampled_tokens_per_step else 0
        for r in reqs
    )
    prompts = sum(len(r.prompt) for r in reqs)
    return (
        prompts
        + 2 * outputs
        + preemptions * (m + in_flight)
        + len(reqs) * (2 * in_flight + 3)
        + 2 * in_flight
        + 3
    )


def longest_request(config: SchedulerConfig) -> int:
    """``M``: ``max_model_len``, or, when the pool's usable blocks hold fewer slots ``T``, the
    longest request whose every step (``C + n + s <= M``, ``C + n + L`` slots) fits them:
    ``T - L + s``. A request stops there, length-capped."""
    slots = (config.num_gpu_blocks - 1) * config.block_size
    if slots >= config.max_model_len:
        return config.max_model_len
    return slots - config.num_lookahead_tokens + config.num_sampled_tokens_per_step


# ------------------------------------------------------------------------------ the machine


class SchedulerMachine(RuleBasedStateMachine):
    """Drives one scheduler and one simulated runner; checks everything after every call."""

    def __init__(self) -> None:
        super().__init__()
        self.reqs: dict[str, Req] = {}  # live requests by id
        self.done: list[Req] = []  # every finished life
        self.finished_since_schedule: list[str] = []
        # Each step in flight: its output, the runner's, the request lives it scheduled, and
        # the ids whose output in flight a reset dropped.
        self.in_flight: deque[
            tuple[SchedulerOutput, ModelRunnerOutput, dict[str, Req], set[str]]
        ] = deque()
        self.counter = 0
        self.prompts: list[list[int]] = []
        self.steps = 0
        self.drains = 0
        self.events: Counter[str] = Counter()

    # -------------------------------------------------------------- setup

    @initialize(
        config=configs(),
        seed=st.integers(0, 2**32 - 1),
        depth=st.integers(1, 3),
        acceptance=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
        runner_eos=st.sampled_from([None, 0, 1]),
        eos_probability=st.sampled_from([0.0, 0.05, 0.3]),
        accept_padded=st.booleans(),
        drafts_back=st.sampled_from([1.0, 1.0, 0.5]),
        free=st.booleans(),
        drop_rate=st.sampled_from([0.0, 0.1, 0.3]),
    )
    def setup(
        self,
        config: SchedulerConfig,
        seed: int,
        depth: int,
        acceptance: float,
        runner_eos: int | None,
        eos_probability: float,
        accept_padded: bool,
        drafts_back: float,
        free: bool,
        drop_rate: float,
    ) -> None:
        note(f"config: {config!r}")
        self.config = config
        self.m = longest_request(config)
        self.s = config.num_sampled_tokens_per_step
        self.k = config.num_speculative_tokens
        self.is_async = config.async_scheduling
        self.depth = depth if self.is_async else 1
        self.sched = Scheduler(config)
        self.runner = SimulatedModelRunner(
            config,
            seed=seed,
            vocab_size=VOCAB,
            acceptance_rate=acceptance,
            eos_token_id=runner_eos,
            eos_probability=eos_probability if runner_eos is not None else 0.0,
            accept_padded_drafts=accept_padded,
        )
        self.rng = np.random.default_rng(seed)
        self.drafts_back = drafts_back
        # A "free" runner returns any legal output instead of the simulated runner's: any
        # number of accepted drafts, random tokens, and (outside drains) sometimes no token
        # at all for a step that should sample (the scheduler undoes that step).
        self.free = free
        self.drop_rate = drop_rate
        self.draining = False

    # -------------------------------------------------------------- helpers

    def live(self) -> list[str]:
        return list(self.reqs)

    def snapshot_unchanged(self, before: str) -> None:
        assert self.sched.debug_snapshot() == before

    def schedule_and_execute(self) -> SchedulerOutput:
        so = self.sched.schedule()
        self.steps += 1
        check_scheduler_output(self.config, so)
        self.sched.check_invariants()
        self.check_step(so)
        runner_out = self.free_output(so) if self.free else self.runner.execute_model(so)
        lives = {rid: self.reqs[rid] for rid in so.req_ids}
        self.in_flight.append((so, runner_out, lives, set()))
        return so

    def free_output(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Any legal output for ``so``: nothing for a non-final chunk, else 0 (a dropped
        sample, outside drains) to ``s * (1 + drafts)`` random tokens."""
        counts: list[int] = []
        tokens: list[int] = []
        for i, rid in enumerate(so.req_ids):
            if self.sched.get_request(rid).is_prefill_chunk:
                counts.append(0)
                continue
            most = self.s * (1 + int(so.num_spec_tokens[i]))
            least = 0 if not self.draining and self.rng.random() < self.drop_rate else 1
            k = int(self.rng.integers(min(least, most), most + 1))
            counts.append(k)
            tokens += self.rng.integers(0, VOCAB, k).tolist()
            if k == 0 and most:
                self.events["dropped_samples"] += 1
        return ModelRunnerOutput(
            list(so.req_ids), np.array(tokens, dtype=np.int32), np.array(counts, dtype=np.int32)
        )

    def check_step(self, so: SchedulerOutput) -> None:
        """The step against the model: finished, preempted, new and resumed ids."""
        assert Counter(so.finished_req_ids) == Counter(self.finished_since_schedule), (
            so.finished_req_ids,
            self.finished_since_schedule,
        )
        self.finished_since_schedule = []
        for rid in so.preempted_req_ids:
            req = self.reqs.get(rid)
            if req is not None and req.state == "running":
                req.state = "preempted"
        for rid in so.req_ids:
            assert rid in self.reqs, f"{rid!r} is scheduled but not live"
        new, resumed = set(so.new_req_ids), set(so.resumed_req_ids)
        offsets = np.concatenate([[0], np.cumsum(so.num_all_token_ids, dtype=np.int64)])
        for i, rid in enumerate(so.req_ids):
            req = self.reqs[rid]
            if rid in new:
                assert req.state == "waiting", (rid, req.state)
            elif rid in resumed:
                assert req.state == "preempted", (rid, req.state)
            else:
                assert req.state == "running", (rid, req.state)
            if rid in new or rid in resumed:
                tokens = so.all_token_ids[offsets[i] : offsets[i + 1]].tolist()
                assert tokens == req.prompt + req.outputs, rid
                self.events["resumed" if rid in resumed else "admitted"] += 1
                if len(req.prompt) + len(req.outputs) == self.m - self.s:
                    self.events["admitted_at_boundary"] += 1
            req.state = "running"
        self.events["padded"] += sum(
            1
            for i, rid in enumerate(so.req_ids)
            if (rid in new or rid in resumed) and so.num_spec_tokens[i] > 0
        )

    def apply_oldest(self) -> Sequence[RequestOutput]:
        so, runner_out, lives, dropped = self.in_flight.popleft()
        outs = self.sched.update_from_output(so, runner_out)
        self.sched.check_invariants()
        self.check_outputs(runner_out, lives, dropped, outs)
        for rid, req in lives.items():
            if self.reqs.get(rid) is req:  # still live: the scheduler holds what was delivered
                got = self.sched.get_request(rid)
                assert got.output_token_ids == req.outputs, rid
                assert got.prompt_token_ids == req.prompt, rid
        if not self.is_async and self.k > 0:
            drafts = self.runner.take_draft_token_ids()
            if drafts is not None and drafts[0] and self.rng.random() < self.drafts_back:
                self.sched.update_draft_token_ids(*drafts)
                self.sched.check_invariants()
        return outs

    def check_outputs(
        self,
        runner_out: ModelRunnerOutput,
        lives: dict[str, Req],
        dropped: set[str],
        outs: Sequence[RequestOutput],
    ) -> None:
        """Every delivered token is the runner's, stops are vLLM's, nothing is lost."""
        offsets = np.concatenate([[0], np.cumsum(runner_out.num_sampled, dtype=np.int64)])
        sampled = {
            rid: runner_out.sampled_token_ids[offsets[i] : offsets[i + 1]].tolist()
            for i, rid in enumerate(runner_out.req_ids)
        }
        seen: set[str] = set()
        for out in outs:
            rid = out.request_id
            assert rid not in seen, f"two outputs for {rid!r} in one step"
            seen.add(rid)
            assert rid in sampled, f"output for {rid!r}, which the step did not schedule"
            req = self.reqs.get(rid)
            assert req is not None and req is lives[rid], f"output for {rid!r}, not live"
            tokens = out.new_token_ids
            assert tokens == sampled[rid][: len(tokens)], (rid, tokens, sampled[rid])
            stop: tuple[RequestStatus, int | None] | None = None
            for j, token in enumerate(tokens):
                req.outputs.append(token)
                stop = expected_stop(req, self.m)
                if j < len(tokens) - 1:
                    assert stop is None, f"{rid!r} should have stopped at output token {token}"
            if req.state == "preempted":
                self.events["stale_deliveries"] += 1
            if out.finished:
                self.events[f"finished_{out.status.name}"] += 1
                if not tokens:
                    assert self.s == 0, f"{rid!r} finished with no token"
                    stop = (RequestStatus.FINISHED_STOPPED, None)
                assert stop is not None, f"{rid!r} finished without a stop condition"
                assert (out.status, out.stop_reason) == stop, (rid, out.status, out.stop_reason)
                assert out.finish_reason == stop[0].finish_reason
                self.finish(rid, out.status)
            else:
                assert stop is None, f"{rid!r} should have stopped ({stop})"
                assert tokens == sampled[rid], (rid, tokens, sampled[rid])
                assert out.status in (RequestStatus.RUNNING, RequestStatus.PREEMPTED)
        # Lossless: a live request the runner sampled for gets its tokens (unless a reset
        # dropped the output in flight).
        for rid, tokens in sampled.items():
            req = lives[rid]
            if tokens and rid not in seen and req is self.reqs.get(rid) and rid not in dropped:
                assert req.dropped, f"{rid!r}: sampled {tokens} but nothing was delivered"

    def finish(self, rid: str, status: RequestStatus) -> None:
        req = self.reqs.pop(rid)
        req.status = status
        req.finish_count += 1
        self.done.append(req)
        self.finished_since_schedule.append(rid)

    def check_finished_request(self, req: Req) -> None:
        assert req.finish_count == 1, (req.rid, req.finish_count)
        assert req.status is not None and req.status.is_finished
        assert len(req.outputs) <= req.max_tokens, (req.rid, len(req.outputs))
        assert len(req.prompt) + len(req.outputs) <= self.m, req.rid
        if not req.aborted:
            assert req.status in (
                RequestStatus.FINISHED_STOPPED,
                RequestStatus.FINISHED_LENGTH_CAPPED,
            ), (req.rid, req.status)
        if req.aborted or req.status is not RequestStatus.FINISHED_STOPPED or self.s == 0:
            return
        assert req.outputs and req.outputs[-1] in (req.eos, *req.stop), req.rid

    # -------------------------------------------------------------- rules: requests

    @rule(data=st.data(), count=st.integers(1, 3))
    def add_requests(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            self.add_one(data)

    def add_one(self, data: st.DataObject) -> None:
        """Add one random request; check a refusal is justified and changes nothing."""
        m, block_size = self.m, self.config.block_size
        kind = data.draw(st.sampled_from(["random", "boundary", "shared", "short", "reuse"]))
        # Up to max_model_len's prompt limit: past what a small pool holds, too.
        top = self.config.max_model_len - self.s
        rid = f"r{self.counter}"
        if kind == "boundary":
            length = max(1, min(top, m - self.s))  # ends right at the boundary: N = M - s
        elif kind == "short":
            length = data.draw(st.integers(1, min(3, top)))
        else:
            length = data.draw(st.integers(1, top))
        prompt = [int(t) for t in self.rng.integers(0, VOCAB, length)]
        if kind == "shared" and self.prompts:
            base = data.draw(st.sampled_from(self.prompts))
            cut = data.draw(
                st.sampled_from(sorted({len(base), (len(base) // block_size) * block_size}))
            )
            prompt = (base[:cut] + prompt)[: max(1, min(top, cut + data.draw(st.integers(0, 5))))]
        if kind == "reuse" and self.done:
            rid = data.draw(st.sampled_from([r.rid for r in self.done[-8:]]))
            if rid in self.reqs:
                rid = f"r{self.counter}"
        self.counter += 1
        max_tokens = data.draw(st.integers(1, 6) | st.integers(1, self.config.max_model_len + 2))
        computed = 0
        if len(prompt) > 1 and data.draw(st.integers(0, 5)) == 0:
            computed = data.draw(st.integers(1, len(prompt) - 1))
        eos = data.draw(st.none() | st.integers(0, VOCAB - 1))
        stop = tuple(data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=3)))
        kwargs: dict[str, Any] = {
            "max_tokens": max_tokens,
            "min_tokens": data.draw(st.integers(0, max_tokens + 2)),
            "eos_token_id": eos,
            "stop_token_ids": list(stop),
            "num_computed_tokens": computed,
            "priority": data.draw(st.integers(-2, 2)),
            "arrival_time": data.draw(st.none() | st.sampled_from(ARRIVAL_TIMES)),
            "cache_salt": data.draw(st.sampled_from([None, None, "a", "b", ""])),
        }
        as_array = data.draw(st.sampled_from([None, np.int32, np.int64, np.uint16]))
        prompt_arg: Any = prompt if as_array is None else np.asarray(prompt, dtype=as_array)
        before = self.sched.debug_snapshot()
        if len(prompt) > m - self.s:
            with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
                self.sched.add_request(rid, prompt_arg, **kwargs)
            self.snapshot_unchanged(before)
            self.events["refused"] += 1
            return
        if kwargs["min_tokens"] > max_tokens:
            with pytest.raises(InvalidRequestError, match="min_tokens"):
                self.sched.add_request(rid, prompt_arg, **kwargs)
            self.snapshot_unchanged(before)
            self.events["refused"] += 1
            return
        self.sched.add_request(rid, prompt_arg, **kwargs)
        self.reqs[rid] = Req(rid, prompt, max_tokens, eos, stop)
        self.prompts.append(prompt)
        got = self.sched.get_request(rid)
        assert got.prompt_token_ids == prompt and got.num_computed_tokens == computed
        assert got.status is RequestStatus.WAITING

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        pool = [*self.live(), "never-added", *(r.rid for r in self.done[-3:])]
        ids = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        status = data.draw(st.sampled_from(FINISHED_STATUSES))
        form = data.draw(st.sampled_from(["list", "tuple", "one", "all"]))
        if form == "one" and ids:
            arg: Any = ids[0]
            ids = ids[:1]
        elif form == "all" and data.draw(st.integers(0, 5)) == 0:
            arg, ids = None, self.live()
        else:
            arg = tuple(ids) if form == "tuple" else ids
        expected = [rid for rid in dict.fromkeys(ids) if rid in self.reqs]
        got = self.sched.finish_requests(arg, status)
        if arg is None:
            assert sorted(got) == sorted(expected)
        else:
            assert got == expected
        for rid in got:
            self.reqs[rid].aborted = True
            self.finish(rid, status)
        self.sched.check_invariants()
        for rid in got:
            with pytest.raises(UnknownRequestError):
                self.sched.get_request(rid)

    # -------------------------------------------------------------- rules: steps

    @precondition(lambda self: len(self.in_flight) < self.depth)
    @rule()
    def schedule(self) -> None:
        self.schedule_and_execute()

    @precondition(lambda self: bool(self.in_flight))
    @rule()
    def apply_output(self) -> None:
        self.apply_oldest()

    @rule(count=st.integers(1, 12))
    def run_steps(self, count: int) -> None:
        """Engine-like steps: schedule while fewer than ``depth`` are in flight, else apply."""
        for _ in range(count):
            if len(self.in_flight) < self.depth:
                self.schedule_and_execute()
            else:
                self.apply_oldest()

    @precondition(lambda self: self.k > 0)
    @rule(data=st.data())
    def inject_drafts(self, data: st.DataObject) -> None:
        pool = [*self.live(), "never-added"]
        ids = data.draw(st.lists(st.sampled_from(pool), unique=True, max_size=3))
        drafts = [data.draw(st.lists(st.integers(-1, VOCAB - 1), max_size=self.k)) for _ in ids]
        # Synchronous scheduling refuses drafts for a running request whose step is still
        # in flight (the next step would schedule them ahead of the token they follow).
        ahead = [
            rid
            for rid, row in zip(ids, drafts, strict=True)
            if row and not self.is_async and self.takes_drafts_after_its_step(rid)
        ]
        if ahead:
            before = self.sched.debug_snapshot()
            refusal = re.escape(f'"{ahead[0]}"') + ".* is still in flight"
            with pytest.raises(InvalidRequestError, match=refusal):
                self.sched.update_draft_token_ids(ids, drafts)
            assert self.sched.debug_snapshot() == before
            return
        self.sched.update_draft_token_ids(ids, drafts)
        self.sched.check_invariants()

    def takes_drafts_after_its_step(self, rid: str) -> bool:
        """Whether ``rid`` runs past its prompt with tokens in flight."""
        if rid not in self.reqs:
            return False
        request = self.sched.get_request(rid)
        return (
            request.status == RequestStatus.RUNNING
            and not request.is_prefill_chunk
            and request.num_in_flight_tokens > 0
        )

    @rule(reset_running=st.booleans())
    def reset_prefix_cache(self, reset_running: bool) -> None:
        before = self.sched.debug_snapshot()
        running = [rid for rid, r in self.reqs.items() if r.state == "running"]
        in_use = self.sched.num_free_blocks < self.config.num_gpu_blocks - 1
        ok = self.sched.reset_prefix_cache(reset_running_requests=reset_running)
        if not reset_running:
            assert ok == (not in_use)
            if not ok:
                self.snapshot_unchanged(before)
        else:
            assert ok
            assert self.sched.running_request_ids() == []
            in_flight_ids = set().union(*(set(so.req_ids) for so, _, _, _ in self.in_flight))
            for rid in running:
                self.reqs[rid].state = "preempted"
                if rid in in_flight_ids:
                    self.reqs[rid].dropped = True
                for _, _, _, dropped in self.in_flight:
                    dropped.add(rid)
        self.sched.check_invariants()

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "sched"):
            return
        running, waiting = self.sched.get_request_counts()
        assert running + waiting == len(self.reqs) == self.sched.get_num_unfinished_requests()
        assert self.sched.num_steps_in_flight == sum(
            1 for so, _, _, _ in self.in_flight if len(so.req_ids)
        )

    # -------------------------------------------------------------- liveness

    @precondition(lambda self: bool(self.reqs))
    @rule(now=st.integers(0, 3))
    def drain(self, now: int) -> None:
        if now == 0:  # one time in four, so that requests pile up in between
            self.drain_all()

    def drain_all(self) -> None:
        """Run with no new arrivals until every request finished, within the bounds."""
        self.drains += 1
        self.draining = True
        reqs = list(self.reqs.values())
        bound = liveness_bound(reqs, self.config, self.depth)
        if self.config.policy != "fcfs":
            bound *= len(reqs) + 1  # a livelock detector, not a proved bound
        preemptions = self.sched.stats()["num_preemptions"]
        steps = 0
        while self.sched.has_requests() or self.in_flight:
            if self.in_flight and (
                len(self.in_flight) >= self.depth or not self.sched.has_requests()
            ):
                self.apply_oldest()
                continue
            self.schedule_and_execute()
            steps += 1
            assert steps <= bound, (
                f"not finished after {steps} steps (bound {bound}): "
                f"{len(self.reqs)} live requests, counts {self.sched.get_request_counts()}"
            )
            if not self.is_async:
                self.apply_oldest()
        assert not self.reqs, sorted(self.reqs)
        preemptions = self.sched.stats()["num_preemptions"] - preemptions
        most = work_bound(reqs, self.config, self.depth, preemptions)
        assert steps <= most, f"{steps} steps > {most} ({preemptions} preemptions)"
        self.draining = False

    def teardown(self) -> None:
        if not hasattr(self, "sched"):
            return
        self.drain_all()
        sched = self.sched
        sched.check_invariants()
        assert not sched.has_requests() and sched.num_steps_in_flight == 0
        assert sched.num_free_blocks == self.config.num_gpu_blocks - 1
        assert sched.get_kv_cache_usage() == 0.0
        assert self.free or self.runner.num_live_requests == 0
        for req in self.done:
            self.check_finished_request(req)
        note(f"{self.steps} steps, {len(self.done)} requests, {self.drains} drains")
        stats = sched.stats()
        TOTALS.update(
            examples=1,
            steps=self.steps,
            requests=len(self.done),
            drains=self.drains,
            preemptions=stats["num_preemptions"],
            draft_tokens=stats["num_draft_tokens"],
            prefix_hits=stats["prefix_cache_hits"] + stats["prefix_cache_preempted_hits"],
            **self.events,
        )


SchedulerMachine.TestCase.settings = settings(
    stateful_step_count=80 if SLOW else 40,
    max_examples=settings().max_examples if SLOW else 150,  # the fast profile's 40 is too few
    report_multiple_bugs=False,  # one failure is enough for a report
    # CI reports a failure unshrunk, at once (shrinking a long run takes minutes); the slow
    # profile shrinks it.
    phases=list(Phase) if SLOW else [p for p in Phase if p is not Phase.shrink],
)
TestSchedulerMachine = SchedulerMachine.TestCase


# ------------------------------------------------------------------------------ found by fuzzing
#
# Each config below is valid (``SchedulerConfig`` accepts it) and each request is accepted by
# ``add_request``, yet the request is never scheduled: the engine stops with "no progress".
# A fix may refuse the config (ConfigError) or the request (InvalidRequestError) up front, or
# schedule it; what is not acceptable is accepting both and never finishing.


def finishes_or_is_refused(
    config: dict[str, Any], requests: list[tuple[list[int], dict[str, Any]]]
) -> str:
    """Run ``requests`` one after the other; each is refused up front or finishes. Returns
    the ConfigError's message if the config is refused, else ``"ran"``."""
    try:
        cfg = SchedulerConfig(**config)
    except ConfigError as e:
        return str(e)
    engine = Engine(cfg, check_invariants=True)
    for i, (prompt, kwargs) in enumerate(requests):
        try:
            engine.add_request(f"r{i}", prompt, **kwargs)
        except InvalidRequestError:
            continue
        results = engine.run(max_steps=10 * cfg.max_model_len)
        assert results[f"r{i}"].finished, f"r{i} did not finish: {results[f'r{i}']}"
    return "ran"


def test_no_chunked_prefill_and_a_scheduled_token_budget_below_the_prompt() -> None:
    """Found by fuzzing: chunked prefill off, max_num_scheduled_tokens < prompt: never admitted."""
    # The waiting loop breaks on n > min(token_budget, input_budget - draft_slots), and
    # SchedulerConfig only checks max_num_batched_tokens >= max_model_len, not
    # max_num_scheduled_tokens (the token budget), so a 2-token prompt waits forever.
    config = {
        "max_model_len": 64,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 64,
        "max_num_scheduled_tokens": 1,
        "enable_chunked_prefill": False,
        "async_scheduling": False,
    }
    # The fix: SchedulerConfig refuses a budget below M - s without chunked prefill.
    assert "max_num_scheduled_tokens" in finishes_or_is_refused(
        config, [([5, 6], {"max_tokens": 1})]
    )


def test_no_chunked_prefill_and_draft_slots_eating_the_budget() -> None:
    """Found by fuzzing: chunked prefill off, draft slots shrink the budget below the prompt."""
    # input_budget - draft_slots = 16 - 2 < 15 tokens: the same head-of-line break, forever.
    config = {
        "max_model_len": 16,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 16,
        "num_speculative_tokens": 2,
        "max_num_new_slots_for_drafting": 2,
        "enable_chunked_prefill": False,
        "async_scheduling": False,
    }
    refused = finishes_or_is_refused(config, [(list(range(15)), {"max_tokens": 1})])
    assert "max_num_batched_tokens" in refused or "draft" in refused, refused


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_padding_wider_than_the_whole_step_budget_with_computed_tokens(
    async_scheduling: bool,
) -> None:
    """Found by fuzzing: a 1-token admission padded to 1 + K above the step budget never runs."""
    # C_new = N - 1 > 0 (an arrival with computed tokens), so the waiting loop pads n = 1 to
    # 1 + K = 4 and, 4 being above the budget of a whole step (max_num_scheduled_tokens = 2),
    # breaks "to schedule it padded later": no later step has a bigger budget.
    config = {
        "max_model_len": 100,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 100,
        "max_num_scheduled_tokens": 2,
        "num_speculative_tokens": 3,
        "async_scheduling": async_scheduling,
    }
    # The fix: SchedulerConfig refuses a step budget that cannot hold a padded 1 + K decode.
    refused = finishes_or_is_refused(
        config, [(list(range(10)), {"max_tokens": 3, "num_computed_tokens": 9})]
    )
    assert "padded to 1 + num_speculative_tokens" in refused, refused


def test_padding_wider_than_the_whole_step_budget_after_a_prefix_hit() -> None:
    """Found by fuzzing: a prefix hit leaving one token, K=2, a 2-token budget: never scheduled."""
    # No unusual knob: max_num_batched_tokens=2 >= max_num_seqs=1 is a valid tight budget.
    # "b" hits the block "a" cached, so C_new = 4 and n = 1, padded to 1 + K = 3 > 2: break.
    config = {
        "max_model_len": 32,
        "block_size": 4,
        "num_gpu_blocks": 64,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 2,
        "num_speculative_tokens": 2,
        "async_scheduling": False,
        "enable_prefix_caching": True,
    }
    refused = finishes_or_is_refused(
        config, [([1, 2, 3, 4], {"max_tokens": 1}), ([1, 2, 3, 4, 5], {"max_tokens": 1})]
    )
    assert "padded to 1 + num_speculative_tokens" in refused, refused


def teardown_module() -> None:
    """With ``-s``, say what the state machine ran (the slow profile's figures)."""
    if TOTALS:
        profile = "slow" if SLOW else "fast"
        print(f"\nstate machine, {profile} profile: {dict(sorted(TOTALS.items()))}")
