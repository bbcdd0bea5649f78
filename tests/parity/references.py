"""The small vLLM 0.33.0 scheduler the plug-in's API tests start from (vLLM's venv only)."""

from __future__ import annotations

from typing import Any

from llmsched.bench import vllm_reference as ref

BLOCK = 4
"""The block size of :func:`reference`'s scheduler."""


def reference(**overrides: Any) -> Any:
    """vLLM's scheduler on a small config: 256 tokens, 8 sequences, 64-token steps, 200 blocks
    of ``BLOCK`` tokens, prefix caching on; ``overrides`` change any of them."""
    kwargs: dict[str, Any] = {
        "max_model_len": 256,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "block_size": BLOCK,
        "num_gpu_blocks": 200,
        "enable_prefix_caching": True,
    }
    kwargs.update(overrides)
    return ref.make_vllm_scheduler(**kwargs)
