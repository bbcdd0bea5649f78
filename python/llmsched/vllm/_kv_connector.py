"""The scheduler's side of a vLLM KV connector (``kv_transfer_config``), around the core.

The core asks the connector, in its waiting loop, how many tokens past a request's prefix
hit it loads and whether across steps (``get_num_new_matched_tokens``); it holds a loading
request in ``WAITING_FOR_REMOTE_KVS`` until the runner reports the load received, and keeps
a finished request's blocks out of the pool until they are released. Everything else is the
connector's own work, called where vLLM's scheduler calls it: ``update_state_after_alloc``
for each request the step admitted or started loading, in the waiting loop's order,
``build_connector_meta`` on the finished ``SchedulerOutput``, ``request_finished`` when a
request finishes (its blocks released now unless the connector delays it or its load is in
flight), ``update_connector_output`` with the runner's report (loads received, blocks
released once sent), stats (the requests by KV-fetch stage among them) and events.

Served: synchronous and asynchronous loads; with several steps in flight, a consumer's
freed blocks wait for the steps that may still write them (the core's ``defer_block_free``);
a load's failure, asynchronous or synchronous, recomputed or failing its request (vLLM's
``kv_load_failure_policy``; :func:`failed_loads` also serves a runner's failed blocks on an
engine without a connector, recomputed as vLLM does); several KV-cache groups (sliding
window or chunked local attention beside full attention) with a connector that serves them
all (vLLM's ``SupportsHMA``: it is handed a block list per group), where loads fail by
request only.
A synchronous load's failed block while a later step that scheduled its request is in
flight (async scheduling, pipeline stages) restarts that request under "recompute"
(deviation 17 of docs/parity.md). Refused, with a clear error, where it would first be
needed: a failed block over several groups (a block id cannot be traced to requests there;
vLLM refuses it too); at start, a connector serving one group beside several, and Mamba
layers.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, SupportsHMA
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import KVConnectorBlockState, SchedulerOutput
from vllm.v1.metrics.stats import (
    KV_FETCH_COMPLETED_WAITING,
    KV_FETCH_IN_PROGRESS,
    KV_FETCH_STAGES,
    KV_FETCH_WAITING_TO_START,
    PrefixCacheStats,
)
from vllm.v1.request import Request, RequestStatus

import llmsched
from llmsched.vllm._config import UnsupportedFeatureError, read
from llmsched.vllm._requests import as_during_step, before_step, pinned

__all__ = [
    "KvConnectorSide",
    "UnsupportedConnectorUseError",
    "failed_loads",
    "finish_failed_loads",
    "make_connector",
]

# Whether this vLLM's SchedulerOutput says when a step loads KV synchronously.
_HAS_SYNC_KV_LOADS = "has_sync_kv_loads" in SchedulerOutput.__dataclass_fields__

# vLLM's pool's null block (id 0), which stands in a table where a sliding window or local
# chunk let a block go: a connector loads and stores no KV there (it reads ``is_null``).
_NULL_BLOCK = KVCacheBlock(0, is_null=True)


class UnsupportedConnectorUseError(llmsched.LlmschedError, RuntimeError):
    """The connector reported something llmsched.vllm does not serve (a failed block over
    several KV-cache groups, which cannot be traced to the requests that hold it)."""


def make_connector(vllm_config: Any, kv_cache_config: Any) -> Any:
    """The scheduler side of the engine's KV connector, as vLLM's scheduler makes it (None
    without ``kv_transfer_config``)."""
    if read(vllm_config, "kv_transfer_config") is None:
        return None
    connector = KVConnectorFactory.create_connector(
        config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
    )
    num_groups = len(kv_cache_config.kv_cache_groups)
    if num_groups > 1 and not isinstance(connector, SupportsHMA):
        # vLLM's engine turns its hybrid KV cache off for such a connector (one group).
        raise UnsupportedFeatureError(
            f"llmsched.vllm: the KV connector {type(connector).__name__} serves one KV-cache "
            f"group (it is not SupportsHMA), and this engine has {num_groups}"
        )
    return connector


class KvConnectorSide:
    """One engine's connector and what the plug-in does with it (see the module's doc)."""

    def __init__(
        self,
        connector: Any,
        core: llmsched.Scheduler,
        requests: dict[str, Request],
        log_stats: bool,
        num_groups: int,
    ) -> None:
        self.connector = connector
        self._core = core
        self._num_groups = num_groups
        self._requests = requests
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        # With log_stats: the requests in a KV-fetch stage (vLLM's KV_FETCH_STAGES), by id.
        self._fetch_stages: dict[str, str] | None = {} if log_stats else None

    def on_new_request(self, request: Request) -> None:
        """vLLM's ``on_new_request``, before the core takes the request: the connector may
        cut its prompt there (NIXL's prefill side stops short of the tokens its decoder
        computes again: a Mamba model's last, a multi-module MTP drafter's lookahead)."""
        self.connector.on_new_request(request)

    def added(self, request: Request) -> None:
        """A request the core took: a P/D request that will load counts as waiting to
        start its load from its arrival."""
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            self._set_fetch_stage(request.request_id, KV_FETCH_WAITING_TO_START)

    def matched_tokens(self, snapshot: llmsched.Request, num_local: int) -> tuple[int | None, bool]:
        """The core's question (``schedule(external_kv=...)``), put to the connector with
        vLLM's ``Request``, which reads the snapshot meanwhile (the core is busy)."""
        request = self._requests[snapshot.request_id]
        with pinned(request, snapshot):
            tokens, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
        if tokens is None:
            return None, False
        loads_async = load_async and tokens and not request.skip_reading_prefix_cache
        stage = KV_FETCH_WAITING_TO_START if loads_async else None
        self._set_fetch_stage(request.request_id, stage)
        return int(tokens), bool(load_async)

    def admitted(self, output: Any, core_out: llmsched.SchedulerOutput) -> None:
        """``update_state_after_alloc`` for each request the step admitted or started
        loading, in the waiting loop's order, with the connector's prefix-cache stats; then
        the step's connector metadata. Each call reads the requests as vLLM's scheduler has
        them at that point of its step."""
        external: list[int] = core_out.num_external_computed_tokens.tolist()
        loads: list[tuple[str, int, int]] = core_out.kv_loads
        req_ids: list[str] = core_out.req_ids
        first = len(req_ids) - len(external)
        computed: list[int] = core_out.num_computed_tokens.tolist()
        resumed = set(core_out.resumed_req_ids)
        next_load = 0
        for j, num_external in enumerate(external):
            while next_load < len(loads) and loads[next_load][2] == j:
                self._load_started(*loads[next_load][:2])
                next_load += 1
            req_id = req_ids[first + j]
            # Admitted but not yet running: C as it was (0 after a lookup).
            before = {
                "num_computed_tokens": 0 if num_external >= 0 else computed[first + j],
                "status": RequestStatus.PREEMPTED if req_id in resumed else RequestStatus.WAITING,
            }
            with as_during_step({self._requests[req_id]: before}):
                self._allocated(req_id, computed[first + j], num_external)
            self._set_fetch_stage(req_id, None)
        for req_id, num_external, _ in loads[next_load:]:
            self._load_started(req_id, num_external)
        if _HAS_SYNC_KV_LOADS:
            output.has_sync_kv_loads = any(n > 0 for n in external)
        output.kv_connector_block_state = KVConnectorBlockState(
            req_ids=set(output.num_scheduled_tokens),
            resolve_block_ids=self._block_ids,
            boundary_state_offloads={},
        )
        # The step's requests before it advances them (vLLM builds the metadata first).
        with as_during_step(
            before_step(self._requests, core_out, self._core.config.async_scheduling)
        ):
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        output.kv_connector_block_state = None

    def _load_started(self, req_id: str, num_external: int) -> None:
        """A request whose load runs across steps has its blocks: its prefill stats are its
        lookup's (vLLM records them at the lookup), and the connector is told, the request
        read as vLLM has it then (waiting, no computed tokens yet)."""
        request = self._requests[req_id]
        num_computed = self._core.get_request(req_id).num_computed_tokens
        if request.prefill_stats is not None and request.num_preemptions <= 0:
            request.prefill_stats.set(
                num_prompt_tokens=request.num_prompt_tokens,
                num_local_cached_tokens=num_computed - num_external,
                num_external_cached_tokens=num_external,
            )
        status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        with as_during_step({request: {"num_computed_tokens": 0, "status": status}}):
            self._allocated(req_id, num_computed, num_external)
        self._set_fetch_stage(req_id, KV_FETCH_IN_PROGRESS)

    def _allocated(self, req_id: str, num_computed: int, num_external: int) -> None:
        """``update_state_after_alloc`` for a request given blocks in the waiting loop, and
        its lookup in the connector's prefix-cache stats (none without a lookup: -1)."""
        request = self._requests[req_id]
        blocks = KVCacheBlocks(
            tuple(
                tuple(KVCacheBlock(b) if b else _NULL_BLOCK for b in table)
                for table in self._block_ids(req_id)
            )
        )
        self.connector.update_state_after_alloc(request, blocks, max(num_external, 0))
        if self.prefix_cache_stats is None or num_external < 0:
            return
        queries = request.num_tokens - (num_computed - num_external)
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

    def _block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """A live request's block tables, one per KV-cache group."""
        return tuple(self._core.get_request(req_id).group_block_ids)

    def finished(self, request: Request) -> dict[str, Any] | None:
        """vLLM's ``request_finished`` for a request the core just finished: its blocks go
        back to the pool now unless the connector is still sending them or its load is in
        flight (then once the runner reports it). Returns the request's
        ``kv_transfer_params`` for its output."""
        req_id = request.request_id
        self._set_fetch_stage(req_id, None)
        tables = [self._core.held_kv_blocks(req_id, g) for g in range(self._num_groups)]
        held = tables[0] is not None
        block_ids = tuple([] if table is None else table.tolist() for table in tables)
        delay, params = self._request_finished(request, block_ids)
        if not delay and held and not self._core.kv_load_in_flight(req_id):
            self._core.release_kv_blocks([req_id])
        return None if params is None else dict(params)

    def refused(self, request: Request) -> None:
        """vLLM's ``request_finished`` for a request the connector was told of and the core
        refused: it holds no block."""
        self._request_finished(request, tuple([] for _ in range(self._num_groups)))

    def _request_finished(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        if isinstance(self.connector, SupportsHMA):
            return self.connector.request_finished_all_groups(request, block_ids)  # type: ignore[no-any-return]
        # (Refused at start beside several groups, as vLLM turns its hybrid cache off.)
        return self.connector.request_finished(request, block_ids[0])  # type: ignore[no-any-return]

    def runner_reported(self, kv_connector_output: Any) -> None:
        """The runner's connector report (its failed loads handled first, by
        :func:`failed_loads`): the connector's own update, then the loads received (their
        requests are promoted by the next step) and the blocks of finished requests received
        or sent go back to the pool."""
        self.connector.update_connector_output(kv_connector_output)
        received = list(kv_connector_output.finished_recving or ())
        for req_id in received:
            request = self._requests.get(req_id)
            if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self._set_fetch_stage(req_id, KV_FETCH_COMPLETED_WAITING)
        self._core.finish_kv_transfers(received, list(kv_connector_output.finished_sending or ()))

    def fetch_stage_counts(self) -> dict[str, int]:
        """How many requests are in each KV-fetch stage (vLLM's
        ``num_kv_fetch_reqs_by_stage``; zeros without ``log_stats``)."""
        counts = dict.fromkeys(KV_FETCH_STAGES, 0)
        for stage in (self._fetch_stages or {}).values():
            counts[stage] += 1
        return counts

    def _set_fetch_stage(self, req_id: str, stage: str | None) -> None:
        if self._fetch_stages is None:
            return
        if stage is None:
            self._fetch_stages.pop(req_id, None)
        else:
            self._fetch_stages[req_id] = stage

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


def failed_loads(core: llmsched.Scheduler, kv_connector_output: Any) -> list[str]:
    """The runner's failed loads (``failed_recving``, ``invalid_block_ids``) in the core,
    before the step's output is applied, as vLLM handles them, with or without a connector:
    recomputed, or, under vLLM's ``kv_load_failure_policy`` ``"fail"``, returned (their ids,
    once each) for :func:`finish_failed_loads` once the output is applied. A running
    request's failed block (a synchronous load) takes it back to its first failed block and
    drops the step's output for it (with a later step in flight that scheduled it, it
    starts over); a failed block over several groups raises
    ``UnsupportedConnectorUseError``, changing nothing."""
    failed = kv_connector_output.failed_recving
    invalid = kv_connector_output.invalid_block_ids
    if not failed and not invalid:
        return []
    try:
        failing = core.fail_kv_loads(failed or (), invalid or ())
    except llmsched.InvalidRequestError as exc:
        raise UnsupportedConnectorUseError(f"llmsched.vllm: {exc}") from None
    # vLLM finishes them as a set.
    return list(set(failing))


def finish_failed_loads(core: llmsched.Scheduler, failing: list[str]) -> bool:
    """Finish the requests :func:`failed_loads` returned with an error (True if any: the
    caller reports them)."""
    if not failing:
        return False
    core.finish_requests(failing, int(RequestStatus.FINISHED_ERROR))
    return True
