"""Charts of a replay (matplotlib, the ``plot`` extra): KV usage and queues over time, and
latency CDFs."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from llmsched.sim.report import SimulationReport

__all__ = ["PLOT_HINT", "chart_paths", "write_plots"]

PLOT_HINT = "pip install 'llmsched[plot]'"
"""How to install what ``write_plots`` needs (the README's words)."""


def chart_paths(directory: str | Path, workload: str) -> tuple[Path, Path]:
    """Where ``write_plots`` puts a workload's two charts: file names carry the workload's
    name, so that replays of several workloads into one folder keep every chart."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", workload).strip("._") or "workload"
    out = Path(directory)
    return out / f"{stem}_kv_and_queues.png", out / f"{stem}_latency_cdfs.png"


def write_plots(
    report: SimulationReport, directory: str | Path, measured: dict[str, Any] | None = None
) -> list[Path]:
    """PNG charts: KV usage and queue length over time, latency CDFs (``chart_paths``), with
    a ``measured`` report's CDFs beside them when given (``simulate --measured``). Needs
    matplotlib (``ImportError`` saying how to install it otherwise)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"the charts need matplotlib: {PLOT_HINT}") from e
    kv_path, cdf_path = chart_paths(directory, report.workload)
    kv_path.parent.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    t = np.asarray(report.timeline["time"])

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.plot(t, 100 * np.asarray(report.timeline["kv_usage"]), lw=0.8)
    ax1.set_ylabel("KV cache usage (%)")
    ax1.set_ylim(0, 105)
    ax2.plot(t, report.timeline["running"], lw=0.8, label="running")
    ax2.plot(t, report.timeline["waiting"], lw=0.8, label="waiting")
    ax2.set_ylabel("requests")
    ax2.set_xlabel("virtual time (s)")
    ax2.legend(loc="upper left")
    fig.suptitle(f"{report.workload}: KV usage and queues")
    fig.tight_layout()
    paths.append(kv_path)
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (name, label, scale) in zip(
        axes,
        (("ttft", "TTFT (s)", 1.0), ("tpot", "TPOT (ms)", 1000.0), ("e2e", "end-to-end (s)", 1.0)),
        strict=True,
    ):
        sources = [("predicted" if measured else None, report.latencies[name], "-")]
        if measured:
            sources.append(("measured", measured.get("latencies", {}).get(name) or [], "--"))
        for source, latencies, style in sources:
            values = np.sort([scale * v for v in latencies if v is not None and math.isfinite(v)])
            if values.size:
                ax.plot(values, np.arange(1, values.size + 1) / values.size, style, label=source)
        if measured:
            ax.legend(loc="lower right")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{report.workload}: latency CDFs")
    fig.tight_layout()
    paths.append(cdf_path)
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
