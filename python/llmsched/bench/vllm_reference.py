"""vLLM 0.33.0's own v1 scheduler, built offline, as the reference for benchmarks and parity.

Only usable inside the separate vLLM venv (``make vllm-env``; ``benches/vllm-env.sh
reference`` prints its path), which holds
``vllm==0.33.0`` and the few packages its scheduler path imports. Elsewhere
:func:`vllm_available` returns False and the other functions raise ``ImportError``.

The API::

    vllm_available() -> bool
    make_vllm_scheduler(*, block_size, num_gpu_blocks, num_speculative_tokens=0,
                        use_v2_model_runner=False, **shared_fields)
        -> vllm Scheduler | AsyncScheduler
    make_vllm_request(request_id, prompt_token_ids, *, max_tokens, block_size, ...) -> Request
    scheduler_from(reference, cls=None, **kwargs) -> the plug-in (or ``cls``) on its configs
    vllm_runner_output(scheduler_output, sampled) -> vllm ModelRunnerOutput
    step_summary(scheduler_output) -> dict

How the scheduler is built (mirrors how vLLM's own unit tests build one, without the network):

- The model is a tiny OPT-like ``config.json`` written to a private temporary directory
  (no weights, no tokenizer: ``skip_tokenizer_init=True``). The HF hub is never contacted:
  ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` are set before vLLM is imported.
- ``max_model_len`` is given to both ``ModelConfig`` and vLLM's ``SchedulerConfig`` (the
  scheduler reads the former).
- No GPU is needed: vLLM sees no platform here (``UnspecifiedPlatform``), so the device is
  set explicitly (``DeviceConfig(device="cpu")``); the scheduler never touches a device.
- The KV cache is one ``FullAttentionSpec`` group with ``num_blocks = num_gpu_blocks``.
  The scheduler is built with ``log_stats=True``, as in vLLM's tests and default serving.
- Speculative decoding is vLLM's ``ngram`` method with ``num_speculative_tokens = K``: no
  lookahead (draft) slots, drafts are supplied by the caller through
  ``scheduler.update_draft_token_ids``.
- Prefix caching hashes blocks with vLLM's pickle+SHA-256 ``sha256`` and the fixed
  default NONE_HASH seed (``PYTHONHASHSEED``, if set, replaces that seed), so block hashes
  are the same in every process.
- ``use_v2_model_runner`` (vLLM 0.33.0's default when Triton is installed) only changes how
  vLLM *reports* resumed requests: with the V2 runner they are listed among the new
  requests, with the V1 runner in ``scheduled_cached_reqs.resumed_req_ids``. It changes
  no scheduling decision here (pipeline parallel size 1, no lookahead slots). The default
  is the V1 runner so that :func:`step_summary` can tell resumed requests from new ones.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "EOS_TOKEN_ID",
    "make_vllm_request",
    "make_vllm_scheduler",
    "scheduler_from",
    "step_summary",
    "vllm_available",
    "vllm_runner_output",
]

#: The end-of-sequence id written into the tiny model's config (OPT's ``</s>``). Requests
#: only stop on it when ``make_vllm_request(..., eos_token_id=EOS_TOKEN_ID)`` says so.
EOS_TOKEN_ID = 2

# Keep vLLM and transformers off the network and quiet. setdefault: a caller's explicit
# environment wins. Must happen before the first ``import vllm``.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(_key, _value)

# A large position limit so that any max_model_len a benchmark asks for is accepted.
_MAX_POSITION_EMBEDDINGS = 1 << 20

# A tiny decoder-only OPT: the scheduler never sees weights, only the architecture name,
# the dtype and the position limit.
_TINY_OPT_CONFIG: dict[str, Any] = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "vocab_size": 50272,
    "hidden_size": 64,
    "word_embed_proj_dim": 64,
    "ffn_dim": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": _MAX_POSITION_EMBEDDINGS,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "bos_token_id": EOS_TOKEN_ID,
    "eos_token_id": EOS_TOKEN_ID,
    "pad_token_id": 1,
    "torch_dtype": "float16",
}

#: The special tokens of a llava-1.5 model with their ids: its processor expands
#: ``<image>`` (``image_token_index``) into an image's placeholder tokens.
LLAVA_SPECIAL_TOKENS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001}

#: A tiny llava-1.5's language model (the scheduler reads the position limit only).
_TINY_LLAVA_TEXT_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": _MAX_POSITION_EMBEDDINGS,
    "num_attention_heads": 4,
    "num_hidden_layers": 1,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-05,
    "vocab_size": 32064,
    "torch_dtype": "float16",
}


def write_llava_model(
    path: str | os.PathLike[str],
    *,
    image_size: int,
    patch_size: int,
    text_config: Mapping[str, Any],
) -> None:
    """Writes a llava-1.5-shaped model directory at ``path`` as far as vLLM reads it to size
    a scheduler's encoder budget (no weights): ``config.json`` (a CLIP vision tower of
    ``image_size`` pixels in patches of ``patch_size``: an image is ``(image_size //
    patch_size) ** 2`` placeholder tokens, the largest input vLLM's ``MultiModalBudget``
    sizes the budget for), the CLIP image-processor config its processor loads, and a
    stand-in ``tokenizer.json`` of the special tokens only (prompts are token ids)."""
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_token_index": LLAVA_SPECIAL_TOKENS["<image>"],
        "pad_token_id": LLAVA_SPECIAL_TOKENS["<pad>"],
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "text_config": dict(text_config),
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 64,
            "image_size": image_size,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "patch_size": patch_size,
            "projection_dim": 64,
        },
    }
    from llmsched.bench.vllm_engine import llava_image_processor_config

    processor = llava_image_processor_config(image_size)
    special = [
        {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for content, token_id in LLAVA_SPECIAL_TOKENS.items()
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": LLAVA_SPECIAL_TOKENS, "unk_token": "<unk>"},
    }
    os.makedirs(path, exist_ok=True)
    for name, content in (
        ("config.json", config),
        ("preprocessor_config.json", processor),
        ("tokenizer.json", tokenizer),
    ):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=1)


_model_dir: str | None = None
_llava_dirs: dict[int, str] = {}
_none_hash_ready = False


def vllm_available() -> bool:
    """True if vLLM's v1 scheduler and the pieces this module uses import. Never raises."""
    try:
        import vllm.config
        import vllm.v1.core.sched.async_scheduler
        import vllm.v1.core.sched.scheduler
        import vllm.v1.outputs
        import vllm.v1.request  # noqa: F401
    except Exception:
        return False
    return True


def _tiny_model_dir() -> str:
    """A private directory holding the tiny model's ``config.json``; removed at exit."""
    global _model_dir
    if _model_dir is None or not os.path.isfile(os.path.join(_model_dir, "config.json")):
        path = tempfile.mkdtemp(prefix="llmsched-vllm-tiny-opt-")
        with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
            json.dump(_TINY_OPT_CONFIG, f, indent=2)
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _model_dir = path
    return _model_dir


def _tiny_llava_dir(image_side: int) -> str:
    """A private directory holding a tiny llava-1.5 whose images are ``image_side ** 2``
    placeholder tokens; removed at exit."""
    path = _llava_dirs.get(image_side)
    if path is None or not os.path.isfile(os.path.join(path, "config.json")):
        path = tempfile.mkdtemp(prefix="llmsched-vllm-tiny-llava-")
        patch = 14
        write_llava_model(
            path,
            image_size=patch * image_side,
            patch_size=patch,
            text_config=_TINY_LLAVA_TEXT_CONFIG,
        )
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _llava_dirs[image_side] = path
    return path


def _ensure_none_hash() -> None:
    """Seed vLLM's prefix-cache hash chain once per process (SHA-256, fixed seed)."""
    global _none_hash_ready
    if not _none_hash_ready:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash

        init_none_hash(sha256)
        _none_hash_ready = True


# The shared fields' values where a caller gives none: vLLM's defaults differ for these
# (async scheduling and prefix caching on).
_SHARED_DEFAULTS: dict[str, Any] = {
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "async_scheduling": False,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "watermark": 0.0,
}


def make_vllm_scheduler(
    *,
    block_size: int,
    num_gpu_blocks: int,
    num_speculative_tokens: int = 0,
    speculative_method: str = "ngram",
    lookahead_block_hashes: bool = True,
    max_loras: int = 0,
    use_v2_model_runner: bool = False,
    pooling: bool = False,
    kv_events: bool = False,
    kv_connector: tuple[str, str] | None = None,
    kv_role: str = "kv_producer",
    kv_load_failure_policy: str = "recompute",
    kv_cache_groups: str = "full",
    latent_attention: bool = False,
    prefix_cache_retention_interval: int | None = 0,
    mamba_prefill_checkpoint_alignment: int = 0,
    data_parallel_size: int = 1,
    image_side: int = 0,
    max_num_encoder_input_tokens: int | None = None,
    encoder_cache_size: int | None = None,
    mm_encoder_only: bool = False,
    diffusion_canvas_length: int | None = None,
    **shared_fields: Any,
) -> Any:
    """Build vLLM 0.33.0's ``Scheduler`` (or ``AsyncScheduler`` if ``async_scheduling``)
    for llmsched's ``SchedulerConfig(block_size=..., num_gpu_blocks=...,
    num_speculative_tokens=..., **shared_fields)``.

    ``shared_fields`` are the llmsched config fields vLLM's config holds too, each set
    where ``llmsched.vllm._config.SHARED_FIELDS`` (the one llmsched <-> vLLM mapping) says
    vLLM keeps it: ``max_model_len``, ``max_num_seqs`` and ``max_num_batched_tokens`` are
    required; the others default to chunked prefill on, no long-prefill threshold, sync
    scheduling, prefix caching off, FCFS, no watermark, and vLLM's defaults for the rest.
    ``num_gpu_blocks`` is the KV cache's block count, ``num_speculative_tokens`` the ``K``
    of speculative decoding (0 for none) by ``speculative_method`` (``ngram``, or a drafter
    with a model, ``eagle``, ``eagle3`` or ``draft_model``: vLLM derives the drafter's
    lookahead slots, draft slots and prefix-cache rule from it, with lookahead block hashes
    unless ``lookahead_block_hashes`` is False), ``max_loras`` the LoRA config's (0: LoRA
    off), ``pooling`` a pooling (embedding) model's runner (it samples no token),
    ``kv_events`` KV cache events on (vLLM's ``null`` publisher: a caller that wants them
    replaces ``kv_event_publisher``), ``kv_connector`` a KV connector's ``(class name,
    module path)`` in ``kv_role`` (a consumer defers block frees with steps in flight) with
    ``kv_load_failure_policy``,
    ``kv_cache_groups`` llmsched's field of that name
    (one KV-cache group per entry: ``FullAttentionSpec``, ``SlidingWindowSpec``,
    ``ChunkedLocalAttentionSpec`` or, for ``mamba``, a ``MambaSpec``: of ``max_model_len``
    tokens without prefix caching, aligned to ``block_size`` with it, as vLLM sets them up;
    with ``latent_attention`` a full-attention group is an ``MLAAttentionSpec``, as a
    DeepSeek-style model's) and ``prefix_cache_retention_interval`` the KV-cache config's
    (vLLM's engines take the cache config's, 0; None keeps every sliding-window block),
    ``mamba_prefill_checkpoint_alignment``
    the aligned Mamba groups' prefill checkpoints (0: none). See the module docstring for the
    rest. ``data_parallel_size`` > 1 is a data-parallel rank of an MoE model (dense models'
    ranks are independent engines of size 1), whose engine core keeps the prefill cadence.
    ``image_side`` > 0 makes the model a tiny llava-1.5 (multimodal inputs, each image
    ``image_side ** 2`` placeholder tokens at most), whose encoder compute budget and cache
    size vLLM derives from ``max_num_encoder_input_tokens`` and ``encoder_cache_size``
    (vLLM's defaults when None: the token budget) and that image size; with
    ``mm_encoder_only`` it is an encoder instance (vLLM's ``mm_encoder_only``), which vLLM
    serves without prefix caching. ``kv_cache_groups=""`` is a model without a KV cache: no
    group, a pool of the null block alone, and chunked prefill turned off, as vLLM's engine
    sets them up. ``diffusion_canvas_length`` makes it a diffusion LLM of that canvas (vLLM's
    ``DiffusionConfig``, and its ``DiffusionScheduler`` / ``DiffusionAsyncScheduler``).
    """
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        KVTransferConfig,
        LoRAConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    from llmsched.vllm._config import vllm_fields

    missing = sorted(
        {"max_model_len", "max_num_seqs", "max_num_batched_tokens"} - set(shared_fields)
    )
    if missing:
        raise TypeError(f"make_vllm_scheduler() missing keyword arguments: {', '.join(missing)}")
    _ensure_none_hash()
    sections = vllm_fields({**_SHARED_DEFAULTS, **shared_fields})
    model_config = ModelConfig(
        model=_tiny_llava_dir(image_side) if image_side else _tiny_model_dir(),
        tokenizer=None,
        # A multimodal model's processor (which sizes the encoder budget) needs its tokenizer.
        skip_tokenizer_init=not image_side,
        dtype="float16",
        seed=0,
        runner="pooling" if pooling else "generate",
        **sections.pop("model_config"),
    )
    diffusion_config = None
    if diffusion_canvas_length is not None:
        from vllm.config import DiffusionConfig

        # A diffusion checkpoint declares its canvas in its config (model_config.is_diffusion).
        model_config.hf_config.canvas_length = diffusion_canvas_length
        diffusion_config = DiffusionConfig(canvas_length=diffusion_canvas_length)
    if mm_encoder_only:
        if not image_side:
            raise TypeError("make_vllm_scheduler(): mm_encoder_only needs a multimodal model")
        model_config.multimodal_config.mm_encoder_only = True
    scheduler_config = SchedulerConfig(
        # An init-only argument: vLLM checks the budgets against the model's length.
        max_model_len=model_config.max_model_len,
        is_encoder_decoder=model_config.is_encoder_decoder,
        **sections.pop("scheduler_config"),
    )
    # Not constructor arguments: vLLM sets them to the token budget, then a caller may.
    if max_num_encoder_input_tokens is not None:
        scheduler_config.max_num_encoder_input_tokens = max_num_encoder_input_tokens
    if encoder_cache_size is not None:
        scheduler_config.encoder_cache_size = encoder_cache_size
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        **sections.pop("cache_config"),
    )
    parallel_config = ParallelConfig(
        data_parallel_size=data_parallel_size, **sections.pop("parallel_config", {})
    )
    if sections:
        raise AssertionError(f"sections the builder does not construct: {sorted(sections)}")
    speculative_config = None
    if num_speculative_tokens > 0:
        speculative_config = SpeculativeConfig(
            model="ngram", num_speculative_tokens=num_speculative_tokens
        )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=parallel_config,
        device_config=DeviceConfig(device="cpu"),
        speculative_config=speculative_config,
        lora_config=LoRAConfig(max_loras=max_loras) if max_loras > 0 else None,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        if kv_events
        else None,
        diffusion_config=diffusion_config,
        kv_transfer_config=None
        if kv_connector is None
        else KVTransferConfig(
            kv_connector=kv_connector[0],
            kv_connector_module_path=kv_connector[1],
            kv_role=kv_role,
            kv_load_failure_policy=kv_load_failure_policy,
        ),
    )

    def spec(kind: str) -> Any:
        shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1}
        if kind == "full" and latent_attention:
            return MLAAttentionSpec(**shape, dtype=torch.float32)
        if kind == "full":
            return FullAttentionSpec(**shape, dtype=torch.float32)
        if kind == "mamba" and cache_config.enable_prefix_caching:
            # With prefix caching vLLM aligns Mamba state to the attention block size.
            checkpoints = mamba_prefill_checkpoint_alignment > 0
            return MambaSpec(
                block_size=block_size,
                shapes=((1,),),
                dtypes=(torch.float32,),
                mamba_cache_mode="align",
                num_speculative_blocks=num_speculative_tokens,
                num_prefill_checkpoint_blocks=int(checkpoints),
                prefill_checkpoint_alignment=mamba_prefill_checkpoint_alignment
                if checkpoints
                else None,
            )
        if kind == "mamba":
            # Without prefix caching, as vLLM sizes it: one state block per request (and
            # one per draft token) of max_model_len tokens.
            return MambaSpec(
                block_size=model_config.max_model_len,
                shapes=((1,),),
                dtypes=(torch.float32,),
                mamba_cache_mode="none",
                num_speculative_blocks=num_speculative_tokens,
            )
        if kind.startswith("chunked_local:"):
            chunk = int(kind.removeprefix("chunked_local:"))
            return ChunkedLocalAttentionSpec(
                **shape, dtype=torch.float32, attention_chunk_size=chunk
            )
        window = int(kind.removeprefix("sliding_window:"))
        return SlidingWindowSpec(**shape, dtype=torch.float32, sliding_window=window)

    kv_cache_config = KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[],
        # "+eagle": the group holds the drafter's layers (vLLM's is_eagle_group).
        kv_cache_groups=[
            KVCacheGroupSpec(
                [f"layer.{g}"],
                spec(kind.removesuffix("+eagle")),
                is_eagle_group=kind.endswith("+eagle"),
            )
            for g, kind in enumerate(kv_cache_groups.split(",") if kv_cache_groups else ())
        ],
        prefix_cache_retention_interval=prefix_cache_retention_interval,
    )
    if "mamba" in kv_cache_groups and cache_config.enable_prefix_caching:
        # vLLM's MambaModelConfig: prefix caching with Mamba layers caches their state at
        # block boundaries.
        cache_config.mamba_cache_mode = "align"
    if speculative_config is not None and speculative_method != "ngram":
        _become_drafter(vllm_config, speculative_method, lookahead_block_hashes)
    cache_config.num_gpu_blocks = num_gpu_blocks
    if not kv_cache_config.kv_cache_groups:
        # vLLM's EngineCore, once the config is validated: a model without a KV cache
        # cannot chunk a prefill.
        scheduler_config.enable_chunked_prefill = False
    register_all_kvcache_specs(vllm_config)
    cls = AsyncScheduler if scheduler_config.async_scheduling else Scheduler
    if diffusion_config is not None:
        from vllm.v1.core.sched.diffusion_scheduler import (
            DiffusionAsyncScheduler,
            DiffusionScheduler,
        )

        cls = DiffusionAsyncScheduler if scheduler_config.async_scheduling else DiffusionScheduler
    # vLLM's scheduler block size: the least common multiple of the groups' (Mamba's is
    # max_model_len); without a group, the cache config's.
    group_block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
    scheduler_block_size = math.lcm(*group_block_sizes) if group_block_sizes else block_size
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=scheduler_block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )
    scheduler.use_v2_model_runner = use_v2_model_runner
    # vLLM's rule at construction, which read the platform's runner.
    scheduler.can_skip_drafts = scheduler.num_lookahead_tokens > 0 and use_v2_model_runner
    return scheduler


def _become_drafter(vllm_config: Any, method: str, lookahead_block_hashes: bool) -> None:
    """Turns the ngram speculative config of ``vllm_config`` into ``method``'s, as vLLM's
    own scheduler tests do (a drafter's config would load its model): vLLM derives the
    lookahead slots, the draft slots and the prefix-cache rule from the method, and the
    token budget again (``_set_max_num_scheduled_tokens``)."""
    from types import SimpleNamespace

    spec = vllm_config.speculative_config
    object.__setattr__(spec, "method", method)
    # "mtp": a multi-module MTP drafter, one module per draft token (vLLM reads the count
    # from the draft model's config).
    layers = {"num_nextn_predict_layers": spec.num_speculative_tokens} if method == "mtp" else {}
    object.__setattr__(
        spec, "draft_model_config", SimpleNamespace(hf_config=SimpleNamespace(**layers))
    )
    object.__setattr__(spec, "disable_lookahead_block_hashes", not lookahead_block_hashes)
    vllm_config._set_max_num_scheduled_tokens()


def scheduler_from(reference: Any, cls: type | None = None, **kwargs: Any) -> Any:
    """A scheduler built from the very configs of ``reference`` (a scheduler from
    :func:`make_vllm_scheduler`), as vLLM's EngineCore builds its ``scheduler_cls``.

    ``cls`` defaults to the plug-in: ``llmsched.vllm.AsyncScheduler`` when the reference's
    config has async scheduling on, ``llmsched.vllm.Scheduler`` otherwise. ``kwargs`` go to
    the constructor (``log_stats=True`` and the reference's ``block_size`` unless given),
    and the new scheduler reports resumed requests, and skips drafts, for the same model
    runner as ``reference``.
    """
    if cls is None:
        from llmsched.vllm import AsyncScheduler, Scheduler

        cls = AsyncScheduler if reference.scheduler_config.async_scheduling else Scheduler
    kwargs.setdefault("log_stats", True)
    kwargs.setdefault("block_size", reference.block_size)
    scheduler = cls(
        vllm_config=reference.vllm_config,
        kv_cache_config=reference.kv_cache_config,
        structured_output_manager=reference.structured_output_manager,
        **kwargs,
    )
    scheduler.use_v2_model_runner = reference.use_v2_model_runner
    scheduler.can_skip_drafts = reference.can_skip_drafts
    return scheduler


def make_vllm_request(
    request_id: str,
    prompt_token_ids: Sequence[int] | None,
    *,
    max_tokens: int,
    eos_token_id: int | None = None,
    stop_token_ids: Iterable[int] = (),
    arrival_time: float = 0.0,
    priority: int = 0,
    block_size: int,
    prefix_caching: bool = True,
    lora_id: int | None = None,
    cache_salt: str | None = None,
    skip_reading_prefix_cache: bool = False,
    structured_output: bool = False,
    pooling: bool = False,
    report_reused_blocks: bool = False,
    num_hash_lookahead_tokens: int = 0,
    mm_inputs: Sequence[tuple[str, int, int]] = (),
    resumable: bool = False,
    diffusion_canvas_length: int | None = None,
    diffusion_read_steps: int | None = None,
    prompt_embeds: Any = None,
) -> Any:
    """Build a vLLM ``Request`` for ``scheduler.add_request``.

    ``eos_token_id`` is the id that stops the request (none if None), ``stop_token_ids``
    further stop ids, set the way vLLM's engine sets them. ``block_size`` must be the
    scheduler's: it sizes the prefix-cache block hasher attached to the request (vLLM's
    engine attaches one only when prefix caching is on; pass ``prefix_caching=False`` to
    leave it off and save the hashing cost). ``lora_id`` puts the request under the LoRA
    adapter of that id (named ``adapter-<id>``; it enters the block hashes), and
    ``cache_salt`` salts its first block's hash (requests share cached blocks only with the
    same salt). ``skip_reading_prefix_cache`` admits it without a prefix-cache lookup (what
    vLLM's engine sets for prompt logprobs). ``structured_output`` gives it a (regex)
    structured-output constraint: it waits for its grammar, which the caller sets on
    ``request.structured_output_request`` (vLLM's engine has its manager compile it).
    ``pooling`` makes it an embedding request (pooling parameters, no sampling ones).
    ``report_reused_blocks`` asks for KV cache events of its prefix hits too
    (``kv_cache_report_mode="full"``). ``num_hash_lookahead_tokens`` is the engine's (an
    EAGLE drafter's lookahead hashes: each block hash covers that many tokens after it).
    ``mm_inputs`` are its images, ``(identifier, offset, length)`` each: ``length``
    placeholder tokens from ``offset`` on (the prompt's tokens there are the caller's), an
    encoder output shared by identifier, and a stand-in of the image's data.
    ``resumable`` makes it a streaming-input session, or the next input of the live session
    of its id. For a diffusion model, ``diffusion_canvas_length`` is its own canvas and
    ``diffusion_read_steps`` makes it a read of that many denoising steps (the
    ``extra_args`` vLLM's diffusion scheduler reads). ``prompt_embeds`` (a tensor, a row
    per position) gives the prompt as embeddings, with ``prompt_token_ids`` None (vLLM's
    engine then has no token ids; an engine with ``enable_prompt_embeds``).
    """
    import torch
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import (
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        MultiModalSharedField,
        PlaceholderRange,
    )
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    block_hasher = None
    if prefix_caching:
        _ensure_none_hash()
        block_hasher = get_request_block_hasher(block_size, sha256, num_hash_lookahead_tokens)
    params = SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=list(stop_token_ids),
        skip_reading_prefix_cache=skip_reading_prefix_cache,
        structured_outputs=StructuredOutputsParams(regex="[a-z]+") if structured_output else None,
        extra_args={
            **({"kv_cache_report_mode": "full"} if report_reused_blocks else {}),
            **(
                {"diffusion_canvas_length": diffusion_canvas_length}
                if diffusion_canvas_length is not None
                else {}
            ),
            **(
                {"diffusion_read_only": True, "diffusion_max_steps": diffusion_read_steps}
                if diffusion_read_steps is not None
                else {}
            ),
        }
        or None,
    )
    params.update_from_generation_config({}, eos_token_id)
    return Request(
        request_id=request_id,
        prompt_token_ids=None if prompt_token_ids is None else [int(t) for t in prompt_token_ids],
        prompt_embeds=prompt_embeds,
        sampling_params=None if pooling else params,
        pooling_params=PoolingParams(task="embed") if pooling else None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=block_hasher,
        cache_salt=cache_salt,
        lora_request=None
        if lora_id is None
        else LoRARequest(f"adapter-{lora_id}", lora_id, f"/adapters/{lora_id}"),
        resumable=resumable,
        mm_features=[
            MultiModalFeatureSpec(
                # A stand-in of the image's data, the same in every process (vLLM's
                # MultiModalKwargsItem.dummy() holds uninitialized memory).
                data=MultiModalKwargsItem(
                    {
                        "pixels": MultiModalFieldElem(
                            data=torch.full((1,), k, dtype=torch.uint8),
                            field=MultiModalSharedField(batch_size=1),
                        )
                    }
                ),
                modality="image",
                identifier=identifier,
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
            for k, (identifier, offset, length) in enumerate(mm_inputs)
        ]
        or None,
    )


def vllm_runner_output(
    scheduler_output: Any, sampled: Mapping[str, Sequence[int]], *, pooling: bool = False
) -> Any:
    """A vLLM ``ModelRunnerOutput`` answering ``scheduler_output``.

    One row per scheduled request, in the scheduler output's order: ``sampled[req_id]``
    (the tokens sampled for it this step, accepted drafts first), or an empty row when the
    request is missing from ``sampled`` (a partial prefill chunk samples nothing). With
    ``pooling``, no token rows: each request in ``sampled`` (its prompt done) gets a pooled
    output (a one-element tensor of its position in the step), the others None.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(scheduler_output.num_scheduled_tokens)
    if pooling:
        import torch

        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[],
            pooler_output=[
                torch.tensor([float(i)]) if rid in sampled else None
                for i, rid in enumerate(req_ids)
            ],
        )
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=[[int(t) for t in sampled.get(rid, ())] for rid in req_ids],
    )


def step_summary(scheduler_output: Any) -> dict[str, Any]:
    """A normalized, plain-data view of one vLLM ``SchedulerOutput``.

    Keys:

    - ``scheduled``: ``[(req_id, num_scheduled_tokens), ...]`` in vLLM's order (running
      requests first, then this step's admissions).
    - ``total_num_scheduled_tokens``: the sum of those counts.
    - ``spec_tokens``: ``{req_id: [draft ids]}`` for requests with draft slots scheduled
      (``-1`` marks a placeholder under async scheduling).
    - ``new``: ids of first-time admissions, in order (with the V2 model runner, resumed
      requests too: that is how vLLM reports them there).
    - ``resumed``: ids of requests resumed after preemption, in scheduled order.
    - ``preempted``: ids preempted since the previous step, sorted.
    - ``finished``: ids finished since the previous step, sorted.
    - ``num_computed_tokens``: ``{req_id: C}``, each scheduled request's computed tokens
      before the step (prefix-cache hits included), as vLLM sends them to the runner.
    """
    num_scheduled = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    computed: dict[str, int] = {}
    for new_req in scheduler_output.scheduled_new_reqs:
        computed[new_req.req_id] = int(new_req.num_computed_tokens)
    for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        computed[rid] = int(c)
    resumed = set(cached.resumed_req_ids)
    return {
        "scheduled": [(rid, int(n)) for rid, n in num_scheduled.items()],
        "total_num_scheduled_tokens": int(scheduler_output.total_num_scheduled_tokens),
        "spec_tokens": {
            rid: [int(t) for t in toks]
            for rid, toks in scheduler_output.scheduled_spec_decode_tokens.items()
        },
        "new": [r.req_id for r in scheduler_output.scheduled_new_reqs],
        "resumed": [rid for rid in cached.req_ids if rid in resumed],
        "preempted": sorted(scheduler_output.preempted_req_ids or ()),
        "finished": sorted(scheduler_output.finished_req_ids),
        "num_computed_tokens": {rid: computed[rid] for rid in num_scheduled if rid in computed},
    }
