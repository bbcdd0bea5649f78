"""A KV connector for the parity matrix (imports vLLM): the same external hits on every side.

:class:`ParityConnector` is a vLLM ``KVConnectorBase_V1`` whose scheduler side plays a
store like vLLM's ``ExampleConnector``, without files: a request whose prompt the store
"holds" (:func:`stored`, a rule on its tokens) can load every whole block of its prompt but
the one holding its last token, synchronously; ``build_connector_meta`` lists, per step, the
requests that load and the blocks they load into (plain data, compared field by field).
It also sends the KV of some finished requests (:func:`sends`): ``request_finished`` keeps
their blocks and returns their block ids as ``kv_transfer_params``, and the engine (the
harness) reports them sent with the next runner output (:meth:`ParityConnector.take_sent`);
each one sent becomes a KV event of the connector's (``take_events``). While some are being
sent, it answers ``has_pending_block_frees`` true: the running loop preempts no request
for blocks then.
:class:`AsyncParityConnector` loads half the prompts its store holds across steps
(:func:`loads_async`), whole, as a P/D transfer does: the requests wait in
``WAITING_FOR_REMOTE_KVS`` until the engine reports their loads received with the runner
output of the step that started them (:meth:`ParityConnector.take_received`); some of those
loads fail (:func:`load_failure`: a request's first load only), whole or from a block on,
reported in the same output (:meth:`ParityConnector.take_failed`). Under sync scheduling,
some synchronous loads fail from a block on too (:func:`sync_load_fails`), reported with
the output of the step that loaded.
vLLM's scheduler and the plug-in load it by ``kv_connector_module_path``; llmsched's own
side asks :func:`matched_tokens` through ``schedule(external_kv=...)`` and holds the blocks
of the requests :func:`sends` names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import BlockRemoved
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)

MODULE = __name__
NAME = "ParityConnector"


def stored(prompt: Any) -> bool:
    """Whether the store holds ``prompt`` (about one prompt in three, by its tokens)."""
    return (int(prompt[0]) + len(prompt)) % 3 == 0


def loads_async(prompt: Any) -> bool:
    """Whether an asynchronous store loads ``prompt`` across steps (half those it holds)."""
    return stored(prompt) and (int(prompt[-1]) + len(prompt)) % 2 == 0


def load_failure(prompt: Any, num_groups: int = 1) -> str | None:
    """How an asynchronous load of ``prompt`` fails: ``"whole"`` (``failed_recving``),
    ``"block"`` (its middle block in ``invalid_block_ids``), or None (it loads). Over
    several KV-cache groups a block id names one group's block, and a load fails whole
    (vLLM takes failed loads by request then)."""
    failure = {0: "whole", 1: "block"}.get((int(prompt[0]) * 7 + len(prompt)) % 5)
    return "whole" if failure == "block" and num_groups > 1 else failure


def sync_load_fails(prompt: Any, num_groups: int = 1) -> bool:
    """Whether a synchronous load of ``prompt`` fails from a block on (one in four; a
    request's first load only, under sync scheduling only: with steps overlapping, a
    synchronous load's failure is not served; one KV-cache group only, see
    :func:`load_failure`)."""
    return num_groups == 1 and (int(prompt[len(prompt) // 2]) + 5 * len(prompt)) % 4 == 0


def failed_block(block_ids: list[int]) -> int:
    """The block reported invalid when a load fails from a block on: its middle one."""
    return block_ids[len(block_ids) // 2]


def matched_tokens(
    prompt: Any, block_size: int, num_local: int, async_loads: bool = False
) -> tuple[int, bool]:
    """Tokens past ``num_local`` the store loads for a request with ``prompt``, and whether
    across steps: with ``async_loads``, every prompt token of those :func:`loads_async`
    names (none left: no load); otherwise its whole blocks before the last token's
    (``ExampleConnector``'s reach), or none."""
    if not stored(prompt):
        return 0, False
    if async_loads and loads_async(prompt):
        tokens = max(len(prompt) - num_local, 0)
        return tokens, tokens > 0
    reach = (len(prompt) - 1) // block_size * block_size
    return max(reach - num_local, 0), False


def sends(prompt: Any) -> bool:
    """Whether a finished request's KV is sent before its blocks are freed (about one prompt
    in three, none the store holds)."""
    return not stored(prompt) and (int(prompt[-1]) + len(prompt)) % 2 == 0


@dataclass
class ParityConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """The step's loads: ``(request id, blocks per KV-cache group, tokens)`` per loading
    request; and what the
    connector read of the requests when the scheduler called it: per
    ``update_state_after_alloc``, ``("alloc", id, num_computed_tokens, status, tokens)``, and
    in ``build_connector_meta``, per scheduled request it was asked about,
    ``("meta", id, num_computed_tokens, num_output_placeholders)``."""

    loads: list[tuple[str, list[list[int]], int]] = field(default_factory=list)
    seen: list[tuple[Any, ...]] = field(default_factory=list)


class ParityConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """See the module's doc. The worker side does nothing (no engine runs the model). It
    serves several KV-cache groups (``SupportsHMA``): what it loads and sends is every
    group's blocks."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = vllm_config.cache_config.block_size
        self._num_groups = 1 if kv_cache_config is None else len(kv_cache_config.kv_cache_groups)
        self._fails_sync_loads = not vllm_config.scheduler_config.async_scheduling
        self._loading: dict[str, tuple[list[list[int]], int]] = {}
        self._sending: list[str] = []
        self._receiving: list[str] = []
        self._failed: list[str] = []
        self._invalid: list[int] = []
        self._failed_once: set[str] = set()
        self._loads_started: list[str] = []
        self._answered_async: dict[str, bool] = {}
        # The requests it was asked about (every admitted one), and what it read since the
        # last metadata.
        self._asked: dict[str, Any] = {}
        self._seen: list[tuple[Any, ...]] = []
        self._events: list[Any] = []

    async_loads = False

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        tokens, load_async = matched_tokens(
            request.prompt_token_ids, self._block_size, num_computed_tokens, self.async_loads
        )
        # The allocation that follows this answer (if any) starts the load it names.
        self._answered_async[request.request_id] = load_async
        self._asked[request.request_id] = request
        return tokens, load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._seen.append(
            (
                "alloc",
                request.request_id,
                request.num_computed_tokens,
                request.status.name,
                num_external_tokens,
            )
        )
        load_async = self._answered_async.pop(request.request_id, False)
        if num_external_tokens > 0:
            self._loading[request.request_id] = (
                [list(group) for group in blocks.get_block_ids()],
                num_external_tokens,
            )
            if load_async:
                self._receiving.append(request.request_id)
                self._loads_started.append(request.request_id)
                # A request's first load fails by the rule; its next one loads.
                failure = None
                if request.request_id not in self._failed_once:
                    failure = load_failure(request.prompt_token_ids, self._num_groups)
                if failure is not None:
                    self._failed_once.add(request.request_id)
                if failure == "whole":
                    self._failed.append(request.request_id)
                elif failure == "block":
                    self._invalid.append(failed_block(list(blocks.get_block_ids()[0])))
            elif (
                self._fails_sync_loads
                and request.request_id not in self._failed_once
                and sync_load_fails(request.prompt_token_ids, self._num_groups)
            ):
                self._failed_once.add(request.request_id)
                self._invalid.append(failed_block(list(blocks.get_block_ids()[0])))

    def build_connector_meta(self, scheduler_output: Any) -> ParityConnectorMetadata:
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self._asked.get(req_id)
            if request is not None:
                self._seen.append(
                    (
                        "meta",
                        req_id,
                        request.num_computed_tokens,
                        request.num_output_placeholders,
                    )
                )
        meta = ParityConnectorMetadata(
            [(req_id, blocks, tokens) for req_id, (blocks, tokens) in self._loading.items()],
            self._seen,
        )
        self._loading.clear()
        self._seen = []
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Any]:
        self._asked.pop(request.request_id, None)
        if not sends(request.prompt_token_ids):
            return False, None
        self._sending.append(request.request_id)
        return True, {"sent_blocks": [list(group) for group in block_ids]}

    def has_pending_block_frees(self) -> bool:
        """Whether KV it is sending will give blocks back (at the next output): vLLM's running
        loop then preempts no request for blocks."""
        return bool(self._sending)

    def take_sent(self) -> list[str]:
        """The requests whose KV has been sent since the last call (all those finished)."""
        sent, self._sending = self._sending, []
        self._events.extend(
            BlockRemoved(block_hashes=[len(req_id)], medium="CPU") for req_id in sent
        )
        return sent

    def take_received(self) -> list[str]:
        """The requests whose asynchronous loads are in since the last call (all started)."""
        received, self._receiving = self._receiving, []
        return received

    def take_failed(self) -> tuple[list[str], list[int]]:
        """The loads that failed whole and the blocks of those that failed from a block on,
        since the last call (reported with the same output as their loads)."""
        failed, invalid = self._failed, self._invalid
        self._failed, self._invalid = [], []
        return failed, invalid

    def take_loads_started(self) -> list[str]:
        """The requests whose loads across steps started since the last call, in order."""
        started, self._loads_started = self._loads_started, []
        return started

    def take_events(self) -> list[Any]:
        """A KV event per request sent (published after the cache's own, in vLLM's order)."""
        events, self._events = self._events, []
        return events

    # The worker side: nothing to move.
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


class AsyncParityConnector(ParityConnector):
    """The parity connector with loads across steps (see the module's doc)."""

    async_loads = True


class BlockwiseAsyncParityConnector(AsyncParityConnector):
    """Loads across steps as :class:`AsyncParityConnector`, but only the prompt's whole
    blocks before its last token's, as :class:`ParityConnector` reaches: what an
    auxiliary-output connector (routed experts) lets load, since it holds outputs of whole
    blocks only, and never of a prompt's last token."""

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        tokens, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if load_async:
            reach = (len(request.prompt_token_ids) - 1) // self._block_size * self._block_size
            tokens = max(reach - num_computed_tokens, 0)
            load_async = tokens > 0
            self._answered_async[request.request_id] = load_async
        return tokens, load_async
