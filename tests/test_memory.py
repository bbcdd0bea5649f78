"""Memory at the boundary: what a call reads, and what the scheduler keeps.

An endless iterable (or one whose ``len()`` lies) handed to any call that reads a list is
refused with an ordinary exception naming the field, never read until the allocator
aborts the process: each call runs in a subprocess under an address-space limit
(``RLIMIT_AS``), where a growing read ends in SIGABRT, and must exit cleanly with the
expected exception.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter: builds a scheduler with requests "a" (running, one step
# applied, none in flight) and "b" (waiting), caps the address space 256 MiB above what
# it uses, runs CALL, and prints the class and message of what it raised.
HARNESS = textwrap.dedent(
    """
    import itertools, resource, sys
    import numpy as np
    from llmsched import Scheduler, SchedulerConfig, RequestStatus

    class Duck:
        def __init__(self, req_ids, sampled_token_ids, num_sampled):
            self.req_ids = req_ids
            self.sampled_token_ids = sampled_token_ids
            self.num_sampled = num_sampled

    class LyingLen:
        '''Claims 2**62 items; iterates over `items`.'''
        def __init__(self, items):
            self.items = items
        def __len__(self):
            return 2**62
        def __iter__(self):
            return iter(self.items)

    sched = Scheduler(SchedulerConfig(
        max_model_len=2048, num_speculative_tokens=2, async_scheduling=False,
        enable_prefix_caching=False, max_num_seqs=4, max_num_batched_tokens=2048))
    sched.add_request("a", [1, 2, 3], max_tokens=50)
    so = sched.schedule()
    sched.update_from_output(so, Duck(["a"], np.array([7], np.int32), np.array([1], np.int32)))
    sched.add_request("b", [4, 5], max_tokens=50)

    def vm_bytes():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmSize")

    limit = vm_bytes() + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = CALL
    except BaseException as error:
        print(f"{type(error).__name__}: {error}"[:300])
        sched.check_invariants()
        print("state:", sched.get_request_counts(), sched.get_request("a").spec_token_ids)
    else:
        print("returned:", repr(result)[:200])
    """
)

ENDLESS_CALLS = [
    (
        "prompt",
        "sched.add_request('x', itertools.repeat(1), max_tokens=1)",
        r"InvalidRequestError: prompt_token_ids=<more than 2047 tokens>",
    ),
    (
        "prompt-of-numpy-ints",
        "sched.add_request('x', map(np.int32, itertools.repeat(1)), max_tokens=1)",
        r"InvalidRequestError: prompt_token_ids=<more than 2047 tokens>",
    ),
    (
        "stop_token_ids",
        "sched.add_request('x', [1], max_tokens=1, stop_token_ids=itertools.repeat(1))",
        r"InvalidRequestError: stop_token_ids=<more than 1048576 ids>",
    ),
    (
        "finish_requests-ids",
        "sched.finish_requests(itertools.repeat('nope'), RequestStatus.FINISHED_ABORTED)",
        r"InvalidRequestError: request_ids=<more than 1048578 ids>",
    ),
    (
        "finish_requests-live-ids",
        "sched.finish_requests(itertools.cycle(['a', 'b']), RequestStatus.FINISHED_ABORTED)",
        r"InvalidRequestError: request_ids=<more than 1048578 ids>",
    ),
    (
        "drafts-req_ids",
        "sched.update_draft_token_ids(itertools.repeat('a'), [[1]])",
        r"InvalidRequestError: req_ids=<more than 6 requests>",
    ),
    (
        "drafts-rows",
        "sched.update_draft_token_ids(['a'], itertools.repeat([1]))",
        r"InvalidRequestError: draft_token_ids=<more than 1 rows>",
    ),
    (
        "drafts-row",
        "sched.update_draft_token_ids(['a'], [itertools.repeat(1)])",
        r"InvalidRequestError: draft_token_ids\[0\]=<more than 2 drafts>",
    ),
    (
        "drafts-flat",
        "sched.update_draft_token_ids(['a'], itertools.repeat(1), [1])",
        r"InvalidRequestError: draft_token_ids=<more than 2 drafts>",
    ),
    (
        "drafts-counts",
        "sched.update_draft_token_ids(['a'], [1], itertools.repeat(1))",
        r"InvalidRequestError: num_draft_tokens=<more than 1 counts>",
    ),
    (
        "runner-req_ids",
        "sched.update_from_output(so := sched.schedule(), Duck(itertools.repeat('a'),"
        " np.array([8, 9], np.int32), np.array([1, 1], np.int32)))",
        r"OutputMismatchError: runner_output.req_ids has over 2 requests",
    ),
    (
        "lying-len-endless-prompt",
        "sched.add_request('x', LyingLen(itertools.repeat(1)), max_tokens=1)",
        r"InvalidRequestError: prompt_token_ids=<more than 2047 tokens>",
    ),
    (
        "lying-len-drafts",
        "sched.update_draft_token_ids(LyingLen(iter(['a'])), LyingLen([LyingLen([5, 6])]))",
        r"returned: None",
    ),
    (
        "lying-len-prompt",
        "sched.add_request('x', LyingLen([1, 2, 3]), max_tokens=1)",
        r"returned: None",
    ),
]


def run_under_memory_limit(call: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    script = HARNESS.replace("CALL", call)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("call", "expected"),
    [(call, expected) for _, call, expected in ENDLESS_CALLS],
    ids=[name for name, _, _ in ENDLESS_CALLS],
)
def test_an_endless_or_lying_iterable_is_refused_not_an_abort(call: str, expected: str) -> None:
    done = run_under_memory_limit(call)
    assert done.returncode == 0, (
        f"the process ended with {done.returncode} (a negative code is a signal: "
        f"-6 SIGABRT):\n{done.stdout}{done.stderr[-2000:]}"
    )
    first, *rest = done.stdout.splitlines()
    assert re.match(expected, first), done.stdout
    if not first.startswith("returned"):
        # Refused: nothing changed ("a" still running with no drafts, "b" waiting; the
        # runner's case scheduled both first).
        state = "(2, 0)" if "schedule()" in call else "(1, 1)"
        assert rest == [f"state: {state} []"], done.stdout
