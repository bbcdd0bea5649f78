"""The encoder cache through the binding, as a request sees it: the inputs whose outputs it
references (``Request.referenced_mm_inputs``), and an identifier reused within a request for
another count of embeddings, listed (``encoder_mismatch_ids``) until the next update fails
the request (``finish_encoder_mismatches``) while the others go on."""

from __future__ import annotations

import pytest

from llmsched import RequestStatus, Scheduler, SchedulerConfig, UnknownRequestError

from conftest import runner_output


def _scheduler() -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_model_len=512,
            block_size=16,
            num_gpu_blocks=64,
            max_num_batched_tokens=100,
            max_num_seqs=8,
            max_num_encoder_input_tokens=100,
            encoder_cache_size=200,
            async_scheduling=False,
        )
    )


def test_a_request_references_the_inputs_its_chunk_reaches_until_its_tokens_pass_them() -> None:
    sched = _scheduler()
    # Two inputs share identifier "a" (one output, encoded once); "b" is past the chunk.
    images = [("a", 0, 50), ("a", 60, 50), ("b", 120, 50)]
    sched.add_request("r", list(range(1, 201)), max_tokens=4, mm_inputs=images)
    assert sched.get_request("r").referenced_mm_inputs == []
    so = sched.schedule()
    assert so.num_scheduled_tokens.tolist() == [100]
    assert so.encoder_input_ids.tolist() == [0]
    # The chunk reaches the second "a" too: both reference the output encoded for the first.
    assert sched.get_request("r").referenced_mm_inputs == [0, 1]
    sched.update_from_output(so, runner_output(so, [[]]))
    # Its computed tokens passed the first input, not the second.
    assert sched.get_request("r").referenced_mm_inputs == [1]
    entries, freeable = sched.encoder_cache_contents()
    assert entries == [("a", 50, ["r"])] and freeable == []
    sched.check_invariants()


def test_an_identifier_reused_for_another_count_fails_only_its_request() -> None:
    sched = _scheduler()
    sched.add_request(
        "m", list(range(1, 31)), max_tokens=4, mm_inputs=[("x", 0, 10), ("x", 10, 12)]
    )
    sched.add_request("ok", list(range(1, 21)), max_tokens=4)
    free_before = sched.num_free_blocks
    so = sched.schedule()
    # "m" gets nothing (vLLM's encoder_cache_mismatch_reqs), "ok" runs, nothing is cached.
    assert so.req_ids == ["ok"]
    assert sched.encoder_mismatch_ids() == ["m"]
    assert sched.encoder_cache_contents() == ([], [])
    sched.update_from_output(so, runner_output(so, [[7]]))
    assert sched.finish_encoder_mismatches() == ["m"]
    assert sched.encoder_mismatch_ids() == []
    (final,) = sched.take_finished_requests()
    assert (final.request_id, final.status) == ("m", RequestStatus.FINISHED_ERROR)
    with pytest.raises(UnknownRequestError):
        sched.get_request("m")
    assert sched.get_request("ok").output_token_ids == [7]
    # "m" held no blocks: the pool lost none to it.
    assert sched.num_free_blocks == free_before - len(sched.get_request("ok").block_ids)
    sched.check_invariants()
