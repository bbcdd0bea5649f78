"""The drafts protocol of a synchronous scheduler: drafts are handed in after the output
of the step that made them is applied.

vLLM 0.33 accepts drafts for a request whose step is still in flight: a second
``schedule()`` then schedules a draft slot where the in-flight step's token belongs, and
once both outputs are applied ``C != N - 1`` (its state is broken: the next step
recomputes). llmsched refuses such drafts, naming the request, and changes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmsched import InvalidRequestError, Scheduler, SchedulerConfig, SchedulerOutput


class Output:
    """A runner output: one sampled token per entry that reaches the end of its tokens."""

    def __init__(self, so: SchedulerOutput, sched: Scheduler, token: int = 7) -> None:
        self.req_ids = list(so.req_ids)
        counts = [
            0 if sched.get_request(rid).is_prefill_chunk else 1 + int(so.num_spec_tokens[i])
            for i, rid in enumerate(self.req_ids)
        ]
        self.num_sampled = np.array(counts, np.int32)
        self.sampled_token_ids = np.full(sum(counts), token, np.int32)


def sync_k1(**overrides: Any) -> Scheduler:
    fields: dict[str, Any] = {
        "num_speculative_tokens": 1,
        "async_scheduling": False,
        "enable_prefix_caching": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**fields))


def decoding_in_flight() -> tuple[Scheduler, SchedulerOutput]:
    """Request "r" past its prompt, its decode step scheduled and in flight."""
    sched = sync_k1()
    sched.add_request("r", [1, 2, 3, 4, 5], max_tokens=20)
    so = sched.schedule()
    sched.update_from_output(so, Output(so, sched, 10))
    return sched, sched.schedule()


@pytest.mark.parametrize(
    "drafts",
    [
        ((["r"], [[77]]), "rows"),
        ((["r"], np.array([77], np.int32), np.array([1], np.int32)), "flat"),
        ((iter(["r"]), [[77]]), "iterable"),
    ],
    ids=lambda d: d[1],
)
def test_drafts_for_a_request_in_flight_are_refused_and_change_nothing(
    drafts: tuple[tuple[Any, ...], str],
) -> None:
    sched, in_flight = decoding_in_flight()
    before = sched.debug_snapshot()
    with pytest.raises(
        InvalidRequestError,
        match=rf"req_ids\[0\]=\"r\": drafts for a request whose step {in_flight.step_id} is "
        r"still in flight: with synchronous scheduling, hand drafts in after "
        r"update_from_output",
    ):
        sched.update_draft_token_ids(*drafts[0])
    assert sched.debug_snapshot() == before
    # The second step the issue describes schedules nothing (no draft slot) ...
    assert len(sched.schedule()) == 0
    sched.update_from_output(in_flight, Output(in_flight, sched, 11))
    sched.check_invariants()
    r = sched.get_request("r")
    assert r.num_computed_tokens == r.num_tokens - 1
    # ... and once the output is applied, the same drafts are taken and verified.
    sched.update_draft_token_ids(["r"], [[77]])
    so = sched.schedule()
    assert so.num_spec_tokens.tolist() == [1] and so.spec_token_ids.tolist() == [77]
    sched.update_from_output(so, Output(so, sched, 12))
    sched.check_invariants()
    r = sched.get_request("r")
    assert r.num_computed_tokens == r.num_tokens - 1


def test_the_refusal_names_the_request_and_leaves_the_other_rows_unapplied() -> None:
    """One bad row refuses the whole call: the rows before it are not applied either."""
    sched = sync_k1()
    sched.add_request("a", [1, 2, 3], max_tokens=20)
    so = sched.schedule()
    sched.update_from_output(so, Output(so, sched))
    sched.add_request("b", [4, 5, 6], max_tokens=20)
    in_flight = sched.schedule()
    assert list(in_flight.req_ids) == ["a", "b"]
    sched.update_from_output(in_flight, Output(in_flight, sched))
    sched.add_request("c", [7, 8, 9], max_tokens=20)
    sched.update_draft_token_ids(["a", "b"], [[5], [6]])
    in_flight = sched.schedule()  # a and b verify their drafts, c's prompt
    sched.update_from_output(in_flight, Output(in_flight, sched))
    so = sched.schedule()  # a, b and c all decode: in flight
    before = sched.debug_snapshot()
    with pytest.raises(InvalidRequestError, match=r"req_ids\[1\]=\"c\": drafts for a request"):
        sched.update_draft_token_ids(["gone", "c", "a"], [[], [1], [2]])
    assert sched.debug_snapshot() == before
    # Rows without drafts for requests in flight are fine: nothing to schedule ahead.
    sched.update_draft_token_ids(["a", "b", "c"], [[], [], []])
    sched.update_from_output(so, Output(so, sched))
    sched.check_invariants()


def test_async_scheduling_keeps_its_placeholders() -> None:
    """The rule is the synchronous protocol's: an async scheduler's requests are always
    in flight, and drafts handed to it are not refused for that."""
    sched = sync_k1(async_scheduling=True)
    sched.add_request("r", [1, 2, 3], max_tokens=20)
    so = sched.schedule()
    sched.update_draft_token_ids(["r"], [[5]])
    sched.update_from_output(so, Output(so, sched))
    sched.check_invariants()
