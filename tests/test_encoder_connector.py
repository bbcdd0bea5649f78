"""An encoder-cache connector's scheduler side through the binding:
``schedule(external_encoder=...)`` (encoder outputs loaded instead of encoded, requests
passed over while theirs are in transit), a source that fails, the encoder cache's contents
and the inputs a request's tokens passed (``take_passed_encoder_inputs``)."""

from __future__ import annotations

from typing import Any

import pytest

from llmsched import InvalidRequestError, Request, Scheduler, SchedulerConfig

from conftest import runner_output


def _scheduler(**overrides: Any) -> Scheduler:
    config = {
        "max_model_len": 256,
        "block_size": 16,
        "num_gpu_blocks": 64,
        "max_num_batched_tokens": 256,
        "max_num_encoder_input_tokens": 100,
        "encoder_cache_size": 200,
        "ec_connector": True,
        "async_scheduling": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**config))


class _Store:
    """Has the outputs of ``has``, and the requests of ``in_transit`` still loading;
    records every question."""

    def __init__(self, has: Any = (), in_transit: Any = ()) -> None:
        self.has = has
        self.in_transit = in_transit
        self.asked_items: list[str] = []
        self.asked_ready: list[tuple[str, int]] = []

    def has_cache_item(self, identifier: str) -> Any:
        self.asked_items.append(identifier)
        if isinstance(self.has, (Exception, str)):
            if isinstance(self.has, Exception):
                raise self.has
            return self.has
        return identifier in self.has

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        self.asked_ready.append((request.request_id, num_computed_tokens))
        return request.request_id not in self.in_transit


def _add(sched: Scheduler, req_id: str, length: int, *images: tuple[str, int, int]) -> None:
    sched.add_request(req_id, list(range(1, length + 1)), max_tokens=4, mm_inputs=list(images))


def test_a_loaded_output_takes_no_compute_budget_and_is_reported_apart() -> None:
    sched = _scheduler()
    _add(sched, "a", 100, ("x", 10, 80))
    _add(sched, "b", 100, ("y", 30, 40))
    store = _Store(has={"x"})
    so = sched.schedule(external_encoder=store)
    # Loading x leaves the whole budget to y: b's chunk need not stop before its image.
    assert so.num_scheduled_tokens.tolist() == [100, 100]
    assert (so.encoder_input_rows.tolist(), so.encoder_input_ids.tolist()) == ([1], [0])
    assert so.external_encoder_input_rows.tolist() == [0]
    assert so.external_encoder_input_ids.tolist() == [0]
    assert store.asked_items == ["x", "y"]
    assert store.asked_ready == [("a", 0), ("b", 0)]
    entries, freeable = sched.encoder_cache_contents()
    assert entries == [("x", 80, ["a"]), ("y", 40, ["b"])] and freeable == []
    sched.check_invariants()


def test_a_request_in_transit_waits_and_the_passed_inputs_are_reported_once() -> None:
    sched = _scheduler(max_num_batched_tokens=40, max_num_seqs=8)
    _add(sched, "a", 100, ("x", 10, 20))
    store = _Store(in_transit={"a"})
    assert sched.schedule(external_encoder=store).req_ids == []
    assert sched.waiting_request_ids() == ["a"]
    store.in_transit = set()
    for _ in range(2):
        so = sched.schedule(external_encoder=store)
        sched.update_from_output(so, runner_output(so, [[]]))  # prompt chunks: no token
    # The second chunk, [40, 80), passed x (which ends at 30) once the first ran.
    assert sched.take_passed_encoder_inputs() == [("a", 0)]
    assert sched.take_passed_encoder_inputs() == []
    entries, freeable = sched.encoder_cache_contents()
    assert entries == [("x", 20, [])] and freeable == ["x"]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("yes", r'external_encoder.has_cache_item\("x"\)=.*must be a bool'),
        (RuntimeError("down"), "down"),
    ],
)
def test_a_failing_source_is_raised_after_the_step_which_is_delivered_next(
    answer: Any, message: str
) -> None:
    sched = _scheduler()
    _add(sched, "a", 100, ("x", 10, 80))
    _add(sched, "b", 100, ("y", 30, 10))
    store = _Store(has=answer)
    with pytest.raises((InvalidRequestError, RuntimeError), match=message):
        sched.schedule(external_encoder=store)
    # Decided as if the connector had nothing: a encodes x; b, never asked about after the
    # failure, is passed over. The next call delivers that step.
    so = sched.schedule(external_encoder=_Store())
    assert so.req_ids == ["a"]
    assert (so.encoder_input_rows.tolist(), so.external_encoder_input_rows.tolist()) == ([0], [])
    assert sched.waiting_request_ids() == ["b"]
    sched.check_invariants()


def test_without_the_flag_the_source_is_never_asked() -> None:
    sched = _scheduler(ec_connector=False)
    _add(sched, "a", 100, ("x", 10, 80))
    store = _Store(has={"x"}, in_transit={"a"})
    so = sched.schedule(external_encoder=store)
    assert so.encoder_input_rows.tolist() == [0] and so.external_encoder_input_rows.tolist() == []
    assert store.asked_items == [] and store.asked_ready == []
    assert sched.take_passed_encoder_inputs() == []


class _NotCallable:
    """Has the names, not the methods."""

    has_cache_item = True
    ensure_cache_available = True


@pytest.mark.parametrize("source", [object(), _NotCallable()], ids=["bare", "not-callable"])
def test_a_source_without_the_methods_is_refused_before_anything_changes(source: Any) -> None:
    sched = _scheduler()
    _add(sched, "a", 100, ("x", 10, 80))
    with pytest.raises(InvalidRequestError, match="external_encoder: must have a method"):
        sched.schedule(external_encoder=source)
    # Nothing was decided: the next step admits a.
    assert sched.schedule(external_encoder=_Store()).req_ids == ["a"]
