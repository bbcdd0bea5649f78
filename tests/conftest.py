"""Shared harness: vLLM's test defaults, and a scheduler that checks every step.

Every test that drives the loop goes through ``CheckedScheduler`` (or the
Engine with ``check_invariants=True``), so spec Appendix A is checked on
every ``schedule()`` and every ``update_from_output()``.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
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
from llmsched.sim.checks import check_scheduler_output


def _package_dir() -> Path:
    import llmsched
    import llmsched._core

    return Path(llmsched._core.__file__).resolve().parent


def pytest_report_header() -> str:
    import llmsched._core

    return f"llmsched: {Path(llmsched._core.__file__).resolve()}"


def pytest_configure() -> None:
    """With LLMSCHED_TEST_INSTALLED=1 (CI's run against the wheel), refuse to test the
    source tree's package instead of the installed one."""
    if os.environ.get("LLMSCHED_TEST_INSTALLED") == "1":
        source = (Path(__file__).resolve().parents[1] / "python").resolve()
        if _package_dir().is_relative_to(source):
            raise pytest.UsageError(
                f"LLMSCHED_TEST_INSTALLED=1 but llmsched is imported from {_package_dir()}"
            )


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

    def schedule(self, *, throttle_prefills: bool = False) -> SchedulerOutput:
        so = self.inner.schedule(throttle_prefills=throttle_prefills)
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


class PipelinedRunner:
    """An engine loop with a batch queue of ``depth`` steps (async scheduling, and pipeline
    parallelism when ``depth > 2``) and a stand-in runner.

    The runner knows each request only from what the scheduler outputs tell it: a new or
    resumed request arrives with its tokens and ``C``; a preempted or finished one is
    forgotten when the step that reports it executes. A request samples when a step reaches
    the end of the sequence as the runner sees it, ``1 + accept(clock, req_id, drafts)``
    tokens. Every sampled token is globally unique, and the position it was sampled for is
    remembered. Subclasses observe steps through ``on_scheduled`` and ``on_outputs``.
    """

    def __init__(
        self, sched: CheckedScheduler, depth: int, accept: Callable[[int, str, int], int]
    ) -> None:
        self.sched = sched
        self.depth = depth
        self.accept = accept
        self.queue: deque[SchedulerOutput] = deque()
        self.view: dict[str, list[int]] = {}  # req_id -> [sequence length, computed]
        self.sampled: dict[str, list[int]] = defaultdict(list)
        self.position_of: dict[int, int] = {}
        self.iteration = 0
        self.num_schedules = 0
        self.next_token = 1000

    def clock(self) -> int:
        """The first argument ``accept`` is given: the loop iteration."""
        return self.iteration

    def on_scheduled(self, so: SchedulerOutput) -> None:
        """Called after each ``schedule()``."""

    def on_outputs(self, outs: Sequence[RequestOutput]) -> None:
        """Called with what each ``update_from_output`` returned."""

    def schedule(self) -> None:
        so = self.sched.schedule()
        self.num_schedules += 1
        self.on_scheduled(so)
        self.queue.append(so)  # empty steps too: their preempted/finished ids matter

    def execute_oldest(self) -> None:
        so = self.queue.popleft()
        for req_id in (*so.preempted_req_ids, *so.finished_req_ids):
            self.view.pop(req_id, None)
        admitted = {*so.new_req_ids, *so.resumed_req_ids}
        rows: list[list[int]] = []
        for i, req_id in enumerate(so.req_ids):
            if req_id in admitted:
                self.view[req_id] = [int(so.num_all_token_ids[i]), int(so.num_computed_tokens[i])]
            view = self.view.get(req_id)
            if view is None:
                rows.append([])
                continue
            end = view[1] + int(so.num_scheduled_tokens[i])
            if end < view[0]:  # a non-final prefill chunk, by the runner's own count
                view[1] = end
                rows.append([])
                continue
            num_drafts = int(so.num_spec_tokens[i])
            accepted = min(self.accept(self.clock(), req_id, num_drafts), num_drafts)
            tokens = list(range(self.next_token, self.next_token + 1 + accepted))
            self.next_token += len(tokens)
            view[1] = end - (num_drafts - accepted)
            view[0] = view[1] + 1
            for j, token in enumerate(tokens):
                self.position_of[token] = view[0] - len(tokens) + j
            self.sampled[req_id].extend(tokens)
            rows.append(tokens)
        self.on_outputs(self.sched.update_from_output(so, runner_output(so, rows)))

    def run(self, before_step: Callable[[int], None], max_iterations: int) -> None:
        for i in range(max_iterations):
            self.iteration = i
            if not self.sched.has_requests() and not self.queue:
                return
            before_step(i)
            if self.sched.has_requests() and len(self.queue) < self.depth:
                self.schedule()
                if len(self.queue) < self.depth:
                    continue  # the batch queue has room: do not wait on an output yet
            if self.queue:
                self.execute_oldest()
        raise AssertionError("the engine loop did not converge")


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
