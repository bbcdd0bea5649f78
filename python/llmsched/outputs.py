"""What a model runner hands back to the scheduler after executing a step."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from llmsched._core import OutputMismatchError

_INT32_MAX = np.iinfo(np.int32).max


def _as_int32_vector(name: str, value: Any) -> npt.NDArray[np.int32]:
    """A contiguous int32 vector: ``value`` itself when it is one (no copy), else a checked
    conversion."""
    if (
        type(value) is np.ndarray
        and value.dtype == np.int32
        and value.ndim == 1
        and value.flags.c_contiguous
    ):
        return value
    array = np.asarray(value)
    if array.ndim != 1:
        raise OutputMismatchError(f"{name}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int32)
    if array.dtype.kind not in "iu":
        raise OutputMismatchError(f"{name}: expected integers, got dtype {array.dtype}")
    if array.dtype != np.int32:
        low, high = int(array.min()), int(array.max())
        if low < -_INT32_MAX - 1 or high > _INT32_MAX:
            bad = high if high > _INT32_MAX else low
            raise OutputMismatchError(f"{name}: value {bad} does not fit int32")
        array = array.astype(np.int32)
    return np.ascontiguousarray(array)


def _as_id_list(value: Any) -> list[str]:
    """``req_ids`` as a list (the very list when it is one; its items are checked by the
    scheduler, which matches them to its step)."""
    if type(value) is list:
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise OutputMismatchError(
            f"req_ids: expected a sequence of str, got {type(value).__name__}"
        )
    return list(value)


class ModelRunnerOutput:
    """Sampled tokens of one executed step.

    ``sampled_token_ids`` is flat; ``num_sampled[i]`` tokens of it belong to
    ``req_ids[i]``, in order (accepted drafts, then the bonus or recovered
    token). A non-final prefill chunk has 0. Any runner can build one, and
    ``from_lists`` takes vLLM's list-of-lists shape.

    Arrays that are already contiguous int32 are used as they are (no copy); do not
    modify them until the output has been applied.
    """

    __slots__ = ("num_sampled", "req_ids", "sampled_token_ids")

    req_ids: list[str]
    sampled_token_ids: npt.NDArray[np.int32]
    num_sampled: npt.NDArray[np.int32]

    def __init__(self, req_ids: Sequence[str], sampled_token_ids: Any, num_sampled: Any) -> None:
        # Conversion only: how the counts fit the ids, the tokens and the step is checked
        # once, by the scheduler, when the output is applied.
        self.req_ids = _as_id_list(req_ids)
        self.sampled_token_ids = _as_int32_vector("sampled_token_ids", sampled_token_ids)
        self.num_sampled = _as_int32_vector("num_sampled", num_sampled)

    @classmethod
    def from_lists(
        cls, req_ids: Sequence[str], sampled_token_ids: Sequence[Sequence[int]]
    ) -> ModelRunnerOutput:
        """Build from vLLM's shape: one list of token ids per request."""
        ids = _as_id_list(req_ids)
        if isinstance(sampled_token_ids, (str, bytes)) or not isinstance(
            sampled_token_ids, Iterable
        ):
            raise OutputMismatchError(
                "sampled_token_ids: expected a sequence of token id lists, got "
                f"{type(sampled_token_ids).__name__}"
            )
        rows = list(sampled_token_ids)
        if len(rows) != len(ids):
            raise OutputMismatchError(
                f"sampled_token_ids: has {len(rows)} rows for {len(ids)} req_ids"
            )
        for i, row in enumerate(rows):
            if isinstance(row, (str, bytes)) or not isinstance(row, Sequence | np.ndarray):
                raise OutputMismatchError(
                    f"sampled_token_ids[{i}]: expected a sequence of token ids, got "
                    f"{type(row).__name__}"
                )
        counts = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
        flat: list[int] = [token for row in rows for token in row]
        # No dtype here: a float or a bool among the tokens must fail the check, not be cast.
        return cls(ids, np.asarray(flat) if flat else np.zeros(0, dtype=np.int32), counts)

    @classmethod
    def empty(cls) -> ModelRunnerOutput:
        """The output of a step that scheduled nothing."""
        return cls([], np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32))

    def __len__(self) -> int:
        return len(self.req_ids)

    def __repr__(self) -> str:
        return (
            f"ModelRunnerOutput({len(self.req_ids)} requests, {len(self.sampled_token_ids)} tokens)"
        )
