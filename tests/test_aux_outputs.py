"""An auxiliary-output connector through the binding (routed experts):
``schedule(aux_outputs=...)`` and ``update_from_output(aux_outputs=...)`` ask it how far a
hit may reach and tell it of preemptions and finishes, handing it the prefix cache as it is
then (``CachedBlocks``, readable only during the call); ``Scheduler.cached_block`` between
calls; a source that fails or lacks a method."""

from __future__ import annotations

from typing import Any

import pytest

from llmsched import CachedBlocks, InvalidRequestError, Request, Scheduler, SchedulerConfig

from conftest import runner_output

PROMPT = list(range(1, 17))


def _scheduler(**overrides: Any) -> Scheduler:
    config = {
        "max_model_len": 64,
        "block_size": 4,
        "num_gpu_blocks": 32,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 8,
        "enable_prefix_caching": True,
        "async_scheduling": False,
        **overrides,
    }
    return Scheduler(SchedulerConfig(**config))


class _Outputs:
    """Lets a hit reach ``max_hit`` tokens (None: all but the last); records what it was
    asked and told, and how many leading blocks of each request it read cached."""

    def __init__(self, max_hit: Any = None) -> None:
        self.max_hit = max_hit
        self.asked: list[tuple[str, int]] = []
        self.told: list[tuple[str, str, int]] = []
        self.kept_cache: CachedBlocks | None = None

    @staticmethod
    def _cached(request: Request, cache: CachedBlocks) -> int:
        count = 0
        for block_hash in request.block_hashes:
            if cache.cached_block(block_hash) is None:
                break
            count += 1
        return count

    def max_cache_hit(self, request: Request, cache: CachedBlocks) -> Any:
        self.asked.append((request.request_id, self._cached(request, cache)))
        self.kept_cache = cache
        if isinstance(self.max_hit, Exception):
            raise self.max_hit
        return request.num_tokens - 1 if self.max_hit is None else self.max_hit

    def cap_external_hit(
        self, request: Request, num_local: int, num_external: int, cache: CachedBlocks
    ) -> int:
        return num_external

    def request_finished(self, request: Request, cache: CachedBlocks) -> None:
        self.told.append((request.request_id, request.status.name, self._cached(request, cache)))


def _cached_first(sched: Scheduler, outputs: _Outputs) -> None:
    """``first`` (16 tokens, 4 blocks) computed and finished, its blocks cached."""
    sched.add_request("first", PROMPT, max_tokens=1)
    so = sched.schedule(aux_outputs=outputs)
    sched.update_from_output(so, runner_output(so, [[7]]), aux_outputs=outputs)


def test_a_hit_reaches_as_far_as_the_connector_lets_it() -> None:
    sched = _scheduler()
    outputs = _Outputs(max_hit=8)
    _cached_first(sched, outputs)
    # Told of the finish before its blocks were freed, its four blocks cached then.
    assert outputs.told == [("first", "FINISHED_LENGTH_CAPPED", 4)]
    sched.add_request("second", PROMPT, max_tokens=1)
    so = sched.schedule(aux_outputs=outputs)
    assert outputs.asked == [("first", 0), ("second", 4)]
    assert (so.num_computed_tokens.tolist(), so.num_scheduled_tokens.tolist()) == ([8], [8])


def test_between_calls_the_scheduler_answers_which_block_holds_a_hash() -> None:
    sched = _scheduler()
    outputs = _Outputs()
    _cached_first(sched, outputs)
    sched.add_request("second", PROMPT, max_tokens=4)
    sched.schedule(aux_outputs=outputs)
    second = sched.get_request("second")
    assert [sched.cached_block(h) for h in second.block_hashes[:3]] == second.block_ids[:3]
    assert sched.cached_block(1) is None
    assert sched.cached_block(second.block_hashes[0], 5) is None, "a group the pool has not"
    with pytest.raises(InvalidRequestError, match="block_hash=-1"):
        sched.cached_block(-1)
    with pytest.raises(InvalidRequestError, match="group=-2"):
        sched.cached_block(second.block_hashes[0], -2)


def test_the_cache_a_call_is_given_cannot_be_read_after_it() -> None:
    sched = _scheduler()
    outputs = _Outputs()
    _cached_first(sched, outputs)
    assert outputs.kept_cache is not None
    with pytest.raises(InvalidRequestError, match="read only during the callback"):
        outputs.kept_cache.cached_block(1)


def test_a_running_request_preempted_for_blocks_is_told_before_they_are_freed() -> None:
    sched = _scheduler(num_gpu_blocks=5, enable_prefix_caching=True)
    outputs = _Outputs()
    sched.add_request("a", PROMPT[:8], max_tokens=8)
    sched.add_request("b", list(range(100, 108)), max_tokens=8)
    for _ in range(6):
        so = sched.schedule(aux_outputs=outputs)
        if not len(so.req_ids):
            break
        sched.update_from_output(
            so, runner_output(so, [[7]] * len(so.req_ids)), aux_outputs=outputs
        )
    preempted = [told for told in outputs.told if told[1] == "RUNNING"]
    # Its two full blocks still cached, its status still running.
    assert preempted[:1] == [("b", "RUNNING", 2)]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("8", r'aux_outputs.max_cache_hit\("second"\)=.*must be an integer'),
        (RuntimeError("down"), "down"),
    ],
)
def test_a_failing_source_is_raised_after_the_step_which_is_delivered_next(
    answer: Any, message: str
) -> None:
    sched = _scheduler()
    _cached_first(sched, _Outputs())
    sched.add_request("second", PROMPT, max_tokens=1)
    with pytest.raises((InvalidRequestError, RuntimeError), match=message):
        sched.schedule(aux_outputs=_Outputs(max_hit=answer))
    # Decided as if no hit were allowed; the next call delivers that step.
    so = sched.schedule(aux_outputs=_Outputs())
    assert (so.num_computed_tokens.tolist(), so.num_scheduled_tokens.tolist()) == ([0], [16])
    sched.check_invariants()


def test_a_source_told_of_a_finish_that_fails_is_raised_once_the_output_is_applied() -> None:
    sched = _scheduler()
    sched.add_request("first", PROMPT, max_tokens=1)
    so = sched.schedule()

    class Failing(_Outputs):
        def request_finished(self, request: Request, cache: CachedBlocks) -> None:
            raise RuntimeError("told")

    with pytest.raises(RuntimeError, match="told"):
        sched.update_from_output(so, runner_output(so, [[7]]), aux_outputs=Failing())
    # Applied all the same: the request finished, nothing is in flight.
    assert not sched.has_unfinished_requests()
    assert [r.request_id for r in sched.take_finished_requests()] == ["first"]
    sched.check_invariants()


class _Incomplete:
    """Has the questions, not the finishes."""

    def max_cache_hit(self, request: Request, cache: CachedBlocks) -> int:
        return 0

    def cap_external_hit(self, *args: Any) -> int:
        return 0


def test_a_source_without_a_method_is_refused_before_anything_changes() -> None:
    sched = _scheduler()
    sched.add_request("first", PROMPT, max_tokens=1)
    with pytest.raises(
        InvalidRequestError, match="aux_outputs: must have a method request_finished"
    ):
        sched.schedule(aux_outputs=_Incomplete())
    so = sched.schedule()
    with pytest.raises(
        InvalidRequestError, match="aux_outputs: must have a method request_finished"
    ):
        sched.update_from_output(so, runner_output(so, [[7]]), aux_outputs=_Incomplete())
    sched.update_from_output(so, runner_output(so, [[7]]))
    assert not sched.has_unfinished_requests()
