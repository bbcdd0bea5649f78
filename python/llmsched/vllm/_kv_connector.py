"""The scheduler's side of a vLLM KV connector (``kv_transfer_config``), around the core.

The core asks the connector, in its waiting loop, how many tokens past a request's prefix
hit it loads (``get_num_new_matched_tokens``), and keeps a finished request's blocks out of
the pool until they are released. Everything else is the connector's own work, called
where vLLM's scheduler calls it: ``update_state_after_alloc`` for each request the step
admitted, ``build_connector_meta`` on the finished ``SchedulerOutput``, ``request_finished``
when a request finishes (its blocks released now unless the connector delays it),
``update_connector_output`` with the runner's report (blocks released once sent), stats and
events.

Served: synchronous loads. Refused, with a clear error, where they would first be needed:
asynchronous loads (``WAITING_FOR_REMOTE_KVS``), failed loads and invalid blocks reported by
the runner; at start, a consumer connector with several steps in flight (vLLM defers
block frees there).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request

import llmsched
from llmsched.vllm._requests import pinned

__all__ = ["KvConnectorSide", "UnsupportedConnectorUseError", "make_connector"]

# Whether this vLLM's SchedulerOutput says when a step loads KV synchronously.
_HAS_SYNC_KV_LOADS = "has_sync_kv_loads" in SchedulerOutput.__dataclass_fields__


class UnsupportedConnectorUseError(llmsched.LlmschedError, RuntimeError):
    """The connector asked for something llmsched.vllm does not serve yet (an asynchronous
    load, a failed load's recovery)."""


def make_connector(vllm_config: Any, kv_cache_config: Any) -> Any:
    """The scheduler side of the engine's KV connector, as vLLM's scheduler makes it (None
    without ``kv_transfer_config``)."""
    if vllm_config.kv_transfer_config is None:
        return None
    return KVConnectorFactory.create_connector(
        config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
    )


class KvConnectorSide:
    """One engine's connector and what the plug-in does with it (see the module's doc)."""

    def __init__(
        self,
        connector: Any,
        core: llmsched.Scheduler,
        requests: dict[str, Request],
        log_stats: bool,
    ) -> None:
        self.connector = connector
        self._core = core
        self._requests = requests
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None

    def matched_tokens(self, snapshot: llmsched.Request, num_local: int) -> int | None:
        """The core's question (``schedule(external_kv=...)``), put to the connector with
        vLLM's ``Request``, which reads the snapshot meanwhile (the core is busy)."""
        request = self._requests[snapshot.request_id]
        with pinned(request, snapshot):
            tokens, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
        if load_async and tokens and not request.skip_reading_prefix_cache:
            raise UnsupportedConnectorUseError(
                f"KV connector {type(self.connector).__name__} asked to load "
                f"{tokens} tokens of request {request.request_id!r} asynchronously: "
                "asynchronous KV loads (WAITING_FOR_REMOTE_KVS) are not served by llmsched.vllm yet"
            )
        return None if tokens is None else int(tokens)

    def admitted(self, output: Any, core_out: llmsched.SchedulerOutput) -> None:
        """``update_state_after_alloc`` for each request the step admitted, in admission
        order, and the connector's prefix-cache stats; then the step's connector metadata."""
        external: list[int] = core_out.num_external_computed_tokens.tolist()
        req_ids: list[str] = core_out.req_ids
        first = len(req_ids) - len(external)
        computed: list[int] = core_out.num_computed_tokens.tolist()
        for row, num_external in enumerate(external, first):
            request = self._requests[req_ids[row]]
            blocks = KVCacheBlocks((tuple(KVCacheBlock(b) for b in self._block_ids(req_ids[row])),))
            self.connector.update_state_after_alloc(request, blocks, max(num_external, 0))
            if self.prefix_cache_stats is not None and num_external >= 0:
                num_local = computed[row] - num_external
                queries = request.num_tokens - num_local
                if queries:
                    preempted = request.num_preemptions > 0
                    self.prefix_cache_stats.record(
                        num_tokens=queries,
                        num_hits=num_external,
                        preempted=preempted,
                        hits_by_source=(
                            self.connector.get_external_cache_hit_sources(request, num_external)
                            if num_external and not preempted
                            else None
                        ),
                    )
        if _HAS_SYNC_KV_LOADS:
            output.has_sync_kv_loads = any(n > 0 for n in external)
        output.kv_connector_block_state = KVConnectorBlockState(
            req_ids=set(output.num_scheduled_tokens),
            resolve_block_ids=lambda req_id: (self._block_ids(req_id),),
            boundary_state_offloads={},
        )
        output.kv_connector_metadata = self.connector.build_connector_meta(output)
        output.kv_connector_block_state = None

    def _block_ids(self, req_id: str) -> list[int]:
        return [int(b) for b in self._core.get_request(req_id).block_ids]

    def finished(self, request: Request) -> dict[str, Any] | None:
        """vLLM's ``request_finished`` for a request the core just finished: its blocks go
        back to the pool now unless the connector is still sending them. Returns the
        request's ``kv_transfer_params`` for its output."""
        held = self._core.held_kv_blocks(request.request_id)
        block_ids = [] if held is None else held.tolist()
        delay, params = self.connector.request_finished(request, block_ids)
        if not delay and held is not None:
            self._core.release_kv_blocks([request.request_id])
        return None if params is None else dict(params)

    def runner_reported(self, kv_connector_output: Any) -> None:
        """The runner's connector report: the connector's own update, then the blocks of
        finished requests that are now sent (or received) go back to the pool."""
        if kv_connector_output.failed_recving or kv_connector_output.invalid_block_ids:
            raise UnsupportedConnectorUseError(
                "the runner reported failed KV loads or invalid KV blocks: their recovery "
                "(kv_load_failure_policy) is not served by llmsched.vllm yet"
            )
        self.connector.update_connector_output(kv_connector_output)
        done = [
            req_id
            for req_id in (
                *(kv_connector_output.finished_recving or ()),
                *(kv_connector_output.finished_sending or ()),
            )
            if self._core.held_kv_blocks(req_id) is not None
        ]
        if done:
            self._core.release_kv_blocks(done)

    def take_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The connector's prefix-cache lookups since the last call (with ``log_stats``)."""
        stats = self.prefix_cache_stats
        if stats is None:
            return None
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def stats(self, runner_stats: Any) -> Any:
        """The runner's connector stats with the scheduler side's, as vLLM aggregates them."""
        own = self.connector.get_kv_connector_stats()
        if own is None or own.is_empty():
            return runner_stats
        return own if runner_stats is None else runner_stats.aggregate(own)

    def reset_cache(self) -> bool:
        """vLLM's ``reset_connector_cache`` with a connector attached."""
        if self.connector.reset_cache() is False:
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True
