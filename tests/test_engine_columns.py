"""What a real engine's model runner needs beyond the counts: output-token counts, the
requests a runner may hold stale state for, the pause state, and the cached-block count
(the columns the vLLM plug-in reads; vLLM's meaning is stated in each test)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from llmsched import InvalidRequestError, OutputMismatchError

from conftest import add_requests, make_scheduler, one_token_each, runner_output


def test_num_output_tokens_counts_outputs_and_placeholders_before_the_step() -> None:
    """vLLM's ``CachedRequestData.num_output_tokens``: ``N - Np + P`` before the step."""
    sched = make_scheduler(async_scheduling=True)
    add_requests(sched, 2, num_tokens=8, max_tokens=10, ignore_eos=True)
    s1 = sched.schedule()  # prefill, P becomes 1 after it
    assert s1.num_output_tokens.tolist() == [0, 0]
    s2 = sched.schedule()  # before s1's output: one placeholder each
    assert s2.num_output_tokens.tolist() == [1, 1]
    sched.update_from_output(s1, one_token_each(s1, 20))
    s3 = sched.schedule()  # one token delivered, one placeholder in flight (s2)
    assert s3.num_output_tokens.tolist() == [2, 2]
    assert not s3.num_output_tokens.flags.writeable


def test_num_output_tokens_sync_is_the_delivered_count() -> None:
    sched = make_scheduler()
    add_requests(sched, 1, num_tokens=5, max_tokens=10, ignore_eos=True)
    for expected in range(4):
        so = sched.schedule()
        assert so.num_output_tokens.tolist() == [expected]
        sched.update_from_output(so, one_token_each(so, 30 + expected))


def test_rescheduled_req_ids_after_a_step_that_skipped_them() -> None:
    """vLLM's V1 runner drops a request it did not see in the previous step; the scheduler
    then sends all its tokens (``CachedRequestData.all_token_ids``). Here a request's
    drafts eat the token budget, so the running loop skips the next request once."""
    sched = make_scheduler(
        num_speculative_tokens=1,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        max_num_scheduled_tokens=2,
    )
    sched.add_request("a", [5], max_tokens=20, eos_token_id=None)
    sched.add_request("b", [6], max_tokens=20, eos_token_id=None)
    so = sched.schedule()
    assert so.req_ids == ["a", "b"] and so.rescheduled_req_ids == []
    sched.update_from_output(so, one_token_each(so, 11))
    sched.update_draft_token_ids(["a"], [[12]])  # a: 1 + 1 draft = the whole budget
    so = sched.schedule()
    assert so.req_ids == ["a"] and so.rescheduled_req_ids == []
    sched.update_from_output(so, runner_output(so, [[12, 13]]))
    so = sched.schedule()
    assert so.req_ids == ["a", "b"]
    assert so.rescheduled_req_ids == ["b"]  # "a" ran in the previous step, "b" did not
    sched.update_from_output(so, one_token_each(so, 14))
    so = sched.schedule()
    assert so.rescheduled_req_ids == []


def test_an_empty_step_makes_every_running_request_rescheduled() -> None:
    sched = make_scheduler()
    add_requests(sched, 2, num_tokens=4, max_tokens=20, ignore_eos=True)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    sched.set_pause_state(2)
    empty = sched.schedule()
    assert empty.req_ids == [] and empty.rescheduled_req_ids == []
    sched.set_pause_state(0)
    so = sched.schedule()
    assert so.rescheduled_req_ids == ["0", "1"]


def test_pause_all_schedules_nothing_but_reports_finished() -> None:
    """vLLM's ``PauseState.PAUSED_ALL``: no token is scheduled, finished ids still go out,
    and no request counts as unfinished."""
    sched = make_scheduler()
    add_requests(sched, 2, num_tokens=5, max_tokens=5, ignore_eos=True)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    sched.finish_requests("0", 9)
    sched.set_pause_state(2)
    assert sched.pause_state == 2
    assert sched.get_num_unfinished_requests() == 0
    paused = sched.schedule()
    assert paused.req_ids == [] and paused.total_num_scheduled_tokens == 0
    assert paused.finished_req_ids == ["0"]
    sched.set_pause_state(0)
    assert sched.get_num_unfinished_requests() == 1
    assert sched.schedule().req_ids == ["1"]


def test_pause_new_serves_running_requests_and_admits_none() -> None:
    """``PAUSED_NEW``: running requests go on, waiting ones stay queued (and do not count
    as unfinished) until unpaused."""
    sched = make_scheduler()
    add_requests(sched, 1, num_tokens=5, max_tokens=5, ignore_eos=True)
    so = sched.schedule()
    sched.update_from_output(so, one_token_each(so))
    add_requests(sched, 1, num_tokens=5, max_tokens=5, req_ids=["late"], ignore_eos=True)
    sched.set_pause_state(1)
    assert sched.get_num_unfinished_requests() == 1
    so = sched.schedule()
    assert so.req_ids == ["0"] and so.new_req_ids == []
    sched.update_from_output(so, one_token_each(so))
    sched.set_pause_state(0)
    assert "late" in sched.schedule().new_req_ids


@pytest.mark.parametrize("value", [-1, 3, 99])
def test_pause_state_out_of_range_is_refused_and_changes_nothing(value: int) -> None:
    sched = make_scheduler()
    with pytest.raises(InvalidRequestError, match=f"pause_state={value}"):
        sched.set_pause_state(value)
    assert sched.pause_state == 0


def test_num_cached_blocks_counts_the_prefix_cached_blocks() -> None:
    """vLLM's ``estimate_cached_tokens`` is this count times the block size."""
    sched = make_scheduler(enable_prefix_caching=True, block_size=4)
    sched.add_request("a", list(range(10)), max_tokens=3, eos_token_id=None)
    so = sched.schedule()
    assert sched.get_request("a").num_cached_blocks == 2  # two full blocks of 10 tokens
    sched.update_from_output(so, one_token_each(so))
    no_cache = make_scheduler(enable_prefix_caching=False, block_size=4)
    no_cache.add_request("a", list(range(10)), max_tokens=3, eos_token_id=None)
    no_cache.schedule()
    assert no_cache.get_request("a").num_cached_blocks == 0
    assert np.array_equal(so.num_computed_tokens, [0])


def test_importing_the_vllm_plugin_without_vllm_is_one_clear_line() -> None:
    code = "import sys; sys.modules['vllm'] = None; import llmsched.vllm"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: llmsched.vllm needs vLLM")
    assert "pip install 'llmsched[vllm]'" in last


def _rows_output(req_ids: list[str], rows: object) -> object:
    """vLLM's runner shape: one token list per request, ``num_sampled=None``."""

    class Rows:
        num_sampled = None

        def __init__(self) -> None:
            self.req_ids = req_ids
            self.sampled_token_ids = rows

    return Rows()


def test_vllms_token_lists_apply_like_the_flat_arrays() -> None:
    flat, lists = make_scheduler(), make_scheduler()
    for sched in (flat, lists):
        add_requests(sched, 3, num_tokens=4, max_tokens=3, ignore_eos=True)
    for step in range(4):
        a, b = flat.schedule(), lists.schedule()
        rows = [[20 + step + i] for i in range(len(a.req_ids))]
        out_a = flat.update_from_output(a, runner_output(a, rows))
        out_b = lists.update_from_output(b, _rows_output(list(reversed(b.req_ids)), rows[::-1]))
        assert list(out_a) == list(out_b)
    assert flat.debug_snapshot() == lists.debug_snapshot()


@pytest.mark.parametrize(
    ("rows", "names"),
    [
        ((7,), "sampled_token_ids: with num_sampled=None"),
        ([[7], (8,)], "sampled_token_ids[1]: must be a list"),
        ([[7], [8, "x"]], "sampled_token_ids[1][1]: must be an int32"),
        ([[7], [2**31]], "sampled_token_ids[1][0]"),
    ],
)
def test_bad_token_lists_name_the_row_and_change_nothing(rows: object, names: str) -> None:
    sched = make_scheduler()
    add_requests(sched, 2, num_tokens=4, max_tokens=3, ignore_eos=True)
    so = sched.schedule()
    before = sched.debug_snapshot()
    with pytest.raises(OutputMismatchError, match=re.escape(names)):
        sched.update_from_output(so, _rows_output(so.req_ids, rows))
    assert sched.debug_snapshot() == before
    sched.update_from_output(so, one_token_each(so))  # the step still applies
