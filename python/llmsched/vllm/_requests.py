"""vLLM's ``Request`` objects, telling what llmsched's core knows of them.

vLLM's own scheduler writes a request's progress (status, computed tokens, output tokens,
drafts, preemptions) into its ``Request`` object every step; the engine, connectors, the
structured output manager and vLLM's tests read it there. The plug-in does not write it:
each request the core takes is turned into a :class:`LiveRequest`, whose fields of that
kind read the core when they are accessed (no Python work per request per step). When the
request finishes, the core hands over its final record (``take_finished_requests``) and
the object keeps it: it reads what it read at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from vllm.v1.core.sched.output import NewRequestData
from vllm.v1.request import Request, RequestStatus
from vllm.v1.utils import ConstantList

import llmsched

__all__ = [
    "LiveRequest",
    "as_during_step",
    "attach",
    "before_step",
    "freeze",
    "is_live",
    "new_request_data",
    "pinned",
    "record",
]

# Where a LiveRequest finds its state, in its instance dict: the core while it is live,
# the core's final record once it finished; and, while vLLM's code reads the request at a
# point of its scheduler's step that the core has passed, the fields as they were there
# (by field name: see `as_during_step`).
_CORE = "_llmsched_core"
_FINAL = "_llmsched_final"
_DURING_STEP = "_llmsched_during_step"
# Set while the engine's block hasher extends a request's hashes (it reads them itself).
_HASHING = "_llmsched_hashing"


def _state(request: Request) -> llmsched.Request:
    fields = request.__dict__
    final: llmsched.Request | None = fields.get(_FINAL)
    if final is not None:
        return final
    core: llmsched.Scheduler = fields[_CORE]
    return core.get_request(request.request_id)


class _CoreField:
    """A ``Request`` field vLLM's scheduler maintains, read from the core on access. The
    core owns it: setting it is an error (it would be silently out of date)."""

    def __init__(self, read: Callable[[llmsched.Request], Any]) -> None:
        self._read = read
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, request: Request | None, owner: type | None = None) -> Any:
        if request is None:
            return self
        during_step: dict[str, Any] | None = request.__dict__.get(_DURING_STEP)
        if during_step is not None and self._name in during_step:
            value = during_step[self._name]
            return value() if callable(value) else value
        return self._read(_state(request))

    def __set__(self, request: Request, value: Any) -> None:
        raise AttributeError(
            f"Request.{self._name} of request {request.request_id!r} is kept by llmsched's "
            "scheduler core and cannot be set"
        )


class _BlockHashes:
    """``block_hashes``: the engine's hashes of the request's full blocks, brought up to its
    tokens when read. vLLM's scheduler extends them as it appends each output token; the
    plug-in appends none to vLLM's object (its tokens read the core), so the engine's own
    hasher extends them here, only for whoever reads them (KV events, connectors)."""

    def __get__(self, request: Request | None, owner: type | None = None) -> Any:
        if request is None:
            return self
        fields = request.__dict__
        if not fields.get(_HASHING):
            fields[_HASHING] = True
            try:
                request.update_block_hashes()
            finally:
                del fields[_HASHING]
        return fields["block_hashes"]

    def __set__(self, request: Request, value: Any) -> None:
        request.__dict__["block_hashes"] = value


class LiveRequest(Request):  # type: ignore[misc]  # vLLM ships no stubs
    """A vLLM ``Request`` whose scheduling state is the core's (see the module's doc).
    Made by :func:`attach` from the engine's own object, so every other field (sampling
    parameters, events, the prompt, metrics) stays what vLLM put there."""

    status = _CoreField(lambda s: RequestStatus(int(s.status)))
    num_computed_tokens = _CoreField(lambda s: s.num_computed_tokens)
    num_tokens = _CoreField(lambda s: s.num_tokens)
    num_tokens_with_spec = _CoreField(lambda s: s.num_tokens_with_spec)
    num_output_tokens = _CoreField(lambda s: s.num_tokens - s.num_prompt_tokens)
    output_token_ids = _CoreField(lambda s: ConstantList(s.output_token_ids))
    all_token_ids = _CoreField(lambda s: ConstantList(s.prompt_token_ids + s.output_token_ids))
    spec_token_ids = _CoreField(lambda s: s.spec_token_ids)
    num_output_placeholders = _CoreField(lambda s: s.num_output_placeholders)
    num_in_flight_tokens = _CoreField(lambda s: s.num_in_flight_tokens)
    num_stale_output_tokens = _CoreField(lambda s: s.num_stale_output_tokens)
    drop_stale_output = _CoreField(lambda s: s.drop_stale_output)
    num_preemptions = _CoreField(lambda s: s.num_preemptions)
    is_prefill_chunk = _CoreField(lambda s: s.is_prefill_chunk)
    next_decode_eligible_step = _CoreField(lambda s: s.next_decode_eligible_step)
    last_sched_seq = _CoreField(lambda s: s.last_sched_seq)
    block_hashes = _BlockHashes()


def attach(request: Request, core: llmsched.Scheduler) -> None:
    """Make ``request`` (just added to ``core``) a :class:`LiveRequest` reading ``core``."""
    request.__dict__[_CORE] = core
    request.__class__ = LiveRequest


def freeze(request: Request, final: llmsched.Request) -> None:
    """Give a finished ``request`` its final record (the core has let it go)."""
    fields = request.__dict__
    fields[_FINAL] = final
    fields.pop(_CORE, None)


def is_live(request: Request) -> bool:
    """Whether ``request`` still reads the core (it has not finished)."""
    return _FINAL not in request.__dict__


def record(request: Request) -> llmsched.Request:
    """The core's record of ``request``: now while it is live, its final one once it
    finished (a snapshot while it is pinned)."""
    return _state(request)


@contextmanager
def pinned(request: Request, snapshot: llmsched.Request) -> Iterator[None]:
    """While the core is inside a step (it cannot be read then), the live ``request`` reads
    ``snapshot``, the core's record of it at that point (a KV connector asked mid-step)."""
    fields = request.__dict__
    fields[_FINAL] = snapshot
    try:
        yield
    finally:
        del fields[_FINAL]


@contextmanager
def as_during_step(fields_by_request: dict[Request, dict[str, Any]]) -> Iterator[None]:
    """While vLLM's code reads requests at a point of its scheduler's step that the core has
    passed (a connector's ``update_state_after_alloc`` and ``build_connector_meta``, a
    ``NewRequestData``), each request in ``fields_by_request`` reads the given fields (by
    name: ``num_computed_tokens``, ``num_output_placeholders``, ``status``) as they were
    there (a callable: the value it returns, worked out only if read); its other fields read
    the core."""
    for request, fields in fields_by_request.items():
        request.__dict__[_DURING_STEP] = fields
    try:
        yield
    finally:
        for request in fields_by_request:
            del request.__dict__[_DURING_STEP]


def new_request_data(
    request: Request,
    block_ids: tuple[list[int], ...],
    prefill_token_ids: list[int] | None,
    num_computed_tokens: int,
) -> NewRequestData:
    """vLLM's ``NewRequestData.from_request`` for a request the step admits, read as vLLM's
    scheduler reads it: with ``num_computed_tokens``, the request's ``C`` before the step
    (what the runner starts from, and where multimodal inputs already covered end)."""
    with as_during_step({request: {"num_computed_tokens": num_computed_tokens}}):
        return NewRequestData.from_request(request, block_ids, prefill_token_ids)


def before_step(
    requests: dict[str, Request], core_out: llmsched.SchedulerOutput, async_scheduling: bool
) -> dict[Request, dict[str, Any]]:
    """For :func:`as_during_step`: the fields a step advances, as they were before it, for
    each of its requests (what vLLM's scheduler's components read while it builds the step,
    such as a connector's ``build_connector_meta``)."""
    req_ids: list[str] = core_out.req_ids
    computed: list[int] = core_out.num_computed_tokens.tolist()
    if not async_scheduling:
        return {
            requests[req_id]: {"num_computed_tokens": c}
            for req_id, c in zip(req_ids, computed, strict=True)
        }
    outputs: list[int] = core_out.num_output_tokens.tolist()
    fields: dict[Request, dict[str, Any]] = {}
    for req_id, c, num_outputs in zip(req_ids, computed, outputs, strict=True):
        request = requests[req_id]
        fields[request] = {
            "num_computed_tokens": c,
            # The step's num_output_tokens counts the placeholders before it.
            "num_output_placeholders": lambda r=request, n=num_outputs: n - r.num_output_tokens,
        }
    return fields
