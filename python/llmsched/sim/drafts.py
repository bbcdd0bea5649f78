"""Speculative decoding in the simulated runner: what each draft slot holds, how many
drafts the model accepts, and the drafts the runner proposes for the next step."""

from __future__ import annotations

import numpy as np

from llmsched.sim._arrays import BoolArray, Int32Array, Int64Array, IntpArray, within
from llmsched.sim.batch import PersistentBatch
from llmsched.sim.contract import SchedulerOutputLike, check_draft_slots
from llmsched.sim.tokens import TokenModel

__all__ = ["Drafts", "SpecDecoding"]

Drafts = tuple[list[str], Int32Array, Int32Array]
"""``(req_ids, draft_token_ids, num_draft_tokens)``, the arguments of
``Scheduler.update_draft_token_ids``: flat, as a GPU runner holds them."""


class SpecDecoding:
    """The runner's drafter and verifier over its persistent batch.

    Sync: the drafts are the scheduler's (``spec_token_ids``; ``-1`` is padding), handed
    back after each step (:meth:`take_pending`). Async: the scheduler only sees
    placeholders and a slot holds the draft this runner proposed for that index at the
    request's previous step, or padding. With ``accept_padded_drafts`` a padding slot is
    a real draft: a drafter that proposed for a request the scheduler padded."""

    def __init__(
        self,
        batch: PersistentBatch,
        tokens: TokenModel,
        *,
        num_spec: int,
        is_async: bool,
        accept_padded_drafts: bool,
    ) -> None:
        self.batch = batch
        self.tokens = tokens
        self.num_spec = num_spec
        self.is_async = is_async
        self.accept_padded_drafts = accept_padded_drafts
        self._pending: Drafts | None = None

    def discard_pending(self) -> None:
        """A new step begins: the last step's drafts are no longer to be handed over."""
        self._pending = None

    def take_pending(self) -> Drafts | None:
        """Sync: the drafts proposed at the last step, then forget them; always None async."""
        drafts, self._pending = self._pending, None
        return drafts

    def slots(
        self,
        so: SchedulerOutputLike,
        rows: IntpArray,
        ns: Int32Array,
        num_spec: Int32Array,
        known_end: Int64Array,
        ntok: Int64Array,
    ) -> tuple[Int32Array, IntpArray, Int64Array]:
        """The draft each scheduled draft slot holds, with its row and token index. Draft
        slots must sit right after the request's known tokens."""
        req_ids = so.req_ids
        spec_ids = np.asarray(so.spec_token_ids)
        num_slots = check_draft_slots(req_ids, ns, num_spec, spec_ids, self.num_spec)
        misplaced = (num_spec > 0) & (known_end != ntok)
        if misplaced.any():
            i = int(np.argmax(misplaced))
            raise AssertionError(
                f"request {req_ids[i]!r}: draft slots scheduled in a non-final prefill chunk "
                f"(non-draft positions end at {int(known_end[i])}, {int(ntok[i])} tokens)"
            )
        slot_rows = np.repeat(rows, num_spec)
        offset = within(num_spec, num_slots)
        slot_index = np.repeat(ntok, num_spec) + offset
        batch = self.batch
        if self.is_async:
            held = batch.draft_base[slot_rows] == slot_index - offset
            drafts = np.where(held, batch.drafts[slot_rows, offset], np.int32(-1))
        else:
            drafts = spec_ids.copy()
        if self.accept_padded_drafts:
            padded = drafts == -1
            if padded.any():
                proposals = self.tokens.proposals(batch.keys[slot_rows], slot_index)
                drafts = np.where(padded, proposals, drafts)
        return drafts.astype(np.int32, copy=False), slot_rows, slot_index

    def accepted(
        self,
        num_reqs: int,
        num_spec: Int32Array,
        drafts: Int32Array,
        slot_rows: IntpArray,
        slot_index: Int64Array,
    ) -> Int64Array:
        """Accepted drafts per request: the leading drafts equal to ``T`` at their index.
        A ``-1`` (or any id out of the vocabulary) never matches."""
        offset = within(num_spec, len(drafts))
        match = drafts == self.tokens.targets(self.batch.keys[slot_rows], slot_index)
        lengths = np.repeat(num_spec, num_spec).astype(np.int64)
        first_miss = np.where(match, lengths, offset)
        accepted = np.zeros(num_reqs, dtype=np.int64)
        with_spec = np.flatnonzero(num_spec)
        seg_starts = np.cumsum(num_spec, dtype=np.int64) - num_spec
        accepted[with_spec] = np.minimum.reduceat(first_miss, seg_starts[with_spec])
        return accepted

    def propose(
        self, req_ids: list[str], rows: IntpArray, samples: BoolArray, end: Int64Array
    ) -> None:
        """After sampling, propose K drafts for the next K indices of each sampled request."""
        sampled_at = np.flatnonzero(samples)
        if len(sampled_at) == 0:
            return
        k = self.num_spec
        sampled_rows = rows[sampled_at]
        base = end[sampled_at]
        index = np.repeat(base, k) + np.tile(np.arange(k, dtype=np.int64), len(sampled_at))
        keys = np.repeat(self.batch.keys[sampled_rows], k)
        proposals = self.tokens.proposals(keys, index).astype(np.int32).reshape(-1, k)
        self.batch.drafts[sampled_rows, :k] = proposals
        self.batch.draft_base[sampled_rows] = base
        if not self.is_async:
            ids = (
                req_ids
                if len(sampled_at) == len(req_ids)
                else [req_ids[i] for i in sampled_at.tolist()]
            )
            counts = np.full(len(ids), k, dtype=np.int32)
            self._pending = (list(ids), proposals.ravel(), counts)
