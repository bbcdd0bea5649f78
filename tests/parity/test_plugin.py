"""``llmsched.vllm`` is vLLM's scheduler as far as vLLM can tell: field-equal objects.

Every parity case (``matrix``: sync and async, K in {0, 1, 3}, prefix caching, KV pressure
and preemption, priority, aborts in every state, the ``max_model_len`` boundary) is driven
through vLLM 0.33.0's scheduler and through the plug-in, with the same vLLM ``Request``s
and ``ModelRunnerOutput``s, and every field of every ``SchedulerOutput`` and
``EngineCoreOutputs``, the scheduling fields of the ``Request`` objects the step names and
the order of the ``running`` and ``waiting`` queues are compared at every step
(``plugin``), for each of vLLM's two model runners (``use_v2_model_runner``: the V2 runner,
vLLM 0.33's default where Triton is installed, gets resumed requests among the new ones,
every token re-sent). Runs where vLLM is importable (``make parity-test``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from benches.parity.fuzz import make_case
from benches.parity.harness import compare, describe, drive
from benches.parity.matrix import Case, case_by_id, case_params, cases
from benches.parity.plugin import FIELD_KEYS, PluginFieldSide, VllmFieldSide

pytest.importorskip("vllm", reason="vLLM 0.33.0 is installed in its own venv: make parity-test")


RUNNERS = {"v1-runner": False, "v2-runner": True}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("case", case_params(cases()))
def test_every_field_of_every_step_equal(case: Case, runner: str) -> None:
    requests = case.requests()
    config = dataclasses.replace(case.config, use_v2_model_runner=RUNNERS[runner])
    vllm_run = drive(VllmFieldSide, config, requests)
    plugin_run = drive(PluginFieldSide, config, requests)
    comparison = compare(vllm_run, plugin_run, FIELD_KEYS)
    assert comparison.steps_compared > 0
    assert comparison.identical, f"{case.id} {runner}\n" + describe(comparison)


def _first_step_with(run: Any, predicate: Any) -> int:
    return next(i for i, step in enumerate(run.steps) if predicate(step))


class _NoOutputTokenCounts(PluginFieldSide):
    """A plug-in that forgets the placeholders in ``num_output_tokens`` (what the V1 runner
    trims its output-token list to under async scheduling)."""

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        cached = out.scheduled_cached_reqs
        broken = [n - 1 if n else n for n in cached.num_output_tokens]
        summary["scheduler_output"]["scheduled_cached_reqs"]["num_output_tokens"] = broken
        return out, summary


class _NoRescheduledTokens(PluginFieldSide):
    """A plug-in that does not resend the tokens of requests the previous step skipped."""

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        summary["scheduler_output"]["scheduled_cached_reqs"]["all_token_ids"] = {}
        return out, summary


class _UnmirroredRequests(PluginFieldSide):
    """The plug-in as it was before its ``Request`` objects read the core: vLLM's objects as
    the engine made them, never brought up to date."""

    def add(self, req: Any) -> None:
        from vllm.v1.request import Request

        super().add(req)
        self.added[req.request_id].__class__ = Request


class _ReversedRunning(PluginFieldSide):
    """A plug-in whose ``running`` view lists the running requests backwards."""

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        summary["queues"]["running"].reverse()
        return out, summary


@pytest.mark.parametrize(
    ("side", "case_id", "key", "field"),
    [
        (
            _NoOutputTokenCounts,
            "synthetic-conv/async-K0-apc-fcfs",
            "scheduler_output",
            "num_output_tokens",
        ),
        (
            _NoRescheduledTokens,
            "synthetic-conv/sync-K3-apc-fcfs-kv",
            "scheduler_output",
            "all_token_ids",
        ),
        (_UnmirroredRequests, "synthetic-conv/sync-K0-apc-fcfs", "requests_scheduled", "status"),
        (_ReversedRunning, "synthetic-conv/sync-K0-apc-fcfs", "queues", "running"),
    ],
)
def test_a_wrong_field_is_caught(side: Any, case_id: str, key: str, field: str) -> None:
    """The comparison is not vacuous: one field a runner or a reader of the scheduler's
    state reads, got wrong, shows up."""
    case = case_by_id(case_id)
    requests = case.requests()
    comparison = compare(
        drive(VllmFieldSide, case.config, requests),
        drive(side, case.config, requests),
        FIELD_KEYS,
    )
    assert not comparison.identical
    assert field in str(comparison.detail.get(key))


def test_a_different_block_pool_is_caught() -> None:
    """Block ids are compared: a pool one block larger on the plug-in's side differs."""
    case = case_by_id("synthetic-chat/sync-K0-apc-fcfs-kv")
    requests = case.requests()
    bigger = dataclasses.replace(case.config, num_gpu_blocks=case.config.num_gpu_blocks + 1)
    comparison = compare(
        drive(VllmFieldSide, case.config, requests),
        drive(PluginFieldSide, bigger, requests),
        FIELD_KEYS,
    )
    assert not comparison.identical


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("seed", range(40))
def test_random_small_configs_field_equal(seed: int, runner: str) -> None:
    """Odd small configs and workloads (``fuzz.make_case``: block sizes down to 1, tiny
    pools and budgets, thresholds, chunked prefill off), every field of every step."""
    config, requests = make_case(seed)
    config = dataclasses.replace(config, use_v2_model_runner=RUNNERS[runner])
    comparison = compare(
        drive(VllmFieldSide, config, requests), drive(PluginFieldSide, config, requests), FIELD_KEYS
    )
    assert comparison.steps_compared > 0
    assert comparison.identical, f"seed {seed}\n" + describe(comparison)
