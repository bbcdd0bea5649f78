"""Checks for tests: an independent look at one ``SchedulerOutput``, from its arrays only.

``check_scheduler_output`` verifies spec Appendix A items 1, 2 and 4 and the shape of the
output without trusting the scheduler's own bookkeeping. Every failure is an
``AssertionError`` whose message names the offending request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from llmsched.sim.contract import SchedulerConfigLike, SchedulerOutputLike, check_draft_slots

__all__ = ["check_scheduler_output"]


def _vector(name: str, value: object, length: int | None = None) -> npt.NDArray[np.int32]:
    array = np.asarray(value)
    if array.dtype != np.int32 or array.ndim != 1:
        raise AssertionError(f"{name}: expected a 1-D int32 array, got {array.dtype} {array.shape}")
    if length is not None and len(array) != length:
        raise AssertionError(f"{name}: has {len(array)} entries for {length} req_ids")
    return array


def check_scheduler_output(config: SchedulerConfigLike, so: SchedulerOutputLike) -> None:
    """Raise ``AssertionError`` if ``so`` breaks the runner contract or spec Appendix A
    items 1, 2 and 4:

    * every ``n >= 1`` and ``C + n + s <= M`` (the invariant this project exists for);
    * ``sum(n) == total_num_scheduled_tokens <= max_num_scheduled_tokens`` and
      ``len(req_ids) <= max_num_seqs``;
    * draft slots: ``0 <= num_spec <= min(K, n)``, ``spec_token_ids`` split exactly by
      ``num_spec_tokens``; a new or resumed request with draft slots is padded, so it has
      ``n == 1 + K`` and ``K`` placeholders ``-1``;
    * int32 arrays aligned with ``req_ids``; no duplicate id; new and resumed ids are
      scheduled, disjoint, and exactly the ones carrying ``all_token_ids``; no finished id
      is scheduled (unless a new request reuses it); no block id is 0 (the null block) or
      negative.
    """
    step = _Step.of(so)
    _check_ids(config, step)
    _check_counts(config, step)
    num_spec_cfg = int(config.num_speculative_tokens)
    check_draft_slots(step.req_ids, step.ns, step.num_spec, step.spec_ids, num_spec_cfg)
    _check_block_ids(step)
    is_admitted = _check_admissions(config, step)
    _check_padding(config, step, is_admitted)


@dataclass(frozen=True)
class _Step:
    """The step's ids and arrays, each checked to be a 1-D int32 array aligned with
    ``req_ids`` (the flat ones: 1-D int32)."""

    so: SchedulerOutputLike
    req_ids: list[str]
    ns: npt.NDArray[np.int32]
    computed: npt.NDArray[np.int32]
    num_spec: npt.NDArray[np.int32]
    spec_ids: npt.NDArray[np.int32]
    num_block_ids: npt.NDArray[np.int32]
    block_ids: npt.NDArray[np.int32]
    num_all: npt.NDArray[np.int32]
    all_ids: npt.NDArray[np.int32]

    @classmethod
    def of(cls, so: SchedulerOutputLike) -> _Step:
        req_ids = list(so.req_ids)
        n = len(req_ids)
        return cls(
            so,
            req_ids,
            ns=_vector("num_scheduled_tokens", so.num_scheduled_tokens, n),
            computed=_vector("num_computed_tokens", so.num_computed_tokens, n),
            num_spec=_vector("num_spec_tokens", so.num_spec_tokens, n),
            spec_ids=_vector("spec_token_ids", so.spec_token_ids),
            num_block_ids=_vector("num_block_ids", so.num_block_ids, n),
            block_ids=_vector("block_ids", so.block_ids),
            num_all=_vector("num_all_token_ids", so.num_all_token_ids, n),
            all_ids=_vector("all_token_ids", so.all_token_ids),
        )


def _check_ids(config: SchedulerConfigLike, step: _Step) -> None:
    """No id twice; at most ``max_num_seqs`` requests."""
    req_ids = step.req_ids
    if len(set(req_ids)) != len(req_ids):
        seen: set[str] = set()
        for req_id in req_ids:
            if req_id in seen:
                raise AssertionError(f"request {req_id!r} is scheduled twice")
            seen.add(req_id)
    if len(req_ids) > int(config.max_num_seqs):
        raise AssertionError(
            f"{len(req_ids)} requests scheduled > max_num_seqs {config.max_num_seqs}"
        )


def _check_counts(config: SchedulerConfigLike, step: _Step) -> None:
    """Item 1, ``n >= 1`` and ``C + n + s <= M``; item 2, the token budget."""
    max_model_len = int(config.max_model_len)
    num_sampled = int(config.num_sampled_tokens_per_step)
    ns64 = step.ns.astype(np.int64)
    computed64 = step.computed.astype(np.int64)
    bad = (ns64 < 1) | (computed64 < 0) | (computed64 + ns64 + num_sampled > max_model_len)
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(
            f"request {step.req_ids[i]!r}: C={int(step.computed[i])}, n={int(step.ns[i])}, "
            f"s={num_sampled}, M={max_model_len}: every scheduled request needs n >= 1 and "
            "C + n + s <= M"
        )
    total = int(ns64.sum())
    if total != step.so.total_num_scheduled_tokens:
        raise AssertionError(
            f"total_num_scheduled_tokens={step.so.total_num_scheduled_tokens} "
            f"but num_scheduled_tokens sums to {total}"
        )
    if total > int(config.max_num_scheduled_tokens):
        raise AssertionError(
            f"{total} tokens scheduled > max_num_scheduled_tokens {config.max_num_scheduled_tokens}"
        )


def _check_block_ids(step: _Step) -> None:
    """Block ids split exactly by ``num_block_ids``; none is 0 (the null block) or negative."""
    num_block_ids, block_ids = step.num_block_ids, step.block_ids
    if (num_block_ids < 0).any():
        i = int(np.argmax(num_block_ids < 0))
        raise AssertionError(f"request {step.req_ids[i]!r}: num_block_ids={int(num_block_ids[i])}")
    if len(block_ids) != int(num_block_ids.sum(dtype=np.int64)):
        raise AssertionError(
            f"block_ids has {len(block_ids)} ids but num_block_ids sums to "
            f"{int(num_block_ids.sum(dtype=np.int64))}"
        )
    if len(block_ids) and int(block_ids.min()) <= 0:
        owner = int(np.repeat(np.arange(len(step.req_ids)), num_block_ids)[np.argmin(block_ids)])
        raise AssertionError(
            f"request {step.req_ids[owner]!r}: block id {int(block_ids.min())} in its table "
            "(block 0 is the null block, never allocated)"
        )


def _check_admissions(config: SchedulerConfigLike, step: _Step) -> npt.NDArray[np.bool_]:
    """New and resumed ids are scheduled, disjoint, and exactly the ones carrying
    ``all_token_ids`` (every token they hold); no finished id is scheduled unless a new
    request reuses it. Returns which requests are admitted."""
    so, req_ids = step.so, step.req_ids
    new_ids = list(so.new_req_ids)
    resumed_ids = list(so.resumed_req_ids)
    admitted = set(new_ids) | set(resumed_ids)
    if len(admitted) != len(new_ids) + len(resumed_ids):
        raise AssertionError("new_req_ids and resumed_req_ids overlap or repeat an id")
    scheduled = set(req_ids)
    if not admitted <= scheduled:
        missing = sorted(admitted - scheduled)
        raise AssertionError(f"new or resumed requests {missing} are not scheduled")
    # A finished id may come back only as a new request that reuses the id.
    finished_and_scheduled = scheduled.intersection(so.finished_req_ids) - set(new_ids)
    if finished_and_scheduled:
        raise AssertionError(
            f"requests {sorted(finished_and_scheduled)} are finished and scheduled in one step"
        )
    num_all = step.num_all
    if (num_all < 0).any():
        i = int(np.argmax(num_all < 0))
        raise AssertionError(f"request {req_ids[i]!r}: num_all_token_ids={int(num_all[i])}")
    if len(step.all_ids) != int(num_all.sum(dtype=np.int64)):
        raise AssertionError(
            f"all_token_ids has {len(step.all_ids)} ids but num_all_token_ids sums to "
            f"{int(num_all.sum(dtype=np.int64))}"
        )
    is_admitted = np.fromiter((r in admitted for r in req_ids), dtype=np.bool_, count=len(req_ids))
    wrong = is_admitted != (num_all > 0)
    if wrong.any():
        i = int(np.argmax(wrong))
        kind = "new or resumed" if is_admitted[i] else "neither new nor resumed"
        raise AssertionError(
            f"request {req_ids[i]!r} is {kind} but has num_all_token_ids={int(num_all[i])}"
        )
    max_model_len = int(config.max_model_len)
    known = step.computed.astype(np.int64) + step.ns - step.num_spec
    over = is_admitted & ((known > num_all) | (num_all > max_model_len))
    if over.any():
        i = int(np.argmax(over))
        raise AssertionError(
            f"request {req_ids[i]!r}: admitted with C={int(step.computed[i])}, "
            f"n={int(step.ns[i])}, {int(step.num_spec[i])} draft slots but {int(num_all[i])} "
            f"tokens (M={max_model_len})"
        )
    return is_admitted


def _check_padding(
    config: SchedulerConfigLike, step: _Step, is_admitted: npt.NDArray[np.bool_]
) -> None:
    """Item 4: an admission with draft slots is padded: ``n == 1 + K``, ``K``
    placeholders -1."""
    num_spec_cfg = int(config.num_speculative_tokens)
    padded = is_admitted & (step.num_spec > 0)
    if not padded.any():
        return
    starts = np.cumsum(step.num_spec, dtype=np.int64) - step.num_spec
    for i in np.flatnonzero(padded).tolist():
        first = int(starts[i])
        slots = step.spec_ids[first : first + int(step.num_spec[i])]
        if int(step.ns[i]) != 1 + num_spec_cfg or len(slots) != num_spec_cfg or (slots != -1).any():
            raise AssertionError(
                f"request {step.req_ids[i]!r}: a padded admission needs "
                f"n=1+K={1 + num_spec_cfg} and {num_spec_cfg} placeholders -1, "
                f"got n={int(step.ns[i])}, drafts {slots.tolist()}"
            )
