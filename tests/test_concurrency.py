"""Threads and time: concurrent calls are serialized safely, and memory stays flat under churn.

``Scheduler`` documents that calls from several threads are serialized and that the GIL is
released while a call works. The thread tests run adders, aborters, readers (``get_request``,
``stats``, ``check_invariants``...) and steppers (``schedule`` + ``update_from_output``) at
once, with every join bounded by a timeout (a deadlock fails the test instead of hanging it),
and check the whole state afterwards. The soak tests run a long stream of requests that
arrive, finish and are aborted, each in a fresh interpreter, and compare its resident memory
after a warm-up with the memory at the end.

The slow soak (one million steps per policy) is marked ``slow``; the fast one runs in CI.
"""

from __future__ import annotations

import gc
import json
import random
import resource
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmsched import (
    ModelRunnerOutput,
    OutputMismatchError,
    RequestStatus,
    Scheduler,
    SchedulerConfig,
    SimulatedModelRunner,
    UnknownRequestError,
)

from conftest import one_token_each

JOIN_TIMEOUT = 60.0


class Crew:
    """Threads that run ``work`` until told to stop; exceptions are kept for the test."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.calls = 0
        self._lock = threading.Lock()

    def spawn(self, name: str, work: Callable[[random.Random], None], seed: int) -> None:
        def run() -> None:
            rng = random.Random(seed)
            try:
                while not self.stop.is_set():
                    work(rng)
                    with self._lock:
                        self.calls += 1
            except BaseException as e:  # reported by join()
                self.errors.append(e)
                self.stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)

    def run_for(
        self, seconds: float, until: Callable[[], bool] | None = None, most: float = 120.0
    ) -> None:
        """Runs the threads ``seconds``, then, if ``until`` is given, on until it holds (at
        most ``most`` seconds in all): on a loaded machine one thread can hold the lock for
        most of the time, and a wall-clock share would make the test flaky."""
        started = time.monotonic()
        for thread in self.threads:
            thread.start()
        self.stop.wait(seconds)
        while until is not None and not until() and time.monotonic() - started < most:
            if self.stop.wait(0.05):
                break
        self.stop.set()
        deadline = time.monotonic() + JOIN_TIMEOUT
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self.threads if t.is_alive()]
        assert not stuck, f"threads still running after {JOIN_TIMEOUT}s (deadlock?): {stuck}"
        if self.errors:
            raise self.errors[0]


def drain(sched: Scheduler, runner: SimulatedModelRunner, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        if not sched.has_requests():
            return
        so = sched.schedule()
        sched.update_from_output(so, runner.execute_model(so))
    raise AssertionError(f"requests left after {max_steps} steps: {sched.get_request_counts()}")


def test_threads_add_abort_read_and_step_at_once() -> None:
    """Adders, aborters, readers and locked schedule/update pairs at once: state stays sound."""
    config = SchedulerConfig(
        max_model_len=128,
        block_size=8,
        num_gpu_blocks=96,
        max_num_seqs=16,
        max_num_batched_tokens=128,
        num_speculative_tokens=2,
        async_scheduling=True,
        enable_prefix_caching=True,
    )
    sched = Scheduler(config)
    runner = SimulatedModelRunner(config, seed=3, eos_token_id=2, eos_probability=0.05)
    pair = threading.Lock()  # an engine applies its steps in order: the runner is not shared
    in_flight: list[tuple[object, ModelRunnerOutput]] = []
    ids: list[str] = []
    counter = iter(range(10**9))
    seen = {"steps": 0, "outputs": 0, "aborted": 0, "invariant_checks": 0}

    def add(rng: random.Random) -> None:
        rid = f"t{next(counter)}"
        prompt = [rng.randrange(40) for _ in range(rng.randint(1, 100))]
        sched.add_request(rid, prompt, max_tokens=rng.randint(1, 24), priority=rng.randint(0, 2))
        ids.append(rid)
        if sched.get_num_unfinished_requests() > 100:
            time.sleep(0.002)  # let the steppers catch up

    def abort(rng: random.Random) -> None:
        pick = [rng.choice(ids) for _ in range(3)] if ids else []
        seen["aborted"] += len(
            sched.finish_requests([*pick, "unknown"], RequestStatus.FINISHED_ABORTED)
        )

    def step(rng: random.Random) -> None:
        with pair:  # keep up to two steps in flight, applied in order
            so = sched.schedule()
            in_flight.append((so, runner.execute_model(so)))
            seen["steps"] += 1
            if len(in_flight) == 2 or rng.random() < 0.3:
                so, out = in_flight.pop(0)
                seen["outputs"] += len(sched.update_from_output(so, out))

    def read(rng: random.Random) -> None:
        if ids:
            try:
                request = sched.get_request(rng.choice(ids))
                assert request.num_computed_tokens >= 0
            except UnknownRequestError:
                pass  # finished or aborted meanwhile
        stats = sched.stats()
        assert stats["num_steps"] >= 0
        running, waiting = sched.get_request_counts()
        assert running <= config.max_num_seqs and waiting >= 0
        assert 0.0 <= sched.get_kv_cache_usage() <= 1.0
        sched.running_request_ids()
        sched.has_requests()

    def check(rng: random.Random) -> None:
        sched.check_invariants()  # between any two calls, whatever is in flight
        seen["invariant_checks"] += 1

    crew = Crew()
    for i in range(2):
        crew.spawn(f"add-{i}", add, seed=i)
    crew.spawn("abort", abort, seed=10)
    for i in range(2):
        crew.spawn(f"step-{i}", step, seed=20 + i)
    crew.spawn("read", read, seed=30)
    crew.spawn("check", check, seed=40)
    crew.run_for(2.0, until=lambda: seen["steps"] > 50 and seen["invariant_checks"] > 10)

    assert seen["steps"] > 50 and seen["invariant_checks"] > 10, seen
    sched.check_invariants()
    for so, out in in_flight:
        sched.update_from_output(so, out)
    drain(sched, runner)
    sched.check_invariants()
    assert sched.num_free_blocks == config.num_gpu_blocks - 1
    assert sched.get_num_unfinished_requests() == 0


def test_racing_steppers_apply_in_order_or_are_told_why() -> None:
    """Unlocked schedule/update from several threads: out-of-order applies fail cleanly."""
    # Without a lock two threads interleave their schedule() and update_from_output(): a
    # thread whose step is not the oldest in flight gets OutputMismatchError ("out of order")
    # and retries once the older step is applied. Empty outputs (no token sampled) are legal
    # for any step: a decode step without a token is undone, so the requests never finish
    # and the aborter ends them.
    config = SchedulerConfig(
        max_model_len=64,
        block_size=4,
        num_gpu_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        async_scheduling=True,
    )
    sched = Scheduler(config)
    counter = iter(range(10**9))
    ids: list[str] = []
    counts = {"applied": 0, "out_of_order": 0}

    def add(rng: random.Random) -> None:
        rid = f"r{next(counter)}"
        sched.add_request(rid, [rng.randrange(9) for _ in range(rng.randint(1, 40))], max_tokens=4)
        ids.append(rid)
        time.sleep(0.0005)

    def abort(rng: random.Random) -> None:
        if ids:
            sched.finish_requests(rng.sample(ids, min(4, len(ids))), RequestStatus.FINISHED_ABORTED)
        time.sleep(0.001)

    def step(rng: random.Random) -> None:
        so = sched.schedule()
        empty = ModelRunnerOutput(
            so.req_ids, np.zeros(0, np.int32), np.zeros(len(so.req_ids), np.int32)
        )
        deadline = time.monotonic() + JOIN_TIMEOUT
        while True:
            try:
                sched.update_from_output(so, empty)
                counts["applied"] += 1
                return
            except OutputMismatchError as e:
                assert "out of order" in str(e), e
                counts["out_of_order"] += 1
                assert time.monotonic() < deadline, "an older step is never applied"
                time.sleep(0)

    crew = Crew()
    crew.spawn("add", add, seed=1)
    crew.spawn("abort", abort, seed=2)
    for i in range(3):
        crew.spawn(f"step-{i}", step, seed=10 + i)
    crew.spawn("check", lambda rng: sched.check_invariants(), seed=3)
    crew.run_for(2.0)

    assert counts["applied"] > 50, counts
    assert sched.num_steps_in_flight == 0
    sched.check_invariants()
    sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    sched.schedule()
    sched.check_invariants()
    assert sched.num_free_blocks == config.num_gpu_blocks - 1 and not sched.has_requests()


def test_one_scheduler_per_thread_runs_in_parallel_without_interference() -> None:
    """Four threads, each with its own scheduler and runner: results equal a serial run."""
    config = SchedulerConfig(max_model_len=96, num_gpu_blocks=64, async_scheduling=False)

    def run(seed: int) -> dict[str, list[int]]:
        sched = Scheduler(config)
        runner = SimulatedModelRunner(config, seed=seed)
        rng = random.Random(seed)
        for i in range(30):
            prompt = [rng.randrange(100) for _ in range(rng.randint(1, 60))]
            sched.add_request(f"q{i}", prompt, max_tokens=rng.randint(1, 20))
        tokens: dict[str, list[int]] = {}
        while sched.has_requests():
            so = sched.schedule()
            for out in sched.update_from_output(so, runner.execute_model(so)):
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        return tokens

    serial = [run(seed) for seed in range(4)]
    results: dict[int, dict[str, list[int]]] = {}
    threads = [
        threading.Thread(target=lambda s=seed: results.__setitem__(s, run(s)), daemon=True)
        for seed in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert [results[s] for s in range(4)] == serial


def _large_scheduler(num_waiting: int) -> Scheduler:
    """16,384 running requests of 1,000 tokens, and ``num_waiting`` more waiting."""
    config = SchedulerConfig(
        max_model_len=4096,
        num_gpu_blocks=1_100_000,
        max_num_seqs=16384,
        max_num_batched_tokens=1 << 24,
        async_scheduling=False,
    )
    sched = Scheduler(config)
    for i in range(16384 + num_waiting):
        sched.add_request(f"r{i}", list(range(1000)), max_tokens=8)
    sched.schedule()
    return sched


def test_the_gil_is_released_while_a_call_works() -> None:
    """A Python thread keeps running while check_invariants() works on a large state."""
    # The call must last long enough to tell: the state grows until it takes 50 ms (a
    # release build checks the first state in about 30 ms, a debug build in 230).
    for num_waiting in (0, 16384, 65536):
        sched = _large_scheduler(num_waiting)
        stamps: list[float] = []
        stop = threading.Event()

        def spin(stamps: list[float] = stamps, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                stamps.append(time.perf_counter())

        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
        try:
            time.sleep(0.02)
            start = time.perf_counter()
            sched.check_invariants()
            end = time.perf_counter()
        finally:
            stop.set()
            spinner.join(JOIN_TIMEOUT)
        if end - start > 0.05:
            break
    # Were the GIL held during the call, the spinner could run only before it started (one
    # switch interval, 5 ms), not throughout. Count the 10 ms slots in which it ran.
    assert end - start > 0.05, f"the call took only {(end - start) * 1000:.1f} ms"
    inside = [t for t in stamps if start + 0.01 < t < end - 0.001]
    slots = {int((t - start) * 100) for t in inside}
    assert len(slots) >= 0.25 * (end - start - 0.011) * 100, (len(slots), end - start)


def test_reentrant_call_from_a_finalizer_does_not_deadlock() -> None:
    """Found here: a __del__ that calls the scheduler during schedule() hangs the process."""
    # schedule() builds its Python lists while holding the scheduler's (non-reentrant)
    # mutex. An allocation there can start the cyclic garbage collector, which runs
    # finalizers on the same thread; a finalizer that calls any Scheduler method then
    # blocks forever on the mutex its own thread holds (the GIL is released while waiting,
    # so nothing else notices). A request handle whose __del__ aborts its request is enough.
    # Acceptable: the inner call succeeds, or raises (Python reports an exception in
    # __del__ and carries on). Not acceptable: hanging. Run in a child with a timeout.
    script = textwrap.dedent(
        """
        import gc
        from llmsched import ModelRunnerOutput, RequestStatus, Scheduler, SchedulerConfig

        sched = Scheduler(SchedulerConfig(async_scheduling=False))
        for i in range(8):
            sched.add_request(f"r{i}", [1, 2, 3], max_tokens=4)

        class Handle:
            def __init__(self, rid):
                self.rid, self.me = rid, self  # a cycle: only the collector frees it
            def __del__(self):
                sched.finish_requests(self.rid, RequestStatus.FINISHED_ABORTED)

        gc.set_threshold(1, 1, 1)
        for i in range(50):
            for _ in range(20):
                Handle("nope")
            so = sched.schedule()
            out = ModelRunnerOutput.from_lists(so.req_ids, [[7]] * len(so.req_ids))
            sched.update_from_output(so, out)
        sched.check_invariants()
        print("ok")
        """
    )
    try:
        child = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: a finalizer re-entered the scheduler during a call")
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr[-2000:]


# ------------------------------------------------------------------------------ soak


def rss_mib() -> float:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def churn(policy: str, steps: int, seed: int = 0) -> tuple[float, float, int, dict[str, int]]:
    """A long stream of requests under overload, with client timeouts.

    88 live requests at any time: 24 "interactive" ones (priority 0..3, finish by length or
    EOS, time out after 400 steps) and 64 "batch" ones (priority 9, starved under the
    priority policy, time out after 1..4 steps and are aborted). Prompts share one of four
    16-token prefixes half of the time (prefix-cache hits and evictions). Every step: top up,
    abort the expired, schedule, sample one token per scheduled request, apply. Returns the
    RSS after a warm-up of a tenth of the steps, the RSS at the end, the number of
    requests and the scheduler's stats.
    """
    config = SchedulerConfig(
        max_model_len=128,
        block_size=16,
        num_gpu_blocks=48,
        max_num_seqs=8,
        max_num_batched_tokens=512,  # >= 8 x 56 tokens: no prefill is ever chunked
        async_scheduling=False,
        policy=policy,
        enable_prefix_caching=True,
    )
    sched = Scheduler(config)
    rng = random.Random(seed)
    deadline: dict[str, int] = {}
    batch_live = 0
    n = 0
    prefixes = [[rng.randrange(50) for _ in range(16)] for _ in range(4)]
    warm = steps // 10
    before = 0.0
    for step in range(steps):
        while len(deadline) < 88:
            batch = batch_live < 64
            rid = f"{'b' if batch else 'i'}{n}"
            n += 1
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 24))]
            if rng.random() < 0.5:
                prompt = rng.choice(prefixes) + prompt
            sched.add_request(
                rid,
                prompt,
                max_tokens=rng.randint(1, 16),
                eos_token_id=7,
                priority=9 if batch else rng.randint(0, 3),
            )
            deadline[rid] = step + (rng.randint(1, 4) if batch else 400)
            batch_live += batch
        expired = [rid for rid, end in deadline.items() if end <= step]
        if expired:
            sched.finish_requests(expired, RequestStatus.FINISHED_ABORTED)
            for rid in expired:
                del deadline[rid]
                batch_live -= rid[0] == "b"
        so = sched.schedule()
        k = len(so.req_ids)
        if k:
            tokens = np.array([rng.randrange(50) for _ in range(k)], dtype=np.int32)
            outs = sched.update_from_output(
                so, ModelRunnerOutput(so.req_ids, tokens, np.ones(k, np.int32))
            )
            for out in outs:
                if out.finished:
                    del deadline[out.request_id]
                    batch_live -= out.request_id[0] == "b"
        if step % 5000 == 0:
            sched.check_invariants()
            sched.reset_prefix_cache()  # usually refused: blocks are in use
        if step == warm:
            gc.collect()
            before = rss_mib()
    sched.check_invariants()
    gc.collect()
    return before, rss_mib(), n, dict(sched.stats())


def churn_in_child(policy: str, steps: int, seed: int) -> dict[str, Any]:
    """``churn`` in a fresh interpreter: memory that earlier tests freed would hide growth."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_concurrency import churn
        before, after, requests, stats = churn({policy!r}, {steps}, {seed})
        print(json.dumps({{"before": before, "after": after, "requests": requests, **stats}}))
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=3600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_soak_fast_memory_stays_flat(policy: str) -> None:
    """A few seconds of churn (adds, finishes, timeouts): RSS grows by less than 2 MiB."""
    r = churn_in_child(policy, steps=6_000, seed=0)
    assert r["requests"] > 30_000 and r["num_steps"] == 6_000
    growth = r["after"] - r["before"]
    assert growth < 2.0, f"RSS {r['before']:.1f} -> {r['after']:.1f} MiB, {r['requests']} requests"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_soak_million_steps_memory_stays_flat(policy: str) -> None:
    """One million steps of churn: RSS after warm-up and at the end differ by < 8 MiB."""
    r = churn_in_child(policy, steps=1_000_000, seed=1)
    print(f"{policy}: {r}")
    growth = r["after"] - r["before"]
    assert growth < 8.0, f"RSS {r['before']:.1f} -> {r['after']:.1f} MiB, {r['requests']} requests"


def test_a_reentrant_call_is_refused_and_the_outer_call_completes() -> None:
    """Code the collector runs inside a scheduler call (a gc callback here; a finalizer is
    the same) gets ReentrantCallError and changes nothing; the outer call and later calls
    work normally. In a fresh interpreter: after a long test session the collector may not
    happen to run inside a call at all."""
    script = textwrap.dedent(
        """
        import gc
        from llmsched import (
            ModelRunnerOutput, ReentrantCallError, RequestStatus, Scheduler, SchedulerConfig
        )

        sched = Scheduler(SchedulerConfig(async_scheduling=False))
        refused, allowed = [], 0

        def on_collect(phase, info):
            global allowed
            if phase == "start":
                try:
                    sched.finish_requests("nope", RequestStatus.FINISHED_ABORTED)
                    allowed += 1
                except BaseException as e:
                    refused.append(e)

        gc.set_threshold(1, 1, 1)
        gc.callbacks.append(on_collect)
        for step in range(20_000):
            sched.add_request(f"r{step}", [1, 2, 3], max_tokens=2)
            so = sched.schedule()
            out = ModelRunnerOutput.from_lists(so.req_ids, [[7]] * len(so.req_ids))
            sched.update_from_output(so, out)
            if refused:
                break
        gc.callbacks.remove(on_collect)
        assert refused, f"no collection ran inside a scheduler call ({allowed} outside)"
        assert all(isinstance(e, ReentrantCallError) for e in refused), refused
        assert isinstance(refused[0], RuntimeError), refused
        assert "already inside a call" in str(refused[0]), refused
        sched.check_invariants()
        while sched.has_requests():
            so = sched.schedule()
            out = ModelRunnerOutput.from_lists(so.req_ids, [[7]] * len(so.req_ids))
            sched.update_from_output(so, out)
        sched.check_invariants()
        print("ok", len(refused), allowed)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0 and child.stdout.startswith("ok"), child.stderr[-2000:]


def test_concurrent_calls_are_serialized() -> None:
    """Threads adding, scheduling and applying at once never corrupt the state."""
    sched = Scheduler(
        SchedulerConfig(max_model_len=256, num_gpu_blocks=512, async_scheduling=False)
    )
    lock = threading.Lock()  # keeps each schedule/update pair together, as an engine does
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(200):
                sched.add_request(f"{k}-{i}", [k, i % 7 + 1], max_tokens=3)
                with lock:
                    so = sched.schedule()
                    sched.update_from_output(so, one_token_each(so, token=5))
                sched.get_num_unfinished_requests()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    sched.check_invariants()
    while sched.has_requests():
        so = sched.schedule()
        sched.update_from_output(so, one_token_each(so, token=5))
    sched.check_invariants()
    assert sched.num_free_blocks == 511
