"""Type stubs of the Rust extension ``llmsched._core``.

Hand-written, and checked against the compiled module by ``mypy.stubtest``
(``make stubtest``). Import these names from ``llmsched``, not from here.
"""

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, final, overload

import numpy as np
import numpy.typing as npt

from llmsched.status import RequestStatus

_Int32Array = npt.NDArray[np.int32]

__all__ = [
    "REQUEST_STATUSES",
    "ConfigError",
    "DuplicateRequestError",
    "InternalError",
    "InvalidRequestError",
    "InvariantError",
    "LlmschedError",
    "OutputMismatchError",
    "ReentrantCallError",
    "Request",
    "RequestOutput",
    "RequestOutputs",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "UnknownRequestError",
    "__version__",
]

__version__: Final[str]
REQUEST_STATUSES: Final[tuple[tuple[str, int, str | None], ...]]
"""Every request status as ``(name, value, finish reason)``, in value order: the
declaration ``llmsched.RequestStatus`` is checked against."""

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
    """A runner output that does not match the scheduler output it answers,
    or a scheduler output applied twice or out of order."""

class InvariantError(LlmschedError, AssertionError):
    """``Scheduler.check_invariants`` found a broken invariant (spec Appendix A)."""

class ReentrantCallError(LlmschedError, RuntimeError):
    """A ``Scheduler`` method called while the same thread is already inside a call on
    that scheduler (from a finalizer, a signal handler or a callback). The inner call is
    refused and changes nothing; the outer call completes."""

class InternalError(LlmschedError, RuntimeError):
    """A bug inside llmsched. The scheduler refuses further calls after one."""

@final
class SchedulerConfig:
    """The validated configuration of a scheduler. Immutable.

    This object is the one home of ``max_model_len``: the scheduler, the
    simulated runner and the engine all read it from here.
    """

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
        num_sampled_tokens_per_step: int = 1,
        async_scheduling: bool = True,
        watermark: float = 0.0,
        scheduler_reserve_full_isl: bool = True,
        enable_prefix_caching: bool = True,
        policy: str = "fcfs",
    ) -> SchedulerConfig: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def max_num_scheduled_tokens(self) -> int: ...
    @property
    def max_num_active_seqs(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def enable_chunked_prefill(self) -> bool: ...
    @property
    def long_prefill_token_threshold(self) -> int: ...
    @property
    def long_prefill_token_threshold_adaptive(self) -> bool: ...
    @property
    def num_speculative_tokens(self) -> int: ...
    @property
    def num_lookahead_tokens(self) -> int: ...
    @property
    def max_num_new_slots_for_drafting(self) -> int: ...
    @property
    def num_sampled_tokens_per_step(self) -> int: ...
    @property
    def async_scheduling(self) -> bool: ...
    @property
    def watermark(self) -> float: ...
    @property
    def scheduler_reserve_full_isl(self) -> bool: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def policy(self) -> str: ...
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
    arrays are read-only. Per-request arrays are aligned with ``req_ids``:
    running requests first (in running order), then this step's admissions.
    """

    @property
    def step_id(self) -> int: ...
    @property
    def req_ids(self) -> list[str]: ...
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
    def num_block_ids(self) -> _Int32Array:
        """Block ids per request in ``block_ids``: the whole table for new and
        resumed requests (replace), the newly allocated blocks otherwise (append)."""
    @property
    def block_ids(self) -> _Int32Array: ...
    @property
    def num_all_token_ids(self) -> _Int32Array:
        """For new and resumed requests, how many tokens they hold (prompt and
        outputs so far); 0 for the others."""
    @property
    def all_token_ids(self) -> _Int32Array:
        """The tokens counted by ``num_all_token_ids``, flat."""
    @property
    def total_num_scheduled_tokens(self) -> int: ...
    @property
    def new_req_ids(self) -> list[str]: ...
    @property
    def resumed_req_ids(self) -> list[str]: ...
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
    def request_id(self) -> str: ...
    @property
    def new_token_ids(self) -> list[int]: ...
    @property
    def status(self) -> RequestStatus: ...
    @property
    def finished(self) -> bool: ...
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
    """The outputs of one step: a sequence of ``RequestOutput`` (each request that
    produced tokens or finished), stored as columns.

    Elements are built when accessed, so a caller that reads the columns never pays for
    one Python object per request. The column properties copy into new numpy arrays on
    each access."""

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
        """Every delivered token, flat, split by ``num_new_tokens`` (int32; a copy)."""
    @property
    def num_new_tokens(self) -> _Int32Array:
        """Tokens delivered per request (int32; a copy)."""
    @property
    def statuses(self) -> _Int32Array:
        """``RequestStatus`` values per request (int32; a copy)."""
    @property
    def finished_req_ids(self) -> list[str]:
        """Ids of the requests that finished in this step."""

@final
class Request:
    """A snapshot of one live request, taken by ``Scheduler.get_request``."""

    @property
    def request_id(self) -> str: ...
    @property
    def status(self) -> RequestStatus: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens_with_spec(self) -> int: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def spec_token_ids(self) -> list[int]: ...
    @property
    def num_output_placeholders(self) -> int: ...
    @property
    def num_in_flight_tokens(self) -> int: ...
    @property
    def num_stale_output_tokens(self) -> int:
        """In-flight tokens scheduled before the request's last preemption."""
    @property
    def drop_stale_output(self) -> bool:
        """Whether that stale output is dropped rather than delivered."""
    @property
    def num_preemptions(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def is_prefill_chunk(self) -> bool: ...
    @property
    def block_ids(self) -> list[int]: ...
    @property
    def block_hashes(self) -> list[int]:
        """One 128-bit hash per full block of the request's tokens (empty without
        prefix caching)."""

@final
class Scheduler:
    """The request scheduler. Thread-safe: calls from several threads are
    serialized; the GIL is released while a call works."""

    def __new__(cls, config: SchedulerConfig) -> Scheduler: ...
    @property
    def config(self) -> SchedulerConfig: ...
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
    ) -> None:
        """Queue a request. Copies the prompt into the scheduler."""
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: Any
    ) -> RequestOutputs:
        """Apply a runner's output for ``scheduler_output``.

        ``runner_output`` is a ``llmsched.ModelRunnerOutput`` (or any object
        with ``req_ids``, ``sampled_token_ids`` and ``num_sampled``). Outputs
        must be applied once each, in the order the steps were scheduled. Copies the
        runner's arrays before it releases the GIL, so a thread writing into them during the
        call cannot change what is applied.
        Returns a sequence of ``RequestOutput``, one per request that produced tokens
        or finished.
        """
    def update_draft_token_ids(
        self,
        req_ids: Sequence[str],
        draft_token_ids: Sequence[Sequence[int]],
    ) -> None: ...
    def finish_requests(
        self, request_ids: str | Iterable[str] | None, status: RequestStatus | int
    ) -> list[str]:
        """Finish live requests with a finished ``status``; returns the ids
        finished (ids not live are ignored, as in vLLM). None means all."""
    def get_request(self, request_id: str) -> Request: ...
    def has_unfinished_requests(self) -> bool: ...
    def get_num_unfinished_requests(self) -> int: ...
    def has_requests(self) -> bool: ...
    def get_request_counts(self) -> tuple[int, int]:
        """``(running, waiting)``."""
    def get_kv_cache_usage(self) -> float: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_steps_in_flight(self) -> int: ...
    def stats(self) -> dict[str, int]:
        """Counters over the scheduler's life: num_steps, num_preemptions,
        num_draft_tokens, num_accepted_tokens, and the prefix cache's lookups recorded
        at admission: prefix_cache_{requests,queries,hits} for first admissions and
        prefix_cache_preempted_{requests,queries,hits} for re-admissions."""
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix block. With ``reset_running_requests``, first
        preempt every running request (their output in flight is dropped). Returns
        False, changing nothing, while any block is in use."""
    def running_request_ids(self) -> list[str]:
        """Running request ids, in running order."""
    def waiting_request_ids(self) -> list[str]:
        """Waiting request ids, in the order the waiting loop would consider them."""
    def free_block_queue(self) -> list[int]:
        """The free-block queue, head first (blocks are reused from the head)."""
    def check_invariants(self) -> None:
        """Check the invariants of spec Appendix A over the whole state.

        O(everything): meant for tests and debugging, not the hot path.
        Raises ``InvariantError`` naming the first broken one."""
    def debug_snapshot(self) -> str:
        """A deterministic dump of the whole state, for equality checks in tests."""
