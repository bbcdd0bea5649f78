"""numpy helpers the simulated runner's parts share: array types, per-request segments."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "BoolArray",
    "Int32Array",
    "Int64Array",
    "IntpArray",
    "U64Array",
    "grown",
    "within",
]

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]
IntpArray = npt.NDArray[np.intp]
U64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]
_G = TypeVar("_G", bound=np.generic)


def within(counts: npt.NDArray[np.integer], total: int) -> Int64Array:
    """For counts ``[2, 3]``: ``[0, 1, 0, 1, 2]`` (vLLM's ``_get_cumsum_and_arange``)."""
    ends = np.cumsum(counts, dtype=np.int64)
    offsets: Int64Array = np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts)
    return offsets


def grown(array: npt.NDArray[_G], rows: int, fill: int = 0) -> npt.NDArray[_G]:
    """``array`` with ``rows`` rows: the old ones copied, the new ones set to ``fill``.
    ``np.zeros`` leaves untouched pages unallocated, so wide token rows cost nothing
    until used."""
    bigger = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    bigger[: len(array)] = array
    if fill:
        bigger[len(array) :] = fill
    return bigger
