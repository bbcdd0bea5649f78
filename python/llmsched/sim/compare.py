"""Measured against predicted: a real engine's report beside a simulation's.

``llmsched replay-engine --json`` writes a replay's report in ``simulate``'s shape, on the
engine's clock; ``simulate --measured REPORT`` puts its figures (:data:`COMPARED`) beside the
simulation's, with the prediction's error, in the printed report, the JSON report
(``measured``) and the latency charts (the measured CDFs beside the predicted ones).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["COMPARED", "comparison", "figure", "load_measured"]

COMPARED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TTFT p50", ("latency_seconds", "ttft", "p50")),
    ("TTFT p90", ("latency_seconds", "ttft", "p90")),
    ("TPOT p50", ("latency_seconds", "tpot", "p50")),
    ("TPOT p90", ("latency_seconds", "tpot", "p90")),
    ("E2E p50", ("latency_seconds", "e2e", "p50")),
    ("E2E p90", ("latency_seconds", "e2e", "p90")),
    ("output tok/s", ("throughput", "output_tokens_per_s")),
)
"""The figures compared: a label, and where a report (its JSON) holds the figure."""


def figure(report: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path`` in a report's JSON, None where it has none."""
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def load_measured(path: str | Path, *, workload: str, num_requests: int) -> dict[str, Any]:
    """A measured report (``replay-engine --json``) of the replay about to be simulated
    (``workload`` with ``num_requests`` requests); ``ValueError`` naming the file and what
    is wrong: not JSON, a figure missing or not a number, another workload."""
    where = f"--measured {path}"
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(report, dict):
        raise ValueError(f"{where}: not a report (a JSON object)")
    for _, key in COMPARED:
        value = figure(report, key)
        if value is None:
            raise ValueError(f"{where}: {'.'.join(key)} is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{where}: {'.'.join(key)}={value!r}: not a number >= 0")
    theirs = (report.get("workload"), report.get("num_requests"))
    if theirs != (workload, num_requests):
        raise ValueError(
            f"{where}: a report of {theirs[0]!r} with {theirs[1]!r} requests; this replay is "
            f"{workload!r} with {num_requests}"
        )
    return report


def comparison(predicted: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Per :data:`COMPARED` figure: the measured and predicted values and the prediction's
    error, ``(predicted - measured) / measured`` (None where the measured value is 0)."""
    rows = []
    for label, key in COMPARED:
        want, got = float(figure(measured, key)), figure(predicted, key)
        got = math.nan if got is None else float(got)
        error = (got - want) / want if want > 0 and math.isfinite(got) else None
        rows.append({"metric": label, "measured": want, "predicted": got, "error": error})
    return rows
