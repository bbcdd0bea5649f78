"""Every step of every parity case is identical in llmsched and in vLLM 0.33.0's scheduler.

Runs only where vLLM is importable (``.venv-vllm``: ``make parity-test``); skipped
elsewhere, which is the only skip in the suite. See ``harness`` for the runner and the
engine loop, ``matrix`` for the workloads and configs.
"""

from __future__ import annotations

import dataclasses

import pytest

from .fuzz import make_case
from .harness import (
    LlmschedSide,
    ParityConfig,
    ParityRequest,
    VllmSide,
    blocks_needed,
    compare,
    coverage,
    describe,
    drive,
    run_case,
)
from .matrix import Case, cases

pytest.importorskip("vllm", reason="vLLM 0.33.0 is only installed in .venv-vllm")

CASES = cases()
_BY_ID = {case.id: case for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_every_step_identical(case: Case) -> None:
    comparison, vllm_run, llmsched_run = run_case(case.config, case.requests())
    assert comparison.steps_compared > 0
    assert comparison.identical, f"{case.id}\n" + describe(
        comparison, context=3, runs=(vllm_run, llmsched_run)
    )


def test_a_different_decision_is_caught() -> None:
    """The harness is not vacuous: a pool one block larger on one side shows up."""
    case = _BY_ID["azure-conv/async-K3-apc-prio-kv"]
    requests = case.requests()
    vllm_run = drive(VllmSide, case.config, requests)
    bigger = dataclasses.replace(case.config, num_gpu_blocks=case.config.num_gpu_blocks + 1)
    comparison = compare(vllm_run, drive(LlmschedSide, bigger, requests))
    assert not comparison.identical
    assert comparison.first_difference is not None
    assert comparison.detail


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [
        (
            "synthetic-chat/async-K3-apc-fcfs-kv",
            ("preemptions", "resumptions", "prefix_hit_admissions", "draft_slots"),
        ),
        ("azure-conv/sync-K3-apc-fcfs", ("padded_admissions", "finished_stop")),
        ("synthetic-conv/edge-tightM-async-K3-apc", ("padded_admissions", "finished_length")),
    ],
)
def test_the_matrix_reaches_the_rules(case_id: str, expected: tuple[str, ...]) -> None:
    """Cases that must exercise a rule do (on vLLM's side, identical on llmsched's)."""
    case = _BY_ID[case_id]
    counts = coverage(drive(VllmSide, case.config, case.requests()))
    assert all(counts[key] > 0 for key in expected), counts


# Deliberate deviations (README, "Where llmsched deliberately differs from vLLM 0.33.0").
# The matrix never reaches them; these tests pin each one down where it applies: identical
# up to the point of the deviation, then exactly the documented difference.


def test_deviation_54028_no_padding_that_the_threshold_would_clip() -> None:
    """``0 < long_prefill_token_threshold < 1 + K`` (open vLLM PR #54028): vLLM pads a
    one-token admission to ``1 + K``, the threshold clips it, and vLLM's
    ``assert num_new_tokens == 1 + self.num_spec_tokens`` fails; llmsched does not pad."""
    config = ParityConfig(
        "deviation-54028",
        async_scheduling=False,
        num_speculative_tokens=3,
        enable_prefix_caching=True,
        policy="fcfs",
        num_gpu_blocks=256,
        max_model_len=512,
        long_prefill_token_threshold=2,
    )
    requests = [
        ParityRequest("a", tuple(range(10, 60)), 20, arrival_step=0, arrival_time=0.0),
        ParityRequest("b", (11,), 5, arrival_step=3, arrival_time=1.0),  # 1 token: padded
    ]
    comparison, vllm_run, llmsched_run = run_case(config, requests)
    assert comparison.vllm_error is not None
    assert comparison.vllm_error.startswith("AssertionError")
    assert comparison.llmsched_error is None
    step = comparison.first_difference
    assert step == len(vllm_run.steps) == comparison.steps_identical  # identical until then
    admitted = llmsched_run.steps[step]
    assert ("b", 1) in admitted["scheduled"] and "b" not in admitted["spec_tokens"]


def test_deviation_empty_decode_output_is_undone() -> None:
    """A decode step whose output has no token: vLLM leaves ``num_computed_tokens`` one
    ahead of the tokens, so the request is never scheduled again; llmsched undoes the
    step's positions and samples again."""
    config = ParityConfig(
        "deviation-empty-decode", False, 0, False, "fcfs", num_gpu_blocks=64, max_model_len=256
    )
    request = ParityRequest("a", tuple(range(10, 30)), 8, arrival_step=0, arrival_time=0.0)
    scheduled = {}
    for side in (VllmSide(config), LlmschedSide(config)):
        side.add(request)
        out, prefill = side.schedule()
        side.update(out, prefill, {"a": [100]})
        out, decode = side.schedule()
        side.update(out, decode, {})  # the decode step returns no token
        _, after = side.schedule()
        scheduled[side.name] = [prefill["scheduled"], decode["scheduled"], after["scheduled"]]
    assert scheduled["vllm"][:2] == scheduled["llmsched"][:2] == [[("a", 20)], [("a", 1)]]
    assert scheduled["vllm"][2] == []
    assert scheduled["llmsched"][2] == [("a", 1)]


def test_deviation_requests_that_could_outgrow_the_pool_are_refused() -> None:
    """vLLM accepts a request whose KV could outgrow the whole pool (it would preempt
    everything, then itself, forever); llmsched's ``add_request`` refuses it."""
    from llmsched import InvalidRequestError

    config = ParityConfig("deviation-pool", False, 0, False, "fcfs", num_gpu_blocks=3)
    request = ParityRequest("big", tuple(range(10, 30)), 100, arrival_step=0, arrival_time=0.0)
    assert blocks_needed(request, config) > config.num_gpu_blocks - 1
    vllm_side = VllmSide(config)
    vllm_side.add(request)
    assert vllm_side.has_requests()
    with pytest.raises(InvalidRequestError, match="could never finish"):
        LlmschedSide(config).add(request)


@pytest.mark.parametrize("seed", range(40))
def test_random_small_case(seed: int) -> None:
    """Odd small configs and workloads (``fuzz.make_case``); more seeds: ``python -m
    tests.parity.fuzz START COUNT``."""
    config, requests = make_case(seed)
    comparison, vllm_run, llmsched_run = run_case(config, requests)
    assert comparison.identical, f"seed {seed}: {config}\n" + describe(
        comparison, context=3, runs=(vllm_run, llmsched_run)
    )
