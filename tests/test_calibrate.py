"""``llmsched calibrate --from-log``: the fit recovers known terms from a step log written as
the plug-in writes it, and bad logs are one line naming the file and line."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmsched import SchedulerConfig
from llmsched.sim.calibrate import LOG_FORMAT

SCRIPT = Path(sys.executable).with_name("llmsched")
TRUE_TERMS = {
    "fixed_ms": 4.0,
    "prefill_token_ms": 0.05,
    "decode_request_ms": 0.2,
    "kv_token_ms": 0.0004,
}


def _header(**engine: Any) -> dict[str, Any]:
    config = SchedulerConfig(**engine).to_dict()
    return {"format": LOG_FORMAT, "vllm": "0.32.0", "engine": config}


def _steps(num: int, seed: int, noise: float, start: float = 100.0) -> list[dict[str, Any]]:
    """Steps whose engine time is TRUE_TERMS' cost (times 1 +- noise), laid out as the
    plug-in logs them: each step's ``t`` is the previous one's plus its engine time and the
    scheduler's own time."""
    rng = random.Random(seed)
    lines, t = [], start
    for _ in range(num):
        prefill = rng.choice([0, 0, rng.randrange(16, 2048)])
        decode = rng.randrange(0, 256)
        context = rng.randrange(100, 60_000)
        schedule_s, update_s = rng.uniform(1e-5, 4e-4), rng.uniform(1e-5, 4e-4)
        lines.append(
            {
                "t": t,
                "schedule_s": schedule_s,
                "update_s": update_s,
                "num_requests": decode + (1 if prefill else 0),
                "prefill_tokens": prefill,
                "decode_requests": decode,
                "context_tokens": context,
            }
        )
        ms = (
            TRUE_TERMS["fixed_ms"]
            + TRUE_TERMS["prefill_token_ms"] * prefill
            + TRUE_TERMS["decode_request_ms"] * decode
            + TRUE_TERMS["kv_token_ms"] * context
        )
        t += ms / 1000.0 * (1 + rng.uniform(-noise, noise)) + schedule_s + update_s
    return lines


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "calibrate", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_the_fit_recovers_the_terms_a_log_was_made_with(tmp_path: Path, noise: float) -> None:
    """Two logs of one engine (two engine lifetimes): every term within a few percent of
    the one the steps were timed with, and the engine's configuration carried over."""
    engine = {"max_num_seqs": 64, "num_gpu_blocks": 4096}
    first = _write(tmp_path / "a.jsonl", [_header(**engine), *_steps(300, 1, noise)])
    second = _write(tmp_path / "b.jsonl", [_header(**engine), *_steps(300, 2, noise, 5000.0)])
    out = tmp_path / "model.json"
    run = _calibrate("--from-log", str(first), str(second), "--out", str(out))
    assert run.returncode == 0, run.stderr
    model = json.loads(out.read_text())
    tolerance = 1e-6 if noise == 0 else 0.1
    for name, value in TRUE_TERMS.items():
        assert model["cost_model"][name] == pytest.approx(value, rel=tolerance), name
    assert model["engine"] == SchedulerConfig(**engine).to_dict()
    assert model["fit"]["steps"] == 598  # each log's last step has no successor
    assert model["fit"]["median_abs_error"] <= noise + 1e-9


def test_simulate_takes_the_fitted_model(tmp_path: Path) -> None:
    log = _write(tmp_path / "a.jsonl", [_header(max_num_seqs=8), *_steps(50, 3, 0.0)])
    model = tmp_path / "model.json"
    assert _calibrate("--from-log", str(log), "--out", str(model)).returncode == 0
    report = tmp_path / "report.json"
    sim = subprocess.run(
        [str(SCRIPT), "simulate", "--num-requests", "4", "--no-progress", "--cost-model",
         str(model), "--json", str(report)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    simulated = json.loads(report.read_text())
    assert simulated["config"]["max_num_seqs"] == 8
    for name, value in TRUE_TERMS.items():
        assert simulated["cost_model"][name] == pytest.approx(value, rel=1e-6)


def _one_line(run: subprocess.CompletedProcess[str], *names: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_a_log_of_another_engine_configuration_is_refused(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.jsonl", [_header(max_num_seqs=64), *_steps(20, 1, 0.0)])
    second = _write(tmp_path / "b.jsonl", [_header(max_num_seqs=32), *_steps(20, 2, 0.0)])
    out = tmp_path / "model.json"
    _one_line(
        _calibrate("--from-log", str(first), str(second), "--out", str(out)),
        "b.jsonl, line 1",
        "max_num_seqs=32",
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("lines", "names"),
    [
        (lambda h, s: [s[0], h, *s], ["line 1", "before the log's header"]),
        (lambda h, s: [h, *s[:3], "{oops", *s[3:]], ["line 5", "not a JSON object"]),
        (lambda h, s: [h, {**s[0], "prefill_tokens": "many"}, *s[1:]], ["line 2", "prefill"]),
        (lambda h, s: [h, *s[:2], {**s[2], "t": 0.0}, *s[3:]], ["line 4", "earlier"]),
        (lambda h, s: [{**h, "format": "other/9"}, *s], ["line 1", "header"]),
        (lambda h, s: [h, *s[:3]], ["2 timed steps", "fewer than"]),
    ],
)
def test_a_bad_log_is_one_line_naming_the_file_and_line(
    tmp_path: Path, lines: Any, names: list[str]
) -> None:
    records = lines(_header(), _steps(20, 4, 0.0))
    log = tmp_path / "a.jsonl"
    log.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    _one_line(_calibrate("--from-log", str(log), "--out", str(tmp_path / "m.json")), *names)
