"""splitmix64, element-wise on ``uint64`` arrays: the deterministic hash behind the
simulated runner's tokens and the synthetic workloads' prompts."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U64Array = npt.NDArray[np.uint64]

# As numpy scalars, so that array operations never see a Python int (an int above int64's
# range would otherwise make numpy pick another dtype).
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_SHIFT30 = np.uint64(30)
_SHIFT27 = np.uint64(27)
_SHIFT31 = np.uint64(31)


def finalize64(x: U64Array) -> U64Array:
    """splitmix64's finalizer (numpy wraps the uint64 arithmetic)."""
    z = (x ^ (x >> _SHIFT30)) * _MUL1
    z = (z ^ (z >> _SHIFT27)) * _MUL2
    return z ^ (z >> _SHIFT31)


def mix64(x: U64Array) -> U64Array:
    """One splitmix64 step: the golden-ratio increment, then the finalizer."""
    return finalize64(x + GOLDEN)
