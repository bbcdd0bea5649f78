"""The priority policy (``SchedulerConfig(policy="priority")``).

Written anew against llmsched's public API from what vLLM 0.33.0's priority tests pin down
(spec §7.3 tag P items 90-100 and 105, and the two files of spec §7.4):

* the waiting queue is a heap ordered by ``(priority, arrival_time, request_id)``, lower
  first (spec §1.1, §1.3), for the plain queue and for the KV-holding one alike;
* under KV pressure the running loop preempts ``max(running, key=(priority, arrival))``,
  the first such in running order, not the tail of ``running`` (spec §3.1 step 9);
* a victim that sits before the request being scheduled is removed without skipping the
  requests behind it, and if it was already scheduled in this step its tokens are given
  back and it leaves the step's output (spec §3.1 step 9);
* a request that preempts itself lets the running loop continue (spec §3.4).

Each test's docstring names the vLLM test it follows. Numbers are vLLM's wherever the API
allows; ``num_gpu_blocks`` counts the null block, as vLLM's ``num_blocks`` does.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest

from llmsched import (
    ModelRunnerOutput,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
    SimulatedModelRunner,
)

from conftest import (
    EOS_TOKEN_ID,
    CheckedScheduler,
    make_config,
    make_scheduler,
    runner_output,
    scheduled,
)

# ------------------------------------------------------------------------------ helpers


def priority_scheduler(**overrides: Any) -> CheckedScheduler:
    """vLLM's ``create_scheduler_with_priority``: the test defaults, policy priority, and
    ``max_model_len`` equal to ``max_num_batched_tokens`` unless given."""
    overrides.setdefault("max_model_len", overrides.get("max_num_batched_tokens", 8192))
    return make_scheduler(policy="priority", **overrides)


def add_prioritized(
    sched: CheckedScheduler,
    priorities: list[int],
    arrival_times: list[float] | None = None,
    *,
    num_tokens: int = 10,
    max_tokens: int = 16,
    req_ids: list[str] | None = None,
    first_token: int = 0,
) -> list[str]:
    """vLLM's ``create_requests_with_priority``: ids ``"0".."n-1"`` (or ``req_ids``),
    prompt ``[i] * num_tokens``, arrival times ``0.0, 1.0, ...`` unless given."""
    n = len(priorities)
    arrivals = arrival_times if arrival_times is not None else [float(i) for i in range(n)]
    ids = req_ids if req_ids is not None else [str(i) for i in range(n)]
    assert len(arrivals) == n and len(ids) == n
    for i, (req_id, priority, arrival) in enumerate(zip(ids, priorities, arrivals, strict=True)):
        sched.add_request(
            req_id,
            [first_token + i] * num_tokens,
            max_tokens=max_tokens,
            eos_token_id=EOS_TOKEN_ID,
            priority=priority,
            arrival_time=arrival,
        )
    return ids


def admitted(so: SchedulerOutput) -> list[str]:
    """New and resumed requests of ``so``, in admission order."""
    fresh = set(so.new_req_ids) | set(so.resumed_req_ids)
    return [req_id for req_id in so.req_ids if req_id in fresh]


def sample(
    sched: CheckedScheduler, so: SchedulerOutput, token: int = 100
) -> dict[str, RequestOutput]:
    """Apply ``so`` (sync): every request whose step reaches the end of its known tokens
    samples ``token``; a non-final prefill chunk samples nothing."""
    rows = []
    for req_id, n, c in zip(
        so.req_ids, so.num_scheduled_tokens, so.num_computed_tokens, strict=True
    ):
        done = int(c) + int(n) >= sched.get_request(req_id).num_tokens
        rows.append([token] if done else [])
    outs = sched.update_from_output(so, runner_output(so, rows))
    return {out.request_id: out for out in outs}


def step(sched: CheckedScheduler, token: int = 100) -> SchedulerOutput:
    """One sync step: schedule, then apply with ``sample``."""
    so = sched.schedule()
    sample(sched, so, token)
    return so


def all_tokens(so: SchedulerOutput, req_id: str) -> list[int]:
    """The ``all_token_ids`` that ``so`` carries for ``req_id``."""
    offsets = [0]
    for count in so.num_all_token_ids:
        offsets.append(offsets[-1] + int(count))
    i = so.req_ids.index(req_id)
    return [int(t) for t in so.all_token_ids[offsets[i] : offsets[i + 1]]]


def status(sched: CheckedScheduler, req_id: str) -> RequestStatus:
    return RequestStatus(sched.get_request(req_id).status)


# ------------------------------------------------------------ waiting order (90-92, 98)


def test_basic_ordering() -> None:
    """vLLM test_priority_scheduling_basic_ordering: priorities [2, 0, 1] admit 1, 2, 0."""
    sched = priority_scheduler()
    add_prioritized(sched, [2, 0, 1], [1.0, 2.0, 3.0])
    assert sched.waiting_request_ids() == ["1", "2", "0"]

    so = sched.schedule()
    assert so.new_req_ids == ["1", "2", "0"]
    assert so.req_ids == ["1", "2", "0"]
    assert sched.running_request_ids() == ["1", "2", "0"]
    assert sched.waiting_request_ids() == []


def test_arrival_time_tiebreaker() -> None:
    """vLLM test_priority_scheduling_arrival_time_tiebreaker: equal priority, earlier
    arrival first (arrivals 3, 1, 2 admit 1, 2, 0)."""
    sched = priority_scheduler()
    add_prioritized(sched, [1, 1, 1], [3.0, 1.0, 2.0])
    assert sched.waiting_request_ids() == ["1", "2", "0"]
    assert sched.schedule().new_req_ids == ["1", "2", "0"]


def test_mixed_priority_and_arrival() -> None:
    """vLLM test_priority_scheduling_mixed_priority_and_arrival: priority first, arrival
    second: (2, 1.0), (1, 3.0), (1, 2.0), (0, 4.0) admit 3, 2, 1, 0."""
    sched = priority_scheduler()
    add_prioritized(sched, [2, 1, 1, 0], [1.0, 3.0, 2.0, 4.0])
    so = sched.schedule()
    assert so.new_req_ids == ["3", "2", "1", "0"]
    assert scheduled(so) == {"3": 10, "2": 10, "1": 10, "0": 10}


def test_fcfs_fallback_with_equal_priorities() -> None:
    """vLLM test_priority_scheduling_fcfs_fallback: all priority 1, arrivals 4, 1, 3, 2 are
    admitted in arrival order 1, 3, 2, 0 (not in the order they were added)."""
    sched = priority_scheduler()
    add_prioritized(sched, [1, 1, 1, 1], [4.0, 1.0, 3.0, 2.0])
    assert sched.schedule().new_req_ids == ["1", "3", "2", "0"]


def test_request_id_is_the_last_tie_breaker() -> None:
    """Spec §1.1: equal priority and arrival time fall back to the request id, compared as
    a string ("10" < "9"), whatever the order of the adds."""
    sched = priority_scheduler()
    ids = ["b", "9", "10", "a", "1"]
    add_prioritized(sched, [4] * 5, [7.5] * 5, req_ids=ids)
    expected = sorted(ids)
    assert expected == ["1", "10", "9", "a", "b"]
    assert sched.waiting_request_ids() == expected
    assert sched.schedule().new_req_ids == expected

    # The id only breaks ties: a better priority or an earlier arrival still wins.
    sched = priority_scheduler()
    add_prioritized(sched, [4, 4, 3], [7.5, 7.0, 9.0], req_ids=["a", "z", "zz"])
    assert sched.waiting_request_ids() == ["zz", "z", "a"]


# ---------------------------------------------------- limited slots (95-97, 99-100)


def test_victim_selection_one_slot_admits_the_best() -> None:
    """vLLM test_priority_scheduling_preemption_victim_selection: with max_num_seqs=1 only
    the best request (priority 0) runs; the others wait in priority order."""
    sched = priority_scheduler(max_num_seqs=1)
    add_prioritized(sched, [3, 2, 0], [1.0, 2.0, 3.0])
    so = sched.schedule()
    assert so.new_req_ids == ["2"]
    assert sched.get_request_counts() == (1, 2)
    assert sched.waiting_request_ids() == ["1", "0"]
    assert [sched.get_request(r).priority for r in sched.waiting_request_ids()] == [2, 3]


def test_equal_priority_one_slot_uses_arrival_time() -> None:
    """vLLM test_priority_scheduling_equal_priority_preemption: equal priority and one slot:
    the earliest arrival runs, the rest wait in arrival order."""
    sched = priority_scheduler(max_num_seqs=1)
    add_prioritized(sched, [2, 2, 2], [3.0, 1.0, 2.0])
    assert sched.schedule().new_req_ids == ["1"]
    assert sched.waiting_request_ids() == ["2", "0"]
    assert [sched.get_request(r).arrival_time for r in sched.waiting_request_ids()] == [2.0, 3.0]


def test_waiting_queue_order() -> None:
    """vLLM test_priority_scheduling_waiting_queue_order: one slot, priorities [3, 1, 2, 0]:
    3 runs, the queue is 1, 2, 0."""
    sched = priority_scheduler(max_num_seqs=1)
    add_prioritized(sched, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    assert sched.waiting_request_ids() == ["3", "1", "2", "0"]
    assert sched.schedule().new_req_ids == ["3"]
    assert sched.waiting_request_ids() == ["1", "2", "0"]
    assert [sched.get_request(r).priority for r in sched.waiting_request_ids()] == [1, 2, 3]


def test_limited_slots_admit_the_two_best() -> None:
    """vLLM test_priority_scheduling_with_limited_slots: max_num_seqs=2 admits priorities 0
    and 1; priorities 2 and 3 wait in that order."""
    sched = priority_scheduler(max_num_seqs=2, max_num_batched_tokens=1000)
    add_prioritized(sched, [3, 1, 2, 0], [1.0, 2.0, 3.0, 4.0])
    so = sched.schedule()
    assert so.new_req_ids == ["3", "1"]
    assert sched.running_request_ids() == ["3", "1"]
    assert sched.waiting_request_ids() == ["2", "0"]
    assert [sched.get_request(r).priority for r in sched.waiting_request_ids()] == [2, 3]


def test_heap_property_of_sequential_admissions() -> None:
    """vLLM test_priority_scheduling_heap_property: one slot; run each admitted request one
    step, then finish it: admissions come out sorted by priority."""
    sched = priority_scheduler(max_num_seqs=1)
    priorities = [5, 1, 8, 3, 2, 7, 4, 6]
    add_prioritized(sched, priorities)

    order: list[int] = []
    while sched.get_request_counts()[1] > 0:
        so = sched.schedule()
        assert len(so.new_req_ids) == 1
        (req_id,) = so.new_req_ids
        order.append(priorities[int(req_id)])
        sample(sched, so)
        assert sched.finish_requests(req_id, RequestStatus.FINISHED_STOPPED) == [req_id]
    assert order == sorted(priorities)


def test_kv_holding_queue_is_ordered_by_priority() -> None:
    """Spec §1.3: requests added with ``num_computed_tokens > 0`` wait in the KV-holding
    queue, which is a priority heap too, and is drained before the plain queue."""
    sched = priority_scheduler(max_num_seqs=1)
    add_prioritized(sched, [0], [0.0], req_ids=["plain"])
    for req_id, priority, arrival in [
        ("k3", 3, 1.0),
        ("k1", 1, 2.0),
        ("k2", 2, 3.0),
        ("k1a", 1, 0.5),
    ]:
        sched.add_request(
            req_id,
            [5] * 20,
            max_tokens=4,
            priority=priority,
            arrival_time=arrival,
            num_computed_tokens=16,
        )
    # KV-holding first (by priority, then arrival), then the plain queue, even though
    # "plain" has the best priority of all.
    assert sched.waiting_request_ids() == ["k1a", "k1", "k2", "k3", "plain"]

    admissions: list[str] = []
    while sched.get_request_counts()[1] > 0:
        so = sched.schedule()
        (req_id,) = so.new_req_ids
        admissions.append(req_id)
        if req_id != "plain":
            assert scheduled(so) == {req_id: 4}  # resumes from C = 16
        sample(sched, so)
        sched.finish_requests(req_id, RequestStatus.FINISHED_STOPPED)
    assert admissions == ["k1a", "k1", "k2", "k3", "plain"]


# ------------------------------------------------------------------ preemption (93-94)


def test_preemption_picks_the_lowest_priority_running_request() -> None:
    """vLLM test_priority_scheduling_preemption: lo1 (priority 5) runs first, hi1
    (priority 0) joins; when hi1 needs a third block and none is free, lo1 is preempted
    although it is at the head of ``running`` (FCFS would preempt the tail, hi1)."""
    # 6 blocks of 16, one of them the null block: 5 usable.
    sched = priority_scheduler(max_num_seqs=3, max_num_batched_tokens=200, num_gpu_blocks=6)
    add_prioritized(sched, [5], [1.0], num_tokens=32, req_ids=["lo1"])
    so = step(sched, 100)
    assert so.new_req_ids == ["lo1"]
    assert sched.num_free_blocks == 3  # lo1: 2 blocks, 33 tokens now

    add_prioritized(sched, [0], [2.0], num_tokens=32, req_ids=["hi1"])
    so = sched.schedule()
    assert so.new_req_ids == ["hi1"]
    assert scheduled(so) == {"lo1": 1, "hi1": 32}  # lo1 takes its 3rd block, hi1 two
    assert sched.num_free_blocks == 0
    assert sched.running_request_ids() == ["lo1", "hi1"]
    sample(sched, so, 101)

    # lo1 fits its 3 blocks and is scheduled first; hi1 then needs a 3rd block: the
    # victim is max(running, key=(priority, arrival)) = lo1.
    so = sched.schedule()
    assert so.preempted_req_ids == ["lo1"]
    assert scheduled(so) == {"hi1": 1}
    assert status(sched, "lo1") == RequestStatus.PREEMPTED
    assert status(sched, "hi1") == RequestStatus.RUNNING
    assert sched.running_request_ids() == ["hi1"]
    assert sched.waiting_request_ids() == ["lo1"]
    assert sched.num_free_blocks == 2  # lo1's 3 blocks back, hi1 took 1
    assert sched.get_request("lo1").num_computed_tokens == 0
    assert sched.get_request("lo1").num_preemptions == 1


def test_no_preemption_when_space_available() -> None:
    """vLLM test_priority_scheduling_no_preemption_when_space_available: a high-priority
    arrival joins two low-priority running requests when the blocks fit."""
    sched = priority_scheduler(max_num_seqs=3, max_num_batched_tokens=200)
    add_prioritized(sched, [5, 5], [1.0, 2.0], num_tokens=30, req_ids=["lo1", "lo2"])
    step(sched)

    add_prioritized(sched, [0], [3.0], num_tokens=30, req_ids=["hi1"])
    so = sched.schedule()
    assert so.new_req_ids == ["hi1"]
    assert so.preempted_req_ids == []
    assert scheduled(so) == {"lo1": 1, "lo2": 1, "hi1": 30}
    assert sched.get_request_counts() == (3, 0)
    assert sched.running_request_ids() == ["lo1", "lo2", "hi1"]
    assert sched.stats()["num_preemptions"] == 0


def test_victim_is_the_latest_arrival_wherever_it_runs() -> None:
    """Spec §3.1 step 9: among equal priorities the victim is the latest arrival, wherever
    it sits in ``running``. Here the victim was already scheduled in the step, before c
    (the tail, which FCFS would pick): its step is undone."""
    # 4 usable blocks of 16: a and b hold one each, c holds two and its next token needs a
    # third. Admitted one step apart so that running is [a, b, c] whatever the arrivals.
    sched = priority_scheduler(num_gpu_blocks=5, max_num_batched_tokens=200)
    for i, (req_id, num_tokens, arrival) in enumerate(
        [("a", 8, 1.0), ("b", 8, 5.0), ("c", 32, 2.0)]
    ):
        add_prioritized(
            sched, [1], [arrival], req_ids=[req_id], num_tokens=num_tokens, first_token=i
        )
        assert step(sched).new_req_ids == [req_id]
    assert sched.running_request_ids() == ["a", "b", "c"]
    assert sched.num_free_blocks == 0

    so = sched.schedule()
    assert so.preempted_req_ids == ["b"]
    assert scheduled(so) == {"a": 1, "c": 1}
    assert so.total_num_scheduled_tokens == 2
    assert sched.running_request_ids() == ["a", "c"]
    assert status(sched, "b") == RequestStatus.PREEMPTED
    assert sched.waiting_request_ids() == ["b"]
    assert sched.num_free_blocks == 0  # the victim's block went to c


def test_victim_of_a_full_tie_is_the_largest_request_id() -> None:
    """A deliberate deviation from vLLM: with equal (priority, arrival_time) vLLM takes the
    first such request in running order, which lets two requests preempt each other
    forever; llmsched ranks ties by request id, as the waiting queue does, so the victim is
    the request that would be admitted last (here c, which then preempts itself)."""
    sched = priority_scheduler(num_gpu_blocks=5, max_num_batched_tokens=200)
    for i, (req_id, num_tokens) in enumerate([("a", 8), ("b", 8), ("c", 32)]):
        add_prioritized(sched, [1], [2.0], req_ids=[req_id], num_tokens=num_tokens, first_token=i)
        assert step(sched).new_req_ids == [req_id]
    assert sched.running_request_ids() == ["a", "b", "c"]

    so = sched.schedule()
    assert so.preempted_req_ids == ["c"]
    assert scheduled(so) == {"a": 1, "b": 1}
    assert sched.running_request_ids() == ["a", "b"]
    assert sched.waiting_request_ids() == ["c"]
    assert sched.num_free_blocks == 2  # c's blocks are free again


def test_self_preemption_continues_the_running_loop() -> None:
    """Spec §3.1 step 9 and §3.4: when the request that needs a block is itself the
    lowest-priority running one it preempts itself, and the running loop goes on with the
    request behind it (FCFS would end the loop there)."""
    # 3 usable blocks of 16.
    sched = priority_scheduler(num_gpu_blocks=4, max_num_batched_tokens=200)
    add_prioritized(sched, [0], [1.0], req_ids=["h"], num_tokens=8)
    add_prioritized(sched, [5], [2.0], req_ids=["l"], num_tokens=15, first_token=1)
    assert step(sched).new_req_ids == ["h", "l"]
    add_prioritized(sched, [1], [3.0], req_ids=["m"], num_tokens=8, first_token=2)
    assert step(sched).new_req_ids == ["m"]
    assert sched.running_request_ids() == ["h", "l", "m"]
    assert sched.num_free_blocks == 0  # one block each; l has 17 tokens now

    so = sched.schedule()
    assert so.preempted_req_ids == ["l"]
    assert scheduled(so) == {"h": 1, "m": 1}
    assert sched.running_request_ids() == ["h", "m"]
    assert sched.waiting_request_ids() == ["l"]
    assert sched.num_free_blocks == 1


# ------------------------------------------------ preemption and resumption (105)


def test_preemption_and_resumption_when_out_of_kv() -> None:
    """vLLM test_priority_scheduling_preemption_and_resumption_when_out_of_kv (V1 runner,
    no connector): 4 usable blocks; the low-priority request is preempted when the
    high-priority one needs a third block, then comes back as a *resumed* request whose
    ``all_token_ids`` hold its 30 prompt tokens and its 2 outputs."""
    sched = priority_scheduler(max_num_seqs=2, max_num_batched_tokens=200, num_gpu_blocks=5)
    low, high = "0", "1"
    add_prioritized(sched, [1], [0.0], num_tokens=30, req_ids=[low])
    so = step(sched, 100)
    assert so.new_req_ids == [low]
    assert sched.get_request_counts() == (1, 0)

    add_prioritized(sched, [0], [1.0], num_tokens=32, req_ids=[high], first_token=1)
    so = sched.schedule()
    assert sched.num_free_blocks == 0
    assert so.new_req_ids == [high]
    assert scheduled(so) == {low: 1, high: 32}  # one cached (running) request, one new
    assert sched.get_request_counts() == (2, 0)
    sample(sched, so, 100)

    # low needs 32 tokens (2 blocks), high 33 (3 blocks): they do not fit in 4.
    so = sched.schedule()
    assert so.new_req_ids == []
    assert so.req_ids == [high]
    assert so.preempted_req_ids == [low]
    assert status(sched, low) == RequestStatus.PREEMPTED
    assert sched.get_request_counts() == (1, 1)
    sample(sched, so, 100)
    assert sched.finish_requests(high, RequestStatus.FINISHED_STOPPED) == [high]

    so = sched.schedule()
    assert sched.get_request_counts() == (1, 0)
    assert so.new_req_ids == []
    assert so.resumed_req_ids == [low]
    assert so.req_ids == [low]
    tokens = all_tokens(so, low)
    assert len(tokens) == 32
    assert tokens == [0] * 30 + [100, 100]
    assert tokens[31] == 100
    assert scheduled(so) == {low: 32}
    assert status(sched, low) == RequestStatus.RUNNING


# ----------------------------------------- victim before the request being scheduled


def test_preempted_victim_already_scheduled_is_undone() -> None:
    """vLLM test_priority_preemption_bug.py::test_priority_scheduler_preempt_skipped_request,
    the case spec §3.1 step 9 spells out: the victim A sits before the request C that needs
    a block, and was already scheduled in this step. A leaves the step's output, its tokens
    go back to the budget, and the index moves back so that D (behind C) is not skipped."""
    # 8 usable blocks of 16, a 34-token budget, no full-prompt reservation at admission.
    sched = priority_scheduler(
        num_gpu_blocks=9,
        max_num_batched_tokens=34,
        max_model_len=1000,
        scheduler_reserve_full_isl=False,
    )
    add_prioritized(sched, [9], [1.0], req_ids=["A"], num_tokens=56, max_tokens=8)
    assert scheduled(step(sched)) == {"A": 34}
    assert scheduled(step(sched)) == {"A": 22}  # A holds 4 blocks from here on
    add_prioritized(sched, [1], [2.0], req_ids=["C"], num_tokens=31, max_tokens=10)
    assert scheduled(step(sched)) == {"A": 1, "C": 31}
    add_prioritized(sched, [2], [3.0], req_ids=["D"], num_tokens=100, max_tokens=4)
    assert scheduled(step(sched)) == {"A": 1, "C": 1, "D": 32}
    assert sched.running_request_ids() == ["A", "C", "D"]
    assert sched.num_free_blocks == 0

    # A (1 token, no new block) is scheduled first; C's 33rd token needs a 3rd block;
    # the victim is A. With A's token back, D gets 34 - 1 = 33 tokens.
    so = sched.schedule()
    assert so.preempted_req_ids == ["A"]
    assert scheduled(so) == {"C": 1, "D": 33}
    assert so.total_num_scheduled_tokens == 34
    assert status(sched, "A") == RequestStatus.PREEMPTED
    assert sched.get_request("A").num_in_flight_tokens == 0
    assert sched.running_request_ids() == ["C", "D"]
    assert sched.waiting_request_ids() == ["A"]
    assert sched.num_free_blocks == 0  # A's 4 blocks: 1 to C, 3 to D
    sample(sched, so)

    # D's next chunk needs 2 more blocks: D is now the lowest priority running request and
    # preempts itself; the queue orders D (priority 2) before A (priority 9).
    so = sched.schedule()
    assert so.preempted_req_ids == ["D"]
    assert scheduled(so) == {"C": 1}
    assert sched.waiting_request_ids() == ["D", "A"]


def test_preempted_victim_skipped_in_this_step() -> None:
    """vLLM test_priority_preemption_bug.py::test_priority_scheduler_preempt_skipped_request,
    the exact shape: the victim A was *skipped* by the running loop (here by the async
    "already done" rule: its last token is in flight) and sits before C, which needs a
    block. Removing A must not make the loop skip C or D."""
    # 4 usable blocks of 16; async scheduling, driven by the simulated runner.
    sched = priority_scheduler(num_gpu_blocks=5, async_scheduling=True)
    runner = SimulatedModelRunner(sched.config)

    def schedule() -> tuple[SchedulerOutput, ModelRunnerOutput]:
        so = sched.schedule()
        return so, runner.execute_model(so)

    add_prioritized(sched, [9], [1.0], req_ids=["A"], num_tokens=16, max_tokens=2)
    step1 = schedule()
    add_prioritized(sched, [1, 2], [2.0, 3.0], req_ids=["C", "D"], num_tokens=16)
    step2 = schedule()
    assert scheduled(step2[0]) == {"A": 1, "C": 16, "D": 16}
    assert sched.num_free_blocks == 0  # A: 2 blocks, C and D: 1 each
    sched.update_from_output(*step1)

    so, ro = schedule()
    assert so.preempted_req_ids == ["A"]
    assert scheduled(so) == {"C": 1, "D": 1}
    assert sched.running_request_ids() == ["C", "D"]

    # A's in-flight token still arrives (spec §4.6): it is A's second and last one.
    outs = {out.request_id: out for out in sched.update_from_output(*step2)}
    assert outs["A"].finished
    assert outs["A"].finish_reason == "length"
    assert sched.waiting_request_ids() == []
    sched.update_from_output(so, ro)


# -------------------------------------------------------------------- randomized blast


def _key(sched: CheckedScheduler, req_id: str) -> tuple[int, float, str]:
    request = sched.get_request(req_id)
    return (request.priority, request.arrival_time, req_id)


def _blast(seed: int, async_scheduling: bool, num_spec: int) -> dict[str, int]:
    """Random priorities, arrivals and lengths under KV pressure, driven until every request
    finishes. Checks, on top of ``CheckedScheduler``'s invariants at every call:

    * the waiting queue is always in ``(priority, arrival, id)`` order;
    * a step admits a prefix of the waiting order (sync), or a subsequence whose gaps are
      preempted requests with output still in flight (async); none after a preemption;
    * ``running`` keeps its order: survivors in place, then admissions;
    * no step schedules a request it preempted, and every victim's (priority, arrival) is
      >= that of every request left running;
    * every request finishes exactly once, with its outputs in order and nothing after.
    """
    rng = random.Random(seed)
    eos = 7
    block_size = rng.choice([4, 16])
    usable = rng.randint(8, 14) * 16 // block_size
    config = make_config(
        policy="priority",
        async_scheduling=async_scheduling,
        num_speculative_tokens=num_spec,
        block_size=block_size,
        num_gpu_blocks=usable + 1,
        max_num_seqs=rng.randint(4, 10),
        max_num_batched_tokens=rng.choice([24, 48, 96]),
        long_prefill_token_threshold=rng.choice([0, 0, 12]),
        scheduler_reserve_full_isl=rng.choice([True, False]),
    )
    sched = CheckedScheduler(config)
    runner = SimulatedModelRunner(config, seed=seed, eos_token_id=eos, eos_probability=0.04)
    capacity = usable * block_size - num_spec

    prompts: dict[str, int] = {}
    max_tokens: dict[str, int] = {}
    outputs: dict[str, list[int]] = {}
    finished: dict[str, str | None] = {}
    num_to_add = 24

    def add_one(priority: int | None = None, arrival: float | None = None) -> None:
        req_id = f"{rng.getrandbits(12):03x}-{len(prompts)}"
        outputs[req_id] = []
        prompt_len = rng.randint(1, min(64, capacity - 1))
        prompts[req_id] = prompt_len
        max_tokens[req_id] = rng.randint(1, min(60, capacity - prompt_len))
        if priority is None:
            priority = rng.randint(-3, 3)
        if arrival is None:
            arrival = rng.choice([rng.uniform(0, 1), float(rng.randint(0, 2))])
        sched.add_request(
            req_id,
            [rng.randrange(100) for _ in range(prompt_len)],
            max_tokens=max_tokens[req_id],
            eos_token_id=eos,
            priority=priority,
            arrival_time=arrival,
        )

    for _ in range(10):
        add_one()
    for _ in range(2):
        add_one(priority=4, arrival=0.0)

    def check_waiting_order() -> list[str]:
        waiting = sched.waiting_request_ids()
        keys = [_key(sched, r) for r in waiting]
        assert keys == sorted(keys), f"waiting queue out of order: {keys}"
        return waiting

    def apply(so: SchedulerOutput, ro: ModelRunnerOutput) -> None:
        for out in sched.update_from_output(so, ro):
            req_id = out.request_id
            assert req_id not in finished, f"{req_id} got output after finishing"
            outputs[req_id].extend(out.new_token_ids)
            if out.finished:
                finished[req_id] = out.finish_reason
        if not async_scheduling and num_spec:
            drafts = runner.take_draft_token_ids()
            if drafts is not None and drafts[0]:
                sched.update_draft_token_ids(*drafts)
        check_waiting_order()

    stats = {"steps": 0, "preemptions": 0, "victim_before_scheduled": 0}
    depth = 2 if async_scheduling else 1
    in_flight: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
    while len(prompts) < num_to_add or sched.has_requests() or in_flight:
        stats["steps"] += 1
        assert stats["steps"] < 5000, "the blast does not converge"
        if len(prompts) < num_to_add and (not sched.get_request_counts()[1] or rng.random() < 0.1):
            for _ in range(min(rng.randint(0, 2), num_to_add - len(prompts))):
                add_one()
        if sched.has_requests():
            waiting_before = check_waiting_order()
            running_before = sched.running_request_ids()
            so = sched.schedule()
            ids = set(so.req_ids)
            victims = so.preempted_req_ids
            new = admitted(so)
            assert not ids & set(victims), f"preempted and scheduled: {ids & set(victims)}"
            for req_id in so.req_ids:
                assert status(sched, req_id) == RequestStatus.RUNNING
            running_after = sched.running_request_ids()
            assert running_after == [r for r in running_before if r not in victims] + new
            if victims:
                stats["preemptions"] += len(victims)
                assert new == []
                for victim in victims:
                    assert status(sched, victim) == RequestStatus.PREEMPTED
                    assert all(_key(sched, victim)[:2] >= _key(sched, r)[:2] for r in running_after)
                    index = running_before.index(victim)
                    if any(r in ids for r in running_before[index + 1 :]):
                        stats["victim_before_scheduled"] += 1
            # Admissions follow the waiting order; async may skip preempted requests whose
            # output is still in flight (spec §3.3 item 2).
            if new:
                last = waiting_before.index(new[-1])
                passed = waiting_before[: last + 1]
                assert [r for r in passed if r in new] == new
                for req_id in passed:
                    if req_id not in new:
                        assert async_scheduling, f"{req_id} skipped in sync mode"
                        assert status(sched, req_id) == RequestStatus.PREEMPTED
                        assert sched.get_request(req_id).num_in_flight_tokens > 0
            check_waiting_order()
            in_flight.append((so, runner.execute_model(so)))
        if in_flight and (len(in_flight) >= depth or not sched.has_requests()):
            apply(*in_flight.popleft())

    assert len(prompts) == num_to_add
    assert set(finished) == set(prompts)
    for req_id, tokens in outputs.items():
        expected = [runner.target_token(req_id, prompts[req_id] + i) for i in range(len(tokens))]
        assert tokens == expected, f"{req_id}: outputs out of order"
        assert 1 <= len(tokens) <= max_tokens[req_id]
        assert eos not in tokens[:-1]
        if tokens[-1] == eos:
            assert finished[req_id] == "stop"
        else:
            assert len(tokens) == max_tokens[req_id]
            assert finished[req_id] == "length"
    assert sched.get_num_unfinished_requests() == 0
    assert sched.num_free_blocks == usable
    return stats


BLAST_SEEDS = [0, 1, 2, 3, 4]


@pytest.mark.parametrize("num_spec", [0, 2], ids=["no-spec", "spec2"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_priority_blast(async_scheduling: bool, num_spec: int) -> None:
    """vLLM test_priority_scheduler_random.py::test_priority_scheduling_blast, in spirit:
    several seeds, each driven until every request finishes (see ``_blast``)."""
    totals = {"steps": 0, "preemptions": 0, "victim_before_scheduled": 0}
    for seed in BLAST_SEEDS:
        stats = _blast(seed * 7919 + 17, async_scheduling, num_spec)
        assert stats["preemptions"] > 0, f"seed {seed}: no KV pressure"
        for name, value in stats.items():
            totals[name] += value
    # Victims sitting before a request the same step schedules happen too.
    assert totals["victim_before_scheduled"] > 0
