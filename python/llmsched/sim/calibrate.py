"""The fit of ``simulate``'s step-cost model to an engine's steps (``llmsched calibrate``,
whose command lives with the engine it sweeps, in ``llmsched.bench.calibrate``).

The steps come from the step log (:class:`llmsched.steps.StepLog`) the vLLM plug-in writes
(``LLMSCHED_STEP_LOG=PATH`` in the engine's environment, while it serves or while
``calibrate`` sweeps it; a sweep of vLLM's own scheduler writes it too): a header naming the
scheduler and its configuration, then a line per step with when ``schedule()`` was called,
the time spent in the scheduler's two calls, the requests the engine took in since the step
before, whether the engine was left idle, and the step's shape. A step's engine time is the
interval to the next ``schedule()`` call less the scheduler's own time (the model step and
the engine's other work between the two calls, the requests it took in among it); an
interval after which the engine was idle holds a wait for work, and is left out; the step
after it is one the engine woke up for. A step is the engine's first of its batch shape
when no step before it in the log had that shape (:class:`~llmsched.sim.cost.ShapesRun`:
the logged engine is taken as warmed up, as calibrate's sweep warms it). The engine's terms
of :class:`~llmsched.sim.cost.CostModel` (:data:`~llmsched.sim.cost.ENGINE_TERMS`:
``fixed_ms``, one per count of the shape, ``add_request_ms``, ``add_batch_ms``, ``wake_ms``,
``new_shape_ms``) are the non-negative least-squares fit (``scipy.optimize.nnls``) of those
times to the shapes, the requests taken in (each, and whether any), the wake-ups and the
first steps of a batch shape, each step weighed by its inverse (the fit minimises
relative errors); the scheduler's terms (:data:`~llmsched.sim.cost.SCHEDULER_TERMS`), the
same fit of every step's scheduler time to the requests and tokens it scheduled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmsched.sim.cost import (
    ENGINE_TERMS,
    SCHEDULER_TERMS,
    CostModel,
    ShapesRun,
    scheduled_counts,
)
from llmsched.steps import (
    EMPTY_STEP,
    OLDER_STEP_LOG_FORMATS,
    SCHEDULERS,
    STEP_LOG_FORMAT,
    StepShape,
)

__all__ = ["FitResult", "StepTimes", "fit_cost_model", "read_step_log"]

_STEP_KEYS = ("t", "schedule_s", "update_s", "added", *StepShape._fields)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """The engine time of each logged step that has a successor, and the step's shape; the
    scheduler's time in every logged step."""

    engine: dict[str, Any]
    scheduler: str
    """The scheduler the logs were written under (``llmsched``, or ``vllm``)."""
    seconds: list[float]
    shapes: list[StepShape]
    added: list[int]
    """Requests the engine took in after the step began and before the next one."""
    woke: list[bool]
    """Whether the step began after the engine waited for requests (the engine's first
    step, or one after an idle step)."""
    new_shape: list[bool]
    """Whether the step was the engine's first of its batch shape."""
    scheduler_seconds: list[float]
    scheduler_shapes: list[StepShape]


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def read_step_log(paths: list[str]) -> StepTimes:
    """The steps of one or more logs of the same engine configuration; ``ValueError``
    naming the file and line of the first bad line, or of a header whose configuration
    differs from the first one's."""
    engine: dict[str, Any] | None = None
    scheduler = ""
    seconds: list[float] = []
    shapes: list[StepShape] = []
    added: list[int] = []
    woke: list[bool] = []
    new_shape: list[bool] = []
    scheduler_seconds: list[float] = []
    scheduler_shapes: list[StepShape] = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ValueError(f"--from-log {path}: cannot read it ({e.strerror})") from None
        previous: dict[str, Any] | None = None
        previous_shape = EMPTY_STEP
        previous_woke = previous_new = True
        shapes_run: ShapesRun | None = None
        for number, line in enumerate(lines, 1):
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{where}: not a JSON object") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: not a JSON object")
            if "format" in record:
                if record["format"] in OLDER_STEP_LOG_FORMATS:
                    raise ValueError(
                        f"{where}: a {record['format']} log, written before the step log "
                        "held each step's KV blocks in use: log the engine again"
                    )
                if record["format"] != STEP_LOG_FORMAT or not isinstance(
                    record.get("engine"), dict
                ):
                    raise ValueError(f"{where}: not a {STEP_LOG_FORMAT} header")
                named = record.get("scheduler")
                if named not in SCHEDULERS:
                    raise ValueError(
                        f"{where}: scheduler={named!r} is not one of {', '.join(SCHEDULERS)}"
                    )
                if engine is None:
                    engine, scheduler = record["engine"], named
                elif named != scheduler:
                    raise ValueError(
                        f"{where}: a log of the {named!r} scheduler (first log: {scheduler!r})"
                    )
                elif record["engine"] != engine:
                    differ = ", ".join(
                        f"{k}={record['engine'].get(k)!r} (first log: {engine.get(k)!r})"
                        for k in sorted(set(engine) | set(record["engine"]))
                        if engine.get(k) != record["engine"].get(k)
                    )
                    raise ValueError(f"{where}: a log of another engine configuration: {differ}")
                # A new engine's steps: no interval across engines, its first step is one
                # after a wait, and it has run the warm-up's shapes only.
                previous, previous_woke = None, True
                shapes_run = _shapes_run(record["engine"], where)
                continue
            if engine is None or shapes_run is None:
                raise ValueError(f"{where}: a step before the log's header")
            bad = [k for k in _STEP_KEYS if not _number(record.get(k))]
            if bad:
                raise ValueError(f"{where}: {bad[0]}={record.get(bad[0])!r} is not a number")
            if not isinstance(record.get("idle"), bool):
                raise ValueError(f"{where}: idle={record.get('idle')!r} is not true or false")
            shape = StepShape(*(int(record[k]) for k in StepShape._fields))
            scheduler_seconds.append(record["schedule_s"] + record["update_s"])
            scheduler_shapes.append(shape)
            # After an idle step the engine waited for requests: no step time to read.
            if previous is not None and not previous["idle"]:
                interval = record["t"] - previous["t"]
                if interval < 0:
                    raise ValueError(
                        f"{where}: t={record['t']!r} is earlier than the line before's"
                    )
                own = previous["schedule_s"] + previous["update_s"]
                seconds.append(max(interval - own, 0.0))
                shapes.append(previous_shape)
                added.append(int(record["added"]))
                woke.append(previous_woke)
                new_shape.append(previous_new)
            previous_woke = previous is None or bool(previous["idle"])
            previous_new = shapes_run.first_run(shape)
            previous, previous_shape = record, shape
    if engine is None:
        raise ValueError(f"--from-log {' '.join(paths)}: no {STEP_LOG_FORMAT} header")
    return StepTimes(
        engine,
        scheduler,
        seconds,
        shapes,
        added,
        woke,
        new_shape,
        scheduler_seconds,
        scheduler_shapes,
    )


def _shapes_run(engine: dict[str, Any], where: str) -> ShapesRun:
    """The batch shapes the engine of a log's header has run when its log begins."""
    sizes = []
    for name in ("max_num_batched_tokens", "max_model_len"):
        value = engine.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: the header's engine has {name}={value!r}")
        sizes.append(value)
    return ShapesRun(*sizes)


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted terms, over how many steps, and how far they miss those steps."""

    cost: CostModel
    num_steps: int
    median_abs_error: float
    """The median over the steps of |predicted - measured| / measured."""


def fit_cost_model(times: StepTimes, *, min_steps: int = 8) -> FitResult:
    """The non-negative least-squares fit of :class:`CostModel`'s terms to the steps."""
    try:
        from scipy.optimize import nnls
    except ImportError:
        raise ValueError("calibrate needs scipy: pip install 'llmsched[calibrate]'") from None
    if len(times.seconds) < min_steps:
        raise ValueError(
            f"--from-log: {len(times.seconds)} timed steps, fewer than the {min_steps} a fit needs"
        )
    shapes = np.asarray(times.shapes, dtype=np.float64)
    added = np.asarray(times.added)
    design = np.column_stack(
        [np.ones(len(shapes)), shapes, added, added > 0, times.woke, times.new_shape]
    )
    measured_ms = 1000.0 * np.asarray(times.seconds)
    positive = measured_ms > 0
    # Each step's relative error weighs alike: a latency is a sum of mostly small steps,
    # which an absolute fit would give up for the few long ones.
    weight = 1.0 / measured_ms[positive]
    terms, _ = nnls(design[positive] * weight[:, None], measured_ms[positive] * weight)
    # The scheduler's time against what it scheduled: a constant, the requests, the tokens.
    counts = np.asarray([scheduled_counts(shape) for shape in times.scheduler_shapes])
    own_design = np.column_stack([np.ones(len(counts)), counts.reshape(-1, 2)])
    own_terms, _ = nnls(own_design, 1000.0 * np.asarray(times.scheduler_seconds))
    # The designs' columns are ENGINE_TERMS' and SCHEDULER_TERMS' order.
    cost = CostModel(
        **dict(zip(ENGINE_TERMS, (float(t) for t in terms), strict=True)),
        **dict(zip(SCHEDULER_TERMS, (float(t) for t in own_terms), strict=True)),
    )
    predicted = design @ terms
    errors = np.abs(predicted[positive] - measured_ms[positive]) / measured_ms[positive]
    return FitResult(cost, len(measured_ms), float(np.median(errors)) if errors.size else math.nan)
