"""Which of vLLM 0.33.0's scheduler tests run against ``llmsched.vllm``, and why the others
do not.

``INCLUDED`` lists, per file, every test that drives the scheduler through vLLM's
``SchedulerInterface`` (and the ``SchedulerOutput`` / ``EngineCoreOutputs`` it returns), what
the plug-in shows of its state (the ``running`` and ``waiting`` queues, the fields of each
``Request`` that vLLM's scheduler maintains: status, computed and output tokens, drafts,
preemptions; the read-only view of its KV pool at ``scheduler.kv_cache_manager``) and
passes: ``run.py`` fails if one of them fails, or builds no llmsched scheduler.
``EXCLUDED`` maps every other test to the reason: the vLLM scheduler internal it reads or
patches (``scheduler.deferred_waiting``, ``scheduler._kv_fetch_counts``, ...), a
``Request`` field it writes to build a state by hand, the feature llmsched.vllm does not
serve (Mamba state cached at block boundaries beside a KV connector, prefill context
parallelism, KV-cache groups the plug-in does not build),
the deliberate deviation of ``docs/parity.md`` it trips, or that it never builds the
plug-in. The connector tests' leak check
(``assert_scheduler_empty``) is replaced by the plug-in's own (``conftest.py``).
A key is a test function name (every parametrization) or ``name[params]`` (one
parametrization; it wins over the name). A test of these files that is in neither list
fails the run, so that a new vLLM test is classified before it counts.

Each reason names the first thing that stops the test; "also" lists the other vLLM scheduler
internals it touches and "Request fields" the ``Request`` attributes it reads (``written``:
it sets them, which the plug-in refuses: the core keeps them).
"""

from __future__ import annotations

SCHEDULER_TESTS = "tests/v1/core/test_scheduler.py"
ASYNC_SCHEDULER_TESTS = "tests/v1/core/test_async_scheduler.py"
WORKER_SLOT_TESTS = "tests/v1/core/test_worker_slot_overflow.py"
PRIORITY_PREEMPTION_TESTS = "tests/v1/core/test_priority_preemption_bug.py"
DEFERRED_FREE_TESTS = "tests/v1/core/test_deferred_block_free.py"
SWA_INFLIGHT_TESTS = "tests/v1/core/test_swa_inflight_window_free.py"

# vLLM's KV-connector unit tests that drive a scheduler (tests/v1/kv_connector/unit/).
REMOTE_PREFILL_TESTS = "tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py"
REMOTE_DECODE_TESTS = "tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py"
LOAD_FAILURE_TESTS = "tests/v1/kv_connector/unit/test_kv_load_failure_recovery.py"
INVALID_BLOCKS_TESTS = "tests/v1/kv_connector/unit/test_invalid_blocks_correctness.py"
ERROR_PROPAGATION_TESTS = "tests/v1/kv_connector/unit/test_error_propagation.py"
CACHE_POLLUTION_TESTS = "tests/v1/kv_connector/unit/test_cache_pollution_prevention.py"
CONNECTOR_OVERRIDE_TESTS = "tests/v1/kv_connector/unit/test_scheduler_kv_connector_override.py"
CONNECTOR_LIFECYCLE_TESTS = "tests/v1/kv_connector/unit/test_kv_connector_lifecycle.py"
OFFLOADING_SCHEDULER_TESTS = "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"

# The reason shared by the test of that name in both files (their Request fields differ).
_FSM_ABORT_BY_HAND = (
    "builds the scheduler with object.__new__ (no __init__) and sets "
    "vLLM's internals by hand (requests, running, waiting, kv_cache_manager, "
    "structured_output_manager, ...); also scheduler._free_request, "
    "scheduler.aux_output_connector, scheduler.defer_block_free, "
    "scheduler.encoder_cache_mismatch_reqs; Request fields: num_computed_tokens (written),"
)


# The reasons shared by many of the KV-connector tests.
_NO_SCHEDULER = (
    "never builds a scheduler: it tests the connector's own scheduler-side classes "
    "(OffloadingConnectorScheduler and its manager, the KV-connector mixin) directly"
)
_MAMBA_ALIGN = (
    "refused feature: a KV connector that serves one KV-cache group (its MockKVConnector is "
    "not SupportsHMA) beside several; then Mamba state cached at block boundaries beside a "
    "KV connector (prefix caching with Mamba layers, mamba_cache_mode 'align')"
)
_HASH_BLOCK_SIZE = (
    "refused feature: a hash block size other than the block size (KV-cache groups of "
    "different block sizes)"
)
_PREFILL_LOOKAHEAD_ALONE = (
    "sets scheduler internal scheduler.num_prefill_lookahead after construction (a drafter's "
    "prefill lookahead on an engine without a drafter, which llmsched's config refuses: "
    "ConfigError); also replaces scheduler.encoder_cache_manager with vLLM's own"
)
_NO_ENCODER_BUDGET = (
    "sets scheduler internal scheduler.max_num_encoder_input_tokens = 0 after construction "
    "(an encoder budget that can hold no image, which llmsched's config refuses: "
    "ConfigError, a request with an image could never run; vLLM lets it wait)"
)
_DEFERRED_LOADS = (
    "sets scheduler.defer_async_loads (HiSparse's asynchronous loads held back while a step "
    "in flight may still read the reused blocks), which llmsched does not build"
)
_PREFIX_REPLAY = (
    "sets scheduler.prefix_replay_tokens: the bounded replay of a sliding-window prefix hit "
    "(DeepSeek V4's), which llmsched does not build"
)

#: The test files run, relative to the extracted sdist. Of tests/v1/core/'s other files
#: that build a scheduler: test_priority_scheduler_random.py builds a Qwen2.5-VL model
#: config whose processor is not written offline; test_prefix_replay.py is DeepSeek V4's
#: bounded sliding-window prefix replay (prefix_replay_tokens, SlidingWindowMLASpec), not
#: built. Of
#: tests/v1/kv_connector/unit/, the files whose tests drive a scheduler; the others test
#: connectors' own classes.
FILES: tuple[str, ...] = (
    SCHEDULER_TESTS,
    ASYNC_SCHEDULER_TESTS,
    WORKER_SLOT_TESTS,
    PRIORITY_PREEMPTION_TESTS,
    DEFERRED_FREE_TESTS,
    SWA_INFLIGHT_TESTS,
    REMOTE_PREFILL_TESTS,
    REMOTE_DECODE_TESTS,
    LOAD_FAILURE_TESTS,
    INVALID_BLOCKS_TESTS,
    ERROR_PROPAGATION_TESTS,
    CACHE_POLLUTION_TESTS,
    CONNECTOR_OVERRIDE_TESTS,
    CONNECTOR_LIFECYCLE_TESTS,
    OFFLOADING_SCHEDULER_TESTS,
)

#: Tests that use only the public interface; every one must pass.
INCLUDED_BY_FILE: dict[str, tuple[str, ...]] = {
    SCHEDULER_TESTS: (
        # Read the plug-in's view of its KV pool (kv_cache_manager), finished_req_ids and
        # the loads reported (finished_recving_kv_req_ids, failed_recving_kv_req_ids), the
        # requests set aside (deferred_waiting) and peek_request on the waiting queues.
        "test_async_load_reservation_prevents_wedge_e2e",
        "test_kv_cache_release_after_keep_pause_preserves_requests",
        "test_memory_leak",
        "test_spec_decode_padding_skipped_with_prefill_in_batch",
        "test_kv_connector_basic",
        "test_schedule_skip_tokenizer_init_structured_output_request",
        "test_throttle_prefills_excludes_fully_transferred_remote_kv",
        "test_throttle_prefills_defers_remote_kv_resume_with_local_prefill",
        "test_get_num_unfinished_requests",
        "test_pause_new_ignores_streaming_session_waiting_for_input",
        "test_scheduler_stats_route_to_existing_output_client",
        "test_schedule_prefills_gating",
        "test_long_prefill_threshold_ignored_when_alone",
        "test_long_prefill_threshold_applies_with_other_requests",
        "test_long_prefill_threshold_floored_by_fair_share",
        "test_schedule_concurrent_batches",
        # An encoder instance: a prompt longer than the budget is split over steps.
        "test_encoder_only_prompt_longer_than_budget_is_chunked",
        # A diffusion LLM: a canvas per request, drafts trimmed to it, a denoising step that
        # emits nothing, a read deferred while all its steps are in flight.
        "test_diffusion_scheduler_narrows_the_canvas_per_request",
        "test_diffusion_scheduler_trims_full_width_worker_drafts",
        "test_sync_diffusion_step_commits_only_emitted_tokens",
        "test_diffusion_scheduler_defers_a_read_with_every_step_in_flight",
        # The bound a decode cadence records (Request.next_decode_eligible_step, read from
        # the core): a pipeline's wait outlasts a read's deferral.
        "test_diffusion_read_deferral_keeps_a_longer_pp_wait",
        "test_schedule_order[True]",
        "test_spec_decoding_stats_empty_output",
        "test_spec_decode_padding_first_decode_step",
        "test_priority_scheduling_basic_ordering",
        "test_priority_scheduling_arrival_time_tiebreaker",
        "test_priority_scheduling_mixed_priority_and_arrival",
        "test_priority_scheduling_fcfs_fallback",
        "test_schedule_skip_tokenizer_init",
        "test_scheduler_no_ec_connector_by_default",
        # These two also read scheduler.requests[id].spec_decode_metrics and
        # scheduler.spec_decode_metrics_level, which llmsched.vllm keeps as vLLM's does.
        "test_per_request_spec_decode_detailed_records_per_step",
        "test_per_request_spec_decode_acceptance_disabled_by_default",
        # These read the running and waiting queues (the plug-in's views of the core's) and
        # the Request fields vLLM's scheduler maintains (the plug-in's read the core).
        "test_add_requests",
        # An auxiliary-output connector (routed experts), vLLM's or a mock, put in the
        # plug-in's aux_output_connector after construction; vLLM's reads the plug-in's view
        # of its KV pool.
        "test_routed_experts_prompt_start_at_prompt_end",
        "test_routed_experts_hashes_follow_scheduled_tokens",
        "test_prefix_hit_is_capped_at_retained_auxiliary_outputs",
        "test_evicted_blocks_release_their_auxiliary_outputs_past_capacity",
        "test_finish_request",
        "test_schedule",
        "test_schedule_concurrent_partial_requests",
        "test_preempt_during_execution",
        "test_schedule_spec_decoding_stats",
        "test_no_spec_tokens_scheduled_for_prefill_chunks",
        "test_priority_scheduling_preemption",
        "test_priority_scheduling_no_preemption_when_space_available",
        "test_priority_scheduling_preemption_victim_selection",
        "test_priority_scheduling_equal_priority_preemption",
        "test_priority_scheduling_waiting_queue_order",
        "test_priority_scheduling_with_limited_slots",
        "test_priority_scheduling_heap_property",
        # KV connectors with synchronous loads (a mock connector's external hits).
        "test_spec_decode_padding_resumed_request_without_running_requests",
        "test_kv_connector_honors_skip_reading_prefix_cache",
        "test_external_prefix_cache_metrics",
        "test_has_sync_kv_loads",
        # KV connectors with asynchronous loads (WAITING_FOR_REMOTE_KVS).
        "test_pause_new_drains_async_kv_loads",
        # The prefill cadence and throttled steps.
        "test_local_prefill_interval_never_idles_the_model",
        "test_local_prefill_interval_defers_inflight_prefill_chunk",
        "test_throttle_defers_inflight_prefill_chunk",
        # Structured output: a grammar that fails to compile fails only its request; drafts
        # the grammar invalidates are not counted as proposed; async drafts validated into
        # the step's output.
        "test_grammar_compile_error_finishes_only_request",
        "test_per_request_spec_decode_subtracts_invalid_drafts",
        "test_update_draft_token_ids_in_output_strips_padding",
        # A pooling model: no sampled token, so a prompt may fill max_model_len.
        "test_pooling_chunked_prefill_can_finish_at_max_model_len",
        # Drafters with a model: block drafters' budgets, drafts skipped when no request of
        # the step can use them (vLLM's can_skip_drafts, the plug-in's too).
        "test_block_drafters_cap_requests_instead_of_draft_slots",
        "test_skip_drafts_only_when_no_request_can_use_them",
        # The prefill cadence the scheduler applies itself (vLLM's local_prefill_interval):
        # none by default, none on a data-parallel rank of an MoE model.
        "test_local_prefill_interval_defaults_to_no_gating",
        "test_local_prefill_interval_left_to_engine_under_dp",
        # Pipeline stages: a request rescheduled with its outputs in flight (the V2
        # runner's decode stagger), and one awaiting its output keeps its LoRA slot.
        "test_async_scheduling_pp_allows_rescheduling_with_output_placeholders",
        "test_max_loras_counts_running_request_awaiting_output",
        # vLLM's scheduler attributes the plug-in shows from the core: its budgets
        # (max_num_running_reqs, max_num_scheduled_tokens), the prefill cadence's counters
        # (current_step, num_executed_steps, last_prefill_step, prefill_capacity_bound), and
        # reset_connector_cache without a connector.
        "test_max_num_active_seqs_caps_admission",
        "test_draft_slots_budgeted_per_scheduled_request",
        "test_local_prefill_interval_holds_prefill_between_bursts",
        "test_empty_schedule_does_not_advance_the_prefill_cadence",
        "test_prefill_cadence_counts_executed_steps_not_schedule_calls",
        "test_throttle_capacity_bound_guard_admits",
        "test_reset_connector_cache_no_connector_is_no_op_success",
        # Multimodal inputs (a llava-1.5 config written by run.py): the encoder budget and
        # cache in the core, the V2 runner's encoder_input_updates.
        "test_schedule_multimodal_requests",
        "test_schedule_partial_requests",
        "test_no_mm_input_chunking[False]",
        "test_no_mm_input_chunking_for_same_step_duplicate",
        "test_eagle3_mm_encoder_cache_with_shift",
        "test_cpu_encoder_input_updates_wait_for_completed_prefill",
        "test_cpu_encoder_input_updates_resume_and_abort",
        "test_cpu_encoder_input_updates_preserve_shm_handles",
        # A runner's failed block without a KV connector, recomputed (vLLM's default): the
        # image before it encoded again, its pixels sent again.
        "test_cpu_encoder_input_updates_restore_after_kv_load_failure",
        # The prefix cache's stats accumulator (kv_cache_manager.prefix_cache_stats, live).
        "test_prefix_cache_query_not_inflated_by_connector_defer",
        "test_prefix_cache_stats_not_recorded_when_caching_disabled",
        # Probes of the prefix cache with a request never added
        # (kv_cache_manager.get_computed_blocks): blocks cached when a request finishes,
        # never the tokens of a step in flight.
        "test_finished_spec_request_caches_completed_blocks",
        "test_async_output_does_not_cache_inflight_tokens",
        # A runner output listing requests the step did not schedule (vLLM reads its rows
        # by request id, and so does the plug-in), with and without an encoder-cache
        # connector.
        "test_kv_connector_unable_to_allocate",
        "test_kv_connector_handles_preemption",
        "test_priority_scheduling_preemption_and_resumption_when_out_of_kv",
        # Encoder-cache connectors (an ec_consumer, vLLM's ECExampleConnector, often with
        # its answers mocked): outputs loaded instead of encoded, requests whose outputs
        # are in transit passed over in both loops, the runner's report; the encoder
        # cache read through the plug-in's view (encoder_cache_manager.cached).
        "test_ec_connector_text_only_request",
        "test_ec_connector_cache_hit_external_load",
        "test_ec_connector_cache_miss_computes_locally",
        "test_ec_connector_with_partial_cache_hit_multi_round",
        "test_ec_connector_unable_to_allocate",
        "test_ec_connector_update_connector_output_called",
        "test_ec_connector_ensure_cache_available_defers_request",
        "test_ec_connector_defers_running_request_for_async_reload",
        "test_ec_connector_waits_for_embeddings_in_prefix_replay[0-False-False]",
        # The encoder cache's view (get_cached_input_ids, freeable) after a step that
        # encodes an image a later input of the same request shares; a request whose
        # identifier is reused within it for another count of embeddings, in
        # encoder_cache_mismatch_reqs until the next update fails it.
        "test_same_step_duplicate_encoder_input_stays_cached",
        "test_encoder_cache_rejects_mismatched_embed_count_within_request",
        # Requests added in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR without a grammar wait
        # (set aside, counted as skipped in the stats).
        "test_scheduler_stats_waiting_queues",
    ),
    ASYNC_SCHEDULER_TESTS: (
        "test_prefix_caching_for_prefill_dedup",
        # A connector's metadata is built on the requests before the step advances them.
        "test_connector_metadata_precedes_async_placeholder_advance",
        "test_stop_by_max_tokens",
        "test_resumable_request_handoff",
        "test_abort",
        "test_prefix_caching_for_multi_turn",
        # #53962's boundary: a request arriving with all but its last token computed, one
        # token from max_model_len, is scheduled unpadded (ngram_gpu drafts).
        "test_no_spec_decode_padding_up_to_max_model_len",
        # requires_kv_delivery and defer_block_free, which the plug-in shows from the core's
        # config; defer_block_free set on the built scheduler before its first request
        # (the core takes it as a new config then).
        "test_requires_kv_delivery_defaults_to_producer_role",
        "test_kv_pressure_preempt_mid_handoff",
    ),
    WORKER_SLOT_TESTS: (
        "test_streaming_pause_does_not_over_admit_worker_slot",
        "test_reset_prefix_cache_priority_does_not_over_admit_worker_slot",
        "test_reset_prefix_cache_same_step_resume_purges_then_re_adds",
    ),
    # A priority scheduler with a long-prefill threshold preempting a request it skipped.
    PRIORITY_PREEMPTION_TESTS: ("test_priority_scheduler_preempt_skipped_request",),
    # Freed blocks held back while a step in flight may still write them
    # (defer_block_free, set by the engine for a KV consumer with steps in flight, or by
    # hand): the plug-in's deferred_frees, sched_step_seq, processed_step_seq and
    # Request.last_sched_seq read the core's, and its view of the pool's free count.
    DEFERRED_FREE_TESTS: (
        "test_gate_enabled_for_async_consumer",
        "test_gate_disabled_without_connector",
        "test_finish_defers_free_until_inflight_step_done",
        "test_finish_frees_immediately_when_no_inflight_step",
        "test_abort_defers_free",
        "test_multiple_deferred_frees_drain_in_order",
        "test_fence_held_across_multiple_inflight_steps",
        "test_max_tokens_finish_frees_immediately_with_other_inflight",
        "test_non_async_abort_defers_via_last_sched_seq",
        "test_async_load_registers_immediately_without_deferral",
    ),
    # Blocks behind a sliding window or local chunk go back only once the step in flight
    # that reads them is applied (read through the plug-in's view of each group, its null
    # block one object as vLLM's).
    SWA_INFLIGHT_TESTS: (
        "test_num_in_flight_tokens_accounting",
        "test_swa_free_waits_for_in_flight_step",
        "test_swa_free_immediate_when_sync",
        "test_chunked_local_free_waits_for_in_flight_step",
    ),
    REMOTE_PREFILL_TESTS: (
        "test_full_block_prompt",
        "test_interleaved_lifecycle",
        "test_cannot_schedule_after_recv",
        "test_cannot_recv",
        "test_async_load_reserves_blocks_for_inflight",
        "test_async_loads_both_admitted_when_pool_fits",
        "test_async_load_reserves_blocks_for_promotion_margin[single-group]",
        # A KV connector over several KV-cache groups (a sliding window beside full
        # attention).
        "test_async_load_reserves_blocks_for_promotion_margin[multiple-groups]",
        "test_deferred_lookup_does_not_block_parked_load",
        # A KV connector beside a Mamba group: NIXL's prefill side cuts the prompt's last
        # token (the decoder computes it again) when it is told of the request.
        "test_p_side_chunked_prefill_mamba",
    ),
    REMOTE_DECODE_TESTS: (
        "test_basic_lifecycle",
        "test_abort_during_kv_transfer",
        "test_short_prompt_lifecycle",
        "test_prefix_cache_lifecycle",
    ),
    LOAD_FAILURE_TESTS: (
        "test_failed_receive_completion_honors_failure_policy",
        "test_async_load_failure",
        "test_async_progressive_load_failure",
        "test_sync_load_failure",
        "test_sync_load_failure_with_shared_blocks",
    ),
    INVALID_BLOCKS_TESTS: (
        "test_sync_recompute_blocks_not_freed_for_running_requests",
        "test_sync_fail_invalid_blocks_evicted",
    ),
    ERROR_PROPAGATION_TESTS: (
        "test_error_propagation_sync_load",
        "test_error_propagation_async_load",
    ),
    CACHE_POLLUTION_TESTS: (),
    CONNECTOR_OVERRIDE_TESTS: (),
    CONNECTOR_LIFECYCLE_TESTS: (),
    OFFLOADING_SCHEDULER_TESTS: (
        "test_cache_reset_holds_promotions_until_flushed_jobs_report",
        "test_cache_reset_fence_ignores_reports_of_other_jobs",
        "test_cache_reset_fence_held_too_long_warns_on_idle_steps",
        "test_cache_reset_without_in_flight_jobs_holds_nothing",
        "test_has_pending_push_work_does_not_open_the_step_region",
        "test_take_events_drains_the_manager_inside_the_region",
        "test_loads_do_not_populate_fence_index",
        "test_request_level_supply_covers_consumer_demand[False-cold]",
        "test_request_level_supply_covers_consumer_demand[False-gpu_warm]",
        "test_request_level_supply_covers_consumer_demand[False-primary_warm]",
        "TestEagle::test_full_attn_lookup_pops_one_block",
        "TestEagle::test_full_attn_lookup_single_block_returns_zero",
        "TestEagle::test_full_attn_lookup_no_hits_returns_zero",
        "TestEagle::test_sw_lookup_inflates_query_max",
        "TestEagle::test_sw_lookup_requires_extra_window_block",
        "TestEagle::test_sw_lookup_w_plus_one_hits_returns_w_blocks",
        "TestEagle::test_eagle_verified_prevents_double_pop",
        "TestEagle::test_non_eagle_tighten_clears_eagle_verified",
        # Requests whose KV could outgrow the test's pool of a few hundred tokens (smaller
        # than max_model_len, which vLLM's engine refuses at startup): llmsched stops one
        # at the longest request the pool holds (deviation 4), none gets that far here.
        "test_scheduler_reports_allocation_failure",
        "test_final_sampled_token_does_not_complete_an_offloaded_block",
        "test_abort_queued_request_does_not_build_store_job",
        "test_store_jobs_wait_for_missing_offload_key",
        "test_scheduler_reports_lookup_sync_delay",
        "test_on_schedule_end_is_the_last_manager_call_of_a_step",
        "test_step_releases_the_manager_before_the_model_runs",
        "test_scheduler_reports_lookup_async_delay_on_resolve",
        "test_max_offload_tokens_zero_does_not_record_pending_lookups",
        "test_abort_before_hit_uses_placeholder_then_later_hit_heals_removal",
        "test_promotion_hit_precedes_stored_event_translation",
        "test_offloading_connector",
        "test_small_hit_loads_synchronously",
        "test_on_request_finished_not_deferred_until_store_completion",
        "test_on_request_finished_fires_after_final_block_store",
        "test_concurrent_lookups_of_the_same_prefix",
        "test_abort_loading_requests",
        "test_two_groups_full_and_sliding_window",
        "test_sliding_window_chunk_with_null_block_is_not_stored",
        "test_swa_load_does_not_wait_for_unusable_pending_suffix",
        "test_request_level_policy_stores_all_blocks",
        "test_fence_at_update_state_after_alloc",
        "test_fence_at_build_store_jobs",
        "test_complete_store_called_per_job",
        "test_complete_store_waits_for_all_worker_acks",
        "test_max_offload_tokens_validation",
        "test_offload_prompt_only",
        "test_reset_cache",
        "test_prefix_cache_reset_preserves_same_step_offload_reload",
        "test_skip_reading_prefix_cache",
        "test_max_load_tokens_limits_external_load",
        "TestEagle::test_full_attn_store_excludes_trailing_decode_block",
        "TestEagle::test_sw_store_excludes_trailing_decode_block",
        "TestEagle::test_single_block_stored_at_end_of_prefill",
        "TestEagle::test_full_attn_store_then_load",
        # Drafts beside the connector: its request, which asks for more tokens than a load
        # beside a speculative step's blocks could take, is capped there, not refused.
        "TestSharedGroupMTPOffload::test_no_annotation_marks_no_groups",
        "test_request_finished_with_pending_stores_populates_fence",
        "test_multiple_in_flight_stores_all_flushed_by_fence",
        "test_request_finished_mixed_full_attn_and_sliding_window",
    ),
}

#: Tests not run, each with the internal or the feature it needs.
EXCLUDED_BY_FILE: dict[str, dict[str, str]] = {
    SCHEDULER_TESTS: {
        "test_make_scheduled_encoder_input_stats_output_embeddings": (
            "scheduler internal: scheduler._make_scheduled_encoder_input_stats"
        ),
        "test_scheduled_encoder_input_stats_disabled_without_iteration_logging": (
            "patches scheduler internal: scheduler._make_scheduled_encoder_input_stats (multimodal"
            " encoder stats)"
        ),
        "test_scheduled_encoder_input_stats_disabled_without_log_stats": (
            "scheduler internal: scheduler.observability_config"
        ),
        "test_pending_hisparse_spill_keeps_scheduler_alive": (
            "KV connector internals (HiSparse connector, object.__new__ scheduler with mocked "
            "connector)"
        ),
        "test_scheduler_publishes_lookahead_blocks_at_allocation": (
            "hashes its requests' blocks with a lookahead hasher (get_request_block_hasher(..., "
            "1)) on a scheduler configured without hash lookahead (no EAGLE drafter): vLLM's "
            "cache follows the request's hasher, llmsched's core hashes blocks itself, by its "
            "config's num_hash_lookahead_tokens (0 here)"
        ),
        "test_streaming_lookahead_hashes_follow_recomputed_kv": (
            "hybrid KV cache (Qwen3-Next model, mamba groups); kv_cache_manager and block-hash "
            "internals; also scheduler._preempt_request, scheduler.kv_cache_manager, "
            "scheduler.num_hash_lookahead_tokens, scheduler.running"
        ),
        "test_max_loras_counts_running_request_skipped_for_encoder_budget": (
            "sets scheduler internals after construction: scheduler.max_num_encoder_input_tokens "
            "(an encoder budget for a model without multimodal inputs) and "
            "scheduler.encoder_cache_manager (vLLM's own); the plug-in's encoder budget and "
            "cache are the core's (refused: ConfigError); Request fields: status"
        ),
        "test_cached_request_data_resumed_all_token_ids_mrv1_only": (
            "scheduler internal: scheduler.prev_step_scheduled_req_ids; also "
            "scheduler._make_cached_request_data; Request fields: all_token_ids, "
            "append_output_token_ids"
        ),
        "test_no_mm_input_chunking[True]": (
            "scheduler internal: scheduler.encoder_cache_manager (a warm encoder cache built by "
            "hand); also scheduler.running"
        ),
        "test_no_mm_input_chunking_at_item_boundary": (
            "scheduler internal: scheduler._try_schedule_encoder_inputs"
        ),
        "test_update_from_output_routes_sampling_masks_by_request": (
            "builds its running requests by hand (scheduler.requests, scheduler.running); "
            "Request fields: num_computed_tokens (written), status (written)"
        ),
        "test_update_from_output_routes_multi_position_sampling_masks": (
            "builds its running requests by hand (scheduler.requests, scheduler.running); "
            "Request fields: num_computed_tokens (written), status (written)"
        ),
        "test_stop_via_update_from_output": (
            "builds the requests' state by hand; Request fields: num_computed_tokens (written), "
            "status (written); also scheduler.finished_req_ids"
        ),
        "test_check_stop_min_tokens": (
            "tests vLLM's check_stop() helper on Request objects; no scheduler"
        ),
        "test_check_stop_length_cap_below_min_tokens": (
            "tests vLLM's check_stop() helper on Request objects; no scheduler"
        ),
        "test_schedule_order[False]": (
            "deliberate deviation 5 (docs/parity.md): chunked prefill off with "
            "max_num_batched_tokens=1024 < max_model_len=2048 is refused (ConfigError)"
        ),
        "test_pending_hisparse_reclamation_defers_preemption": (
            "patches scheduler internal kv_cache_manager.allocate_slots (the plug-in's view "
            "allocates nothing); also scheduler.running; Request fields: num_preemptions, status"
        ),
        "test_preemption_re_records_prefix_cache_query": (
            "calls scheduler internal scheduler._preempt_request (after taking the request out of "
            "scheduler.running by hand); Request fields: status"
        ),
        "test_preemption_processes_stale_aux_output": (
            "calls scheduler internal scheduler._preempt_request (after taking the request out of "
            "scheduler.running by hand)"
        ),
        "test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request": (
            "patches scheduler internal kv_cache_manager.allocate_slots (the plug-in's view "
            "allocates nothing)"
        ),
        "test_scheduler_reset_prefix_cache": (
            "Request fields: num_in_flight_tokens (written: a pause's completion emulated by "
            "hand); also scheduler.running, scheduler.waiting"
        ),
        "test_aux_output_reset_follows_kv_reset_result": (
            "patches scheduler internal kv_cache_manager.reset_prefix_cache (the plug-in's view "
            "resets nothing: the core's cache is reset)"
        ),
        "test_kv_cache_release_rejects_nonresident_memory": (
            "EngineCore sleep internals (object.__new__(EngineCore), mocked executor); the "
            "scheduler is never called"
        ),
        "test_spec_decode_padding_skipped_for_diffusion": (
            "sets scheduler internal scheduler.num_sampled_tokens_per_step = 0 on a scheduler "
            "built for a model that samples (the core's config keeps s); its runner also "
            "returns a token for a prefill of a model that samples none, which the plug-in "
            "refuses (OutputMismatchError)"
        ),
        "test_spec_decode_padding_dropped_when_recurrent_alignment_clips": (
            "scheduler internal: scheduler._mamba_block_aligned_split; also "
            "scheduler.need_mamba_block_aligned_split"
        ),
        "test_kv_connector_records_external_cache_hit_sources": (
            "patches scheduler internal scheduler.kv_cache_manager.allocate_slots; also "
            "scheduler.connector_prefix_cache_stats, scheduler.finished_recving_kv_req_ids, "
            "scheduler.kv_cache_manager, scheduler.kv_holding_waiting; Request fields: status"
        ),
        "test_abort_request_when_structured_output_fsm_cannot_advance": (
            _FSM_ABORT_BY_HAND + " num_tokens, status, status (written)"
        ),
        "test_chunked_prefill_disabled_for_encoder_decoder": (
            "encoder-decoder config only (SchedulerConfig); no scheduler"
        ),
        "test_mamba_align_encoder_cache_cap_makes_progress": (
            "multimodal inputs + mamba alignment internals "
            "(scheduler.need_mamba_block_aligned_split, encoder_cache_manager); also "
            "scheduler.encoder_cache_manager, scheduler.max_num_encoder_input_tokens"
        ),
        "test_mamba_align_eagle_schedules_encoder_at_boundary": (
            "multimodal inputs + mamba/EAGLE internals (scheduler.need_mamba_block_aligned_split, "
            "use_eagle, encoder_cache_manager); also scheduler.encoder_cache_manager, "
            "scheduler.max_num_encoder_input_tokens, scheduler.num_prefill_lookahead, "
            "scheduler.use_eagle"
        ),
        "test_ec_connector_schedule_multiple_requests": (
            "writes the encoder cache by hand (scheduler.encoder_cache_manager.allocate)"
        ),
        "test_priority_scheduling_ec_connector_preemption_and_resumption": (
            "its runner output gives a request two tokens in a step that scheduled one "
            "without drafts, which the plug-in refuses (OutputMismatchError); vLLM's runner "
            "never returns one"
        ),
        "test_ec_connector_allocate_encoder_tokens_with_external_load": (
            "replaces scheduler.encoder_cache_manager with vLLM's own (a smaller cache)"
        ),
        "test_prepend_skipped_requests_order": (
            "builds the requests' state by hand (Request.status written); also "
            "scheduler.kv_holding_waiting, scheduler.waiting; Request fields: status (written)"
        ),
        "test_remote_kv_promotion_drains_before_grammar_prefix": (
            "builds the requests' state by hand (Request.status WAITING_FOR_REMOTE_KVS set "
            "before add_request; scheduler.connector replaced by a Mock); also "
            "scheduler._update_waiting_for_remote_kv, scheduler.finished_recving_kv_req_ids, "
            "scheduler.kv_holding_waiting, scheduler.waiting; Request fields: status (written)"
        ),
        "test_fcfs_mixed_blocked_types_remote_load_drains_first": (
            "scheduler internal: scheduler._update_waiting_for_remote_kv (KV connectors); also "
            "scheduler.finished_recving_kv_req_ids, scheduler.kv_holding_waiting; Request "
            "fields: status (written)"
        ),
        "test_abort_request_waiting_for_remote_kvs": (
            "builds the requests' state by hand (Request.status written); also "
            "scheduler.finished_recving_kv_req_ids; Request fields: status, status (written)"
        ),
        "test_abort_request_finished_recving": (
            "builds the requests' state by hand (Request.status written); also "
            "scheduler.finished_recving_kv_req_ids; Request fields: status, status (written)"
        ),
        "test_delayed_kv_connector_free_keeps_scheduler_active": (
            "builds the scheduler's state by hand (scheduler.requests, scheduler.finished_req_ids "
            "written); also scheduler.finished_req_ids; Request fields: status (written)"
        ),
        "test_scheduler_kv_connector_stats": (
            "KV connector stats (hand-built SchedulerOutput with kv_connector_output; "
            "scheduler.connector)"
        ),
        "test_scheduler_ec_connector_stats": (
            "puts a mock in scheduler.ec_connector on a scheduler built without an "
            "encoder-cache connector (refused: the core was configured without one); "
            "hand-built SchedulerOutput"
        ),
        "test_variable_length_cross_attn_block_allocation": (
            "sets scheduler internals after construction to make an encoder-decoder "
            "scheduler by hand: scheduler.is_encoder_decoder, "
            "scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_manager; reads "
            "kv_cache_manager.coordinator; also a refused feature: cross-attention KV-cache "
            "groups (CrossAttentionSpec)"
        ),
        "test_cross_attn_blocks_not_over_allocated": (
            "sets scheduler internals after construction to make an encoder-decoder "
            "scheduler by hand: scheduler.is_encoder_decoder, "
            "scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_manager; reads "
            "kv_cache_manager.coordinator; also a refused feature: cross-attention KV-cache "
            "groups (CrossAttentionSpec)"
        ),
        "test_cross_attn_blocks_not_under_allocated": (
            "sets scheduler internals after construction to make an encoder-decoder "
            "scheduler by hand: scheduler.is_encoder_decoder, "
            "scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_manager; reads "
            "kv_cache_manager.coordinator; also a refused feature: cross-attention KV-cache "
            "groups (CrossAttentionSpec)"
        ),
        "test_cross_attn_zero_blocks_without_encoder_inputs": (
            "sets scheduler internals after construction to make an encoder-decoder "
            "scheduler by hand: scheduler.is_encoder_decoder, "
            "scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_manager; reads "
            "kv_cache_manager.coordinator; also a refused feature: cross-attention KV-cache "
            "groups (CrossAttentionSpec)"
        ),
        "test_free_encoder_inputs_respects_unconfirmed_placeholders": (
            "scheduler internal: scheduler._free_encoder_inputs, scheduler.encoder_cache_manager; "
            "Request fields: num_computed_tokens (written), num_output_placeholders (written)"
        ),
        "test_free_encoder_inputs_notifies_the_ec_connector": (
            "scheduler internal: scheduler._free_encoder_inputs; writes the encoder cache by "
            "hand (scheduler.encoder_cache_manager.allocate); Request fields: "
            "num_computed_tokens (written)"
        ),
        "test_unavailable_encoder_input_fails_the_request_as_retryable": (
            "puts a mock in scheduler.ec_connector on a scheduler built without an "
            "encoder-cache connector (refused: the core was configured without one)"
        ),
        "test_encoder_cache_accepts_matching_embed_count": (
            "scheduler internal: scheduler.encoder_cache_manager, "
            "scheduler.encoder_cache_mismatch_reqs"
        ),
        "test_encoder_cache_rejects_mismatched_embed_count": (
            "scheduler internal: scheduler.encoder_cache_manager; also "
            "scheduler.encoder_cache_mismatch_reqs; Request fields: status"
        ),
        "test_encoder_cache_embed_count_mismatch_restores_prior_hit_state": (
            "scheduler internal: scheduler.encoder_cache_manager, "
            "scheduler.encoder_cache_mismatch_reqs; Request fields: status"
        ),
        "test_drafter_lookahead_encoder_cache_cap_makes_progress": _PREFILL_LOOKAHEAD_ALONE,
        "test_drafter_lookahead_encoder_cache_cap_respects_token_budget": (
            _PREFILL_LOOKAHEAD_ALONE
        ),
        "test_free_encoder_inputs_unchanged_without_spec_decode": (
            "scheduler internal: scheduler._free_encoder_inputs, scheduler.encoder_cache_manager; "
            "Request fields: num_computed_tokens (written)"
        ),
        "test_waiting_encoder_stall_does_not_starve_later_requests": _NO_ENCODER_BUDGET,
        "test_waiting_encoder_stall_is_counted_as_deferred": _NO_ENCODER_BUDGET,
        "test_waiting_encoder_stall_kv_holder_keeps_drain_priority": _NO_ENCODER_BUDGET,
        "test_encoder_cache_retained_across_preemption_and_resume": (
            "scheduler internal: scheduler.encoder_cache_manager; Request fields: "
            "num_computed_tokens (written)"
        ),
        "test_encoder_cache_recomputed_when_evicted_during_preemption": (
            "scheduler internal: scheduler.encoder_cache_manager; Request fields: "
            "num_computed_tokens (written)"
        ),
        "test_ec_connector_waits_for_embeddings_in_prefix_replay": _PREFIX_REPLAY
        + "; the parametrization without replay runs",
        "test_ec_connector_pending_prefetch_only_checks_future_mm_features": (
            "EC connector + multimodal helper; no scheduler"
        ),
        "test_hybrid_per_group_hit_divergence_with_connector": (
            _MAMBA_ALIGN + "; also "
            "scheduler.kv_cache_manager; Request fields: num_computed_tokens (written), num_tokens"
        ),
        "test_hybrid_divergent_hit_fallback_is_capped_at_retained_auxiliary_outputs": (
            _MAMBA_ALIGN + "; also "
            "scheduler.aux_output_connector, scheduler.kv_cache_manager; Request fields: "
            "num_computed_tokens (written)"
        ),
        "test_hybrid_fa_deeper_hit_respects_connector_lookup_policy": (
            _MAMBA_ALIGN + "; also "
            "scheduler.kv_cache_manager; Request fields: num_computed_tokens (written), num_tokens"
        ),
        "test_encoder_instance_defers_stop_until_prompt_is_consumed": (
            "writes scheduler internals to give a text-only model an encoder cache: "
            "scheduler.encoder_cache_manager (cache_size, num_free_slots, num_freeable_slots), "
            "scheduler.max_num_encoder_input_tokens; Request fields: is_finished, num_output_tokens"
        ),
        "test_encoder_instance_finishes_request_once_prompt_is_consumed": (
            "writes scheduler internals to give a text-only model an encoder cache: "
            "scheduler.encoder_cache_manager (cache_size, num_free_slots, num_freeable_slots), "
            "scheduler.max_num_encoder_input_tokens; Request fields: num_output_tokens, status"
        ),
        "test_encoder_input_skipped_when_connector_already_has_the_item": (
            "writes scheduler internals to give a text-only model an encoder cache: "
            "scheduler.encoder_cache_manager (cache_size, num_free_slots, num_freeable_slots), "
            "scheduler.max_num_encoder_input_tokens; also patches scheduler.ec_connector"
        ),
        "test_update_draft_token_ids_strips_ngram_padding": (
            "sets Request.structured_output_request on a live request (written): the plug-in "
            "learns that a request uses structured output at add_request; reads "
            "Request.spec_token_ids"
        ),
        "test_diffusion_canvas_width_defaults_to_the_served_canvas": (
            "tests vLLM's diffusion_canvas_width() helper on stand-in requests; no scheduler"
        ),
        "test_diffusion_scheduler_is_selected_by_default": (
            "asserts that vLLM's SchedulerConfig.get_scheduler_cls() picks vLLM's diffusion "
            "classes (an engine picks the plug-in with --scheduler-cls instead)"
        ),
        "test_diffusion_scheduler_trims_full_width_worker_drafts[False-True]": (
            "sets Request.structured_output_request on a live request (written): the plug-in "
            "learns that a request uses structured output at add_request, so it does not "
            "validate this one's synchronous drafts"
        ),
        "test_drafts_unused_with_async_placeholders": (
            "scheduler internal: scheduler._drafts_unused; Request fields: "
            "append_output_token_ids, num_output_placeholders (written)"
        ),
    },
    DEFERRED_FREE_TESTS: {
        "test_preempt_defers_free_and_clears_bookkeeping": (
            "calls scheduler internal scheduler._preempt_request (after taking the request out "
            "of scheduler.running by hand); also kv_cache_manager.coordinator"
        ),
        "test_allocation_retry_waits_for_fence_then_succeeds": (
            "patches scheduler internal kv_cache_manager.allocate_slots (the plug-in's view "
            "allocates nothing)"
        ),
        "test_abort_mid_prefill_defers_free": (
            "its runner samples a token for a non-final prefill chunk (it samples for every "
            "scheduled request), which the plug-in refuses (OutputMismatchError); vLLM's GPU "
            "runner never returns one"
        ),
        "test_cow_retentions_deferred_until_copy_step_processed": (
            "scheduler internal: kv_cache_manager.coordinator (copy-on-write block "
            "retentions, which llmsched does not build)"
        ),
        "test_deferred_async_load_registers_after_inflight_step": _DEFERRED_LOADS,
        "test_deferred_async_load_records_hit_sources_when_started": _DEFERRED_LOADS,
        "test_abort_deferred_async_load_frees_after_inflight_step": _DEFERRED_LOADS,
    },
    SWA_INFLIGHT_TESTS: {
        "test_swa_admission_cap_accounts_for_overlapping_batches": (
            "never builds a scheduler: it tests vLLM's SlidingWindowSpec helper "
            "(max_admission_blocks_per_request)"
        ),
        "test_chunked_local_admission_cap_accounts_for_overlapping_batches": (
            "never builds a scheduler: it tests vLLM's ChunkedLocalAttentionSpec helper "
            "(max_admission_blocks_per_request)"
        ),
        "test_connector_finish_frees_on_settled_basis": (
            "calls scheduler internal scheduler._connector_finished"
        ),
    },
    ASYNC_SCHEDULER_TESTS: {
        "test_abort_request_when_structured_output_fsm_cannot_advance": (
            _FSM_ABORT_BY_HAND + " num_output_placeholders (written), num_tokens, status, status"
            " (written)"
        ),
        "test_kv_pressure_preemption_with_inflight_output": (
            "pipeline parallelism emulated through scheduler internals (sets scheduler.pp_size, "
            "scheduler.use_pp; wraps scheduler._preempt_request); Request fields: is_finished, "
            "num_computed_tokens, num_output_tokens, output_token_ids"
        ),
        "test_reset_prefix_cache_with_inflight_output_under_kv_pressure": (
            "pipeline parallelism emulated through scheduler internals (sets scheduler.pp_size, "
            "scheduler.use_pp; wraps scheduler._preempt_request); also scheduler.running; "
            "Request fields: is_finished, num_computed_tokens, num_output_tokens, output_token_ids"
        ),
    },
    REMOTE_PREFILL_TESTS: {
        "test_basic_lifecycle": "scheduler internal: scheduler._kv_fetch_counts",
        "test_no_spurious_prefix_caching": (
            "reads a private field of vLLM's KVCacheBlock (block_pool.blocks[i]._block_hash)"
        ),
        "test_kv_fetch_stages_cleared_on_abort": "scheduler internal: scheduler._kv_fetch_counts",
        "test_async_load_reserves_blocks_for_promotion_margin[different-block-sizes]": (
            _HASH_BLOCK_SIZE
        ),
        "test_async_load_does_not_double_reserve_mamba_spec_blocks[none-128-18]": (
            _HASH_BLOCK_SIZE
        ),
        "test_async_load_does_not_double_reserve_mamba_spec_blocks[align-16-18]": _MAMBA_ALIGN,
    },
    LOAD_FAILURE_TESTS: {
        "test_block_level_load_failure_fails_closed_with_multiple_groups": (
            "calls scheduler internal scheduler._handle_invalid_blocks (the plug-in, as "
            "vLLM, refuses a block-level load failure over several groups)"
        ),
    },
    INVALID_BLOCKS_TESTS: {
        "test_async_recompute_blocks_not_cached_when_invalid": (
            "patches scheduler internal scheduler.kv_cache_manager.evict_blocks (a spy)"
        ),
    },
    CACHE_POLLUTION_TESTS: {
        "test_invalid_blocks_evicted_prevents_cache_pollution": "writes vLLM's prefix cache by hand (scheduler.kv_cache_manager.cache_blocks)",  # noqa: E501 (a test's name)
    },
    CONNECTOR_OVERRIDE_TESTS: {
        "test_connector_receives_block_hashes": (
            "patches vLLM's Scheduler._build_kv_connector_meta (a method of vLLM's scheduler "
            "class, which the plug-in is not)"
        ),
        "test_connector_block_state_covers_steps_without_new_blocks": (
            "patches vLLM's Scheduler._build_kv_connector_meta (a method of vLLM's scheduler "
            "class, which the plug-in is not)"
        ),
        "test_connector_block_state_resolves_only_offered_requests": _NO_SCHEDULER,
    },
    CONNECTOR_LIFECYCLE_TESTS: {
        "test_kv_connector_mixin_clears_metadata": _NO_SCHEDULER,
    },
    OFFLOADING_SCHEDULER_TESTS: {
        "test_swa_offload_window_covers_unaligned_hit": _NO_SCHEDULER,
        "test_create_req_context_preserves_kv_hints": _NO_SCHEDULER,
        "test_partial_tail_store_uses_attention_and_recurrent_cow_sources": _NO_SCHEDULER,
        "test_aligned_boundary_store_uses_exact_source_with_partial_tail": _NO_SCHEDULER,
        "test_aligned_boundary_store_maps_sparse_group_id_to_dense_transfer_slot": _NO_SCHEDULER,
        "test_aligned_boundary_store_flushes_before_block_reuse": _NO_SCHEDULER,
        "test_normal_store_excludes_align_mode_mamba_sources": _NO_SCHEDULER,
        "test_partial_lookup_returns_exact_boundary_and_group_load_keys": _NO_SCHEDULER,
        "test_sync_partial_tail_load_targets_hashed_blocks": _NO_SCHEDULER,
        "test_sync_load_budget_is_shared_per_step": _NO_SCHEDULER,
        "test_lookup_cap_stops_at_authoritative_prefix_boundary": _NO_SCHEDULER,
        "test_max_load_tokens_zero_skips_partial_tail_lookup": _NO_SCHEDULER,
        "test_max_load_tokens_caps_tokens_beyond_gpu_prefix": _NO_SCHEDULER,
        "test_max_load_tokens_rounds_down_without_partial_tail": _NO_SCHEDULER,
        "test_invalid_max_load_tokens_is_ignored": _NO_SCHEDULER,
        "test_recurrent_group_unhashed_block_does_not_truncate_load_boundary": _NO_SCHEDULER,
        "test_external_cache_hit_sources_preserve_partial_tail_origin": _NO_SCHEDULER,
        "test_external_cache_hit_sources_reconcile_different_group_chunk_sizes": _HASH_BLOCK_SIZE,
        "test_external_cache_hit_sources_range_boundaries": _NO_SCHEDULER,
        "test_external_cache_hit_sources_recurrent_only_state": _NO_SCHEDULER,
        "test_external_cache_hit_sources_use_loaded_attention_ranges": _NO_SCHEDULER,
        "test_partial_lookup_requires_every_cache_group": _NO_SCHEDULER,
        "test_eagle_proof_margin_follows_core_hit_alignment": _NO_SCHEDULER,
        "test_eagle_partial_tail_store_keys_attention_at_proof": _NO_SCHEDULER,
        "test_eagle_partial_tail_store_needs_proof_in_prompt": _NO_SCHEDULER,
        "test_eagle_partial_lookup_loads_attention_proof": _NO_SCHEDULER,
        "test_eagle_partial_lookup_probes_popped_chunk_once": _NO_SCHEDULER,
        "test_eagle_partial_lookup_after_recurrent_group_tightens_hit": _NO_SCHEDULER,
        "test_eagle_partial_tail_round_trip_serves_mamba_checkpoint": _NO_SCHEDULER,
        "test_eagle_partial_tail_store_needs_offload_load": _NO_SCHEDULER,
        "test_streaming_session_stores_new_chunks": "refused feature: streaming-input sessions with a KV connector",  # noqa: E501 (a test's name)
        "test_request_preemption": (
            "writes vLLM's pool internals: block_pool.free_block_queue.num_free_blocks (the "
            "plug-in's view of the pool, read from the core, is read-only)"
        ),
        "test_two_groups_different_block_sizes": _HASH_BLOCK_SIZE,
        "test_scan_behavior_declared_for_every_lookup_result": _NO_SCHEDULER,
        "test_sliding_window_unaligned_initial_run": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_all_hit": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_records_absolute_chunk_indices": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_all_miss": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_partial_prefix": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_miss_then_hit": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_single_hit": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_empty": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_pending_result_records_only_allocated_primary": _NO_SCHEDULER,  # noqa: E501 (a test's name)
        "TestMaximalPrefixLookup::test_retry_defers": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_retry_after_hit_defers": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_hit_pending_defers": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_hit_pending_does_not_stop_scan": _NO_SCHEDULER,
        "TestMaximalPrefixLookup::test_retry_stops_at_miss": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_pending_chunk_behind_gap_does_not_defer": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_all_hit_exact_window": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_all_miss": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_window_at_end": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_window_in_middle": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_no_full_window_falls_back_to_prefix": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_single_block_window": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_gap_resets_consecutive": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_window_prefers_rightmost": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_prefix_fallback_with_gap": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_empty": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_retry_defers": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_retry_with_full_window_still_defers": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_hit_pending_counts_as_hit": _NO_SCHEDULER,
        "TestSlidingWindowLookup::test_hit_pending_does_not_break_streak": _NO_SCHEDULER,
        "test_sliding_window_demand_is_store_reachable": _NO_SCHEDULER,
        "test_reset_cache_finalizes_finished_request_with_pending_store": (
            "builds a request's state by hand; Request fields: status (written)"
        ),
        "test_pending_transfer_defers_prefix_lookup": _NO_SCHEDULER,
        "test_async_preempt_readmit_before_transfer_output_is_deferred": (
            "writes vLLM's pool internals: block_pool.free_block_queue.num_free_blocks (the "
            "plug-in's view of the pool, read from the core, is read-only)"
        ),
        "test_swa_alignment_skip": _HASH_BLOCK_SIZE,
        "test_request_level_supply_covers_consumer_demand[True-cold]": _HASH_BLOCK_SIZE,
        "test_request_level_supply_covers_consumer_demand[True-gpu_warm]": _HASH_BLOCK_SIZE,
        "test_request_level_supply_covers_consumer_demand[True-primary_warm]": _HASH_BLOCK_SIZE,
        "test_stale_sliding_window_block_after_prepare_store_failure": (
            "deliberate deviation 4 (docs/parity.md): its pool of 3 usable blocks of 4 holds "
            "a request of 13 tokens by llmsched's bound, which counts a sliding window's "
            "blocks as vLLM's admission gate does (the window plus a step's budget of 1,000 "
            "tokens): a longer request, once preempted, resumes with one chunk of all its "
            "tokens, which this pool cannot hold; its request stops there, length-capped, "
            "before the step the test stores from"
        ),
        "TestEagle::test_multichunk_store_no_interior_holes": (
            "the test's runner samples a token for a non-final prefill chunk (it samples for "
            "every running request), which the plug-in refuses (OutputMismatchError); vLLM's "
            "GPU runner never returns one"
        ),
        "TestEagle::test_chunked_prefill_uses_final_swa_store_horizon": _HASH_BLOCK_SIZE,
        "TestEagle::test_active_decode_does_not_advance_swa_final_horizon": _HASH_BLOCK_SIZE,
        "TestEagle::test_dcp_abort_reconsiders_final_swa_tail": _NO_SCHEDULER,
        "test_chunked_local_attention_reports_its_chunk_window": _NO_SCHEDULER,
        "test_reachable_block_mask_chunk_to_block_index_conversion": _NO_SCHEDULER,
        "test_retention_interval_sparsifies_swa_stores": _HASH_BLOCK_SIZE,
        "test_retention_interval_zero_stores_only_replay_boundary": _HASH_BLOCK_SIZE,
        "TestMambaHybridOffloadServing::test_shared_group_mtp_serves_like_non_speculative": _NO_SCHEDULER,  # noqa: E501 (a test's name)
        "TestMambaHybridOffloadServing::test_annotated_eagle_group_does_not_starve_coarse_sibling": _NO_SCHEDULER,  # noqa: E501 (a test's name)
    },
}


def _flatten(by_file: dict[str, dict[str, str]]) -> dict[str, str]:
    return {
        f"{path}::{name}": value for path, names in by_file.items() for name, value in names.items()
    }


#: ``file::name`` or ``file::name[params]`` (pytest node ids, relative to the sdist's root).
INCLUDED: frozenset[str] = frozenset(
    f"{path}::{name}" for path, names in INCLUDED_BY_FILE.items() for name in names
)
#: Node id (or id prefix without parameters) -> reason.
EXCLUDED: dict[str, str] = _flatten(EXCLUDED_BY_FILE)
