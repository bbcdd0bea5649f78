"""Field equality of vLLM's own objects: vLLM 0.33.0's scheduler and ``llmsched.vllm``'s.

The parity harness (``harness``) compares plain-data summaries of what two schedulers
decide. Here both sides are vLLM schedulers as an engine sees them: vLLM's own, and the
plug-in (``llmsched.vllm.Scheduler``) built from the same ``VllmConfig`` and
``KVCacheConfig``. Both are fed the same vLLM ``Request`` objects (one copy each) and the
same vLLM ``ModelRunnerOutput``s by the harness's runner and engine loop, and at every step
every field of the ``SchedulerOutput`` (new-request data with block tables, cached-request
data, counts, drafts, finished and preempted ids, and the rest) and of the returned
``EngineCoreOutputs`` (every ``EngineCoreOutput`` field, the scheduler stats) is recorded
for comparison; so are the ``Request`` objects' scheduling fields (:data:`REQUEST_FIELDS`)
of every request the step names, after the step and after its output, the order of the
``running`` and ``waiting`` queues, and the requests the scheduler knows (``requests``),
sets aside (``deferred_waiting``), will report finished (``finished_req_ids``), and whose
asynchronous loads were reported (``finished_recving_kv_req_ids``,
``failed_recving_kv_req_ids``). The token lists (:data:`TOKEN_FIELDS`; their lengths are
fields too) are recorded when a request leaves the running queue (preempted, finished): each
step recording them would cost the square of a request's length.

Normalized, not loosened: objects that are per-side copies of the same input (the
requests' ``SamplingParams``) are compared by value; event timestamps and
``EngineCoreOutputs.timestamp`` (wall-clock readings) are left out, event types kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import chain
from typing import Any

from .harness import (
    STEP_KEYS,
    ParityConfig,
    ParityRequest,
    VllmSide,
    failures_by_id,
    output_rows,
)

__all__ = [
    "FIELD_KEYS",
    "REQUEST_FIELDS",
    "TOKEN_FIELDS",
    "PluginFieldSide",
    "VllmFieldSide",
    "engine_outputs_fields",
    "request_fields",
]

FIELD_KEYS = (
    *STEP_KEYS,
    "scheduler_output",
    "engine_outputs",
    "requests_scheduled",
    "requests_updated",
    "queues",
    "grammar_output",
    "kv_events",
)
"""What is compared at every step: the harness's summary, every field of vLLM's
``SchedulerOutput`` and ``EngineCoreOutputs``, the ``Request`` fields, the queues, and the
step's ``GrammarOutput`` (``get_grammar_bitmask``: structured-output rows, bitmask, drafts
it constrains), asked for when vLLM's engine asks: right after the step, or, when it
awaits an earlier step's tokens, right after that step's output; and the KV cache events
``update_from_output`` published (every field of each, the batch's timestamp left out)."""

TOKEN_FIELDS = ("output_token_ids", "all_token_ids", "prompt_token_ids", "block_hashes")
"""The ``Request`` fields that hold every token so far, and the engine's hashes of the full
blocks of those tokens."""

REQUEST_FIELDS = (
    *TOKEN_FIELDS,
    "status",
    "num_computed_tokens",
    "num_prompt_tokens",
    "max_tokens",
    "num_tokens",
    "num_tokens_with_spec",
    "num_output_tokens",
    "spec_token_ids",
    "num_output_placeholders",
    "num_in_flight_tokens",
    "num_stale_output_tokens",
    "drop_stale_output",
    "num_preemptions",
    "is_prefill_chunk",
    "next_decode_eligible_step",
)
"""The fields of vLLM's ``Request`` that its scheduler maintains."""

# EngineCoreOutputs fields that are wall-clock readings.
_CLOCK_FIELDS = frozenset({"timestamp"})


def _value(obj: Any) -> Any:
    """A comparable plain-data view of one field value."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {k: _value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_value(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(_value(v) for v in obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    type_name = type(obj).__name__
    if type_name == "EngineCoreEvent":
        return ("event", int(obj.type))
    if type_name == "SamplingParams":
        return repr(obj)
    if dataclasses.is_dataclass(obj):
        return {
            f.name: _value(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not f.name.startswith("_")
        }
    fields = getattr(type(obj), "__struct_fields__", None)
    if fields is not None:
        return {name: _value(getattr(obj, name)) for name in fields}
    if hasattr(obj, "_asdict"):
        return _value(obj._asdict())
    return repr(obj)


def scheduler_output_fields(out: Any) -> dict[str, Any]:
    """Every field of a vLLM ``SchedulerOutput``; ``num_scheduled_tokens`` keeps its order
    (the runner's batch order follows it)."""
    fields = {f.name: _value(getattr(out, f.name)) for f in dataclasses.fields(out)}
    fields["num_scheduled_tokens"] = list(out.num_scheduled_tokens.items())
    return fields


def _grammar_failure(output: dict[str, Any]) -> bool:
    return output["error"] is not None and not output["new_token_ids"]


def engine_outputs_fields(engine_outputs: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Every field of each client's ``EngineCoreOutputs``, wall-clock readings left out
    (failed grammars' outputs by id: vLLM lists them in a set's order)."""
    fields = {}
    for client, eco in sorted(engine_outputs.items()):
        values = {
            name: _value(getattr(eco, name))
            for name in type(eco).__struct_fields__
            if name not in _CLOCK_FIELDS
        }
        values["outputs"] = failures_by_id(values["outputs"], _grammar_failure)
        fields[client] = values
    return fields


def request_fields(request: Any, *, tokens: bool = True) -> dict[str, Any]:
    """A ``Request``'s :data:`REQUEST_FIELDS` (without :data:`TOKEN_FIELDS` unless
    ``tokens``), and whether it says it is finished."""
    fields = {}
    for name in REQUEST_FIELDS if tokens else REQUEST_FIELDS[len(TOKEN_FIELDS) :]:
        value = getattr(request, name)
        # output_token_ids and all_token_ids are vLLM's read-only list views.
        fields[name] = _value(list(value) if isinstance(value, Sequence) else value)
    fields["is_finished"] = request.is_finished()
    return fields


class _Recorder:
    """A KV event publisher that keeps the batches it is given."""

    def __init__(self, batches: list[Any]) -> None:
        self._batches = batches

    def publish(self, batch: Any) -> None:
        self._batches.append(batch)

    def shutdown(self) -> None:
        pass


class VllmFieldSide(VllmSide):
    """vLLM's scheduler, recording its objects' fields at every step."""

    name = "vllm"

    def __init__(self, config: ParityConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        # Every Request object added, live or finished, by id.
        self.added: dict[str, Any] = {}
        # A step whose grammar bitmask waits for the next output.
        self._awaiting_bitmask: tuple[Any, dict[str, Any]] | None = None
        self.published: list[Any] = []
        self.scheduler.kv_event_publisher = _Recorder(self.published)

    def add(self, req: ParityRequest) -> None:
        super().add(req)
        self.added[req.request_id] = self.scheduler.requests[req.request_id]

    def _requests(self, req_ids: Any, left: Any) -> dict[str, dict[str, Any]]:
        """The fields of the requests ``req_ids`` names; tokens too for those in ``left``."""
        return {
            req_id: request_fields(self.added[req_id], tokens=req_id in left)
            for req_id in sorted(set(req_ids))
        }

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        summary["scheduler_output"] = scheduler_output_fields(out)
        left = out.preempted_req_ids | out.finished_req_ids
        summary["requests_scheduled"] = self._requests(chain(out.num_scheduled_tokens, left), left)
        summary["requests_updated"] = None
        summary["queues"] = {
            queue: [r.request_id for r in getattr(self.scheduler, queue)]
            for queue in ("running", "waiting", "kv_holding_waiting")
        }
        # The requests it knows: live ones, and finished ones whose blocks a connector sends;
        # and which are set aside, finished to report, loaded or failed to load.
        sched = self.scheduler
        summary["queues"]["requests"] = sorted(sched.requests)
        summary["queues"]["deferred_waiting"] = sorted(r.request_id for r in sched.deferred_waiting)
        for name in (
            "finished_req_ids",
            "finished_recving_kv_req_ids",
            "failed_recving_kv_req_ids",
        ):
            summary["queues"][name] = sorted(getattr(sched, name))
        summary["grammar_output"] = None
        if out.pending_structured_output_tokens:
            self._awaiting_bitmask = (out, summary)
        else:
            summary["grammar_output"] = _value(self.scheduler.get_grammar_bitmask(out))
        return out, summary

    def update(self, out: Any, summary: dict[str, Any], sampled: dict[str, list[int]]) -> Any:
        engine_outputs = self.scheduler.update_from_output(out, self._runner_output(out, sampled))
        summary["engine_outputs"] = engine_outputs_fields(engine_outputs)
        summary["kv_events"] = [_value(e) for batch in self.published for e in batch.events]
        self.published.clear()
        rows = output_rows(engine_outputs)
        finished = {row[0] for row in rows if row[2] is not None}
        summary["requests_updated"] = self._requests((row[0] for row in rows), finished)
        if self._awaiting_bitmask is not None:
            awaiting, awaiting_summary = self._awaiting_bitmask
            self._awaiting_bitmask = None
            awaiting_summary["grammar_output"] = _value(
                self.scheduler.get_grammar_bitmask(awaiting)
            )
        return rows


class PluginFieldSide(VllmFieldSide):
    """``llmsched.vllm.Scheduler`` (or ``AsyncScheduler``), built from the very configs of a
    vLLM scheduler made for ``config``, as EngineCore would build it."""

    name = "llmsched.vllm"

    def __init__(self, config: ParityConfig) -> None:
        super().__init__(config, emulate_uncache=False)
        # The hash block size EngineCore resolves: vLLM's scheduler's (with Mamba groups, the
        # least common multiple of the groups' block sizes, as its block size).
        self.scheduler = self.ref.scheduler_from(
            self.scheduler,
            hash_block_size=self.scheduler.hash_block_size,
            include_finished_set=False,
        )
        self.scheduler.kv_event_publisher = _Recorder(self.published)

    def block_hashes(self, req_id: str) -> Any:
        """The hashes the plug-in's prefix cache uses: its core's (the vLLM ``Request``'s,
        the engine's hashes, are compared with the token fields)."""
        return self.scheduler.core.get_request(req_id).block_hashes
