"""Per-step cost of ``schedule()`` + ``update_from_output()``, with pytest-benchmark.

Benchmarks are disabled by default (``--benchmark-disable`` in pyproject), so a plain
``pytest`` runs each case once, as a test. ``pytest benches --benchmark-enable`` measures.
Every case of ``llmsched.bench.CASES`` runs on llmsched and, when ``vllm`` is importable
(``make vllm-env``, then run pytest from ``.venv-vllm``), on vLLM 0.33.0's own scheduler
with the same workload, so the two rows of a case compare in the same run.
"""

from __future__ import annotations

from typing import Any

import pytest

from llmsched.bench import CASES, LlmschedStepper, VllmStepper, vllm_available

IMPLEMENTATIONS = ["llmsched", "vllm"] if vllm_available() else ["llmsched"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case_name", list(CASES))
def test_step(benchmark: Any, case_name: str, implementation: str) -> None:
    """One steady-state step of the case; the scheduler keeps its requests running."""
    case = CASES[case_name]
    stepper = LlmschedStepper(case) if implementation == "llmsched" else VllmStepper(case)
    for _ in range(20):  # reach the steady state: prompts prefilled, queues settled
        stepper.step()
    benchmark.group = case_name
    benchmark.extra_info["implementation"] = implementation

    def step() -> int:
        return stepper.step()[2]

    scheduled = benchmark(step)
    assert (
        scheduled == min(case.running, case.max_num_seqs or case.running) or case.churn_max_tokens
    )
    if isinstance(stepper, LlmschedStepper):
        stepper.sched.check_invariants()
