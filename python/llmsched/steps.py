"""What a step asks of the model, in the terms a step-cost model charges for, and the step
log that records it.

One home for the step's shape: ``llmsched simulate``'s cost model charges it, and the step
log (:class:`StepLog`, turned on by :data:`STEP_LOG_ENV`) records it beside the time the
engine took, for ``llmsched calibrate`` to fit the cost model to; and for the log's name and
format, which the vLLM plug-in (and calibrate's logging wrapper of vLLM's own scheduler)
writes and ``calibrate`` reads.

A scheduled request decodes when its step is one sampled position plus its draft slots, and
prefills otherwise (a prompt chunk, or the tokens a resumed request recomputes). The shape
counts what a step's cost grows with: the prefilling requests, those the runner sets up (new
or resumed) and lets go (finished at the step before), the prefill tokens and the attention
they compute (each chunk of ``n`` tokens after ``C`` computed ones attends to
``n*C + n*(n+1)/2`` positions), the decode requests, those decoding for the first time, the
context the decode requests read (``C + n`` each), and the KV blocks in use when the step
runs (``Scheduler.num_used_blocks``): the distinct KV memory its attention reads. Requests
that share a prefix read its blocks once per step from a cache; on a CPU engine a decode
batch of 16 requests with one 900-token prefix steps in half the time or less of one with 16
different prompts (``docs/step-effects.md``), so context counted per request misses what the
memory counts.
"""

from __future__ import annotations

import json
import weakref
from typing import IO, Any, NamedTuple

from llmsched._core import SchedulerOutput
from llmsched._core import step_shape as _step_shape

__all__ = [
    "EMPTY_STEP",
    "OLDER_STEP_LOG_FORMATS",
    "SCHEDULERS",
    "STEP_LOG_ENV",
    "STEP_LOG_FORMAT",
    "StepLog",
    "StepShape",
    "step_shape",
]

STEP_LOG_ENV = "LLMSCHED_STEP_LOG"
"""The environment variable that turns the plug-in's step log on: the file it appends to."""
STEP_LOG_FORMAT = "llmsched-step-log/3"
"""The step log header's format marker."""
OLDER_STEP_LOG_FORMATS = ("llmsched-step-log/1", "llmsched-step-log/2")
"""Markers of the step log's earlier formats, which ``calibrate`` no longer reads."""
SCHEDULERS = ("llmsched", "vllm")
"""The schedulers a step log can be written under: llmsched's plug-in, vLLM's own."""


class StepShape(NamedTuple):
    """What a step asks of the model (see the module doc)."""

    prefill_requests: int
    new_requests: int
    finished_requests: int
    prefill_tokens: int
    prefill_attention: int
    decode_requests: int
    first_decodes: int
    decode_context: int
    kv_blocks: int


EMPTY_STEP = StepShape(0, 0, 0, 0, 0, 0, 0, 0, 0)
"""The shape of a step that schedules nothing."""


def step_shape(so: SchedulerOutput, kv_blocks: int) -> StepShape:
    """The shape of a step the core decided, read from its columns by the core (the
    reading its replay charges); ``kv_blocks`` is the scheduler's ``num_used_blocks``
    right after it decided the step."""
    return StepShape(
        **_step_shape(
            so.num_scheduled_tokens,
            so.num_computed_tokens,
            so.num_spec_tokens,
            so.num_output_tokens,
            len(so.new_req_ids) + len(so.resumed_req_ids),
            len(so.finished_req_ids),
            kv_blocks,
        )
    )


class StepLog:
    """Appends one engine's steps to a step log (JSON lines): a header naming the format,
    the scheduler (``llmsched``, or ``vllm`` for vLLM's own) and its configuration, then one
    line per step that ran: when ``schedule()`` was called (``t``, seconds on the process's
    monotonic clock), the time spent in ``schedule()`` and ``update_from_output()``, the
    requests added since the step before (``added``), whether no request was left
    afterwards (``idle``: the engine then waits for work), and the step's shape."""

    def __init__(
        self, path: str, engine: dict[str, Any], vllm_version: str, scheduler: str = "llmsched"
    ) -> None:
        # Line-buffered: a line per step reaches the file as it is written (an engine that
        # dies keeps its log); closed by close(), or when the log is dropped.
        self._file: IO[str] = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._closer = weakref.finalize(self, self._file.close)
        self._write(
            {
                "format": STEP_LOG_FORMAT,
                "vllm": vllm_version,
                "scheduler": scheduler,
                "engine": engine,
            }
        )
        # Steps decided and not yet applied: when schedule() was called, how long it took,
        # the shape, and how many requests the engine added since the step before.
        self._pending: dict[int, tuple[float, float, StepShape, int]] = {}
        self.added = 0
        """Requests added to the scheduler since the last step logged."""

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def scheduled(self, key: int, started: float, seconds: float, shape: StepShape) -> None:
        """A step of ``shape`` was decided under ``key``, in ``seconds`` from ``started``."""
        self._pending[key] = (started, seconds, shape, self.added)
        self.added = 0

    def applied(self, key: int, seconds: float, idle: bool) -> None:
        """The output of the step under ``key`` was applied in ``seconds``, after which the
        scheduler holds no request (``idle``: the engine may wait for the next): its line."""
        started, schedule_s, shape, added = self._pending.pop(key)
        self._write(
            {
                "t": started,
                "schedule_s": schedule_s,
                "update_s": seconds,
                "added": added,
                "idle": idle,
                **shape._asdict(),
            }
        )

    def close(self) -> None:
        self._closer()
