"""vLLM's KV cache events, from the core's.

The core records what happened to the prefix cache (``llmsched.Scheduler.take_kv_events``),
naming blocks by id and requests by id; vLLM's events name blocks by the engine's block
hashes (those of the engine's ``Request.block_hashes``, which the core does not compute;
the plug-in's requests bring them up to their tokens when read)
and carry the tokens and extra keys each hash covers. :class:`KvEvents` turns the one into
the other, in the core's order, and publishes them through the publisher vLLM's scheduler
would create, once per ``update_from_output`` as vLLM's scheduler does. Only with
``kv_events_config.enable_kv_cache_events``: otherwise the plug-in makes none of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVCacheEvent,
    KVEventBatch,
)
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)
from vllm.v1.kv_cache_interface import (
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.request import Request

__all__ = ["KvEvents", "make_publisher", "publish_events"]


def make_publisher(kv_events_config: Any, data_parallel_index: int) -> Any:
    """The publisher vLLM's scheduler creates for an engine (a no-op one when events are
    off)."""
    return EventPublisherFactory.create(kv_events_config, data_parallel_index)


def publish_events(publisher: Any, events: list[Any]) -> None:
    """``events`` as one batch (none: nothing sent)."""
    if events:
        publisher.publish(KVEventBatch(ts=time.time(), events=events))


class KvEvents:
    """The engine's KV cache events, built from the core's as they are taken."""

    def __init__(self, kv_cache_config: Any, block_size: int, hash_lookahead: int) -> None:
        # vLLM's KV cache manager annotates each stored event with its group's kind.
        specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]
        self._spec_kinds: list[str] = [get_kv_cache_spec_kind(spec).value for spec in specs]
        self._sliding_windows = [get_kv_cache_spec_sliding_window(spec) for spec in specs]
        self._block_size = block_size
        # The tokens after a block that its hash covers (lookahead hashes; 0: none).
        self._hash_lookahead = hash_lookahead
        # The hash each cached block was stored under, to name it when it is removed.
        self._stored_as: dict[int, Any] = {}
        self._pending: list[KVCacheEvent] = []

    def take(self, core_events: list[Any], requests: Mapping[str, Request]) -> None:
        """Builds vLLM's events for ``core_events`` (``take_kv_events``), whose requests
        ``requests`` holds (a request a step's output finished is still there, frozen)."""
        for event in core_events:
            kind = event[0]
            if kind == "stored":
                _, req_id, first_block, blocks, group = event
                self._pending.append(self._stored(requests[req_id], first_block, blocks, group))
            elif kind == "removed":
                _, block, group = event
                self._pending.append(
                    BlockRemoved(
                        block_hashes=[self._stored_as.pop(block)],
                        medium=MEDIUM_GPU,
                        group_idx=group,
                    )
                )
            elif kind == "reused":
                _, req_id, num_blocks, group = event
                self._pending.append(self._reused(requests[req_id], num_blocks, group))
            else:
                self._stored_as.clear()
                self._pending.append(AllBlocksCleared())

    def publish(self, publisher: Any, connector_events: Sequence[Any] = ()) -> None:
        """Sends the events built since the last call, then a KV connector's
        (``take_events``), as one batch (none: nothing), as vLLM's scheduler does."""
        events, self._pending = self._pending, []
        publish_events(publisher, [*events, *connector_events])

    def _stored(
        self, request: Request, first_block: int, blocks: list[int], group: int
    ) -> BlockStored:
        """vLLM's event of blocks entering the cache: the tokens of the whole range, the
        hashes and extra keys of the blocks that entered (a sliding window's others, 0 in
        ``blocks``, did not), the parent the range's previous block, cached or not."""
        hashes = request.block_hashes
        end_block = first_block + len(blocks)
        entered = [i for i, block in enumerate(blocks, first_block) if block]
        external = [maybe_convert_block_hash(hashes[i]) for i in entered]
        self._stored_as.update(zip([block for block in blocks if block], external, strict=True))
        parent = None if first_block == 0 else maybe_convert_block_hash(hashes[first_block - 1])
        return self._event(request, external, parent, (first_block, end_block), entered, group)

    def _reused(self, request: Request, num_blocks: int, group: int) -> BlockStored:
        """vLLM's report of a prefix hit (``kv_cache_report_mode="full"``): the hit blocks,
        as if stored again (a sliding window's skipped blocks too)."""
        hashes = request.block_hashes
        external = [maybe_convert_block_hash(h) for h in hashes[:num_blocks]]
        return self._event(request, external, None, (0, num_blocks), range(num_blocks), group)

    def _event(
        self,
        request: Request,
        hashes: list[Any],
        parent: Any,
        token_blocks: tuple[int, int],
        keyed_blocks: Sequence[int],
        group: int,
    ) -> BlockStored:
        bs = self._block_size
        first_block, end_block = token_blocks
        lora = request.lora_request
        event = BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[first_block * bs : end_block * bs],
            block_size=bs,
            lora_id=None if lora is None else lora.adapter_id,
            medium=MEDIUM_GPU,
            lora_name=None if lora is None else lora.name,
            extra_keys=to_event_extra_keys(
                generate_block_hash_extra_keys(request, i * bs, (i + 1) * bs, 0)[0]
                for i in keyed_blocks
            ),
            group_idx=group,
            session_id=request.session_id,
        )
        event.kv_cache_spec_kind = self._spec_kinds[group]
        event.kv_cache_spec_sliding_window = self._sliding_windows[group]
        if self._hash_lookahead:
            tokens = request.all_token_ids
            event.lookahead_token_ids = [
                tokens[(i + 1) * bs : (i + 1) * bs + self._hash_lookahead] for i in keyed_blocks
            ]
        return event
