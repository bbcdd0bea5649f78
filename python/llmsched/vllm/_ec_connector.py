"""The scheduler's side of a vLLM encoder-cache connector (``ec_transfer_config``: encoder
disaggregation, where one instance encodes multimodal inputs and others load their outputs),
around the core.

The core asks the connector, in both loops, whether a request's encoder outputs are still in
transit (``ensure_cache_available``: the request is passed over) and, for an input a chunk
needs that is not in the encoder cache, whether the connector has its output
(``has_cache_item``: loaded, not encoded, and the step's encoder budget not charged).
Everything else is the connector's own work, called where vLLM's scheduler calls it:
``update_state_after_alloc`` for each input the step encodes or loads, request by request in
the step's order (those it encodes first), ``build_connector_meta`` on the finished
``SchedulerOutput``, ``update_state_after_free`` for each input a request's computed tokens
passed, ``take_unavailable_requests`` (those requests fail, as vLLM's do),
``update_connector_output`` with the runner's report, ``request_finished`` (its
``ec_transfer_params`` go with the request's final output), stats and
``has_pending_push_work``.

A connector's ``request_finished`` that asks to delay freeing the request's KV blocks is not
honoured (deviation 16 in ``docs/parity.md``): vLLM then holds them until a KV connector
reports them sent, which no connector does for a request it did not delay itself, so they
never come back; and the encoder outputs the connector may still be sending stay in the
encoder cache after the request ends either way.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus

import llmsched
from llmsched.vllm._config import read
from llmsched.vllm._requests import pinned

__all__ = ["EcConnectorSide", "make_ec_connector"]

logger = logging.getLogger(__name__)


def make_ec_connector(vllm_config: Any) -> Any:
    """The scheduler side of the engine's encoder-cache connector, as vLLM's scheduler makes
    it (None without ``ec_transfer_config``)."""
    if read(vllm_config, "ec_transfer_config") is None:
        return None
    return ECConnectorFactory.create_connector(config=vllm_config, role=ECConnectorRole.SCHEDULER)


class EcConnectorSide:
    """One engine's encoder-cache connector and what the plug-in does with it (see the
    module's doc). Passed to the core as its ``external_encoder``."""

    def __init__(self, connector: Any, core: llmsched.Scheduler, requests: dict[str, Request]):
        self.connector = connector
        self._core = core
        self._requests = requests
        self._warned_delay = False

    # -- the core's questions -----------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        return bool(self.connector.has_cache_item(identifier))

    def ensure_cache_available(self, snapshot: llmsched.Request, num_computed_tokens: int) -> bool:
        """Put to the connector with vLLM's ``Request``, which reads the snapshot meanwhile
        (the core is busy)."""
        request = self._requests[snapshot.request_id]
        with pinned(request, snapshot):
            return bool(self.connector.ensure_cache_available(request, num_computed_tokens))

    # -- the step and its output --------------------------------------------------------

    def scheduled(self, output: SchedulerOutput, core_out: llmsched.SchedulerOutput) -> None:
        """``update_state_after_alloc`` for each input the step encodes or loads, request by
        request in the step's order, the encoded ones first (as vLLM's loops call it); then
        the step's connector metadata."""
        encoded = zip(
            core_out.encoder_input_rows.tolist(), core_out.encoder_input_ids.tolist(), strict=True
        )
        loaded = zip(
            core_out.external_encoder_input_rows.tolist(),
            core_out.external_encoder_input_ids.tolist(),
            strict=True,
        )
        # Rows ascending in each; a stable sort by row keeps a row's encoded inputs first.
        allocated = sorted([*encoded, *loaded], key=lambda row_input: row_input[0])
        req_ids: list[str] = core_out.req_ids
        for row, input_id in allocated:
            self.connector.update_state_after_alloc(self._requests[req_ids[row]], input_id)
        output.ec_connector_metadata = self.connector.build_connector_meta(output)

    def passed_inputs(self) -> None:
        """``update_state_after_free`` for each input a request's computed tokens passed in
        the output just applied."""
        requests = self._requests
        for req_id, input_id in self._core.take_passed_encoder_inputs():
            self.connector.update_state_after_free(requests[req_id], input_id)

    def fail_unavailable(self) -> bool:
        """Finish with an error the requests whose encoder inputs the connector can no longer
        obtain (vLLM's ``take_unavailable_requests``; a client may issue them again). True if
        any finished: the caller reports them."""
        unavailable = [r for r in self.connector.take_unavailable_requests() if r in self._requests]
        if not unavailable:
            return False
        self._core.finish_requests(unavailable, int(RequestStatus.FINISHED_ERROR))
        return True

    def runner_reported(self, ec_connector_output: Any) -> None:
        """The runner's connector report, for the connector's own update."""
        if ec_connector_output:
            self.connector.update_connector_output(ec_connector_output)

    def finished(self, request: Request) -> dict[str, Any] | None:
        """vLLM's ``request_finished`` for a request the core just finished; returns its
        ``ec_transfer_params`` for its output."""
        delay, params = self.connector.request_finished(request)
        if delay and not self._warned_delay:
            self._warned_delay = True
            logger.warning(
                "llmsched.vllm: the encoder-cache connector %s asked to delay freeing the KV "
                "blocks of request %s; they are freed now (see deviation 16 in llmsched's "
                "docs/parity.md)",
                type(self.connector).__name__,
                request.request_id,
            )
        return None if params is None else dict(params)

    def stats(self, runner_stats: Any) -> Any:
        """The runner's connector stats with the scheduler side's, as vLLM aggregates them."""
        own = self.connector.get_ec_connector_stats()
        if own is None or own.is_empty():
            return runner_stats
        return own if runner_stats is None else runner_stats.aggregate(own)
