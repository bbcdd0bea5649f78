"""Multimodal inputs between vLLM and the core: a request's inputs as the core takes them,
and a step's encoder fields as vLLM's ``SchedulerOutput`` carries them.

The decisions (which inputs a step encodes, where a chunk stops before an input, what the
encoder cache evicts) are the core's; this module only converts. One thing is kept here:
which inputs' data the V2 model runner holds (``encoder_input_updates``), which is about
shipping vLLM's tensors to its workers, not about scheduling.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

import llmsched

__all__ = ["EncoderCacheView", "EncoderFields", "mm_inputs"]

try:
    from vllm.v1.core.sched.output import ScheduledEncoderInputStats
except ImportError:  # pragma: no cover - every tested vLLM has it
    ScheduledEncoderInputStats = None


def mm_inputs(request: Any) -> list[tuple[str, int, int, list[bool] | None]] | None:
    """``request``'s multimodal inputs as the core's ``add_request`` takes them: identifier,
    placeholder offset and length, and which placeholders carry an embedding."""
    if not request.mm_features:
        return None
    inputs: list[tuple[str, int, int, list[bool] | None]] = []
    for feature in request.mm_features:
        position = feature.mm_position
        is_embed = position.is_embed
        inputs.append(
            (
                feature.identifier,
                position.offset,
                position.length,
                None if is_embed is None else [bool(f) for f in is_embed.tolist()],
            )
        )
    return inputs


class EncoderFields:
    """Fills a step's encoder fields of vLLM's ``SchedulerOutput``: the inputs to encode, the
    encoder outputs to free, their stats (vLLM's ``scheduled_encoder_input_stats``, with
    ``log_stats`` and ``enable_logging_iteration_details``) and, for the V2 model runner,
    which inputs' data to install in the runner or drop (``encoder_input_updates``)."""

    def __init__(self, with_stats: bool) -> None:
        self.with_stats = with_stats and ScheduledEncoderInputStats is not None
        self.has_updates = "encoder_input_updates" in SchedulerOutput.__dataclass_fields__
        # Per request whose data the V2 runner was sent: the inputs it holds.
        self._installed: dict[str, set[int]] = {}

    def fill(
        self,
        output: SchedulerOutput,
        core_out: llmsched.SchedulerOutput,
        req_ids: list[str],
        requests: dict[str, Any],
        v2_runner: bool,
    ) -> None:
        for req_id in core_out.preempted_req_ids:
            self.forget(req_id)
        scheduled: dict[str, list[int]] = {}
        for row, input_id in zip(
            core_out.encoder_input_rows.tolist(), core_out.encoder_input_ids.tolist(), strict=True
        ):
            scheduled.setdefault(req_ids[row], []).append(input_id)
        output.scheduled_encoder_inputs = scheduled
        output.free_encoder_mm_hashes = core_out.freed_encoder_outputs
        if self.with_stats and scheduled:
            features = [
                requests[req_id].mm_features[i]
                for req_id, inputs in scheduled.items()
                for i in inputs
            ]
            output.scheduled_encoder_input_stats = ScheduledEncoderInputStats(
                num_inputs=len(features),
                output_tokens=sum(f.mm_position.get_num_embeds() for f in features),
            )
        if self.has_updates and v2_runner:
            output.encoder_input_updates = self._updates(output, scheduled, requests)

    def forget(self, req_id: str) -> None:
        """The request left the runner (finished or preempted): its data goes with it."""
        self._installed.pop(req_id, None)

    def _updates(
        self, output: SchedulerOutput, scheduled: dict[str, list[int]], requests: dict[str, Any]
    ) -> dict[str, dict[int, Any]]:
        """vLLM's V2-runner rule: a request installed in the step (new or resumed) holds the
        data of its inputs that carry it inline; an input encoded again is sent again; an
        input whose placeholders the request's confirmed tokens have passed is dropped."""
        for new in output.scheduled_new_reqs:
            if new.mm_features:
                self._installed[new.req_id] = {
                    i
                    for i, feature in enumerate(new.mm_features)
                    if feature.data is not None and "address" not in feature.data
                }
        updates: dict[str, dict[int, Any]] = {}
        for req_id in output.num_scheduled_tokens:
            held = self._installed.get(req_id)
            if held is None:
                continue
            encoding = scheduled.get(req_id, ())
            if not held and not encoding:
                continue
            request = requests[req_id]
            for i in encoding:
                data = request.mm_features[i].data
                if i not in held and data is not None and "address" not in data:
                    updates.setdefault(req_id, {})[i] = data
                    held.add(i)
            # Confirmed tokens: neither the step just scheduled nor unreturned outputs.
            confirmed = request.num_computed_tokens - max(
                request.num_output_placeholders, request.num_in_flight_tokens
            )
            for i in sorted(held):
                position = request.mm_features[i].mm_position
                if i not in encoding and position.offset + position.length <= confirmed:
                    updates.setdefault(req_id, {})[i] = None
                    held.remove(i)
        return updates


class EncoderCacheView:
    """The core's encoder cache as vLLM's scheduler shows its ``EncoderCacheManager``
    (``scheduler.encoder_cache_manager``): read-only, each attribute read from the core when
    accessed (a new object each time)."""

    def __init__(self, core: llmsched.Scheduler) -> None:
        self._core = core

    @property
    def cache_size(self) -> int:
        """The cache's size, in embeddings."""
        return self._core.config.encoder_cache_size

    @property
    def num_free_slots(self) -> int:
        return self._core.encoder_cache_state()[0]

    @property
    def num_freeable_slots(self) -> int:
        """Free slots plus those of outputs no request references."""
        return self._core.encoder_cache_state()[1]

    @property
    def cached(self) -> dict[str, set[str]]:
        """Each cached output's identifier, with the ids of the requests that reference it
        (none: it stays until its room is needed)."""
        entries, _ = self._core.encoder_cache_contents()
        return {identifier: set(holders) for identifier, _, holders in entries}

    def get_cached_input_ids(self, request: Request) -> set[int]:
        """The inputs of ``request`` (by index) whose outputs it references in the cache (a
        new set; empty for a request that is not live)."""
        try:
            return set(self._core.get_request(request.request_id).referenced_mm_inputs)
        except llmsched.UnknownRequestError:
            return set()

    @property
    def freeable(self) -> OrderedDict[str, int]:
        """The outputs no request references, oldest (first evicted) first, with their
        embeddings."""
        entries, freeable = self._core.encoder_cache_contents()
        num_embeds = {identifier: n for identifier, n, _ in entries}
        return OrderedDict((identifier, num_embeds[identifier]) for identifier in freeable)
