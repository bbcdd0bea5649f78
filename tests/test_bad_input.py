"""Bad input: every public call with every kind of wrong argument.

Each case must raise a clear exception: a ``ValueError`` subclass (``ConfigError``,
``InvalidRequestError``, ``OutputMismatchError``...) or, for an id that is not live where the
API documents it, ``UnknownRequestError`` (a ``KeyError``), with a message that names what
was wrong (each case gives a pattern). A Rust panic (``PanicException``, a ``BaseException``)
or an ``InternalError`` fails the case, and so does any other exception class. Calls on a
scheduler must leave it exactly as it was: ``debug_snapshot()`` and every other read-out are
compared before and after, and the scheduler then runs its requests to completion.

Signature errors (a missing required argument, an unexpected positional argument) are
Python's ``TypeError`` by design and are not cases here.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pytest

from llmsched import (
    ConfigError,
    DuplicateRequestError,
    Engine,
    InternalError,
    InvalidRequestError,
    LlmschedError,
    ModelRunnerOutput,
    OutputMismatchError,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SimulatedModelRunner,
    UnknownRequestError,
)

M = 64
BASE: dict[str, Any] = {
    "max_model_len": M,
    "block_size": 4,
    "num_gpu_blocks": 64,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 32,
    "num_speculative_tokens": 2,
    "enable_prefix_caching": True,
    "async_scheduling": False,
}
WORLD_CONFIGS: dict[str, dict[str, Any]] = {
    "sync": BASE,
    "async": {**BASE, "async_scheduling": True},
    "k0": {**BASE, "num_speculative_tokens": 0},
    "tiny": {**BASE, "num_gpu_blocks": 8},  # 7 usable blocks of 4: a request of 29 tokens
    # Multimodal inputs of up to 16 embeddings.
    "mm": {**BASE, "max_num_encoder_input_tokens": 16, "encoder_cache_size": 16},
}


class Duck:
    """A runner output that skips ``ModelRunnerOutput``'s checks: what any runner may send."""

    def __init__(self, req_ids: Any, sampled_token_ids: Any, num_sampled: Any) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = sampled_token_ids
        self.num_sampled = num_sampled


class NoCounts:
    """A runner output without ``num_sampled``."""

    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = np.zeros(0, dtype=np.int32)


class HugeIndex:
    """An integer-like object whose value does not fit 64 bits."""

    def __index__(self) -> int:
        return 2**80


@dataclass
class World:
    """A scheduler mid-run: one step applied, one (sync) or two (async) in flight."""

    kind: str
    config: SchedulerConfig
    sched: Scheduler
    runner: SimulatedModelRunner
    applied: tuple[SchedulerOutput, ModelRunnerOutput]
    empty: SchedulerOutput  # an empty step, already applied
    in_flight: list[tuple[SchedulerOutput, ModelRunnerOutput]]
    other: SchedulerOutput  # a step of another scheduler

    @property
    def so(self) -> SchedulerOutput:
        """The oldest step in flight: ``a`` decoding with drafts, ``b`` a non-final chunk."""
        return self.in_flight[0][0]

    def rows(self) -> dict[str, list[int]]:
        """The runner's correct tokens for the oldest step in flight, by request."""
        out = self.in_flight[0][1]
        ends = np.cumsum(out.num_sampled)
        return {
            rid: out.sampled_token_ids[end - n : end].tolist()
            for rid, n, end in zip(
                out.req_ids, out.num_sampled.tolist(), ends.tolist(), strict=True
            )
        }

    def output(self, rows: dict[str, list[int]]) -> ModelRunnerOutput:
        return ModelRunnerOutput.from_lists(list(rows), list(rows.values()))

    def flat(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        rows = self.rows()
        tokens = np.array([t for row in rows.values() for t in row], dtype=np.int32)
        counts = np.array([len(row) for row in rows.values()], dtype=np.int32)
        return list(rows), tokens, counts


def build_world(kind: str) -> World:
    config = SchedulerConfig(**WORLD_CONFIGS[kind])
    sched = Scheduler(config)
    runner = SimulatedModelRunner(config, seed=1, acceptance_rate=0.5)
    other = Scheduler(config)
    other.add_request("a", [1, 2], max_tokens=2)
    other_so = other.schedule()
    empty = sched.schedule()
    sched.update_from_output(empty, runner.execute_model(empty))
    sched.add_request("a", [1, 2, 3, 4, 5, 6], max_tokens=20)
    if kind != "tiny":
        sched.add_request("b", list(range(60)), max_tokens=3)
    sched.add_request("gone", [9, 9], max_tokens=4)
    sched.finish_requests("gone", RequestStatus.FINISHED_ABORTED)
    step0 = sched.schedule()
    out0 = runner.execute_model(step0)
    sched.update_from_output(step0, out0)
    drafts = runner.take_draft_token_ids()
    if drafts is not None and drafts[0]:
        sched.update_draft_token_ids(*drafts)
    in_flight = []
    for _ in range(2 if config.async_scheduling else 1):
        so = sched.schedule()
        in_flight.append((so, runner.execute_model(so)))
    sched.add_request("w", [7, 8, 9], max_tokens=2)  # waiting
    sched.check_invariants()
    if kind != "tiny":  # what the cases rely on
        so = in_flight[0][0]
        assert so.req_ids == ["a", "b"]
        assert so.num_spec_tokens.tolist() == [config.num_speculative_tokens, 0]
        assert int(so.num_computed_tokens[1] + so.num_scheduled_tokens[1]) < 60  # a chunk
    return World(kind, config, sched, runner, (step0, out0), empty, in_flight, other_so)


def state(sched: Scheduler) -> tuple[Any, ...]:
    """Everything a caller can read of a scheduler."""
    return (
        sched.debug_snapshot(),
        sched.stats(),
        sched.free_block_queue(),
        sched.running_request_ids(),
        sched.waiting_request_ids(),
        sched.num_steps_in_flight,
        sched.get_request_counts(),
        sched.get_kv_cache_usage(),
        sched.has_requests(),
        sched.pause_state,
    )


def run_to_completion(w: World) -> None:
    """Apply the steps in flight, then run every request to its end."""
    for so, out in w.in_flight:
        w.sched.update_from_output(so, out)
    for _ in range(1000):
        if not w.sched.has_requests():
            break
        so = w.sched.schedule()
        w.sched.update_from_output(so, w.runner.execute_model(so))
        drafts = w.runner.take_draft_token_ids()
        if drafts is not None and drafts[0]:
            w.sched.update_draft_token_ids(*drafts)
    w.sched.check_invariants()
    assert not w.sched.has_requests()
    assert w.sched.num_free_blocks == w.config.num_gpu_blocks - 1


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[World], object]
    error: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    world: str = "sync"


CASES: list[Case] = []


def case(
    name: str,
    call: Callable[[World], object],
    error: type[BaseException] | tuple[type[BaseException], ...],
    match: str,
    world: str = "sync",
) -> None:
    CASES.append(Case(name, call, error, match, world))


# ------------------------------------------------------------------------------ add_request


def add(*args: Any, **kwargs: Any) -> Callable[[World], object]:
    kwargs.setdefault("max_tokens", 2)
    return lambda w: w.sched.add_request(*args, **kwargs)


for label, rid in [
    ("int", 7),
    ("none", None),
    ("bytes", b"x"),
    ("float", 1.5),
    ("list", ["x"]),
    ("bool", True),
]:
    case(f"add_request-id-{label}", add(rid, [1]), InvalidRequestError, "request_id")
case("add_request-id-empty", add("", [1]), InvalidRequestError, "request_id")
case("add_request-id-surrogate", add("\ud800", [1]), ValueError, "surrogate")
case("add_request-duplicate-running", add("a", [1]), DuplicateRequestError, "request_id=.a.")
case("add_request-duplicate-waiting", add("w", [1]), DuplicateRequestError, "request_id=.w.")

BAD_PROMPTS: list[tuple[str, Any, str]] = [
    ("empty-list", [], "prompt_token_ids"),
    ("empty-array", np.zeros(0, dtype=np.int32), "prompt_token_ids"),
    ("str", "abc", "prompt_token_ids"),
    ("none", None, "prompt_token_ids"),
    ("int", 5, "prompt_token_ids"),
    ("negative", [1, -2], r"prompt_token_ids\[1\]"),
    ("float", [1, 2.5], r"prompt_token_ids\[1\]"),
    ("numpy-float", [1, np.float32(2)], r"prompt_token_ids\[1\]"),
    ("bool", [True], r"prompt_token_ids\[0\]"),
    ("numpy-bool", [np.True_], r"prompt_token_ids\[0\]"),
    ("none-token", [1, None], r"prompt_token_ids\[1\]"),
    ("str-token", [1, "2"], r"prompt_token_ids\[1\]"),
    ("nested", [[1]], r"prompt_token_ids\[0\]"),
    ("int32-overflow", [1, 2**31], r"prompt_token_ids\[1\]"),
    ("int64-overflow", [2**63], r"prompt_token_ids\[0\]"),
    ("huge", [2**80], r"prompt_token_ids\[0\]"),
    ("huge-index", [HugeIndex()], r"prompt_token_ids\[0\]"),
    ("numpy-int64-huge", [np.int64(2**40)], r"prompt_token_ids\[0\]"),
    ("numpy-uint64-max", [np.uint64(2**64 - 1)], r"prompt_token_ids\[0\]"),
    ("array-2d", np.array([[1, 2]], dtype=np.int32), "prompt_token_ids"),
    ("array-0d", np.array(5, dtype=np.int32), "prompt_token_ids"),
    ("array-float", np.array([1.0]), "prompt_token_ids"),
    ("array-bool", np.array([True]), "prompt_token_ids"),
    ("array-object", np.array([1, None], dtype=object), "prompt_token_ids"),
    ("array-str", np.array(["1"]), "prompt_token_ids"),
    ("array-complex", np.array([1j]), "prompt_token_ids"),
    ("array-int64-big", np.array([2**40], dtype=np.int64), r"prompt_token_ids\[0\]"),
    ("array-int64-negative", np.array([3, -1], dtype=np.int64), r"prompt_token_ids\[1\]"),
    ("array-int32-negative", np.array([-1], dtype=np.int32), r"prompt_token_ids\[0\]"),
    ("array-uint32-big", np.array([2**32 - 1], dtype=np.uint32), r"prompt_token_ids\[0\]"),
    ("array-uint64-big", np.array([2**64 - 1], dtype=np.uint64), r"prompt_token_ids\[0\]"),
    ("length-M", list(range(M)), "prompt_token_ids"),
    ("length-2M", np.arange(2 * M, dtype=np.int32), "prompt_token_ids"),
    ("length-million", [1] * 1_000_000, "prompt_token_ids"),
]
for label, prompt, pattern in BAD_PROMPTS:
    case(f"add_request-prompt-{label}", add("x", prompt), InvalidRequestError, pattern)

BAD_KWARGS: list[tuple[str, dict[str, Any], str]] = [
    ("max_tokens-0", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens-negative", {"max_tokens": -1}, "max_tokens"),
    ("max_tokens-float", {"max_tokens": 1.5}, "max_tokens"),
    ("max_tokens-str", {"max_tokens": "3"}, "max_tokens"),
    ("max_tokens-none", {"max_tokens": None}, "max_tokens"),
    ("max_tokens-bool", {"max_tokens": True}, "max_tokens"),
    ("max_tokens-int32-overflow", {"max_tokens": 2**31}, "max_tokens"),
    ("max_tokens-huge", {"max_tokens": 2**70}, "max_tokens"),
    ("max_tokens-numpy-float", {"max_tokens": np.float64(3)}, "max_tokens"),
    ("min_tokens-negative", {"min_tokens": -1}, "min_tokens"),
    ("min_tokens-float", {"min_tokens": 1.5}, "min_tokens"),
    ("min_tokens-str", {"min_tokens": "1"}, "min_tokens"),
    ("min_tokens-int32-overflow", {"min_tokens": 2**31}, "min_tokens"),
    ("min_tokens-bool", {"min_tokens": True}, "min_tokens"),
    ("min_tokens-above-max_tokens", {"max_tokens": 3, "min_tokens": 4}, "min_tokens.*max_tokens"),
    ("eos-negative", {"eos_token_id": -1}, "eos_token_id"),
    ("eos-int32-overflow", {"eos_token_id": 2**31}, "eos_token_id"),
    ("eos-float", {"eos_token_id": 1.5}, "eos_token_id"),
    ("eos-str", {"eos_token_id": "2"}, "eos_token_id"),
    ("eos-bool", {"eos_token_id": True}, "eos_token_id"),
    ("eos-list", {"eos_token_id": [2]}, "eos_token_id"),
    ("stop-negative", {"stop_token_ids": [3, -3]}, r"stop_token_ids\[1\]"),
    ("stop-float", {"stop_token_ids": [1.5]}, r"stop_token_ids\[0\]"),
    ("stop-str", {"stop_token_ids": "ab"}, "stop_token_ids"),
    ("stop-int", {"stop_token_ids": 5}, "stop_token_ids"),
    ("stop-int32-overflow", {"stop_token_ids": [2**31]}, r"stop_token_ids\[0\]"),
    ("stop-none-token", {"stop_token_ids": [None]}, r"stop_token_ids\[0\]"),
    ("stop-array-float", {"stop_token_ids": np.array([1.0])}, "stop_token_ids"),
    ("stop-array-2d", {"stop_token_ids": np.array([[1]])}, "stop_token_ids"),
    ("arrival-inf", {"arrival_time": math.inf}, "arrival_time"),
    ("arrival-minus-inf", {"arrival_time": -math.inf}, "arrival_time"),
    ("arrival-nan", {"arrival_time": math.nan}, "arrival_time"),
    ("arrival-str", {"arrival_time": "now"}, "arrival_time"),
    ("arrival-bool", {"arrival_time": True}, "arrival_time"),
    ("arrival-complex", {"arrival_time": 1j}, "arrival_time"),
    ("arrival-list", {"arrival_time": [1.0]}, "arrival_time"),
    ("computed-negative", {"num_computed_tokens": -1}, "num_computed_tokens"),
    ("computed-whole-prompt", {"num_computed_tokens": 3}, "num_computed_tokens"),
    ("computed-beyond-prompt", {"num_computed_tokens": 50}, "num_computed_tokens"),
    ("computed-float", {"num_computed_tokens": 1.5}, "num_computed_tokens"),
    ("computed-str", {"num_computed_tokens": "1"}, "num_computed_tokens"),
    ("computed-bool", {"num_computed_tokens": True}, "num_computed_tokens"),
    ("computed-huge", {"num_computed_tokens": 2**70}, "num_computed_tokens"),
    ("priority-int32-overflow", {"priority": 2**40}, "priority"),
    ("priority-int32-underflow", {"priority": -(2**40)}, "priority"),
    ("priority-float", {"priority": 1.5}, "priority"),
    ("priority-str", {"priority": "1"}, "priority"),
    ("priority-bool", {"priority": True}, "priority"),
    ("salt-bytes", {"cache_salt": b"a"}, "cache_salt"),
    ("salt-int", {"cache_salt": 5}, "cache_salt"),
    ("salt-list", {"cache_salt": ["a"]}, "cache_salt"),
    ("lora-with-lora-off", {"lora_id": 1}, "lora_id=1: LoRA is off"),
    ("lora-bool", {"lora_id": True}, "lora_id"),
    ("lora-str", {"lora_id": "1"}, "lora_id"),
    # A 3-token prompt in blocks of 4 reaches one block: one key.
    ("embeds-str", {"prompt_embeds_keys": "ab"}, "prompt_embeds_keys: must be an iterable of"),
    ("embeds-bytes", {"prompt_embeds_keys": b"ab"}, "prompt_embeds_keys: .* got bytes"),
    ("embeds-key-str", {"prompt_embeds_keys": ["a"]}, r"prompt_embeds_keys\[0\]: must be bytes"),
    ("embeds-count", {"prompt_embeds_keys": [b"a", b"b"]}, "prompt_embeds_keys=2 keys: .*1 for 3"),
    ("embeds-empty-key", {"prompt_embeds_keys": [b""]}, r"prompt_embeds_keys\[0\]=<0 bytes>"),
    ("embeds-long-key", {"prompt_embeds_keys": [b"k" * 65]}, r"\[0\]=<65 bytes>: a key is 1 to 64"),
    ("embeds-endless", {"prompt_embeds_keys": itertools.repeat(b"k")}, "<more than .* keys>"),
]
for label, kwargs, pattern in BAD_KWARGS:
    case(f"add_request-{label}", add("x", [1, 2, 3], **kwargs), InvalidRequestError, pattern)


def test_a_request_with_computed_tokens_is_refused_beside_aligned_mamba() -> None:
    """No state block holds an aligned Mamba state computed elsewhere: the request is
    refused, naming the field, and the scheduler holds nothing."""
    config = SchedulerConfig(
        **{**BASE, "num_speculative_tokens": 0, "kv_cache_groups": "full,mamba"}
    )
    sched = Scheduler(config)
    with pytest.raises(InvalidRequestError, match=r"num_computed_tokens=2.*Mamba"):
        sched.add_request("x", [1, 2, 3], max_tokens=2, num_computed_tokens=2)
    assert not sched.has_requests()
    sched.add_request("x", [1, 2, 3], max_tokens=2)
    assert sched.has_requests()


BAD_MM_INPUTS: list[tuple[str, Any, str]] = [
    ("str", "abc", "mm_inputs: must be an iterable of tuples, got str"),
    ("int", 5, "mm_inputs: must be an iterable of tuples, got int"),
    ("short-tuple", [("x", 0)], r"mm_inputs\[0\]=.*must be a tuple"),
    ("list-item", [["x", 0, 4]], r"mm_inputs\[0\]=.*must be a tuple"),
    ("identifier-int", [(5, 0, 4)], r"mm_inputs\[0\]\.identifier"),
    ("identifier-empty", [("", 0, 4)], r"mm_inputs\[0\]\.identifier"),
    ("offset-float", [("x", 1.5, 4)], r"mm_inputs\[0\]\.offset=1\.5"),
    ("length-zero", [("x", 0, 0)], r"mm_inputs\[0\]\.length=0"),
    ("flags-ints", [("x", 0, 2, [1, 1])], r"mm_inputs\[0\]\.is_embed\[0\]=1"),
    ("flags-count", [("x", 0, 2, [True])], r"mm_inputs\[0\]\.is_embed"),
    ("over-budget", [("x", 0, 17)], r"mm_inputs\[0\]\.length=17.*could never be encoded"),
    ("overlap", [("x", 0, 4), ("y", 2, 4)], r"mm_inputs\[1\]\.offset=2"),
    ("beyond-prompt", [("x", 18, 4)], r"mm_inputs\[0\]\.offset=18"),
    ("endless", itertools.repeat(("x", 0, 1)), r"mm_inputs=<more than \d+ inputs>"),
]
for label, mm_inputs, pattern in BAD_MM_INPUTS:
    case(
        f"add_request-mm-{label}",
        add("x", list(range(1, 21)), mm_inputs=mm_inputs),
        InvalidRequestError,
        pattern,
        world="mm",
    )
case(
    "add_request-mm-text-only",
    add("x", list(range(1, 11)), mm_inputs=[("x", 0, 4)]),
    InvalidRequestError,
    "max_num_encoder_input_tokens=0",
)
case(
    "add_request-prompt-outgrows-the-pool",
    # 7 usable blocks of 4 hold a request of 29 tokens: a prompt of 28 at most.
    add("x", list(range(29)), max_tokens=40),
    InvalidRequestError,
    r"prompt_token_ids=<29 tokens>: at most 28 tokens.*7 usable blocks",
    world="tiny",
)

# ------------------------------------------------------------------------------ update_from_output


def apply(so: Callable[[World], Any], out: Callable[[World], Any]) -> Callable[[World], object]:
    return lambda w: w.sched.update_from_output(so(w), out(w))


def current(w: World) -> SchedulerOutput:
    return w.so


def good(w: World) -> ModelRunnerOutput:
    return w.in_flight[0][1]


for label, bad_so in [
    ("none", None),
    ("int", 5),
    ("str", "step"),
    ("list", []),
]:
    case(
        f"update-scheduler_output-{label}",
        apply(lambda w, v=bad_so: v, good),
        OutputMismatchError,
        "scheduler_output",
    )
case(
    "update-scheduler_output-is-a-runner-output",
    apply(good, good),
    OutputMismatchError,
    "scheduler_output",
)
case(
    "update-step-of-another-scheduler",
    apply(lambda w: w.other, good),
    OutputMismatchError,
    "another Scheduler",
)
case(
    "update-same-step-applied-twice",
    apply(lambda w: w.applied[0], lambda w: w.applied[1]),
    OutputMismatchError,
    "already applied",
)
case(
    "update-same-step-applied-twice-async",
    apply(lambda w: w.applied[0], lambda w: w.applied[1]),
    OutputMismatchError,
    "already applied",
    world="async",
)
case(
    "update-out-of-order",
    apply(lambda w: w.in_flight[1][0], lambda w: w.in_flight[1][1]),
    OutputMismatchError,
    "out of order",
    world="async",
)

for label, bad_out in [
    ("none", None),
    ("int", 5),
    ("object", object()),
    ("dict", {"req_ids": ["a", "b"]}),
    ("list", [[1], []]),
]:
    case(
        f"update-runner_output-{label}",
        apply(current, lambda w, v=bad_out: v),
        OutputMismatchError,
        "runner_output",
    )


def rows_with(change: Callable[[dict[str, list[int]]], dict[str, list[int]]]) -> Any:
    return lambda w: w.output(change(w.rows()))


def drop_b(rows: dict[str, list[int]]) -> dict[str, list[int]]:
    return {"a": rows["a"]}


def rename_b(rows: dict[str, list[int]]) -> dict[str, list[int]]:
    return {"a": rows["a"], "zzz": rows["b"]}


def extra(rows: dict[str, list[int]]) -> dict[str, list[int]]:
    return {**rows, "w": [1]}


def finished_extra(rows: dict[str, list[int]]) -> dict[str, list[int]]:
    return {**rows, "gone": [1]}


RUNNER_CASES: list[tuple[str, Any, str]] = [
    ("missing-id", rows_with(drop_b), "req_ids"),
    ("extra-live-id", rows_with(extra), "req_ids"),
    ("extra-finished-id", rows_with(finished_extra), "req_ids"),
    ("unknown-id", rows_with(rename_b), "misses .b."),
    (
        "duplicate-id",
        lambda w: ModelRunnerOutput.from_lists(["a", "a"], [w.rows()["a"], []]),
        "appears twice",
    ),
    ("empty", lambda w: ModelRunnerOutput.empty(), "req_ids"),
    (
        "too-many-tokens",
        rows_with(lambda r: {"a": [1] * (2 + 2), "b": r["b"]}),
        '"a".*at most 3',
    ),
    (
        "tokens-for-a-non-final-prefill-chunk",
        rows_with(lambda r: {"a": r["a"], "b": [5]}),
        '"b".*non-final prefill chunk',
    ),
    ("negative-token", rows_with(lambda r: {"a": [-1], "b": r["b"]}), "cannot be negative"),
    (
        "very-negative-token",
        rows_with(lambda r: {"a": [-(2**31)], "b": r["b"]}),
        "cannot be negative",
    ),
    (
        "negative-count",
        lambda w: Duck(["a", "b"], np.zeros(0, np.int32), np.array([1, -1], np.int32)),
        "cannot be negative",
    ),
    (
        "counts-shorter-than-ids",
        lambda w: Duck(["a", "b"], np.array([1], np.int32), np.array([1], np.int32)),
        "num_sampled|requests",
    ),
    (
        "counts-longer-than-ids",
        lambda w: Duck(["a", "b"], np.array([1], np.int32), np.array([1, 0, 0], np.int32)),
        "num_sampled|requests",
    ),
    (
        "tokens-do-not-add-up",
        lambda w: Duck(["a", "b"], np.array([1, 2, 3], np.int32), np.array([1, 0], np.int32)),
        "sampled_token_ids",
    ),
    ("no-num_sampled", lambda w: NoCounts(["a", "b"]), "num_sampled"),
    (
        "req_ids-not-iterable",
        lambda w: Duck(5, np.zeros(0, np.int32), np.zeros(0, np.int32)),
        "req_ids",
    ),
    (
        "req_ids-not-str",
        lambda w: Duck([1, 2], np.array([1], np.int32), np.array([1, 0], np.int32)),
        "req_ids",
    ),
    (
        "req_ids-bytes",
        lambda w: Duck([b"a", b"b"], np.array([1], np.int32), np.array([1, 0], np.int32)),
        "req_ids",
    ),
]
for dtype_label, make in [
    ("float", lambda t: t.astype(np.float64)),
    ("int64", lambda t: t.astype(np.int64)),
    ("uint32", lambda t: t.astype(np.uint32)),
    ("int16", lambda t: t.astype(np.int16)),
    ("bool", lambda t: t.astype(np.bool_)),
    ("object", lambda t: t.astype(object)),
    ("list", lambda t: t.tolist()),
    ("2-D", lambda t: t.reshape(1, -1)),
]:
    RUNNER_CASES.append(
        (
            f"sampled-{dtype_label}",
            lambda w, make=make: Duck(w.flat()[0], make(w.flat()[1]), w.flat()[2]),
            "sampled_token_ids",
        )
    )
    RUNNER_CASES.append(
        (
            f"counts-{dtype_label}",
            lambda w, make=make: Duck(w.flat()[0], w.flat()[1], make(w.flat()[2])),
            "num_sampled",
        )
    )
RUNNER_CASES += [
    (
        "sampled-0-d",
        lambda w: Duck(["a", "b"], np.array(5, np.int32), np.array([1, 0], np.int32)),
        "sampled_token_ids",
    ),
]
for label, make_out, pattern in RUNNER_CASES:
    case(f"update-runner_output-{label}", apply(current, make_out), OutputMismatchError, pattern)
    if label in ("too-many-tokens", "unknown-id", "negative-token"):
        case(
            f"update-runner_output-{label}-async",
            apply(current, make_out),
            OutputMismatchError,
            pattern,
            world="async",
        )
    if label == "tokens-for-a-non-final-prefill-chunk":
        # Without drafts every count is within `s`: the chunk's limit of 0 still holds.
        case(
            f"update-runner_output-{label}-k0",
            apply(current, make_out),
            OutputMismatchError,
            pattern,
            world="k0",
        )


def mutated_req_ids(w: World) -> object:
    """The step's ``req_ids`` list is handed out; a caller may write into it."""
    ids = w.so.req_ids
    saved = list(ids)
    try:
        ids[0] = 5
        return w.sched.update_from_output(w.so, good(w))
    finally:
        ids[:] = saved


case("update-scheduler_output-req_ids-mutated", mutated_req_ids, OutputMismatchError, "req_ids")

# ------------------------------------------------------------------------------ drafts


def drafts(ids: Any, rows: Any) -> Callable[[World], object]:
    return lambda w: w.sched.update_draft_token_ids(ids, rows)


DRAFT_CASES: list[tuple[str, Any, Any, str, str]] = [
    ("ids-none", None, [], "req_ids", "sync"),
    ("ids-int", 5, [], "req_ids", "sync"),
    ("ids-int-element", [5], [[1]], r"req_ids\[0\]", "sync"),
    ("ids-none-element", [None], [[1]], r"req_ids\[0\]", "sync"),
    ("ids-bytes-element", [b"a"], [[1]], r"req_ids\[0\]", "sync"),
    ("ids-surrogate", ["\ud800"], [[1]], "surrogate", "sync"),
    ("drafts-none", ["a"], None, "draft_token_ids", "sync"),
    ("drafts-int", ["a"], 5, "draft_token_ids", "sync"),
    ("more-than-K", ["a"], [[1, 2, 3]], r"draft_token_ids\[0\]", "sync"),
    ("more-than-K-unknown-id", ["nope"], [[1, 2, 3]], r"draft_token_ids\[0\]", "sync"),
    ("negative", ["a"], [[1, -5]], r"draft_token_ids\[0\]\[1\]", "sync"),
    ("float", ["a"], [[1.5]], r"draft_token_ids\[0\]", "sync"),
    ("int32-overflow", ["a"], [[2**31]], r"draft_token_ids\[0\]", "sync"),
    ("str-token", ["a"], [["a"]], r"draft_token_ids\[0\]", "sync"),
    ("bool-token", ["a"], [[True]], r"draft_token_ids\[0\]", "sync"),
    ("none-token", ["a"], [[None]], r"draft_token_ids\[0\]", "sync"),
    ("row-int", ["a"], [5], r"draft_token_ids\[0\]", "sync"),
    ("row-str", ["a"], ["ab"], r"draft_token_ids\[0\]", "sync"),
    ("row-array-float", ["a"], [np.array([1.0])], r"draft_token_ids\[0\]", "sync"),
    ("row-array-2d", ["a"], [np.array([[1]])], r"draft_token_ids\[0\]", "sync"),
    ("fewer-rows-than-ids", ["a", "b"], [[1]], "draft_token_ids", "sync"),
    ("more-rows-than-ids", ["a"], [[1], [2]], "draft_token_ids", "sync"),
    ("duplicate-id", ["a", "a"], [[1], [2]], "appears twice", "sync"),
    ("drafts-without-spec-decode", ["a"], [[1]], "num_speculative_tokens=0", "k0"),
]
for label, ids, rows, pattern, world in DRAFT_CASES:
    error: type[Exception] = ValueError if pattern == "surrogate" else InvalidRequestError
    case(f"update_draft_token_ids-{label}", drafts(ids, rows), error, pattern, world)

# Flat drafts: one int array and a count per request id (K = 2 in the sync world).
_i32 = partial(np.array, dtype=np.int32)
FLAT_DRAFT_CASES: list[tuple[str, Any, Any, Any, str]] = [
    ("counts-sum-short", ["a", "b"], _i32([1, 2, 3]), _i32([1, 1]), "num_draft_tokens.*sum 2"),
    ("counts-sum-long", ["a", "b"], _i32([1]), _i32([1, 1]), "num_draft_tokens.*sum 2"),
    ("counts-fewer", ["a", "b"], _i32([1]), _i32([1]), "draft_token_ids.*1 rows"),
    ("count-negative", ["a", "b"], _i32([1]), _i32([2, -1]), r"draft_token_ids\[1\]"),
    ("count-more-than-K", ["a"], _i32([1, 2, 3]), _i32([3]), r"draft_token_ids\[0\]"),
    ("draft-negative", ["a", "b"], _i32([1, 2, -5]), _i32([2, 1]), r"draft_token_ids\[1\]\[0\]"),
    ("drafts-float", ["a"], np.array([1.0]), _i32([1]), "draft_token_ids.*dtype"),
    ("drafts-2d", ["a"], _i32([[1]]), _i32([1]), "draft_token_ids.*1-D"),
    ("counts-float", ["a"], _i32([1]), np.array([1.0]), "num_draft_tokens.*dtype"),
    ("counts-none-element", ["a"], [1], [None], r"num_draft_tokens\[0\]"),
    ("drafts-int64-overflow", ["a"], np.array([2**40]), _i32([1]), r"draft_token_ids\[0\]\[0\]"),
]
for label, ids, flat, counts, pattern in FLAT_DRAFT_CASES:
    case(
        f"update_draft_token_ids-flat-{label}",
        lambda w, ids=ids, flat=flat, counts=counts: w.sched.update_draft_token_ids(
            ids, flat, counts
        ),
        InvalidRequestError,
        pattern,
    )

# ------------------------------------------------------------------------------ finish_requests


def finish(ids: Any, status: Any = RequestStatus.FINISHED_ABORTED) -> Callable[[World], object]:
    return lambda w: w.sched.finish_requests(ids, status)


for label, status in [
    ("running", RequestStatus.RUNNING),
    ("waiting", RequestStatus.WAITING),
    ("preempted", RequestStatus.PREEMPTED),
    ("zero", 0),
    ("thirteen", 13),
    ("negative", -1),
    ("float", 9.5),
    ("numpy-float", np.float64(9)),
    ("str", "FINISHED_ABORTED"),
    ("none", None),
    ("bool", True),
    ("huge", 2**70),
]:
    case(f"finish_requests-status-{label}", finish("a", status), InvalidRequestError, "status")
for label, ids in [
    ("int", 5),
    ("float", 1.5),
    ("int-element", [5]),
    ("valid-then-int", ["a", 5]),
    ("none-element", [None]),
    ("bytes-element", [b"a"]),
    ("bytes", b"a"),
]:
    case(f"finish_requests-ids-{label}", finish(ids), InvalidRequestError, "request_ids")
case("finish_requests-surrogate", finish("\ud800"), ValueError, "surrogate")

# ------------------------------------------------------------------------------ get_request


def get(rid: Any) -> Callable[[World], object]:
    return lambda w: w.sched.get_request(rid)


case("get_request-unknown", get("nope"), UnknownRequestError, "nope")
case("get_request-empty", get(""), UnknownRequestError, "request_id")
case("get_request-finished", get("gone"), UnknownRequestError, "gone")
case("get_request-surrogate", get("\ud800"), ValueError, "surrogate")
for label, rid in [("int", 5), ("none", None), ("bytes", b"a"), ("list", ["a"])]:
    case(
        f"get_request-id-{label}",
        get(rid),
        (InvalidRequestError, UnknownRequestError),
        "request_id",
    )

# ------------------------------------------------------------------------------ reset_prefix_cache

for label, flag in [
    ("int-1", 1),
    ("int-0", 0),
    ("str", "yes"),
    ("str-false", "False"),
    ("float", 1.0),
    ("list", [True]),
]:
    case(
        f"reset_prefix_cache-{label}",
        lambda w, flag=flag: w.sched.reset_prefix_cache(flag),
        InvalidRequestError,
        "reset_running_requests",
    )


# ------------------------------------------------------------------------------ set_pause_state

for label, pause in [
    ("bool-true", True),
    ("bool-false", False),
    ("numpy-bool", np.bool_(True)),
    ("float", 1.0),
    ("str", "1"),
    ("none", None),
    ("out-of-range", 3),
]:
    case(
        f"set_pause_state-{label}",
        lambda w, pause=pause: w.sched.set_pause_state(pause),
        InvalidRequestError,
        "pause_state",
    )


# ------------------------------------------------------------------------------ the battery


@pytest.mark.parametrize("bad", CASES, ids=[c.name for c in CASES])
def test_scheduler_call_refuses_bad_input_and_changes_nothing(bad: Case) -> None:
    """A bad argument raises a clear error naming it and leaves the scheduler as it was."""
    w = build_world(bad.world)
    before = state(w.sched)
    with pytest.raises(bad.error, match=bad.match) as info:
        bad.call(w)
    assert not isinstance(info.value, InternalError), info.value
    assert isinstance(info.value, (ValueError, LlmschedError, KeyError)), info.value
    assert state(w.sched) == before
    run_to_completion(w)


def test_an_empty_step_is_a_no_op_however_often_it_is_applied() -> None:
    """A step that scheduled nothing is not tracked as in flight: as in vLLM, applying its
    (empty) output is a no-op, so a runner may apply it twice or skip it without harm; tokens
    for it are refused."""
    w = build_world("sync")
    before = state(w.sched)
    for _ in range(2):
        assert len(w.sched.update_from_output(w.empty, ModelRunnerOutput.empty())) == 0
    assert state(w.sched) == before
    with pytest.raises(OutputMismatchError, match=r"scheduled 0|scheduled nothing"):
        w.sched.update_from_output(w.empty, ModelRunnerOutput.from_lists(["a"], [[1]]))
    assert state(w.sched) == before
    run_to_completion(w)


# ------------------------------------------------------------------------------ configs

INT_FIELDS = [
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_num_scheduled_tokens",
    "max_num_active_seqs",
    "block_size",
    "num_gpu_blocks",
    "long_prefill_token_threshold",
    "num_speculative_tokens",
    "num_lookahead_tokens",
    "max_num_new_slots_for_drafting",
    "num_sampled_tokens_per_step",
]
OPTIONAL_FIELDS = {"max_num_scheduled_tokens", "max_num_active_seqs"}
BOOL_FIELDS = [
    "enable_chunked_prefill",
    "long_prefill_token_threshold_adaptive",
    "async_scheduling",
    "scheduler_reserve_full_isl",
    "enable_prefix_caching",
]
WRONG_INTS: list[tuple[str, Any]] = [
    ("str", "8"),
    ("float", 8.0),
    ("numpy-float", np.float64(8.0)),
    ("bool", True),
    ("list", [8]),
    ("bytes", b"8"),
    ("complex", 8j),
    ("object", object()),
    ("overflow", 2**70),
]
CONFIG_CASES: list[tuple[str, dict[str, Any], str]] = []
for name in INT_FIELDS:
    for label, value in WRONG_INTS:
        CONFIG_CASES.append((f"{name}-{label}", {name: value}, name))
    if name not in OPTIONAL_FIELDS:
        CONFIG_CASES.append((f"{name}-none", {name: None}, name))
for name in BOOL_FIELDS:
    for label, value in [
        ("int-1", 1),
        ("int-0", 0),
        ("str", "yes"),
        ("str-true", "True"),
        ("none", None),
        ("float", 1.0),
        ("list", [True]),
    ]:
        CONFIG_CASES.append((f"{name}-{label}", {name: value}, name))
CONFIG_CASES += [
    ("max_model_len-0", {"max_model_len": 0}, "max_model_len"),
    ("max_model_len-negative", {"max_model_len": -1}, "max_model_len"),
    ("max_model_len-1-with-sampling", {"max_model_len": 1}, "max_model_len"),
    ("max_model_len-huge", {"max_model_len": 2**31}, "max_model_len"),
    ("max_num_seqs-0", {"max_num_seqs": 0}, "max_num_seqs"),
    ("max_num_seqs-negative", {"max_num_seqs": -3}, "max_num_seqs"),
    ("max_num_seqs-huge", {"max_num_seqs": 2**25}, "max_num_seqs"),
    ("max_num_batched_tokens-0", {"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ("max_num_batched_tokens-below-seqs", {"max_num_batched_tokens": 64}, "max_num_batched_tokens"),
    ("max_num_batched_tokens-huge", {"max_num_batched_tokens": 2**31}, "max_num_batched_tokens"),
    ("max_num_scheduled_tokens-0", {"max_num_scheduled_tokens": 0}, "max_num_scheduled_tokens"),
    ("max_num_scheduled_tokens-neg", {"max_num_scheduled_tokens": -1}, "max_num_scheduled_tokens"),
    ("max_num_scheduled_tokens-huge", {"max_num_scheduled_tokens": 2**31}, "max_num_scheduled"),
    ("max_num_active_seqs-0", {"max_num_active_seqs": 0}, "max_num_active_seqs"),
    ("max_num_active_seqs-above-seqs", {"max_num_active_seqs": 1000}, "max_num_active_seqs"),
    ("block_size-0", {"block_size": 0}, "block_size"),
    ("kv_cache_metrics_sample-neg", {"kv_cache_metrics_sample": -0.1}, "kv_cache_metrics_sample"),
    ("kv_cache_metrics_sample-2", {"kv_cache_metrics_sample": 2.0}, r"sample=2.*\[0, 1\]"),
    ("kv_cache_metrics_sample-nan", {"kv_cache_metrics_sample": float("nan")}, "metrics_sample"),
    ("block_size-negative", {"block_size": -16}, "block_size"),
    ("block_size-huge", {"block_size": 2**17}, "block_size"),
    ("num_gpu_blocks-1", {"num_gpu_blocks": 1}, "num_gpu_blocks"),
    ("num_gpu_blocks-0", {"num_gpu_blocks": 0}, "num_gpu_blocks"),
    ("num_gpu_blocks-negative", {"num_gpu_blocks": -1}, "num_gpu_blocks"),
    ("num_gpu_blocks-above-int32", {"num_gpu_blocks": 2**31}, "num_gpu_blocks"),
    ("threshold-negative", {"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ("threshold-above-M", {"long_prefill_token_threshold": 4096}, "long_prefill_token_threshold"),
    ("K-negative", {"num_speculative_tokens": -1}, "num_speculative_tokens"),
    ("K-65", {"num_speculative_tokens": 65}, "num_speculative_tokens"),
    ("lookahead-negative", {"num_lookahead_tokens": -1}, "num_lookahead_tokens"),
    ("lookahead-without-K", {"num_lookahead_tokens": 1}, "num_lookahead_tokens"),
    (
        "lookahead-above-K+1",
        {"num_speculative_tokens": 2, "num_lookahead_tokens": 4},
        "num_lookahead_tokens",
    ),
    ("slots-negative", {"max_num_new_slots_for_drafting": -1}, "max_num_new_slots_for_drafting"),
    ("slots-without-K", {"max_num_new_slots_for_drafting": 1}, "max_num_new_slots_for_drafting"),
    (
        "slots-above-K",
        {"num_speculative_tokens": 2, "max_num_new_slots_for_drafting": 3},
        "max_num_new_slots_for_drafting",
    ),
    (
        "slots-eat-the-whole-budget",
        {
            "num_speculative_tokens": 2,
            "max_num_new_slots_for_drafting": 2,
            "max_num_batched_tokens": 2,
            "max_num_seqs": 2,
        },
        "max_num_new_slots_for_drafting",
    ),
    ("sampled-negative", {"num_sampled_tokens_per_step": -1}, "num_sampled_tokens_per_step"),
    ("sampled-2", {"num_sampled_tokens_per_step": 2}, "num_sampled_tokens_per_step"),
    (
        "no-chunking-with-a-small-budget",
        {"enable_chunked_prefill": False, "max_model_len": 4096},
        "max_num_batched_tokens",
    ),
    ("watermark-negative", {"watermark": -0.1}, "watermark"),
    ("watermark-1", {"watermark": 1.0}, "watermark"),
    ("watermark-above-1", {"watermark": 1.5}, "watermark"),
    ("watermark-nan", {"watermark": math.nan}, "watermark"),
    ("watermark-inf", {"watermark": math.inf}, "watermark"),
    ("watermark-minus-inf", {"watermark": -math.inf}, "watermark"),
    ("watermark-str", {"watermark": "0.1"}, "watermark"),
    ("watermark-bool", {"watermark": True}, "watermark"),
    ("watermark-none", {"watermark": None}, "watermark"),
    ("watermark-list", {"watermark": [0.1]}, "watermark"),
    ("policy-unknown", {"policy": "lifo"}, "policy"),
    ("policy-upper-case", {"policy": "FCFS"}, "policy"),
    ("policy-empty", {"policy": ""}, "policy"),
    ("policy-int", {"policy": 1}, "policy"),
    ("policy-none", {"policy": None}, "policy"),
    ("policy-bytes", {"policy": b"fcfs"}, "policy"),
    ("policy-list", {"policy": ["fcfs"]}, "policy"),
    ("groups-unknown-kind", {"kv_cache_groups": "mamba"}, 'kv_cache_groups.*"mamba"'),
    (
        "groups-none-with-prefix-caching",
        {"kv_cache_groups": "", "num_gpu_blocks": 1},
        "enable_prefix_caching.*without KV-cache groups",
    ),
    (
        "groups-none-with-kv-connector",
        {"kv_cache_groups": "", "enable_prefix_caching": False, "kv_connector": True},
        "kv_connector.*without KV-cache groups",
    ),
    ("groups-lone-comma", {"kv_cache_groups": ","}, "kv_cache_groups"),
    ("groups-trailing-comma", {"kv_cache_groups": "full,"}, "kv_cache_groups"),
    ("groups-zero-window", {"kv_cache_groups": "sliding_window:0"}, "kv_cache_groups"),
    ("groups-bad-window", {"kv_cache_groups": "sliding_window:x"}, "kv_cache_groups"),
    (
        "groups-two-windows",
        {"kv_cache_groups": "sliding_window:8,sliding_window:9,full"},
        "kv_cache_groups.*same",
    ),
    ("groups-list", {"kv_cache_groups": ["full"]}, "kv_cache_groups"),
    ("groups-bad-mark", {"kv_cache_groups": "full+drafter"}, "kv_cache_groups.*eagle"),
    (
        "chunked-local-with-eagle-block-drop",
        {
            "kv_cache_groups": "chunked_local:64,full",
            "num_speculative_tokens": 2,
            "num_lookahead_tokens": 2,
            "eagle_block_drop": True,
        },
        "eagle_block_drop",
    ),
    (
        "aligned-mamba-chunk-short-of-a-block",
        {
            "kv_cache_groups": "full,mamba",
            "block_size": 16,
            "max_num_batched_tokens": 16,
            "max_num_seqs": 4,
            "num_speculative_tokens": 2,
            "max_num_new_slots_for_drafting": 1,
        },
        "max_num_new_slots_for_drafting.*1.*15 tokens.*block",
    ),
    (
        "aligned-mamba-with-whole-images",
        {
            "kv_cache_groups": "full,mamba",
            "max_num_encoder_input_tokens": 16,
            "encoder_cache_size": 16,
            "disable_chunked_mm_input": True,
        },
        "disable_chunked_mm_input.*Mamba",
    ),
    (
        "aligned-mamba-with-a-connector",
        {"kv_cache_groups": "full,mamba", "kv_connector": True},
        "kv_connector.*Mamba",
    ),
    ("hash-lookahead-negative", {"num_hash_lookahead_tokens": -1}, "num_hash_lookahead_tokens"),
    ("retention-negative", {"prefix_cache_retention_interval": -16}, "retention_interval"),
    ("retention-off-grid", {"prefix_cache_retention_interval": 24}, "retention_interval.*24"),
    ("pipeline-zero", {"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ("unknown-field", {"max_len": 64}, "max_len"),
    ("empty-field-name", {"": 64}, "not a SchedulerConfig field"),
]


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [(fields, pattern) for _, fields, pattern in CONFIG_CASES],
    ids=[label for label, _, _ in CONFIG_CASES],
)
def test_config_refuses_bad_fields(fields: dict[str, Any], pattern: str) -> None:
    """A bad config field raises ConfigError naming the field, and so does replace()."""
    with pytest.raises(ConfigError, match=pattern):
        SchedulerConfig(**fields)
    config = SchedulerConfig()
    before = config.to_dict()
    with pytest.raises(ConfigError, match=pattern):
        config.replace(**fields)
    assert config.to_dict() == before


@pytest.mark.parametrize(
    "config",
    [None, 5, "config", {"max_model_len": 64}, SchedulerConfig, object()],
    ids=["none", "int", "str", "dict", "the-class", "object"],
)
def test_scheduler_refuses_what_is_not_a_config(config: Any) -> None:
    """Scheduler(x) with x not a SchedulerConfig raises ConfigError naming ``config``."""
    with pytest.raises(ConfigError, match="config"):
        Scheduler(config)


@pytest.mark.parametrize("steps", [-1, 1025, 2**70, 1.5, "2"])
def test_a_bad_decode_stagger_is_refused_and_changes_nothing(steps: Any) -> None:
    """set_decode_stagger outside [0, 1024] (or not an int) raises ConfigError naming the
    field, and the stagger stays as it was."""
    sched = Scheduler(SchedulerConfig())
    sched.set_decode_stagger(3)
    with pytest.raises(ConfigError, match="decode_stagger"):
        sched.set_decode_stagger(steps)
    assert sched.decode_stagger == 3


def test_huge_kv_pool_is_refused_not_a_process_abort() -> None:
    """A valid-looking num_gpu_blocks too big to allocate must raise, not abort the process."""
    # SchedulerConfig accepts num_gpu_blocks up to 2**31 - 1; Scheduler() then allocates the
    # block pool's arrays (tens of GB) with infallible Vec allocations, and when memory runs
    # out Rust's allocation-error handler aborts the whole interpreter (SIGABRT). The child
    # caps its address space at 4 GiB to make that deterministic and harmless here.
    script = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import llmsched
        try:
            config = llmsched.SchedulerConfig(num_gpu_blocks=2**31 - 1)
            llmsched.Scheduler(config)
        except (llmsched.ConfigError, MemoryError) as e:
            print("refused:", type(e).__name__, e)
        else:
            print("built")
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.startswith(("refused:", "built")), child.stdout


# ------------------------------------------------------------------------------ runner outputs

MRO_CASES: list[tuple[str, Callable[[], object], str]] = [
    (
        "sampled-float",
        lambda: ModelRunnerOutput(["a"], np.array([1.5]), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-bool",
        lambda: ModelRunnerOutput(["a"], np.array([True]), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-object",
        lambda: ModelRunnerOutput(["a", "b"], np.array([1, None], dtype=object), np.array([1, 1])),
        "sampled_token_ids",
    ),
    (
        "sampled-complex",
        lambda: ModelRunnerOutput(["a"], np.array([1j]), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-str",
        lambda: ModelRunnerOutput(["a"], np.array(["1"]), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-2-D",
        lambda: ModelRunnerOutput(["a"], np.array([[1]], dtype=np.int32), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-int64-too-big",
        lambda: ModelRunnerOutput(["a"], np.array([2**40]), np.array([1])),
        "sampled_token_ids",
    ),
    (
        "sampled-uint64-too-big",
        lambda: ModelRunnerOutput(["a"], np.array([2**63], dtype=np.uint64), np.array([1])),
        "sampled_token_ids",
    ),
    # Negative counts, and counts that do not fit the ids or the tokens, are the
    # scheduler's check at apply time (the "negative-count" and "counts-*" cases above).
    (
        "counts-float",
        lambda: ModelRunnerOutput(["a"], np.array([1]), np.array([1.0])),
        "num_sampled",
    ),
    (
        "counts-2-D",
        lambda: ModelRunnerOutput(["a"], np.array([1]), np.array([[1]])),
        "num_sampled",
    ),
    (
        "req_ids-int",
        lambda: ModelRunnerOutput(5, np.zeros(0, np.int32), np.zeros(0, np.int32)),
        "req_ids",
    ),
    (
        "req_ids-none",
        lambda: ModelRunnerOutput(None, np.zeros(0, np.int32), np.zeros(0, np.int32)),
        "req_ids",
    ),
    (
        "from_lists-rows-for-fewer-ids",
        lambda: ModelRunnerOutput.from_lists(["a", "b"], [[1]]),
        "sampled_token_ids",
    ),
    ("from_lists-float", lambda: ModelRunnerOutput.from_lists(["a"], [[1.5]]), "sampled_token_ids"),
    ("from_lists-bool", lambda: ModelRunnerOutput.from_lists(["a"], [[True]]), "sampled_token_ids"),
    ("from_lists-str", lambda: ModelRunnerOutput.from_lists(["a"], [["a"]]), "sampled_token_ids"),
    ("from_lists-none", lambda: ModelRunnerOutput.from_lists(["a"], [[None]]), "sampled_token_ids"),
    (
        "from_lists-too-big",
        lambda: ModelRunnerOutput.from_lists(["a"], [[2**40]]),
        "sampled_token_ids",
    ),
    (
        "from_lists-huge",
        lambda: ModelRunnerOutput.from_lists(["a"], [[2**80]]),
        "sampled_token_ids",
    ),
    (
        "from_lists-mixed",
        lambda: ModelRunnerOutput.from_lists(["a", "b"], [[1], [2.5]]),
        "sampled_token_ids",
    ),
    (
        "from_lists-row-int",
        lambda: ModelRunnerOutput.from_lists(["a"], [5]),
        "sampled_token_ids",
    ),
    (
        "from_lists-rows-none",
        lambda: ModelRunnerOutput.from_lists(["a"], None),
        "sampled_token_ids",
    ),
    (
        "from_lists-req_ids-none",
        lambda: ModelRunnerOutput.from_lists(None, [[1]]),
        "req_ids",
    ),
]


@pytest.mark.parametrize(
    ("make", "pattern"),
    [(make, pattern) for _, make, pattern in MRO_CASES],
    ids=[label for label, _, _ in MRO_CASES],
)
def test_model_runner_output_refuses_bad_arrays(make: Callable[[], object], pattern: str) -> None:
    """ModelRunnerOutput and from_lists refuse what no step could use, naming the field."""
    with pytest.raises(OutputMismatchError, match=pattern):
        make()


# ------------------------------------------------------------------------------ engine


def engine_world() -> Engine:
    engine = Engine(SchedulerConfig(**BASE), check_invariants=True)
    engine.add_request("a", [1, 2, 3], max_tokens=4)
    engine.step()
    return engine


ENGINE_CASES: list[tuple[str, Callable[[Engine], object], type[Exception], str]] = [
    (
        "add-empty-prompt",
        lambda e: e.add_request("x", [], max_tokens=1),
        InvalidRequestError,
        "prompt",
    ),
    (
        "add-max_tokens-0",
        lambda e: e.add_request("x", [1], max_tokens=0),
        InvalidRequestError,
        "max_tokens",
    ),
    (
        "add-id-int",
        lambda e: e.add_request(5, [1], max_tokens=1),
        InvalidRequestError,
        "request_id",
    ),
    (
        "add-duplicate",
        lambda e: e.add_request("a", [1], max_tokens=1),
        DuplicateRequestError,
        ".a.",
    ),
    (
        "add-min_tokens-above-max_tokens",
        lambda e: e.add_request("x", [1], max_tokens=2, min_tokens=3),
        InvalidRequestError,
        "min_tokens",
    ),
    ("abort-int", lambda e: e.abort_requests(5), InvalidRequestError, "request_ids"),
    ("abort-int-element", lambda e: e.abort_requests(["a", 5]), InvalidRequestError, "request_ids"),
]


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [(c, e, p) for _, c, e, p in ENGINE_CASES],
    ids=[label for label, _, _, _ in ENGINE_CASES],
)
def test_engine_refuses_bad_requests_and_changes_nothing(
    call: Callable[[Engine], object], error: type[Exception], pattern: str
) -> None:
    """Engine.add_request / abort_requests refuse bad input; results and scheduler unchanged."""
    engine = engine_world()
    before = (state(engine.scheduler), repr(engine.results))
    with pytest.raises(error, match=pattern):
        call(engine)
    assert (state(engine.scheduler), repr(engine.results)) == before
    assert engine.run()["a"].finished


def test_engine_refuses_the_id_of_a_finished_request_and_keeps_its_result() -> None:
    engine = engine_world()
    engine.abort_requests("a")  # a finished request, by abort...
    engine.add_request("b", [1, 2], max_tokens=2)
    engine.run()  # ...and one by length
    for request_id, reason in (("a", "abort"), ("b", "length")):
        before = (state(engine.scheduler), repr(engine.results))
        with pytest.raises(DuplicateRequestError, match=f"request_id='{request_id}'.*finished"):
            engine.add_request(request_id, [4, 5], max_tokens=1)
        assert (state(engine.scheduler), repr(engine.results)) == before
        assert engine.results[request_id].finish_reason == reason


@pytest.mark.parametrize(
    "config",
    [None, {"max_model_len": 64}, "config", 5],
    ids=["none", "dict", "str", "int"],
)
def test_engine_refuses_what_is_not_a_config(config: Any) -> None:
    """Engine(x) with x not a SchedulerConfig raises ConfigError naming ``config``."""
    with pytest.raises(ConfigError, match="config"):
        Engine(config)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [({"max_model_len": 32}, "max_model_len"), ({"block_size": 8}, "block_size")],
    ids=["max_model_len", "block_size"],
)
def test_engine_refuses_a_runner_with_another_config(change: dict[str, Any], pattern: str) -> None:
    """Engine(config, runner) refuses a runner built on a config that differs."""
    config = SchedulerConfig(**BASE)
    runner = SimulatedModelRunner(config.replace(**change))
    with pytest.raises(ConfigError, match=pattern):
        Engine(config, runner)


# ------------------------------------------------------------------------------ found here


def test_reordering_the_step_req_ids_cannot_misroute_tokens() -> None:
    """Found here: the step's req_ids list is shared and mutable; the scheduler trusts it."""
    # SchedulerOutput is documented immutable, but ``so.req_ids`` returns the very list the
    # scheduler later reads in update_from_output to match runner rows to step entries (fast
    # path: same id objects in the same order). Reversing it in place, then building the
    # runner output from it, makes the scheduler give "b"'s token to "a" and vice versa.
    sched = Scheduler(SchedulerConfig(**BASE))
    sched.add_request("a", [1, 2], max_tokens=5)
    sched.add_request("b", [1, 2, 3], max_tokens=5)
    so = sched.schedule()
    ids = so.req_ids
    ids.reverse()
    out = ModelRunnerOutput.from_lists(ids, [[111 if rid == "a" else 222] for rid in ids])
    try:
        outs = sched.update_from_output(so, out)
    except OutputMismatchError:
        return  # refusing the tampered step is fine too
    assert {o.request_id: o.new_token_ids for o in outs} == {"a": [111], "b": [222]}


def test_numpy_bools_are_bools() -> None:
    """Found here: numpy 2 bools are refused as "must be a bool, got bool"."""
    # convert.rs accepts a numpy bool by its type name "bool_", which numpy 2 renamed "bool".
    config = SchedulerConfig(async_scheduling=np.True_, enable_prefix_caching=np.False_)
    assert config.async_scheduling is True and config.enable_prefix_caching is False
    assert Scheduler(config).reset_prefix_cache(np.False_)
