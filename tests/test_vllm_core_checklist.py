"""Ports of the core (tag C) scheduler tests of vLLM 0.33.0, prefix caching and the
priority policy left out, plus the KV-cache tests that need no prefix caching.

Each test is written anew against llmsched's public API; its docstring names the vLLM
test (``tests/v1/core/...``) or the spec behaviour it pins. Numbers (budgets, prompt
lengths, expected counts) are vLLM's wherever the API lets them be.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmsched import (
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
    UnknownRequestError,
)

from conftest import (
    EOS_TOKEN_ID,
    CheckedScheduler,
    add_requests,
    make_scheduler,
    one_token_each,
    runner_output,
    scheduled,
    spec_tokens,
)

# ------------------------------------------------------------------------------ helpers


def _offsets(counts: Any) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def block_table(so: SchedulerOutput, req_id: str) -> list[int]:
    """The block ids ``so`` carries for ``req_id`` (whole table or appended blocks)."""
    i = so.req_ids.index(req_id)
    offs = _offsets(so.num_block_ids)
    return [int(b) for b in so.block_ids[offs[i] : offs[i + 1]]]


def all_tokens(so: SchedulerOutput, req_id: str) -> list[int]:
    """The ``all_token_ids`` that ``so`` carries for ``req_id``."""
    i = so.req_ids.index(req_id)
    offs = _offsets(so.num_all_token_ids)
    return [int(t) for t in so.all_token_ids[offs[i] : offs[i + 1]]]


def computed(so: SchedulerOutput) -> dict[str, int]:
    """``{req_id: C before the step}``."""
    return dict(zip(so.req_ids, (int(c) for c in so.num_computed_tokens), strict=True))


def by_id(outs: list[RequestOutput]) -> dict[str, RequestOutput]:
    return {o.request_id: o for o in outs}


def apply(
    sched: CheckedScheduler, so: SchedulerOutput, tokens: dict[str, list[int]]
) -> dict[str, RequestOutput]:
    """Apply ``so`` with the given sampled tokens per request (missing ids sample nothing)."""
    rows = [tokens.get(req_id, []) for req_id in so.req_ids]
    return by_id(sched.update_from_output(so, runner_output(so, rows)))


def step(sched: CheckedScheduler, tokens: dict[str, int]) -> dict[str, RequestOutput]:
    """One sync step where exactly the requests of ``tokens`` are scheduled, each sampling
    its token."""
    so = sched.schedule()
    assert sorted(so.req_ids) == sorted(tokens)
    return apply(sched, so, {req_id: [tok] for req_id, tok in tokens.items()})


# --------------------------------------------------------------- queues and bookkeeping


def test_add_requests() -> None:
    """vLLM test_add_requests: each add registers the request and appends it to waiting."""
    sched = make_scheduler()
    ids = [str(i) for i in range(10)]
    for i, req_id in enumerate(ids):
        add_requests(sched, 1, req_ids=[req_id])
        assert sched.get_request(req_id).status == RequestStatus.WAITING
        assert sched.waiting_request_ids() == ids[: i + 1]
        assert sched.get_request_counts() == (0, i + 1)


def test_finish_request() -> None:
    """vLLM test_finish_request: an abort removes the request from the requests and waiting."""
    sched = make_scheduler()
    ids = add_requests(sched, 10)
    for i, req_id in enumerate(ids):
        assert sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED) == [req_id]
        with pytest.raises(UnknownRequestError):
            sched.get_request(req_id)
        assert sched.get_request_counts() == (0, 9 - i)
        assert sched.waiting_request_ids() == ids[i + 1 :]
    # Aborts are reported to the runner by the next step.
    so = sched.schedule()
    assert len(so) == 0
    assert sorted(so.finished_req_ids) == sorted(ids)
    assert not sched.has_requests()


def test_get_num_unfinished_requests() -> None:
    """vLLM test_get_num_unfinished_requests: the unfinished count drops by one per finish."""
    sched = make_scheduler()
    ids = add_requests(sched, 10)
    assert sched.get_num_unfinished_requests() == 10
    for i, req_id in enumerate(ids):
        sched.finish_requests(req_id, RequestStatus.FINISHED_STOPPED)
        assert sched.get_num_unfinished_requests() == 10 - i - 1
    assert not sched.has_unfinished_requests()


def test_max_num_active_seqs_caps_admission() -> None:
    """vLLM test_max_num_active_seqs_caps_admission: 3 of 10 admitted, max_num_seqs stays 16."""
    sched = make_scheduler(max_num_seqs=16, max_num_active_seqs=3)
    ids = add_requests(sched, 10)
    so = sched.schedule()
    assert so.new_req_ids == ids[:3]
    assert sched.get_request_counts() == (3, 7)
    assert sched.waiting_request_ids() == ids[3:]
    assert sched.config.max_num_seqs == 16
    assert sched.config.max_num_active_seqs == 3


def test_schedule() -> None:
    """vLLM test_schedule (APC off): 10 prompts of 10 tokens all admitted whole, in order."""
    sched = make_scheduler()
    ids = add_requests(sched, 10)
    so = sched.schedule()
    assert so.new_req_ids == ids
    assert so.resumed_req_ids == []
    assert so.finished_req_ids == []
    assert scheduled(so) == dict.fromkeys(ids, 10)
    assert computed(so) == dict.fromkeys(ids, 0)
    for i, req_id in enumerate(ids):
        assert all_tokens(so, req_id) == [i] * 10
    assert sched.waiting_request_ids() == []
    assert sched.running_request_ids() == ids


# ------------------------------------------------------------------- pooling (s = 0)


def test_pooling_chunked_prefill_can_finish_at_max_model_len() -> None:
    """vLLM test_pooling_chunked_prefill_can_finish_at_max_model_len (pooling, s=0)."""
    # s=0: the last chunk reaches M=8 (4 + 4); the request stops when that chunk is processed.
    sched = make_scheduler(
        max_num_seqs=1, max_model_len=8, max_num_batched_tokens=4, num_sampled_tokens_per_step=0
    )
    sched.add_request("pool", [1] * 8, max_tokens=1)
    so1 = sched.schedule()
    assert scheduled(so1) == {"pool": 4}
    # With s = 0 no slot is kept for a sampled token: C + n may equal M.
    so2 = sched.schedule()
    assert scheduled(so2) == {"pool": 4}
    assert computed(so2) == {"pool": 4}

    outs1 = apply(sched, so1, {})
    assert "pool" not in outs1 or not outs1["pool"].finished
    assert sched.get_request("pool").status == RequestStatus.RUNNING

    outs2 = apply(sched, so2, {})
    out = outs2["pool"]
    assert out.finished
    assert out.status == RequestStatus.FINISHED_STOPPED
    assert out.finish_reason == "stop"
    assert out.new_token_ids == []
    assert not sched.has_unfinished_requests()
    assert sched.has_requests()  # until the finish is reported
    assert sched.schedule().finished_req_ids == ["pool"]
    assert not sched.has_requests()


# ------------------------------------------------------------------ resumed requests


def test_resumed_request_carries_all_token_ids() -> None:
    """vLLM test_cached_request_data_resumed_all_token_ids_mrv1_only: resumed carry all tokens."""
    # A resumed request is sent with all its tokens (prompt and outputs) and its whole table.
    # 4 usable blocks of 16; two 24-token prompts take 2 blocks each.
    sched = make_scheduler(num_gpu_blocks=5)
    sched.add_request("0", [0] * 24, max_tokens=10, eos_token_id=EOS_TOKEN_ID)
    sched.add_request("1", [1] * 24, max_tokens=16, eos_token_id=EOS_TOKEN_ID)

    so = sched.schedule()
    assert so.new_req_ids == ["0", "1"]
    assert all_tokens(so, "0") == [0] * 24
    assert block_table(so, "0") == [1, 2]
    assert block_table(so, "1") == [3, 4]
    apply(sched, so, {"0": [101], "1": [101]})

    # Steps 2..9 fit in two blocks (C + 1 <= 32).
    for k in range(2, 10):
        so = sched.schedule()
        assert scheduled(so) == {"0": 1, "1": 1}
        assert all(n == 0 for n in so.num_all_token_ids)  # running requests carry no tokens
        apply(sched, so, {"0": [100 + k], "1": [100 + k]})

    # Step 10: "0" needs a third block, so the tail of running ("1") is preempted.
    so = sched.schedule()
    assert scheduled(so) == {"0": 1}
    assert so.preempted_req_ids == ["1"]
    assert sched.get_request("1").status == RequestStatus.PREEMPTED
    outs = apply(sched, so, {"0": [110]})
    assert outs["0"].status == RequestStatus.FINISHED_LENGTH_CAPPED

    # Step 11: "1" comes back as a resumed request holding 24 prompt + 9 output tokens.
    so = sched.schedule()
    assert so.resumed_req_ids == ["1"]
    assert so.new_req_ids == []
    assert so.finished_req_ids == ["0"]
    expected = [1] * 24 + [100 + k for k in range(1, 10)]
    assert sched.get_request("1").output_token_ids == expected[24:]
    assert list(so.num_all_token_ids) == [33]
    assert all_tokens(so, "1") == expected
    assert scheduled(so) == {"1": 33}
    assert computed(so) == {"1": 0}
    assert len(block_table(so, "1")) == 3  # the whole table, replacing the old one


# -------------------------------------------------------- chunked prefill and threshold


def test_schedule_concurrent_partial_requests() -> None:
    """vLLM test_schedule_concurrent_partial_requests (APC off): 400/400/224 twice, then 1/1/352."""
    # Budget 1024, threshold 400, three 800-token prompts.
    sched = make_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    ids = add_requests(sched, 3, num_tokens=800)

    so = sched.schedule()
    assert so.new_req_ids == ids
    assert so.finished_req_ids == []
    assert scheduled(so) == {"0": 400, "1": 400, "2": 224}
    outs = apply(sched, so, {})
    assert all(not o.new_token_ids for o in outs.values())

    so1 = sched.schedule()
    assert sched.get_request_counts() == (3, 0)
    assert so1.new_req_ids == []
    assert so1.resumed_req_ids == []
    assert so1.finished_req_ids == []
    assert scheduled(so1) == {"0": 400, "1": 400, "2": 224}
    apply(sched, so1, {"0": [0], "1": [0]})

    so2 = sched.schedule()
    assert sched.get_request_counts() == (3, 0)
    assert so2.new_req_ids == []
    assert scheduled(so2) == {"0": 1, "1": 1, "2": 800 - 224 - 224}


def test_long_prefill_threshold_ignored_when_alone() -> None:
    """vLLM test_long_prefill_threshold_ignored_when_alone: a lone 2000-token prompt gets 1024."""
    sched = make_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    add_requests(sched, 1, num_tokens=2000)
    assert scheduled(sched.schedule()) == {"0": 1024}


def test_long_prefill_threshold_applies_with_other_requests() -> None:
    """vLLM test_long_prefill_threshold_applies_with_other_requests: 2000 and 10 give 400 and 10."""
    sched = make_scheduler(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    add_requests(sched, 1, num_tokens=2000)
    add_requests(sched, 1, num_tokens=10, req_ids=["short"])
    assert scheduled(sched.schedule()) == {"0": 400, "short": 10}


def test_long_prefill_threshold_floored_by_fair_share() -> None:
    """vLLM test_long_prefill_threshold_floored_by_fair_share: adaptive 100 floored to 512."""
    sched = make_scheduler(
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=100,
        long_prefill_token_threshold_adaptive=True,
    )
    add_requests(sched, 1, num_tokens=2000)
    add_requests(sched, 1, num_tokens=10, req_ids=["short"])
    assert scheduled(sched.schedule()) == {"0": 512, "short": 10}


@pytest.mark.parametrize("enable_chunked_prefill", [True, False])
def test_schedule_order(enable_chunked_prefill: bool) -> None:
    """vLLM test_schedule_order: chunking shares 1024 as 800 + 224; without it the loop breaks."""
    # Without chunking max_num_batched_tokens must cover M (vLLM's harness validated
    # the scheduler config with M = the budget).
    sched = make_scheduler(
        max_num_batched_tokens=1024,
        max_num_seqs=3,
        enable_chunked_prefill=enable_chunked_prefill,
        max_model_len=2048 if enable_chunked_prefill else 1024,
    )
    add_requests(sched, 2, num_tokens=800, req_ids=["1", "2"])
    add_requests(sched, 2, num_tokens=10, req_ids=["3", "4"])

    so = sched.schedule()
    if enable_chunked_prefill:
        assert so.new_req_ids == ["1", "2"]
        assert scheduled(so) == {"1": 800, "2": 224}
        assert sched.waiting_request_ids() == ["3", "4"]
    else:
        # 224 tokens of budget are left, but the waiting loop breaks on "2".
        assert so.new_req_ids == ["1"]
        assert scheduled(so) == {"1": 800}
        assert sched.waiting_request_ids() == ["2", "3", "4"]


# ---------------------------------------------------------------------- stop checks


def _decode_with_drafts(
    num_speculative_tokens: int, **request_kwargs: Any
) -> tuple[CheckedScheduler, list[str]]:
    """Two 10-token requests whose prefill has sampled token 7 each: C = 10, N = 11."""
    sched = make_scheduler(num_speculative_tokens=num_speculative_tokens)
    ids = add_requests(sched, 2, **request_kwargs)
    outs = step(sched, dict.fromkeys(ids, 7))
    assert all(not o.finished for o in outs.values())
    return sched, ids


def test_stop_via_update_from_output_eos() -> None:
    """vLLM test_stop_via_update_from_output case 1: a sampled EOS gives FINISHED_STOPPED."""
    sched, _ = _decode_with_drafts(1, max_tokens=10)
    sched.update_draft_token_ids(["1"], [[10]])
    so = sched.schedule()
    assert scheduled(so) == {"0": 1, "1": 2}
    assert spec_tokens(so) == {"1": [10]}
    outs = apply(sched, so, {"0": [EOS_TOKEN_ID], "1": [10, 11]})

    assert outs["0"].finished
    assert outs["0"].status == RequestStatus.FINISHED_STOPPED
    assert outs["0"].finish_reason == "stop"
    assert outs["0"].stop_reason is None
    assert outs["0"].new_token_ids == [EOS_TOKEN_ID]
    assert not outs["1"].finished
    assert outs["1"].new_token_ids == [10, 11]
    assert sched.running_request_ids() == ["1"]
    req1 = sched.get_request("1")
    assert req1.output_token_ids == [7, 10, 11]
    assert req1.num_computed_tokens == req1.num_tokens - 1
    with pytest.raises(UnknownRequestError):
        sched.get_request("0")
    assert "0" in sched.schedule().finished_req_ids


def test_stop_via_update_from_output_stop_token() -> None:
    """vLLM test_stop_via_update_from_output case 2: stop token sets stop_reason, trims after."""
    sched, _ = _decode_with_drafts(2, max_tokens=10, stop_token_ids=[42, 43])
    sched.update_draft_token_ids(["0", "1"], [[10, 42], [13]])
    so = sched.schedule()
    assert scheduled(so) == {"0": 3, "1": 2}
    assert spec_tokens(so) == {"0": [10, 42], "1": [13]}
    outs = apply(sched, so, {"0": [10, 42, 12], "1": [13, 14]})

    assert outs["0"].status == RequestStatus.FINISHED_STOPPED
    assert outs["0"].stop_reason == 42
    assert outs["0"].finish_reason == "stop"
    assert outs["0"].new_token_ids == [10, 42]
    assert outs["1"].new_token_ids == [13, 14]
    assert not outs["1"].finished
    assert sched.running_request_ids() == ["1"]
    assert sched.get_request("1").output_token_ids == [7, 13, 14]
    assert "0" in sched.schedule().finished_req_ids


def test_stop_via_update_from_output_max_tokens() -> None:
    """vLLM test_stop_via_update_from_output case 3: max_tokens trims and gives LENGTH_CAPPED."""
    # vLLM starts with no output and max_tokens=2; here the prefill already sampled one
    # token, so max_tokens=3 leaves the same 2 tokens for the draft step.
    sched, _ = _decode_with_drafts(2, max_tokens=3)
    sched.update_draft_token_ids(["0"], [[10, 11]])
    so = sched.schedule()
    assert scheduled(so) == {"0": 3, "1": 1}
    assert spec_tokens(so) == {"0": [10, 11]}
    outs = apply(sched, so, {"0": [10, 11, 12], "1": [13]})

    assert outs["0"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert outs["0"].finish_reason == "length"
    assert outs["0"].new_token_ids == [10, 11]  # truncated to max_tokens
    assert outs["1"].new_token_ids == [13]
    assert not outs["1"].finished
    assert sched.running_request_ids() == ["1"]
    assert sched.get_request("1").output_token_ids == [7, 13]
    assert "0" in sched.schedule().finished_req_ids


def test_stop_via_update_from_output_ignore_eos() -> None:
    """vLLM test_stop_via_update_from_output case 4: ignore_eos goes on past a sampled EOS."""
    sched = make_scheduler(num_speculative_tokens=2)
    add_requests(sched, 1, max_tokens=10, ignore_eos=True)
    step(sched, {"0": 7})
    sched.update_draft_token_ids(["0"], [[EOS_TOKEN_ID, 10]])
    so = sched.schedule()
    assert scheduled(so) == {"0": 3}
    outs = apply(sched, so, {"0": [EOS_TOKEN_ID, 10, 11]})

    assert not outs["0"].finished
    assert outs["0"].new_token_ids == [EOS_TOKEN_ID, 10, 11]
    assert sched.running_request_ids() == ["0"]
    req = sched.get_request("0")
    assert req.status == RequestStatus.RUNNING
    assert req.output_token_ids == [7, EOS_TOKEN_ID, 10, 11]


def _run_script(
    sched: CheckedScheduler, req_id: str, tokens: list[int]
) -> list[RequestOutput | None]:
    """Feed ``tokens`` one step at a time; the output of ``req_id`` after each step (None
    once it is no longer scheduled)."""
    seen: list[RequestOutput | None] = []
    for tok in tokens:
        so = sched.schedule()
        if req_id not in so.req_ids:
            seen.append(None)
            continue
        seen.append(apply(sched, so, {req_id: [tok]})[req_id])
    return seen


@pytest.mark.parametrize(
    ("request_kwargs", "tokens", "stops_at", "stop_reason"),
    [
        pytest.param({"min_tokens": 5}, [10, 11, 12], None, None, id="ordinary-below-min"),
        pytest.param({"min_tokens": 5}, [10, 11, EOS_TOKEN_ID], 3, None, id="eos-below-min"),
        pytest.param(
            {"min_tokens": 5, "eos_token_id": None}, [EOS_TOKEN_ID], None, None, id="ignore-eos"
        ),
        pytest.param({"min_tokens": 0}, [10, EOS_TOKEN_ID], 2, None, id="eos-no-min"),
        pytest.param(
            {"min_tokens": 5, "stop_token_ids": [42]}, [10, 11, 42], 3, 42, id="stop-below-min"
        ),
    ],
)
def test_check_stop_min_tokens(
    request_kwargs: dict[str, Any],
    tokens: list[int],
    stops_at: int | None,
    stop_reason: int | None,
) -> None:
    """vLLM test_check_stop_min_tokens: a sampled EOS or stop token stops below min_tokens."""
    sched = make_scheduler()
    kwargs = {"eos_token_id": EOS_TOKEN_ID, **request_kwargs}
    sched.add_request("r", [0, 1, 2], max_tokens=20, **kwargs)
    seen = _run_script(sched, "r", tokens)
    for i, out in enumerate(seen, start=1):
        assert out is not None
        assert out.new_token_ids == [tokens[i - 1]]
        assert out.finished == (i == stops_at)
    if stops_at is None:
        req = sched.get_request("r")
        assert req.status == RequestStatus.RUNNING
        assert req.output_token_ids == tokens
    else:
        last = seen[stops_at - 1]
        assert last is not None
        assert last.status == RequestStatus.FINISHED_STOPPED
        assert last.stop_reason == stop_reason
        assert not sched.has_unfinished_requests()


@pytest.mark.parametrize(
    ("max_model_len", "max_tokens", "min_tokens", "num_outputs"),
    [
        pytest.param(10, 500, 500, 7, id="max-model-len"),
        # min_tokens > max_tokens is refused (as vLLM's SamplingParams refuses it).
        pytest.param(100, 3, 3, 3, id="max-tokens-equal-to-min-tokens"),
    ],
)
def test_check_stop_length_cap_below_min_tokens(
    max_model_len: int, max_tokens: int, min_tokens: int, num_outputs: int
) -> None:
    """vLLM test_check_stop_length_cap_below_min_tokens: length caps fire below min_tokens."""
    sched = make_scheduler(max_model_len=max_model_len)
    sched.add_request(
        "r", [0, 1, 2], max_tokens=max_tokens, min_tokens=min_tokens, eos_token_id=None
    )
    tokens = list(range(10, 10 + num_outputs))
    seen = _run_script(sched, "r", tokens)
    assert all(out is not None for out in seen)
    assert [out.finished for out in seen if out is not None] == [False] * (num_outputs - 1) + [True]
    last = seen[-1]
    assert last is not None
    assert last.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert last.finish_reason == "length"
    assert not sched.has_unfinished_requests()


# ------------------------------------------------------------ several steps in flight


def test_schedule_concurrent_batches() -> None:
    """vLLM test_schedule_concurrent_batches (APC off): rescheduled while another is in flight."""
    sched = make_scheduler(max_num_batched_tokens=1024, max_num_seqs=2)
    sched.add_request("0", [0] * 512, max_tokens=16, eos_token_id=EOS_TOKEN_ID)
    so0 = sched.schedule()
    assert so0.new_req_ids == ["0"]
    assert scheduled(so0) == {"0": 512}

    # "0" is still in flight: only the new request is scheduled.
    sched.add_request("1", [1] * 512, max_tokens=16, eos_token_id=EOS_TOKEN_ID)
    so1 = sched.schedule()
    assert so1.new_req_ids == ["1"]
    assert scheduled(so1) == {"1": 512}

    apply(sched, so0, {"0": [0]})
    so2 = sched.schedule()
    assert scheduled(so2) == {"0": 1}

    outs = apply(sched, so1, {"1": [0]})
    assert outs["1"].new_token_ids == [0]
    apply(sched, so2, {"0": [0]})
    assert scheduled(sched.schedule()) == {"0": 1, "1": 1}


def test_preempt_during_execution() -> None:
    """vLLM test_preempt_during_execution: preempted in flight, its late token 42 is appended."""
    # 11 blocks (10 usable), two 80-token prompts of 5 blocks; "0"'s 6th block preempts "1".
    sched = make_scheduler(max_num_batched_tokens=100, block_size=16, num_gpu_blocks=11)
    add_requests(sched, 1, num_tokens=80)
    so0 = sched.schedule()
    assert scheduled(so0) == {"0": 80}
    assert len(block_table(so0, "0")) == 5

    # Scheduled while "0" is still running (several batches in flight, as with PP).
    add_requests(sched, 1, num_tokens=80, req_ids=["1"])
    so1 = sched.schedule()
    assert scheduled(so1) == {"1": 80}
    assert len(block_table(so1, "1")) == 5
    assert sched.num_free_blocks == 0

    apply(sched, so0, {"0": [0]})
    so2 = sched.schedule()  # "0" needs a 6th block: "1" is preempted
    assert scheduled(so2) == {"0": 1}
    assert so2.preempted_req_ids == ["1"]
    assert sched.running_request_ids() == ["0"]
    req1 = sched.get_request("1")
    assert req1.status == RequestStatus.PREEMPTED
    assert req1.num_computed_tokens == 0
    assert sched.waiting_request_ids() == ["1"]

    outs = apply(sched, so1, {"1": [42]})
    assert outs["1"].new_token_ids == [42]
    assert sched.get_request("1").output_token_ids == [42]


def _two_victims_with_output_in_flight(
    last_prompt_len: int,
) -> tuple[CheckedScheduler, SchedulerOutput, SchedulerOutput]:
    """4 usable blocks. "0" and "1" (one block each) have sampled; "2" and "3" (one block
    each) have their prefill output in flight when "0" and "1" each need a second block,
    which preempts "3" then "2". "1" is then aborted (2 blocks free) and "4" arrives."""
    sched = make_scheduler(num_gpu_blocks=5)
    add_requests(sched, 2, num_tokens=16)
    so0 = sched.schedule()
    assert scheduled(so0) == {"0": 16, "1": 16}
    add_requests(sched, 2, num_tokens=16, req_ids=["2", "3"])
    so1 = sched.schedule()
    assert scheduled(so1) == {"2": 16, "3": 16}
    assert sched.num_free_blocks == 0
    apply(sched, so0, {"0": [7], "1": [7]})

    so2 = sched.schedule()
    assert scheduled(so2) == {"0": 1, "1": 1}
    assert sorted(so2.preempted_req_ids) == ["2", "3"]
    assert sched.waiting_request_ids() == ["2", "3"]
    sched.finish_requests("1", RequestStatus.FINISHED_ABORTED)
    assert sched.num_free_blocks == 2
    sched.add_request("4", [4] * last_prompt_len, max_tokens=16, eos_token_id=EOS_TOKEN_ID)
    return sched, so1, so2


def test_prepend_skipped_requests_order() -> None:
    """vLLM test_prepend_skipped_requests_order: skipped requests go back in their order."""
    # The skip reason here: preempted with the pre-preemption output still in flight.
    # "4" needs 3 blocks and only 2 are free: the waiting loop ends on it.
    sched, so1, so2 = _two_victims_with_output_in_flight(last_prompt_len=48)
    so3 = sched.schedule()
    # "2" would fit in the 2 free blocks: only its in-flight output keeps it waiting.
    assert len(so3) == 0
    assert sched.waiting_request_ids() == ["2", "3", "4"]
    assert sched.get_request("2").status == RequestStatus.PREEMPTED

    # Once the old output is in (and delivered), "2" resumes first.
    outs = apply(sched, so1, {"2": [8], "3": [9]})
    assert outs["2"].new_token_ids == [8]
    assert outs["3"].new_token_ids == [9]
    apply(sched, so2, {"0": [7], "1": [7]})
    so4 = sched.schedule()
    assert so4.resumed_req_ids == ["2"]
    assert scheduled(so4) == {"0": 1, "2": 17}
    assert sched.waiting_request_ids() == ["3", "4"]


def test_skipped_waiting_request_does_not_starve_later_ones() -> None:
    """vLLM test_waiting_encoder_stall_does_not_starve_later_requests: skip, not break."""
    sched, _, _ = _two_victims_with_output_in_flight(last_prompt_len=16)
    so3 = sched.schedule()
    assert so3.new_req_ids == ["4"]
    assert scheduled(so3) == {"4": 16}
    assert sched.waiting_request_ids() == ["2", "3"]


# ---------------------------------------------------------------------- memory leak


def test_memory_leak() -> None:
    """vLLM test_memory_leak (APC off): after all requests finish, every block is free again."""
    sched = make_scheduler()
    produced: dict[str, list[int]] = {}
    finished: set[str] = set()

    def run_step() -> SchedulerOutput:
        so = sched.schedule()
        finished.update(so.finished_req_ids)
        for out in sched.update_from_output(so, one_token_each(so, 1000)):
            produced.setdefault(out.request_id, []).extend(out.new_token_ids)
        return so

    for i in range(5):
        add_requests(sched, 1, num_tokens=10, max_tokens=10, req_ids=[str(i)])
        run_step()
    while len(run_step()):
        pass

    assert finished == {str(i) for i in range(5)}
    assert produced == {str(i): [1000] * 10 for i in range(5)}
    assert sched.schedule().finished_req_ids == []
    assert not sched.has_requests()
    assert sched.get_num_unfinished_requests() == 0
    assert sched.get_request_counts() == (0, 0)
    assert sched.running_request_ids() == []
    assert sched.waiting_request_ids() == []
    num_gpu_blocks = sched.config.num_gpu_blocks
    assert sched.num_free_blocks == num_gpu_blocks - 1
    assert sorted(sched.free_block_queue()) == list(range(1, num_gpu_blocks))
    assert sched.get_kv_cache_usage() == 0.0
    sched.check_invariants()


# ----------------------------------------------------------------- KV cache, no APC


def test_null_block_and_free_block_queue_order() -> None:
    """vLLM free-block-queue tests (spec 5.2): null block 0, head reuse, freed tail first."""
    sched = make_scheduler(num_gpu_blocks=11)
    assert sched.num_free_blocks == 10
    assert sched.free_block_queue() == list(range(1, 11))
    assert sched.get_kv_cache_usage() == 0.0

    sched.add_request("0", [0] * 50, max_tokens=16)  # 4 blocks
    sched.add_request("1", [1] * 20, max_tokens=1)  # 2 blocks
    so = sched.schedule()
    assert block_table(so, "0") == [1, 2, 3, 4]
    assert block_table(so, "1") == [5, 6]
    assert sched.get_request("0").block_ids == [1, 2, 3, 4]
    assert sched.free_block_queue() == [7, 8, 9, 10]
    assert sched.num_free_blocks == 4
    assert sched.get_kv_cache_usage() == pytest.approx(0.6)

    # An abort frees "0"'s blocks, last block first, at the head of the queue.
    sched.finish_requests("0", RequestStatus.FINISHED_ABORTED)
    assert sched.free_block_queue() == [4, 3, 2, 1, 7, 8, 9, 10]
    # A normal finish (max_tokens=1) does the same; the aborted row is ignored.
    outs = apply(sched, so, {"0": [5], "1": [5]})
    assert outs["1"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert "0" not in outs
    assert sched.free_block_queue() == [6, 5, 4, 3, 2, 1, 7, 8, 9, 10]
    assert sched.num_free_blocks == 10

    # The head is reused first.
    sched.add_request("2", [2] * 40, max_tokens=16)  # 3 blocks
    so = sched.schedule()
    assert block_table(so, "2") == [6, 5, 4]
    assert sched.free_block_queue() == [3, 2, 1, 7, 8, 9, 10]


def test_preemption_frees_blocks_to_the_head() -> None:
    """vLLM test_preempt_during_execution (spec 3.2): preemption frees to the head, tail first."""
    sched = make_scheduler(max_num_batched_tokens=100, num_gpu_blocks=11)
    add_requests(sched, 1, num_tokens=80)
    so0 = sched.schedule()
    add_requests(sched, 1, num_tokens=80, req_ids=["1"])
    so1 = sched.schedule()
    assert block_table(so1, "1") == [6, 7, 8, 9, 10]
    apply(sched, so0, {"0": [0]})
    so2 = sched.schedule()
    assert so2.preempted_req_ids == ["1"]
    # "1" freed [10, 9, 8, 7, 6] to the head; "0" took 10.
    assert block_table(so2, "0") == [10]
    assert sched.free_block_queue() == [9, 8, 7, 6]


@pytest.mark.parametrize(
    ("num_lookahead_tokens", "max_model_len", "expected_blocks"),
    [
        pytest.param(0, 100, 1, id="no-lookahead"),
        pytest.param(2, 100, 2, id="3+2"),
        pytest.param(4, 100, 2, id="3+4"),
        pytest.param(6, 100, 3, id="3+6"),
        pytest.param(6, 8, 2, id="capped-at-M"),
    ],
)
def test_allocate_with_lookahead(
    num_lookahead_tokens: int, max_model_len: int, expected_blocks: int
) -> None:
    """vLLM test_allocate_with_lookahead: ceil((3 + L) / 4) blocks, lookahead capped at M."""
    sched = make_scheduler(
        block_size=4,
        num_gpu_blocks=10,
        max_model_len=max_model_len,
        num_speculative_tokens=5,
        num_lookahead_tokens=num_lookahead_tokens,
    )
    sched.add_request("0", [0, 1, 2], max_tokens=4)
    so = sched.schedule()
    assert scheduled(so) == {"0": 3}
    assert len(block_table(so, "0")) == expected_blocks
    assert sched.num_free_blocks == 9 - expected_blocks


def test_prefix_caching_disabled_allocates_fresh_blocks() -> None:
    """vLLM test_basic_prefix_caching_disabled: no hit on a shared prefix, fresh blocks."""
    # vLLM's pool: 4 usable blocks of 4 tokens, which hold a request of 17 tokens.
    sched = make_scheduler(block_size=4, num_gpu_blocks=5)
    sched.add_request("1", list(range(10)), max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"1": 0}
    assert len(block_table(so, "1")) == 3
    outs = apply(sched, so, {"1": [0]})
    assert outs["1"].finished
    assert sched.num_free_blocks == 4

    sched.add_request("2", list(range(16)), max_tokens=1)
    sched.add_request("3", list(range(5)), max_tokens=1)
    so = sched.schedule()
    assert scheduled(so) == {"2": 16}
    assert computed(so) == {"2": 0}
    assert len(block_table(so, "2")) == 4
    # "3" needs 2 blocks and none is free: it waits, holding none.
    assert sched.waiting_request_ids() == ["3"]
    assert sched.get_request("3").block_ids == []


@pytest.mark.parametrize("watermark", [0.0, 0.2])
def test_watermark_applies_to_admissions_only(watermark: float) -> None:
    """vLLM KVCacheManager watermark: kept free for waiting admissions while others run."""
    sched = make_scheduler(num_gpu_blocks=11, watermark=watermark)
    sched.add_request("0", [0] * 144, max_tokens=4)  # 9 blocks of the 10
    sched.add_request("1", [1] * 16, max_tokens=4)  # 1 block
    so = sched.schedule()
    if watermark:
        # "0" is admitted though 9 + 2 > 10: nothing was running yet.
        assert scheduled(so) == {"0": 144}
        assert sched.waiting_request_ids() == ["1"]
    else:
        assert scheduled(so) == {"0": 144, "1": 16}
    apply(sched, so, {req_id: [7] for req_id in so.req_ids})

    so = sched.schedule()
    # "0" needs its 10th block; running requests ignore the watermark.
    assert "0" in scheduled(so)
    assert len(block_table(so, "0")) == 1
    if watermark:
        assert scheduled(so) == {"0": 1}
        assert sched.waiting_request_ids() == ["1"]
        assert sched.num_free_blocks == 0


def test_watermark_blocks_count_the_null_block() -> None:
    """vLLM KVCacheManager: watermark blocks = int(watermark * num_gpu_blocks), null included."""
    # int(0.19 * 11) = 2 blocks; over the 10 usable blocks it would be int(1.9) = 1.
    sched = make_scheduler(num_gpu_blocks=11, watermark=0.19)
    sched.add_request("0", [0] * 128, max_tokens=4)  # 8 blocks: 2 left
    sched.add_request("1", [1] * 16, max_tokens=4)  # 1 block + 2 kept free > 2
    so = sched.schedule()
    assert scheduled(so) == {"0": 128}
    assert sched.waiting_request_ids() == ["1"]
    assert sched.num_free_blocks == 2


@pytest.mark.parametrize("reserve_full_isl", [True, False])
def test_scheduler_reserve_full_isl(reserve_full_isl: bool) -> None:
    """vLLM scheduler_reserve_full_isl: admission needs the whole prompt's blocks free."""
    sched = make_scheduler(
        num_gpu_blocks=11, max_num_batched_tokens=64, scheduler_reserve_full_isl=reserve_full_isl
    )
    sched.add_request("0", [0] * 64, max_tokens=2)  # 4 blocks
    sched.add_request("1", [1] * 112, max_tokens=2)  # 7 blocks
    so = sched.schedule()
    assert scheduled(so) == {"0": 64}
    apply(sched, so, {"0": [7]})

    so = sched.schedule()  # "0" takes a 5th block: 5 free
    if reserve_full_isl:
        assert scheduled(so) == {"0": 1}
        assert sched.waiting_request_ids() == ["1"]
    else:
        assert scheduled(so) == {"0": 1, "1": 63}
        assert len(block_table(so, "1")) == 4
    outs = apply(sched, so, {"0": [8]})
    assert outs["0"].status == RequestStatus.FINISHED_LENGTH_CAPPED

    if reserve_full_isl:
        so = sched.schedule()  # "0" freed its blocks: all 7 fit now
        assert so.new_req_ids == ["1"]
        assert scheduled(so) == {"1": 64}
