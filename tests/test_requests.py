"""Requests in and out: add_request's validation (a refusal changes nothing), prompts in every
form a caller holds, duplicate ids, finish_requests, get_request."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmsched import (
    DuplicateRequestError,
    InvalidRequestError,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    UnknownRequestError,
)

from conftest import add_requests, make_scheduler, one_token_each


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        ((7, [1]), {"max_tokens": 1}, "request_id"),
        (("", [1]), {"max_tokens": 1}, "request_id"),
        (("x", []), {"max_tokens": 1}, "prompt_token_ids"),
        (("x", "abc"), {"max_tokens": 1}, "prompt_token_ids"),
        (("x", [1, -2]), {"max_tokens": 1}, r"prompt_token_ids\[1\]"),
        (("x", [1, 2.5]), {"max_tokens": 1}, r"prompt_token_ids\[1\]"),
        (("x", [1, 2**31]), {"max_tokens": 1}, r"prompt_token_ids\[1\]"),
        (("x", np.array([[1, 2]])), {"max_tokens": 1}, "prompt_token_ids"),
        (("x", np.array([1.0])), {"max_tokens": 1}, "prompt_token_ids"),
        (("x", list(range(64))), {"max_tokens": 1}, "prompt_token_ids"),  # == M
        (("x", [1]), {"max_tokens": 0}, "max_tokens"),
        (("x", [1]), {"max_tokens": 1.5}, "max_tokens"),
        (("x", [1]), {"max_tokens": 1, "min_tokens": -1}, "min_tokens"),
        (("x", [1]), {"max_tokens": 1, "eos_token_id": -1}, "eos_token_id"),
        (("x", [1]), {"max_tokens": 1, "stop_token_ids": [3, -3]}, r"stop_token_ids\[1\]"),
        (("x", [1, 2]), {"max_tokens": 1, "num_computed_tokens": 2}, "num_computed_tokens"),
        (("x", [1, 2]), {"max_tokens": 1, "num_computed_tokens": -1}, "num_computed_tokens"),
        (("x", [1]), {"max_tokens": 1, "arrival_time": float("inf")}, "arrival_time"),
        (("x", [1]), {"max_tokens": 1, "priority": 2**40}, "priority"),
        # 3 usable blocks of 16 hold a request of 49 tokens: a prompt of 48 at most.
        (("x", [1] * 49), {"max_tokens": 1}, r"prompt_token_ids=<49 tokens>: at most 48"),
        (
            ("x", [1]),
            {"max_tokens": 1, "skip_reading_prefix_cache": 1},
            "skip_reading_prefix_cache",
        ),
    ],
)
def test_bad_request_is_refused_and_changes_nothing(
    args: tuple[Any, ...], kwargs: dict[str, Any], field: str
) -> None:
    sched = Scheduler(SchedulerConfig(max_model_len=64, num_gpu_blocks=4, block_size=16))
    sched.add_request("live", [1, 2, 3], max_tokens=4)
    before = sched.debug_snapshot()
    with pytest.raises(InvalidRequestError, match=field):
        sched.add_request(*args, **kwargs)
    assert sched.debug_snapshot() == before
    sched.check_invariants()


def test_duplicate_live_id_is_refused_but_a_finished_id_can_return() -> None:
    sched = make_scheduler()
    sched.add_request("a", [1, 2], max_tokens=1)
    with pytest.raises(DuplicateRequestError, match=r"request_id=.a."):
        sched.add_request("a", [1, 2], max_tokens=1)
    so = sched.schedule()
    outs = sched.update_from_output(so, one_token_each(so))
    assert outs[0].finished
    sched.add_request("a", [3, 4], max_tokens=1)  # the id is free again
    so = sched.schedule()
    assert so.finished_req_ids == ["a"] and so.new_req_ids == ["a"]


def test_prompt_as_numpy_array_of_any_integer_width() -> None:
    sched = make_scheduler()
    for dtype in (np.int8, np.uint16, np.int32, np.int64):
        sched.add_request(str(dtype), np.arange(5, dtype=dtype), max_tokens=1)
    so = sched.schedule()
    assert so.all_token_ids.tolist() == list(range(5)) * 4


def test_prompt_as_a_strided_or_a_long_array_is_read_in_order() -> None:
    """Every int32 layout (contiguous, strided, reversed) and a long prompt with a bad id
    at its very end: the same tokens, or the bad one named by its index."""
    sched = make_scheduler(max_model_len=4096)
    base = np.arange(40, dtype=np.int32)
    layouts = {"contiguous": base[:20], "strided": base[::2], "reversed": base[::-1][:20]}
    for name, prompt in layouts.items():
        sched.add_request(name, prompt, max_tokens=1)
    so = sched.schedule()
    assert so.all_token_ids.tolist() == [t for p in layouts.values() for t in p.tolist()]
    long_prompt = np.arange(1, 3001, dtype=np.int64)
    long_prompt[-1] = 2**31
    with pytest.raises(InvalidRequestError, match=r"prompt_token_ids\[2999\]=2147483648"):
        sched.add_request("long", long_prompt, max_tokens=1)
    long_prompt[-1] = -1
    with pytest.raises(InvalidRequestError, match=r"prompt_token_ids\[2999\]=-1"):
        sched.add_request("long", long_prompt, max_tokens=1)


def test_get_request_snapshot_and_key_error_once_finished() -> None:
    sched = make_scheduler()
    sched.add_request("a", [5, 6, 7], max_tokens=1)
    req = sched.get_request("a")
    assert (req.status, req.num_tokens, req.num_computed_tokens) == (RequestStatus.WAITING, 3, 0)
    assert req.prompt_token_ids == [5, 6, 7] and req.output_token_ids == []
    so = sched.schedule()
    assert sched.get_request("a").num_computed_tokens == 3  # advanced at schedule time
    sched.update_from_output(so, one_token_each(so))
    with pytest.raises(UnknownRequestError) as info:
        sched.get_request("a")
    assert isinstance(info.value, KeyError)


def test_a_finished_requests_final_state_is_taken_once() -> None:
    sched = make_scheduler()
    sched.add_request("a", [5, 6, 7], max_tokens=2)
    sched.add_request("b", [5, 6], max_tokens=9)
    for token in (11, 12):
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so, token))
    (a,) = sched.take_finished_requests()
    assert (a.request_id, a.status, a.output_token_ids) == (
        "a",
        RequestStatus.FINISHED_LENGTH_CAPPED,
        [11, 12],
    )
    assert (a.num_computed_tokens, a.num_tokens, a.block_ids) == (4, 5, [])
    assert sched.take_finished_requests() == []
    assert sched.finish_requests("b", RequestStatus.FINISHED_ABORTED) == ["b"]
    (b,) = sched.take_finished_requests()
    assert (b.status, b.output_token_ids) == (RequestStatus.FINISHED_ABORTED, [11, 12])


def test_a_request_can_skip_reading_the_prefix_cache() -> None:
    """``skip_reading_prefix_cache`` (vLLM's, for prompt logprobs): admitted with no prefix
    hit, no lookup counted; its blocks are still cached for the next request."""
    sched = make_scheduler(enable_prefix_caching=True, block_size=4)
    prompt = list(range(1, 14))
    sched.add_request("first", prompt, max_tokens=1)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    lookups = sched.stats()["prefix_cache_requests"]
    sched.add_request("skips", prompt, max_tokens=1, skip_reading_prefix_cache=True)
    sched.add_request("reads", prompt, max_tokens=1, skip_reading_prefix_cache=False)
    so = sched.schedule()
    computed = dict(zip(so.req_ids, so.num_computed_tokens.tolist(), strict=True))
    assert computed == {"skips": 0, "reads": 12}
    assert sched.stats()["prefix_cache_requests"] == lookups + 1


def test_prefill_waits_for_its_step_while_a_request_decodes() -> None:
    """``prefill_schedule_interval`` and ``schedule(throttle_prefills=True)``: a newcomer
    waits while "a" decodes (the cadence: until 3 executed steps since "a"'s prefill); a
    throttle that is not a bool is refused, the state unchanged."""
    sched = make_scheduler(prefill_schedule_interval=3)
    sched.add_request("a", [1, 2, 3], max_tokens=20)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    sched.add_request("b", [4, 5, 6], max_tokens=20)
    with pytest.raises(InvalidRequestError, match="throttle_prefills=1"):
        sched.schedule(throttle_prefills=1)  # type: ignore[arg-type]
    steps = []
    for _ in range(3):
        so = sched.schedule()
        steps.append(so.req_ids)
        sched.update_from_output(so, one_token_each(so))
    assert steps == [["a"], ["a"], ["a", "b"]]
    unthrottled = make_scheduler()
    unthrottled.add_request("a", [1, 2, 3], max_tokens=20)
    so = unthrottled.schedule()
    unthrottled.update_from_output(so, one_token_each(so))
    unthrottled.add_request("b", [4, 5, 6], max_tokens=20)
    assert unthrottled.schedule(throttle_prefills=True).req_ids == ["a"]


def test_finish_requests_validates_its_status_and_ignores_unknown_ids() -> None:
    sched = make_scheduler()
    add_requests(sched, 3)
    with pytest.raises(InvalidRequestError, match="status"):
        sched.finish_requests("0", RequestStatus.RUNNING)
    assert sched.finish_requests(["0", "nope", "0"], RequestStatus.FINISHED_ABORTED) == ["0"]
    assert sched.finish_requests(None, RequestStatus.FINISHED_ABORTED) == ["1", "2"]
    assert not sched.has_unfinished_requests() and sched.has_requests()
    assert sched.has_finished_requests()
    assert sorted(sched.schedule().finished_req_ids) == ["0", "1", "2"]
    assert not sched.has_requests() and not sched.has_finished_requests()


def test_lora_adapters_reach_the_step_and_the_request() -> None:
    """``lora_id`` is the request's adapter: the step lists its adapters once each, within
    ``max_loras``; a request under a further adapter waits, the ones behind it go on."""
    sched = Scheduler(SchedulerConfig(max_loras=1, async_scheduling=False))
    for req_id, lora in [("a", 7), ("b", 3), ("c", 7), ("d", None)]:
        sched.add_request(req_id, [1, 2, 3], max_tokens=2, lora_id=lora)
    out = sched.schedule()
    assert out.req_ids == ["a", "c", "d"]
    assert out.lora_ids.tolist() == [7] and out.lora_ids.dtype == np.int32
    assert sched.get_request("b").lora_id == 3 and sched.get_request("d").lora_id is None
    # "b" was set aside: a skipped waiting request (vLLM's count) until admitted.
    assert (sched.get_request_counts(), sched.num_skipped_waiting) == ((3, 1), 1)
    assert sched.skipped_waiting_request_ids() == ["b"]
    for bad in (0, -1, 2**31):
        with pytest.raises(InvalidRequestError, match=f"lora_id={bad}"):
            sched.add_request("x", [1], max_tokens=1, lora_id=bad)
    # Once adapter 7's requests are gone, "b" is admitted: none is set aside.
    sched.update_from_output(out, one_token_each(out))
    sched.finish_requests(["a", "c"], RequestStatus.FINISHED_ABORTED)
    assert "b" in sched.schedule().req_ids
    assert sched.skipped_waiting_request_ids() == [] and sched.num_skipped_waiting == 0
