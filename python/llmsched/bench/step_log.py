"""The step log of vLLM's own scheduler: what ``llmsched calibrate --scheduler vllm`` fits.

The plug-in writes its step log itself (:class:`llmsched.steps.StepLog`); vLLM's scheduler
does not, so :class:`LoggedScheduler` wraps it in the engine and writes the same lines, the
step's shape read from vLLM's own ``SchedulerOutput`` (:func:`vllm_step_shape`). The fit
then has the engine under vLLM's scheduler, and the time that scheduler takes per step,
which ``simulate --scheduler-cost`` charges to predict what switching schedulers does.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from llmsched._core import step_shape as _step_shape
from llmsched.steps import StepLog, StepShape

__all__ = ["LoggedScheduler", "vllm_step_shape"]


def vllm_step_shape(so: Any, kv_blocks: int) -> StepShape:
    """The shape of a step (:class:`~llmsched.steps.StepShape`) read from vLLM's
    ``SchedulerOutput``, its columns read by the core as the plug-in's are (a request decodes
    when it is scheduled one token beyond its drafts);
    ``kv_blocks``, the blocks vLLM's pool holds for requests as the step runs."""
    cached = so.scheduled_cached_reqs
    computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    computed.update({new.req_id: new.num_computed_tokens for new in so.scheduled_new_reqs})
    outputs = dict(zip(cached.req_ids, cached.num_output_tokens, strict=True))
    drafts = so.scheduled_spec_decode_tokens
    scheduled = so.num_scheduled_tokens

    def column(values: Iterable[int]) -> npt.NDArray[np.int32]:
        return np.fromiter(values, dtype=np.int32, count=len(scheduled))

    return StepShape(
        **_step_shape(
            column(scheduled.values()),
            column(computed[r] for r in scheduled),
            column(len(drafts.get(r, ())) for r in scheduled),
            column(outputs.get(r, 0) for r in scheduled),
            len(so.scheduled_new_reqs) + len(cached.resumed_req_ids),
            len(so.finished_req_ids),
            kv_blocks,
        )
    )


def _used_blocks(scheduler: Any) -> int:
    """The blocks vLLM's scheduler holds for requests: its pool less the null block and
    the free queue (what ``Scheduler.num_used_blocks`` counts in llmsched's)."""
    pool = scheduler.kv_cache_manager.block_pool
    return int(pool.num_gpu_blocks) - 1 - int(pool.get_num_free_blocks())


class LoggedScheduler:
    """Forwards everything to a vLLM scheduler and writes its steps to ``log`` as the
    plug-in writes its own: the time of ``schedule()`` and ``update_from_output()``, the
    requests added between two steps, the step's shape, whether the engine is left idle.
    A proxy installed as the engine core's ``scheduler``, so vLLM's class is unchanged."""

    def __init__(self, inner: Any, log: StepLog) -> None:
        self.inner = inner
        self.log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def add_request(self, request: Any) -> None:
        """The inner ``add_request``, counted for the next step's line."""
        self.inner.add_request(request)
        self.log.added += 1

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """The inner ``schedule``, timed; a step that schedules tokens is logged."""
        started = time.monotonic()
        so = self.inner.schedule(*args, **kwargs)
        if so.total_num_scheduled_tokens:
            seconds = time.monotonic() - started
            shape = vllm_step_shape(so, _used_blocks(self.inner))
            self.log.scheduled(id(so), started, seconds, shape)
        return so

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """The inner ``update_from_output``, timed; writes the step's line."""
        started = time.monotonic()
        out = self.inner.update_from_output(scheduler_output, model_runner_output)
        if scheduler_output.total_num_scheduled_tokens:
            self.log.applied(
                id(scheduler_output),
                time.monotonic() - started,
                not self.inner.has_unfinished_requests(),
            )
        return out
