"""What a GPU model runner keeps per request between steps (vLLM's persistent batch).

One row per live request: a token row of width ``max_model_len`` (like vLLM's
``token_ids_cpu``), the request's true counters, its block table, its key in the token
model, and the drafts the runner proposed for it (async: they stay here, as on a GPU).
Rows are recycled through a free list and the arrays double when full. A step's state diff
(new and resumed requests with their tokens, new block ids) updates it as vLLM's runner
updates its batch, asserting what that runner asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

import numpy as np

from llmsched.sim._arrays import Int32Array, Int64Array, IntpArray, U64Array, grown, within
from llmsched.sim.contract import SchedulerOutputLike

__all__ = ["PersistentBatch"]


class PersistentBatch:
    """The per-request arrays, indexed by row; ``row_of`` maps live request ids to rows."""

    def __init__(self, capacity: int, width: int, max_blocks: int, num_spec: int) -> None:
        self.tokens: Int32Array = np.zeros((capacity, width), dtype=np.int32)
        self.num_tokens: Int64Array = np.zeros(capacity, dtype=np.int64)
        """True number of tokens: prompt plus the outputs the runner produced."""
        self.num_computed: Int64Array = np.zeros(capacity, dtype=np.int64)
        """Positions whose KV is really computed."""
        self.keys: U64Array = np.zeros(capacity, dtype=np.uint64)
        self.block_table: Int32Array = np.zeros((capacity, max_blocks), dtype=np.int32)
        self.num_blocks: Int64Array = np.zeros(capacity, dtype=np.int64)
        # Drafts proposed for a row, valid for token indices draft_base .. draft_base + K - 1;
        # draft_base -1 means none.
        self.drafts: Int32Array = np.zeros((capacity, max(num_spec, 1)), dtype=np.int32)
        self.draft_base: Int64Array = np.full(capacity, -1, dtype=np.int64)
        self.row_of: dict[str, int] = {}
        self._free_rows: list[int] = list(range(capacity - 1, -1, -1))

    @property
    def width(self) -> int:
        """The token rows' width (``max_model_len`` when the batch was made)."""
        return int(self.tokens.shape[1])

    def row(self, req_id: str) -> int:
        """The live request's row; ``KeyError`` naming it otherwise."""
        try:
            return self.row_of[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not live in the runner") from None

    def alloc(self, req_id: str, key: int) -> int:
        """A fresh row for ``req_id``, its state empty."""
        if not self._free_rows:
            self._grow()
        row = self._free_rows.pop()
        self.row_of[req_id] = row
        self.keys[row] = key
        return row

    def load(self, row: int, tokens: Int32Array, num_computed: int) -> None:
        """Replace a row's state with a new or resumed request's: its tokens, ``C``, and an
        empty block table (the step appends the whole table)."""
        length = len(tokens)
        self.tokens[row, :length] = tokens
        self.num_tokens[row] = length
        self.num_computed[row] = num_computed
        self.num_blocks[row] = 0
        self.draft_base[row] = -1

    def forget(self, req_id: str) -> None:
        """Free a finished request's row (nothing if it holds none)."""
        row = self.row_of.pop(req_id, None)
        if row is not None:
            self.num_tokens[row] = 0
            self.num_computed[row] = 0
            self.num_blocks[row] = 0
            self.draft_base[row] = -1
            self._free_rows.append(row)

    def drop_drafts(self, req_id: str) -> None:
        """A preempted request keeps its state (it may resume) but loses its drafts."""
        row = self.row_of.get(req_id)
        if row is not None:
            self.draft_base[row] = -1

    def rows_of(self, req_ids: list[str]) -> IntpArray:
        """Each id's row, -1 where the batch holds none."""
        rows: IntpArray = np.fromiter(
            map(self.row_of.get, req_ids, repeat(-1)), dtype=np.intp, count=len(req_ids)
        )
        return rows

    def rows_for_step(
        self, so: SchedulerOutputLike, max_model_len: int, key_of: Callable[[str], int]
    ) -> IntpArray:
        """Token-row index of each scheduled request, creating or reloading the state of
        new and resumed requests (their row is replaced by ``all_token_ids``)."""
        req_ids = so.req_ids
        num_reqs = len(req_ids)
        rows = self.rows_of(req_ids)
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
                    row = self.alloc(req_id, key_of(req_id))
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
                self.load(row, all_ids[offset : offset + length], computed)
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
        mark = np.zeros(len(self.num_tokens), dtype=np.bool_)
        mark[rows] = True
        if np.count_nonzero(mark) != num_reqs:
            raise AssertionError("a request id is scheduled twice in one step")
        return rows

    def append_blocks(self, so: SchedulerOutputLike, rows: IntpArray) -> None:
        """Append each request's new block ids (a replacement for new and resumed requests,
        whose table ``rows_for_step`` has just emptied)."""
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
        first = self.num_blocks[rows]
        new_counts = first + num_block_ids
        width = self.block_table.shape[1]
        if int(new_counts.max()) > width:
            i = int(np.argmax(new_counts))
            raise AssertionError(
                f"request {so.req_ids[i]!r} would hold {int(new_counts[i])} blocks, more than "
                f"the {width} that max_model_len needs"
            )
        cols = np.repeat(first, num_block_ids) + within(num_block_ids, total)
        self.block_table[table_rows, cols] = block_ids
        self.num_blocks[rows] = new_counts

    def _grow(self) -> None:
        old = len(self.num_tokens)
        new = old * 2
        self.tokens = grown(self.tokens, new)
        self.num_tokens = grown(self.num_tokens, new)
        self.num_computed = grown(self.num_computed, new)
        self.keys = grown(self.keys, new)
        self.block_table = grown(self.block_table, new)
        self.num_blocks = grown(self.num_blocks, new)
        self.drafts = grown(self.drafts, new)
        self.draft_base = grown(self.draft_base, new, fill=-1)
        self._free_rows.extend(range(new - 1, old - 1, -1))
