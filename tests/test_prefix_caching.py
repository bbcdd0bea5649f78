"""Prefix caching (automatic prefix caching, APC) at the scheduler level, against vLLM 0.33.0.

The block pool's exact free-queue orders are unit-tested in Rust; here the same scenarios
(vLLM ``tests/v1/core/test_prefix_caching.py``: ``test_prefill``, ``test_decode``,
``test_evict`` and friends) are driven through the public API only: the block ids a
``SchedulerOutput`` carries, ``Scheduler.free_block_queue()``, the ``num_computed_tokens``
an admission starts from (its prefix hit), ``Request.block_hashes`` and
``Scheduler.stats()``. The async, spec-decode and stats items come from
``test_async_scheduler.py`` and ``test_scheduler.py`` (spec §7.2, §7.3).

Every test is written anew against llmsched's public API; its docstring names the vLLM
test or the spec behaviour it pins. Every loop goes through conftest's ``CheckedScheduler``
so the KV conservation invariants (spec Appendix A) are checked on every step; aborts go
through ``_abort``, which checks them too.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence

import pytest

from llmsched import (
    InvalidRequestError,
    RequestOutput,
    RequestStatus,
    SchedulerOutput,
    UnknownRequestError,
)

from conftest import (
    EOS_TOKEN_ID,
    CheckedScheduler,
    PipelinedRunner,
    add_requests,
    make_scheduler,
    one_token_each,
    runner_output,
    scheduled,
    spec_tokens,
)

B = 16
# Three full blocks: [0]*16 + [1]*16 + [2]*16 (vLLM's "common_token_ids").
COMMON = [i for i in range(3) for _ in range(B)]

# ---------------------------------------------------------------------------- helpers


def apc(**overrides: object) -> CheckedScheduler:
    """vLLM's test scheduler with prefix caching turned on."""
    return make_scheduler(enable_prefix_caching=True, **overrides)


def _offsets(counts: Sequence[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def blocks(so: SchedulerOutput, req_id: str) -> list[int]:
    """The block ids ``so`` carries for ``req_id``: the whole table for a new or resumed
    request (prefix hits first), the newly allocated blocks for a running one."""
    i = so.req_ids.index(req_id)
    offs = _offsets(so.num_block_ids)
    return [int(b) for b in so.block_ids[offs[i] : offs[i + 1]]]


def computed(so: SchedulerOutput) -> dict[str, int]:
    """``{req_id: C before the step}``: for an admission, its prefix hit in tokens."""
    return dict(zip(so.req_ids, (int(c) for c in so.num_computed_tokens), strict=True))


def apply(
    sched: CheckedScheduler, so: SchedulerOutput, tokens: dict[str, list[int]]
) -> dict[str, RequestOutput]:
    """Apply ``so`` with the given sampled tokens (requests not named sample nothing)."""
    rows = [tokens.get(req_id, []) for req_id in so.req_ids]
    return {o.request_id: o for o in sched.update_from_output(so, runner_output(so, rows))}


def _abort(sched: CheckedScheduler, *req_ids: str) -> None:
    assert sched.finish_requests(list(req_ids), RequestStatus.FINISHED_ABORTED) == list(req_ids)
    sched.check_invariants()


def _add(
    sched: CheckedScheduler,
    req_id: str,
    prompt: Sequence[int],
    *,
    max_tokens: int = 10,
    **kwargs: object,
) -> None:
    """A request that ignores EOS (vLLM's block-pool tests never stop on a token)."""
    sched.add_request(req_id, list(prompt), max_tokens=max_tokens, **kwargs)


def _prefix_stats(sched: CheckedScheduler) -> tuple[int, ...]:
    s = sched.stats()
    return (
        s["prefix_cache_requests"],
        s["prefix_cache_queries"],
        s["prefix_cache_hits"],
        s["prefix_cache_preempted_requests"],
        s["prefix_cache_preempted_queries"],
        s["prefix_cache_preempted_hits"],
    )


# ------------------------------------------------------- test_prefix_caching.py: pool


def test_prefill() -> None:
    """vLLM test_prefill: block ids, shared hits, free-queue order after frees, eviction order."""
    sched = apc(num_gpu_blocks=11)
    _add(sched, "0", COMMON + [3] * 7)
    so = sched.schedule()
    assert scheduled(so) == {"0": 55} and computed(so) == {"0": 0}
    assert blocks(so, "0") == [1, 2, 3, 4]
    req0 = sched.get_request("0")
    assert len(req0.block_hashes) == 3  # the partial block 4 has no hash
    apply(sched, so, {"0": [8]})

    # A hit on the common prefix while its blocks are still in use by request 0.
    _add(sched, "1", COMMON + [3] * 5)
    so = sched.schedule()
    assert scheduled(so) == {"0": 1, "1": 53 - 48}
    assert computed(so)["1"] == 48
    assert blocks(so, "0") == []  # the decode fits in block 4
    assert blocks(so, "1") == [1, 2, 3, 5]
    assert sched.get_request("1").block_hashes == req0.block_hashes
    assert sched.num_free_blocks == 5
    assert sched.free_block_queue() == [6, 7, 8, 9, 10]
    apply(sched, so, {"0": [8], "1": [8]})

    # Shared blocks are freed only with their last reference.
    _abort(sched, "0")
    assert sched.free_block_queue() == [4, 6, 7, 8, 9, 10]
    _abort(sched, "1")
    # Unhashed partial blocks at the head (reused first), cached blocks at the tail,
    # each request's tail block first.
    assert sched.free_block_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert sched.num_free_blocks == 10

    # A hit on blocks that are all free: they leave the free queue.
    _add(sched, "2", COMMON + [3] * 6)
    so = sched.schedule()
    assert scheduled(so) == {"2": 6} and computed(so) == {"2": 48}
    assert blocks(so, "2") == [1, 2, 3, 5]  # the partial block 5 is reused
    assert sched.num_free_blocks == 6
    assert sched.free_block_queue() == [4, 6, 7, 8, 9, 10]
    apply(sched, so, {"2": [8]})
    _abort(sched, "2")
    assert sched.free_block_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    # A miss takes the whole pool in free-queue order, evicting the cached blocks last.
    _add(sched, "3", [99] * 159, max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"3": 0}
    assert blocks(so, "3") == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert sched.num_free_blocks == 0 and sched.free_block_queue() == []
    assert apply(sched, so, {"3": [8]})["3"].finished

    # The evicted blocks no longer hit.
    _add(sched, "4", COMMON + [3] * 7)
    so = sched.schedule()
    assert computed(so) == {"4": 0} and scheduled(so) == {"4": 55}


def test_decode() -> None:
    """vLLM test_decode: decoding inside a block allocates nothing; a full block gets cached."""
    sched = apc(num_gpu_blocks=11)
    prompt = COMMON + [3] * 7
    _add(sched, "0", prompt, max_tokens=30)
    so = sched.schedule()
    assert blocks(so, "0") == [1, 2, 3, 4]
    sampled = [8] * 4 + [7] * 19  # 4 tokens within block 4, then 19 that cross into block 5
    apply(sched, so, {"0": sampled[:1]})
    for token in sampled[1:]:
        so = sched.schedule()
        c = computed(so)["0"]
        assert scheduled(so) == {"0": 1}
        # Only the step whose token is the first of a block allocates (position 64).
        assert blocks(so, "0") == ([5] if c == 64 else []), f"C={c}"
        apply(sched, so, {"0": [token]})
        req = sched.get_request("0")
        assert len(req.block_hashes) == req.num_tokens // B
    req = sched.get_request("0")
    assert req.num_tokens == 55 + 23 == 78
    assert req.block_ids == [1, 2, 3, 4, 5]
    assert len(req.block_hashes) == 4

    # Block 4 was cached when it filled (it goes to the tail), block 5 is partial (head).
    _abort(sched, "0")
    assert sched.free_block_queue() == [5, 6, 7, 8, 9, 10, 4, 3, 2, 1]

    # Its 64 tokens (prompt and outputs) are a hit for a later request.
    tokens = prompt + sampled
    _add(sched, "probe", [*tokens[:64], 1], max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"probe": 64} and scheduled(so) == {"probe": 1}
    assert blocks(so, "probe") == [1, 2, 3, 4, 5]


def test_evict() -> None:
    """vLLM test_evict: free-queue orders after frees (LRU tail), then the eviction order."""
    sched = apc(num_gpu_blocks=11)
    _add(sched, "0", range(5 * B + 7))
    _add(sched, "1", range(5 * B + 7, 8 * B + 7))
    so = sched.schedule()
    assert blocks(so, "0") == [1, 2, 3, 4, 5, 6]  # 5 full and 1 partial
    assert blocks(so, "1") == [7, 8, 9]  # 3 full
    assert sched.num_free_blocks == 1
    apply(sched, so, {"0": [0], "1": [0]})

    _abort(sched, "0")
    assert sched.free_block_queue() == [6, 10, 5, 4, 3, 2, 1]
    _abort(sched, "1")
    assert sched.free_block_queue() == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    assert sched.num_free_blocks == 10

    # Touch the first two cached blocks.
    _add(sched, "2", range(2 * B + 3))
    so = sched.schedule()
    assert computed(so) == {"2": 32} and scheduled(so) == {"2": 3}
    assert blocks(so, "2") == [1, 2, 6]
    assert sched.num_free_blocks == 7
    assert sched.free_block_queue() == [10, 5, 4, 3, 9, 8, 7]
    apply(sched, so, {"2": [0]})
    _abort(sched, "2")
    assert sched.free_block_queue() == [6, 10, 5, 4, 3, 9, 8, 7, 2, 1]

    # A miss evicts in exactly that order: least recently used cached blocks last.
    _add(sched, "3", [500] * 159, max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "3") == [6, 10, 5, 4, 3, 9, 8, 7, 2, 1]


def test_hash_block_correct_reuse() -> None:
    """vLLM test_hash_block_correct_reuse: a cached block reused as a new block loses its hash."""
    sched = apc(num_gpu_blocks=3)
    _add(sched, "0", range(B), max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "0") == [1]
    assert apply(sched, so, {"0": [100]})["0"].finished
    assert sched.free_block_queue() == [2, 1]  # block 1 is cached: at the tail

    # A 31-token miss takes block 2, then evicts block 1 and fills half of it.
    _add(sched, "1", [200] * (2 * B - 1), max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"1": 0}
    assert blocks(so, "1") == [2, 1]
    assert apply(sched, so, {"1": [100]})["1"].finished
    # Block 1 holds a partial block now: no hash, so it goes to the head; block 2 is
    # cached and goes to the tail.
    assert sched.free_block_queue() == [1, 2]

    # The old content of block 1 is gone from the cache.
    _add(sched, "2", [*range(B), 5], max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"2": 0}


def test_computed_blocks_not_evicted() -> None:
    """vLLM test_computed_blocks_not_evicted: a hit is touched before new blocks are popped."""
    sched = apc(num_gpu_blocks=3)
    _add(sched, "0", range(B), max_tokens=1)
    _add(sched, "1", range(B, 2 * B), max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "0") == [1] and blocks(so, "1") == [2]
    apply(sched, so, {"0": [7], "1": [7]})
    assert sched.free_block_queue() == [1, 2]  # the hit block is at the head

    # Block 1 is a hit for "2": the new block must be 2, not the head of the queue.
    _add(sched, "2", range(2 * B - 1), max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"2": B} and scheduled(so) == {"2": B - 1}
    assert blocks(so, "2") == [1, 2]


def test_prefill_not_enough_free_blocks_with_computed_blocks() -> None:
    """vLLM test_prefill_not_enough_free_blocks_with_computed_blocks: hits left untouched."""
    # Evictable hits count against free capacity; a failed admission leaves its hits untouched.
    sched = apc(num_gpu_blocks=11)
    in_flight: list[SchedulerOutput] = []  # outputs kept back, so nothing decodes

    _add(sched, "0", COMMON, max_tokens=1)
    in_flight.append(sched.schedule())
    assert blocks(in_flight[-1], "0") == [1, 2, 3]

    _add(sched, "1", COMMON * 2, max_tokens=1)
    in_flight.append(sched.schedule())
    assert scheduled(in_flight[-1]) == {"1": 48} and computed(in_flight[-1]) == {"1": 48}
    assert blocks(in_flight[-1], "1") == [1, 2, 3, 4, 5, 6]
    _abort(sched, "1")  # blocks 4..6 are cached and free; 1..3 stay with "0"
    assert sched.free_block_queue() == [7, 8, 9, 10, 6, 5, 4]

    _add(sched, "2", [7] * 2 * B, max_tokens=1)
    in_flight.append(sched.schedule())
    assert blocks(in_flight[-1], "2") == [7, 8]
    assert sched.num_free_blocks == 5

    # "3" would hit 6 blocks (1..6) and need 3 more. Blocks 4..6 are free, so touching them
    # takes them from the free pool too: 3 + 3 = 6 > 5 free. The admission fails.
    _add(sched, "3", COMMON * 3, max_tokens=1)
    queue_before = sched.free_block_queue()
    so = sched.schedule()
    assert len(so) == 0
    assert sched.free_block_queue() == queue_before == [9, 10, 6, 5, 4]
    assert sched.num_free_blocks == 5
    req3 = sched.get_request("3")
    assert req3.status == RequestStatus.WAITING
    assert (req3.num_computed_tokens, req3.block_ids) == (0, [])
    assert sched.waiting_request_ids() == ["3"]

    # Once two more blocks are free, the same hits are taken.
    _abort(sched, "2")
    so = sched.schedule()
    assert computed(so) == {"3": 96} and scheduled(so) == {"3": 48}
    assert blocks(so, "3") == [1, 2, 3, 4, 5, 6, 9, 10, 8]
    assert sched.free_block_queue() == [7]

    for step in [*in_flight, so]:
        apply(sched, step, {"0": [1], "3": [1]})
    assert not sched.has_unfinished_requests()


def test_duplicate_content_cached_twice_and_lookup_survives_eviction_of_one_copy() -> None:
    """vLLM test_block_lookup_cache_*: same content cached twice; lookup survives eviction."""
    # The first copy cached answers lookups; once it is evicted, the other copy does.
    sched = apc(num_gpu_blocks=11)
    _add(sched, "a", [1] * 17)  # block 1 = [1]*16, cached when allocated
    _add(sched, "b", [1] * 10, max_tokens=20)  # block 3 fills up with sampled 1s
    so = sched.schedule()
    assert blocks(so, "a") == [1, 2] and blocks(so, "b") == [3]
    assert computed(so) == {"a": 0, "b": 0}
    apply(sched, so, {"a": [7], "b": [1]})
    while sched.get_request("b").num_tokens < B:
        so = sched.schedule()
        apply(sched, so, {"a": [7], "b": [1]})
    # The step that computes b's 16th token caches block 3 under a's key: a duplicate.
    so = sched.schedule()
    assert computed(so)["b"] == B - 1 and blocks(so, "b") == []
    assert sched.get_request("b").block_hashes == sched.get_request("a").block_hashes[:1]
    apply(sched, so, {"a": [7], "b": [1]})

    # A lookup finds the first block cached under the key: a's.
    _add(sched, "p1", [1] * 17, max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "b") == [4]
    assert computed(so)["p1"] == 16 and blocks(so, "p1") == [1, 5]
    assert apply(sched, so, {"a": [7], "b": [1], "p1": [7]})["p1"].finished

    # Free a's copy, then evict it: a 113-token miss takes the 8 free blocks.
    _abort(sched, "a")
    assert sched.free_block_queue() == [2, 5, 6, 7, 8, 9, 10, 1]
    _add(sched, "m", [50] * 113, max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "m") == [2, 5, 6, 7, 8, 9, 10, 1]
    apply(sched, so, {"b": [1], "m": [7]})

    # b's copy is still cached under the same key, and a lookup now finds it.
    _add(sched, "p2", [1] * 17, max_tokens=1)
    so = sched.schedule()
    assert computed(so)["p2"] == 16
    assert blocks(so, "p2")[0] == 3
    apply(sched, so, {"b": [1], "p2": [7]})

    # When b's copy is freed too, it stays a hit.
    _abort(sched, "b")
    _add(sched, "p3", [1] * 17, max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"p3": 16}
    assert blocks(so, "p3")[0] == 3


# ------------------------------------------------------------------------ cache_salt


def test_cache_key_salting() -> None:
    """vLLM test_cache_key_salting: different salts never share blocks, the same salt does."""
    # The salt keys the first block, so it changes every hash of the chain.
    sched = apc(num_gpu_blocks=21)
    tokens0 = COMMON + [3] * 11
    _add(sched, "0", tokens0, cache_salt="salt1")
    _add(sched, "unsalted", tokens0)
    _add(sched, "salt2", tokens0, cache_salt="salt2")
    h1 = sched.get_request("0").block_hashes
    h0 = sched.get_request("unsalted").block_hashes
    h2 = sched.get_request("salt2").block_hashes
    assert len(h1) == len(h0) == len(h2) == 3  # the 11-token tail is not hashed
    for i in range(3):
        assert len({h0[i], h1[i], h2[i]}) == 3, f"block {i}"
    _abort(sched, "unsalted", "salt2")

    so = sched.schedule()
    assert blocks(so, "0") == [1, 2, 3, 4]
    apply(sched, so, {"0": [8]})
    for _ in range(4):  # 5 outputs: block 4 fills up (64 tokens) without a new block
        so = sched.schedule()
        assert blocks(so, "0") == []
        apply(sched, so, {"0": [8]})
    req0 = sched.get_request("0")
    assert req0.num_tokens == 64
    assert len(req0.block_hashes) == 4 and req0.block_hashes[:3] == h1

    tokens1 = COMMON + [4] * 11
    _add(sched, "1", tokens1, cache_salt="salt1")  # same salt: shares the prefix
    _add(sched, "2", tokens1, cache_salt="salt2")  # other salt: a miss
    _add(sched, "3", tokens1)  # no salt: a miss
    _add(sched, "4", tokens1, cache_salt="salt2")  # shares with "2", admitted just before
    assert sched.get_request("1").block_hashes == h1
    so = sched.schedule()
    assert computed(so) == {"0": 63, "1": 48, "2": 0, "3": 0, "4": 48}
    assert blocks(so, "1")[:3] == [1, 2, 3]
    assert not set(blocks(so, "2")) & set(req0.block_ids)
    assert not set(blocks(so, "3")) & (set(req0.block_ids) | set(blocks(so, "2")))
    assert blocks(so, "4")[:3] == blocks(so, "2")[:3]


# ---------------------------------------------------------------- reset_prefix_cache


def test_reset_prefix_cache_fails_while_blocks_are_in_use() -> None:
    """vLLM test_reset_prefix_cache: reset fails while blocks are in use and changes nothing."""
    sched = apc(num_gpu_blocks=11)
    _add(sched, "0", COMMON + [3] * 7)
    _add(sched, "1", COMMON + [4] * 7)
    so = sched.schedule()
    assert blocks(so, "0") == [1, 2, 3, 4] and blocks(so, "1") == [1, 2, 3, 5]

    snapshot = sched.debug_snapshot()
    assert sched.reset_prefix_cache() is False
    assert sched.debug_snapshot() == snapshot
    apply(sched, so, {"0": [9], "1": [9]})

    # The cache still serves hits.
    _add(sched, "2", COMMON + [5] * 7)
    so = sched.schedule()
    assert computed(so)["2"] == 48


def test_reset_prefix_cache() -> None:
    """vLLM test_reset_prefix_cache: once every block is free, reset forgets every hash."""
    sched = apc(num_gpu_blocks=11)
    assert sched.reset_prefix_cache() is True  # nothing in use at all
    _add(sched, "0", COMMON + [3] * 7)
    _add(sched, "1", COMMON + [4] * 7)
    so = sched.schedule()
    assert computed(so) == {"0": 0, "1": 48}
    apply(sched, so, {"0": [9], "1": [9]})
    _abort(sched, "0", "1")
    queue = sched.free_block_queue()
    assert queue == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    assert sched.reset_prefix_cache() is True
    assert sched.free_block_queue() == queue  # blocks stay where they are, minus hashes
    assert sched.num_free_blocks == 10

    # No hit any more; hashing itself is unaffected, and the cache fills again.
    _add(sched, "2", COMMON + [3] * 7)
    assert len(sched.get_request("2").block_hashes) == 3
    so = sched.schedule()
    assert computed(so) == {"2": 0} and scheduled(so) == {"2": 55}
    assert blocks(so, "2") == [5, 4, 6, 7]
    _add(sched, "3", COMMON + [3] * 7)
    so2 = sched.schedule()
    assert computed(so2)["3"] == 48
    assert blocks(so2, "3")[:3] == [5, 4, 6]


def test_scheduler_reset_prefix_cache() -> None:
    """vLLM test_scheduler_reset_prefix_cache: reset preempts all running requests, order kept."""
    # Reset fails while requests run; reset_running_requests=True requeues them in order.
    sched = apc()
    ids = add_requests(sched, 10)
    so = sched.schedule()
    assert sched.running_request_ids() == ids and sched.waiting_request_ids() == []

    assert sched.reset_prefix_cache() is False
    assert sched.running_request_ids() == ids
    sched.update_from_output(so, one_token_each(so, 7))  # nothing in flight any more

    assert sched.reset_prefix_cache(reset_running_requests=True) is True
    sched.check_invariants()
    assert sched.running_request_ids() == []
    assert sched.waiting_request_ids() == ids
    assert sched.num_free_blocks == sched.config.num_gpu_blocks - 1
    for req_id in ids:
        req = sched.get_request(req_id)
        assert req.status == RequestStatus.PREEMPTED
        assert (req.num_computed_tokens, req.num_preemptions, req.block_ids) == (0, 1, [])
        assert req.output_token_ids == [7]

    so = sched.schedule()
    assert set(so.preempted_req_ids) == set(ids)
    assert so.resumed_req_ids == ids
    assert scheduled(so) == dict.fromkeys(ids, 11)  # prompt and the kept output
    assert computed(so) == dict.fromkeys(ids, 0)
    assert sched.running_request_ids() == ids


def _stale_state(sched: CheckedScheduler) -> dict[str, tuple[int, int, bool]]:
    """``{req_id: (in-flight tokens, stale output tokens, drop flag)}`` of the live requests."""
    found = {}
    for req_id in sched.running_request_ids() + sched.waiting_request_ids():
        req = sched.get_request(req_id)
        found[req_id] = (
            req.num_in_flight_tokens,
            req.num_stale_output_tokens,
            req.drop_stale_output,
        )
    return found


class _Pipeline(PipelinedRunner):
    """``PipelinedRunner`` (``accept`` gets the loop iteration) that collects what each
    request was delivered and how it finished, and checks the stale counters after every
    applied step."""

    def __init__(
        self, sched: CheckedScheduler, depth: int, accept: Callable[[int, str, int], int]
    ) -> None:
        super().__init__(sched, depth, accept)
        self.delivered: dict[str, list[int]] = defaultdict(list)
        self.final: dict[str, RequestStatus] = {}

    def on_outputs(self, outs: Sequence[RequestOutput]) -> None:
        for out in outs:
            assert out.request_id not in self.final, "output after the request finished"
            self.delivered[out.request_id].extend(out.new_token_ids)
            if out.finished:
                self.final[out.request_id] = out.status
        # A stale share is part of what is in flight, and drains with it.
        for req_id, (in_flight, stale, _) in _stale_state(self.sched).items():
            assert stale <= in_flight, req_id
            if in_flight == 0:
                assert stale == 0, req_id

    def run(self, before_step: Callable[[int], None], max_iterations: int = 3000) -> None:
        super().run(before_step, max_iterations)


@pytest.mark.parametrize("pp_size", [1, 3])
def test_reset_prefix_cache_with_inflight_output_under_kv_pressure(pp_size: int) -> None:
    """vLLM test_reset_prefix_cache_with_inflight_output_under_kv_pressure (async, in flight)."""
    # Stale output is dropped, nothing is duplicated or reordered, stale counters drain.
    max_tokens, prompt_len, num_spec = 24, 8, 3
    sched = apc(
        async_scheduling=True,
        num_speculative_tokens=num_spec,
        num_gpu_blocks=5,
        block_size=16,
        max_num_batched_tokens=512,
    )
    req_ids = [str(i) for i in range(8)]
    pending = list(req_ids)
    engine = _Pipeline(
        sched, depth=pp_size + 1, accept=lambda step, req_id, k: (step + int(req_id)) % (k + 1)
    )
    for _ in range(2):
        add_requests(
            sched, 1, num_tokens=prompt_len, max_tokens=max_tokens, ignore_eos=True,
            req_ids=[pending.pop(0)],
        )  # fmt: skip
    reset_at = {6, 14} if pp_size == 1 else {6, 7, 18, 19}
    resets = 0
    dropped_in_flight = 0
    repreempted_with_stale = 0

    def before_step(i: int) -> None:
        nonlocal resets, dropped_in_flight, repreempted_with_stale
        if pending:
            add_requests(
                sched,
                1,
                num_tokens=prompt_len,
                max_tokens=max_tokens,
                ignore_eos=True,
                req_ids=[pending.pop(0)],
            )
        if i in reset_at and (engine.queue or sched.running_request_ids()):
            running = set(sched.running_request_ids())
            state = _stale_state(sched)
            dropped_in_flight += sum(1 for r in running if state[r][0] > 0)
            repreempted_with_stale += sum(1 for r in running if state[r][1] > 0)
            assert sched.reset_prefix_cache(reset_running_requests=True) is True
            sched.check_invariants()
            assert sched.running_request_ids() == []
            for r, (in_flight, stale, drop) in _stale_state(sched).items():
                if r in running:
                    # The whole in-flight share is stale now, and will be dropped.
                    assert (stale, drop) == (in_flight, True), r
            resets += 1

    engine.run(before_step)

    assert resets > 0, "reset_prefix_cache was never exercised"
    assert dropped_in_flight > 0, "no reset preempted a request with output in flight"
    if pp_size > 1:
        assert repreempted_with_stale > 0, "no re-preemption with a stale share in flight"
    assert not sched.has_requests()
    assert sched.num_free_blocks == sched.config.num_gpu_blocks - 1
    for req_id in req_ids:
        assert engine.final[req_id] == RequestStatus.FINISHED_LENGTH_CAPPED
        delivered = engine.delivered[req_id]
        assert len(delivered) == max_tokens
        # An order-preserving subset of what the runner sampled, without duplicates...
        it = iter(engine.sampled[req_id])
        assert all(token in it for token in delivered), f"{req_id}: reordered or duplicated"
        # ...and the i-th delivered token was sampled for position Np + i: no stale token
        # lands on a position the resumed request sampled again.
        assert [engine.position_of[t] for t in delivered] == list(
            range(prompt_len, prompt_len + max_tokens)
        )


# ----------------------------------------------------- test_async_scheduler.py, 5 and 6


def _by_position(so: SchedulerOutput) -> list[list[int]]:
    """Request ``i`` of a step samples token ``i`` (vLLM's async test runner)."""
    return [[i] for i in range(len(so))]


def test_prefix_caching_for_prefill_dedup() -> None:
    """vLLM test_prefix_caching_for_prefill_dedup: same-step identical prompts get 100, then 4."""
    num_prompt_tokens = 100
    sched = apc(async_scheduling=True, max_num_batched_tokens=1000, block_size=B)
    ids = [str(i) for i in range(5)]
    pending = ids[2:]
    add_requests(
        sched, 2, num_tokens=num_prompt_tokens, max_tokens=3, same_prompt=True, req_ids=ids[:2]
    )
    so = sched.schedule()
    assert scheduled(so) == {"0": num_prompt_tokens, "1": num_prompt_tokens % B}
    assert computed(so) == {"0": 0, "1": 96}
    assert blocks(so, "1")[:6] == blocks(so, "0")[:6]
    assert blocks(so, "1")[6] != blocks(so, "0")[6]  # the partial block is private

    in_flight = deque([so, sched.schedule()])
    checked = []
    while in_flight:
        added = None
        if pending:
            added = pending.pop(0)
            add_requests(
                sched, 1, num_tokens=num_prompt_tokens, max_tokens=3, same_prompt=True,
                req_ids=[added],
            )  # fmt: skip
        so = in_flight.popleft()
        sched.update_from_output(so, runner_output(so, _by_position(so)))
        so = sched.schedule()
        if len(so):
            in_flight.append(so)
            if added is not None:
                assert scheduled(so)[added] == num_prompt_tokens % B
                assert computed(so)[added] == 96
                checked.append(added)
    assert checked == ids[2:]
    assert sched.get_num_unfinished_requests() == 0


def test_prefix_caching_for_multi_turn() -> None:
    """vLLM test_prefix_caching_for_multi_turn: prompt + 200 outputs (300) schedules 300 % 16."""
    num_prompt_tokens, num_output_tokens = 100, 200
    sched = apc(async_scheduling=True, max_num_batched_tokens=1000, block_size=B)
    ids = add_requests(sched, 5, num_tokens=num_prompt_tokens, max_tokens=num_output_tokens)
    outputs: dict[str, list[int]] = defaultdict(list)
    in_flight = deque([sched.schedule(), sched.schedule()])
    while in_flight:
        so = in_flight.popleft()
        for out in sched.update_from_output(so, runner_output(so, _by_position(so))):
            outputs[out.request_id].extend(out.new_token_ids)
        so = sched.schedule()
        if len(so):
            in_flight.append(so)
    assert sched.get_num_unfinished_requests() == 0
    assert all(len(outputs[req_id]) == num_output_tokens for req_id in ids)

    for i, req_id in enumerate(ids):
        sched.add_request(
            req_id,
            [i] * num_prompt_tokens + outputs[req_id],
            max_tokens=num_output_tokens,
            eos_token_id=EOS_TOKEN_ID,
        )
    so = sched.schedule()
    total = num_prompt_tokens + num_output_tokens
    assert scheduled(so) == dict.fromkeys(ids, total % B)
    assert computed(so) == dict.fromkeys(ids, total - total % B)


# ------------------------------------------------------- test_scheduler.py, items 17, 18


@pytest.mark.parametrize("ending", ["prefill", "accepted", "stop", "rejected"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_finished_spec_request_caches_completed_blocks(async_scheduling: bool, ending: str) -> None:
    """vLLM test_finished_spec_request_caches_completed_blocks (spec §7.3 item 17, K/S)."""
    # The final output caches blocks whose KV is complete before the free; a block whose
    # last KV is missing (rejected draft) is not cached.
    block_size = 4
    sched = apc(block_size=block_size, num_speculative_tokens=2, async_scheduling=async_scheduling)
    prompt = list(range(4)) if ending == "prefill" else [0, 1]
    sched.add_request(
        "producer",
        prompt,
        max_tokens={"prefill": 1, "rejected": 2}.get(ending, 4),
        stop_token_ids=[4] if ending == "stop" else (),
    )
    delivered: list[int] = []
    so = sched.schedule()
    if ending == "prefill":
        out = apply(sched, so, {"producer": [4]})["producer"]
    else:
        delivered += apply(sched, so, {"producer": [2]})["producer"].new_token_ids
        sched.update_draft_token_ids(["producer"], [[3, 4]])
        so = sched.schedule()
        assert scheduled(so) == {"producer": 3}
        assert len(spec_tokens(so)["producer"]) == 2
        sampled = [8] if ending == "rejected" else [3, 4, 5]
        out = apply(sched, so, {"producer": sampled})["producer"]
    delivered += out.new_token_ids
    assert out.finished
    with pytest.raises(UnknownRequestError):
        sched.get_request("producer")

    sched.add_request("probe", prompt + delivered + [99] * block_size, max_tokens=1)
    so = sched.schedule()
    assert computed(so)["probe"] == (0 if ending == "rejected" else block_size)


@pytest.mark.parametrize("num_spec_tokens", [0, 2])
def test_async_output_does_not_cache_inflight_tokens(num_spec_tokens: int) -> None:
    """vLLM test_async_output_does_not_cache_inflight_tokens (item 18): hit 2 with B = 1."""
    # A returned token does not make the in-flight step's KV cacheable.
    sched = apc(block_size=1, async_scheduling=True, num_speculative_tokens=num_spec_tokens)
    sched.add_request("producer", [0, 1], max_tokens=16)
    first = sched.schedule()
    second = sched.schedule()
    assert scheduled(second) == {"producer": 1 + num_spec_tokens}
    apply(sched, first, {"producer": [2]})
    # Probe what is cached right now: nothing may be cached on the producer's behalf later.
    _abort(sched, "producer")
    sched.add_request("probe", [0, 1, 2, 3], max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"probe": 2}


# --------------------------------------------------------- test_scheduler.py, 13 and 89


def test_schedule_with_prefix_caching() -> None:
    """vLLM test_schedule (APC on, item 13): 10 prompts of 10 tokens all admitted whole."""
    sched = apc()
    ids = add_requests(sched, 10)
    so = sched.schedule()
    assert so.new_req_ids == ids and so.resumed_req_ids == [] and so.finished_req_ids == []
    assert scheduled(so) == dict.fromkeys(ids, 10)
    assert computed(so) == dict.fromkeys(ids, 0)
    assert sched.waiting_request_ids() == []
    assert sched.running_request_ids() == ids
    assert _prefix_stats(sched) == (10, 100, 0, 0, 0, 0)


def test_memory_leak_with_prefix_caching() -> None:
    """vLLM test_memory_leak (APC on, item 89): every block is free once all requests finish."""
    sched = apc()
    finished: set[str] = set()

    def run_step() -> SchedulerOutput:
        so = sched.schedule()
        finished.update(so.finished_req_ids)
        sched.update_from_output(so, one_token_each(so, 1000))
        return so

    for i in range(5):
        add_requests(sched, 1, num_tokens=10, max_tokens=10, req_ids=[str(i)])
        run_step()
    while len(run_step()):
        pass

    assert finished == {str(i) for i in range(5)}
    assert not sched.has_requests()
    assert sched.get_request_counts() == (0, 0)
    num_gpu_blocks = sched.config.num_gpu_blocks
    assert sched.num_free_blocks == num_gpu_blocks - 1
    assert sorted(sched.free_block_queue()) == list(range(1, num_gpu_blocks))
    assert sched.get_kv_cache_usage() == 0.0

    # The free blocks still hold cached content: request 0's first block (10 prompt and
    # 6 output tokens) is a hit; after a reset it no longer is.
    def probe_hit(req_id: str) -> int:
        sched.add_request(req_id, [0] * 10 + [1000] * 6 + [5], max_tokens=1)
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so, 1000))
        assert len(sched.schedule()) == 0
        assert sched.num_free_blocks == num_gpu_blocks - 1  # the probe leaks nothing either
        return computed(so)[req_id]

    assert probe_hit("probe") == 16
    assert sched.reset_prefix_cache() is True
    assert probe_hit("probe2") == 0


# --------------------------------------------------------------- prefix-cache stats


def test_prefix_cache_stats_recorded_once_at_admission() -> None:
    """vLLM test_prefix_cache_query_not_inflated_by_connector_defer (item 56): counted once."""
    # A request whose lookup is retried for several steps is counted once, when admitted.
    sched = apc(num_gpu_blocks=5)
    _add(sched, "hog", [9] * 40, max_tokens=8)
    _add(sched, "r", [0] * 32, max_tokens=1)
    so = sched.schedule()
    assert so.req_ids == ["hog"]  # "r" needs 2 blocks, 1 is free
    assert _prefix_stats(sched) == (1, 40, 0, 0, 0, 0)
    for _ in range(3):
        apply(sched, so, {"hog": [1]})
        so = sched.schedule()
        assert so.req_ids == ["hog"]
        assert _prefix_stats(sched) == (1, 40, 0, 0, 0, 0)
    apply(sched, so, {"hog": [1]})
    _abort(sched, "hog")
    so = sched.schedule()
    assert so.new_req_ids == ["r"]
    assert _prefix_stats(sched) == (2, 40 + 32, 0, 0, 0, 0)


def test_preemption_re_records_prefix_cache_query() -> None:
    """vLLM test_preemption_re_records_prefix_cache_query (item 57): resumes count as preempted."""
    sched = apc(num_gpu_blocks=3)  # 2 usable blocks
    _add(sched, "0", [0] * 10, max_tokens=20)
    _add(sched, "1", [1] * 10, max_tokens=20)
    so = sched.schedule()
    assert _prefix_stats(sched) == (2, 20, 0, 0, 0, 0)
    preempted_at = None
    resumed_with = None
    for _ in range(100):
        sched.update_from_output(so, one_token_each(so, 7))
        num_tokens_1 = sched.get_request("1").num_tokens
        so = sched.schedule()
        if "1" in so.preempted_req_ids:
            preempted_at = num_tokens_1
            assert sched.get_request("1").status == RequestStatus.PREEMPTED
            assert _prefix_stats(sched) == (2, 20, 0, 0, 0, 0)
        if so.resumed_req_ids:
            assert so.resumed_req_ids == ["1"]
            resumed_with = num_tokens_1
            break
    assert preempted_at is not None and resumed_with == preempted_at
    # The resumed lookup queries prompt and outputs; its old block was evicted meanwhile.
    assert computed(so) == {"1": 0}
    assert _prefix_stats(sched) == (2, 20, 0, 1, resumed_with, 0)


def test_prefix_cache_stats_not_recorded_when_caching_disabled() -> None:
    """vLLM test_prefix_cache_stats_not_recorded_when_caching_disabled (item 59)."""
    sched = make_scheduler(enable_prefix_caching=False)
    add_requests(sched, 2)
    so = sched.schedule()
    assert len(so) == 2
    assert _prefix_stats(sched) == (0, 0, 0, 0, 0, 0)
    assert sched.get_request("0").block_hashes == []


def test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request() -> None:
    """vLLM test_prefix_cache_stats_counted_once_for_retried_then_scheduled_request (item 60)."""
    # A real hit whose allocation fails once is counted once when admitted, hits included.
    sched = apc(enable_chunked_prefill=False, num_gpu_blocks=6)  # 5 usable blocks
    add_requests(sched, 1, num_tokens=2 * B, max_tokens=2, same_prompt=True, req_ids=["seed"])
    while sched.has_unfinished_requests():
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so, 1000))
    assert sched.free_block_queue() == [3, 4, 5, 2, 1]  # seed's two prompt blocks cached

    _add(sched, "hog", [9] * 40, max_tokens=20)
    so = sched.schedule()
    assert blocks(so, "hog") == [3, 4, 5]
    apply(sched, so, {"hog": [1]})
    before = _prefix_stats(sched)

    # "retried" hits blocks 1 and 2, both free: 1 new block + 2 touched = 3 > 2 free.
    add_requests(sched, 1, num_tokens=3 * B, max_tokens=1, same_prompt=True, req_ids=["retried"])
    so = sched.schedule()
    assert so.req_ids == ["hog"]
    assert _prefix_stats(sched) == before
    apply(sched, so, {"hog": [1]})
    _abort(sched, "hog")

    so = sched.schedule()
    assert so.new_req_ids == ["retried"] and computed(so) == {"retried": 2 * B}
    after = _prefix_stats(sched)
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 3 * B, 2 * B, 0, 0, 0]


# ------------------------------------------------------------ test_scheduler.py, 74


def test_spec_decode_padding_first_decode_step_with_prefix_hit() -> None:
    """vLLM test_spec_decode_padding_first_decode_step (item 74) with a real 32-token prefix hit."""
    # A cached 33-token prompt needs 1 token and is padded to 1 + K beside a spec decode.
    num_spec = 3
    sched = apc(num_speculative_tokens=num_spec, block_size=B)
    add_requests(sched, 1, num_tokens=33, max_tokens=16, same_prompt=True, req_ids=["r1"])
    so = sched.schedule()
    assert scheduled(so) == {"r1": 33}
    apply(sched, so, {"r1": [100]})
    sched.update_draft_token_ids(["r1"], [[1, 2, 3]])

    add_requests(sched, 1, num_tokens=33, max_tokens=16, same_prompt=True, req_ids=["r2"])
    so = sched.schedule()
    assert so.new_req_ids == ["r2"]
    assert computed(so)["r2"] == 32  # the hit, not a given num_computed_tokens
    assert spec_tokens(so) == {"r1": [1, 2, 3], "r2": [-1] * num_spec}
    assert scheduled(so) == {"r1": 1 + num_spec, "r2": 1 + num_spec}
    # The padding drafts are rejected: r2 ends with C = N - 1.
    apply(sched, so, {"r1": [1, 101], "r2": [102]})
    r2 = sched.get_request("r2")
    assert (r2.num_tokens, r2.num_computed_tokens) == (34, 33)


# ------------------------------------------------------------------- hashing facts


def test_block_hashes_chain_on_the_prefix() -> None:
    """Spec §5.3/§5.4: a block's hash covers its whole prefix; the first miss ends a lookup."""
    sched = apc()
    a = [1] * B + [2] * B + [3] * B
    _add(sched, "a", a, max_tokens=1)
    _add(sched, "b", [9] * B + [2] * B + [3] * B, max_tokens=1)  # same blocks 1, 2
    _add(sched, "c", [1] * B + [5] * B + [3] * B, max_tokens=1)  # same blocks 0, 2
    _add(sched, "a2", a, max_tokens=1)
    ha, hb, hc = (sched.get_request(r).block_hashes for r in "abc")
    assert sched.get_request("a2").block_hashes == ha  # content, not request id
    assert len({ha[0], hb[0]}) == 2 and ha[0] == hc[0]
    assert len({ha[1], hb[1], hc[1]}) == 3  # equal content, different prefixes
    assert len({ha[2], hb[2], hc[2]}) == 3
    _abort(sched, "b", "c", "a2")

    so = sched.schedule()
    assert computed(so) == {"a": 0}
    _add(sched, "c", [1] * B + [5] * B + [3] * B + [4], max_tokens=1)
    _add(sched, "b", [9] * B + [2] * B + [3] * B + [4], max_tokens=1)
    _add(sched, "d", [*a, 4], max_tokens=1)
    so2 = sched.schedule()
    assert computed(so2) == {"c": B, "b": 0, "d": 3 * B}
    apply(sched, so, {"a": [4]})


def test_only_full_blocks_are_hashed_and_hits_stop_before_the_last_token() -> None:
    """Spec §5.3/§5.4: only full blocks are hashed; a hit covers at most N - 1 tokens."""
    sched = apc()
    for n in (1, 15, 16, 17, 31, 32, 33):
        _add(sched, f"n{n}", [7] * n, max_tokens=1)
        assert len(sched.get_request(f"n{n}").block_hashes) == n // B, n
    assert sched.get_request("n33").block_hashes[:2] == sched.get_request("n32").block_hashes
    assert sched.get_request("n17").block_hashes == sched.get_request("n16").block_hashes
    _abort(sched, *[f"n{n}" for n in (1, 15, 16, 17, 31, 32, 33)])

    _add(sched, "a", [7] * 2 * B, max_tokens=1)
    so = sched.schedule()
    assert computed(so) == {"a": 0}
    _add(sched, "same", [7] * 2 * B, max_tokens=1)
    _add(sched, "longer", [7] * (2 * B + 1), max_tokens=1)
    so2 = sched.schedule()
    assert computed(so2) == {"same": B, "longer": 2 * B}
    assert scheduled(so2) == {"same": B, "longer": 1}
    apply(sched, so, {"a": [1]})


def test_output_tokens_extend_block_hashes() -> None:
    """Spec §5.3: outputs extend Request.block_hashes as they arrive, chained on the prompt."""
    sched = apc()
    prompt = list(range(30))
    _add(sched, "r", prompt)
    so = sched.schedule()
    apply(sched, so, {"r": [100]})
    hashes = sched.get_request("r").block_hashes
    assert len(hashes) == 1  # 31 tokens
    so = sched.schedule()
    apply(sched, so, {"r": [101]})
    grown = sched.get_request("r").block_hashes
    assert len(grown) == 2 and grown[0] == hashes[0]  # 32 tokens
    _add(sched, "fresh", [*prompt, 100, 101])
    assert sched.get_request("fresh").block_hashes == grown
    _add(sched, "other", [*prompt, 100, 102])
    assert sched.get_request("other").block_hashes[1] != grown[1]


def test_block_hashes_empty_without_prefix_caching() -> None:
    """Spec §5.3: without prefix caching nothing is hashed, prompt or outputs."""
    sched = make_scheduler(enable_prefix_caching=False)
    _add(sched, "r", [7] * 40)
    so = sched.schedule()
    apply(sched, so, {"r": [1]})
    assert sched.get_request("r").block_hashes == []
    _add(sched, "s", [7] * 40)
    so = sched.schedule()
    assert computed(so)["s"] == 0


# ---------------------------------------------------------------------------- KV cache events


def test_kv_events_tell_what_entered_and_left_the_prefix_cache() -> None:
    """``take_kv_events`` (vLLM's KV cache events, by block id): a prefill stores its full
    blocks, the ones its output names; a later request's lookup reports its hit when the
    request asked; blocks evicted for reuse are removed; a reset clears."""
    # 7 usable blocks of 16 tokens.
    sched = apc(enable_kv_cache_events=True, num_gpu_blocks=8, async_scheduling=False)
    sched.add_request("a", [*COMMON, 7], max_tokens=1)
    so = sched.schedule()
    a_blocks = blocks(so, "a")
    assert sched.take_kv_events() == [("stored", "a", 0, a_blocks[:3], 0)]
    sched.update_from_output(so, one_token_each(so, EOS_TOKEN_ID))
    assert sched.take_kv_events() == []

    # b shares a's first block and asks to be told of its hit; c shares nothing and needs
    # four blocks: the free queue's uncached ones, then a's cached ones, least recently
    # used first (a freed its blocks tail first: its third block leaves before its second).
    sched.add_request("b", COMMON[:B] + [8] * (B + 1), max_tokens=1, report_reused_blocks=True)
    sched.add_request("c", [9] * (3 * B + 1), max_tokens=1)
    so = sched.schedule()
    assert blocks(so, "b")[0] == a_blocks[0]
    assert sched.take_kv_events() == [
        ("reused", "b", 1, 0),
        ("stored", "b", 1, blocks(so, "b")[1:2], 0),
        ("removed", a_blocks[2], 0),
        ("removed", a_blocks[1], 0),
        ("stored", "c", 0, blocks(so, "c")[:3], 0),
    ]
    sched.update_from_output(so, one_token_each(so, EOS_TOKEN_ID))
    assert sched.reset_prefix_cache()
    assert sched.take_kv_events() == [("cleared",)]


def test_kv_events_are_off_unless_enabled() -> None:
    """Without ``enable_kv_cache_events`` nothing is recorded, whatever the requests ask."""
    sched = apc(num_gpu_blocks=6, async_scheduling=False)
    sched.add_request("a", [*COMMON, 7], max_tokens=1, report_reused_blocks=True)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so, EOS_TOKEN_ID))
    sched.add_request("b", [*COMMON, 7], max_tokens=1, report_reused_blocks=True)
    sched.schedule()
    assert sched.take_kv_events() == []


def test_report_reused_blocks_must_be_a_bool() -> None:
    sched = apc(enable_kv_cache_events=True)
    with pytest.raises(InvalidRequestError, match="report_reused_blocks"):
        sched.add_request("a", [1, 2, 3], max_tokens=1, report_reused_blocks="yes")
    assert sched.get_request_counts() == (0, 0)


def _tables_refs(sched: CheckedScheduler, req_ids: Sequence[str]) -> dict[int, int]:
    """How many of the live requests' block tables hold each block (the null block left
    out), counted from the tables."""
    refs: dict[int, int] = defaultdict(int)
    for req_id in req_ids:
        for table in sched.get_request(req_id).group_block_ids:
            for block in table:
                refs[block] += block != 0
    return {block: n for block, n in refs.items() if n}


def test_block_ref_count_counts_the_tables_that_hold_each_block() -> None:
    """``block_ref_count`` gives each block the number of requests holding it (a shared
    prefix twice), ``cached_block_hash`` the hash a full block is cached under (the one its
    request's ``block_hashes`` gives it); ``finished_since_last_step`` names a finished
    request until the next step reports it."""
    sched = apc(block_size=B)
    sched.add_request("a", [*COMMON, 7], max_tokens=4)
    sched.add_request("b", [*COMMON, 8], max_tokens=4)
    sched.schedule()
    a = sched.get_request("a")
    shared = a.block_ids[:3]
    assert sched.get_request("b").block_ids[:3] == shared
    assert a.group_block_ids == [a.block_ids]
    num_blocks = sched.config.num_gpu_blocks

    def held() -> dict[int, int]:
        counts = {block: sched.block_ref_count(block) for block in range(num_blocks)}
        return {block: n for block, n in counts.items() if n}

    assert held() == _tables_refs(sched, ["a", "b"])
    assert [sched.block_ref_count(block) for block in shared] == [2, 2, 2]
    assert [sched.cached_block_hash(block) for block in shared] == a.block_hashes[:3]
    assert sched.cached_block_hash(a.block_ids[3]) is None  # a's last block is not full

    assert sched.finished_since_last_step() == []
    sched.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert sched.finished_since_last_step() == ["a"]
    assert held() == _tables_refs(sched, ["b"])
    assert [sched.block_ref_count(block) for block in shared] == [1, 1, 1]
    so = sched.schedule()
    assert so.finished_req_ids == ["a"] and sched.finished_since_last_step() == []


def test_probe_prefix_cache_finds_what_an_admission_finds_and_changes_nothing() -> None:
    """``probe_prefix_cache`` (vLLM's ``get_computed_blocks`` for a request not added): the
    hit of a prompt under the same keys is what the request then gets at admission; another
    salt or adapter, or skipping the cache, finds nothing; the probe records no stats and
    no events and touches no block."""
    sched = apc(block_size=B, enable_kv_cache_events=True, max_loras=2)
    _add(sched, "a", [*COMMON, 7], max_tokens=1, cache_salt="s", lora_id=1)
    apply(sched, sched.schedule(), {"a": [5]})
    sched.take_kv_events()
    state = (_prefix_stats(sched), sched.num_free_blocks, sched.free_block_queue())
    prompt = [*COMMON, 8]
    block_ids, num_tokens, boundary = sched.probe_prefix_cache(prompt, cache_salt="s", lora_id=1)
    assert (len(block_ids), num_tokens, boundary) == (1, 3 * B, 0)
    assert sched.probe_prefix_cache(prompt, cache_salt="t", lora_id=1)[1] == 0
    assert sched.probe_prefix_cache(prompt, cache_salt="s")[1] == 0
    skipped = sched.probe_prefix_cache(
        prompt, cache_salt="s", lora_id=1, skip_reading_prefix_cache=True
    )
    assert skipped == ([[]], 0, 0)
    assert (_prefix_stats(sched), sched.num_free_blocks, sched.free_block_queue()) == state
    assert sched.take_kv_events() == []
    with pytest.raises(InvalidRequestError, match="lora_id"):
        sched.probe_prefix_cache(prompt, lora_id="x")

    _add(sched, "b", prompt, cache_salt="s", lora_id=1)
    so = sched.schedule()
    assert computed(so)["b"] == num_tokens
    assert blocks(so, "b")[:3] == block_ids[0]
