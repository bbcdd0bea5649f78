"""The KV cache as vLLM's scheduler exposes it outside ``SchedulerInterface``: a read-only
view of the core's pool.

vLLM's scheduler keeps a ``KVCacheManager`` at ``scheduler.kv_cache_manager``, and code
outside the interface reads it: ``EngineCore`` reads ``coordinator.single_type_managers``
to learn each KV-cache group's block size and spec (the full-attention block size it reports
as ``vllm:cache_config_info``'s ``effective_attention_block_size``, and
``get_kv_cache_group_metadata``); vLLM's connector tests and tools read the block pool (free
blocks, reference counts) and the requests' block tables to check that nothing leaks; an
auxiliary-output connector asks the pool which block holds a hash. llmsched keeps its KV
pool in the core, so the plug-in answers those reads with this view, each read asked of the
core when it is made. It allocates, frees and caches nothing: a method of vLLM's manager
that changes the cache is absent here.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import _gen_prompt_embeds_extra_hash_keys
from vllm.v1.metrics.stats import PrefixCacheStats

import llmsched
from llmsched.vllm._aux_outputs import BlockNames
from llmsched.vllm._config import group_block_size, is_full_attention
from llmsched.vllm._multimodal import mm_inputs

__all__ = ["KVCacheLayout", "prefix_cache_keys"]


def prefix_cache_keys(request: Any, block_size: int) -> dict[str, Any]:
    """What of a vLLM ``Request`` its prefix-cache lookups depend on past its tokens, as
    the core's ``add_request`` and ``probe_prefix_cache`` take it: the keys its block hashes
    cover (cache salt, LoRA adapter, multimodal inputs, the prompt embeddings of each
    block), and whether it reads the cache."""
    return {
        "cache_salt": request.cache_salt,
        "lora_id": None if request.lora_request is None else request.lora_request.lora_int_id,
        "mm_inputs": mm_inputs(request),
        "prompt_embeds_keys": _prompt_embeds_keys(request, block_size),
        # vLLM's engine sets it for prompt logprobs (every position computed).
        "skip_reading_prefix_cache": request.skip_reading_prefix_cache,
    }


def _prompt_embeds_keys(request: Any, block_size: int) -> list[bytes] | None:
    """For a prompt given as embeddings, each block's key of them, as vLLM's block hasher
    computes it (and keeps on the request, so it is computed once): a digest of the block's
    slice of ``prompt_embeds``."""
    if request.prompt_embeds is None:
        return None
    keys: list[bytes] = []
    for start in range(0, request.num_prompt_tokens, block_size):
        ((_, key),) = _gen_prompt_embeds_extra_hash_keys(request, start, start + block_size)
        keys.append(key)
    return keys


class KVBlockView:
    """One KV block as vLLM's ``KVCacheBlock`` shows it: its id, how many hold it, and the
    hash it is in the prefix cache under (llmsched's own 128-bit hash, not vLLM's; None if
    it is not cached), each read from the core when accessed, as vLLM's block is live."""

    __slots__ = ("_core", "block_id")

    def __init__(self, core: llmsched.Scheduler, block_id: int) -> None:
        self._core = core
        self.block_id = block_id

    @property
    def ref_cnt(self) -> int:
        """How many hold the block now."""
        return self._core.block_ref_count(self.block_id)

    @property
    def block_hash(self) -> int | None:
        """The hash the block is in the prefix cache under now, or None."""
        return self._core.cached_block_hash(self.block_id)

    @property
    def is_null(self) -> bool:
        """Block 0 is the null block, as in vLLM's pool."""
        return self.block_id == 0

    def __repr__(self) -> str:
        return f"KVBlockView(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeBlockQueueView:
    """vLLM's ``free_block_queue`` as far as it is counted."""

    __slots__ = ("_core",)

    def __init__(self, core: llmsched.Scheduler) -> None:
        self._core = core

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached ones included (they are reusable)."""
        return self._core.num_free_blocks


class BlockPoolView:
    """vLLM's ``BlockPool``: its size, its free blocks, each block's reference count, and the
    blocks cached under the vLLM hashes an auxiliary-output connector can ask about."""

    __slots__ = ("_core", "free_block_queue", "hash_block_size", "names")

    def __init__(self, core: llmsched.Scheduler) -> None:
        self._core = core
        self.free_block_queue = FreeBlockQueueView(core)
        # The tokens one block hash covers (the block size: llmsched refuses others).
        self.hash_block_size: int = core.config.block_size
        self.names = BlockNames(core)

    def get_cached_block(
        self, block_hash: Any, kv_cache_group_ids: list[int]
    ) -> list[KVBlockView] | None:
        """The block cached under vLLM's ``block_hash`` in each group, or None if a group
        has none, as vLLM's pool answers, for the hashes the plug-in has named: those of
        the blocks an auxiliary-output connector can ask about (``BlockNames``); None for
        any other."""
        blocks = []
        for group in kv_cache_group_ids:
            block = self.names.cached_block(block_hash, group)
            if block is None:
                return None
            blocks.append(KVBlockView(self._core, block))
        return blocks

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self._core.config.num_gpu_blocks

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue."""
        return self._core.num_free_blocks

    def get_usage(self) -> float:
        """The share of the pool's blocks in use, as vLLM computes it."""
        return self._core.get_kv_cache_usage()

    @property
    def blocks(self) -> list[KVBlockView]:
        """Every block, by id: a new list on each access, of views that read the core."""
        core = self._core
        return [KVBlockView(core, block_id) for block_id in range(core.config.num_gpu_blocks)]


class KVGroupView:
    """One KV-cache group as vLLM's single-type manager shows it: its block size and spec,
    and the block table of each request that holds blocks in it."""

    __slots__ = ("_core", "_group", "_null_block", "block_pool", "block_size", "kv_cache_spec")

    def __init__(
        self,
        core: llmsched.Scheduler,
        group: int,
        block_size: int,
        kv_cache_spec: Any,
        block_pool: BlockPoolView,
    ) -> None:
        self._core = core
        self._group = group
        self.block_size = block_size
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        # vLLM's manager holds one null block object, which stands in a table wherever a
        # sliding window or local chunk let a block go (read by identity).
        self._null_block = KVBlockView(core, 0)

    @property
    def req_to_blocks(self) -> dict[str, list[KVBlockView]]:
        """The blocks each request holds in this group, by request id: the live requests
        with a non-empty table, and the finished ones a KV connector holds. A new dict on
        each access."""
        core = self._core
        tables = {req_id: _block_table(core, req_id, self._group) for req_id in _holders(core)}
        null = self._null_block
        return {
            req_id: [null if block == 0 else KVBlockView(core, block) for block in table]
            for req_id, table in tables.items()
            if table
        }

    @property
    def num_cached_block(self) -> dict[str, int]:
        """How many leading blocks of each live request's table are in the prefix cache,
        by request id (group 0's count: the core registers a request's groups together)."""
        core = self._core
        counts = {}
        for req_id in _live(core):
            request = core.get_request(req_id)
            if request.block_ids:
                counts[req_id] = request.num_cached_blocks
        return counts


#: vLLM's ``PrefixCacheStats`` fields, each with the core's counter of it (``stats()``).
_PREFIX_COUNTERS = {
    "requests": "prefix_cache_requests",
    "queries": "prefix_cache_queries",
    "hits": "prefix_cache_hits",
    "preempted_requests": "prefix_cache_preempted_requests",
    "preempted_queries": "prefix_cache_preempted_queries",
    "preempted_hits": "prefix_cache_preempted_hits",
}


def _counter(field: str) -> Any:
    def read(self: PrefixCacheStatsView) -> int:
        return self.counts()[field]

    return property(read, doc=f"``{field}`` since this accumulator was started.")


class PrefixCacheStatsView:
    """vLLM's ``PrefixCacheStats`` as its ``KVCacheManager`` accumulates it: the prefix
    cache's lookups since the accumulator was started, read from the core's counters when
    accessed, until ``make_prefix_cache_stats`` takes it and starts another (it then keeps
    what it had, as vLLM's does). ``reset``: the prefix cache was reset meanwhile."""

    __slots__ = ("_core", "_since", "_taken", "reset")

    def __init__(self, core: llmsched.Scheduler, since: dict[str, int]) -> None:
        self._core = core
        self._since = since
        self._taken: dict[str, int] | None = None
        self.reset = False

    def counts(self) -> dict[str, int]:
        """Every field's count, by field name."""
        if self._taken is not None:
            return self._taken
        return self._counts_at(self._core.stats())

    def _counts_at(self, counters: dict[str, int]) -> dict[str, int]:
        return {field: counters[key] - self._since[key] for field, key in _PREFIX_COUNTERS.items()}

    def take(self, counters: dict[str, int]) -> PrefixCacheStats:
        """Freeze the counts at ``counters`` (the core's now); they as vLLM's object."""
        self._taken = self._counts_at(counters)
        return PrefixCacheStats(reset=self.reset, **self._taken)

    requests = _counter("requests")
    queries = _counter("queries")
    hits = _counter("hits")
    preempted_requests = _counter("preempted_requests")
    preempted_queries = _counter("preempted_queries")
    preempted_hits = _counter("preempted_hits")


class KVCoordinatorLayout:
    """The groups, in ``kv_cache_config.kv_cache_groups`` order; with several, the first
    full-attention group's index (``full_attention_group_id``, None without one), as
    vLLM's hybrid coordinator names it."""

    __slots__ = ("full_attention_group_id", "single_type_managers")

    def __init__(self, groups: tuple[KVGroupView, ...]) -> None:
        self.single_type_managers = groups
        if len(groups) > 1:
            self.full_attention_group_id = next(
                (i for i, group in enumerate(groups) if is_full_attention(group.kv_cache_spec)),
                None,
            )


class KVCacheLayout:
    """Stands where vLLM's scheduler keeps its ``KVCacheManager``: the groups
    (``coordinator.single_type_managers``), the pool (``block_pool``), the requests' block
    ids (``get_block_ids``), ``usage`` and the prefix cache's stats (with ``log_stats``).
    Read-only, but for the stats' accumulator, which the scheduler's ``make_stats`` takes."""

    __slots__ = ("_core", "_prefix_cache_stats", "block_pool", "coordinator", "kv_cache_config")

    def __init__(
        self,
        kv_cache_config: Any,
        core: llmsched.Scheduler,
        log_stats: bool,
        decode_context_parallel: int,
    ) -> None:
        self._core = core
        self.kv_cache_config = kv_cache_config
        self._prefix_cache_stats = (
            PrefixCacheStatsView(core, dict.fromkeys(_PREFIX_COUNTERS.values(), 0))
            if log_stats
            else None
        )
        self.block_pool = BlockPoolView(core)
        # A group's block size is its spec's, times the decode-context-parallel ranks a
        # full-attention block is sharded over, as in vLLM's own managers.
        self.coordinator = KVCoordinatorLayout(
            tuple(
                KVGroupView(
                    core,
                    group,
                    group_block_size(spec.kv_cache_spec, decode_context_parallel),
                    spec.kv_cache_spec,
                    self.block_pool,
                )
                for group, spec in enumerate(kv_cache_config.kv_cache_groups)
            )
        )

    @property
    def usage(self) -> float:
        """The share of the pool's blocks in use, as vLLM computes it."""
        return self._core.get_kv_cache_usage()

    @property
    def prefix_cache_stats(self) -> PrefixCacheStatsView | None:
        """The prefix cache's lookups since the last ``make_prefix_cache_stats()``, live
        (None without ``log_stats``)."""
        return self._prefix_cache_stats

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The prefix cache's lookups since the last call, as vLLM's object, and a new
        accumulator for the next (None without ``log_stats``)."""
        stats = self._prefix_cache_stats
        if stats is None:
            return None
        counters = self._core.stats()
        self._prefix_cache_stats = PrefixCacheStatsView(self._core, counters)
        return stats.take(counters)

    def get_computed_blocks(self, request: Any) -> tuple[KVCacheBlocks, int, int]:
        """The prefix-cache hit ``request`` (a vLLM ``Request``, added or not) would find
        now, as vLLM's manager answers: its blocks per group, the tokens they hold, and the
        ``shared_prefix_boundary``. Looks only: nothing is allocated or recorded."""
        block_ids, num_tokens, boundary = self._core.probe_prefix_cache(
            list(request.all_token_ids), **prefix_cache_keys(request, self._core.config.block_size)
        )
        core = self._core
        blocks = tuple([KVBlockView(core, block) for block in ids] for ids in block_ids)
        return KVCacheBlocks(blocks), num_tokens, boundary

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The blocks ``request_id`` holds, one list per KV-cache group (a finished
        request's while a KV connector holds them; empty lists for any other)."""
        return tuple(
            _block_table(self._core, request_id, group)
            for group in range(len(self.coordinator.single_type_managers))
        )


def _live(core: llmsched.Scheduler) -> list[str]:
    """The live requests: running, then waiting."""
    return core.running_request_ids() + core.waiting_request_ids()


def _holders(core: llmsched.Scheduler) -> list[str]:
    """The requests that may hold blocks: the live ones, then the finished ones whose
    blocks a KV connector holds."""
    return _live(core) + core.held_kv_request_ids()


def _block_table(core: llmsched.Scheduler, request_id: str, group: int) -> list[int]:
    """``request_id``'s block table in ``group`` (a held request's: the blocks a connector
    sends); empty if it holds none there."""
    held = core.held_kv_blocks(request_id, group)
    if held is not None:
        held_table: list[int] = held.tolist()
        return held_table
    try:
        tables = core.get_request(request_id).group_block_ids
    except llmsched.UnknownRequestError:
        return []
    return tables[group] if group < len(tables) else []
