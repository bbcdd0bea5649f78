"""The bug llmsched exists to make impossible (vLLM PR #53962), at the boundary.

A request arriving with ``C = M - 1 - K`` computed tokens and one token left needs exactly
one token. Padding it to the uniform decode shape ``1 + K`` would end its step at ``M`` and
leave no room for the sampled token: ``C + n + s = M + 1``. vLLM before #53962 padded it
anyway; engines then crashed, in the sync path with "Sampled token IDs exceed the max model
length" (a runner whose padded slots hold real drafts) and in the async path with a negative
count on the next step (``np.repeat``). One capacity rule, ``C + n + s <= M``, serves both of
llmsched's loops; these tests hold it at the boundary, end to end with the simulated runner.

In the sync path the runner treats padded slots as real drafts that are always accepted
(``accept_padded_drafts=True``, ``acceptance_rate=1.0``), the worst case: an overrun shows as
the runner's assertion. In the async path padded slots are rejected, as on a GPU that holds
no drafts for a fresh admission: an overrun shows as a negative room ``M - C - s`` in the
scheduler's state, the count vLLM sent to ``np.repeat`` on the next step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmsched import RequestStatus, SchedulerConfig, SchedulerOutput
from llmsched.sim.engine import Engine
from llmsched.sim.runner import SimulatedModelRunner

M = 2048


class StepLog:
    """Records ``(request, C, n, spec ids)`` of every scheduled entry of every step."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str, int, int, list[int]]] = []

    def __call__(self, so: SchedulerOutput) -> None:
        offsets = np.concatenate([[0], np.cumsum(so.num_spec_tokens)])
        for i, req_id in enumerate(so.req_ids):
            spec = so.spec_token_ids[offsets[i] : offsets[i + 1]].tolist()
            c, n = int(so.num_computed_tokens[i]), int(so.num_scheduled_tokens[i])
            self.entries.append((so.step_id, req_id, c, n, spec))

    def of(self, req_id: str) -> list[tuple[int, str, int, int, list[int]]]:
        return [e for e in self.entries if e[1] == req_id]


def boundary_engine(
    num_spec: int, async_scheduling: bool, max_model_len: int = M, **config: Any
) -> tuple[Engine, StepLog]:
    settings = {"max_num_seqs": 16, "max_num_batched_tokens": 8192, "num_gpu_blocks": 4096}
    cfg = SchedulerConfig(
        max_model_len=max_model_len,
        num_speculative_tokens=num_spec,
        async_scheduling=async_scheduling,
        block_size=16,
        **{**settings, **config},
    )
    runner = SimulatedModelRunner(
        cfg, seed=7, acceptance_rate=1.0, accept_padded_drafts=not async_scheduling
    )
    log = StepLog()
    return Engine(cfg, runner, on_schedule=log), log


def start_decoding(engine: Engine) -> None:
    """A filler request that decodes for the whole test, so a running request is scheduled."""
    engine.add_request("decoding", list(range(1, 9)), max_tokens=64)
    while not engine.results["decoding"].output_token_ids:
        engine.step()


def add_late_arrival(engine: Engine, num_computed: int) -> None:
    """A disaggregated-decode arrival: KV for all but its last prompt token exists."""
    prompt_len = num_computed + 1
    engine.add_request(
        "late", list(range(prompt_len)), max_tokens=M, num_computed_tokens=num_computed
    )
    engine.add_request("behind", [5, 6, 7, 8], max_tokens=4)


def run_checked(engine: Engine) -> None:
    """Run to completion, checking the scheduler's state invariants after every step: the
    state form of the capacity rule is that the room ``M - C - s`` of a request never goes
    negative, which is what turned into a negative count in vLLM's async path."""
    while engine.scheduler.has_requests() or engine.num_steps_in_flight:
        engine.step()
        engine.scheduler.check_invariants()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("num_spec", [1, 3])
def test_one_token_short_of_room_is_not_padded(num_spec: int, async_scheduling: bool) -> None:
    """C = M - 1 - K: scheduled 1 token without drafts, beside the request behind it, and
    driven to FINISHED_LENGTH_CAPPED at exactly M tokens within the capacity rule."""
    engine, log = boundary_engine(num_spec, async_scheduling)
    start_decoding(engine)
    add_late_arrival(engine, M - 1 - num_spec)

    run_checked(engine)

    first_step, _, c, n, spec = log.of("late")[0]
    assert (c, n, spec) == (M - 1 - num_spec, 1, [])
    # No head-of-line block: the request behind was admitted in the same step.
    assert log.of("behind")[0][0] == first_step
    for step_id, req_id, c, n, _ in log.entries:
        assert n >= 1 and c + n + 1 <= M, f"step {step_id} {req_id}: C={c} n={n}"
    late = engine.results["late"]
    assert late.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert (M - num_spec) + len(late.output_token_ids) == M
    assert engine.results["behind"].finished


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("num_spec", [1, 3])
def test_one_more_token_of_room_is_padded(num_spec: int, async_scheduling: bool) -> None:
    """C = M - 2 - K: the padded step ends at M - 1, the sampled token lands at M - 1: padded
    to 1 + K with K placeholders, and the run still ends at exactly M tokens."""
    engine, log = boundary_engine(num_spec, async_scheduling)
    start_decoding(engine)
    add_late_arrival(engine, M - 2 - num_spec)

    run_checked(engine)

    _, _, c, n, spec = log.of("late")[0]
    assert (c, n, spec) == (M - 2 - num_spec, 1 + num_spec, [-1] * num_spec)
    for step_id, req_id, c, n, _ in log.entries:
        assert n >= 1 and c + n + 1 <= M, f"step {step_id} {req_id}: C={c} n={n}"
    late = engine.results["late"]
    assert late.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert (M - 1 - num_spec) + len(late.output_token_ids) == M


def test_vllm_case_m32_k1_async() -> None:
    """vLLM's test_no_spec_decode_padding_up_to_max_model_len: M=32, K=1, async, C=30 of 31."""
    engine, log = boundary_engine(1, True, max_model_len=32, num_gpu_blocks=64)
    engine.add_request("filler", [1, 2, 3], max_tokens=20)
    while not engine.results["filler"].output_token_ids:
        engine.step()
    engine.add_request("late", list(range(31)), max_tokens=32, num_computed_tokens=30)

    run_checked(engine)

    _, _, c, n, spec = log.of("late")[0]
    assert (c, n, spec) == (30, 1, [])
    for step_id, req_id, c, n, _ in log.entries:
        assert c + n + 1 <= 32, f"step {step_id} {req_id}: C={c} n={n}"
    late = engine.results["late"]
    assert late.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert 31 + len(late.output_token_ids) == 32
