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


# ------------------------------------------------------------------ what a finished request keeps

# Runs in a fresh interpreter: ROUNDS add-then-abort cycles of PROMPT-token prompts without
# a schedule(), prints the growth of the resident set (bytes), then the next step's report.
CYCLES = textwrap.dedent(
    """
    import os
    import numpy as np
    from llmsched import Scheduler, SchedulerConfig, RequestStatus

    def resident_bytes():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    config = SchedulerConfig(
        max_model_len=16384, max_num_batched_tokens=16384, block_size=16,
        num_gpu_blocks=2048, enable_prefix_caching=True)
    sched = Scheduler(config)
    prompt = np.arange(PROMPT, dtype=np.int32)

    def cycles(first, count):
        for i in range(first, first + count):
            sched.add_request(f"r{i}", prompt, max_tokens=1)
            sched.finish_requests(f"r{i}", RequestStatus.FINISHED_ABORTED)

    cycles(0, 50)  # the allocator's and the interpreter's own warm-up
    before = resident_bytes()
    cycles(50, ROUNDS)
    print(resident_bytes() - before)
    report = sched.schedule().finished_req_ids
    print(len(report), len(set(report)), report[0], report[-1])
    """
)

CHECK_WORKLOAD = textwrap.dedent(
    """
    import resource
    from llmsched.sim.simulate import check_workload
    from llmsched.sim.workload import RequestSpec, Workload
    from llmsched import SchedulerConfig

    def peak_resident_bytes():
        # The high-water mark: the probe scheduler frees what it held when the check returns.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    config = SchedulerConfig(
        max_model_len=16384, max_num_batched_tokens=16384, block_size=16,
        num_gpu_blocks=2048, enable_prefix_caching=True)
    specs = [RequestSpec(f"r{i}", float(i), PROMPT, 1, key=i) for i in range(ROUNDS + 50)]
    check_workload(config, Workload("warm-up", specs[:50], "test"))
    before = peak_resident_bytes()
    check_workload(config, Workload("replay", specs, "test"))
    print(peak_resident_bytes() - before)
    """
)

ROUNDS, PROMPT = 3000, 12_000
# What holding the finished records would cost: each prompt (4 bytes a token) and its
# block hashes (16 bytes a block of 16 tokens), 60 KB a request, 180 MB in all.
HELD = ROUNDS * PROMPT * (4 + 16 / 16)


def run_script(script: str) -> list[str]:
    source = script.replace("ROUNDS", str(ROUNDS)).replace("PROMPT", str(PROMPT))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_a_finished_request_keeps_only_its_id_until_the_next_step() -> None:
    """3,000 add-then-abort cycles of 12,000-token prompts without a ``schedule()``: the
    process grows by what the ids cost, not by the prompts and block hashes (180 MB)."""
    growth, reported, distinct, first, last = run_script(CYCLES)
    assert int(growth) < HELD / 20, f"grew by {int(growth) / 2**20:.1f} MiB"
    # Every finished request is still reported, once, by the next step.
    assert (int(reported), int(distinct)) == (ROUNDS + 50, ROUNDS + 50)
    assert (first, last) == ("r0", f"r{ROUNDS + 49}")


def test_the_workload_check_holds_no_prompt_of_the_replay() -> None:
    """``check_workload`` adds and aborts every request of a replay on a scheduler that
    never schedules: it holds the ids only (its peak resident set grows by no prompt)."""
    (growth,) = run_script(CHECK_WORKLOAD)
    assert int(growth) < HELD / 20, f"grew by {int(growth) / 2**20:.1f} MiB"


def test_a_finished_request_is_reported_by_its_own_id_object() -> None:
    """The ids are all a finished request keeps: the next step reports the very object it
    was added with, though a newer request with an equal id took its slot meanwhile; and
    that object, handed in later, names the newer request by its text."""
    import numpy as np

    from llmsched import RequestStatus, Scheduler, SchedulerConfig

    def run(sched: Scheduler) -> object:
        so = sched.schedule()
        n = len(so.req_ids)
        sampled = np.full(n, 7, np.int32), np.ones(n, np.int32)
        sched.update_from_output(so, _Output(list(so.req_ids), *sampled))
        return so

    config = SchedulerConfig(
        async_scheduling=False, num_speculative_tokens=1, enable_prefix_caching=False
    )
    sched = Scheduler(config)
    old = "".join(["re", "quest"])  # an id object of its own
    sched.add_request(old, [1, 2, 3], max_tokens=5)
    run(sched)
    assert sched.finish_requests([old], RequestStatus.FINISHED_ABORTED) == ["request"]
    new = "".join(["re", "quest"])
    assert new == old and new is not old
    sched.add_request(new, [4, 5, 6], max_tokens=5)
    so = run(sched)
    (reported,) = so.finished_req_ids
    assert reported is old
    sched.update_draft_token_ids([old], [[9]])
    so = sched.schedule()
    assert so.req_ids == ["request"] and so.spec_token_ids.tolist() == [9]


class _Output:
    def __init__(self, req_ids: object, sampled_token_ids: object, num_sampled: object) -> None:
        self.req_ids = req_ids
        self.sampled_token_ids = sampled_token_ids
        self.num_sampled = num_sampled
