"""Field equality of vLLM's own objects: vLLM 0.33.0's scheduler and ``llmsched.vllm``'s.

The parity harness (``harness``) compares plain-data summaries of what two schedulers
decide. Here both sides are vLLM schedulers as an engine sees them: vLLM's own, and the
plug-in (``llmsched.vllm.Scheduler``) built from the same ``VllmConfig`` and
``KVCacheConfig``. Both are fed the same vLLM ``Request`` objects (one copy each) and the
same vLLM ``ModelRunnerOutput``s by the harness's runner and engine loop, and at every step
every field of the ``SchedulerOutput`` (new-request data with block tables, cached-request
data, counts, drafts, finished and preempted ids, and the rest) and of the returned
``EngineCoreOutputs`` (every ``EngineCoreOutput`` field, the scheduler stats) is recorded
for comparison.

Normalized, not loosened: objects that are per-side copies of the same input (the
requests' ``SamplingParams``) are compared by value; event timestamps and
``EngineCoreOutputs.timestamp`` (wall-clock readings) are left out, event types kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .harness import STEP_KEYS, ParityConfig, VllmSide, output_rows

__all__ = ["FIELD_KEYS", "PluginFieldSide", "VllmFieldSide", "engine_outputs_fields"]

FIELD_KEYS = (*STEP_KEYS, "scheduler_output", "engine_outputs")
"""What is compared at every step: the harness's summary, and every field of vLLM's
``SchedulerOutput`` and ``EngineCoreOutputs``."""

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


def engine_outputs_fields(engine_outputs: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Every field of each client's ``EngineCoreOutputs``, wall-clock readings left out."""
    return {
        client: {
            name: _value(getattr(eco, name))
            for name in type(eco).__struct_fields__
            if name not in _CLOCK_FIELDS
        }
        for client, eco in sorted(engine_outputs.items())
    }


class VllmFieldSide(VllmSide):
    """vLLM's scheduler, recording its objects' fields at every step."""

    name = "vllm"

    def schedule(self) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule()
        summary["scheduler_output"] = scheduler_output_fields(out)
        return out, summary

    def update(self, out: Any, summary: dict[str, Any], sampled: dict[str, list[int]]) -> Any:
        engine_outputs = self.scheduler.update_from_output(
            out, self.ref.vllm_runner_output(out, sampled)
        )
        summary["engine_outputs"] = engine_outputs_fields(engine_outputs)
        return output_rows(engine_outputs)


class PluginFieldSide(VllmFieldSide):
    """``llmsched.vllm.Scheduler`` (or ``AsyncScheduler``), built from the very configs of a
    vLLM scheduler made for ``config``, as EngineCore would build it."""

    name = "llmsched.vllm"

    def __init__(self, config: ParityConfig) -> None:
        super().__init__(config, emulate_uncache=False)
        self.scheduler = self.ref.scheduler_from(
            self.scheduler, hash_block_size=config.block_size, include_finished_set=False
        )

    def block_hashes(self, req_id: str) -> Any:
        """The hashes the plug-in's prefix cache uses: its core's (the vLLM ``Request`` keeps
        those of its prompt, as the engine made them, and nothing reads them)."""
        return self.scheduler.core.get_request(req_id).block_hashes
        self.uncache = None
