"""Rules that hand-made mutants of the core survived, pinned through the Python API.

Each test names the rule it guards; removing that rule from the core turns it red.
"""

from __future__ import annotations

from llmsched import ModelRunnerOutput, RequestStatus, Scheduler, SchedulerConfig


def apply(sched: Scheduler, rows: dict[str, list[int]]) -> None:
    so = sched.schedule()
    out = ModelRunnerOutput.from_lists(so.req_ids, [rows.get(rid, []) for rid in so.req_ids])
    sched.update_from_output(so, out)


def test_a_stop_on_an_accepted_draft_caches_nothing_past_the_stop() -> None:
    """Rule: when a stop lands mid-output, ``C`` is trimmed to ``N - 1`` before blocks are
    cached. Without the trim, the block holding the tokens past the stop is registered, and
    a later prompt with that prefix hits 4 tokens that were never the request's."""
    config = SchedulerConfig(
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=16,
        num_speculative_tokens=2,
        async_scheduling=False,
        enable_prefix_caching=True,
    )
    sched = Scheduler(config)
    sched.add_request("a", [10, 11], max_tokens=8, eos_token_id=13)
    apply(sched, {"a": [12]})  # the prompt, then 12 sampled
    sched.update_draft_token_ids(["a"], [[13, 14]])
    so = sched.schedule()
    assert so.num_scheduled_tokens.tolist() == [3]  # 12 and the drafts 13, 14
    outputs = sched.update_from_output(so, ModelRunnerOutput.from_lists(["a"], [[13, 14, 15]]))
    assert [(o.new_token_ids, o.status) for o in outputs] == [
        ([13], RequestStatus.FINISHED_STOPPED)
    ]
    sched.schedule()  # reports the finish
    queue = sched.free_block_queue()
    # a's blocks 1 and 2 hold no cached content: freed to the head, the last one first
    # (a cached block would go to the tail, kept for hits as long as possible).
    assert queue == [2, 1, *range(3, 16)]
    sched.add_request("b", [10, 11, 12, 13, 20], max_tokens=2)
    so = sched.schedule()
    assert so.num_computed_tokens.tolist() == [0], "hits on a block cached past a stop"
    assert sched.stats()["prefix_cache_hits"] == 0
    assert so.block_ids.tolist() == [2, 1]


def test_undoing_a_priority_preemption_uncaches_the_victims_new_blocks() -> None:
    """Rule: when a request already scheduled in this step is chosen as the victim, its
    entry is undone and the blocks its allocation registered in the prefix cache are
    uncached: the step never computes them. Otherwise, on resumption, the cache offers
    more of its prompt than it ever computed."""
    config = SchedulerConfig(
        max_model_len=64,
        max_num_seqs=2,
        max_num_batched_tokens=8,
        block_size=4,
        num_gpu_blocks=12,
        policy="priority",
        long_prefill_token_threshold=3,
        enable_prefix_caching=True,
        async_scheduling=False,
    )
    sched = Scheduler(config)
    sched.add_request("a", list(range(1, 33)), max_tokens=1, priority=1, arrival_time=0.0)
    apply(sched, {})
    # More important, later: joins behind a in running order.
    sched.add_request("b", list(range(101, 133)), max_tokens=1, priority=0, arrival_time=1.0)
    computed = 0
    resumed_at = None
    for _ in range(40):
        so = sched.schedule()
        if "a" in so.resumed_req_ids:
            resumed_at = int(so.num_computed_tokens[so.req_ids.index("a")])
            break
        ends = (so.num_computed_tokens + so.num_scheduled_tokens).tolist()
        sched.update_from_output(
            so, ModelRunnerOutput.from_lists(so.req_ids, [[7] if e >= 32 else [] for e in ends])
        )
        a = sched.get_request("a")
        if a.status is RequestStatus.RUNNING:
            computed = a.num_computed_tokens  # steps are applied one at a time: C is computed
        if "a" in so.preempted_req_ids:
            # b, which preempted a, leaves: a resumes from what the prefix cache offers.
            sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert resumed_at is not None, "the scenario no longer preempts and resumes a"
    assert 0 < resumed_at <= computed, (
        f"a computed {computed} tokens before its preemption, but resumed from {resumed_at}"
    )
