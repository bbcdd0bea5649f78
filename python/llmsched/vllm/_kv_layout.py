"""The KV-cache layout vLLM's engine reads from its scheduler outside ``SchedulerInterface``.

vLLM's ``EngineCore`` reads ``scheduler.kv_cache_manager.coordinator.single_type_managers``
to learn each KV-cache group's block size and spec: the full-attention block size it
reports to the front end (``vllm:cache_config_info``'s ``effective_attention_block_size``)
and ``get_kv_cache_group_metadata``. llmsched keeps its KV pool in the core, so the plug-in
answers those reads with this description of the one full-attention group it schedules
(engines with any other layout are refused at start).
"""

from __future__ import annotations

from typing import Any

__all__ = ["KVCacheLayout"]


class KVGroupLayout:
    """One KV-cache group as ``EngineCore`` reads it: its block size and spec."""

    __slots__ = ("block_size", "kv_cache_spec")

    def __init__(self, block_size: int, kv_cache_spec: Any) -> None:
        self.block_size = block_size
        self.kv_cache_spec = kv_cache_spec


class KVCoordinatorLayout:
    """The groups, in ``kv_cache_config.kv_cache_groups`` order."""

    __slots__ = ("single_type_managers",)

    def __init__(self, groups: tuple[KVGroupLayout, ...]) -> None:
        self.single_type_managers = groups


class KVCacheLayout:
    """Stands where vLLM's scheduler keeps its ``KVCacheManager``, with only what the engine
    reads of it: ``coordinator.single_type_managers``. Read-only; it allocates nothing."""

    __slots__ = ("coordinator",)

    def __init__(self, kv_cache_config: Any) -> None:
        # A group's block size is its spec's, as in vLLM's own managers without context
        # parallelism.
        self.coordinator = KVCoordinatorLayout(
            tuple(
                KVGroupLayout(group.kv_cache_spec.block_size, group.kv_cache_spec)
                for group in kv_cache_config.kv_cache_groups
            )
        )
