"""vLLM 0.33.0's spec-decode, padding and async checks (spec §7), without prefix caching
and without the priority policy.

Ported from ``tests/v1/core/test_async_scheduler.py`` (items 1, 2, 3 and 8) and
``tests/v1/core/test_scheduler.py`` (items 21, 66, 68, 72 to 76 and 78), plus the padding
facts of spec §3.5. Where vLLM gets a request with ``C > 0`` from a prefix-cache hit or a
KV connector, these tests add it with ``add_request(..., num_computed_tokens=C)``: the
scheduler then sees the same ``N - C`` that vLLM's waiting loop sees.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence

import pytest

from llmsched import (
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
    UnknownRequestError,
)

from conftest import (
    EOS_TOKEN_ID,
    CheckedScheduler,
    PipelinedRunner,
    add_requests,
    make_scheduler,
    one_token_each,
    runner_output,
    scheduled,
    spec_tokens,
)

# ---------------------------------------------------------------------------- helpers


def _by_position(so: SchedulerOutput) -> ModelRunnerOutput:
    """Request ``i`` of the step samples token ``i`` (vLLM's async test helper)."""
    return runner_output(so, [[i] for i in range(len(so))])


class _Log:
    """What the scheduler handed back, request by request: delivered tokens and the
    finished status (live requests can be read with ``get_request``, finished ones not)."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.final: dict[str, RequestStatus] = {}

    def record(self, outputs: Sequence[RequestOutput]) -> None:
        for out in outputs:
            assert out.request_id not in self.final, f"{out.request_id} produced after finishing"
            self.tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                self.final[out.request_id] = out.status


def _add(
    sched: CheckedScheduler,
    req_id: str,
    num_tokens: int,
    *,
    max_tokens: int = 16,
    num_computed_tokens: int = 0,
) -> None:
    sched.add_request(
        req_id,
        [0] * num_tokens,
        max_tokens=max_tokens,
        eos_token_id=EOS_TOKEN_ID,
        num_computed_tokens=num_computed_tokens,
    )


# ------------------------------------------------- test_async_scheduler.py, item 1


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens: int) -> None:
    """vLLM test_stop_by_max_tokens: async, no step is scheduled that max_tokens makes useless."""
    sched = make_scheduler(async_scheduling=True)
    log = _Log()
    in_flight: deque[SchedulerOutput] = deque()
    expected_total = 0

    add_requests(sched, 1, max_tokens=max_tokens, req_ids=["0"])
    in_flight.append(sched.schedule())
    expected_total += 10 + max_tokens - 1
    add_requests(sched, 1, max_tokens=max_tokens, req_ids=["1"])
    in_flight.append(sched.schedule())
    expected_total += 10 + max_tokens - 1

    total = 0
    while in_flight:
        so = in_flight.popleft()
        total += so.total_num_scheduled_tokens
        log.record(sched.update_from_output(so, _by_position(so)))
        so = sched.schedule()
        if len(so):
            in_flight.append(so)

    assert sched.get_num_unfinished_requests() == 0
    for req_id in ("0", "1"):
        assert len(log.tokens[req_id]) == max_tokens
        assert log.final[req_id] == RequestStatus.FINISHED_LENGTH_CAPPED
    # Prompt plus max_tokens - 1 decode positions each, and not one token more.
    assert total == expected_total


# ------------------------------------------------- test_async_scheduler.py, item 2


def test_no_spec_decode_padding_up_to_max_model_len() -> None:
    """vLLM test_no_spec_decode_padding_up_to_max_model_len (#53962): no room, no padding."""
    max_model_len, num_spec = 32, 1
    sched = make_scheduler(
        async_scheduling=True, max_model_len=max_model_len, num_speculative_tokens=num_spec
    )
    # A decoding filler makes "a running request was scheduled in this step" true.
    _add(sched, "filler", 4)
    so = sched.schedule()
    sched.update_from_output(so, _by_position(so))

    # A decode-worker style arrival: all but the last prompt token already computed.
    prompt_len = max_model_len - num_spec
    _add(sched, "boundary", prompt_len, num_computed_tokens=prompt_len - 1)
    so = sched.schedule()
    # Padded it would be C + (1 + K) + s = 30 + 2 + 1 = 33 > 32: one token, unpadded.
    assert scheduled(so)["boundary"] == 1
    assert "boundary" not in spec_tokens(so)
    assert sched.get_request("boundary").num_computed_tokens < max_model_len

    log = _Log()
    log.record(sched.update_from_output(so, _by_position(so)))
    assert log.final["boundary"] == RequestStatus.FINISHED_LENGTH_CAPPED


def test_spec_decode_padding_allowed_when_it_fits_max_model_len_exactly() -> None:
    """Spec §3.5 (#53962 guard): C + (1 + K) + s == M still pads; the next async step skips it."""
    max_model_len, num_spec = 32, 1
    sched = make_scheduler(
        async_scheduling=True, max_model_len=max_model_len, num_speculative_tokens=num_spec
    )
    _add(sched, "filler", 4)
    so = sched.schedule()
    sched.update_from_output(so, _by_position(so))

    prompt_len = max_model_len - num_spec - 1
    _add(sched, "edge", prompt_len, num_computed_tokens=prompt_len - 1)
    first = sched.schedule()
    # 29 + 2 + 1 = 32 <= 32: padded to the uniform 1 + K shape.
    assert scheduled(first)["edge"] == 1 + num_spec
    assert spec_tokens(first)["edge"] == [-1] * num_spec
    # Scheduled again before that output returns: no room is left (M - C - s = 0).
    second = sched.schedule()
    assert "edge" not in scheduled(second)

    log = _Log()
    log.record(sched.update_from_output(first, _by_position(first)))
    log.record(sched.update_from_output(second, _by_position(second)))
    # The placeholder was rejected: C is rolled back to N - 1.
    edge = sched.get_request("edge")
    assert (edge.num_tokens, edge.num_computed_tokens) == (prompt_len + 1, prompt_len)
    third = sched.schedule()
    assert scheduled(third)["edge"] == 1
    assert "edge" not in spec_tokens(third)
    log.record(sched.update_from_output(third, _by_position(third)))
    assert log.final["edge"] == RequestStatus.FINISHED_LENGTH_CAPPED
    assert len(log.tokens["edge"]) == 2


# ------------------------------------------------- test_async_scheduler.py, item 3


def test_abort() -> None:
    """vLLM test_abort: async, aborts with two steps in flight; late outputs are ignored."""
    sched = make_scheduler(async_scheduling=True)
    req_ids = add_requests(sched, 10, max_tokens=20)
    in_flight = deque([sched.schedule(), sched.schedule()])
    abort_order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    to_abort = list(abort_order)
    log = _Log()
    reported_finished: set[str] = set()

    while in_flight:
        if to_abort:
            req_id = str(to_abort.pop(0))
            assert sched.finish_requests(req_id, RequestStatus.FINISHED_ABORTED) == [req_id]
        so = in_flight.popleft()
        log.record(sched.update_from_output(so, _by_position(so)))
        so = sched.schedule()
        reported_finished.update(so.finished_req_ids)
        if len(so):
            in_flight.append(so)

    assert not sched.has_unfinished_requests()
    assert log.final == {}  # nothing finished on its own: every request was aborted
    assert reported_finished == set(req_ids)
    for i, req_id in enumerate(req_ids):
        with pytest.raises(UnknownRequestError):
            sched.get_request(req_id)
        assert len(log.tokens[req_id]) == abort_order.index(i)


# ------------------------------------------------- test_async_scheduler.py, item 8


class _PipelinedDriver(PipelinedRunner):
    """``PipelinedRunner`` whose ``accept`` gets the number of ``schedule()`` calls so far;
    it logs every output and counts preemptions of requests with output in flight."""

    def __init__(
        self,
        sched: CheckedScheduler,
        depth: int,
        accept: Callable[[int, str, int], int],
    ) -> None:
        super().__init__(sched, depth, accept)
        self.log = _Log()
        self.preempted_with_output_in_flight = 0

    def clock(self) -> int:
        return self.num_schedules

    def on_scheduled(self, so: SchedulerOutput) -> None:
        for req_id in so.preempted_req_ids:
            if self.sched.get_request(req_id).num_in_flight_tokens > 0:
                self.preempted_with_output_in_flight += 1

    def on_outputs(self, outs: Sequence[RequestOutput]) -> None:
        self.log.record(outs)

    def run(self, before_step: Callable[[], None], max_iterations: int = 2000) -> None:
        super().run(lambda _: before_step(), max_iterations)


@pytest.mark.parametrize("num_spec", [0, 3])
def test_kv_pressure_preemption_with_inflight_output(num_spec: int) -> None:
    """vLLM test_kv_pressure_preemption_with_inflight_output: no token lost, duplicated or moved."""
    max_tokens, prompt_len = 24, 8
    sched = make_scheduler(
        async_scheduling=True,
        num_speculative_tokens=num_spec,
        num_gpu_blocks=5,
        block_size=16,
        max_num_batched_tokens=512,
    )
    req_ids = [str(i) for i in range(8)]
    pending = list(req_ids)

    def arrive() -> None:
        if pending:
            req_id = pending.pop(0)
            add_requests(
                sched,
                1,
                num_tokens=prompt_len,
                max_tokens=max_tokens,
                ignore_eos=True,
                req_ids=[req_id],
            )

    arrive()
    arrive()
    # PP = 3 emulated: a batch queue of 4 steps. Acceptance varies by step and request,
    # so that stale spec outputs carry rejections.
    engine = _PipelinedDriver(
        sched, depth=4, accept=lambda step, req_id, k: (step + int(req_id)) % (k + 1)
    )
    engine.run(before_step=arrive)

    assert engine.preempted_with_output_in_flight > 0, "no preemption with output in flight"
    assert not sched.has_requests()
    for req_id in req_ids:
        assert engine.log.final[req_id] == RequestStatus.FINISHED_LENGTH_CAPPED
        delivered = engine.log.tokens[req_id]
        assert len(delivered) == max_tokens
        # Lossless and in order; the tail sampled after the finish is dropped.
        assert delivered == engine.sampled[req_id][:max_tokens]
        # The i-th output was sampled for position Np + i: a stale token never lands
        # on a position that the resumed request sampled again.
        assert [engine.position_of[t] for t in delivered] == list(
            range(prompt_len, prompt_len + max_tokens)
        )


# ------------------------------------------------------ test_scheduler.py, item 21


def test_async_scheduling_pp_allows_rescheduling_with_output_placeholders() -> None:
    """vLLM test_async_scheduling_pp_allows_rescheduling_with_output_placeholders (V1 runner)."""
    sched = make_scheduler(async_scheduling=True)
    (req_id,) = add_requests(sched, 1, num_tokens=8)
    first = sched.schedule()
    assert sched.get_request(req_id).num_output_placeholders > 0
    # Before any output comes back, the request is scheduled again (one in-flight token).
    second = sched.schedule()
    assert scheduled(second) == {req_id: 1}
    assert sched.get_request(req_id).num_output_placeholders == 2

    sched.update_from_output(first, one_token_each(first, 7))
    sched.update_from_output(second, one_token_each(second, 8))
    req = sched.get_request(req_id)
    assert req.output_token_ids == [7, 8]
    assert (req.num_computed_tokens, req.num_output_placeholders) == (9, 0)


# ------------------------------------------------------ test_scheduler.py, item 66


def test_draft_slots_budgeted_per_scheduled_request() -> None:
    """vLLM test_draft_slots_budgeted_per_scheduled_request: 3 draft slots charged per request."""
    sched = make_scheduler(
        max_num_batched_tokens=20, num_speculative_tokens=4, max_num_new_slots_for_drafting=3
    )
    assert sched.config.max_num_scheduled_tokens == 20
    add_requests(sched, 2, num_tokens=10)
    # 20 - 3 leaves 17 for "0" (takes 10); then 20 - 13 - 3 = 4 for "1".
    assert scheduled(sched.schedule()) == {"0": 10, "1": 4}


# ------------------------------------------------------ test_scheduler.py, item 68


@pytest.mark.parametrize(
    ("drafts", "outputs", "num_draft_tokens", "num_accepted_tokens"),
    [
        ([[1, 2, 3]], [[1, 2, 3, 4]], 3, 3),  # all accepted
        ([[1, 2, 3]], [[1, 5]], 3, 1),  # mismatch at the second draft
        ([[1, 2], [3]], [[1, 2, 5], [3, 4]], 3, 3),  # two requests
        ([[1]], [[1, 2]], 1, 1),  # one draft
        ([[]], [[5]], 0, 0),  # no draft at all
        ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7], [4, 8]], 6, 3),  # several mismatches
    ],
)
def test_schedule_spec_decoding_stats(
    drafts: list[list[int]],
    outputs: list[list[int]],
    num_draft_tokens: int,
    num_accepted_tokens: int,
) -> None:
    """vLLM test_schedule_spec_decoding_stats: 1 + len(drafts) scheduled, drafts in the stats."""
    num_spec = max(1, *(len(d) for d in drafts))
    sched = make_scheduler(num_speculative_tokens=num_spec)
    req_ids = add_requests(sched, len(drafts), num_tokens=1)

    so = sched.schedule()
    assert so.new_req_ids == req_ids
    assert so.total_num_scheduled_tokens == len(req_ids)
    assert scheduled(so) == dict.fromkeys(req_ids, 1)
    assert spec_tokens(so) == {}
    sched.update_from_output(so, one_token_each(so))
    sched.update_draft_token_ids(req_ids, drafts)
    for req_id, draft in zip(req_ids, drafts, strict=True):
        req = sched.get_request(req_id)
        assert req.num_computed_tokens == 1  # the prompt token
        assert req.num_tokens == 2  # and the sampled one
        assert req.num_tokens_with_spec == 2 + len(draft)
    stats = sched.stats()
    assert (stats["num_draft_tokens"], stats["num_accepted_tokens"]) == (0, 0)

    so = sched.schedule()
    assert so.new_req_ids == []
    assert so.total_num_scheduled_tokens == len(req_ids) + sum(len(d) for d in drafts)
    assert scheduled(so) == {r: 1 + len(d) for r, d in zip(req_ids, drafts, strict=True)}
    assert spec_tokens(so) == {r: d for r, d in zip(req_ids, drafts, strict=True) if d}
    sched.update_from_output(so, runner_output(so, outputs))

    stats = sched.stats()
    assert stats["num_draft_tokens"] == num_draft_tokens
    assert stats["num_accepted_tokens"] == num_accepted_tokens
    for req_id in req_ids:
        req = sched.get_request(req_id)
        assert req.num_computed_tokens == req.num_tokens - 1  # rejected drafts rolled back


# ------------------------------------------------------ test_scheduler.py, item 72


def test_spec_decoding_stats_empty_output() -> None:
    """vLLM test_spec_decoding_stats_empty_output: an empty row for a draft step counts nothing."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec)
    (req_id,) = add_requests(sched, 1, num_tokens=1)
    so = sched.schedule()
    assert so.new_req_ids == [req_id]
    sched.update_from_output(so, one_token_each(so))
    sched.update_draft_token_ids([req_id], [[1, 2, 3]])
    so = sched.schedule()
    assert spec_tokens(so) == {req_id: [1, 2, 3]}

    # An empty row (an error on the runner's side): no stats, no crash. vLLM then leaves
    # C ahead of N - 1 and never schedules the request again; llmsched undoes the step's
    # draft and sampled positions (a deliberate deviation) so the request samples again.
    outputs = sched.update_from_output(so, runner_output(so, [[]]))
    assert outputs == []
    stats = sched.stats()
    assert (stats["num_draft_tokens"], stats["num_accepted_tokens"]) == (0, 0)
    req = sched.get_request(req_id)
    assert req.status == RequestStatus.RUNNING
    assert req.num_computed_tokens == req.num_tokens - 1 == 1
    so = sched.schedule()
    assert scheduled(so) == {req_id: 1}
    outputs = sched.update_from_output(so, one_token_each(so, token=7))
    assert [o.new_token_ids for o in outputs] == [[7]]


# ------------------------------------------------------ test_scheduler.py, item 73


def test_no_spec_tokens_scheduled_for_prefill_chunks() -> None:
    """vLLM test_no_spec_tokens_scheduled_for_prefill_chunks: mid-prefill drafts are dropped."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec, max_num_batched_tokens=50)
    (req_id,) = add_requests(sched, 1, num_tokens=80)

    so = sched.schedule()
    assert so.new_req_ids == [req_id]
    assert scheduled(so) == {req_id: 50}
    sched.update_from_output(so, runner_output(so, [[]]))
    sched.update_draft_token_ids([req_id], [[1, 2, 3]])
    assert sched.get_request(req_id).spec_token_ids == []

    so = sched.schedule()
    assert scheduled(so) == {req_id: 30}  # the rest of the prompt, not 30 + 3
    assert spec_tokens(so) == {}
    sched.update_from_output(so, runner_output(so, [[42]]))
    sched.update_draft_token_ids([req_id], [[1, 2, 3]])
    assert sched.get_request(req_id).spec_token_ids == [1, 2, 3]

    so = sched.schedule()
    assert scheduled(so) == {req_id: 1 + num_spec}
    assert spec_tokens(so) == {req_id: [1, 2, 3]}


# ------------------------------------------------- test_scheduler.py, items 74-76, 78


def _running_spec_decode(sched: CheckedScheduler, req_id: str = "r1") -> None:
    """Prefill a 33-token prompt, then give it 3 real drafts: a running spec decode."""
    _add(sched, req_id, 33)
    so = sched.schedule()
    assert scheduled(so) == {req_id: 33}
    sched.update_from_output(so, runner_output(so, [[100]]))
    sched.update_draft_token_ids([req_id], [[1, 2, 3]])


def test_spec_decode_padding_first_decode_step() -> None:
    """vLLM test_spec_decode_padding_first_decode_step: 1-token admission padded to 1 + K."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec)
    _running_spec_decode(sched)
    # vLLM gets C = 32 of 33 from a prefix hit; here the request arrives with it.
    _add(sched, "r2", 33, num_computed_tokens=32)

    so = sched.schedule()
    assert so.new_req_ids == ["r2"]
    assert spec_tokens(so)["r1"] == [1, 2, 3]
    assert scheduled(so)["r2"] == 1 + num_spec
    assert spec_tokens(so)["r2"] == [-1] * num_spec


def test_spec_decode_padding_one_token_prompt_beside_running_decode() -> None:
    """Spec §3.5: a new 1-token prompt (C = 0) is padded when a running request was scheduled."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec)
    _running_spec_decode(sched)
    _add(sched, "tiny", 1)

    so = sched.schedule()
    assert scheduled(so) == {"r1": 1 + num_spec, "tiny": 1 + num_spec}
    assert spec_tokens(so) == {"r1": [1, 2, 3], "tiny": [-1] * num_spec}
    sched.update_from_output(so, runner_output(so, [[1, 101], [102]]))
    tiny = sched.get_request("tiny")
    assert (tiny.num_tokens, tiny.num_computed_tokens) == (2, 1)


def test_spec_decode_padding_resumed_request_without_running_requests() -> None:
    """vLLM test_spec_decode_padding_resumed_request_without_running_requests (#55126)."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec)
    _add(sched, "resumed", 33, num_computed_tokens=32)

    so = sched.schedule()
    assert scheduled(so) == {"resumed": 1 + num_spec}
    assert spec_tokens(so) == {"resumed": [-1] * num_spec}
    # The placeholders are always rejected: one real token, C rolled back to N - 1.
    sched.update_from_output(so, runner_output(so, [[100]]))
    req = sched.get_request("resumed")
    assert req.output_token_ids == [100]
    assert req.num_computed_tokens == 33


def test_spec_decode_padding_skipped_for_diffusion() -> None:
    """vLLM test_spec_decode_padding_skipped_for_diffusion: s = 0 never pads."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec, num_sampled_tokens_per_step=0)
    # The same arrival that is padded when s = 1 (see the test above).
    _add(sched, "r2", 33, num_computed_tokens=32)

    so = sched.schedule()
    assert scheduled(so) == {"r2": 1}
    assert spec_tokens(so) == {}


def test_spec_decode_padding_skipped_with_prefill_in_batch() -> None:
    """vLLM test_spec_decode_padding_skipped_with_prefill_in_batch: a prefill chunk: no pad."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec, max_num_batched_tokens=64)
    _add(sched, "long", 100)
    so = sched.schedule()
    assert scheduled(so) == {"long": 64}
    sched.update_from_output(so, runner_output(so, [[]]))
    assert sched.get_request("long").is_prefill_chunk

    _add(sched, "candidate", 33, num_computed_tokens=32)
    so = sched.schedule()
    # The budget (64 - 36 = 28) would allow 1 + K; the prefill chunk in the batch does not.
    assert scheduled(so) == {"long": 36, "candidate": 1}
    assert spec_tokens(so) == {}


# ---------------------------------------------------------- spec §3.5 padding facts


def test_padding_breaks_waiting_loop_when_padded_size_exceeds_budget() -> None:
    """Spec §3.5: padded size > budget (room under M) breaks the waiting loop, no unpadded token."""
    num_spec = 3
    sched = make_scheduler(
        num_speculative_tokens=num_spec, max_num_seqs=4, max_num_batched_tokens=6
    )
    _add(sched, "r1", 4)
    so = sched.schedule()
    sched.update_from_output(so, runner_output(so, [[100]]))
    sched.update_draft_token_ids(["r1"], [[1, 2, 3]])
    _add(sched, "candidate", 33, num_computed_tokens=32)
    _add(sched, "behind", 2)

    so = sched.schedule()
    # r1 takes 4 of 6; the padded 4 does not fit in 2: no unpadded token, and no skip
    # to "behind" either (which would fit).
    assert scheduled(so) == {"r1": 1 + num_spec}
    assert sched.get_request_counts() == (1, 2)

    sched.update_from_output(so, runner_output(so, [[1, 101]]))  # one draft accepted
    so = sched.schedule()
    # r1 now needs 1 token: 5 left, the padded shape fits.
    assert scheduled(so) == {"r1": 1, "candidate": 1 + num_spec, "behind": 1}
    assert spec_tokens(so) == {"candidate": [-1] * num_spec}


def test_no_room_for_padding_schedules_one_token_and_keeps_admitting() -> None:
    """Spec §3.5: no room under M for 1 + K schedules 1 token unpadded and never breaks."""
    max_model_len, num_spec = 32, 1
    sched = make_scheduler(max_model_len=max_model_len, num_speculative_tokens=num_spec)
    _add(sched, "filler", 4)
    so = sched.schedule()
    sched.update_from_output(so, runner_output(so, [[100]]))
    sched.update_draft_token_ids(["filler"], [[7]])
    _add(sched, "boundary", 31, num_computed_tokens=30)
    _add(sched, "behind", 3)

    so = sched.schedule()
    assert scheduled(so) == {"filler": 1 + num_spec, "boundary": 1, "behind": 3}
    assert spec_tokens(so) == {"filler": [7]}

    log = _Log()
    log.record(sched.update_from_output(so, runner_output(so, [[101], [102], [103]])))
    assert log.final == {"boundary": RequestStatus.FINISHED_LENGTH_CAPPED}
    assert log.tokens["boundary"] == [102]


def test_long_prefill_threshold_below_padded_size_does_not_pad() -> None:
    """#54028 (deliberate deviation): 0 < threshold < 1 + K does not pad, so no crash."""
    num_spec = 3
    sched = make_scheduler(num_speculative_tokens=num_spec, long_prefill_token_threshold=2)
    _running_spec_decode(sched)
    _add(sched, "r2", 33, num_computed_tokens=32)

    # vLLM 0.33.0 pads r2 to 4, clips it to 2 and fails its `n == 1 + K` assert.
    so = sched.schedule()
    # The threshold caps r1 too (2 tokens, so one of its drafts), and r2 keeps its 1 token.
    assert scheduled(so) == {"r1": 2, "r2": 1}
    assert spec_tokens(so) == {"r1": [1]}
