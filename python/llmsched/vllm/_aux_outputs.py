"""vLLM's auxiliary-output connector beside llmsched's core: ``--enable-return-routed-experts``
(the experts a mixture-of-experts model routed each token to, returned with the token, as
reinforcement-learning trainers replay them).

The connector (vLLM's ``AuxOutputSchedulerConnector``, at the scheduler's
``aux_output_connector``) keeps the outputs of the KV blocks it retains, so a prefix-cache
hit may reach only as far as it holds them. The core asks it where vLLM's loops ask
(``llmsched.Scheduler.schedule``'s and ``update_from_output``'s ``aux_outputs``,
answered by :class:`AuxOutputsSide`): how far a waiting request's hit may reach, what a KV
connector's load keeps, and, before a request's blocks are freed, its preemption or finish.
The plug-in tells it the rest as vLLM's scheduler does: loads started, each step's
metadata, each output's rows, requests finished between steps, a reset.

The connector reads the prefix cache by vLLM's block hashes
(``block_pool.get_cached_block``), which the core does not key it by: :class:`BlockNames`
pairs each vLLM hash it can be asked about with the core's hash of the same block (a
request's own, while the connector is told of it; those of the blocks it retains, learned
from its metadata, until it releases them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm.distributed.aux_output_connector.connector import AuxOutputConnectorMetadata
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

import llmsched
from llmsched.vllm._requests import as_during_step, before_step, pinned, record

__all__ = ["AuxOutputsSide", "BlockNames"]


def _names(request: Request, state: llmsched.Request) -> dict[Any, int]:
    """vLLM's hash of each of the request's full blocks, with the core's (none without
    prefix caching: then the core hashes no block, and caches none)."""
    core_hashes: list[int] = state.block_hashes
    if not core_hashes:
        return {}
    return dict(zip(request.block_hashes, core_hashes, strict=True))


class BlockNames:
    """The core's hash of each block the auxiliary-output connector can ask about, by
    vLLM's hash, and where the prefix cache is read now (the core between steps; mid-step,
    the ``llmsched.CachedBlocks`` the core gave the callback)."""

    def __init__(self, core: llmsched.Scheduler) -> None:
        self._core = core
        self.reader: Any = core
        # The request the connector is being asked or told about.
        self._asked: dict[Any, int] = {}
        # Requests told finished since the connector's last metadata: their blocks it
        # retained are named in that metadata.
        self._told: dict[Any, int] = {}
        self._retained: dict[Any, int] = {}

    def __len__(self) -> int:
        """How many hashes are named past the call in progress: those of requests told
        finished since the last metadata, and those of the blocks the connector retains."""
        return len(self._told.keys() | self._retained.keys())

    def cached_block(self, block_hash: Any, group: int) -> int | None:
        """The block cached under vLLM's ``block_hash`` in ``group``, or None (also for a
        hash never named)."""
        for names in (self._asked, self._told, self._retained):
            core_hash = names.get(block_hash)
            if core_hash is not None:
                block: int | None = self.reader.cached_block(core_hash, group)
                return block
        return None

    @contextmanager
    def about(self, request: Request, state: llmsched.Request, reader: Any) -> Iterator[None]:
        """While the connector is asked about ``request`` (whose core record is
        ``state``), reading the cache through ``reader``."""
        self._asked = _names(request, state)
        self.reader = reader
        try:
            yield
        finally:
            self._asked = {}
            self.reader = self._core

    def told_finished(self, request: Request, state: llmsched.Request) -> None:
        """The connector was told ``request`` finished (or was preempted): it may retain
        its blocks."""
        self._told.update(_names(request, state))

    def sent(self, metadata: Any) -> None:
        """The connector's metadata went out: the blocks it retained since the last one keep
        their names, those it released lose them. A block is retained only while it holds
        none and released only while it holds one, so each hash's events alternate: the
        count of retentions less releases says whether it ends held, whatever their order
        (a reset releases what a preemption just retained; an update can re-cache, and the
        connector retain again, a block it released)."""
        if isinstance(metadata, AuxOutputConnectorMetadata):
            held = Counter(metadata.retained_block_hashes or ())
            held.subtract(metadata.released_block_hashes or ())
            for block_hash, change in held.items():
                if change > 0 and block_hash in self._told:
                    self._retained[block_hash] = self._told[block_hash]
                elif change < 0:
                    self._retained.pop(block_hash, None)
        self._told = {}


class AuxOutputsSide:
    """The plug-in's side of the auxiliary-output connector: the core's questions (as
    ``schedule``'s ``aux_outputs``), answered by the connector with each request read as
    the core has it then, and what vLLM's scheduler tells the connector."""

    def __init__(
        self, core: llmsched.Scheduler, requests: dict[str, Request], names: BlockNames
    ) -> None:
        self._core = core
        self._requests = requests
        self._names = names
        #: The connector (None: no auxiliary outputs).
        self.connector: Any = None

    @property
    def for_core(self) -> AuxOutputsSide | None:
        """This side, as the core's ``aux_outputs``, while a connector is set."""
        return None if self.connector is None else self

    # -- the core's questions, mid-step or mid-update -----------------------------------

    def max_cache_hit(self, state: llmsched.Request, cache: llmsched.CachedBlocks) -> int:
        """How far ``state``'s prefix-cache hit may reach (tokens)."""
        with self._asked(state, cache) as request:
            hit: int = self.connector.max_cache_hit(request)
            return hit

    def cap_external_hit(
        self,
        state: llmsched.Request,
        num_local: int,
        num_external: int,
        cache: llmsched.CachedBlocks,
    ) -> int:
        """The tokens a KV connector loads past a local hit that are kept."""
        with self._asked(state, cache) as request:
            kept: int = self.connector.cap_external_hit(request, num_local, num_external)
            return kept

    def request_finished(self, state: llmsched.Request, cache: llmsched.CachedBlocks) -> None:
        """The running loop preempts ``state``'s request, or a runner's output finishes it
        (its blocks are not freed yet)."""
        with self._asked(state, cache) as request:
            self._tell_finished(request, state)

    @contextmanager
    def _asked(self, state: llmsched.Request, cache: Any) -> Iterator[Request]:
        request = self._requests[state.request_id]
        with pinned(request, state), self._names.about(request, state, cache):
            yield request

    # -- what the plug-in tells it ----------------------------------------------------

    def tell_finished(self, request: Request) -> None:
        """``request`` finished between the core's steps and updates (aborted, failed), or
        is about to be preempted by a reset."""
        state = record(request)
        with self._names.about(request, state, self._core):
            self._tell_finished(request, state)

    def _tell_finished(self, request: Request, state: llmsched.Request) -> None:
        self.connector.request_finished(request)
        self._names.told_finished(request, state)

    def scheduled(self, output: SchedulerOutput, core_out: llmsched.SchedulerOutput) -> None:
        """The step is built: the loads it started, then its metadata, built with the step's
        requests as they were before it, as vLLM's scheduler builds it."""
        connector = self.connector
        requests = self._requests
        for req_id, _num_external, _row in core_out.kv_loads:
            request = requests[req_id]
            connector.request_loading(request, request.num_computed_tokens)
        with as_during_step(before_step(requests, core_out, self._core.config.async_scheduling)):
            metadata = connector.build_connector_meta(output, requests)
        output.aux_output_connector_metadata = metadata
        self._names.sent(metadata)

    def take_output(self, request: Request, runner_output: Any) -> Any:
        """The rows of ``request``'s tokens in this output (its routed experts)."""
        return self.connector.take_output(request, runner_output)

    def reset(self) -> None:
        """The prefix cache was reset."""
        self.connector.reset()
