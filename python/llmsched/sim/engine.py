"""The engine loop: a scheduler and a model runner driven as vLLM's ``EngineCore`` does.

Sync scheduling (``config.async_scheduling`` False) follows ``EngineCore.step``: schedule,
execute, apply the output, then hand the runner's drafts back to the scheduler.

Async scheduling follows ``EngineCore.step_with_batch_queue`` with a batch queue of two,
assuming a busy GPU: step *t + 1* is scheduled (and, the simulated runner being instant,
executed) **before** step *t*'s output is applied, which is what makes the scheduler's
placeholders and optimistic ``num_computed_tokens`` matter. Every scheduled step, empty
ones included, is applied exactly once and in order.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from llmsched._core import BATCH_QUEUE_SIZE as _CORE_BATCH_QUEUE_SIZE
from llmsched._core import MAX_IDLE_STEPS as _CORE_MAX_IDLE_STEPS
from llmsched._core import (
    ConfigError,
    DuplicateRequestError,
    RequestOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from llmsched.sim.results import RequestSummary, Results
from llmsched.sim.runner import SimulatedModelRunner
from llmsched.status import RequestStatus

__all__ = ["BATCH_QUEUE_SIZE", "Engine", "ModelRunner"]

BATCH_QUEUE_SIZE: int = _CORE_BATCH_QUEUE_SIZE
"""Steps in flight under async scheduling (vLLM's batch queue without pipeline parallelism),
as the core's replay keeps them."""

_MAX_IDLE_STEPS: int = _CORE_MAX_IDLE_STEPS
"""``run`` gives up after this many consecutive steps that schedule nothing while nothing is
in flight: the scheduler's state can no longer change, so it would loop forever (as the
core's replay does)."""


class ModelRunner(Protocol):
    """What the engine needs from a runner. A runner may also have ``config`` (checked
    against the engine's) and ``take_draft_token_ids()`` (sync spec decode: the arguments
    of ``Scheduler.update_draft_token_ids``, ids and rows or ids, flat drafts and counts;
    or None)."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> Any: ...


class Engine:
    """Drives a ``Scheduler`` built from ``config`` and a model runner (by default a
    ``SimulatedModelRunner`` on the same config).

    With ``check_invariants``, every ``schedule()`` and every ``update_from_output`` is
    followed by ``Scheduler.check_invariants()`` (the simulated runner asserts what vLLM's
    GPU runner asserts on every step it executes). ``on_schedule`` is
    called with every ``SchedulerOutput``, before the runner executes it.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        runner: ModelRunner | None = None,
        *,
        check_invariants: bool = False,
        on_schedule: Callable[[SchedulerOutput], None] | None = None,
    ) -> None:
        scheduler = Scheduler(config)  # first: it refuses what is not a SchedulerConfig
        if runner is None:
            runner = SimulatedModelRunner(config)
        else:
            _check_runner_config(config, runner)
        self._config = config
        self._scheduler = scheduler
        self._runner: ModelRunner = runner
        self._take_drafts = getattr(runner, "take_draft_token_ids", None)
        self._check = check_invariants
        self._on_schedule = on_schedule
        self._async = bool(config.async_scheduling)
        self._batch_queue: deque[tuple[SchedulerOutput, Any]] = deque()
        self._num_steps = 0
        self._last_applied_step_id: int | None = None
        self._scheduler_seconds = 0.0
        self._idle_steps = 0
        self._results = Results()

    # ------------------------------------------------------------------ properties

    @property
    def config(self) -> SchedulerConfig:
        return self._config

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @property
    def runner(self) -> ModelRunner:
        return self._runner

    @property
    def num_steps(self) -> int:
        """How many steps were scheduled (and executed), empty ones included."""
        return self._num_steps

    @property
    def last_applied_step_id(self) -> int | None:
        """``step_id`` of the last step whose output was applied (None before the first)."""
        return self._last_applied_step_id

    @property
    def scheduler_seconds(self) -> float:
        """Wall time spent inside ``schedule()`` and ``update_from_output()``."""
        return self._scheduler_seconds

    @property
    def num_steps_in_flight(self) -> int:
        """Steps scheduled and executed whose output is not applied yet (async only)."""
        return len(self._batch_queue)

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer[Any]],
        **kwargs: Any,
    ) -> None:
        """Queue a request; ``kwargs`` go to ``Scheduler.add_request`` (``max_tokens``...).

        Raises ``DuplicateRequestError`` for the id of a request this engine has finished:
        its summary in ``results`` would be lost."""
        previous = self._results.get(request_id) if isinstance(request_id, str) else None
        if previous is not None and previous.finished:
            raise DuplicateRequestError(
                f"request_id={request_id!r}: this engine already finished a request with this "
                f"id ({previous.finish_reason}); its result is in Engine.results: use a new id"
            )
        self._scheduler.add_request(request_id, prompt_token_ids, **kwargs)
        self._results[request_id] = RequestSummary(request_id)

    def abort_requests(self, request_ids: str | Iterable[str]) -> list[str]:
        """Finish live requests as ``FINISHED_ABORTED``; returns the ids aborted."""
        aborted = self._scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        self._results.aborted(aborted)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return self._scheduler.has_unfinished_requests()

    @property
    def results(self) -> dict[str, RequestSummary]:
        """The summary of every request this engine has seen, by id (live objects)."""
        return self._results

    # ------------------------------------------------------------------ the loop

    def step(self) -> Sequence[RequestOutput]:
        """One engine step; returns the request outputs it applied (possibly none)."""
        outputs = self._step_async() if self._async else self._step_sync()
        if outputs:
            self._results.collect(outputs)
        return outputs

    def run(self, max_steps: int | None = None) -> dict[str, RequestSummary]:
        """Step until the scheduler has no requests and no step is in flight, or for at most
        ``max_steps`` calls of ``step``. Returns ``results``: per request, every output
        token id and the last status seen.

        Raises ``RuntimeError`` if the scheduler keeps scheduling nothing while nothing is
        in flight (it would never finish)."""
        calls = 0
        while self._scheduler.has_requests() or self._batch_queue:
            if max_steps is not None and calls >= max_steps:
                break
            self.step()
            calls += 1
            if self._idle_steps >= _MAX_IDLE_STEPS:
                running, waiting = self._scheduler.get_request_counts()
                raise RuntimeError(
                    f"the scheduler made no progress in {self._idle_steps} steps with nothing "
                    f"in flight ({running} running, {waiting} waiting requests)"
                )
        return self._results

    def _step_sync(self) -> Sequence[RequestOutput]:
        scheduler = self._scheduler
        if not scheduler.has_requests():
            return []
        scheduler_output = self._schedule()
        runner_output = self._runner.execute_model(scheduler_output)
        outputs = self._update(scheduler_output, runner_output)
        if self._take_drafts is not None:
            drafts = self._take_drafts()
            if drafts is not None and drafts[0]:
                scheduler.update_draft_token_ids(*drafts)
        self._note_idle(scheduler_output, False, outputs)
        return outputs

    def _step_async(self) -> Sequence[RequestOutput]:
        scheduler = self._scheduler
        queue = self._batch_queue
        if len(queue) < BATCH_QUEUE_SIZE and scheduler.has_requests():
            in_flight = any(so.total_num_scheduled_tokens > 0 for so, _ in queue)
            scheduler_output = self._schedule()
            runner_output = self._runner.execute_model(scheduler_output)
            queue.append((scheduler_output, runner_output))
            if (
                scheduler_output.total_num_scheduled_tokens > 0
                and len(queue) < BATCH_QUEUE_SIZE
                and scheduler.has_requests()
            ):
                self._idle_steps = 0
                return []  # the GPU is busy: schedule the next step before waiting on this one
            outputs = self._update(*queue.popleft())
            self._note_idle(scheduler_output, in_flight, outputs)
            return outputs
        if not queue:
            return []
        return self._update(*queue.popleft())

    def _schedule(self) -> SchedulerOutput:
        started = time.perf_counter()
        scheduler_output = self._scheduler.schedule()
        self._scheduler_seconds += time.perf_counter() - started
        self._num_steps += 1
        if self._on_schedule is not None:
            self._on_schedule(scheduler_output)
        if self._check:
            self._scheduler.check_invariants()
        return scheduler_output

    def _update(
        self, scheduler_output: SchedulerOutput, runner_output: Any
    ) -> Sequence[RequestOutput]:
        started = time.perf_counter()
        outputs = self._scheduler.update_from_output(scheduler_output, runner_output)
        self._scheduler_seconds += time.perf_counter() - started
        self._last_applied_step_id = scheduler_output.step_id
        if self._check:
            self._scheduler.check_invariants()
        return outputs

    def _note_idle(
        self, scheduler_output: SchedulerOutput, in_flight: bool, outputs: Sequence[RequestOutput]
    ) -> None:
        if scheduler_output.total_num_scheduled_tokens == 0 and not in_flight and not outputs:
            self._idle_steps += 1
        else:
            self._idle_steps = 0


def _check_runner_config(config: SchedulerConfig, runner: object) -> None:
    """The engine must never run a scheduler and a runner that disagree on the config,
    above all on ``max_model_len``."""
    runner_config = getattr(runner, "config", None)
    if runner_config is None or runner_config == config:
        return
    runner_len = getattr(runner_config, "max_model_len", None)
    if runner_len != config.max_model_len:
        raise ConfigError(
            f"max_model_len: the runner's config has max_model_len={runner_len} but the "
            f"engine's has {config.max_model_len}; scheduler and runner must agree"
        )
    detail = ""
    to_dict = getattr(runner_config, "to_dict", None)
    if callable(to_dict):
        ours, theirs = config.to_dict(), to_dict()
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        detail = f" (fields that differ: {', '.join(differ)})"
    raise ConfigError(f"the runner's config differs from the engine's{detail}")
