"""What a step hands out and takes back: SchedulerOutput's and RequestOutputs' read-only
columns, RequestOutput and RequestStatus, runner outputs matched to their step (once each, in
order, in the runner's own row order), and the ids a step holds."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

from llmsched import (
    ModelRunnerOutput,
    OutputMismatchError,
    RequestOutputs,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)

from conftest import add_requests, make_scheduler, one_token_each, runner_output

SCHEDULER_OUTPUT_ARRAYS = (
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


def test_scheduler_output_arrays_are_read_only_int32_and_ids_are_the_same_objects() -> None:
    sched = make_scheduler()
    request_id = "".join(["req", "-", "x"])  # built at run time: not an interned constant
    sched.add_request(request_id, [1, 2, 3], max_tokens=5)
    so = sched.schedule()
    # Empty ones included (spec_token_ids here): every empty column is one shared array.
    for name in SCHEDULER_OUTPUT_ARRAYS:
        array = getattr(so, name)
        assert array.dtype == np.int32 and not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0
        with pytest.raises(ValueError, match="WRITEABLE"):
            array.flags.writeable = True
    assert so.req_ids[0] is request_id
    outs = sched.update_from_output(so, one_token_each(so))
    assert outs[0].request_id is request_id
    so = sched.schedule()
    assert so.req_ids[0] is request_id


def test_request_output_fields() -> None:
    sched = make_scheduler()
    sched.add_request("a", [1, 2], max_tokens=5, stop_token_ids=[42])
    so = sched.schedule()
    (out,) = sched.update_from_output(so, one_token_each(so, token=9))
    assert (out.request_id, out.new_token_ids, out.status) == ("a", [9], RequestStatus.RUNNING)
    assert not out.finished and out.finish_reason is None and out.stop_reason is None
    so = sched.schedule()
    (out,) = sched.update_from_output(so, one_token_each(so, token=42))
    assert out.status is RequestStatus.FINISHED_STOPPED
    assert (out.finished, out.finish_reason, out.stop_reason) == (True, "stop", 42)


def test_request_status_is_vllms_enum() -> None:
    names = [s.name for s in RequestStatus]
    assert names[:6] == [
        "WAITING",
        "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR",
        "WAITING_FOR_REMOTE_KVS",
        "WAITING_FOR_STREAMING_REQ",
        "RUNNING",
        "PREEMPTED",
    ]
    assert [s.value for s in RequestStatus] == list(range(1, 13))
    assert not RequestStatus.PREEMPTED.is_finished and RequestStatus.FINISHED_STOPPED.is_finished
    assert RequestStatus.FINISHED_IGNORED.finish_reason == "length"


def test_runner_output_must_match_its_step() -> None:
    sched = make_scheduler()
    add_requests(sched, 2)
    so = sched.schedule()
    before = sched.debug_snapshot()
    bad: list[Any] = [
        ModelRunnerOutput.from_lists(["0"], [[1]]),  # a request missing
        ModelRunnerOutput.from_lists(["0", "9"], [[1], [1]]),  # an unknown one
        ModelRunnerOutput.from_lists(["0", "0"], [[1], [1]]),  # one twice
        ModelRunnerOutput.from_lists(["0", "1"], [[1, 2, 3], [1]]),  # more than 1 + drafts
        ModelRunnerOutput.empty(),
        object(),
    ]
    for runner_out in bad:
        with pytest.raises(OutputMismatchError):
            sched.update_from_output(so, runner_out)
        assert sched.debug_snapshot() == before
    with pytest.raises(OutputMismatchError, match="sampled_token_ids"):
        ModelRunnerOutput(["0", "1"], np.array([1.0, 2.0]), np.array([1, 1]))
    # How the counts fit the ids and the tokens is the scheduler's check, at apply time.
    for counts in ([1], [1, 1, 0], [2, 1], [-1, 3]):
        with pytest.raises(OutputMismatchError, match=r"num_sampled|requests|tokens"):
            sched.update_from_output(
                so, ModelRunnerOutput(["0", "1"], np.array([1, 2], np.int32), np.array(counts))
            )
        assert sched.debug_snapshot() == before
    with pytest.raises(OutputMismatchError, match="cannot be negative"):
        sched.update_from_output(so, runner_output(so, [[1], [-1]]))
    # Any order of the same requests is fine.
    outs = sched.update_from_output(so, ModelRunnerOutput.from_lists(["1", "0"], [[8], [9]]))
    assert {o.request_id: o.new_token_ids for o in outs} == {"0": [9], "1": [8]}


def test_outputs_apply_once_and_in_order() -> None:
    sched = make_scheduler(async_scheduling=True)
    add_requests(sched, 1)
    first = sched.schedule()
    second = sched.schedule()
    assert len(second.req_ids) == 1  # scheduled again with an output placeholder
    with pytest.raises(OutputMismatchError, match="out of order"):
        sched.update_from_output(second, one_token_each(second))
    sched.update_from_output(first, one_token_each(first))
    with pytest.raises(OutputMismatchError, match="already applied"):
        sched.update_from_output(first, one_token_each(first))
    other = Scheduler(sched.config)
    with pytest.raises(OutputMismatchError, match="another Scheduler"):
        other.update_from_output(second, one_token_each(second))
    sched.update_from_output(second, one_token_each(second))
    assert sched.num_steps_in_flight == 0


@pytest.mark.parametrize("ids", ["same objects", "equal copies"])
def test_runner_rows_in_the_runners_own_order_reach_their_requests(ids: str) -> None:
    """A runner keeps its own batch order (vLLM's does): rows are matched to the step's
    requests by id, whether the ids are the step's own objects or equal strings."""
    sched = make_scheduler()
    add_requests(sched, 6, req_ids=[f"request-{i}" for i in range(6)])
    so = sched.schedule()
    order = [so.req_ids[i] for i in (3, 0, 5, 1, 4, 2)]
    if ids == "equal copies":
        order = ["".join(list(rid)) for rid in order]
        assert not {id(rid) for rid in order} & {id(rid) for rid in so.req_ids}
    tokens = {rid: 100 + i for i, rid in enumerate(order)}
    rows = [[tokens[rid]] for rid in order]
    outputs = sched.update_from_output(so, ModelRunnerOutput.from_lists(order, rows))
    outputs_by_id = {o.request_id: o.new_token_ids for o in outputs}
    assert outputs_by_id == {rid: [tokens[rid]] for rid in order}
    assert len(outputs_by_id) == 6
    twice = make_scheduler()
    add_requests(twice, 2)
    so = twice.schedule()
    first = so.req_ids[0]
    with pytest.raises(OutputMismatchError, match="appears twice"):
        twice.update_from_output(so, ModelRunnerOutput.from_lists([first, first], [[1], [2]]))


def test_runner_ids_that_only_claim_to_be_the_steps_are_refused() -> None:
    """Runner rows are matched by id object, else by text: an object that is not a str is
    refused by name, even one that claims to equal every id, or whose ``==`` raises; the
    step's ids as equal strings, in step order, are the step's ids."""

    class EqualToAll:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    class EqRaises:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("== raised")

        __hash__ = object.__hash__

    sched = make_scheduler()
    add_requests(sched, 3, req_ids=[f"request-{i}" for i in range(3)])
    so = sched.schedule()
    for bad in (EqualToAll(), EqRaises(), 7):
        ids: list[Any] = list(so.req_ids)
        ids[1] = bad
        with pytest.raises(OutputMismatchError, match=r"req_ids\[1\]: must be a str"):
            sched.update_from_output(so, ModelRunnerOutput.from_lists(ids, [[7]] * 3))
    copies = ["".join(list(rid)) for rid in so.req_ids]
    outputs = sched.update_from_output(so, ModelRunnerOutput.from_lists(copies, [[7], [8], [9]]))
    assert [(o.request_id, list(o.new_token_ids)) for o in outputs] == list(
        zip(so.req_ids, [[7], [8], [9]], strict=True)
    )


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_steps_release_every_reference_to_the_ids_they_hand_out(async_scheduling: bool) -> None:
    """A step holds its ids (its ``req_ids`` list, and a private copy its outputs share) and
    releases them once the step and its outputs are gone; a finished request's id is
    released by the scheduler. Exact reference counts: a leak or a double release of one
    reference per step shows."""
    sched = Scheduler(
        SchedulerConfig(
            max_model_len=64,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            block_size=4,
            num_gpu_blocks=64,
            async_scheduling=async_scheduling,
        )
    )
    ids = [f"ref-{i}" for i in range(12)]  # built at run time: not shared constants
    for rid in ids:
        sched.add_request(rid, [1, 2, 3], max_tokens=6)
    held_by_scheduler = [sys.getrefcount(rid) for rid in ids]
    in_flight = []
    for _ in range(40):
        so = sched.schedule()
        in_flight.append(so)
        if len(in_flight) == (2 if async_scheduling else 1):
            oldest = in_flight.pop(0)
            outputs = sched.update_from_output(oldest, one_token_each(oldest, token=7))
            del oldest, outputs
        del so
    while in_flight:
        oldest = in_flight.pop(0)
        sched.update_from_output(oldest, one_token_each(oldest, token=7))
        del oldest
    assert not sched.has_unfinished_requests()
    sched.schedule()  # reports the last finished requests: the scheduler lets their ids go
    assert [sys.getrefcount(rid) for rid in ids] == [count - 1 for count in held_by_scheduler]


def test_req_ids_stay_right_as_requests_finish_and_join_between_steps() -> None:
    """A step's ids are the previous step's, edited: requests that finished are cut, the
    ones admitted are appended. Every step's ``req_ids`` (and the outputs' ids) must be the
    running requests in order, as the objects given to ``add_request``, whether a step cuts
    a few (staggered finishes), none, or every other one of hundreds (a rebuild)."""
    sched = Scheduler(
        SchedulerConfig(
            max_model_len=256,
            max_num_seqs=300,
            max_num_batched_tokens=4096,
            block_size=16,
            num_gpu_blocks=4096,
        )
    )
    objects: dict[str, str] = {}

    def add(i: int, max_tokens: int) -> None:
        rid = f"batch-{i}"  # built at run time: an object of its own
        objects[rid] = rid
        sched.add_request(rid, [1, 2, 3], max_tokens=max_tokens)

    # Even requests stop after 12 tokens, odd ones after 40: one step cuts every other
    # request. Every 7th stops early, at 2 to 6 tokens: steps that cut a few.
    for i in range(400):
        add(i, 2 + i % 5 if i % 7 == 3 else 12 if i % 2 == 0 else 40)
    running: list[str] = []
    computed: dict[str, int] = {}
    finished_last: set[str] = set()
    most_cut = 0
    for step in range(60):
        if step % 3 == 0:
            add(400 + step, 5)
        so = sched.schedule()
        kept = [rid for rid in running if rid not in finished_last]
        most_cut = max(most_cut, len(running) - len(kept))
        assert so.req_ids == kept + list(so.new_req_ids), f"step {step}"
        assert all(rid is objects[rid] for rid in so.req_ids)
        for rid, c in zip(so.req_ids, so.num_computed_tokens.tolist(), strict=True):
            assert c == computed.get(rid, 0), f"step {step}: {rid}"
        for rid, n in zip(so.req_ids, so.num_scheduled_tokens.tolist(), strict=True):
            computed[rid] = computed.get(rid, 0) + n
        outputs = sched.update_from_output(so, one_token_each(so, token=7))
        assert outputs.req_ids == so.req_ids
        assert all(out.request_id is objects[out.request_id] for out in outputs)
        running = list(so.req_ids)
        finished_last = set(outputs.finished_req_ids)
    assert most_cut >= 100  # the step that cut every other request ran


REQUEST_OUTPUTS_COLUMNS = ("new_token_ids", "num_new_tokens", "statuses", "num_cached_blocks")


class Output:
    def __init__(self, so: SchedulerOutput, tokens: list[int]) -> None:
        self.req_ids = list(so.req_ids)
        self.sampled_token_ids = np.array(tokens, np.int32)
        self.num_sampled = np.ones(len(tokens), np.int32)


def a_step_and_its_outputs() -> tuple[SchedulerOutput, RequestOutputs]:
    """Three requests decode; "b" stops on its EOS (a finished output among them)."""
    sched = Scheduler(
        SchedulerConfig(async_scheduling=False, block_size=4, enable_prefix_caching=True)
    )
    for rid in "abc":
        sched.add_request(rid, list(range(1, 10)), max_tokens=5, eos_token_id=2)
    so = sched.schedule()
    outputs = sched.update_from_output(so, Output(so, [7, 2, 9]))
    assert [o.finished for o in outputs] == [False, True, False]
    return so, outputs


@pytest.mark.parametrize(
    "column",
    [("SchedulerOutput", name) for name in SCHEDULER_OUTPUT_ARRAYS]
    + [("RequestOutputs", name) for name in REQUEST_OUTPUTS_COLUMNS],
    ids=lambda c: f"{c[0]}.{c[1]}",
)
def test_every_column_is_a_read_only_int32_array(column: tuple[str, str]) -> None:
    so, outputs = a_step_and_its_outputs()
    owner = so if column[0] == "SchedulerOutput" else outputs
    array = getattr(owner, column[1])
    assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.ndim == 1
    assert not array.flags.writeable
    before = array.tolist()
    with pytest.raises(ValueError, match="read-only"):
        array[:] = 12345
    assert getattr(owner, column[1]).tolist() == before == array.tolist()


def test_request_outputs_index_like_a_sequence() -> None:
    _, outputs = a_step_and_its_outputs()
    n = len(outputs)
    elements = list(outputs)
    assert n == 3 and [o.request_id for o in elements] == ["a", "b", "c"]
    for i in range(-n, n):
        assert outputs[i] == elements[i]
    assert outputs[-1].request_id == "c" and outputs[-n].request_id == "a"
    for bad in (n, n + 1, -n - 1, 2**62, -(2**62)):
        with pytest.raises(IndexError):
            outputs[bad]
    with pytest.raises(IndexError):
        outputs[2**100]
    assert outputs[1:] == elements[1:] and outputs[::-1] == elements[::-1]
    with pytest.raises(TypeError):
        outputs["a"]  # type: ignore[call-overload]
