"""The virtual duration of a model step: what ``llmsched simulate`` charges for each step.

    step = fixed + prefill_token * prefill tokens + decode_request * decode requests
                 + kv_token * context tokens read by attention

The step's shape (prefill tokens, decode requests, context tokens) is
:func:`llmsched.steps.step_shape`'s. The defaults are sized for an 8B-parameter model on one
datacenter GPU; every term can be overridden, or taken from a cost-model file
(:func:`load_cost_model`, which ``llmsched calibrate`` writes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from llmsched._checks import Range
from llmsched._core import SchedulerConfig, SchedulerOutput
from llmsched.steps import step_shape

__all__ = ["COST_TERM", "CostModel", "CostModelFile", "load_cost_model"]

COST_TERM = Range(0)
"""Every cost-model term, in milliseconds."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Virtual duration of one model step, in milliseconds per unit (each field's
    ``metadata["help"]`` says what it charges for)."""

    fixed_ms: float = field(default=6.0, metadata={"help": "cost of every step"})
    prefill_token_ms: float = field(default=0.06, metadata={"help": "per prompt token computed"})
    decode_request_ms: float = field(default=0.08, metadata={"help": "per request decoding"})
    kv_token_ms: float = field(
        default=0.00002, metadata={"help": "per context token read by attention"}
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            COST_TERM.check(f.name, getattr(self, f.name))

    def step_seconds(self, so: SchedulerOutput) -> float:
        if len(so.num_scheduled_tokens) == 0:
            return 0.0
        shape = step_shape(so)
        ms = (
            self.fixed_ms
            + self.prefill_token_ms * shape.prefill_tokens
            + self.decode_request_ms * shape.decode_requests
            + self.kv_token_ms * shape.context_tokens
        )
        return ms / 1000.0


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
    names = [f.name for f in fields(CostModel)]
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
