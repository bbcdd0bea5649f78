"""Type stubs of the Rust extension ``llmsched._core``.

Signatures are written here and checked against the compiled module by ``mypy.stubtest``
(``make stubtest``); docstrings are the compiled module's own, copied by
``python -m tests.stub_docs`` and held equal by ``tests/test_docstrings.py``. Import these
names from ``llmsched``, not from here.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, final, overload

import numpy as np
import numpy.typing as npt

from llmsched.status import RequestStatus

_Int32Array = npt.NDArray[np.int32]
_KvEvent: TypeAlias = (
    tuple[Literal["stored"], str, int, list[int], int]
    | tuple[Literal["reused"], str, int, int]
    | tuple[Literal["removed"], int, int]
    | tuple[Literal["cleared"]]
)

__all__ = [
    "BATCH_QUEUE_SIZE",
    "COST_TERMS",
    "MAX_IDLE_STEPS",
    "MOONCAKE_BLOCK_TOKENS",
    "REQUEST_STATUSES",
    "CachedBlocks",
    "ConfigError",
    "DuplicateRequestError",
    "InternalError",
    "InvalidRequestError",
    "InvariantError",
    "LlmschedError",
    "OutputMismatchError",
    "ReentrantCallError",
    "Replay",
    "Request",
    "RequestOutput",
    "RequestOutputs",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "UnknownRequestError",
    "__version__",
    "prompt_token_ids",
    "step_shape",
]

__version__: Final[str]
REQUEST_STATUSES: Final[tuple[tuple[str, int, str | None], ...]]
"""Every request status as ``(name, value, finish reason)``, in value order: the
declaration ``llmsched.RequestStatus`` is checked against."""
BATCH_QUEUE_SIZE: Final[int]
"""Steps in flight under async scheduling in the core's replay (vLLM's batch queue)."""
MAX_IDLE_STEPS: Final[int]
"""The core's replay stops after this many steps in a row that schedule nothing while
nothing is in flight."""
COST_TERMS: Final[tuple[str, ...]]
"""The step-cost model's terms, in the core's order (``llmsched.sim.cost.TERMS``)."""
MOONCAKE_BLOCK_TOKENS: Final[int]
"""Tokens per ``hash_ids`` block of a Mooncake trace's prompt."""

class LlmschedError(Exception):
    """Base class of every error llmsched raises on purpose."""

class ConfigError(LlmschedError, ValueError):
    """An invalid ``SchedulerConfig`` field or combination of fields."""

class InvalidRequestError(LlmschedError, ValueError):
    """A bad argument to a request-level call (``add_request`` and friends)."""

class DuplicateRequestError(InvalidRequestError):
    """``add_request`` with the id of a request that is still live."""

class UnknownRequestError(LlmschedError, KeyError):
    """A request id that is not live (never added, or already finished)."""

class OutputMismatchError(LlmschedError, ValueError):
    """A runner output that does not match the scheduler output it answers, or a scheduler output
    applied twice or out of order."""

class InvariantError(LlmschedError, AssertionError):
    """``Scheduler.check_invariants`` found a broken invariant."""

class ReentrantCallError(LlmschedError, RuntimeError):
    """A ``Scheduler`` method called while the same thread is already inside a call on that
    scheduler (from a finalizer, a signal handler or a callback). The inner call is refused
    and changes nothing; the outer call completes."""

class InternalError(LlmschedError, RuntimeError):
    """A bug inside llmsched. The scheduler refuses further calls after one."""

@final
class SchedulerConfig:
    """The validated configuration of a scheduler. Immutable.

    Every field is a keyword argument and a read-only property (see each property's
    documentation); a derived field left to None reads as the value it derives.
    ``replace(**changes)`` makes a new validated config.

    This object is the one home of ``max_model_len``: the scheduler, the
    simulated runner and the engine all read it from here."""

    def __new__(
        cls,
        *,
        max_model_len: int = 2048,
        max_num_seqs: int = 128,
        max_num_batched_tokens: int = 2048,
        max_num_scheduled_tokens: int | None = None,
        max_num_active_seqs: int | None = None,
        block_size: int = 16,
        num_gpu_blocks: int = 10000,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        long_prefill_token_threshold_adaptive: bool = False,
        num_speculative_tokens: int = 0,
        num_lookahead_tokens: int = 0,
        max_num_new_slots_for_drafting: int = 0,
        num_hash_lookahead_tokens: int = 0,
        eagle_block_drop: bool = False,
        pad_spec_decode: bool = True,
        num_sampled_tokens_per_step: int = 1,
        async_scheduling: bool = True,
        pipeline_parallel_size: int = 1,
        watermark: float = 0.0,
        scheduler_reserve_full_isl: bool = True,
        enable_prefix_caching: bool = True,
        enable_kv_cache_events: bool = False,
        kv_cache_metrics_sample: float = 0.0,
        kv_connector: bool = False,
        ec_connector: bool = False,
        preemption_drops_in_flight_output: bool = False,
        defer_block_free: bool = False,
        recompute_kv_load_failures: bool = True,
        policy: str = "fcfs",
        max_loras: int = 0,
        max_num_encoder_input_tokens: int = 0,
        encoder_cache_size: int = 0,
        disable_chunked_mm_input: bool = False,
        mm_encoder_only: bool = False,
        num_prefill_lookahead_tokens: int = 0,
        kv_cache_groups: str = "full",
        prefix_cache_retention_interval: int = 0,
        mamba_prefill_checkpoint_alignment: int = 0,
        prefill_schedule_interval: int = 1,
    ) -> SchedulerConfig: ...
    @property
    def max_model_len(self) -> int:
        """``M``: the most tokens a request may hold, prompt and output. Every scheduled
        request keeps ``C + n + s <= M``."""
    @property
    def max_num_seqs(self) -> int:
        """The most requests running at once."""
    @property
    def max_num_batched_tokens(self) -> int:
        """The input budget of a step: scheduled tokens plus draft slots."""
    @property
    def max_num_scheduled_tokens(self) -> int:
        """The token budget of a step; None takes ``max_num_batched_tokens``."""
    @property
    def max_num_active_seqs(self) -> int:
        """The most requests the waiting loop lets run; None takes ``max_num_seqs``."""
    @property
    def block_size(self) -> int:
        """``B``: tokens per KV block."""
    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks in the pool; block 0 is the null block, never allocated."""
    @property
    def enable_chunked_prefill(self) -> bool:
        """Split a prompt over several steps when it does not fit a step's budget."""
    @property
    def long_prefill_token_threshold(self) -> int:
        """Caps a prefill chunk while more than one request is eligible (0: no cap)."""
    @property
    def long_prefill_token_threshold_adaptive(self) -> bool:
        """Raise that cap to ``max_num_batched_tokens // eligible requests`` when larger."""
    @property
    def num_speculative_tokens(self) -> int:
        """``K``: draft tokens per decode step (0: no speculative decoding); a diffusion
        model's canvas (``s`` 0): the positions a step denoises."""
    @property
    def num_lookahead_tokens(self) -> int:
        """``L``: KV slots reserved ahead of the drafts for the drafter."""
    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Input-budget slots charged per scheduled request for the drafter's tokens."""
    @property
    def num_hash_lookahead_tokens(self) -> int:
        """Tokens after each block that the block's prefix-cache hash also covers
        (vLLM's lookahead block hashes: 1 for an EAGLE drafter, whose KV at a
        block's last position depends on the next token). A block enters the
        cache, and can be hit, only once those tokens exist and match."""
    @property
    def eagle_block_drop(self) -> bool:
        """A prefix hit gives back its last block, to be recomputed for the drafter
        (vLLM's EAGLE block drop, used where lookahead hashes are off)."""
    @property
    def pad_spec_decode(self) -> bool:
        """Pad a one-token admission to the uniform decode shape ``1 + K`` (within the
        capacity rule); vLLM does not where ``K`` follows the batch size (dynamic
        speculative decoding)."""
    @property
    def num_sampled_tokens_per_step(self) -> int:
        """``s``: tokens sampled per step: 1 for generation, 0 for pooling and for a
        diffusion LLM (with ``num_speculative_tokens``, its canvas: a step's drafts
        are its canvas positions, the tokens it emits accepted drafts)."""
    @property
    def async_scheduling(self) -> bool:
        """Schedule a step before the previous one's output returns (placeholders)."""
    @property
    def pipeline_parallel_size(self) -> int:
        """Pipeline stages: steps in flight at once in a synchronous engine (vLLM's
        batch queue); with async scheduling, one more than one stage needs."""
    @property
    def watermark(self) -> float:
        """Fraction of the KV pool, in [0, 1), kept free when admitting a request
        while others run."""
    @property
    def scheduler_reserve_full_isl(self) -> bool:
        """Admit a request only if the free blocks can hold its whole sequence."""
    @property
    def enable_prefix_caching(self) -> bool:
        """Reuse the KV blocks of identical prompt prefixes."""
    @property
    def enable_kv_cache_events(self) -> bool:
        """Record the prefix cache's changes (blocks stored, reused, removed, all
        cleared) for ``take_kv_events``: vLLM's KV cache events."""
    @property
    def kv_cache_metrics_sample(self) -> float:
        """The fraction, in [0, 1], of the KV blocks the pool hands out whose residency
        is followed until they are evicted (vLLM's ``kv_cache_metrics_sample`` with
        ``kv_cache_metrics`` on); ``take_kv_cache_eviction_events`` reports each
        (0: off)."""
    @property
    def kv_connector(self) -> bool:
        """A KV connector serves this engine (vLLM's ``kv_transfer_config``): a waiting
        request asks it, through ``schedule``'s external KV source, for tokens past its
        prefix-cache hit, and a finished request keeps its KV blocks until
        ``release_kv_blocks`` (the connector may still be sending them)."""
    @property
    def ec_connector(self) -> bool:
        """An encoder-cache connector serves this engine (vLLM's
        ``ec_transfer_config``): the loops ask it, through ``schedule``'s external
        encoder source, which inputs' encoder outputs it loads instead of the encoder
        computing them, and pass over a request whose outputs are still in transit;
        the inputs a request's computed tokens pass are reported for it
        (``take_passed_encoder_inputs``)."""
    @property
    def preemption_drops_in_flight_output(self) -> bool:
        """A request the running loop preempts for KV drops the output of its steps in
        flight, to be recomputed (vLLM's ``requires_kv_delivery``, a KV connector that
        hands finished requests' KV off: a producer's), instead of delivering it."""
    @property
    def defer_block_free(self) -> bool:
        """Blocks a freed or preempted request held return to the pool only once every
        step scheduled by then has its output applied, since a step in flight may
        still write them (vLLM's ``defer_block_free``: on with a KV connector that
        loads, a consumer's, and several steps in flight, where a load could fill
        such a block again; allowed without one, as vLLM's attribute is)."""
    @property
    def recompute_kv_load_failures(self) -> bool:
        """A KV connector's failed load (reported by the runner) is recomputed: the
        request keeps the tokens before the first failed block and computes the rest
        (vLLM's ``kv_load_failure_policy`` ``"recompute"``); False fails the request
        (``"fail"``)."""
    @property
    def policy(self) -> str:
        """``"fcfs"``, or ``"priority"`` (lower value first, then arrival)."""
    @property
    def max_loras(self) -> int:
        """The most LoRA adapters the running requests may use together; a waiting
        request under another adapter waits (0: LoRA off, requests name none)."""
    @property
    def max_num_encoder_input_tokens(self) -> int:
        """The encoder compute budget: the most embeddings of multimodal inputs one
        step encodes (vLLM's ``max_num_encoder_input_tokens`` as its
        ``MultiModalBudget`` derives it; 0: multimodal inputs off)."""
    @property
    def encoder_cache_size(self) -> int:
        """The encoder cache's size, in embeddings (vLLM's ``encoder_cache_size`` as
        its ``MultiModalBudget`` derives it; 0 exactly when the budget is 0)."""
    @property
    def disable_chunked_mm_input(self) -> bool:
        """A chunk never ends inside a multimodal input's placeholders that it starts
        at or before: it stops before the input instead."""
    @property
    def is_diffusion(self) -> bool:
        """A diffusion LLM: nothing sampled (``num_sampled_tokens_per_step`` 0) but a
        canvas of ``num_speculative_tokens`` positions each step denoises, scheduled
        as drafts; the positions a step emits are its tokens."""
    @property
    def max_request_len(self) -> int:
        """The longest a request grows: ``max_model_len``, or less when the KV pool's
        ``num_gpu_blocks - 1`` usable blocks cannot hold a request that long (every
        KV-cache group counted; with a KV connector and drafts, a load of all its
        tokens beside a speculative step's blocks). A request stops there,
        ``FINISHED_LENGTH_CAPPED``, as at ``max_model_len``, and no step takes it
        past: a request alone always fits the pool. A longer prompt is refused at
        ``add_request``."""
    @property
    def mm_encoder_only(self) -> bool:
        """A multimodal encoder instance (vLLM's ``mm_encoder_only``, disaggregated
        encoding): it runs the encoder and publishes the embeddings instead of
        sampling, so a request stops once its whole prompt is computed, and a prompt
        longer than a step's budget is split over steps even with
        ``enable_chunked_prefill`` off (vLLM turns it off for an engine without a
        KV cache, which such an instance is)."""
    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prompt tokens past the computed ones a drafter reads (vLLM's
        ``num_prefill_lookahead_tokens``: 1 for EAGLE, ``K`` for a multi-module MTP
        drafter, 0 without): encoder inputs are scheduled that far ahead of a chunk, a
        chunk never ends fewer than that many tokens before the prompt's end, and the
        last that many less one computed tokens are not cached (the drafter may
        compute them again)."""
    @property
    def kv_cache_groups(self) -> str:
        """The KV-cache groups the pool serves, in vLLM's order, comma-separated:
        ``full``, ``sliding_window:W`` (a window of W tokens), ``chunked_local:C``
        (attention within chunks of C tokens) or ``mamba`` (a recurrent state: ``1 + K``
        blocks per request with prefix caching off; with it on, the state at each
        block boundary is cached, vLLM's ``mamba_cache_mode`` "align") each, followed by
        ``+eagle``
        where the group holds a drafter's layers (``eagle_block_drop`` then applies to
        the kinds of the groups so marked, to every group if none is). A hybrid model
        (sliding-window, chunked local or Mamba layers beside full ones) has several;
        a model without a KV cache (an encoder-only model, a multimodal encoder
        instance) none, ``""``: its requests hold no block, and its pool is the null
        block alone (``num_gpu_blocks`` 1 suffices)."""
    @property
    def prefix_cache_retention_interval(self) -> int:
        """Which blocks of a sliding-window group, and which aligned Mamba states, enter
        the prefix cache (vLLM's ``prefix_cache_retention_interval``): 0 keeps only
        those a resend of the prompt (or a shared prefix) can hit; a multiple of
        ``block_size`` also keeps the window's blocks, and the state, at every such
        interval (``block_size``: every block)."""
    @property
    def mamba_prefill_checkpoint_alignment(self) -> int:
        """With Mamba groups and prefix caching (their state cached at block
        boundaries): 0, a Mamba layer writes its state only where a step ends; A > 0,
        each Mamba group also holds a prefill checkpoint block, into which a prompt's
        last chunk writes the state at its last block boundary from inside the step
        when that boundary lies a multiple of A tokens past the chunk's start, so the
        chunk is not split there (vLLM's ``MambaSpec.num_prefill_checkpoint_blocks``
        1 with ``prefill_checkpoint_alignment`` A: Mamba2 and gated DeltaNet layers)."""
    @property
    def prefill_schedule_interval(self) -> int:
        """Prefill cadence: while a request decodes, prefill (admissions and running
        prompt chunks) runs only once this many executed steps have passed since
        the last step that carried prefill, unless the waiting requests outgrew
        the last prefill step (1: every step)."""
    def replace(self, **changes: Any) -> SchedulerConfig:
        """A new validated config with ``changes`` applied."""
    def to_dict(self) -> dict[str, Any]:
        """Every field with its resolved value."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[Any, tuple[()]]: ...

@final
class SchedulerOutput:
    """What one ``schedule()`` step decided. Immutable.

    Every array is int32, built in Rust and moved into numpy without a copy;
    arrays are read-only (every empty one is the same shared array). Per-request
    arrays are aligned with ``req_ids``: running requests first (in running
    order), then this step's admissions."""

    @property
    def step_id(self) -> int:
        """The step's number, counting from 1; its output must be applied in this order."""
    @property
    def req_ids(self) -> list[str]:
        """The scheduled requests, in the order of the per-request arrays."""
    @property
    def num_scheduled_tokens(self) -> _Int32Array:
        """``n`` per request: tokens to compute in this step (>= 1)."""
    @property
    def num_computed_tokens(self) -> _Int32Array:
        """``C`` per request before this step (prefix hits included)."""
    @property
    def num_spec_tokens(self) -> _Int32Array:
        """Draft slots scheduled per request (0 if none)."""
    @property
    def spec_token_ids(self) -> _Int32Array:
        """All scheduled drafts, flat, split by ``num_spec_tokens``; -1 is a placeholder."""
    @property
    def num_output_tokens(self) -> _Int32Array:
        """Output tokens per request before this step, placeholders included."""
    @property
    def num_block_ids(self) -> _Int32Array:
        """Block ids per request in ``block_ids``: the whole table for new and
        resumed requests (replace), the newly allocated blocks otherwise (append).
        With several KV-cache groups, one run of counts per group, group after
        group (``len(req_ids)`` each)."""
    @property
    def block_ids(self) -> _Int32Array:
        """The block ids counted by ``num_block_ids``, flat; a sliding-window
        group's table holds the null block (0) where blocks left the window."""
    @property
    def num_all_token_ids(self) -> _Int32Array:
        """For new and resumed requests, how many tokens they hold (prompt and
        outputs so far); 0 for the others."""
    @property
    def all_token_ids(self) -> _Int32Array:
        """The tokens counted by ``num_all_token_ids``, flat."""
    @property
    def lora_ids(self) -> _Int32Array:
        """The LoRA adapters of the scheduled requests, ascending, each once (at most
        ``max_loras``; empty without LoRA). Not per request."""
    @property
    def structured_output_rows(self) -> _Int32Array:
        """The rows (indices into ``req_ids``) whose sampled token a grammar constrains:
        structured-output requests whose chunk reaches the end of their tokens, ascending
        (the rows of the step's grammar bitmask). Empty while no request uses structured
        output."""
    @property
    def new_block_ids_to_zero(self) -> _Int32Array:
        """With Mamba KV-cache groups, the attention groups' blocks allocated since the
        previous step, group after group, which the runner zeroes before use (vLLM's
        ``new_block_ids_to_zero``). Empty without Mamba groups. Not per request."""
    @property
    def num_new_token_ids(self) -> _Int32Array:
        """With pipeline stages and synchronous scheduling, each row's count of tokens in
        ``new_token_ids`` (``n`` less its draft slots); empty otherwise."""
    @property
    def new_token_ids(self) -> _Int32Array:
        """The rows' tokens from ``C`` on, row after row (see ``num_new_token_ids``): the first
        pipeline stage sees no sampled token, so the step sends them (vLLM's
        ``CachedRequestData.new_token_ids``)."""
    @property
    def encoder_input_rows(self) -> _Int32Array:
        """The multimodal inputs the step encodes, one entry per input: its row (an index into
        ``req_ids``), rows ascending (vLLM's ``scheduled_encoder_inputs``). Empty without
        multimodal inputs."""
    @property
    def encoder_input_ids(self) -> _Int32Array:
        """Each of those inputs' index among its request's ``mm_inputs``."""
    @property
    def external_encoder_input_rows(self) -> _Int32Array:
        """With ``ec_connector``, the multimodal inputs whose encoder outputs the connector
        loads for the step instead of the encoder computing them (``has_cache_item``), in
        the same layout: each one's row, rows ascending. Empty otherwise."""
    @property
    def external_encoder_input_ids(self) -> _Int32Array:
        """Each of those inputs' index among its request's ``mm_inputs``."""
    @property
    def num_external_computed_tokens(self) -> _Int32Array:
        """With ``kv_connector``, one entry per request admitted from a waiting queue in this
        step, in admission order (the last rows of ``req_ids``): the tokens past its
        prefix-cache hit that the external KV source loads (counted in its
        ``num_computed_tokens``), or -1 for a request that held computed tokens and asked
        none. Empty without a connector."""
    @property
    def freed_encoder_outputs(self) -> list[str]:
        """The identifiers of the encoder outputs evicted from the encoder cache since the
        previous step: the runner frees them (vLLM's ``free_encoder_mm_hashes``)."""
    @property
    def kv_loads(self) -> list[tuple[str, int, int]]:
        """With ``kv_connector``, the asynchronous KV loads this step's waiting loop started,
        in its order: ``(request_id, num_external_tokens, num_admitted_before)`` (the tokens
        past its prefix-cache hit the connector loads; how many requests the loop admitted
        before it, i.e. where it falls among ``num_external_computed_tokens``). Each request
        waits in ``WAITING_FOR_REMOTE_KVS``, holding its blocks (``get_request``), until
        ``finish_kv_transfers`` reports it received. Empty otherwise."""
    @property
    def pending_structured_output_tokens(self) -> bool:
        """Async scheduling: one of those rows awaits an earlier step's output, so the step's
        bitmask can be built only once that output is applied (vLLM's
        ``pending_structured_output_tokens``)."""
    @property
    def drafts_unused(self) -> bool:
        """No request of the step can use drafts proposed after it (each is a non-final
        prefill chunk or samples its last output token even if every draft is rejected):
        a drafter may skip proposing (vLLM's ``skip_drafts``). True for an empty step and
        without speculative decoding."""
    @property
    def total_num_scheduled_tokens(self) -> int:
        """The sum of ``num_scheduled_tokens``."""
    @property
    def new_req_ids(self) -> list[str]:
        """Requests scheduled for the first time in this step."""
    @property
    def resumed_req_ids(self) -> list[str]:
        """Preempted requests scheduled again in this step (from scratch, or from a
        prefix-cache hit)."""
    @property
    def rescheduled_req_ids(self) -> list[str]:
        """Running requests scheduled in this step that the previous step did not schedule."""
    @property
    def preempted_req_ids(self) -> list[str]:
        """Requests preempted since the previous ``schedule()``, this step included."""
    @property
    def finished_req_ids(self) -> list[str]:
        """Requests that finished since the previous ``schedule()`` (aborts included)."""
    def __len__(self) -> int: ...

@final
class RequestOutput:
    """What one step produced for one request."""

    @property
    def request_id(self) -> str:
        """The request's id."""
    @property
    def new_token_ids(self) -> list[int]:
        """The tokens this step delivered to the request (after a stop, none past it)."""
    @property
    def status(self) -> RequestStatus:
        """The request's status after the step."""
    @property
    def finished(self) -> bool:
        """Whether the request finished in this step."""
    @property
    def finish_reason(self) -> str | None:
        """vLLM's finish reason (``"stop"``, ``"length"``, ``"abort"``...), or None."""
    @property
    def stop_reason(self) -> int | None:
        """The stop token id that finished the request, if one did."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RequestOutputs(Sequence[RequestOutput]):
    """The outputs of one step: a sequence of ``RequestOutput`` (a request that
    produced tokens or finished), stored as columns.

    Elements are built when accessed, so a caller that reads the columns
    (``req_ids``, ``new_token_ids``, ``num_new_tokens``, ``statuses``) never pays
    for one Python object per request. The column properties copy into new
    read-only numpy arrays on each access."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int, /) -> RequestOutput: ...
    @overload
    def __getitem__(self, index: slice, /) -> list[RequestOutput]: ...
    def __iter__(self) -> Iterator[RequestOutput]: ...
    def __eq__(self, value: object, /) -> bool: ...
    @property
    def req_ids(self) -> list[str]:
        """Request ids, in output order."""
    @property
    def new_token_ids(self) -> _Int32Array:
        """Every delivered token, flat, split by ``num_new_tokens`` (int32, read-only; a copy)."""
    @property
    def num_new_tokens(self) -> _Int32Array:
        """Tokens delivered per request (int32, read-only; a copy)."""
    @property
    def statuses(self) -> _Int32Array:
        """``RequestStatus`` values per request (int32, read-only; a copy)."""
    @property
    def num_cached_blocks(self) -> _Int32Array:
        """Each request's prefix-cached blocks after this output, counted before a finish
        freed them (int32, read-only; a copy)."""
    @property
    def finished_req_ids(self) -> list[str]:
        """Ids of the requests that finished in this step."""

@final
class Request:
    """A snapshot of one request: a live one (``Scheduler.get_request``) or a finished one
    (``Scheduler.take_finished_requests``)."""

    @property
    def request_id(self) -> str:
        """The request's id."""
    @property
    def status(self) -> RequestStatus:
        """The request's status when the snapshot was taken."""
    @property
    def num_computed_tokens(self) -> int:
        """``C``: tokens whose KV is computed or scheduled to be."""
    @property
    def num_tokens(self) -> int:
        """``N``: prompt and output tokens so far."""
    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
    @property
    def num_tokens_with_spec(self) -> int:
        """``N`` plus the drafts waiting to be scheduled."""
    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt."""
    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens so far."""
    @property
    def spec_token_ids(self) -> list[int]:
        """Drafts to schedule next (-1 placeholders under async scheduling)."""
    @property
    def num_output_placeholders(self) -> int:
        """Output positions scheduled whose tokens have not returned yet (async)."""
    @property
    def num_in_flight_tokens(self) -> int:
        """Tokens scheduled whose output has not been applied yet."""
    @property
    def num_stale_output_tokens(self) -> int:
        """In-flight tokens scheduled before the request's last preemption."""
    @property
    def drop_stale_output(self) -> bool:
        """Whether that stale output is dropped rather than delivered."""
    @property
    def num_preemptions(self) -> int:
        """How often the request has been preempted."""
    @property
    def max_tokens(self) -> int:
        """The most output tokens the request may produce."""
    @property
    def priority(self) -> int:
        """Its priority under the priority policy (lower runs first)."""
    @property
    def arrival_time(self) -> float:
        """When the request arrived (seconds; the caller's clock or the epoch)."""
    @property
    def is_prefill_chunk(self) -> bool:
        """Whether the last scheduled chunk ended before the request's known tokens."""
    @property
    def block_ids(self) -> list[int]:
        """The request's KV block table (group 0's, with several KV-cache groups)."""
    @property
    def group_block_ids(self) -> list[list[int]]:
        """The request's KV block table in every KV-cache group, in the groups' order
        (``block_ids`` first; the null block 0 where a sliding window let blocks go)."""
    @property
    def block_hashes(self) -> list[int]:
        """One 128-bit hash per full block of the request's tokens (empty without
        prefix caching)."""
    @property
    def num_cached_blocks(self) -> int:
        """Leading blocks of ``block_ids`` registered in the prefix cache."""
    @property
    def lora_id(self) -> int | None:
        """The LoRA adapter the request runs under, or None."""
    @property
    def resumable(self) -> bool:
        """Whether it is a streaming-input session (``add_request(..., resumable=True)``)."""
    @property
    def num_queued_inputs(self) -> int:
        """A session's inputs added but not taken up yet (the end of the session counts as one)."""
    @property
    def num_inputs_taken(self) -> int:
        """A session's inputs taken up after its first."""
    @property
    def last_sched_seq(self) -> int:
        """With ``defer_block_free``, the last step with tokens that scheduled it (vLLM's
        ``last_sched_seq``; see ``Scheduler.step_seqs``); 0 without."""
    @property
    def next_decode_eligible_step(self) -> int:
        """The first step that may decode it again (vLLM's field of that name): recorded at
        each decode under a decode cadence (``Scheduler.set_decode_stagger``) and by a
        diffusion read's deferral, 0 before."""
    @property
    def referenced_mm_inputs(self) -> list[int]:
        """Its multimodal inputs (by index, ascending) whose encoder outputs it references in
        the encoder cache now."""

@final
class CachedBlocks:
    """The prefix cache as it is at the point of a step where a connector is asked: which block
    holds a hash. Given to the connector's callback, it answers only until that callback
    returns (the step goes on changing the cache); between steps, ask
    ``Scheduler.cached_block``."""

    def cached_block(self, block_hash: int, group: int | None = None) -> int | None:
        """The KV block cached under ``block_hash`` (llmsched's 128-bit hash, as in
        ``Request.block_hashes``) in KV-cache group ``group`` at this point of the step, or
        None (also in a group the pool does not have). ``InvalidRequestError`` once the
        callback this view was given to has returned."""

class _AuxOutputsSource(Protocol):
    """What ``Scheduler.schedule``'s and ``update_from_output``'s ``aux_outputs`` is asked
    and told (vLLM's ``AuxOutputSchedulerConnector`` names)."""

    def max_cache_hit(self, request: Request, cache: CachedBlocks, /) -> int: ...
    def cap_external_hit(
        self, request: Request, num_local: int, num_external: int, cache: CachedBlocks, /
    ) -> int: ...
    def request_finished(self, request: Request, cache: CachedBlocks, /) -> None: ...

class _ExternalEncoderSource(Protocol):
    """What ``Scheduler.schedule``'s ``external_encoder`` is asked (vLLM's
    ``ECConnectorBase`` names)."""

    def has_cache_item(self, identifier: str, /) -> bool: ...
    def ensure_cache_available(self, request: Request, num_computed_tokens: int, /) -> bool: ...

@final
class Scheduler:
    """The request scheduler. Thread-safe: calls from several threads are
    serialized; the GIL is released while a call works."""

    def __new__(cls, config: SchedulerConfig) -> Scheduler: ...
    @property
    def config(self) -> SchedulerConfig:
        """The scheduler's configuration (the one it was built with, or set by ``reconfigure``)."""
    def reconfigure(self, config: SchedulerConfig) -> None:
        """Take ``config`` in place of the one the scheduler was built with, as if built with
        it. Only before the scheduler's first request and ``schedule()`` call: after,
        ``ConfigError``, changing nothing (a config holds for every step of a request). The
        decode stagger and pause state set since building are kept."""
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer[Any]],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        eos_token_id: int | None = None,
        stop_token_ids: Iterable[int] = (),
        arrival_time: float | None = None,
        num_computed_tokens: int = 0,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_id: int | None = None,
        skip_reading_prefix_cache: bool = False,
        structured_output: bool = False,
        report_reused_blocks: bool = False,
        mm_inputs: Iterable[tuple[str, int, int] | tuple[str, int, int, Iterable[bool] | None]]
        | None = (),
        prompt_embeds_keys: Iterable[bytes] | None = (),
        resumable: bool = False,
        diffusion_canvas_length: int | None = None,
        diffusion_read_steps: int | None = None,
    ) -> Literal["queued", "taken_up", "finished"] | None:
        """Queue a request. Copies the prompt into the scheduler.

        ``prompt_token_ids`` and ``stop_token_ids`` are iterables of ints or 1-D numpy
        integer arrays, read exactly as numpy reads them (any layout, byte order or width).
        An iterable is read no further than one token past the longest valid list
        (the config's ``max_request_len`` minus the sampled token for a prompt, 2**20 stop
        token ids).

        Raises ``InvalidRequestError`` (``DuplicateRequestError`` for an id still live)
        naming the field and the value, and changes nothing, for a request that could
        never run: an empty prompt, one longer than ``max_request_len`` (``max_model_len``,
        or what a small KV pool holds) minus the sampled token, or a token id outside
        int32. A request stops, length-capped, at ``max_request_len`` tokens. ``lora_id``
        names the LoRA adapter the request runs under (a positive int; the config's
        ``max_loras`` must be at least 1). ``skip_reading_prefix_cache`` admits it without
        reading the prefix cache (vLLM sets it for prompt logprobs: every prompt position is
        computed); its blocks are still cached for other requests. ``structured_output``: its
        output follows a grammar the engine compiles; it waits
        (``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``), passed over without blocking others,
        until ``resolve_grammar`` reports the grammar compiled. ``report_reused_blocks``:
        with ``enable_kv_cache_events``, each of its prefix lookups with a hit is recorded as
        a ``"reused"`` event (vLLM's ``kv_cache_report_mode="full"``). ``mm_inputs``: its
        multimodal inputs in prompt order, each ``(identifier, offset, length)`` or
        ``(identifier, offset, length, is_embed)``: the encoder output's identifier (inputs
        with the same one share it), where its placeholders start in the prompt, how many
        there are, and which of them carry an embedding (one bool each; all when absent);
        only with an encoder budget (``max_num_encoder_input_tokens``), and each input
        within it. ``prompt_embeds_keys``: for a prompt given as embeddings (vLLM's
        ``prompt_embeds``; its token ids are placeholders), one ``bytes`` key per block the
        prompt reaches (a digest of that block's embeddings, 1 to 64 bytes): each enters its
        block's hash, so requests share cached blocks only as far as their embeddings match.

        ``resumable`` makes it a streaming-input session (vLLM's resumable requests): a stop
        (its ``RequestOutput`` carries the stop's status, the input's finish reason) ends the
        session's current input, not the request, which keeps the KV of its tokens but the
        last sampled one and waits for its next input (``WAITING_FOR_STREAMING_REQ``, holding
        one of ``max_num_seqs``' slots). The next input is an ``add_request`` under the same
        id with ``resumable=True``: its prompt extends the session's tokens and its
        ``max_tokens``, ``eos_token_id``, ``stop_token_ids`` and ``arrival_time`` replace the
        session's (the rest is the session's); added while the session still runs, it is
        taken up at the stop. One added without ``resumable`` ends the session: at its stop,
        or at once (aborted) if it waits for input. Returns what an input did: ``"queued"``,
        ``"taken_up"`` or ``"finished"`` (then ``take_finished_requests`` has its record);
        None for a new request. An input that does not fit (the session's tokens past the
        prompt limit, or KV past the pool) raises ``InvalidRequestError`` and changes
        nothing; one that does not fit when taken up at a stop ends the session instead.

        For a diffusion model (``num_sampled_tokens_per_step=0`` with a canvas of
        ``num_speculative_tokens``), ``diffusion_canvas_length`` narrows the request's canvas
        (the drafts each step gives it: drafts handed in beyond it are cut), and
        ``diffusion_read_steps`` makes it a read of that many denoising steps, passed over
        under async scheduling while every one of them is in flight."""
    def schedule(
        self,
        *,
        throttle_prefills: bool = False,
        external_kv: Callable[[Request, int], int | tuple[int | None, bool] | None] | None = None,
        pending_block_frees: Callable[[], bool] | None = None,
        external_encoder: _ExternalEncoderSource | None = None,
        aux_outputs: _AuxOutputsSource | None = None,
    ) -> SchedulerOutput:
        """Decide the next step: which requests run and how many tokens each.

        Runs the running loop (decodes and prefill chunks of running requests, preempting
        the lowest-priority running request when KV blocks run out), then, if nothing was
        preempted, admits waiting requests in order. Every scheduled request keeps
        ``C + n + s <= max_model_len``. Returns the step as a ``SchedulerOutput``.

        Should building that output fail (Python out of memory), the step stays decided and
        in flight, and the next ``schedule()`` returns it before deciding another.

        ``throttle_prefills`` (vLLM's, for data-parallel prefill balancing): while a request
        decodes, the step carries no prefill, unless the waiting requests outgrew the last
        step that admitted (``prefill_schedule_interval`` holds prefill back the same way).

        ``external_kv`` (with the config's ``kv_connector``): a KV connector's answer for a
        waiting request with no computed tokens, asked where vLLM's waiting loop asks it:
        called as ``external_kv(request, num_local_computed_tokens)`` with a ``Request``
        snapshot and the tokens its prefix-cache hit covers, it returns how many tokens past
        those the connector loads, or None if it cannot tell yet (the request waits this
        step); or vLLM's pair ``(tokens or None, load_async)``. A load with ``load_async``
        runs across steps: the request takes blocks for the loaded tokens and waits in
        ``WAITING_FOR_REMOTE_KVS`` (``SchedulerOutput.kv_loads``) until
        ``finish_kv_transfers`` reports it received. The GIL is held through such a step.
        Should it raise or return something else, the request waits, the step is decided
        without it, and the error is raised; the next ``schedule()`` returns that step.

        ``pending_block_frees`` (with ``external_kv``): the connector's
        ``has_pending_block_frees``, called with no argument where the running loop would
        preempt a request for KV blocks: while it returns True (transfers in flight will give
        blocks back), the loop preempts none and schedules no further running request, as
        vLLM's. Should it raise or return something else, the step is decided as if it
        returned False, and the error is raised as above.

        ``external_encoder`` (with the config's ``ec_connector``): an encoder-cache
        connector, asked only about requests with multimodal inputs, where vLLM's loops ask
        it: ``external_encoder.ensure_cache_available(request, num_computed_tokens)`` before
        a request's tokens are counted (with a ``Request`` snapshot; False: its encoder
        outputs are in transit, and the request is passed over in this step), and
        ``external_encoder.has_cache_item(identifier)`` for an input a chunk needs that is
        not in the encoder cache, once the cache has room for it and the step's encoder
        budget could encode it (True: the connector loads its output,
        ``SchedulerOutput.external_encoder_input_rows``, and the budget is not charged).
        Each returns a bool. The GIL is held through such a step. A source without those
        methods is refused before anything changes. Should either raise or return something
        else, from then on in the step every input is encoded and every request asked is
        passed over, and the error is raised as above.

        ``aux_outputs``: an auxiliary-output connector (vLLM's
        ``AuxOutputSchedulerConnector``, routed experts), asked where vLLM's loops ask it:
        ``aux_outputs.max_cache_hit(request, cache)`` for a waiting request with no computed
        tokens, before its prefix-cache lookup (the longest hit it may take, in tokens;
        clamped to ``[0, N - 1]``); ``aux_outputs.cap_external_hit(request, num_local,
        num_external, cache)`` after a KV connector's answer (the external tokens kept,
        clamped to ``[0, num_external]``); ``aux_outputs.request_finished(request, cache)``
        when the running loop preempts a request, before its blocks are freed. ``request`` is a
        ``Request`` snapshot, ``cache`` a ``CachedBlocks``: the prefix cache at that point of
        the step, readable only during the call. The GIL is held through such a step. A
        source without those methods is refused before anything changes. Should one raise
        or return something else, from then on in the step no hit and no external token is
        kept and no preemption is told, and the error is raised as above."""
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        runner_output: Any,
        *,
        aux_outputs: _AuxOutputsSource | None = None,
    ) -> RequestOutputs:
        """Apply a runner's output for ``scheduler_output``.

        ``runner_output`` is a ``llmsched.ModelRunnerOutput`` (or any object with
        ``req_ids``, ``sampled_token_ids`` and ``num_sampled``; with ``num_sampled=None``,
        ``sampled_token_ids`` may be vLLM's shape, a list of token-id lists, one per entry of
        ``req_ids``, flattened here without a Python object per token). Outputs must be applied
        once each, in the order the steps were scheduled; the output of a step that
        scheduled nothing is a no-op. ``sampled_token_ids`` and ``num_sampled`` are 1-D numpy
        int32 arrays, read exactly as numpy reads them (any layout or byte order). Copies the
        runner's arrays before it releases the GIL, so a thread writing into them during the
        call cannot change what is applied.
        Returns a sequence of ``RequestOutput``, one per request that produced tokens or
        finished.

        ``aux_outputs`` (see ``schedule``): told of each request the output finishes, where
        vLLM's update tells it, as ``aux_outputs.request_finished(request, cache)`` (before
        its blocks are freed; the blocks of requests later in the step are not cached yet).
        The GIL is held through such an update. Should it raise, the output is applied all
        the same (no further call is made), and the error is raised: that output's
        ``RequestOutput`` sequence is lost (vLLM's engine fails there too)."""
    def update_draft_token_ids(
        self,
        req_ids: Sequence[str],
        draft_token_ids: Sequence[Sequence[int]] | Sequence[int] | npt.NDArray[np.integer[Any]],
        num_draft_tokens: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    ) -> None:
        """Give running requests the drafts to verify in the next step (sync scheduling).

        ``draft_token_ids[i]`` (at most ``num_speculative_tokens`` ids; -1 is a drafter's
        padding) replaces the drafts of ``req_ids[i]``. Flat, as a runner holds them: with
        ``num_draft_tokens`` given, ``draft_token_ids`` is one int array (or sequence) and
        ``num_draft_tokens[i]`` of its ids, in order, belong to ``req_ids[i]``; the arrays
        are copied, under the GIL, before the call returns. Ids that are not live are
        ignored; drafts of a request that is not running or still in prefill are dropped.
        Drafts for a running request whose step is still in flight are refused
        (``InvalidRequestError``, nothing changed): hand them in after ``update_from_output``
        has applied that step, whose token they follow. Iterables are read no further than
        what can be valid: as many ids as live requests plus ``max_num_seqs`` (requests that
        finished since their step), one row or count per id, ``num_speculative_tokens``
        drafts per id."""
    def finish_requests(
        self, request_ids: str | Iterable[str] | None, status: RequestStatus | int
    ) -> list[str]:
        """Finish live requests with a finished ``status``; returns the ids
        finished (ids not live are ignored, as in vLLM). None means all.

        ``request_ids`` may be any iterable; it is read one id at a time, keeping only the
        live ones, and at most the live requests plus 2**20 ids are read (more is an
        ``InvalidRequestError``, and nothing is finished)."""
    def resolve_grammar(self, request_id: str, compiled: bool) -> None:
        """Report whether the grammar of the structured-output request ``request_id`` compiled.
        The next waiting loop that reaches the request acts on it: a compiled grammar makes
        it an ordinary waiting request; a failed one makes ``finish_failed_grammars`` fail
        it. ``UnknownRequestError`` for an id not live, ``InvalidRequestError`` for a
        request without structured output or whose grammar was already reported; either
        changes nothing."""
    def finish_failed_grammars(self) -> list[str]:
        """Finish (``FINISHED_ERROR``) the requests whose grammar did not compile and that a
        waiting loop reached since the last call (vLLM fails them in its next
        ``update_from_output``); returns their ids. Their final records are then
        ``take_finished_requests``'s; the next ``schedule()`` reports them finished."""
    def finish_encoder_mismatches(self) -> list[str]:
        """Finish (``FINISHED_ERROR``) the requests whose multimodal input met a cached encoder
        output of another size (an identifier reused for other content) in a loop since the
        last call (vLLM fails them in its next ``update_from_output``); returns their ids.
        Their final records are then ``take_finished_requests``'s."""
    def encoder_mismatch_ids(self) -> list[str]:
        """The ids of the requests ``finish_encoder_mismatches`` will fail (a new list), in the
        order the loops met them (vLLM's ``encoder_cache_mismatch_reqs``)."""
    def reset_encoder_cache(self) -> None:
        """Forget every cached encoder output (vLLM's ``reset_encoder_cache``, after the
        model's weights change); the requests' references to them go too."""
    def encoder_cache_state(self) -> tuple[int, int, int]:
        """The encoder cache: ``(free, freeable, cached)``: its free embedding slots, those
        plus the slots of outputs no request references, and the outputs it holds."""
    def encoder_cache_contents(
        self,
    ) -> tuple[list[tuple[str, int, list[str]]], list[str]]:
        """The encoder cache's outputs (a new list): ``(identifier, num_embeds, request_ids)``
        for each, by identifier, with the ids of the requests that reference it (none: it
        is kept until its room is needed); and the identifiers of those no request
        references, oldest (first evicted) first."""
    def take_passed_encoder_inputs(self) -> list[tuple[str, int]]:
        """With ``ec_connector``: the multimodal inputs whose encoder outputs a request's
        computed tokens passed (so the request no longer references them) since the last
        call, as ``(request_id, input_index)`` in that order: what vLLM tells its connector
        with ``update_state_after_free``. Empty without."""
    def held_kv_blocks(self, request_id: str, group: int = 0) -> _Int32Array | None:
        """With ``kv_connector``: the blocks of KV-cache group ``group`` holding the computed
        tokens of the finished request ``request_id``, whose blocks stay out of the pool until
        ``release_kv_blocks`` (what a connector's ``request_finished`` is given, a list per
        group), as a new int32 array; None if it holds none, or there is no such group."""
    @property
    def num_held_kv_requests(self) -> int:
        """With ``kv_connector``: how many finished requests hold their KV blocks (until
        ``release_kv_blocks``)."""
    def kv_loads_reported(self) -> tuple[list[str], list[str]]:
        """With ``kv_connector``: ``(received, failed)``, the ids of the requests waiting for an
        asynchronous KV load that the runner reported received (vLLM's
        ``finished_recving_kv_req_ids``), and of those whose load failed and is to be
        recomputed (``failed_recving_kv_req_ids``), in waiting order: the next step promotes
        them."""
    def held_kv_request_ids(self) -> list[str]:
        """With ``kv_connector``: ids of the finished requests that hold their KV blocks,
        sorted."""
    def release_kv_blocks(self, request_ids: Sequence[str]) -> None:
        """Return the held blocks of the finished requests ``request_ids`` to the pool (a
        connector has sent them, or needs them no longer), each table tail first, in the
        order given. ``InvalidRequestError``, changing nothing, if one holds none or its
        load is in flight (``kv_load_in_flight``)."""
    def finish_kv_transfers(
        self,
        finished_recving: Iterable[str] | None = None,
        finished_sending: Iterable[str] | None = None,
    ) -> None:
        """The runner's report of finished KV transfers (vLLM's ``finished_recving`` and
        ``finished_sending``): a request waiting for its asynchronous load
        (``WAITING_FOR_REMOTE_KVS``) that is received is promoted by the next ``schedule()``;
        a finished request's held blocks, received or sent, go back to the pool (received
        ones first, each list in its order). Ids that name neither are ignored."""
    def fail_kv_loads(
        self,
        failed_recving: Iterable[str] | None = None,
        invalid_block_ids: Iterable[int] | None = None,
    ) -> list[str]:
        """The runner's report of failed KV loads (vLLM's ``failed_recving`` and
        ``invalid_block_ids``), given before the output of the oldest step in flight, as
        vLLM takes it: a request waiting for its load whose load failed keeps the tokens
        before its first failed block (none if it failed whole) and, once the load is
        reported done (``finish_kv_transfers``), computes the rest; a running request whose
        computed tokens lie in a failed block (a synchronous load's failure) keeps the
        tokens before it, and that step's output for it is dropped (if a later step in flight
        scheduled it too, it is preempted instead, every output in flight for it dropped,
        its blocks from the failed one out of the prefix cache, and its next admission asks
        the connector nothing). With the config's
        ``recompute_kv_load_failures`` off, returns the ids of the affected requests
        instead: finish them with ``FINISHED_ERROR`` once the step's output is applied
        (vLLM's policy ``"fail"``). Ids that name no request waiting for a load are ignored.
        ``InvalidRequestError``, changing nothing, for any ``invalid_block_ids`` with
        several KV-cache groups (a block id cannot be traced to requests there: loads fail
        by request, as in vLLM)."""
    def kv_load_in_flight(self, request_id: str) -> bool:
        """Whether request ``request_id`` waits for an asynchronous KV load the runner has
        not reported (``finish_kv_transfers``): live in ``WAITING_FOR_REMOTE_KVS``, or
        finished while it was (its blocks are then held until the load is reported, and
        ``release_kv_blocks`` refuses them)."""
    def get_request(self, request_id: str) -> Request:
        """A snapshot of the live request ``request_id``; ``UnknownRequestError`` if no
        live request has that id."""
    def take_finished_requests(self) -> list[Request]:
        """The final state of each request the latest ``update_from_output`` or
        ``finish_requests`` call finished, in the order they finished: one ``Request``
        snapshot each (status, counters and tokens as they were; its blocks are freed).
        Taking them leaves none; the next such call drops those nobody took."""
    def has_unfinished_requests(self) -> bool:
        """Whether any request is running or waiting."""
    def get_num_unfinished_requests(self) -> int:
        """How many requests are running or waiting."""
    def has_requests(self) -> bool:
        """Whether any request is unfinished, or finished but not yet reported by a
        ``schedule()``."""
    def has_finished_requests(self) -> bool:
        """Whether any request finished since the last ``schedule()``, which will report it."""
    @property
    def num_skipped_waiting(self) -> int:
        """How many of the waiting requests a waiting loop set aside (a LoRA adapter past
        ``max_loras``, output from before a preemption still in flight, no token it could
        schedule) and none has admitted since: vLLM's ``num_skipped_waiting_reqs``."""
    @property
    def num_waiting_for_streaming_input(self) -> int:
        """Streaming-input sessions waiting for their next input
        (``WAITING_FOR_STREAMING_REQ``): counted as waiting, but not unfinished work, and each
        holds one of ``max_num_seqs``' slots (vLLM's ``num_waiting_for_streaming_input``)."""
    def get_request_counts(self) -> tuple[int, int]:
        """``(running, waiting)``."""
    def get_kv_cache_usage(self) -> float:
        """The fraction of usable KV blocks in use, in [0, 1]."""
    @property
    def pause_state(self) -> int:
        """vLLM's pause state: 0 unpaused, 1 no new admissions, 2 nothing scheduled."""
    def set_pause_state(self, pause_state: int) -> None:
        """Set the pause state (0 unpaused, 1 no new admissions, 2 nothing scheduled)."""
    @property
    def current_step(self) -> int:
        """``schedule()`` calls so far (vLLM's ``current_step``)."""
    @property
    def step_seqs(self) -> tuple[int, int]:
        """With ``defer_block_free``, ``(sched_step_seq, processed_step_seq)``: the steps with
        tokens scheduled so far and those whose output is applied (vLLM's counters of those
        names); ``(0, 0)`` without."""
    def deferred_frees(self) -> list[tuple[int, list[int]]]:
        """The frees that wait for steps in flight (``defer_block_free``; a new list), oldest
        first: ``(step, block_ids)``, a request's blocks in the order they go back once the
        step numbered ``step`` (see ``step_seqs``) has its output applied (vLLM's
        ``deferred_frees``)."""
    @property
    def prefill_cadence(self) -> tuple[int, int]:
        """The prefill cadence's counters, ``(num_executed_steps, last_prefill_step)``: steps
        that scheduled tokens, and the count of them at the last one that carried prefill (a
        whole interval back before any)."""
    @property
    def prefill_capacity_bound(self) -> bool:
        """The last step that could admit left requests waiting that were not set aside: the
        waiting requests outgrew it, and prefill is not held back (vLLM's
        ``prefill_capacity_bound``)."""
    @property
    def decode_stagger(self) -> int:
        """With async scheduling, the steps between two decodes of one request (1: every
        step; 0: no decode cadence, the default); see ``set_decode_stagger``."""
    def set_decode_stagger(self, steps: int) -> None:
        """With async scheduling, a request decoded in step ``t`` is not decoded again before
        step ``t + steps``, its ``next_decode_eligible_step`` (vLLM's V2 model runner: with
        pipeline parallelism, one decode per request per trip through the stages); 1
        decodes it every step. 0, the default: no decode cadence (the bound is not
        recorded). Takes effect from the next step. ``ConfigError`` naming the value outside
        [0, 1024]."""
    @property
    def num_free_blocks(self) -> int:
        """KV blocks in the free queue (cached ones included: they are reusable)."""
    @property
    def num_used_blocks(self) -> int:
        """KV blocks held by requests (the null block and the free queue left out): the
        distinct KV memory a step scheduled now reads, which ``llmsched.steps`` logs."""
    @property
    def num_steps_in_flight(self) -> int:
        """Scheduled steps with requests whose output has not been applied yet."""
    def stats(self) -> dict[str, int]:
        """Counters over the scheduler's life, as a dict:

        - ``num_steps``: ``schedule()`` calls;
        - ``num_preemptions``: requests preempted;
        - ``num_draft_tokens``, ``num_accepted_tokens``: draft slots scheduled and
          drafts the runner accepted;
        - ``prefix_cache_requests``, ``prefix_cache_queries``, ``prefix_cache_hits``:
          prefix-cache lookups at first admission (requests, prompt tokens looked up,
          tokens found);
        - ``prefix_cache_preempted_requests``, ``prefix_cache_preempted_queries``,
          ``prefix_cache_preempted_hits``: the same at re-admission after a preemption."""
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix block. With ``reset_running_requests``, first
        preempt every running request (their output in flight is dropped). Returns
        False, changing nothing, while any block is in use."""
    def take_kv_events(self) -> list[_KvEvent]:
        """The prefix cache's changes since the last call, oldest first, as tuples:
        ``("stored", request_id, first_block, block_ids, group)`` (the blocks now cached in
        KV-cache group ``group`` hold the request's full blocks ``first_block, first_block +
        1, ...``: their content is the request's tokens there; 0 for a sliding-window block
        that did not enter the cache), ``("reused", request_id, num_blocks, group)`` (a prefix
        lookup of a request added with ``report_reused_blocks`` hit its first ``num_blocks``
        blocks, one tuple per group), ``("removed", block_id, group)`` (evicted, or its KV
        will never be computed) and ``("cleared",)`` (``reset_prefix_cache``). ``schedule``,
        ``update_from_output`` and
        ``reset_prefix_cache`` make them; always empty unless the config's
        ``enable_kv_cache_events``. Take them before the requests they name are let go: a
        request finished by ``update_from_output`` is still reachable then through
        ``take_finished_requests``."""
    def take_kv_cache_eviction_events(self) -> list[tuple[float, float, tuple[float, ...]]]:
        """The KV blocks evicted since the last call among those the config samples
        (``kv_cache_metrics_sample``), in eviction order, as tuples ``(lifetime_seconds,
        idle_seconds, reuse_gaps_seconds)``: how long each lived since the pool handed it
        out, since its last read (a prefix hit), and the gaps between its last reads (up to
        three); vLLM's ``KVCacheEvictionEvent``. Always empty when it samples none."""
    def running_request_ids(self) -> list[str]:
        """Running request ids, in running order."""
    @property
    def num_kv_holding_waiting(self) -> int:
        """How many of ``waiting_request_ids()`` (the first ones) hold KV blocks, a KV load's
        or computed tokens (vLLM's ``kv_holding_waiting``)."""
    def waiting_request_ids(self) -> list[str]:
        """Waiting request ids, in the order the waiting loop would consider them: those
        holding KV blocks first (``num_kv_holding_waiting``)."""
    def skipped_waiting_request_ids(self) -> list[str]:
        """Ids of the waiting requests a waiting loop set aside and none has admitted since
        (vLLM's ``deferred_waiting``; ``num_skipped_waiting`` of them), in waiting order."""
    def block_ref_count(self, block_id: int) -> int:
        """How many hold KV block ``block_id`` now (requests, and finished requests whose
        blocks a KV connector holds); ``InvalidRequestError`` if the pool has no such block."""
    def cached_block_hash(self, block_id: int) -> int | None:
        """The hash KV block ``block_id`` is in the prefix cache under now (llmsched's 128-bit
        hash, as in ``Request.block_hashes``), or None if it is not cached;
        ``InvalidRequestError`` if the pool has no such block."""
    def cached_block(self, block_hash: int, group: int | None = None) -> int | None:
        """The KV block cached under ``block_hash`` (llmsched's 128-bit hash, as in
        ``Request.block_hashes``) in KV-cache group ``group`` now, or None (also in a group
        the pool does not have)."""
    def probe_prefix_cache(
        self,
        prompt_token_ids: Sequence[int] | npt.NDArray[np.integer[Any]],
        *,
        cache_salt: str | None = None,
        lora_id: int | None = None,
        mm_inputs: Iterable[tuple[str, int, int] | tuple[str, int, int, Iterable[bool] | None]]
        | None = None,
        prompt_embeds_keys: Iterable[bytes] | None = (),
        skip_reading_prefix_cache: bool = False,
    ) -> tuple[list[list[int]], int, int]:
        """The prefix-cache hit a request with this prompt and these keys would find now, were
        it added (vLLM's ``KVCacheManager.get_computed_blocks`` for a request not added):
        ``(block_ids, num_tokens, shared_prefix_boundary)``: the hit's blocks, one list per
        KV-cache group, the tokens they hold (none with ``skip_reading_prefix_cache``), and
        where the prefix a full-attention group cached past the hit ends (0 if none). The
        arguments are read as ``add_request`` reads them. Changes nothing: no request is
        added, and no stats or events are recorded."""
    def finished_since_last_step(self) -> list[str]:
        """Ids of the requests finished since the last ``schedule()``, in the order they
        finished: what the next step reports (vLLM's ``finished_req_ids``)."""
    def free_block_queue(self) -> list[int]:
        """The free-block queue, head first (blocks are reused from the head)."""
    def check_invariants(self) -> None:
        """Check every invariant of the whole state: the capacity rule, queues and
        statuses, counters, block tables, reference counts, the free queue and the
        prefix cache's hashes.

        O(everything): meant for tests and debugging, not the hot path.
        Raises ``InvariantError`` naming the first broken one."""
    def debug_snapshot(self) -> str:
        """A deterministic dump of the whole state, for equality checks in tests."""

def step_shape(
    num_scheduled_tokens: _Int32Array,
    num_computed_tokens: _Int32Array,
    num_spec_tokens: _Int32Array,
    num_output_tokens: _Int32Array,
    new_requests: int,
    finished_requests: int,
    kv_blocks: int,
) -> dict[str, int]: ...
def prompt_token_ids(
    key: int, prompt_len: int, prefix_blocks: Sequence[int], vocab_size: int
) -> _Int32Array: ...

@final
class Replay:
    """A workload replayed in virtual time through the scheduler, a runner without a model
    and a step-cost model: the engine loop behind ``llmsched simulate`` (``llmsched.sim``
    builds it; see ``llmsched.sim.simulate``). The requests are columns in arrival order:
    ids, arrival times (virtual seconds), prompt and output lengths, the keys seeding
    their prompts, and their Mooncake prefix blocks (``num_prefix_blocks`` per request,
    flat in ``prefix_blocks``). ``cost`` maps every name of ``COST_TERMS`` to its
    milliseconds. The engine is taken as warmed up with a one-request step of every token
    count up to ``warm_up_tokens``: a step of another batch shape costs ``new_shape_ms``
    the first time."""

    def __new__(
        cls,
        config: SchedulerConfig,
        cost: Mapping[str, float],
        request_ids: Sequence[str],
        arrival_times: Sequence[float] | npt.NDArray[np.float64],
        prompt_lens: Sequence[int],
        output_lens: Sequence[int],
        keys: Sequence[int],
        num_prefix_blocks: Sequence[int],
        prefix_blocks: Sequence[int],
        *,
        seed: int = 0,
        vocab_size: int = 32000,
        acceptance_rate: float = 0.7,
        check_invariants: bool = False,
        warm_up_tokens: int = 0,
    ) -> Replay: ...
    def run(self, seconds: float) -> bool:
        """Replays for about ``seconds`` of wall time (at least one engine step), or to the
        end, with the GIL released; returns whether the replay is done. After an error the
        replay cannot go on (every later ``run`` raises ``InternalError``); what it did
        until then can still be read."""
    @property
    def done(self) -> bool:
        """Whether every request has arrived and finished, and no step is in flight."""
    @property
    def clock(self) -> float:
        """The virtual clock, in seconds."""
    @property
    def num_arrived(self) -> int:
        """Requests that have arrived: the workload's first ones."""
    @property
    def num_finished(self) -> int:
        """Requests finished."""
    @property
    def num_steps(self) -> int:
        """Steps scheduled, empty ones included."""
    @property
    def scheduler_seconds(self) -> float:
        """Wall seconds spent in the scheduler's ``schedule`` and ``update_from_output``."""
    def stats(self) -> dict[str, int]:
        """The scheduler's counters, as ``Scheduler.stats()`` gives them."""
    def times(self) -> dict[str, Any]:
        """Each request's times so far, in the workload's order, as new arrays (a copy):
        ``scheduled``, ``first_token`` and ``finished`` (virtual seconds, NaN for what has
        not happened), ``num_output``, ``preemptions`` (int64), and ``finish_reason`` (a
        list: vLLM's finish reason, or None while unfinished)."""
    def timeline(self) -> dict[str, npt.NDArray[Any]]:
        """The scheduler's state at each step as it started (empty steps included), as new
        arrays (a copy): ``time`` (virtual seconds), ``kv_usage`` (a fraction of the pool),
        ``running`` and ``waiting`` (requests)."""
