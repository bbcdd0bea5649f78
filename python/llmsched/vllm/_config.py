"""What the plug-in takes from vLLM's config, and what it refuses.

The fields llmsched's ``SchedulerConfig`` shares with vLLM's config are mapped in one table,
:data:`SHARED_FIELDS`, which both directions read: :func:`llmsched_config` (vLLM ->
llmsched, for the plug-in) and :func:`vllm_fields` (llmsched -> vLLM, for the reference
scheduler ``llmsched.bench.vllm_reference`` builds). :func:`check_engine_config` and
:func:`check_request` name the features llmsched does not implement, so that an engine
asking for one fails at start (or a request asking for one fails alone) instead of being
scheduled wrongly. Every field of the vLLM config classes the plug-in reads is classified
in ``_fields``; a field the plug-in needs and this vLLM lacks is an
:class:`UnsupportedVersionError` naming it (:func:`read`), never a default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import vllm
from vllm.config import VllmConfig
from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

import llmsched

__all__ = [
    "SHARED_FIELDS",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "check_engine_config",
    "check_request",
    "kv_cache_groups",
    "llmsched_config",
    "read",
    "vllm_fields",
]

SHARED_FIELDS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("max_model_len", "model_config.max_model_len", int),
    ("max_num_seqs", "scheduler_config.max_num_seqs", int),
    ("max_num_batched_tokens", "scheduler_config.max_num_batched_tokens", int),
    ("max_num_scheduled_tokens", "scheduler_config.max_num_scheduled_tokens", lambda v: v),
    ("max_num_active_seqs", "scheduler_config.max_num_active_seqs", lambda v: v),
    ("enable_chunked_prefill", "scheduler_config.enable_chunked_prefill", bool),
    ("long_prefill_token_threshold", "scheduler_config.long_prefill_token_threshold", int),
    (
        "long_prefill_token_threshold_adaptive",
        "scheduler_config.long_prefill_token_threshold_adaptive",
        bool,
    ),
    ("async_scheduling", "scheduler_config.async_scheduling", bool),
    ("watermark", "scheduler_config.watermark", float),
    ("scheduler_reserve_full_isl", "scheduler_config.scheduler_reserve_full_isl", bool),
    ("policy", "scheduler_config.policy", str),
    ("enable_prefix_caching", "cache_config.enable_prefix_caching", bool),
    # vLLM applies it where the engine is not data-parallel-coordinated: a dense model's
    # ranks are independent engines (the ranks of an MoE model, stepping together, are
    # refused).
    ("prefill_schedule_interval", "scheduler_config.prefill_schedule_interval", int),
    # Steps in flight at once: one per stage (vLLM's batch queue).
    ("pipeline_parallel_size", "parallel_config.pipeline_parallel_size", int),
    ("disable_chunked_mm_input", "scheduler_config.disable_chunked_mm_input", bool),
)
"""``(llmsched field, where vLLM keeps it, how its value converts)`` for every field of
llmsched's ``SchedulerConfig`` that vLLM's ``VllmConfig`` holds as one field of the same
meaning. The others come from elsewhere (:func:`llmsched_config`): ``block_size`` is the
attention groups' (the one vLLM hands its scheduler, but with Mamba groups),
``num_gpu_blocks`` the KV pool vLLM sized (``kv_cache_config.num_blocks``),
``num_speculative_tokens``, ``num_lookahead_tokens``, ``max_num_new_slots_for_drafting``,
``num_hash_lookahead_tokens`` and ``eagle_block_drop`` vLLM's own derivations from the
speculative config, ``max_loras`` the LoRA config's (0 without one), and
``num_sampled_tokens_per_step`` 0 for a pooling model (it samples none: a request ends with
its prompt's pooled output) and a diffusion LLM (its canvas, ``num_speculative_tokens`` as
vLLM derives it, is denoised as drafts), 1 otherwise (vLLM's rule)."""


class UnsupportedFeatureError(llmsched.LlmschedError, ValueError):
    """A vLLM feature llmsched's scheduler does not implement (named in the message)."""


class UnsupportedVersionError(llmsched.LlmschedError, RuntimeError):
    """A vLLM version the plug-in was not tested with, or one that lacks a config field the
    plug-in reads (named in the message)."""


def read(config: Any, path: str) -> Any:
    """The value at ``path`` (dotted attribute names, e.g. ``"scheduler_config.watermark"``)
    of ``config``; ``UnsupportedVersionError`` naming the path when this vLLM has no such
    field (a field renamed in an upgrade), never a default."""
    value = config
    for name in path.split("."):
        try:
            value = getattr(value, name)
        except AttributeError:
            raise UnsupportedVersionError(
                f"llmsched.vllm reads vLLM's {path}, which this vLLM ({vllm.__version__}) "
                "does not have"
            ) from None
    return value


def vllm_fields(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """llmsched -> vLLM: ``values`` (llmsched ``SchedulerConfig`` fields of
    :data:`SHARED_FIELDS`) as vLLM config fields, by the ``VllmConfig`` section that holds
    each (``{"scheduler_config": {"max_num_seqs": 8, ...}, ...}``). A name the table does
    not map is a ``KeyError`` naming it."""
    where = {name: path for name, path, _ in SHARED_FIELDS}
    sections: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name not in where:
            raise KeyError(f"{name!r}: not a field llmsched shares with vLLM's config")
        section, field = where[name].split(".")
        sections.setdefault(section, {})[field] = value
    return sections


def _unsupported(feature: str, detail: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"llmsched.vllm does not support {feature} ({detail})")


def check_engine_config(
    vllm_config: Any, kv_cache_config: Any, block_size: int, hash_block_size: int | None
) -> None:
    """Raise ``UnsupportedFeatureError`` naming the first feature the engine asks for that
    llmsched does not implement (``UnsupportedVersionError`` naming a field it reads and
    this vLLM lacks)."""

    def get(path: str) -> Any:
        return read(vllm_config, path)

    def larger_than_one(path: str) -> tuple[bool, str]:
        value = get(path)
        return value > 1, f"{path.rpartition('.')[2]}={value}"

    model_name = get("model_config.model")
    refusals: list[tuple[str, Callable[[], tuple[bool, str]]]] = [
        (
            "encoder-decoder models",
            lambda: (get("model_config.is_encoder_decoder"), f"model {model_name!r}"),
        ),
        (
            "custom encoder cache managers",
            lambda: (
                get("ec_manager_config.encoder_cache_manager_cls") is not None,
                f"encoder_cache_manager_cls={get('ec_manager_config.encoder_cache_manager_cls')!r}",
            ),
        ),
        (
            "prefill context parallelism",
            lambda: larger_than_one("parallel_config.prefill_context_parallel_size"),
        ),
        (
            # vLLM 0.32's auxiliary-output connector neither caps prefix hits nor names the
            # blocks it retains: its scheduler asks other questions.
            f"routed-experts outputs on vLLM {vllm.__version__}",
            lambda: (
                get("aux_output_config.enabled")
                and not hasattr(AuxOutputSchedulerConnector, "max_cache_hit"),
                "enable_return_routed_experts=True; served with vLLM 0.33's connector",
            ),
        ),
        (
            "a hash block size other than the block size",
            lambda: (
                hash_block_size is not None and hash_block_size != block_size,
                f"hash_block_size={hash_block_size}, block_size={block_size}",
            ),
        ),
    ]
    for feature, check in refusals:
        refused, detail = check()
        if refused:
            raise _unsupported(feature, detail)
    kv_cache_groups(
        kv_cache_config,
        block_size,
        get("num_speculative_tokens"),
        get("cache_config.enable_prefix_caching"),
        get("parallel_config.decode_context_parallel_size"),
    )
    mamba_prefill_checkpoint_alignment(kv_cache_config)
    # vLLM zeroes new blocks for Mamba layers (llmsched's core names them) and for KV caches
    # of mixed precision (which it does not).
    if read(kv_cache_config, "needs_kv_cache_zeroing") and not read(
        kv_cache_config, "has_mamba_layers"
    ):
        raise _unsupported("KV caches of mixed precision", "needs_kv_cache_zeroing=True")


#: The KV-cache specs vLLM manages as full attention (its ``FullAttentionManager``): full
#: attention, and multi-head latent attention (DeepSeek-style MLA, one latent vector per
#: token: another page size, the same blocks).
FULL_ATTENTION_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")


def is_full_attention(spec: Any) -> bool:
    """Whether vLLM manages a KV-cache group of ``spec`` as full attention."""
    return type(spec).__name__ in FULL_ATTENTION_SPECS


def group_block_size(spec: Any, decode_context_parallel: int) -> int:
    """The tokens a block of a KV-cache group of ``spec`` holds, as vLLM's manager counts
    them: with decode context parallelism, a block's KV is sharded over the ranks, each
    holding ``spec.block_size`` of its tokens (a spec that is ``dcp_sharded``)."""
    shards = decode_context_parallel if read(spec, "dcp_sharded") else 1
    return int(spec.block_size) * shards


def kv_cache_groups(
    kv_cache_config: Any,
    block_size: int,
    num_speculative_tokens: int,
    prefix_caching: bool,
    decode_context_parallel: int,
) -> tuple[str, int]:
    """The engine's KV-cache groups as llmsched's ``kv_cache_groups`` field, and the block
    size of its attention groups: full-attention (latent attention, MLA, too),
    sliding-window and chunked local attention groups of one block size, the scheduler's
    (``block_size``), and Mamba groups.
    Without prefix caching (``mamba_cache_mode`` "none") vLLM sizes a Mamba group's blocks
    to ``max_model_len`` and hands the scheduler the least common multiple of every group's
    block size; a Mamba group holds a state block per request and one per draft token
    (``num_speculative_blocks``), as llmsched's does. With it ("align", as vLLM turns it
    on) a Mamba group's block size is the attention groups' and its state is cached at
    block boundaries, as llmsched's is (:func:`mamba_prefill_checkpoint_alignment`).
    With decode context parallelism (``decode_context_parallel`` ranks) a full-attention
    block holds that many times its spec's tokens (:func:`group_block_size`); vLLM's managers
    of the other kinds assert against it, and llmsched refuses it beside them.
    ``UnsupportedFeatureError`` names any other (cross attention, ...)."""
    kinds = []
    attention_block_sizes = set()
    groups = read(kv_cache_config, "kv_cache_groups")
    aligned_mamba_block_sizes = set()
    for g, group in enumerate(groups):
        spec = group.kv_cache_spec
        spec_name = type(spec).__name__
        if decode_context_parallel > 1 and not is_full_attention(spec):
            raise _unsupported(
                "decode context parallelism beside KV-cache groups other than full attention",
                f"group {g}: {spec_name}, decode_context_parallel_size={decode_context_parallel}",
            )
        if spec_name == "MambaSpec":
            mode = read(spec, "mamba_cache_mode")
            # llmsched's core aligns Mamba state exactly when prefix caching is on.
            if mode != ("align" if prefix_caching else "none"):
                raise _unsupported(
                    "a Mamba cache mode other than vLLM's for the prefix-caching setting",
                    f"group {g}: mamba_cache_mode={mode!r}, enable_prefix_caching={prefix_caching}",
                )
            if mode == "align":
                aligned_mamba_block_sizes.add(spec.block_size)
            draft_blocks = read(spec, "num_speculative_blocks")
            if draft_blocks != num_speculative_tokens:
                raise _unsupported(
                    "Mamba state blocks other than one per draft token",
                    f"group {g}: num_speculative_blocks={draft_blocks}, "
                    f"num_speculative_tokens={num_speculative_tokens}",
                )
            kinds.append("mamba")
            continue
        if not is_full_attention(spec) and spec_name not in (
            "SlidingWindowSpec",
            "ChunkedLocalAttentionSpec",
        ):
            raise _unsupported(
                "KV-cache groups other than full, sliding-window, chunked local attention and "
                "Mamba",
                f"group {g}: {spec_name}",
            )
        attention_block_sizes.add(group_block_size(spec, decode_context_parallel))
        if is_full_attention(spec):
            kinds.append("full")
        elif spec_name == "ChunkedLocalAttentionSpec":
            kinds.append(f"chunked_local:{read(spec, 'attention_chunk_size')}")
        elif read(spec, "extra_retained_tokens"):
            raise _unsupported(
                "sliding windows retaining extra tokens (multi-module MTP)",
                f"group {g}: extra_retained_tokens={spec.extra_retained_tokens}",
            )
        else:
            kinds.append(f"sliding_window:{read(spec, 'sliding_window')}")
    # Without Mamba groups the scheduler's block size is the attention groups'; with them,
    # a multiple of it.
    attention_block = min(attention_block_sizes, default=block_size)
    if (
        len(attention_block_sizes) > 1
        or aligned_mamba_block_sizes - {attention_block}
        or (block_size % attention_block if "mamba" in kinds else block_size != attention_block)
    ):
        raise _unsupported(
            "a scheduler block size other than a KV-cache group's",
            f"block_size={block_size}, attention groups' block sizes "
            f"{sorted(attention_block_sizes)}, aligned Mamba groups' "
            f"{sorted(aligned_mamba_block_sizes)}",
        )
    # The groups that hold a drafter's layers: EAGLE's block drop applies to their kinds.
    drafter = [bool(read(group, "is_eagle_group")) for group in groups]
    marks = ("+eagle" if marked else "" for marked in drafter)
    text = ",".join(kind + mark for kind, mark in zip(kinds, marks, strict=True))
    return text, attention_block


def mamba_prefill_checkpoint_alignment(kv_cache_config: Any) -> int:
    """llmsched's ``mamba_prefill_checkpoint_alignment``: the alignment of the prefill
    checkpoints the engine's Mamba groups write inside a step (``MambaSpec``'s
    ``num_prefill_checkpoint_blocks`` > 0 and ``prefill_checkpoint_alignment``), 0 if they
    write none; ``UnsupportedFeatureError`` for Mamba groups that differ (vLLM's scheduler
    reads the first group's alignment, its KV manager each group's own)."""
    alignments = set()
    for group in read(kv_cache_config, "kv_cache_groups"):
        spec = group.kv_cache_spec
        if type(spec).__name__ != "MambaSpec":
            continue
        alignment = read(spec, "prefill_checkpoint_alignment")
        exports = read(spec, "num_prefill_checkpoint_blocks") > 0 and alignment is not None
        alignments.add(alignment if exports else 0)
    if len(alignments) > 1:
        raise _unsupported(
            "Mamba groups of different prefill checkpoints",
            f"prefill checkpoint alignments {sorted(alignments)} (0: none)",
        )
    return alignments.pop() if alignments else 0


def llmsched_config(
    vllm_config: Any,
    kv_cache_config: Any,
    block_size: int,
    mm_registry: Any = None,
    kv_connector: Any = None,
    ec_connector: bool = False,
    log_stats: bool = True,
) -> llmsched.SchedulerConfig:
    """vLLM -> llmsched: llmsched's config for the engine vLLM configured: the same budgets
    and policy (:data:`SHARED_FIELDS`), the KV pool vLLM sized (``kv_cache_config.num_blocks``
    blocks, block 0 the null block), the same drafts, LoRA adapters and encoder budget
    (``mm_registry``: the engine's multimodal registry, vLLM's default if None), and the
    engine's KV connector's part (``kv_connector``: its scheduler side, None without),
    whether an encoder-cache connector serves it (``ec_connector``) and whether the engine
    takes stats (``log_stats``: the KV cache residency metrics are followed only then, as
    nothing else would take their events)."""
    shared = {name: convert(read(vllm_config, path)) for name, path, convert in SHARED_FIELDS}
    # vLLM runs each data-parallel rank of a dense model as an independent engine whose
    # config says data_parallel_size=1; an MoE model's ranks step in lockstep, and their
    # engine cores keep the prefill cadence on a counter shared across ranks (throttled
    # steps): the scheduler applies none of its own (vLLM's local_prefill_interval).
    if read(vllm_config, "parallel_config.data_parallel_size") > 1:
        shared["prefill_schedule_interval"] = 1
    spec = read(vllm_config, "speculative_config")
    hash_lookahead = num_hash_lookahead_tokens(vllm_config)
    groups, attention_block = kv_cache_groups(
        kv_cache_config,
        block_size,
        read(vllm_config, "num_speculative_tokens"),
        shared["enable_prefix_caching"],
        read(vllm_config, "parallel_config.decode_context_parallel_size"),
    )
    lora = read(vllm_config, "lora_config")
    events = read(vllm_config, "kv_events_config")
    retention = read(kv_cache_config, "prefix_cache_retention_interval")
    encoder_compute_budget, encoder_cache_size = encoder_budget(vllm_config, mm_registry)
    residency = read(vllm_config, "observability_config.kv_cache_metrics")
    residency_sample = read(vllm_config, "observability_config.kv_cache_metrics_sample")
    try:
        return llmsched.SchedulerConfig(
            **shared,
            block_size=attention_block,
            num_gpu_blocks=kv_cache_config.num_blocks,
            num_speculative_tokens=read(vllm_config, "num_speculative_tokens"),
            num_lookahead_tokens=read(vllm_config, "num_lookahead_tokens"),
            max_num_new_slots_for_drafting=(
                0 if spec is None else read(spec, "max_num_new_slots_for_drafting")
            ),
            num_hash_lookahead_tokens=hash_lookahead,
            # Dynamic speculative decoding (K follows the batch size): vLLM pads no decode.
            pad_spec_decode=not dynamic_sd_schedule(vllm_config),
            # vLLM's scheduler: lookahead hashes prove the boundary token, no drop then.
            eagle_block_drop=spec is not None
            and bool(read(spec, "use_eagle_block_drop")())
            and hash_lookahead == 0,
            # vLLM's rule: a pooling model samples nothing, nor does a diffusion LLM, whose
            # canvas is its num_speculative_tokens.
            num_sampled_tokens_per_step=0
            if read(vllm_config, "model_config.runner_type") == "pooling"
            or read(vllm_config, "model_config.is_diffusion")
            else 1,
            max_loras=0 if lora is None else read(lora, "max_loras"),
            enable_kv_cache_events=events is not None
            and bool(read(events, "enable_kv_cache_events")),
            kv_cache_metrics_sample=float(residency_sample) if residency and log_stats else 0.0,
            kv_cache_groups=groups,
            mm_encoder_only=bool(read(vllm_config, "is_mm_encoder_only")),
            # vLLM's None (a KV-cache config built without the cache config's value)
            # keeps every window block: an interval of one block.
            prefix_cache_retention_interval=block_size if retention is None else retention,
            # (Its checkpoints are read only when Mamba state is aligned: prefix caching.)
            mamba_prefill_checkpoint_alignment=mamba_prefill_checkpoint_alignment(kv_cache_config)
            if shared["enable_prefix_caching"]
            else 0,
            max_num_encoder_input_tokens=encoder_compute_budget,
            encoder_cache_size=encoder_cache_size,
            num_prefill_lookahead_tokens=read(vllm_config, "num_prefill_lookahead_tokens"),
            kv_connector=kv_connector is not None,
            ec_connector=ec_connector,
            # A connector that hands KV off (vLLM's requires_kv_delivery, a producer's by
            # default) has a request preempted for KV drop its output in flight.
            preemption_drops_in_flight_output=kv_connector is not None
            and bool(kv_connector.requires_kv_delivery),
            recompute_kv_load_failures=kv_connector is None
            or read(vllm_config, "kv_transfer_config.kv_load_failure_policy") == "recompute",
            # A consumer's load can land in a block a step in flight still writes.
            defer_block_free=kv_connector is not None
            and bool(read(vllm_config, "kv_transfer_config.is_kv_consumer"))
            and read(vllm_config, "max_concurrent_batches") > 1,
        )
    except llmsched.ConfigError as exc:
        raise llmsched.ConfigError(f"llmsched.vllm cannot schedule this engine: {exc}") from None


def dynamic_sd_schedule(vllm_config: Any) -> Any:
    """The engine's dynamic speculative decoding schedule (vLLM's
    ``num_speculative_tokens_per_batch_size``: the drafts a step asks for by its batch
    size), or None without one."""
    spec = read(vllm_config, "speculative_config")
    if spec is None:
        return None
    return read(spec, "num_speculative_tokens_per_batch_size") or None


def encoder_budget(vllm_config: Any, mm_registry: Any = None) -> tuple[int, int]:
    """The encoder compute budget and encoder cache size, in embeddings, as vLLM's scheduler
    derives them for the model (its ``MultiModalBudget``: each at least the largest input a
    prompt may hold); ``(0, 0)`` for a model without multimodal inputs."""
    if not read(vllm_config, "model_config.supports_multimodal_inputs"):
        return 0, 0
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    budget = MultiModalBudget(
        vllm_config, MULTIMODAL_REGISTRY if mm_registry is None else mm_registry
    )
    return int(budget.encoder_compute_budget), int(budget.encoder_cache_size)


def num_hash_lookahead_tokens(vllm_config: Any) -> int:
    """The tokens after a block that its prefix-cache hash covers: vLLM's
    ``num_hash_lookahead_tokens`` (0.33 on; an EAGLE drafter's, with prefix caching), 0 in
    a vLLM from before lookahead hashes (its ``Request`` hashes blocks alone)."""
    if not hasattr(VllmConfig, "num_hash_lookahead_tokens"):
        return 0
    return int(read(vllm_config, "num_hash_lookahead_tokens"))


def check_request(request: Any, kv_connector: bool = False) -> str | None:
    """Why llmsched cannot serve ``request`` (naming the feature), or None. Its KV transfer
    parameters are for a KV connector: served with one (``kv_connector``), which reads
    them."""
    params = request.sampling_params
    if request.resumable and request.prompt_embeds is not None:
        return "llmsched.vllm does not support prompt embeddings in streaming-input sessions"
    if request.resumable and request.use_structured_output:
        return "llmsched.vllm does not support structured output in streaming-input sessions"
    if request.resumable and kv_connector:
        return "llmsched.vllm does not support streaming-input sessions with a KV connector"
    if params is not None and params.repetition_detection is not None:
        return "llmsched.vllm does not support repetition detection"
    if request.kv_transfer_params and not kv_connector:
        return "llmsched.vllm does not support KV transfer parameters without a KV connector"
    return None
