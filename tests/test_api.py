"""The engine-facing API: configuration, validation, errors and the objects a step returns."""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import llmsched
from llmsched import (
    ConfigError,
    DuplicateRequestError,
    InvalidRequestError,
    LlmschedError,
    ModelRunnerOutput,
    OutputMismatchError,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    UnknownRequestError,
)

from conftest import add_requests, make_scheduler, one_token_each, runner_output, spec_tokens

# ------------------------------------------------------------------------------ config


def test_config_defaults_are_vllms() -> None:
    cfg = SchedulerConfig()
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size) == (128, 2048, 16)
    assert cfg.max_num_scheduled_tokens == cfg.max_num_batched_tokens
    assert cfg.max_num_active_seqs == cfg.max_num_seqs
    assert cfg.enable_chunked_prefill and cfg.scheduler_reserve_full_isl
    assert cfg.async_scheduling  # vLLM resolves async scheduling on by default
    assert (cfg.long_prefill_token_threshold, cfg.num_speculative_tokens, cfg.watermark) == (
        0,
        0,
        0,
    )
    assert cfg.num_sampled_tokens_per_step == 1
    assert cfg.policy == "fcfs" and cfg.enable_prefix_caching


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_model_len", 0),
        ("max_model_len", -5),
        ("max_model_len", 1),  # no room for the sampled token
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 64),  # below max_num_seqs=128
        ("block_size", 0),
        ("num_gpu_blocks", 1),  # only the null block
        ("long_prefill_token_threshold", -1),
        ("long_prefill_token_threshold", 4096),  # above max_model_len
        ("num_speculative_tokens", -1),
        ("num_lookahead_tokens", 1),  # without speculative decoding
        ("max_num_new_slots_for_drafting", 1),  # without speculative decoding
        ("num_sampled_tokens_per_step", 2),
        ("watermark", 1.0),
        ("watermark", -0.1),
        ("watermark", float("nan")),
        ("max_num_active_seqs", 1000),  # above max_num_seqs
        ("policy", "lifo"),
        ("enable_prefix_caching", "yes"),
        ("max_model_len", "2048"),
        ("max_model_len", 2048.0),
        ("async_scheduling", 1),
        ("max_num_seqs", True),
        ("no_such_field", 1),
    ],
)
def test_invalid_config_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        SchedulerConfig(**{field: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, LlmschedError)


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        SchedulerConfig(enable_chunked_prefill=False, max_model_len=4096)
    SchedulerConfig(enable_chunked_prefill=False, max_model_len=2048)


def test_budgets_must_fit_the_steps_that_cannot_be_split() -> None:
    """Found by fuzzing: a budget below a padded decode (1 + K), or below the longest
    request with chunked prefill off, left a request waiting forever; both are refused."""
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=4, max_num_scheduled_tokens=4)
    SchedulerConfig(num_speculative_tokens=4, max_num_scheduled_tokens=5)
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SchedulerConfig(
            num_speculative_tokens=4,
            max_num_new_slots_for_drafting=4,
            max_num_seqs=8,
            max_num_batched_tokens=8,
        )
    with pytest.raises(ConfigError, match="max_num_scheduled_tokens"):
        SchedulerConfig(
            enable_chunked_prefill=False, max_model_len=2048, max_num_scheduled_tokens=1024
        )
    SchedulerConfig(enable_chunked_prefill=False, max_model_len=2048, max_num_scheduled_tokens=2047)


def test_config_is_a_value() -> None:
    cfg = SchedulerConfig(max_model_len=4096, num_speculative_tokens=2)
    assert cfg == SchedulerConfig(num_speculative_tokens=2, max_model_len=4096)
    assert hash(cfg) == hash(SchedulerConfig(num_speculative_tokens=2, max_model_len=4096))
    assert cfg != SchedulerConfig(max_model_len=4096)
    # A derived value and the same value given explicitly are the same config.
    assert SchedulerConfig() == SchedulerConfig(max_num_scheduled_tokens=2048)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    bigger = cfg.replace(max_num_batched_tokens=4096)
    assert bigger.max_num_scheduled_tokens == 4096  # still derived after replace
    assert cfg.max_num_batched_tokens == 2048  # immutable
    with pytest.raises(ConfigError, match="max_model_len"):
        cfg.replace(max_model_len=0)
    assert cfg.to_dict()["max_model_len"] == 4096
    assert "max_model_len=4096" in repr(cfg)
    with pytest.raises(AttributeError):
        cfg.max_model_len = 8  # type: ignore[misc]


def test_scheduler_shares_its_config_object() -> None:
    cfg = SchedulerConfig(max_model_len=512)
    assert Scheduler(cfg).config is cfg
    with pytest.raises(ConfigError, match="config"):
        Scheduler({"max_model_len": 512})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ add_request


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
        (("x", [1] * 40), {"max_tokens": 100}, "max_tokens"),  # could outgrow the KV pool
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


# ------------------------------------------------------------------------------ outputs


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


def test_request_outputs_columns_are_read_only_int32() -> None:
    sched = make_scheduler()
    sched.add_request("a", [1, 2, 3], max_tokens=5)
    outs = sched.update_from_output(sched.schedule(), ModelRunnerOutput.from_lists(["a"], [[7]]))
    for name in ("new_token_ids", "num_new_tokens", "statuses"):
        array = getattr(outs, name)
        assert array.dtype == np.int32 and not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0
    assert outs.new_token_ids.tolist() == [7] and outs.num_new_tokens.tolist() == [1]


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


# ------------------------------------------------------------------------------ runner output


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


def test_draft_validation() -> None:
    sched = make_scheduler(num_speculative_tokens=2)
    add_requests(sched, 1)
    with pytest.raises(InvalidRequestError, match="draft_token_ids"):
        sched.update_draft_token_ids(["0"], [[1, 2, 3]])  # more than K
    with pytest.raises(InvalidRequestError, match="draft_token_ids"):
        sched.update_draft_token_ids(["0"], [[1, -5]])
    with pytest.raises(InvalidRequestError, match="appears twice"):
        sched.update_draft_token_ids(["0", "0"], [[1], [2]])
    sched.update_draft_token_ids(["gone"], [[1]])  # finished or unknown ids are ignored


FLAT_DRAFT_FORMS: dict[str, Callable[[list[int]], Any]] = {
    "int32": lambda tokens: np.array(tokens, dtype=np.int32),
    "int32-strided": lambda tokens: np.repeat(np.array(tokens, dtype=np.int32), 2)[::2],
    "int64": lambda tokens: np.array(tokens, dtype=np.int64),
    "list": list,
}


@pytest.mark.parametrize("form", FLAT_DRAFT_FORMS)
def test_flat_drafts_schedule_as_draft_lists_do(form: str) -> None:
    """``update_draft_token_ids(ids, flat, counts)`` gives each request the same drafts
    as the list of rows: rows of every length up to K, padding, unknown ids; the flat
    drafts an int32 array (taken as it is), a strided one, int64 or a list."""
    lists, flat = make_scheduler(num_speculative_tokens=3), make_scheduler(num_speculative_tokens=3)
    for sched in (lists, flat):
        add_requests(sched, 5, max_tokens=12)
    rng = np.random.default_rng(7)
    for _ in range(10):
        so_lists, so_flat = lists.schedule(), flat.schedule()
        assert spec_tokens(so_lists) == spec_tokens(so_flat)
        lists.update_from_output(so_lists, one_token_each(so_lists))
        flat.update_from_output(so_flat, one_token_each(so_flat))
        ids = [*so_lists.req_ids, "gone"]
        rows = [[int(t) for t in rng.integers(-1, 50, rng.integers(0, 4))] for _ in ids]
        lists.update_draft_token_ids(ids, rows)
        tokens = FLAT_DRAFT_FORMS[form]([t for row in rows for t in row])
        flat.update_draft_token_ids(ids, tokens, np.array([len(r) for r in rows], np.int32))
    assert any(spec_tokens(lists.schedule()).values())


def test_drafts_name_their_requests_in_any_sequence() -> None:
    """The step's own id list, a tuple or a generator of its ids, and a list mixing its
    objects with strings built anew give the same drafts; a duplicate object or a non-str
    in a list is named by position and changes nothing."""
    shapes = {
        "list": lambda ids: list(ids),
        "tuple": lambda ids: tuple(ids),
        "generator": lambda ids: (rid for rid in ids),
        "mixed": lambda ids: [rid if i % 2 else "".join(list(rid)) for i, rid in enumerate(ids)],
    }
    drafts = {}
    for shape, make in shapes.items():
        sched = make_scheduler(num_speculative_tokens=2)
        add_requests(sched, 4, max_tokens=12)
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so))
        ids = so.req_ids
        with pytest.raises(InvalidRequestError, match=r"req_ids\[2\].*appears twice"):
            sched.update_draft_token_ids([ids[0], ids[1], ids[0]], [[1], [2], [3]])
        with pytest.raises(InvalidRequestError, match=r"req_ids\[1\]: must be a str"):
            sched.update_draft_token_ids([ids[0], 7], [[1], [2]])
        sched.update_draft_token_ids(make(ids), [[10 + i, 20 + i] for i in range(len(ids))])
        drafts[shape] = spec_tokens(sched.schedule())
    assert drafts["list"] == {f"{i}": [10 + i, 20 + i] for i in range(4)}
    assert all(d == drafts["list"] for d in drafts.values()), drafts


def test_drafts_find_their_request_by_id_object_or_by_text() -> None:
    """The step's own id objects and equal strings built anew name the same request; a
    finished request's id object (still in a step's lists until reported) and a stale
    object of a finished id now reused are never given drafts of another request."""
    by_object = make_scheduler(num_speculative_tokens=2)
    by_text = make_scheduler(num_speculative_tokens=2)
    for sched in (by_object, by_text):
        add_requests(sched, 3, max_tokens=12)
    for _ in range(3):
        so_object, so_text = by_object.schedule(), by_text.schedule()
        assert spec_tokens(so_object) == spec_tokens(so_text)
        by_object.update_from_output(so_object, one_token_each(so_object))
        by_text.update_from_output(so_text, one_token_each(so_text))
        fresh = ["".join(list(rid)) for rid in so_text.req_ids]
        assert all(a == b and a is not b for a, b in zip(fresh, so_text.req_ids, strict=True))
        by_object.update_draft_token_ids(so_object.req_ids, [[5, 6]] * len(fresh))
        by_text.update_draft_token_ids(fresh, [[5, 6]] * len(fresh))
    drafts_object, drafts_text = spec_tokens(by_object.schedule()), spec_tokens(by_text.schedule())
    assert drafts_object == drafts_text == {rid: [5, 6] for rid in drafts_text}
    assert len(drafts_text) == 3

    sched = make_scheduler(num_speculative_tokens=2)
    add_requests(sched, 2, max_tokens=12)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    old = so.req_ids[0]
    sched.finish_requests(old, RequestStatus.FINISHED_ABORTED)
    sched.update_draft_token_ids([old], [[5, 6]])  # finished, not yet reported: ignored
    sched.add_request(old, [1, 2, 3], max_tokens=4)  # the same object names a new request
    sched.update_draft_token_ids([old], [[5, 6]])  # waiting: its drafts are dropped
    so = sched.schedule()
    assert old in so.finished_req_ids and old in so.req_ids
    assert old not in spec_tokens(so)
    sched.update_from_output(so, one_token_each(so))
    sched.update_draft_token_ids([old], [[8, 9]])
    assert spec_tokens(sched.schedule())[old] == [8, 9]


# ------------------------------------------------------------------------------ threads


def test_concurrent_calls_are_serialized() -> None:
    """Threads adding, scheduling and applying at once never corrupt the state."""
    sched = Scheduler(
        SchedulerConfig(max_model_len=256, num_gpu_blocks=512, async_scheduling=False)
    )
    lock = threading.Lock()  # keeps each schedule/update pair together, as an engine does
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(200):
                sched.add_request(f"{k}-{i}", [k, i % 7 + 1], max_tokens=3)
                with lock:
                    so = sched.schedule()
                    sched.update_from_output(so, one_token_each(so, token=5))
                sched.get_num_unfinished_requests()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    sched.check_invariants()
    while sched.has_requests():
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so, token=5))
    sched.check_invariants()
    assert sched.num_free_blocks == 511


def test_public_names() -> None:
    for name in llmsched.__all__:
        assert hasattr(llmsched, name), name


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
