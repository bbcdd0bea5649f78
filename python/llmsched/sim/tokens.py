"""The simulated model's tokens: what it samples and what its drafter proposes.

Every token is a pure function of (seed, request id, token index): the token at index ``i``
of request ``r`` is ``T(r, i)``, a splitmix64 hash of the seed, ``crc32(r)`` and ``i``,
whatever the step sizes, the drafts and their acceptance. A proposed draft equals ``T`` at
its index with probability ``acceptance_rate`` (again by hash), so acceptance is
reproducible too.

Every hash is computed on ``uint64`` *arrays*: numpy wraps array overflow silently, while
scalar overflow warns (and the test suite turns warnings into errors).
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

from llmsched.sim._arrays import Int64Array, U64Array
from llmsched.sim._hashing import mix64

__all__ = ["TokenModel"]

_MASK64 = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1

_SHIFT11 = np.uint64(11)
_SALT_EOS = np.uint64(0xE05E05E05E05E05E)
_SALT_ACCEPT = np.uint64(0xACCE97ACCE97ACCE)
_TO_UNIT = 2.0**-53


def _unit(h: U64Array) -> npt.NDArray[np.float64]:
    """Uniform floats in ``[0, 1)`` from the top 53 bits of each hash."""
    return (h >> _SHIFT11).astype(np.float64) * _TO_UNIT


class TokenModel:
    """``T(r, i)`` and the drafts proposed for it (see the module docstring). With an
    ``eos_token_id`` in the vocabulary, ``T`` is never that id except where
    ``eos_probability`` draws it."""

    def __init__(
        self,
        seed: int,
        *,
        vocab_size: int,
        acceptance_rate: float,
        eos_token_id: int | None,
        eos_probability: float,
    ) -> None:
        eos_in_vocab = eos_token_id is not None and 0 <= eos_token_id < vocab_size
        # A rejected draft needs a token that is neither T nor EOS.
        min_vocab = 3 if eos_in_vocab else 2
        if not min_vocab <= vocab_size <= INT32_MAX:
            raise ValueError(f"vocab_size={vocab_size}: must be in [{min_vocab}, {INT32_MAX}]")
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate={acceptance_rate}: must be in [0, 1]")
        if not 0.0 <= eos_probability <= 1.0:
            raise ValueError(f"eos_probability={eos_probability}: must be in [0, 1]")
        if eos_token_id is not None and not 0 <= eos_token_id <= INT32_MAX:
            raise ValueError(f"eos_token_id={eos_token_id}: must be in [0, {INT32_MAX}]")
        if eos_probability > 0.0 and eos_token_id is None:
            raise ValueError("eos_probability > 0 needs an eos_token_id")
        self.seed = seed
        self.vocab_size = vocab_size
        self.acceptance_rate = acceptance_rate
        self.eos_token_id = eos_token_id
        self.eos_probability = eos_probability
        self._eos_in_vocab = eos_in_vocab
        self._seed_key = mix64(np.array([seed & _MASK64], dtype=np.uint64))

    def request_key(self, req_id: str) -> U64Array:
        """The request's key (one ``uint64``): every token of the request hashes it."""
        crc = np.array([zlib.crc32(req_id.encode("utf-8"))], dtype=np.uint64)
        return mix64(self._seed_key ^ mix64(crc))

    def targets(self, keys: U64Array, index: Int64Array) -> Int64Array:
        """``T`` at each (request key, token index)."""
        return self._targets_from_hash(self._hash(keys, index))

    def proposals(self, keys: U64Array, index: Int64Array) -> Int64Array:
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

    @staticmethod
    def _hash(keys: U64Array, index: Int64Array) -> U64Array:
        return mix64(keys ^ mix64(index.astype(np.uint64)))

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
