"""The plug-in's step log (opt-in): what each step asked of the model and how long the
engine took, for ``llmsched calibrate --from-log`` to fit a step-cost model to the engine a
user runs.

Set ``LLMSCHED_STEP_LOG=PATH`` in the engine's environment: each scheduler the engine builds
appends to ``PATH`` (JSON lines) a header naming its configuration, then one line per step
that ran: when ``schedule()`` was called (``t``, seconds on the process's monotonic clock),
the time spent in ``schedule()`` and ``update_from_output()``, the requests added since the
step before (``added``), whether no request was left afterwards (``idle``: the engine then
waits for work), and the step's shape (:func:`llmsched.steps.step_shape`). Unset, the
plug-in pays one attribute test per step.
"""

from __future__ import annotations

import json
import weakref
from typing import IO, Any

import llmsched
from llmsched.steps import STEP_LOG_FORMAT, step_shape

__all__ = ["StepLog"]


class StepLog:
    """Appends one engine's steps to a log file."""

    def __init__(self, path: str, config: llmsched.SchedulerConfig, vllm_version: str) -> None:
        # Line-buffered: a line per step reaches the file as it is written (an engine that
        # dies keeps its log); closed by close(), or when the scheduler is dropped.
        self._file: IO[str] = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._closer = weakref.finalize(self, self._file.close)
        header = {"format": STEP_LOG_FORMAT, "vllm": vllm_version, "engine": config.to_dict()}
        self._write(header)
        # Steps decided and not yet applied: when schedule() was called, how long it took,
        # the shape, and how many requests the engine added since the step before.
        self._pending: dict[int, tuple[float, float, Any, int]] = {}
        self.added = 0
        """Requests added to the scheduler since the last step logged."""

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def scheduled(self, key: int, started: float, seconds: float, step: Any) -> None:
        """A step the core decided (``step``, its ``SchedulerOutput``) under ``key``."""
        self._pending[key] = (started, seconds, step_shape(step), self.added)
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
