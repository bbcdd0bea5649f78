"""A diffusion LLM through the Python API: ``num_sampled_tokens_per_step=0`` with a canvas of
``num_speculative_tokens``, a request's own canvas and read steps (``add_request``'s
``diffusion_canvas_length`` and ``diffusion_read_steps``). The rules are the core's
(``rust/core/tests/diffusion.rs``); vLLM's own diffusion tests run against the plug-in
(``tests/vllm_upstream``)."""

from __future__ import annotations

import numpy as np
import pytest

import llmsched
from llmsched import ModelRunnerOutput, Scheduler, SchedulerConfig
from llmsched.sim import SimulatedModelRunner

K = 8


def diffusion(async_scheduling: bool) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            num_sampled_tokens_per_step=0,
            num_speculative_tokens=K,
            async_scheduling=async_scheduling,
            enable_prefix_caching=False,
        )
    )


def emitted(out: llmsched.SchedulerOutput, tokens: dict[str, list[int]]) -> ModelRunnerOutput:
    """The runner's output: each request's emitted positions (none by default)."""
    ids = list(out.req_ids)
    rows = [tokens.get(i, []) for i in ids]
    flat = np.array([t for row in rows for t in row], dtype=np.int32)
    return ModelRunnerOutput(ids, flat, np.array([len(r) for r in rows], dtype=np.int32))


def test_the_config_says_it_is_a_diffusion_model() -> None:
    assert diffusion(False).config.is_diffusion
    assert not SchedulerConfig(num_sampled_tokens_per_step=0).is_diffusion  # pooling
    assert not SchedulerConfig(num_speculative_tokens=K).is_diffusion


def test_a_narrow_canvas_takes_part_of_the_drafts_and_emits_its_tokens() -> None:
    sched = diffusion(False)
    sched.add_request("read", list(range(1, 9)), max_tokens=4, diffusion_canvas_length=4)
    prefill = sched.schedule()
    sched.update_from_output(prefill, emitted(prefill, {}))
    sched.update_draft_token_ids(["read"], [list(range(10, 18))])
    assert sched.get_request("read").spec_token_ids == [10, 11, 12, 13]
    step = sched.schedule()
    assert (step.num_scheduled_tokens.tolist(), step.num_spec_tokens.tolist()) == ([4], [4])
    (out,) = sched.update_from_output(step, emitted(step, {"read": [5, 6, 7, 8]}))
    capped = llmsched.RequestStatus.FINISHED_LENGTH_CAPPED
    assert (out.new_token_ids, out.status) == ([5, 6, 7, 8], capped)


def test_an_async_read_waits_while_its_steps_are_in_flight() -> None:
    sched = diffusion(True)
    sched.add_request("read", list(range(1, 9)), max_tokens=64, diffusion_read_steps=1)
    sched.add_request("gen", list(range(1, 9)), max_tokens=64)
    sched.schedule()  # the prefills
    assert list(sched.schedule().req_ids) == ["read", "gen"]
    assert list(sched.schedule().req_ids) == ["gen"]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"diffusion_canvas_length": K + 1}, rf"diffusion_canvas_length={K + 1}.*\[1, {K}\]"),
        ({"diffusion_canvas_length": 0}, "diffusion_canvas_length=0"),
        ({"diffusion_canvas_length": "4"}, "diffusion_canvas_length"),
        ({"diffusion_read_steps": 0}, "diffusion_read_steps=0"),
        ({"diffusion_read_steps": 1.5}, "diffusion_read_steps"),
    ],
)
def test_bad_diffusion_fields_are_refused_and_change_nothing(
    kwargs: dict[str, object], pattern: str
) -> None:
    sched = diffusion(False)
    with pytest.raises(llmsched.InvalidRequestError, match=pattern):
        sched.add_request("x", [1, 2, 3], max_tokens=4, **kwargs)  # type: ignore[arg-type]
    assert not sched.has_requests()


def test_the_diffusion_fields_belong_to_a_diffusion_model() -> None:
    sched = Scheduler(SchedulerConfig(num_speculative_tokens=K))
    for field in ("diffusion_canvas_length", "diffusion_read_steps"):
        with pytest.raises(llmsched.InvalidRequestError, match=f"{field}=1: only a diffusion"):
            sched.add_request("x", [1, 2, 3], max_tokens=4, **{field: 1})  # type: ignore[arg-type]
    assert not sched.has_requests()


def test_the_simulated_runner_does_not_run_a_diffusion_llm() -> None:
    with pytest.raises(ValueError, match="diffusion LLM"):
        SimulatedModelRunner(diffusion(False).config)
