"""What a GPU model runner keeps per request between steps (vLLM's persistent batch).

One row per live request: a token row of width ``max_model_len`` (like vLLM's
``token_ids_cpu``), the request's true counters, its block table, its key in the token
model, and the drafts the runner proposed for it (async: they stay here, as on a GPU).
Rows are recycled through a free list and the arrays double when full.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from llmsched.sim._arrays import Int32Array, Int64Array, IntpArray, U64Array, grown

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
