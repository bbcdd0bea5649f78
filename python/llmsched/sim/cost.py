"""The virtual duration of a model step: what ``llmsched simulate`` charges for each step.

    step = fixed + sum over the step's shape of term * count

with a term per count of :class:`llmsched.steps.StepShape` (prefilling requests, requests
the runner sets up and lets go, prefill tokens and attention, decode requests, first decodes
and decode context), and a term per request the engine takes in, charged when it arrives
(an engine's own work between two steps). Why these counts: ``docs/fidelity.md`` measures
them against the earlier linear form. The defaults are sized for an 8B-parameter model on
one datacenter GPU; every term can be overridden, or taken from a cost-model file
(:func:`load_cost_model`, which ``llmsched calibrate`` writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from llmsched._checks import Range
from llmsched._core import SchedulerConfig, SchedulerOutput
from llmsched.steps import StepShape, step_shape

__all__ = ["COST_TERM", "SHAPE_TERMS", "TERMS", "CostModel", "CostModelFile", "load_cost_model"]

COST_TERM = Range(0)
"""Every cost-model term, in milliseconds."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Virtual duration of one model step, in milliseconds per unit (each field's
    ``metadata["help"]`` says what it charges for): ``fixed_ms``, then a term per count of
    :class:`~llmsched.steps.StepShape`, in its order, then ``add_request_ms`` (charged per
    arriving request, not per step)."""

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
    add_request_ms: float = field(
        default=0.0, metadata={"help": "per request the engine takes in, when it arrives"}
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            COST_TERM.check(f.name, getattr(self, f.name))

    def step_seconds(self, so: SchedulerOutput) -> float:
        if len(so.num_scheduled_tokens) == 0:
            return 0.0
        return self.shape_ms(step_shape(so)) / 1000.0

    def shape_ms(self, shape: StepShape) -> float:
        """The cost of a step of ``shape``, in milliseconds."""
        charged: float = sum(
            getattr(self, term) * count for term, count in zip(SHAPE_TERMS, shape, strict=True)
        )
        return self.fixed_ms + charged


TERMS: tuple[str, ...] = tuple(f.name for f in fields(CostModel))
"""Every term, in order: ``fixed_ms``, :data:`SHAPE_TERMS`, ``add_request_ms``."""
SHAPE_TERMS: tuple[str, ...] = TERMS[1:-1]
"""The term charging each count of :class:`~llmsched.steps.StepShape`, in its order."""
if len(SHAPE_TERMS) != len(StepShape._fields) or TERMS[-1] != "add_request_ms":
    raise ImportError("CostModel's terms must be fixed_ms, one per StepShape count, add_request_ms")


@dataclass(frozen=True, slots=True)
class CostModelFile:
    """A cost model for one engine, as a file holds it: the terms, and the engine's
    scheduler settings (``SchedulerConfig`` fields) the terms were measured under."""

    cost: CostModel
    engine: dict[str, Any]


def load_cost_model(path: str | Path) -> CostModelFile:
    """Reads a cost-model file: a JSON object ``{"cost_model": {TERM: ms, ...}, "engine":
    {SchedulerConfig field: value, ...}, "fit": {...}}``, every term of :class:`CostModel`
    present and in range, ``engine`` optional, ``fit`` (how well the terms fit the steps
    they were fitted to) informative. ``ValueError`` naming the file and what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--cost-model {path}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--cost-model {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cost_model"), dict):
        raise ValueError(f'--cost-model {path}: expected an object with a "cost_model" object')
    unknown = sorted(set(data) - {"cost_model", "engine", "fit"})
    if unknown:
        raise ValueError(f"--cost-model {path}: unknown key {unknown[0]!r}")
    terms: dict[str, Any] = data["cost_model"]
    names = TERMS
    missing = [name for name in names if name not in terms]
    if missing:
        raise ValueError(f"--cost-model {path}: cost_model.{missing[0]} is missing")
    extra = sorted(set(terms) - set(names))
    if extra:
        raise ValueError(f"--cost-model {path}: cost_model.{extra[0]} is not a term")
    for name in names:
        value = terms[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"--cost-model {path}: cost_model.{name}={value!r}: not a number")
        try:
            COST_TERM.check(name, value)
        except ValueError as e:
            raise ValueError(f"--cost-model {path}: cost_model.{e}") from None
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise ValueError(f'--cost-model {path}: "engine" must be an object')
    known = SchedulerConfig().to_dict()
    strange = sorted(set(engine) - set(known))
    if strange:
        raise ValueError(f"--cost-model {path}: engine.{strange[0]} is not a SchedulerConfig field")
    return CostModelFile(CostModel(**{name: float(terms[name]) for name in names}), engine)
