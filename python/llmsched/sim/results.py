"""What an engine saw of its requests: every output token and the last status, per request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmsched._core import RequestOutput, RequestOutputs
from llmsched.status import RequestStatus

__all__ = ["RequestSummary", "Results"]


@dataclass(slots=True)
class RequestSummary:
    """Everything the engine saw of one request: every output token id so far, and its
    status: ``WAITING`` until its first output, ``RUNNING`` while outputs arrive (not read
    from each output, which costs a call into the extension), then its final status."""

    request_id: str
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | None = None


class Results(dict[str, RequestSummary]):
    """The summary of every request an engine has seen, by id (live objects, filled as
    outputs arrive)."""

    def summary(self, request_id: str) -> RequestSummary:
        """The request's summary, made on first use."""
        summary = self.get(request_id)
        if summary is None:
            summary = self[request_id] = RequestSummary(request_id)
        return summary

    def aborted(self, request_ids: Iterable[str]) -> None:
        """Record requests finished by an abort (they produce no output)."""
        for request_id in request_ids:
            summary = self.summary(request_id)
            summary.status = RequestStatus.FINISHED_ABORTED
            summary.finished = True
            summary.finish_reason = RequestStatus.FINISHED_ABORTED.finish_reason

    def collect(self, outputs: Sequence[RequestOutput]) -> None:
        """Record one step's outputs: their tokens, and a finish with its reasons."""
        if not isinstance(outputs, RequestOutputs):  # a list from a custom scheduler
            outputs = list(outputs)
            columns = (
                [o.request_id for o in outputs],
                [len(o.new_token_ids) for o in outputs],
                [t for o in outputs for t in o.new_token_ids],
                [int(o.status) for o in outputs],
            )
        else:  # read the columns: no Python object per request
            columns = (
                outputs.req_ids,
                outputs.num_new_tokens.tolist(),
                outputs.new_token_ids.tolist(),
                outputs.statuses.tolist(),
            )
        offset = 0
        for i, (request_id, count, status) in enumerate(
            zip(columns[0], columns[1], columns[3], strict=True)
        ):
            summary = self.summary(request_id)
            summary.output_token_ids.extend(columns[2][offset : offset + count])
            offset += count
            if summary.status is RequestStatus.WAITING:
                summary.status = RequestStatus.RUNNING
            if status > RequestStatus.PREEMPTED:
                output = outputs[i]
                summary.status = RequestStatus(status)
                summary.finished = True
                summary.finish_reason = output.finish_reason
                summary.stop_reason = output.stop_reason
