"""Python running out of memory inside a call: the call raises ``MemoryError`` and no step,
token or finished request is lost.

CPython's own test hook (``_testcapi.set_nomemory(k, k + 1)``) makes the ``k``-th Python
allocation after it fail, once: each call is run with ``k`` swept over every allocation it
makes, so that every place the binding builds a Python object fails in turn. The core's
decision is not undone: a ``schedule()`` whose output could not be built keeps its step in
flight and the next ``schedule()`` delivers it; ``update_from_output`` and
``finish_requests`` build what they return before the core changes anything, so a failure
leaves the state as it was.
"""

from __future__ import annotations

import _testcapi
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from llmsched import RequestStatus, Scheduler, SchedulerConfig, SchedulerOutput

T = TypeVar("T")
# The sweep ends once this many allocation counts in a row let the call through (a failed
# allocation some code recovers from does not end it early), or at MOST_ALLOCATIONS.
CALLS_THROUGH = 20
MOST_ALLOCATIONS = 1000


def with_failing_allocation(k: int, call: Callable[[], T]) -> T | MemoryError:
    """``call()`` with the ``k``-th Python allocation failing: its result, or the error."""
    _testcapi.set_nomemory(k, k + 1)
    try:
        return call()
    except MemoryError as error:
        return error
    finally:
        _testcapi.remove_mem_hooks()


def sweep(
    prepare: Callable[[], Scheduler], call: Callable[[Scheduler], T]
) -> Iterator[tuple[int, Scheduler, T | MemoryError]]:
    """``call`` on a fresh ``prepare()``d scheduler with its ``k``-th allocation failing, for
    each ``k`` until the calls go through; asserts that some did not."""
    through = failed = 0
    for k in range(MOST_ALLOCATIONS):
        sched = prepare()
        result = with_failing_allocation(k, lambda sched=sched: call(sched))
        failed += isinstance(result, MemoryError)
        through = 0 if isinstance(result, MemoryError) else through + 1
        yield k, sched, result
        if through == CALLS_THROUGH:
            break
    else:
        raise AssertionError(f"the calls still failed after {MOST_ALLOCATIONS} allocations")
    assert failed > 0, "no allocation failed the call"


class Output:
    """One sampled token per entry that reaches the end of its tokens: ``token`` for all."""

    def __init__(self, so: SchedulerOutput, sched: Scheduler, token: int = 7) -> None:
        self.req_ids = list(so.req_ids)
        live = set(sched.running_request_ids())
        counts = [
            0 if r in live and sched.get_request(r).is_prefill_chunk else 1 for r in self.req_ids
        ]
        self.num_sampled = np.array(counts, np.int32)
        self.sampled_token_ids = np.full(sum(counts), token, np.int32)


def scheduler_mid_run() -> Scheduler:
    """Three requests running and filling the pool; "a" has a draft, so its next step needs
    a block and preempts "c"; "e" was aborted while waiting (reported by the next step) and
    "d" waits. Prefix caching is on."""
    sched = Scheduler(
        SchedulerConfig(
            max_model_len=64,
            block_size=4,
            num_gpu_blocks=10,
            max_num_batched_tokens=64,
            max_num_seqs=8,
            num_speculative_tokens=1,
            async_scheduling=False,
            enable_prefix_caching=True,
        )
    )
    for i, rid in enumerate("abc"):
        sched.add_request(
            rid, list(range(100 * i + 1, 100 * i + 12)), max_tokens=20, arrival_time=float(i)
        )
    so = sched.schedule()
    sched.update_from_output(so, Output(so, sched))
    sched.update_draft_token_ids(["a"], [[7]])
    sched.add_request("e", [5, 6], max_tokens=20, arrival_time=3.0)
    sched.finish_requests("e", RequestStatus.FINISHED_ABORTED)
    sched.add_request("d", list(range(20, 31)), max_tokens=20, arrival_time=4.0)
    return sched


def view(so: SchedulerOutput) -> dict[str, Any]:
    """Everything a step shows, as plain data."""
    arrays = {
        name: getattr(so, name).tolist()
        for name in (
            "num_scheduled_tokens",
            "num_computed_tokens",
            "num_spec_tokens",
            "spec_token_ids",
            "num_output_tokens",
            "num_block_ids",
            "block_ids",
            "num_all_token_ids",
            "all_token_ids",
        )
    }
    lists = {
        name: list(getattr(so, name))
        for name in (
            "req_ids",
            "new_req_ids",
            "resumed_req_ids",
            "rescheduled_req_ids",
            "preempted_req_ids",
            "finished_req_ids",
        )
    }
    return {"step_id": so.step_id, **arrays, **lists}


def run_to_completion(sched: Scheduler) -> dict[str, list[int]]:
    """Every request's output tokens (each step samples 7, then 8, ...)."""
    tokens: dict[str, list[int]] = {}
    token = 7
    while sched.has_requests():
        so = sched.schedule()
        for out in sched.update_from_output(so, Output(so, sched, token)):
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        sched.check_invariants()
        token += 1
    return tokens


def first_step_then_the_rest(sched: Scheduler, so: SchedulerOutput) -> dict[str, list[int]]:
    """Applies ``so`` (the first step) and runs the rest: every request's output tokens."""
    tokens = {
        o.request_id: list(o.new_token_ids) for o in sched.update_from_output(so, Output(so, sched))
    }
    sched.check_invariants()
    for rid, more in run_to_completion(sched).items():
        tokens.setdefault(rid, []).extend(more)
    return tokens


def test_a_step_whose_output_cannot_be_built_is_delivered_by_the_next_schedule() -> None:
    reference = scheduler_mid_run()
    first = reference.schedule()
    expected = view(first)
    assert (expected["preempted_req_ids"], expected["finished_req_ids"]) == (["c"], ["e"])
    expected_tokens = first_step_then_the_rest(reference, first)
    for k, sched, result in sweep(scheduler_mid_run, Scheduler.schedule):
        if isinstance(result, MemoryError):
            # The step is decided and in flight, and the next call hands it out.
            assert sched.num_steps_in_flight == 1, f"allocation {k}"
            sched.check_invariants()
            result = sched.schedule()
        assert view(result) == expected, f"allocation {k}"
        assert first_step_then_the_rest(sched, result) == expected_tokens, f"allocation {k}"


def test_requests_finished_before_a_late_step_is_delivered_keep_their_ids() -> None:
    """A request of the undelivered step is aborted before the step is delivered: the
    step still names it (by the id it had), and its output skips it."""
    for k, sched, result in sweep(scheduler_mid_run, Scheduler.schedule):
        if not isinstance(result, MemoryError):
            continue
        assert sched.finish_requests(["a", "c"], RequestStatus.FINISHED_ABORTED) == ["a", "c"]
        so = sched.schedule()
        assert list(so.req_ids) == ["a", "b"], f"allocation {k}"
        assert (list(so.preempted_req_ids), list(so.finished_req_ids)) == (["c"], ["e"])
        outputs = sched.update_from_output(so, Output(so, sched))
        assert [o.request_id for o in outputs] == ["b"]
        so = sched.schedule()
        assert list(so.finished_req_ids) == ["a", "c"] and list(so.new_req_ids) == ["d"]
        sched.check_invariants()


def outputs_of(outputs: Any) -> list[tuple[str, list[int], bool]]:
    return [(o.request_id, o.new_token_ids, o.finished) for o in outputs]


def test_an_output_that_cannot_be_built_leaves_the_state_as_it_was() -> None:
    reference = scheduler_mid_run()
    so = reference.schedule()
    expected = outputs_of(reference.update_from_output(so, Output(so, reference)))
    scheduled: dict[int, tuple[SchedulerOutput, Output, str]] = {}

    def prepare() -> Scheduler:
        sched = scheduler_mid_run()
        so = sched.schedule()
        scheduled[id(sched)] = (so, Output(so, sched), sched.debug_snapshot())
        return sched

    def update(sched: Scheduler) -> Any:
        so, runner_output, _ = scheduled[id(sched)]
        return sched.update_from_output(so, runner_output)

    for k, sched, result in sweep(prepare, update):
        so, runner_output, before = scheduled.pop(id(sched))
        if isinstance(result, MemoryError):
            assert sched.debug_snapshot() == before, f"allocation {k}"
            result = sched.update_from_output(so, runner_output)
        assert outputs_of(result) == expected, f"allocation {k}"
        sched.check_invariants()


def test_aborts_whose_ids_cannot_be_listed_leave_the_state_as_they_were() -> None:
    def abort(sched: Scheduler) -> list[str]:
        return sched.finish_requests(iter(["b", "zz", "a"]), RequestStatus.FINISHED_ABORTED)

    before = scheduler_mid_run().debug_snapshot()
    for k, sched, result in sweep(scheduler_mid_run, abort):
        if isinstance(result, MemoryError):
            assert sched.debug_snapshot() == before, f"allocation {k}"
            result = abort(sched)
        assert result == ["b", "a"], f"allocation {k}"
        assert sched.get_request_counts() == (1, 1)
        sched.check_invariants()
