"""Shared harness: vLLM's test defaults, and a scheduler that checks every step.

Every test that drives the loop goes through ``CheckedScheduler`` (or the
Engine with ``check_invariants=True``), so spec Appendix A is checked on
every ``schedule()`` and every ``update_from_output()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from llmsched import (
    ModelRunnerOutput,
    RequestOutput,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from llmsched.testing import check_scheduler_output

settings.register_profile(
    "fast", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "slow", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))

EOS_TOKEN_ID = 50256

# vLLM's tests/v1/core/utils.py create_scheduler defaults, with M explicit.
VLLM_TEST_DEFAULTS: dict[str, Any] = {
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 8192,
    "num_gpu_blocks": 10000,
    "block_size": 16,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
    "async_scheduling": False,
}


def make_config(**overrides: Any) -> SchedulerConfig:
    return SchedulerConfig(**{**VLLM_TEST_DEFAULTS, **overrides})


class CheckedScheduler:
    """A ``Scheduler`` that checks the invariants after every schedule and update."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.inner = Scheduler(config)
        self.outputs: list[SchedulerOutput] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def schedule(self) -> SchedulerOutput:
        so = self.inner.schedule()
        check_scheduler_output(self.config, so)
        self.inner.check_invariants()
        self.outputs.append(so)
        return so

    def update_from_output(
        self, so: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[RequestOutput]:
        outs = self.inner.update_from_output(so, runner_output)
        self.inner.check_invariants()
        return outs


def make_scheduler(**overrides: Any) -> CheckedScheduler:
    return CheckedScheduler(make_config(**overrides))


def add_requests(
    sched: CheckedScheduler | Scheduler,
    num_requests: int,
    *,
    num_tokens: int = 10,
    max_tokens: int = 16,
    ignore_eos: bool = False,
    stop_token_ids: Sequence[int] = (),
    same_prompt: bool = False,
    req_ids: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[str]:
    """vLLM's ``create_requests``: prompt ``[i] * num_tokens``, ids ``"0".."n-1"``."""
    ids = list(req_ids) if req_ids is not None else [str(i) for i in range(num_requests)]
    for i, req_id in enumerate(ids):
        prompt = [0 if same_prompt else i] * num_tokens
        sched.add_request(
            req_id,
            prompt,
            max_tokens=max_tokens,
            eos_token_id=None if ignore_eos else EOS_TOKEN_ID,
            stop_token_ids=stop_token_ids,
            **kwargs,
        )
    return ids


def runner_output(so: SchedulerOutput, rows: Iterable[Sequence[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput.from_lists(so.req_ids, list(rows))


def one_token_each(so: SchedulerOutput, token: int = 0) -> ModelRunnerOutput:
    """Every scheduled request samples ``token`` (vLLM's ``[[tok]] * n`` helper)."""
    return runner_output(so, [[token]] * len(so.req_ids))


def scheduled(so: SchedulerOutput) -> dict[str, int]:
    """``{req_id: n}`` in schedule order, like vLLM's ``num_scheduled_tokens`` dict."""
    return dict(zip(so.req_ids, (int(n) for n in so.num_scheduled_tokens), strict=True))


def spec_tokens(so: SchedulerOutput) -> dict[str, list[int]]:
    """vLLM's ``scheduled_spec_decode_tokens``: only requests with draft slots."""
    out: dict[str, list[int]] = {}
    offsets = np.concatenate([[0], np.cumsum(so.num_spec_tokens)])
    for i, req_id in enumerate(so.req_ids):
        if so.num_spec_tokens[i]:
            out[req_id] = [int(t) for t in so.spec_token_ids[offsets[i] : offsets[i + 1]]]
    return out


@pytest.fixture
def sched_factory() -> Any:
    return make_scheduler
