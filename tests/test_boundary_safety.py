"""What crosses the Python boundary cannot break the scheduler.

Three holes an outside review found, each pinned here:

- a Python thread writing into the runner's arrays while ``update_from_output`` works with
  the GIL released must not plant a token the array did not hold when the call was made;
- an ``__index__`` that fails (always, or once and then succeeds) anywhere a conversion
  reads an integer must raise a clear error, never a Rust panic (``PanicException`` is a
  ``BaseException`` that ``except Exception`` misses), and change nothing;
- equal configs hash equal.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from llmsched import (
    ConfigError,
    InvalidRequestError,
    ModelRunnerOutput,
    OutputMismatchError,
    Scheduler,
    SchedulerConfig,
)

# ------------------------------------------------------------------------- the runner's arrays

RACED_REQUESTS = 1024
RACED_CALLS = 40
SAMPLED = 7  # every token the runner samples
PLANTED = -5  # what the racing writer writes


def test_a_writer_racing_update_from_output_never_plants_a_token() -> None:
    """A thread overwrites ``sampled_token_ids`` with ``-5`` while the call runs, at a
    different moment each time. Each call either refuses the output (the writer won before
    the call read the array: ``-5`` is not a token) or applies the tokens the array held
    when it was read; no request may ever hold a ``-5``."""
    config = SchedulerConfig(
        max_model_len=128,
        max_num_seqs=RACED_REQUESTS,
        max_num_batched_tokens=RACED_REQUESTS,
        block_size=16,
        num_gpu_blocks=4 * RACED_REQUESTS,
        enable_prefix_caching=False,
        async_scheduling=False,
    )
    sched = Scheduler(config)
    for i in range(RACED_REQUESTS):
        sched.add_request(f"r{i}", [1], max_tokens=100)
    rng = random.Random(0)
    refused = applied = delivered_planted = 0
    for _ in range(RACED_CALLS + 1):
        so = sched.schedule()
        assert len(so.req_ids) == RACED_REQUESTS
        sampled = np.full(RACED_REQUESTS, SAMPLED, dtype=np.int32)
        out = ModelRunnerOutput(so.req_ids, sampled, np.ones(RACED_REQUESTS, dtype=np.int32))
        assert out.sampled_token_ids is sampled  # the runner's own array, not a copy
        start = threading.Barrier(2)
        delay = rng.uniform(0.0, 0.002)

        def write(
            array: np.ndarray = sampled, start: threading.Barrier = start, delay: float = delay
        ) -> None:
            start.wait()
            time.sleep(delay)
            array[:] = PLANTED

        writer = threading.Thread(target=write)
        writer.start()
        start.wait()
        try:
            outputs = sched.update_from_output(so, out)
        except OutputMismatchError:
            refused += 1
            writer.join()
            # Refused, nothing changed: the clean output applies.
            clean = np.full(RACED_REQUESTS, SAMPLED, dtype=np.int32)
            outputs = sched.update_from_output(
                so, ModelRunnerOutput(so.req_ids, clean, np.ones(RACED_REQUESTS, np.int32))
            )
        else:
            applied += 1
            writer.join()
        delivered_planted += int((outputs.new_token_ids != SAMPLED).sum())
    planted = [
        rid
        for i in range(RACED_REQUESTS)
        if PLANTED in sched.get_request(rid := f"r{i}").output_token_ids
    ]
    assert (delivered_planted, planted) == (0, []), (
        f"{delivered_planted} delivered tokens and {len(planted)} requests hold a token the "
        "runner never sent"
    )
    for i in range(RACED_REQUESTS):
        assert sched.get_request(f"r{i}").output_token_ids == [SAMPLED] * (RACED_CALLS + 1)
    sched.check_invariants()
    assert refused + applied == RACED_CALLS + 1


# --------------------------------------------------------------------- integers that misbehave


class FailingIndex:
    """An integer-like object whose ``__index__`` fails ``failures`` times, then returns
    ``value`` (``failures=None``: it always fails)."""

    def __init__(self, value: int = 3, failures: int | None = 1) -> None:
        self.value = value
        self.failures = failures

    def __index__(self) -> int:
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            raise ArithmeticError("flaky __index__")
        return self.value

    def __repr__(self) -> str:
        return "FailingIndex()"


def flaky() -> FailingIndex:
    return FailingIndex(3, failures=1)


def failing() -> FailingIndex:
    return FailingIndex(3, failures=None)


def config() -> SchedulerConfig:
    return SchedulerConfig(
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=32,
        num_speculative_tokens=2,
        async_scheduling=False,
    )


def running_scheduler() -> Scheduler:
    """``a`` decoding (it may take drafts), ``b`` waiting."""
    sched = Scheduler(config())
    sched.add_request("a", [1, 2, 3], max_tokens=8)
    so = sched.schedule()
    sched.update_from_output(so, ModelRunnerOutput.from_lists(["a"], [[4]]))
    sched.add_request("b", [5, 6], max_tokens=8)
    return sched


# Each path reads an integer from a caller's object; `bad` is the misbehaving integer.
CALLS: dict[str, tuple[Callable[[Scheduler, Any], object], str]] = {
    "prompt-list": (lambda s, bad: s.add_request("n", [1, bad, 2], max_tokens=4), "prompt"),
    "prompt-tuple": (lambda s, bad: s.add_request("n", (1, bad), max_tokens=4), "prompt"),
    "prompt-iter": (lambda s, bad: s.add_request("n", iter([bad]), max_tokens=4), "prompt"),
    "max_tokens": (lambda s, bad: s.add_request("n", [1], max_tokens=bad), "max_tokens"),
    "min_tokens": (lambda s, bad: s.add_request("n", [1], max_tokens=4, min_tokens=bad), "min"),
    "eos": (lambda s, bad: s.add_request("n", [1], max_tokens=4, eos_token_id=bad), "eos"),
    "stop-ids": (
        lambda s, bad: s.add_request("n", [1], max_tokens=4, stop_token_ids=[9, bad]),
        "stop_token_ids",
    ),
    "num_computed": (
        lambda s, bad: s.add_request("n", [1, 2], max_tokens=4, num_computed_tokens=bad),
        "num_computed_tokens",
    ),
    "priority": (lambda s, bad: s.add_request("n", [1], max_tokens=4, priority=bad), "priority"),
    "draft-row": (lambda s, bad: s.update_draft_token_ids(["a"], [[1, bad]]), "draft_token_ids"),
    "draft-second-row": (
        lambda s, bad: s.update_draft_token_ids(["a", "b"], [[1], (bad,)]),
        "draft_token_ids",
    ),
    "finish-status": (lambda s, bad: s.finish_requests("a", bad), "status"),
}


@pytest.mark.parametrize("make_bad", [flaky, failing], ids=["flaky", "failing"])
@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_a_misbehaving_index_raises_a_clear_error_and_changes_nothing(
    call: str, make_bad: Callable[[], FailingIndex]
) -> None:
    run, field = CALLS[call]
    sched = running_scheduler()
    before = sched.debug_snapshot()
    try:
        run(sched, make_bad())
    except BaseException as error:  # a PanicException is a BaseException: catch it to fail
        assert isinstance(error, InvalidRequestError), f"{type(error).__mro__}: {error}"
        assert field in str(error)
        assert "FailingIndex()" in str(error)
    else:
        pytest.fail("a misbehaving __index__ was accepted")
    assert sched.debug_snapshot() == before
    sched.check_invariants()


@pytest.mark.parametrize("make_bad", [flaky, failing], ids=["flaky", "failing"])
@pytest.mark.parametrize("field", ["max_model_len", "block_size", "num_speculative_tokens"])
def test_a_misbehaving_index_in_a_config_field_raises_config_error(
    field: str, make_bad: Callable[[], FailingIndex]
) -> None:
    try:
        SchedulerConfig(**{field: make_bad()})
    except BaseException as error:
        assert isinstance(error, ConfigError), f"{type(error).__mro__}: {error}"
        assert field in str(error)
    else:
        pytest.fail("a misbehaving __index__ was accepted")


def test_a_misbehaving_index_among_many_rows_names_its_row() -> None:
    sched = running_scheduler()
    with pytest.raises(InvalidRequestError, match=r"draft_token_ids\[1\]\[0\]"):
        sched.update_draft_token_ids(["a", "b"], [[1], [failing()]])
    with pytest.raises(InvalidRequestError, match=r"prompt_token_ids\[1\]"):
        sched.add_request("n", [1, failing()], max_tokens=4)


# ----------------------------------------------------------------------------- config hashing

EDGE_FIELDS: list[dict[str, Any]] = [
    {},
    {"watermark": 0.0},
    {"watermark": -0.0},
    {"watermark": 0.5},
    {"watermark": np.float64(-0.0)},
    {"max_num_scheduled_tokens": None},
    {"max_num_scheduled_tokens": 2048},
    {"max_num_active_seqs": None},
    {"max_num_active_seqs": 128},
    {"max_num_active_seqs": 64},
    {"policy": "priority"},
    {"enable_prefix_caching": np.bool_(True)},
]


def test_equal_configs_hash_equal() -> None:
    configs = [SchedulerConfig(**fields) for fields in EDGE_FIELDS]
    for a in configs:
        for b in configs:
            if a == b:
                assert hash(a) == hash(b), (a, b)
    assert SchedulerConfig(watermark=-0.0) == SchedulerConfig(watermark=0.0)
    assert len({SchedulerConfig(watermark=-0.0), SchedulerConfig(watermark=0.0)}) == 1
    # Derived fields: left to derive, or given their derived value, are the same config.
    assert len({SchedulerConfig(), SchedulerConfig(max_num_scheduled_tokens=2048)}) == 1
    # And configs that differ still compare different (the hash is not a constant).
    assert len({hash(c) for c in configs}) > 3


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_watermark_that_cannot_compare_is_refused(value: float) -> None:
    with pytest.raises(ConfigError, match="watermark"):
        SchedulerConfig(watermark=value)
