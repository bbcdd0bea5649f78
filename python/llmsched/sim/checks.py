"""Checks for tests: an independent look at one ``SchedulerOutput``, from its arrays only.

``check_scheduler_output`` verifies spec Appendix A items 1, 2 and 4 and the shape of the
output without trusting the scheduler's own bookkeeping. Every failure is an
``AssertionError`` whose message names the offending request.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llmsched.sim.runner import SchedulerConfigLike, SchedulerOutputLike, check_draft_slots

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
    max_model_len = int(config.max_model_len)
    num_sampled = int(config.num_sampled_tokens_per_step)
    num_spec_cfg = int(config.num_speculative_tokens)

    req_ids = list(so.req_ids)
    num_reqs = len(req_ids)
    if len(set(req_ids)) != num_reqs:
        seen: set[str] = set()
        for req_id in req_ids:
            if req_id in seen:
                raise AssertionError(f"request {req_id!r} is scheduled twice")
            seen.add(req_id)
    if num_reqs > int(config.max_num_seqs):
        raise AssertionError(f"{num_reqs} requests scheduled > max_num_seqs {config.max_num_seqs}")

    ns = _vector("num_scheduled_tokens", so.num_scheduled_tokens, num_reqs)
    computed = _vector("num_computed_tokens", so.num_computed_tokens, num_reqs)
    num_spec = _vector("num_spec_tokens", so.num_spec_tokens, num_reqs)
    spec_ids = _vector("spec_token_ids", so.spec_token_ids)
    num_block_ids = _vector("num_block_ids", so.num_block_ids, num_reqs)
    block_ids = _vector("block_ids", so.block_ids)
    num_all = _vector("num_all_token_ids", so.num_all_token_ids, num_reqs)
    all_ids = _vector("all_token_ids", so.all_token_ids)

    # Item 1: n >= 1 and C + n + s <= M.
    ns64 = ns.astype(np.int64)
    computed64 = computed.astype(np.int64)
    bad = (ns64 < 1) | (computed64 < 0) | (computed64 + ns64 + num_sampled > max_model_len)
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(
            f"request {req_ids[i]!r}: C={int(computed[i])}, n={int(ns[i])}, s={num_sampled}, "
            f"M={max_model_len}: every scheduled request needs n >= 1 and C + n + s <= M"
        )

    # Item 2: the token budget and the sequence cap.
    total = int(ns64.sum())
    if total != so.total_num_scheduled_tokens:
        raise AssertionError(
            f"total_num_scheduled_tokens={so.total_num_scheduled_tokens} "
            f"but num_scheduled_tokens sums to {total}"
        )
    if total > int(config.max_num_scheduled_tokens):
        raise AssertionError(
            f"{total} tokens scheduled > max_num_scheduled_tokens {config.max_num_scheduled_tokens}"
        )

    # Draft slots: what a runner asserts of them (the simulated runner's own check).
    check_draft_slots(req_ids, ns, num_spec, spec_ids, num_spec_cfg)

    # Block ids.
    if (num_block_ids < 0).any():
        i = int(np.argmax(num_block_ids < 0))
        raise AssertionError(f"request {req_ids[i]!r}: num_block_ids={int(num_block_ids[i])}")
    if len(block_ids) != int(num_block_ids.sum(dtype=np.int64)):
        raise AssertionError(
            f"block_ids has {len(block_ids)} ids but num_block_ids sums to "
            f"{int(num_block_ids.sum(dtype=np.int64))}"
        )
    if len(block_ids) and int(block_ids.min()) <= 0:
        owner = int(np.repeat(np.arange(num_reqs), num_block_ids)[np.argmin(block_ids)])
        raise AssertionError(
            f"request {req_ids[owner]!r}: block id {int(block_ids.min())} in its table "
            "(block 0 is the null block, never allocated)"
        )

    # New, resumed and finished ids.
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

    # all_token_ids: exactly for new and resumed requests, every token they hold.
    if (num_all < 0).any():
        i = int(np.argmax(num_all < 0))
        raise AssertionError(f"request {req_ids[i]!r}: num_all_token_ids={int(num_all[i])}")
    if len(all_ids) != int(num_all.sum(dtype=np.int64)):
        raise AssertionError(
            f"all_token_ids has {len(all_ids)} ids but num_all_token_ids sums to "
            f"{int(num_all.sum(dtype=np.int64))}"
        )
    is_admitted = np.fromiter((r in admitted for r in req_ids), dtype=np.bool_, count=num_reqs)
    wrong = is_admitted != (num_all > 0)
    if wrong.any():
        i = int(np.argmax(wrong))
        kind = "new or resumed" if is_admitted[i] else "neither new nor resumed"
        raise AssertionError(
            f"request {req_ids[i]!r} is {kind} but has num_all_token_ids={int(num_all[i])}"
        )
    known = computed64 + ns64 - num_spec
    over = is_admitted & ((known > num_all) | (num_all > max_model_len))
    if over.any():
        i = int(np.argmax(over))
        raise AssertionError(
            f"request {req_ids[i]!r}: admitted with C={int(computed[i])}, n={int(ns[i])}, "
            f"{int(num_spec[i])} draft slots but {int(num_all[i])} tokens (M={max_model_len})"
        )

    # Item 4: an admission with draft slots is padded: n == 1 + K, K placeholders -1.
    padded = is_admitted & (num_spec > 0)
    if padded.any():
        starts = np.cumsum(num_spec, dtype=np.int64) - num_spec
        for i in np.flatnonzero(padded).tolist():
            first = int(starts[i])
            slots = spec_ids[first : first + int(num_spec[i])]
            if int(ns[i]) != 1 + num_spec_cfg or len(slots) != num_spec_cfg or (slots != -1).any():
                raise AssertionError(
                    f"request {req_ids[i]!r}: a padded admission needs n=1+K={1 + num_spec_cfg} "
                    f"and {num_spec_cfg} placeholders -1, got n={int(ns[i])}, "
                    f"drafts {slots.tolist()}"
                )
