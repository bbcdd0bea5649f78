"""Request statuses, with vLLM's members, values and order.

The compiled core declares the statuses and exports them as
``_core.REQUEST_STATUSES``; the members are written out here so that type checkers see
them, and a test holds them equal to the core's. Finish reasons are the core's.
"""

from __future__ import annotations

import enum

from llmsched._core import REQUEST_STATUSES


class RequestStatus(enum.IntEnum):
    """Where a request is in its life. The order matters: every status after
    ``PREEMPTED`` is a finished one (``is_finished``)."""

    WAITING = 1
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = 2
    WAITING_FOR_REMOTE_KVS = 3
    WAITING_FOR_STREAMING_REQ = 4
    RUNNING = 5
    PREEMPTED = 6
    FINISHED_STOPPED = 7
    FINISHED_LENGTH_CAPPED = 8
    FINISHED_ABORTED = 9
    FINISHED_IGNORED = 10
    FINISHED_ERROR = 11
    FINISHED_REPETITION = 12

    def __str__(self) -> str:
        return self.name

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish reason for this status (None while unfinished)."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {RequestStatus(value): reason for _, value, reason in REQUEST_STATUSES}
