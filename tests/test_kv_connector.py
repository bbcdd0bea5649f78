"""A KV connector's scheduler side through the binding: ``schedule(external_kv=...)`` (tokens
a connector loads past the prefix-cache hit), a source that fails, and the held blocks of
finished requests (``held_kv_blocks`` / ``release_kv_blocks``)."""

from __future__ import annotations

from typing import Any

import pytest

from llmsched import InvalidRequestError, Request, RequestStatus, Scheduler, SchedulerConfig

from conftest import one_token_each, runner_output


def _scheduler(**overrides: Any) -> Scheduler:
    config = {
        "max_model_len": 256,
        "block_size": 16,
        "num_gpu_blocks": 64,
        "max_num_batched_tokens": 512,
        "kv_connector": True,
        "async_scheduling": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**config))


class _Store:
    """Holds the first ``holds[id]`` tokens of a request; records every question."""

    def __init__(self, holds: dict[str, Any]) -> None:
        self.holds = holds
        self.asked: list[tuple[str, int, int]] = []

    def __call__(self, request: Request, num_local: int) -> Any:
        self.asked.append((request.request_id, request.num_tokens, num_local))
        held = self.holds.get(request.request_id, 0)
        return held - num_local if isinstance(held, int) else held


def test_loaded_tokens_are_computed_and_reported_per_admission() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    sched.add_request("b", list(range(1001, 1041)), max_tokens=4)
    store = _Store({"a": 64})
    so = sched.schedule(external_kv=store)
    assert so.num_computed_tokens.tolist() == [64, 0]
    assert so.num_scheduled_tokens.tolist() == [36, 40]
    assert so.num_external_computed_tokens.tolist() == [64, 0]
    assert store.asked == [("a", 100, 0), ("b", 40, 0)]
    sched.check_invariants()


def test_without_a_source_nothing_is_loaded_and_without_the_flag_nothing_asked() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    assert sched.schedule().num_external_computed_tokens.tolist() == [0]
    off = _scheduler(kv_connector=False)
    off.add_request("a", list(range(1, 101)), max_tokens=4)
    store = _Store({"a": 64})
    so = off.schedule(external_kv=store)
    assert store.asked == [] and so.num_external_computed_tokens.tolist() == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("lots", r"external_kv\(\"a\", 0\)"),
        (1.5, "must be an integer"),
        (RuntimeError("down"), "down"),
    ],
)
def test_a_failing_source_is_raised_after_the_step_which_is_delivered_next(
    answer: Any, message: str
) -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 41)), max_tokens=4)
    sched.add_request("b", list(range(1, 41)), max_tokens=4)

    def source(request: Request, num_local: int) -> Any:
        if request.request_id == "a":
            if isinstance(answer, Exception):
                raise answer
            return answer
        return 0

    with pytest.raises((InvalidRequestError, RuntimeError), match=message):
        sched.schedule(external_kv=source)
    # The step was decided without a, nor b, asked after the source failed: the next call
    # delivers it (empty), both still waiting in order.
    so = sched.schedule(external_kv=source)
    assert list(so.req_ids) == [] and sched.current_step == 1
    assert sched.waiting_request_ids() == ["a", "b"]
    sched.check_invariants()


def test_a_source_that_is_not_callable_is_refused_before_anything_changes() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 41)), max_tokens=4)
    with pytest.raises(InvalidRequestError, match="external_kv: must be callable"):
        sched.schedule(external_kv=3)  # type: ignore[arg-type]
    assert sched.current_step == 0


def _no_load(request: Request, num_local: int) -> int:
    return 0


def _out_of_blocks() -> Scheduler:
    """Two running requests filling the pool: the next step needs a block for each."""
    sched = _scheduler(num_gpu_blocks=5)
    sched.add_request("a", list(range(1, 33)), max_tokens=8)
    sched.add_request("b", list(range(101, 133)), max_tokens=8)
    so = sched.schedule(external_kv=_no_load)
    sched.update_from_output(so, one_token_each(so))
    return sched


@pytest.mark.parametrize("pending", [True, False])
def test_pending_block_frees_hold_back_a_preemption(pending: bool) -> None:
    sched = _out_of_blocks()
    asked = []

    def pending_block_frees() -> bool:
        asked.append(True)
        return pending

    so = sched.schedule(external_kv=_no_load, pending_block_frees=pending_block_frees)
    assert len(asked) == 1
    # Transfers in flight will free blocks: nothing preempted (vLLM waits for them).
    assert sorted(so.preempted_req_ids) == ([] if pending else ["b"])
    assert list(so.req_ids) == ([] if pending else ["a"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"external_kv": _no_load, "pending_block_frees": 3},
            "pending_block_frees: must be callable",
        ),
        ({"pending_block_frees": lambda: True}, "given with its external_kv"),
    ],
)
def test_a_bad_pending_block_frees_is_refused_before_anything_changes(
    kwargs: dict[str, Any], message: str
) -> None:
    sched = _out_of_blocks()
    with pytest.raises(InvalidRequestError, match=message):
        sched.schedule(**kwargs)
    assert sched.current_step == 1


@pytest.mark.parametrize("answer", [RuntimeError("connector down"), "yes"])
def test_a_failing_pending_block_frees_is_raised_after_the_step(answer: Any) -> None:
    sched = _out_of_blocks()

    def pending_block_frees() -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    with pytest.raises(
        (InvalidRequestError, RuntimeError), match=r"connector down|pending_block_frees"
    ):
        sched.schedule(external_kv=_no_load, pending_block_frees=pending_block_frees)
    # Decided as if no frees were pending (b preempted for a's block), delivered next.
    so = sched.schedule()
    assert sorted(so.preempted_req_ids) == ["b"] and list(so.req_ids) == ["a"]
    sched.check_invariants()


def test_finished_requests_hold_their_blocks_until_released() -> None:
    sched = _scheduler()
    free = sched.num_free_blocks
    sched.add_request("a", list(range(1, 41)), max_tokens=2)
    for _ in range(2):
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so))
    assert sched.take_finished_requests()[0].num_computed_tokens == 41
    held = sched.held_kv_blocks("a")
    assert held is not None and len(held) == 3
    assert sched.num_free_blocks == free - 3
    assert sched.held_kv_request_ids() == ["a"]
    refs = [sched.block_ref_count(b) for b in range(64)]
    assert [refs[b] for b in held] == [1, 1, 1] and sum(refs) == 3
    # Its 41 tokens: two full blocks, cached, and a partial one.
    cached = [sched.cached_block_hash(int(b)) is not None for b in held]
    assert cached == [True, True, False]
    for bad in (64, -1, "x"):
        with pytest.raises(InvalidRequestError, match="block_id"):
            sched.block_ref_count(bad)
    assert sched.held_kv_blocks("b") is None
    with pytest.raises(InvalidRequestError, match="still holds KV blocks"):
        sched.add_request("a", [1, 2], max_tokens=1)
    for bad, field in [
        ("a", "must be a list of str"),
        (["a", "a"], "named twice"),
        (["x"], "holds no"),
    ]:
        with pytest.raises(InvalidRequestError, match=field):
            sched.release_kv_blocks(bad)
        assert sched.num_free_blocks == free - 3
    sched.release_kv_blocks(["a"])
    assert sched.num_free_blocks == free
    assert sched.held_kv_request_ids() == [] and not any(map(sched.block_ref_count, range(64)))
    sched.check_invariants()


def test_over_several_groups_a_finished_request_holds_every_groups_table() -> None:
    """A sliding window (32 tokens) beside full attention: a load fills both tables, the
    window's with null blocks where the loaded tokens left it behind; once finished, each
    group's table is held (``held_kv_blocks(request_id, group)``) until released, and a
    failed block cannot be traced to a request there (refused, nothing changed)."""
    sched = _scheduler(kv_cache_groups="sliding_window:32,full")
    free = sched.num_free_blocks
    sched.add_request("a", list(range(1, 101)), max_tokens=2)
    so = sched.schedule(external_kv=_Store({"a": 96}))
    assert so.num_external_computed_tokens.tolist() == [96]
    window, full = sched.get_request("a").group_block_ids
    assert window[:4] == [0, 0, 0, 0] and 0 not in window[4:] and len(window) == 7
    assert len(full) == 7 and 0 not in full
    with pytest.raises(InvalidRequestError, match="several KV-cache groups"):
        sched.fail_kv_loads([], [full[0]])
    assert sched.get_request("a").num_computed_tokens == 100  # unchanged
    sched.update_from_output(so, one_token_each(so))
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    assert sched.take_finished_requests()[0].num_computed_tokens == 101
    held_window, held_full = (sched.held_kv_blocks("a", g) for g in (0, 1))
    assert held_window is not None and held_full is not None
    assert held_window.tolist()[:4] == [0, 0, 0, 0] and len(held_full) == 7
    assert sched.held_kv_blocks("a", 2) is None
    for bad, message in [(-1, "group=-1: must be a KV-cache group"), ("x", "group='x'")]:
        with pytest.raises(InvalidRequestError, match=message):
            sched.held_kv_blocks("a", bad)
    assert sched.num_free_blocks == free - 3 - 7
    sched.release_kv_blocks(["a"])
    assert sched.num_free_blocks == free
    sched.check_invariants()


def test_an_async_load_waits_for_the_runners_report() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    sched.add_request("b", list(range(1001, 1041)), max_tokens=4)
    free = sched.num_free_blocks
    so = sched.schedule(external_kv=lambda r, n: (64, True) if r.request_id == "a" else (0, False))
    assert so.req_ids == ["b"]
    assert so.kv_loads == [("a", 64, 0)]
    a = sched.get_request("a")
    assert a.status.name == "WAITING_FOR_REMOTE_KVS"
    assert a.num_computed_tokens == 64 and len(a.block_ids) == 4
    assert free - sched.num_free_blocks == 4 + 3
    assert sched.kv_load_in_flight("a") and not sched.kv_load_in_flight("b")
    sched.update_from_output(so, one_token_each(so))
    assert sched.kv_loads_reported() == ([], [])
    sched.finish_kv_transfers(finished_recving=["a"])
    assert sched.kv_loads_reported() == (["a"], [])
    so = sched.schedule(external_kv=lambda r, n: pytest.fail("a is not asked again"))
    assert sched.kv_loads_reported() == ([], [])
    assert so.req_ids == ["b", "a"]
    assert so.num_computed_tokens.tolist()[1] == 64
    assert so.num_external_computed_tokens.tolist() == [-1]
    assert so.kv_loads == []
    sched.check_invariants()


def test_an_aborted_load_keeps_its_blocks_until_reported() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    free = sched.num_free_blocks
    sched.schedule(external_kv=lambda r, n: (64, True))
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.kv_load_in_flight("a")
    with pytest.raises(InvalidRequestError, match=r"request_ids\[0\].*in flight"):
        sched.release_kv_blocks(["a"])
    assert free - sched.num_free_blocks == 4
    sched.finish_kv_transfers(["a"], None)
    assert sched.num_free_blocks == free and sched.num_held_kv_requests == 0


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ((64,), "a tuple of 1"),
        ((64, True, 1), "a tuple of 3"),
        ((64, "yes"), r"\[1\]"),
        (("64", True), "must be an integer"),
    ],
)
def test_a_malformed_pair_is_refused_after_the_step(answer: Any, message: str) -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 41)), max_tokens=4)
    with pytest.raises(InvalidRequestError, match=message):
        sched.schedule(external_kv=lambda r, n: answer)
    assert sched.get_request("a").status.name == "WAITING"
    assert sched.schedule().req_ids == []  # the undelivered step, without a
    sched.check_invariants()


@pytest.mark.parametrize("bad", ["a", 3, [1]])
def test_finish_kv_transfers_refuses_what_is_not_a_list_of_str(bad: Any) -> None:
    sched = _scheduler()
    with pytest.raises(InvalidRequestError, match="finished_sending: must be a list of str"):
        sched.finish_kv_transfers(finished_sending=bad)


def test_a_failed_load_is_recomputed_and_bad_reports_are_refused() -> None:
    sched = _scheduler()
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    so = sched.schedule(external_kv=lambda r, n: (64, True))
    blocks = list(sched.get_request("a").block_ids)
    with pytest.raises(InvalidRequestError, match="invalid_block_ids: must be a collection"):
        sched.fail_kv_loads(invalid_block_ids=["x"])
    assert sched.fail_kv_loads(invalid_block_ids=[blocks[1]]) == []
    assert sched.get_request("a").num_computed_tokens == 16
    assert sched.kv_loads_reported() == ([], ["a"])
    sched.update_from_output(so, one_token_each(so))
    sched.finish_kv_transfers(["a"])
    assert sched.kv_loads_reported() == (["a"], ["a"])
    so = sched.schedule(external_kv=lambda r, n: pytest.fail("a keeps what loaded"))
    assert so.num_computed_tokens.tolist() == [16] and so.num_scheduled_tokens.tolist() == [84]
    sched.check_invariants()


def test_under_the_fail_policy_the_failed_loads_are_named() -> None:
    sched = _scheduler(recompute_kv_load_failures=False)
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    sched.schedule(external_kv=lambda r, n: (64, True))
    assert sched.fail_kv_loads(["a", "unknown"]) == ["a"]
    sched.finish_requests(["a"], RequestStatus.FINISHED_ERROR)
    assert sched.kv_load_in_flight("a")


def test_a_failed_block_of_a_synchronous_load_is_recomputed_and_its_output_dropped() -> None:
    """vLLM's rule for a running request whose loaded (computed) blocks failed: it keeps
    the tokens before its first failed block, the step's output for it is dropped (the
    runner's token for it is not read, however many), and the next step computes the
    rest; another request is unaffected."""
    sched = _scheduler(enable_prefix_caching=True)
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    sched.add_request("b", list(range(1001, 1041)), max_tokens=4)
    so = sched.schedule(external_kv=_Store({"a": 64}))
    assert so.num_computed_tokens.tolist() == [64, 0]
    blocks = list(sched.get_request("a").block_ids)
    assert sched.fail_kv_loads(invalid_block_ids=[blocks[2]]) == []
    assert sched.get_request("a").num_computed_tokens == 32
    outputs = sched.update_from_output(so, runner_output(so, [[5, 6, 7], [9]]))
    assert [o.request_id for o in outputs] == ["b"]
    a = sched.get_request("a")
    assert a.output_token_ids == [] and a.num_computed_tokens == 32
    assert a.num_in_flight_tokens == 0 and a.status == RequestStatus.RUNNING
    so = sched.schedule(external_kv=lambda r, n: pytest.fail("a runs: no new lookup"))
    assert dict(zip(so.req_ids, so.num_scheduled_tokens.tolist(), strict=True)) == {
        "a": 100 - 32,
        "b": 1,
    }
    assert so.num_computed_tokens.tolist() == [32, 40]
    sched.update_from_output(so, one_token_each(so))
    assert sched.get_request("a").output_token_ids == [0]
    sched.check_invariants()


def test_a_failed_block_two_synchronous_loads_share_is_recomputed_by_the_first() -> None:
    """Under the fail policy both requests are named, the first's failed blocks on leave
    the prefix cache; a request that shares the failed block but does not recompute it
    keeps its tokens before the step."""
    sched = _scheduler(enable_prefix_caching=True, recompute_kv_load_failures=False)
    prompt = list(range(1, 81))
    sched.add_request("a", prompt, max_tokens=4)
    sched.add_request("b", [*prompt[:64], 7, 8, 9], max_tokens=4)
    so = sched.schedule(external_kv=_Store({"a": 64}))
    assert so.num_computed_tokens.tolist() == [64, 64]  # b's prefix hit is a's loaded blocks
    shared = list(sched.get_request("a").block_ids[:4])
    assert list(sched.get_request("b").block_ids[:4]) == shared
    assert sched.get_request("a").num_cached_blocks == 5  # its 80 tokens: 5 full blocks
    assert sorted(sched.fail_kv_loads(invalid_block_ids=[shared[1]])) == ["a", "b"]
    assert sched.get_request("a").num_computed_tokens == 16
    assert sched.get_request("b").num_computed_tokens == 64
    # a's blocks from the failed one on leave the prefix cache.
    assert sched.get_request("a").num_cached_blocks == 1
    assert sched.update_from_output(so, one_token_each(so)) == []
    sched.finish_requests(["a", "b"], RequestStatus.FINISHED_ERROR)
    assert sched.get_num_unfinished_requests() == 0
    sched.check_invariants()


def test_a_synchronous_load_failure_with_a_later_step_in_flight_restarts_its_request() -> None:
    """A failed block of a request a later step in flight scheduled too (async scheduling):
    under "recompute" the request is preempted at once, both steps' outputs for it are
    dropped, and it comes back with only the blocks before the failed one cached."""
    sched = _scheduler(async_scheduling=True, enable_prefix_caching=True)
    sched.add_request("a", list(range(1, 101)), max_tokens=4)
    first = sched.schedule(external_kv=_Store({"a": 64}))
    second = sched.schedule()
    assert second.req_ids == ["a"]
    block = sched.get_request("a").block_ids[2]
    assert sched.fail_kv_loads(invalid_block_ids=[block]) == []
    a = sched.get_request("a")
    assert (a.status, a.num_preemptions, a.num_computed_tokens) == (RequestStatus.PREEMPTED, 1, 0)
    assert sched.update_from_output(first, one_token_each(first)) == []
    assert sched.update_from_output(second, one_token_each(second)) == []
    assert sched.get_request("a").output_token_ids == []
    third = sched.schedule(external_kv=_Store({}))
    assert third.num_computed_tokens.tolist() == [32]
    sched.check_invariants()
