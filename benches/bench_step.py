"""Per-step cost of ``schedule()`` + ``update_from_output()``, with pytest-benchmark.

Benchmarks are disabled by default (``--benchmark-disable`` in pyproject), so a plain
``pytest`` runs each case once, as a test. ``pytest benches --benchmark-enable`` measures.
Every case of ``llmsched.bench.step.CASES`` runs on llmsched and, when ``vllm`` is importable
(``make bench-vllm-pytest`` runs pytest in the vLLM 0.33.0 venv), on vLLM 0.33.0's own scheduler
with the same workload, so the two rows of a case compare in the same run.

pytest-benchmark times the whole ``stepper.step()``: the scheduler's two calls plus the
benchmark's stand-in runner in Python (a loop over the step's requests), which costs more
than llmsched's calls themselves. ``llmsched bench`` times the scheduler's calls alone, and
is where ``docs/performance.md``'s figures come from. Run with ``OMP_NUM_THREADS=1
OPENBLAS_NUM_THREADS=1`` (see ``llmsched.bench.cli``).

Each case runs warm (back to back) and cold: an ``Evictor`` writes every cache line of
8 MiB, untimed, before the step and again between its two calls, as an engine's work
between the scheduler's calls would.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmsched.bench.step import CASES, Evictor, LlmschedStepper, VllmStepper, vllm_available

IMPLEMENTATIONS = ["llmsched", "vllm"] if vllm_available() else ["llmsched"]


@pytest.mark.parametrize("cache", ["warm", "cold"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case_name", list(CASES))
def test_step(benchmark: Any, case_name: str, implementation: str, cache: str) -> None:
    """One steady-state step of the case; the scheduler keeps its requests running."""
    case = CASES[case_name]
    stepper = LlmschedStepper(case) if implementation == "llmsched" else VllmStepper(case)
    for _ in range(20):  # reach the steady state: prompts prefilled, queues settled
        stepper.step()
    benchmark.group = f"{case_name} {cache}"
    benchmark.extra_info["implementation"] = implementation
    evict = Evictor(8) if cache == "cold" else None
    if evict:
        stepper.between = evict

    def step() -> int:
        return stepper.step()[2]

    # A fixed number of rounds, as `llmsched bench` times: the cases' requests have
    # max_tokens for a few hundred steady steps, and calibrated rounds would outlive them.
    scheduled = benchmark.pedantic(step, setup=evict, rounds=300, iterations=1)
    expected = min(case.running, case.max_num_seqs or case.running)
    if case.churn_max_tokens:  # finished requests are replaced: admissions come and go
        assert 0 < scheduled <= (case.max_num_seqs or scheduled)
    elif case.name == "kv-pressure":  # preemption keeps part of them waiting
        assert 0 < scheduled <= expected
    else:
        assert scheduled == expected
    if isinstance(stepper, LlmschedStepper):
        stepper.sched.check_invariants()
