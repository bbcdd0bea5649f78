"""A simulated model runner that mirrors the bookkeeping of vLLM's V1 GPU model runner.

It does no model math. It keeps what a real runner keeps (spec §6, ``batch``): one
persistent 2-D ``int32`` array of token rows of width ``max_model_len`` (like vLLM's
``token_ids_cpu``), a block table per request, and the request's *true* counters, and it
expands every ``SchedulerOutput`` into positions, input ids and a slot mapping exactly the
way the V1 runner does. So a scheduler that breaks the runner contract (spec §6.5,
``contract``) fails here the way vLLM fails: a negative count raises numpy's ``ValueError:
repeats may not contain negative values.``, and a sampled token written past the row
raises vLLM's ``Sampled token IDs exceed the max model length...`` ``AssertionError``.

Sampled tokens are deterministic (``tokens``): the token at index ``i`` of request ``r`` is
always ``T(r, i)`` (see ``target_token``), whatever the step sizes, the drafts and their
acceptance; drafts and their acceptance are the ``drafts`` module's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmsched.outputs import ModelRunnerOutput
from llmsched.sim._arrays import Int32Array, Int64Array, IntpArray, within
from llmsched.sim.batch import PersistentBatch
from llmsched.sim.contract import SchedulerConfigLike, SchedulerOutputLike
from llmsched.sim.drafts import Drafts, SpecDecoding
from llmsched.sim.tokens import TokenModel

__all__ = ["SimulatedModelRunner", "StepInputs"]


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
        # (A config-like object without the property is not a diffusion model's.)
        if getattr(config, "is_diffusion", False):
            raise ValueError(
                "config: a diffusion LLM (num_sampled_tokens_per_step=0 with "
                "num_speculative_tokens > 0), which the simulated runner does not run"
            )
        self.config = config
        self.tokens = TokenModel(
            seed,
            vocab_size=vocab_size,
            acceptance_rate=acceptance_rate,
            eos_token_id=eos_token_id,
            eos_probability=eos_probability,
        )
        width = int(config.max_model_len)
        block_size = int(config.block_size)
        num_spec = int(config.num_speculative_tokens)
        if width < 1 or block_size < 1 or num_spec < 0:
            raise ValueError("config: max_model_len and block_size must be >= 1")
        capacity = max(1, min(int(config.max_num_seqs), 16))
        self.batch = PersistentBatch(capacity, width, -(-width // block_size), num_spec)
        self.spec = SpecDecoding(
            self.batch,
            self.tokens,
            num_spec=num_spec,
            is_async=bool(config.async_scheduling),
            accept_padded_drafts=accept_padded_drafts,
        )
        self.last_step_inputs: StepInputs | None = None
        """Positions, input ids and slot mapping of the last step that scheduled tokens."""

    @property
    def seed(self) -> int:
        return self.tokens.seed

    @property
    def vocab_size(self) -> int:
        return self.tokens.vocab_size

    @property
    def acceptance_rate(self) -> float:
        return self.tokens.acceptance_rate

    @property
    def eos_token_id(self) -> int | None:
        return self.tokens.eos_token_id

    # ------------------------------------------------------------------ read-only helpers

    @property
    def num_live_requests(self) -> int:
        """Requests the runner holds state for (running, or preempted and not finished)."""
        return len(self.batch.row_of)

    def num_tokens(self, req_id: str) -> int:
        """True number of tokens of a live request: prompt plus the outputs it produced."""
        return int(self.batch.num_tokens[self.batch.row(req_id)])

    def num_computed_tokens(self, req_id: str) -> int:
        """Positions of a live request whose KV is really computed."""
        return int(self.batch.num_computed[self.batch.row(req_id)])

    def token_ids(self, req_id: str) -> list[int]:
        """A copy of a live request's token row, up to its true number of tokens."""
        row = self.batch.row(req_id)
        tokens: list[int] = self.batch.tokens[row, : self.batch.num_tokens[row]].tolist()
        return tokens

    def target_token(self, req_id: str, index: int) -> int:
        """``T(req_id, index)``: the token this runner samples at that index of the request."""
        keys = self.tokens.request_key(req_id)
        return int(self.tokens.targets(keys, np.array([index], dtype=np.int64))[0])

    def take_draft_token_ids(self) -> Drafts | None:
        """Sync spec decode: the drafts of the requests that sampled in the last executed
        step, ``K`` each, then forget them; flat, as a GPU runner holds them:
        ``(req_ids, draft_token_ids, num_draft_tokens)``, the arguments of
        ``Scheduler.update_draft_token_ids``. None when there is nothing, and always None
        under async scheduling (drafts stay in the runner, as on a GPU)."""
        return self.spec.take_pending()

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
        if self.batch.width != max_model_len:
            raise AssertionError(
                f"token rows have width {self.batch.width} but "
                f"config.max_model_len is {max_model_len}"
            )
        self.spec.discard_pending()
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

        rows = self.batch.rows_for_step(so, max_model_len, self._key_of)
        self.batch.append_blocks(so, rows)

        ns = np.asarray(so.num_scheduled_tokens)
        sched_computed = np.asarray(so.num_computed_tokens)
        if len(ns) != num_reqs or len(sched_computed) != num_reqs:
            raise AssertionError("per-request arrays are not aligned with req_ids")
        start = self.batch.num_computed[rows]
        self._check_computed(req_ids, sched_computed, start, is_async)

        req_indices, positions = self._expand_counts(so, req_ids, rows, ns, start)

        # Draft slots: the last k positions of a request's step. They must sit right after
        # the request's known tokens; the non-draft positions may not run past them.
        ntok = self.batch.num_tokens[rows]
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
            drafts, spec_rows, spec_index = self.spec.slots(so, rows, ns, num_spec, known_end, ntok)
            self.batch.tokens[spec_rows, spec_index] = drafts  # vLLM writes drafts after the tokens

        flat_rows = rows[req_indices]
        input_ids = self.batch.tokens.reshape(-1)[positions + flat_rows * max_model_len]
        block_ids = self.batch.block_table[flat_rows, positions // block_size].astype(np.int64)
        slot_mapping = block_ids * block_size + positions % block_size
        self.last_step_inputs = StepInputs(req_indices, positions, input_ids, slot_mapping)

        # Sampling. A request samples when the step reaches the end of its known tokens;
        # otherwise it is a non-final prefill chunk and gets an empty row.
        if num_sampled_per_step == 0:
            self.batch.num_computed[rows] = start + ns
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
            self.batch.forget(req_id)
        for req_id in so.preempted_req_ids:
            self.batch.drop_drafts(req_id)

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
        query_pos = within(ns, total) if total != num_reqs else np.zeros(total, np.int64)
        positions = start[req_indices] + query_pos
        last_pos = start + ns - 1
        if int(last_pos.max()) >= max_model_len:
            i = int(np.argmax(last_pos))
            raise AssertionError(
                f"request {req_ids[i]!r}: position {int(last_pos[i])} >= max_model_len "
                f"{max_model_len} would spill into the next token row "
                f"(computed {int(start[i])}, n={int(ns[i])})"
            )
        short = last_pos // block_size >= self.batch.num_blocks[rows]
        if short.any():
            i = int(np.argmax(short))
            raise AssertionError(
                f"request {req_ids[i]!r}: position {int(last_pos[i])} needs block "
                f"#{int(last_pos[i]) // block_size} but its block table has "
                f"{int(self.batch.num_blocks[rows[i]])} blocks"
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
        drafts, spec_rows, spec_index = spec_slots
        num_reqs = len(req_ids)
        accepted = np.zeros(num_reqs, dtype=np.int64)
        if has_spec:
            accepted = self.spec.accepted(num_reqs, num_spec, drafts, spec_rows, spec_index)
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
        out_index = np.repeat(ntok, counts) + within(counts, num_out)
        sampled = self.tokens.targets(self.batch.keys[out_rows], out_index).astype(np.int32)
        self.batch.tokens[out_rows, out_index] = sampled
        self.batch.num_tokens[rows] = end
        rejected = num_spec - accepted if has_spec else 0
        self.batch.num_computed[rows] = start + ns - rejected

        if num_spec_cfg > 0:
            self.spec.propose(req_ids, rows, samples, end)
        return sampled, counts.astype(np.int32)

    def _output(
        self, req_ids: list[str], sampled: Int32Array, counts: Int32Array
    ) -> ModelRunnerOutput:
        output = ModelRunnerOutput(req_ids, sampled, counts)
        output.req_ids = req_ids  # the scheduler output's own list, not a copy
        return output

    def _key_of(self, req_id: str) -> int:
        return int(self.tokens.request_key(req_id)[0])

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
