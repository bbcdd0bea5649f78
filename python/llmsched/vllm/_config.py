"""What the plug-in takes from vLLM's config, and what it refuses.

One function per direction: :func:`llmsched_config` reads the fields llmsched's
``SchedulerConfig`` mirrors; :func:`check_engine_config` and :func:`check_request` name the
features llmsched does not implement, so that an engine asking for one fails at start (or a
request asking for one fails alone) instead of being scheduled wrongly.
"""

from __future__ import annotations

from typing import Any

import llmsched

__all__ = [
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "check_engine_config",
    "check_request",
    "llmsched_config",
]

# Speculative methods whose drafts the runner proposes without KV slots of their own: the
# only ones tested end to end.
_SPEC_METHODS = frozenset({"ngram"})


class UnsupportedFeatureError(llmsched.LlmschedError, ValueError):
    """A vLLM feature llmsched's scheduler does not implement (named in the message)."""


class UnsupportedVersionError(llmsched.LlmschedError, RuntimeError):
    """A vLLM version the plug-in was not tested with."""


def _unsupported(feature: str, detail: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"llmsched.vllm does not support {feature} ({detail})")


def check_engine_config(
    vllm_config: Any, kv_cache_config: Any, block_size: int, hash_block_size: int | None
) -> None:
    """Raise ``UnsupportedFeatureError`` naming the first feature the engine asks for that
    llmsched does not implement."""
    model = vllm_config.model_config
    checks: list[tuple[bool, str, str]] = [
        (vllm_config.lora_config is not None, "LoRA", "lora_config is set"),
        (model.is_multimodal_model, "multimodal inputs", f"model {model.model!r}"),
        (model.runner_type == "pooling", "pooling models", "runner_type='pooling'"),
        (
            bool(getattr(model, "enable_prompt_embeds", False)),
            "prompt embeddings",
            "enable_prompt_embeds=True",
        ),
        (model.is_encoder_decoder, "encoder-decoder models", f"model {model.model!r}"),
        (
            vllm_config.kv_transfer_config is not None,
            "KV connectors",
            "kv_transfer_config is set",
        ),
        (
            getattr(vllm_config, "ec_transfer_config", None) is not None,
            "encoder-cache connectors",
            "ec_transfer_config is set",
        ),
        (
            vllm_config.kv_events_config is not None
            and vllm_config.kv_events_config.enable_kv_cache_events,
            "KV events",
            "enable_kv_cache_events=True",
        ),
        (
            vllm_config.parallel_config.pipeline_parallel_size > 1,
            "pipeline parallelism",
            f"pipeline_parallel_size={vllm_config.parallel_config.pipeline_parallel_size}",
        ),
        # vLLM runs each data-parallel rank of a dense model as an independent engine whose
        # config says data_parallel_size=1 (those are served); only an MoE model's ranks,
        # which step in lockstep, show the scheduler more than one.
        (
            vllm_config.parallel_config.data_parallel_size > 1,
            "data parallelism of MoE models (ranks stepping in lockstep)",
            f"data_parallel_size={vllm_config.parallel_config.data_parallel_size}; "
            "a dense model's data-parallel ranks are independent engines and are supported",
        ),
        (
            vllm_config.parallel_config.decode_context_parallel_size > 1,
            "decode context parallelism",
            "decode_context_parallel_size="
            f"{vllm_config.parallel_config.decode_context_parallel_size}",
        ),
        (
            len(kv_cache_config.kv_cache_groups) != 1,
            "more than one KV-cache group (hybrid models)",
            f"{len(kv_cache_config.kv_cache_groups)} groups",
        ),
        (
            hash_block_size is not None and hash_block_size != block_size,
            "a hash block size other than the block size",
            f"hash_block_size={hash_block_size}, block_size={block_size}",
        ),
        (
            getattr(vllm_config.scheduler_config, "prefill_schedule_interval", 1) > 1,
            "prefill cadence",
            "prefill_schedule_interval="
            f"{getattr(vllm_config.scheduler_config, 'prefill_schedule_interval', 1)}",
        ),
    ]
    for failed, feature, detail in checks:
        if failed:
            raise _unsupported(feature, detail)
    spec_name = type(kv_cache_config.kv_cache_groups[0].kv_cache_spec).__name__
    if spec_name != "FullAttentionSpec":
        raise _unsupported("KV-cache layouts other than full attention", spec_name)
    group_block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    if group_block_size != block_size:
        raise _unsupported(
            "a scheduler block size other than the KV group's",
            f"block_size={block_size}, group block_size={group_block_size}",
        )
    spec = vllm_config.speculative_config
    if spec is not None:
        if spec.method not in _SPEC_METHODS:
            raise _unsupported(
                "this speculative decoding method",
                f"method={spec.method!r}; supported: {', '.join(sorted(_SPEC_METHODS))}",
            )
        if getattr(spec, "num_speculative_tokens_per_batch_size", None):
            raise _unsupported(
                "dynamic speculative decoding", "num_speculative_tokens_per_batch_size is set"
            )


def llmsched_config(
    vllm_config: Any, kv_cache_config: Any, block_size: int
) -> llmsched.SchedulerConfig:
    """llmsched's config for the engine vLLM configured: the same budgets, the KV pool vLLM
    sized (``kv_cache_config.num_blocks`` blocks, block 0 the null block), the same policy."""
    sched = vllm_config.scheduler_config
    spec = vllm_config.speculative_config
    try:
        return llmsched.SchedulerConfig(
            max_model_len=vllm_config.model_config.max_model_len,
            max_num_seqs=sched.max_num_seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            max_num_scheduled_tokens=getattr(sched, "max_num_scheduled_tokens", None),
            max_num_active_seqs=getattr(sched, "max_num_active_seqs", None),
            block_size=block_size,
            num_gpu_blocks=kv_cache_config.num_blocks,
            enable_chunked_prefill=sched.enable_chunked_prefill,
            long_prefill_token_threshold=sched.long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=getattr(
                sched, "long_prefill_token_threshold_adaptive", False
            ),
            num_speculative_tokens=vllm_config.num_speculative_tokens,
            num_lookahead_tokens=vllm_config.num_lookahead_tokens,
            max_num_new_slots_for_drafting=(
                spec.max_num_new_slots_for_drafting if spec is not None else 0
            ),
            num_sampled_tokens_per_step=1,
            async_scheduling=bool(sched.async_scheduling),
            watermark=getattr(sched, "watermark", 0.0),
            scheduler_reserve_full_isl=getattr(sched, "scheduler_reserve_full_isl", True),
            enable_prefix_caching=bool(vllm_config.cache_config.enable_prefix_caching),
            policy=str(sched.policy),
        )
    except llmsched.ConfigError as exc:
        raise llmsched.ConfigError(f"llmsched.vllm cannot schedule this engine: {exc}") from None


def check_request(request: Any, prefix_caching: bool) -> str | None:
    """Why llmsched cannot serve ``request`` (naming the feature), or None."""
    params = request.sampling_params
    if request.pooling_params is not None or params is None:
        return "llmsched.vllm does not support pooling requests"
    if request.lora_request is not None:
        return "llmsched.vllm does not support LoRA (the request names an adapter)"
    if request.mm_features:
        return "llmsched.vllm does not support multimodal inputs"
    if request.prompt_embeds is not None or request.prompt_token_ids is None:
        return "llmsched.vllm does not support prompt embeddings"
    if request.use_structured_output:
        return "llmsched.vllm does not support structured output"
    if getattr(request, "resumable", False):
        return "llmsched.vllm does not support streaming-input (resumable) requests"
    if getattr(params, "repetition_detection", None) is not None:
        return "llmsched.vllm does not support repetition detection"
    if getattr(request, "kv_transfer_params", None):
        return "llmsched.vllm does not support KV transfer parameters"
    if prefix_caching and getattr(request, "skip_reading_prefix_cache", False):
        return (
            "llmsched.vllm does not support prompt logprobs with prefix caching on "
            "(the request must skip reading the prefix cache)"
        )
    return None
