"""A simulated model runner that mirrors the bookkeeping of vLLM's V1 GPU model runner.

It does no model math. It keeps what a real runner keeps (spec §6): one persistent 2-D
``int32`` array of token rows of width ``max_model_len`` (like vLLM's ``token_ids_cpu``),
a block table per request, and the request's *true* counters, and it expands every
``SchedulerOutput`` into positions, input ids and a slot mapping exactly the way the V1
runner does. So a scheduler that breaks the runner contract (spec §6.5) fails here the way
vLLM fails: a negative count raises numpy's ``ValueError: repeats may not contain negative
values.``, and a sampled token written past the row raises vLLM's
``Sampled token IDs exceed the max model length...`` ``AssertionError``.

Sampled tokens are deterministic: the token at index ``i`` of request ``r`` is always
``T(r, i)``, a splitmix64 hash of the seed, ``crc32(r)`` and ``i`` (see ``target_token``),
whatever the step sizes, the drafts and their acceptance. Drafts equal ``T`` at their index
with probability ``acceptance_rate`` (again by hash), so acceptance is reproducible too.

Every hash is computed on ``uint64`` *arrays*: numpy wraps array overflow silently, while
scalar overflow warns (and the test suite turns warnings into errors).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from llmsched.outputs import ModelRunnerOutput
from llmsched.sim._hashing import mix64

__all__ = [
    "SchedulerConfigLike",
    "SchedulerOutputLike",
    "SimulatedModelRunner",
    "StepInputs",
]

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]
IntpArray = npt.NDArray[np.intp]
U64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]
_G = TypeVar("_G", bound=np.generic)

_MASK64 = (1 << 64) - 1
_INT32_MAX = (1 << 31) - 1

_SHIFT11 = np.uint64(11)
_SALT_EOS = np.uint64(0xE05E05E05E05E05E)
_SALT_ACCEPT = np.uint64(0xACCE97ACCE97ACCE)
_TO_UNIT = 2.0**-53


def check_draft_slots(
    req_ids: Sequence[str],
    ns: npt.NDArray[np.integer],
    num_spec: npt.NDArray[np.integer],
    spec_ids: npt.NDArray[np.integer],
    num_spec_cfg: int,
) -> int:
    """What a runner asserts of a step's draft slots: ``0 <= num_spec <= min(K, n)`` per
    request, and ``spec_token_ids`` split exactly by ``num_spec_tokens``. Returns the
    number of slots; raises ``AssertionError`` naming the first request that breaks it."""
    bad = (num_spec < 0) | (num_spec > ns) | (num_spec > num_spec_cfg)
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(
            f"request {req_ids[i]!r}: {int(num_spec[i])} draft slots with n={int(ns[i])} "
            f"and num_speculative_tokens={num_spec_cfg}"
        )
    num_slots = int(num_spec.sum(dtype=np.int64))
    if len(spec_ids) != num_slots:
        raise AssertionError(
            f"spec_token_ids has {len(spec_ids)} ids but num_spec_tokens sums to {num_slots}"
        )
    return num_slots


def _unit(h: U64Array) -> npt.NDArray[np.float64]:
    """Uniform floats in ``[0, 1)`` from the top 53 bits of each hash."""
    return (h >> _SHIFT11).astype(np.float64) * _TO_UNIT


def _within(counts: npt.NDArray[np.integer], total: int) -> Int64Array:
    """For counts ``[2, 3]``: ``[0, 1, 0, 1, 2]`` (vLLM's ``_get_cumsum_and_arange``)."""
    ends = np.cumsum(counts, dtype=np.int64)
    within: Int64Array = np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts)
    return within


class SchedulerConfigLike(Protocol):
    """The fields of ``llmsched.SchedulerConfig`` that the runner and the checks read."""

    @property
    def max_model_len(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_speculative_tokens(self) -> int: ...
    @property
    def num_sampled_tokens_per_step(self) -> int: ...
    @property
    def async_scheduling(self) -> bool: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_scheduled_tokens(self) -> int: ...


class SchedulerOutputLike(Protocol):
    """The fields of ``llmsched.SchedulerOutput`` that the runner and the checks read."""

    @property
    def req_ids(self) -> list[str]: ...
    @property
    def num_scheduled_tokens(self) -> Int32Array: ...
    @property
    def num_computed_tokens(self) -> Int32Array: ...
    @property
    def num_spec_tokens(self) -> Int32Array: ...
    @property
    def spec_token_ids(self) -> Int32Array: ...
    @property
    def num_block_ids(self) -> Int32Array: ...
    @property
    def block_ids(self) -> Int32Array: ...
    @property
    def num_all_token_ids(self) -> Int32Array: ...
    @property
    def all_token_ids(self) -> Int32Array: ...
    @property
    def total_num_scheduled_tokens(self) -> int: ...
    @property
    def new_req_ids(self) -> list[str]: ...
    @property
    def resumed_req_ids(self) -> list[str]: ...
    @property
    def preempted_req_ids(self) -> list[str]: ...
    @property
    def finished_req_ids(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class StepInputs:
    """What the last non-empty step fed the (absent) model, one entry per scheduled token."""

    req_indices: IntpArray
    """Index into ``req_ids`` of each token."""
    positions: Int64Array
    input_ids: Int32Array
    slot_mapping: Int64Array


class SimulatedModelRunner:
    """A deterministic stand-in for vLLM's V1 GPU model runner (spec §6).

    ``config`` is the one home of ``max_model_len`` (``M``); the runner reads it from there
    at every call and checks that its token rows still have that width.
    """

    def __init__(
        self,
        config: SchedulerConfigLike,
        seed: int = 0,
        *,
        vocab_size: int = 32000,
        acceptance_rate: float = 0.7,
        eos_token_id: int | None = None,
        eos_probability: float = 0.0,
        accept_padded_drafts: bool = False,
    ) -> None:
        eos_in_vocab = eos_token_id is not None and 0 <= eos_token_id < vocab_size
        # A rejected draft needs a token that is neither T nor EOS.
        min_vocab = 3 if eos_in_vocab else 2
        if not min_vocab <= vocab_size <= _INT32_MAX:
            raise ValueError(f"vocab_size={vocab_size}: must be in [{min_vocab}, {_INT32_MAX}]")
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate={acceptance_rate}: must be in [0, 1]")
        if not 0.0 <= eos_probability <= 1.0:
            raise ValueError(f"eos_probability={eos_probability}: must be in [0, 1]")
        if eos_token_id is not None and not 0 <= eos_token_id <= _INT32_MAX:
            raise ValueError(f"eos_token_id={eos_token_id}: must be in [0, {_INT32_MAX}]")
        if eos_probability > 0.0 and eos_token_id is None:
            raise ValueError("eos_probability > 0 needs an eos_token_id")

        self.config = config
        self.seed = seed
        self.vocab_size = vocab_size
        self.acceptance_rate = acceptance_rate
        self.eos_token_id = eos_token_id
        self.eos_probability = eos_probability
        self.accept_padded_drafts = accept_padded_drafts
        self._eos_in_vocab = eos_in_vocab
        self._seed_key = mix64(np.array([seed & _MASK64], dtype=np.uint64))

        width = int(config.max_model_len)
        block_size = int(config.block_size)
        num_spec = int(config.num_speculative_tokens)
        if width < 1 or block_size < 1 or num_spec < 0:
            raise ValueError("config: max_model_len and block_size must be >= 1")
        capacity = max(1, min(int(config.max_num_seqs), 16))
        # Rows are recycled through a free list and the arrays double when full.
        self._tokens: Int32Array = np.zeros((capacity, width), dtype=np.int32)
        self._num_tokens: Int64Array = np.zeros(capacity, dtype=np.int64)
        self._num_computed: Int64Array = np.zeros(capacity, dtype=np.int64)
        self._keys: U64Array = np.zeros(capacity, dtype=np.uint64)
        self._block_table: Int32Array = np.zeros(
            (capacity, -(-width // block_size)), dtype=np.int32
        )
        self._num_blocks: Int64Array = np.zeros(capacity, dtype=np.int64)
        # Drafts this runner proposed for a row (async: they stay here, as on a GPU), valid
        # for token indices draft_base .. draft_base + K - 1; draft_base -1 means none.
        self._drafts: Int32Array = np.zeros((capacity, max(num_spec, 1)), dtype=np.int32)
        self._draft_base: Int64Array = np.full(capacity, -1, dtype=np.int64)
        self._row_of: dict[str, int] = {}
        self._free_rows: list[int] = list(range(capacity - 1, -1, -1))

        self._pending_drafts: tuple[list[str], Int32Array, Int32Array] | None = None
        self.last_step_inputs: StepInputs | None = None
        """Positions, input ids and slot mapping of the last step that scheduled tokens."""

    # ------------------------------------------------------------------ read-only helpers

    @property
    def num_live_requests(self) -> int:
        """Requests the runner holds state for (running, or preempted and not finished)."""
        return len(self._row_of)

    def num_tokens(self, req_id: str) -> int:
        """True number of tokens of a live request: prompt plus the outputs it produced."""
        return int(self._num_tokens[self._row(req_id)])

    def num_computed_tokens(self, req_id: str) -> int:
        """Positions of a live request whose KV is really computed."""
        return int(self._num_computed[self._row(req_id)])

    def token_ids(self, req_id: str) -> list[int]:
        """A copy of a live request's token row, up to its true number of tokens."""
        row = self._row(req_id)
        tokens: list[int] = self._tokens[row, : self._num_tokens[row]].tolist()
        return tokens

    def target_token(self, req_id: str, index: int) -> int:
        """``T(req_id, index)``: the token this runner samples at that index of the request."""
        keys = self._request_key(req_id)
        return int(self._targets(keys, np.array([index], dtype=np.int64))[0])

    def take_draft_token_ids(self) -> tuple[list[str], Int32Array, Int32Array] | None:
        """Sync spec decode: the drafts of the requests that sampled in the last executed
        step, ``K`` each, then forget them; flat, as a GPU runner holds them:
        ``(req_ids, draft_token_ids, num_draft_tokens)``, the arguments of
        ``Scheduler.update_draft_token_ids``. None when there is nothing, and always None
        under async scheduling (drafts stay in the runner, as on a GPU)."""
        drafts = self._pending_drafts
        self._pending_drafts = None
        return drafts

    # ------------------------------------------------------------------ the step

    def execute_model(self, scheduler_output: SchedulerOutputLike) -> ModelRunnerOutput:
        """Run one step: apply the state diff, expand the counts, sample, do bookkeeping."""
        so = scheduler_output
        config = self.config
        max_model_len = int(config.max_model_len)
        block_size = int(config.block_size)
        num_spec_cfg = int(config.num_speculative_tokens)
        num_sampled_per_step = int(config.num_sampled_tokens_per_step)
        is_async = bool(config.async_scheduling)
        if self._tokens.shape[1] != max_model_len:
            raise AssertionError(
                f"token rows have width {self._tokens.shape[1]} but "
                f"config.max_model_len is {max_model_len}"
            )
        self._pending_drafts = None
        self._apply_state_diff(so)

        req_ids = so.req_ids
        num_reqs = len(req_ids)
        if num_reqs == 0:
            if so.total_num_scheduled_tokens != 0:
                raise AssertionError(
                    f"total_num_scheduled_tokens={so.total_num_scheduled_tokens} "
                    "with no request scheduled"
                )
            return ModelRunnerOutput.empty()

        rows = self._rows_for(so, req_ids, max_model_len)
        self._append_blocks(so, rows)

        ns = np.asarray(so.num_scheduled_tokens)
        sched_computed = np.asarray(so.num_computed_tokens)
        if len(ns) != num_reqs or len(sched_computed) != num_reqs:
            raise AssertionError("per-request arrays are not aligned with req_ids")
        start = self._num_computed[rows]
        self._check_computed(req_ids, sched_computed, start, is_async)

        req_indices, positions = self._expand_counts(so, req_ids, rows, ns, start)

        # Draft slots: the last k positions of a request's step. They must sit right after
        # the request's known tokens; the non-draft positions may not run past them.
        ntok = self._num_tokens[rows]
        known_end = start + ns
        num_spec = np.zeros(0, dtype=np.int32)
        has_spec = False
        if num_spec_cfg > 0 or len(so.spec_token_ids):
            num_spec = np.asarray(so.num_spec_tokens)
            has_spec = bool(num_spec.any())
        if has_spec:
            known_end = known_end - num_spec
        over = known_end > ntok
        if over.any():
            i = int(np.argmax(over))
            raise AssertionError(
                f"request {req_ids[i]!r}: the step computes positions up to "
                f"{int(known_end[i]) - 1} but the request has only {int(ntok[i])} tokens"
            )
        drafts = np.zeros(0, dtype=np.int32)
        spec_rows = np.zeros(0, dtype=np.intp)
        spec_index = np.zeros(0, dtype=np.int64)
        if has_spec:
            drafts, spec_rows, spec_index = self._draft_slots(
                so, req_ids, rows, ns, num_spec, known_end, ntok, num_spec_cfg, is_async
            )
            self._tokens[spec_rows, spec_index] = drafts  # vLLM writes drafts after the tokens

        flat_rows = rows[req_indices]
        input_ids = self._tokens.reshape(-1)[positions + flat_rows * max_model_len]
        block_ids = self._block_table[flat_rows, positions // block_size].astype(np.int64)
        slot_mapping = block_ids * block_size + positions % block_size
        self.last_step_inputs = StepInputs(req_indices, positions, input_ids, slot_mapping)

        # Sampling. A request samples when the step reaches the end of its known tokens;
        # otherwise it is a non-final prefill chunk and gets an empty row.
        if num_sampled_per_step == 0:
            self._num_computed[rows] = start + ns
            return self._output(req_ids, np.zeros(0, np.int32), np.zeros(num_reqs, np.int32))
        samples = known_end >= ntok
        sampled, counts = self._sample(
            req_ids,
            rows,
            start,
            ns,
            ntok,
            samples,
            num_spec,
            has_spec,
            (drafts, spec_rows, spec_index),
        )
        return self._output(req_ids, sampled, counts)

    # ------------------------------------------------------------------ step parts

    def _apply_state_diff(self, so: SchedulerOutputLike) -> None:
        """(a) Forget finished requests; preempted ones keep their state (they may
        resume) but lose the drafts they held."""
        for req_id in so.finished_req_ids:
            self._forget(req_id)
        for req_id in so.preempted_req_ids:
            row = self._row_of.get(req_id)
            if row is not None:
                self._draft_base[row] = -1

    def _expand_counts(
        self,
        so: SchedulerOutputLike,
        req_ids: list[str],
        rows: npt.NDArray[np.intp],
        ns: npt.NDArray[np.int32],
        start: Int64Array,
    ) -> tuple[Int64Array, Int64Array]:
        """(c) The step's tokens as ``(request index, position)`` pairs, checked as vLLM's
        runner checks them: positions stay below ``max_model_len`` and inside the block
        table."""
        max_model_len = int(self.config.max_model_len)
        block_size = int(self.config.block_size)
        num_reqs = len(req_ids)
        # (c) Expand the counts as vLLM's _prepare_inputs does. np.repeat comes first so
        # that a negative count raises numpy's ValueError "repeats may not contain negative
        # values." (vLLM would assert total > 0 first when the counts sum to <= 0).
        try:
            req_indices = np.repeat(np.arange(num_reqs), ns)
        except ValueError as exc:
            if (ns < 0).any() and "repeats may not contain negative values" not in str(exc):
                # numpy checks the total first: with a negative sum it says "negative
                # dimensions are not allowed". Give every negative count one error.
                raise ValueError("repeats may not contain negative values.") from exc
            raise
        total = int(req_indices.size)
        if not (total > 0 and num_reqs > 0):
            raise AssertionError(f"total_num_scheduled_tokens={total} with {num_reqs} requests")
        if total != so.total_num_scheduled_tokens:
            raise AssertionError(
                f"total_num_scheduled_tokens={so.total_num_scheduled_tokens} "
                f"but num_scheduled_tokens sums to {total}"
            )
        if int(ns.min()) < 1:
            i = int(np.argmin(ns))
            raise AssertionError(f"request {req_ids[i]!r} is scheduled with n={int(ns[i])}")
        # Position of each token within its request (all zeros in a pure 1-token decode).
        query_pos = _within(ns, total) if total != num_reqs else np.zeros(total, np.int64)
        positions = start[req_indices] + query_pos
        last_pos = start + ns - 1
        if int(last_pos.max()) >= max_model_len:
            i = int(np.argmax(last_pos))
            raise AssertionError(
                f"request {req_ids[i]!r}: position {int(last_pos[i])} >= max_model_len "
                f"{max_model_len} would spill into the next token row "
                f"(computed {int(start[i])}, n={int(ns[i])})"
            )
        short = last_pos // block_size >= self._num_blocks[rows]
        if short.any():
            i = int(np.argmax(short))
            raise AssertionError(
                f"request {req_ids[i]!r}: position {int(last_pos[i])} needs block "
                f"#{int(last_pos[i]) // block_size} but its block table has "
                f"{int(self._num_blocks[rows[i]])} blocks"
            )
        return req_indices, positions

    def _sample(
        self,
        req_ids: list[str],
        rows: npt.NDArray[np.intp],
        start: Int64Array,
        ns: npt.NDArray[np.int32],
        ntok: Int64Array,
        samples: npt.NDArray[np.bool_],
        num_spec: npt.NDArray[np.int32],
        has_spec: bool,
        spec_slots: tuple[npt.NDArray[np.int32], npt.NDArray[np.intp], Int64Array],
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """(d) Sample for the requests that reached their known tokens, then (§6.3) the
        bookkeeping, with vLLM's assertion; returns the sampled tokens and their counts."""
        max_model_len = int(self.config.max_model_len)
        num_spec_cfg = int(self.config.num_speculative_tokens)
        is_async = bool(self.config.async_scheduling)
        drafts, spec_rows, spec_index = spec_slots
        num_reqs = len(req_ids)
        accepted = np.zeros(num_reqs, dtype=np.int64)
        if has_spec:
            accepted = self._accepted(rows, num_spec, drafts, spec_rows, spec_index)
        counts = np.where(samples, accepted + 1, 0)

        # (§6.3) Bookkeeping, with vLLM's assertion.
        end = ntok + counts
        overflow = (end > max_model_len) & (counts > 0)
        if overflow.any():
            i = int(np.argmax(overflow))
            raise AssertionError(
                "Sampled token IDs exceed the max model length. "
                f"Total number of tokens: {int(end[i])} > max_model_len: {max_model_len}"
            )
        num_out = int(counts.sum())
        out_rows = np.repeat(rows, counts)
        out_index = np.repeat(ntok, counts) + _within(counts, num_out)
        sampled = self._targets(self._keys[out_rows], out_index).astype(np.int32)
        self._tokens[out_rows, out_index] = sampled
        self._num_tokens[rows] = end
        rejected = num_spec - accepted if has_spec else 0
        self._num_computed[rows] = start + ns - rejected

        if num_spec_cfg > 0:
            self._propose(req_ids, rows, samples, end, num_spec_cfg, is_async)
        return sampled, counts.astype(np.int32)

    def _output(
        self, req_ids: list[str], sampled: Int32Array, counts: Int32Array
    ) -> ModelRunnerOutput:
        output = ModelRunnerOutput(req_ids, sampled, counts)
        output.req_ids = req_ids  # the scheduler output's own list, not a copy
        return output

    def _rows_for(
        self, so: SchedulerOutputLike, req_ids: list[str], max_model_len: int
    ) -> IntpArray:
        """Token-row index of each scheduled request, creating or reloading the state of
        new and resumed requests (their row is replaced by ``all_token_ids``)."""
        num_reqs = len(req_ids)
        rows: IntpArray = np.fromiter(
            map(self._row_of.get, req_ids, repeat(-1)), dtype=np.intp, count=num_reqs
        )
        new_ids = so.new_req_ids
        resumed_ids = so.resumed_req_ids
        if new_ids or resumed_ids:
            new_set = set(new_ids)
            resumed_set = set(resumed_ids)
            num_all = np.asarray(so.num_all_token_ids)
            all_ids = np.asarray(so.all_token_ids)
            sched_computed = np.asarray(so.num_computed_tokens)
            if len(num_all) != num_reqs:
                raise AssertionError("num_all_token_ids is not aligned with req_ids")
            offsets = np.cumsum(num_all, dtype=np.int64) - num_all
            if int(offsets[-1]) + int(num_all[-1]) != len(all_ids):
                raise AssertionError("all_token_ids does not match num_all_token_ids")
            admitted = np.flatnonzero(num_all).tolist()
            seen = 0
            for i in admitted:
                req_id = req_ids[i]
                row = int(rows[i])
                if req_id in new_set:
                    if row >= 0:
                        raise AssertionError(f"new request {req_id!r} is already live")
                elif req_id not in resumed_set:
                    raise AssertionError(
                        f"request {req_id!r} has all_token_ids but is neither new nor resumed"
                    )
                if row < 0:
                    row = self._alloc(req_id)
                    rows[i] = row
                seen += 1
                length = int(num_all[i])
                computed = int(sched_computed[i])
                if length > max_model_len:
                    raise AssertionError(
                        f"request {req_id!r} holds {length} tokens > max_model_len {max_model_len}"
                    )
                if not 0 <= computed <= length:
                    raise AssertionError(
                        f"request {req_id!r}: num_computed_tokens={computed} outside [0, {length}]"
                    )
                offset = int(offsets[i])
                self._tokens[row, :length] = all_ids[offset : offset + length]
                self._num_tokens[row] = length
                self._num_computed[row] = computed
                self._num_blocks[row] = 0  # the block table is replaced
                self._draft_base[row] = -1
            if seen != len(new_set) + len(resumed_set):
                raise AssertionError(
                    "every new and resumed request must be scheduled with its all_token_ids"
                )
        if num_reqs and int(rows.min()) < 0:
            i = int(np.argmin(rows))
            raise AssertionError(
                f"request {req_ids[i]!r} is scheduled but the runner holds no state for it "
                "(it is neither new nor resumed)"
            )
        mark = np.zeros(len(self._num_tokens), dtype=np.bool_)
        mark[rows] = True
        if np.count_nonzero(mark) != num_reqs:
            raise AssertionError("a request id is scheduled twice in one step")
        return rows

    def _append_blocks(self, so: SchedulerOutputLike, rows: IntpArray) -> None:
        """Append each request's new block ids (a replacement for new and resumed requests,
        whose table ``_rows_for`` has just emptied)."""
        num_block_ids = np.asarray(so.num_block_ids)
        block_ids = np.asarray(so.block_ids)
        if len(num_block_ids) != len(rows):
            raise AssertionError("num_block_ids is not aligned with req_ids")
        total = len(block_ids)
        if total == 0 and not num_block_ids.any():
            return
        table_rows = np.repeat(rows, num_block_ids)
        if len(table_rows) != total:
            raise AssertionError(
                f"block_ids has {total} ids but num_block_ids sums to {len(table_rows)}"
            )
        if int(block_ids.min()) <= 0:
            raise AssertionError(
                f"block id {int(block_ids.min())} in a block table: block 0 is the null block "
                "and is never allocated"
            )
        first = self._num_blocks[rows]
        new_counts = first + num_block_ids
        width = self._block_table.shape[1]
        if int(new_counts.max()) > width:
            i = int(np.argmax(new_counts))
            raise AssertionError(
                f"request {so.req_ids[i]!r} would hold {int(new_counts[i])} blocks, more than "
                f"the {width} that max_model_len needs"
            )
        cols = np.repeat(first, num_block_ids) + _within(num_block_ids, total)
        self._block_table[table_rows, cols] = block_ids
        self._num_blocks[rows] = new_counts

    def _check_computed(
        self,
        req_ids: list[str],
        sched_computed: Int32Array,
        start: Int64Array,
        is_async: bool,
    ) -> None:
        """The scheduler's ``C`` is optimistic under async scheduling (it counts in-flight
        drafts as accepted) but never below the truth; in sync mode the two agree."""
        behind = sched_computed < start
        if behind.any():
            i = int(np.argmax(behind))
            raise AssertionError(
                f"request {req_ids[i]!r}: scheduler's num_computed_tokens "
                f"{int(sched_computed[i])} < the runner's true {int(start[i])}"
            )
        if not is_async:
            differ = sched_computed != start
            if differ.any():
                i = int(np.argmax(differ))
                raise AssertionError(
                    f"request {req_ids[i]!r}: sync scheduling, but the scheduler's "
                    f"num_computed_tokens {int(sched_computed[i])} != the runner's "
                    f"{int(start[i])}"
                )

    def _draft_slots(
        self,
        so: SchedulerOutputLike,
        req_ids: list[str],
        rows: IntpArray,
        ns: Int32Array,
        num_spec: Int32Array,
        known_end: Int64Array,
        ntok: Int64Array,
        num_spec_cfg: int,
        is_async: bool,
    ) -> tuple[Int32Array, IntpArray, Int64Array]:
        """The draft each scheduled draft slot holds, with its row and token index.

        Sync: the scheduler's ids (``-1`` is padding). Async: the drafts this runner
        proposed for that request at its previous step, or padding if it holds none.
        With ``accept_padded_drafts`` a padding slot is a real draft (see ``_propose``)."""
        spec_ids = np.asarray(so.spec_token_ids)
        num_slots = check_draft_slots(req_ids, ns, num_spec, spec_ids, num_spec_cfg)
        misplaced = (num_spec > 0) & (known_end != ntok)
        if misplaced.any():
            i = int(np.argmax(misplaced))
            raise AssertionError(
                f"request {req_ids[i]!r}: draft slots scheduled in a non-final prefill chunk "
                f"(non-draft positions end at {int(known_end[i])}, {int(ntok[i])} tokens)"
            )
        slot_rows = np.repeat(rows, num_spec)
        within = _within(num_spec, num_slots)
        slot_index = np.repeat(ntok, num_spec) + within
        if is_async:
            held = self._draft_base[slot_rows] == slot_index - within
            drafts = np.where(held, self._drafts[slot_rows, within], np.int32(-1))
        else:
            drafts = spec_ids.copy()
        if self.accept_padded_drafts:
            padded = drafts == -1
            if padded.any():
                proposals = self._proposals(self._keys[slot_rows], slot_index)
                drafts = np.where(padded, proposals, drafts)
        return drafts.astype(np.int32, copy=False), slot_rows, slot_index

    def _accepted(
        self,
        rows: IntpArray,
        num_spec: Int32Array,
        drafts: Int32Array,
        slot_rows: IntpArray,
        slot_index: Int64Array,
    ) -> Int64Array:
        """Accepted drafts per request: the leading drafts equal to ``T`` at their index.
        A ``-1`` (or any id out of the vocabulary) never matches."""
        num_slots = len(drafts)
        within = _within(num_spec, num_slots)
        match = drafts == self._targets(self._keys[slot_rows], slot_index)
        lengths = np.repeat(num_spec, num_spec).astype(np.int64)
        first_miss = np.where(match, lengths, within)
        accepted = np.zeros(len(rows), dtype=np.int64)
        with_spec = np.flatnonzero(num_spec)
        seg_starts = np.cumsum(num_spec, dtype=np.int64) - num_spec
        accepted[with_spec] = np.minimum.reduceat(first_miss, seg_starts[with_spec])
        return accepted

    def _propose(
        self,
        req_ids: list[str],
        rows: IntpArray,
        samples: BoolArray,
        end: Int64Array,
        num_spec_cfg: int,
        is_async: bool,
    ) -> None:
        """After sampling, propose K drafts for the next K indices of each sampled request."""
        sampled_at = np.flatnonzero(samples)
        if len(sampled_at) == 0:
            return
        sampled_rows = rows[sampled_at]
        base = end[sampled_at]
        offsets = np.tile(np.arange(num_spec_cfg, dtype=np.int64), len(sampled_at))
        index = np.repeat(base, num_spec_cfg) + offsets
        keys = np.repeat(self._keys[sampled_rows], num_spec_cfg)
        proposals = self._proposals(keys, index).astype(np.int32).reshape(-1, num_spec_cfg)
        self._drafts[sampled_rows, :num_spec_cfg] = proposals
        self._draft_base[sampled_rows] = base
        if not is_async:
            ids = (
                req_ids
                if len(sampled_at) == len(req_ids)
                else [req_ids[i] for i in sampled_at.tolist()]
            )
            counts = np.full(len(ids), num_spec_cfg, dtype=np.int32)
            self._pending_drafts = (list(ids), proposals.ravel(), counts)

    # ------------------------------------------------------------------ hashing

    def _request_key(self, req_id: str) -> U64Array:
        crc = np.array([zlib.crc32(req_id.encode("utf-8"))], dtype=np.uint64)
        return mix64(self._seed_key ^ mix64(crc))

    def _hash(self, keys: U64Array, index: Int64Array) -> U64Array:
        return mix64(keys ^ mix64(index.astype(np.uint64)))

    def _targets(self, keys: U64Array, index: Int64Array) -> Int64Array:
        """``T`` at each (request key, token index)."""
        return self._targets_from_hash(self._hash(keys, index))

    def _targets_from_hash(self, h: U64Array) -> Int64Array:
        vocab = self.vocab_size
        eos = self.eos_token_id
        if eos is not None and self._eos_in_vocab:
            tokens = (h % np.uint64(vocab - 1)).astype(np.int64)
            tokens += tokens >= eos  # skip the EOS id
        else:
            tokens = (h % np.uint64(vocab)).astype(np.int64)
        if eos is not None and self.eos_probability > 0.0:
            is_eos = _unit(mix64(h ^ _SALT_EOS)) < self.eos_probability
            tokens = np.where(is_eos, np.int64(eos), tokens)
        return tokens

    def _proposals(self, keys: U64Array, index: Int64Array) -> Int64Array:
        """The draft proposed for each index: ``T`` with probability ``acceptance_rate``,
        otherwise another token that is not EOS either."""
        h = self._hash(keys, index)
        targets = self._targets_from_hash(h)
        vocab = self.vocab_size
        other = (targets + 1) % vocab
        if self._eos_in_vocab:
            other = np.where(other == self.eos_token_id, (targets + 2) % vocab, other)
        hit = _unit(mix64(h ^ _SALT_ACCEPT)) < self.acceptance_rate
        return np.where(hit, targets, other)

    # ------------------------------------------------------------------ rows

    def _row(self, req_id: str) -> int:
        try:
            return self._row_of[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not live in the runner") from None

    def _alloc(self, req_id: str) -> int:
        if not self._free_rows:
            self._grow()
        row = self._free_rows.pop()
        self._row_of[req_id] = row
        self._keys[row] = self._request_key(req_id)[0]
        return row

    def _forget(self, req_id: str) -> None:
        row = self._row_of.pop(req_id, None)
        if row is not None:
            self._num_tokens[row] = 0
            self._num_computed[row] = 0
            self._num_blocks[row] = 0
            self._draft_base[row] = -1
            self._free_rows.append(row)

    def _grow(self) -> None:
        old = len(self._num_tokens)
        new = old * 2
        self._tokens = _grown(self._tokens, new)
        self._num_tokens = _grown(self._num_tokens, new)
        self._num_computed = _grown(self._num_computed, new)
        self._keys = _grown(self._keys, new)
        self._block_table = _grown(self._block_table, new)
        self._num_blocks = _grown(self._num_blocks, new)
        self._drafts = _grown(self._drafts, new)
        self._draft_base = _grown(self._draft_base, new, fill=-1)
        self._free_rows.extend(range(new - 1, old - 1, -1))


def _grown(array: npt.NDArray[_G], rows: int, fill: int = 0) -> npt.NDArray[_G]:
    """``array`` with ``rows`` rows: the old ones copied, the new ones set to ``fill``.
    ``np.zeros`` leaves untouched pages unallocated, so wide token rows cost nothing
    until used."""
    bigger = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    bigger[: len(array)] = array
    if fill:
        bigger[len(array) :] = fill
    return bigger
