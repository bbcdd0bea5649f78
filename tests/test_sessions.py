"""Streaming-input sessions through the binding (``add_request(..., resumable=True)``): a
stop ends the session's input, not the request; its next input is an ``add_request`` under
the same id; bad inputs are refused naming the field and change nothing."""

from __future__ import annotations

from typing import Any

import pytest

from llmsched import InvalidRequestError, RequestStatus, Scheduler, SchedulerConfig

from conftest import one_token_each


def _scheduler(**overrides: Any) -> Scheduler:
    config = {
        "max_model_len": 64,
        "block_size": 4,
        "num_gpu_blocks": 64,
        "max_num_batched_tokens": 128,
        "async_scheduling": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**config))


def _step(sched: Scheduler, token: int = 0) -> Any:
    so = sched.schedule()
    return sched.update_from_output(so, one_token_each(so, token))


def test_a_session_stops_waits_for_input_and_goes_on_with_it() -> None:
    sched = _scheduler(max_num_seqs=1)
    assert sched.add_request("s", [1, 2, 3, 4, 5], max_tokens=2, resumable=True) is None
    _step(sched, 7)
    (out,) = _step(sched, 8)
    # The output carries the input's finish reason; the request stays live.
    assert out.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert not sched.take_finished_requests()
    session = sched.get_request("s")
    assert session.status == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert (session.resumable, session.num_computed_tokens, session.num_tokens) == (True, 6, 7)
    assert sched.num_waiting_for_streaming_input == 1
    assert sched.get_num_unfinished_requests() == 0
    # It holds the one runner slot: another request waits.
    sched.add_request("other", [9, 9], max_tokens=1)
    assert len(sched.schedule()) == 0

    assert sched.add_request("s", [20, 21], max_tokens=1, resumable=True) == "taken_up"
    session = sched.get_request("s")
    assert list(session.prompt_token_ids) == [1, 2, 3, 4, 5, 7, 20, 21]
    assert (session.num_computed_tokens, session.num_inputs_taken) == (6, 1)
    so = sched.schedule()
    assert list(so.req_ids) == ["s"]
    assert list(so.num_scheduled_tokens) == [2]
    assert list(so.num_computed_tokens) == [6]


def test_inputs_added_while_it_runs_wait_their_turn() -> None:
    sched = _scheduler()
    sched.add_request("s", [1, 2, 3], max_tokens=1, resumable=True)
    sched.schedule()  # in flight, not applied yet
    assert sched.add_request("s", [4], max_tokens=1, resumable=True) == "queued"
    assert sched.add_request("s", [0], max_tokens=1) == "queued"  # the end of the session
    assert sched.get_request("s").num_queued_inputs == 2


def test_the_end_of_a_session_waiting_for_input_aborts_it() -> None:
    sched = _scheduler()
    sched.add_request("s", [1, 2, 3], max_tokens=1, resumable=True)
    free = sched.num_free_blocks
    _step(sched)
    assert sched.add_request("s", [0], max_tokens=1) == "finished"
    (final,) = sched.take_finished_requests()
    assert final.status == RequestStatus.FINISHED_ABORTED
    assert sched.num_free_blocks == free
    assert sched.num_waiting_for_streaming_input == 0
    assert not sched.has_unfinished_requests()


def test_the_end_of_the_session_queued_finishes_it_at_its_stop() -> None:
    sched = _scheduler()
    sched.add_request("s", [1, 2, 3], max_tokens=1, resumable=True)
    free = sched.num_free_blocks
    so = sched.schedule()
    sched.add_request("s", [4, 5], max_tokens=2, resumable=True)
    sched.add_request("s", [0], max_tokens=1)
    sched.update_from_output(so, one_token_each(so, 7))
    assert sched.get_request("s").status == RequestStatus.WAITING
    _step(sched, 8)
    _step(sched, 9)
    (final,) = sched.take_finished_requests()
    assert final.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert list(final.prompt_token_ids) == [1, 2, 3, 4, 5]
    assert list(final.output_token_ids) == [8, 9]
    assert sched.num_free_blocks == free


@pytest.mark.parametrize(
    ("prompt", "kwargs", "field"),
    [
        ([3] * 61, {"max_tokens": 1}, "prompt_token_ids"),
        ([], {"max_tokens": 1}, "prompt_token_ids"),
        ([3], {"max_tokens": 0}, "max_tokens"),
        ([-3], {"max_tokens": 1}, "prompt_token_ids"),
        ([3], {"max_tokens": 1, "mm_inputs": [("img", 0, 1)]}, "mm_inputs"),
    ],
)
def test_a_bad_input_is_refused_naming_the_field_and_changes_nothing(
    prompt: list[int], kwargs: dict[str, Any], field: str
) -> None:
    sched = _scheduler(max_num_encoder_input_tokens=16, encoder_cache_size=16)
    sched.add_request("s", [1, 2, 3], max_tokens=1, resumable=True)
    _step(sched)
    before = sched.get_request("s")
    with pytest.raises(InvalidRequestError, match=field):
        sched.add_request("s", prompt, resumable=True, **kwargs)
    after = sched.get_request("s")
    assert (after.status, list(after.prompt_token_ids), after.num_computed_tokens) == (
        before.status,
        list(before.prompt_token_ids),
        before.num_computed_tokens,
    )
    assert sched.num_waiting_for_streaming_input == 1


def test_an_input_for_a_request_that_is_no_session_is_a_duplicate() -> None:
    sched = _scheduler()
    sched.add_request("plain", [1, 2, 3], max_tokens=1)
    with pytest.raises(InvalidRequestError, match="plain"):
        sched.add_request("plain", [4], max_tokens=1, resumable=True)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"kv_cache_groups": "mamba,full", "async_scheduling": True}, "async"),
        ({"kv_cache_groups": "full,mamba", "num_speculative_tokens": 2}, "drafts"),
    ],
)
def test_a_session_is_refused_where_mamba_state_cannot_carry_it(
    overrides: dict[str, Any], reason: str
) -> None:
    """Beside Mamba groups a session is refused under async scheduling, and beside drafts
    with prefix caching on (a later input would resume from a state the runner does not
    keep); the scheduler is left as it was and a plain request still runs."""
    sched = _scheduler(enable_prefix_caching=True, **overrides)
    with pytest.raises(InvalidRequestError, match=f"resumable.*{reason}"):
        sched.add_request("s", [1, 2, 3], max_tokens=1, resumable=True)
    assert not sched.has_unfinished_requests()
    sched.add_request("plain", [1, 2, 3], max_tokens=1)
    assert sched.schedule().num_scheduled_tokens.tolist() == [3]
