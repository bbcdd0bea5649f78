"""The runner contract (spec §6.5): what a model runner reads of the scheduler's config and
of each step, and what it asserts of a step's draft slots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llmsched.sim._arrays import Int32Array

__all__ = ["SchedulerConfigLike", "SchedulerOutputLike", "check_draft_slots"]


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
