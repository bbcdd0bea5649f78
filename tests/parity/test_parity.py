"""Every step of every parity case is identical in llmsched and in vLLM 0.33.0's scheduler.

Runs only where vLLM is importable (the vLLM 0.33.0 venv: ``make parity-test``); skipped
elsewhere, which is the only skip in the suite. See ``harness`` for the runner and the
engine loop, ``matrix`` for the workloads and configs.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import pytest
from benches.parity import harness
from benches.parity.fuzz import make_case
from benches.parity.harness import (
    LlmschedSide,
    ParityConfig,
    ParityRequest,
    RunnerError,
    RunResult,
    SessionInput,
    VllmSide,
    blocks_needed,
    compare,
    coverage,
    describe,
    deviation_triggers,
    drive,
    llmsched_refuses,
    run_case,
)
from benches.parity.matrix import Case, case_by_id, case_params, cases, missing_trace
from benches.parity.report import DEVIATIONS_MD

pytest.importorskip("vllm", reason="vLLM 0.33.0 is installed in its own venv: make parity-test")

CASES = cases()


@pytest.mark.parametrize("case", case_params(CASES))
def test_every_step_identical(case: Case) -> None:
    comparison, vllm_run, llmsched_run = run_case(case.config, case.requests())
    assert comparison.steps_compared > 0
    assert comparison.identical, f"{case.id}\n" + describe(
        comparison, context=3, runs=(vllm_run, llmsched_run)
    )


def test_a_different_decision_is_caught() -> None:
    """The harness is not vacuous: a pool one block larger on one side shows up."""
    case = case_by_id("azure-conv/async-K3-apc-prio-kv")
    requests = case.requests()
    vllm_run = drive(VllmSide, case.config, requests)
    bigger = dataclasses.replace(case.config, num_gpu_blocks=case.config.num_gpu_blocks + 1)
    comparison = compare(vllm_run, drive(LlmschedSide, bigger, requests))
    assert not comparison.identical
    assert comparison.first_difference is not None
    assert comparison.detail


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [
        (
            "synthetic-chat/async-K3-apc-fcfs-kv",
            ("preemptions", "resumptions", "prefix_hit_admissions", "draft_slots"),
        ),
        ("azure-conv/sync-K3-apc-fcfs", ("padded_admissions", "finished_stop")),
        ("synthetic-conv/edge-tightM-async-K3-apc", ("padded_admissions", "finished_length")),
        # The emulation of llmsched's uncaching of an undone step (deviation below) fires.
        ("azure-code/sync-K3-apc-prio-kv", ("uncached_blocks",)),
        ("azure-code/async-K1-apc-prio-kv", ("uncached_blocks",)),
        # A KV connector's loads across steps start, and some requests wait for them.
        ("synthetic-conv/edge-kvconn-asyncload-sync-K0-apc-fcfs-kv", ("kv_loads_started",)),
        ("synthetic-code/edge-kvconn-asyncload-async-K3-apc-fcfs-kv", ("kv_loads_started",)),
    ],
)
def test_the_matrix_reaches_the_rules(case_id: str, expected: tuple[str, ...]) -> None:
    """Cases that must exercise a rule do (on vLLM's side, identical on llmsched's)."""
    case = case_by_id(case_id)
    counts = coverage(drive(VllmSide, case.config, case.requests()))
    assert all(counts[key] > 0 for key in expected), counts


class _SessionPaths(VllmSide):
    """vLLM's scheduler, counting which of its streaming-input paths a run takes."""

    def __init__(self, config: ParityConfig, counts: dict[str, int]) -> None:
        super().__init__(config)
        from vllm.v1.request import RequestStatus

        sched = self.scheduler
        handle_stopped, update_as_session = (
            sched._handle_stopped_request,
            sched._update_request_as_session,
        )
        finish = sched.finish_requests

        def handle_stopped_request(request: Any) -> bool:
            if request.resumable:
                queue = request.streaming_queue
                path = "paused" if not queue else "ended" if queue[0] is None else "taken"
                counts[f"stop_{path}"] += 1
                # (the running ones leave `running` only after the loop over the outputs)
                counts["stopped_preempted"] += request not in sched.running
                counts["in_flight_dropped"] += request.num_in_flight_tokens > 0
            return bool(handle_stopped(request))

        def update_request_as_session(session: Any, update: Any) -> None:
            waiting = session.status == RequestStatus.WAITING_FOR_STREAMING_REQ
            counts["taken_while_waiting"] += waiting
            update_as_session(session, update)

        def finish_requests(request_ids: Any, status: Any) -> Any:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
            counts["ended_while_waiting"] += sum(
                sched.requests[rid].status == RequestStatus.WAITING_FOR_STREAMING_REQ
                for rid in ids
                if rid in sched.requests
            )
            return finish(request_ids, status)

        sched._handle_stopped_request = handle_stopped_request
        sched._update_request_as_session = update_request_as_session
        sched.finish_requests = finish_requests
        self._counts = counts

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        sched = self.scheduler
        held = sched.num_waiting_for_streaming_input
        full = len(sched.running) + held >= sched.max_num_running_reqs
        self._counts["slots_held_back_admission"] += bool(held and full and len(sched.waiting))
        self._counts["sessions_preempted"] += sum(
            sched.requests[rid].resumable for rid in summary["preempted"] if rid in sched.requests
        )
        return out, summary


def test_the_session_cases_reach_every_session_path() -> None:
    """The streaming-input cases take each path of vLLM's sessions (on vLLM's side; the
    parity cases hold llmsched's identical): an input taken up at a stop and one taken up
    by a session waiting for it, a session's end at its stop and while it waits, a stop of
    output owed while preempted, work in flight dropped at a stop, sessions preempted, and
    sessions waiting for input holding the runner slots a waiting request needs."""
    counts: dict[str, int] = collections.Counter()
    for case in CASES:
        if case.sessions:
            drive(functools.partial(_SessionPaths, counts=counts), case.config, case.requests())
    expected = (
        "stop_paused",
        "stop_taken",
        "stop_ended",
        "taken_while_waiting",
        "ended_while_waiting",
        "stopped_preempted",
        "in_flight_dropped",
        "sessions_preempted",
        "slots_held_back_admission",
    )
    assert all(counts[key] > 0 for key in expected), dict(counts)


class _WatermarkWhileIdle(VllmSide):
    """vLLM's scheduler with the watermark held back for admissions into an empty batch
    too (a rule the watermark cases must tell apart from vLLM's)."""

    def __init__(self, config: ParityConfig) -> None:
        super().__init__(config)
        manager = self.scheduler.kv_cache_manager
        allocate = manager.allocate_slots

        def allocate_slots(*args: Any, **kwargs: Any) -> Any:
            kwargs["has_scheduled_reqs"] = True
            return allocate(*args, **kwargs)

        manager.allocate_slots = allocate_slots


class _WatermarkOneBlockMore(VllmSide):
    """vLLM's scheduler keeping one block more than the watermark free (what ``>=`` in
    place of ``>`` in the watermark's test does)."""

    def __init__(self, config: ParityConfig) -> None:
        super().__init__(config)
        self.scheduler.kv_cache_manager.watermark_blocks += 1


@pytest.mark.parametrize(
    ("case_id", "rules"),
    [
        ("synthetic-chat/edge-watermark-exact-sync-K1-apc-fcfs-kv", (_WatermarkOneBlockMore,)),
        (
            "azure-conv/edge-watermark-idle-sync-K1-apc-fcfs-kv",
            (_WatermarkOneBlockMore, _WatermarkWhileIdle),
        ),
    ],
)
def test_the_watermark_cases_reach_its_edges(case_id: str, rules: tuple[type, ...]) -> None:
    """Decisions in these cases depend on the watermark's edges: vLLM with the watermark a
    block larger, or held back for an empty batch too, decides otherwise."""
    case = case_by_id(case_id)
    requests = case.requests()
    reference = drive(VllmSide, case.config, requests)
    assert coverage(reference)["preemptions"] > 0 or "idle" in case_id
    for rule in rules:
        assert not compare(reference, drive(rule, case.config, requests)).identical, rule


class _AlignedChunks(_SessionPaths):
    """vLLM's scheduler, counting what its steps do beside aligned Mamba (and its session
    paths): prompt chunks cut mid-block (before an image), and prompt chunks that realign
    from mid-block (where an image cut the last, or a session's later input begins) at the
    next boundary."""

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out, summary = super().schedule(throttle)
        sched, counts = self.scheduler, self._counts
        block_size = sched.block_size
        cached = out.scheduled_cached_reqs
        starts = {
            **dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True)),
            **{r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs},
        }
        for rid, n in out.num_scheduled_tokens.items():
            start = starts[rid]
            end = start + n
            if end < sched.requests[rid].num_prompt_tokens:
                counts["cut_mid_block"] += end % block_size != 0
                counts["realigned"] += start % block_size != 0 and end % block_size == 0
        return out, summary


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [
        (
            "synthetic-conv/edge-mm-mamba-1m-sync-apc-c0-fcfs-enc40-cache72-kv",
            ("cut_mid_block", "realigned"),
        ),
        (
            "synthetic-conv/edge-mm-mamba-1m-async-apc-c1-prio-enc36-cache36-kv",
            ("cut_mid_block", "realigned"),
        ),
        (
            "synthetic-chat/edge-sessions-mamba-1m-sync-apc-fcfs-kv",
            ("realigned", "stop_taken", "taken_while_waiting", "sessions_preempted"),
        ),
        (
            "synthetic-chat/edge-sessions-mamba-1m-sync-apc-prio-kv",
            ("realigned", "stop_taken"),
        ),
    ],
)
def test_the_aligned_mamba_cases_reach_their_rules(case_id: str, expected: tuple[str, ...]) -> None:
    """Beside aligned Mamba, encoder budgets cut prompt chunks mid-block and the next chunk
    realigns; sessions take up inputs that begin mid-block and realign, and are preempted."""
    case = case_by_id(case_id)
    counts: collections.Counter[str] = collections.Counter()
    drive(functools.partial(_AlignedChunks, counts=counts), case.config, case.requests())
    assert all(counts[key] > 0 for key in expected), dict(counts)


def test_the_shuffled_blocks_hold_the_same_tokens_under_other_prefixes() -> None:
    """The ``shuffled-blocks`` workload has what makes a prefix hit depend on the parent
    chain: full blocks with the same tokens under different prefixes (in one prompt and
    across prompts), and prefix hits as well."""
    case = case_by_id("shuffled-blocks/edge-shuffled-sync-K0-apc-fcfs")
    size = case.config.block_size
    prefix_of: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for req in case.requests():
        for start in range(0, req.prompt_len - size + 1, size):
            tokens = req.prompt[start : start + size]
            prefix_of.setdefault(tokens, set()).add(req.prompt[:start])
    assert sum(len(prefixes) > 1 for prefixes in prefix_of.values()) >= 3
    assert coverage(drive(VllmSide, case.config, case.requests()))["prefix_hit_admissions"] > 0


def test_the_matrix_and_the_fuzz_keep_out_of_the_deviations() -> None:
    """No compared case reaches a deviation the harness does not compare (``run_case``
    refuses one too): every config is one llmsched accepts, no threshold in ``(0, 1 + K)``,
    no request that could outgrow the pool (vLLM preempts it forever), no tied priority
    keys."""
    for case in CASES:
        if missing_trace(case.workload):
            continue  # not compared here either (case_params skips it)
        assert deviation_triggers(case.config, case.requests()) == [], case.id
    for seed in range(2000):
        config, requests = make_case(seed)  # asserts it too
        assert deviation_triggers(config, requests) == [], seed


def test_the_report_names_every_deviation_test() -> None:
    """docs/parity.md's "Deliberate deviations" section (``report.DEVIATIONS_MD``) names
    the tests below and the plug-in's (``test_plugin_*.py``), and only tests that exist."""
    named = set(re.findall(r"`(test_deviation_\w+)`", DEVIATIONS_MD))
    defined = {name for name in globals() if name.startswith("test_deviation_")}
    for module in Path(__file__).parent.glob("test_plugin*.py"):
        defined.update(re.findall(r"^def (test_deviation_\w+)", module.read_text(), re.M))
    assert named == defined


# Deliberate deviations (README, "Where llmsched deliberately differs from vLLM 0.33.0").
# The matrix never reaches them (or, for the uncaching of an undone step, emulates it on
# vLLM's side); these tests pin each one down where it applies: identical up to the point
# of the deviation, then exactly the documented difference.


def test_deviation_54028_no_padding_that_the_threshold_would_clip() -> None:
    """``0 < long_prefill_token_threshold < 1 + K`` (open vLLM PR #54028): vLLM pads a
    one-token admission to ``1 + K``, the threshold clips it, and vLLM's
    ``assert num_new_tokens == 1 + self.num_spec_tokens`` fails; llmsched does not pad."""
    config = ParityConfig(
        "deviation-54028",
        async_scheduling=False,
        num_speculative_tokens=3,
        enable_prefix_caching=True,
        policy="fcfs",
        num_gpu_blocks=256,
        max_model_len=512,
        long_prefill_token_threshold=2,
    )
    requests = [
        ParityRequest("a", tuple(range(10, 60)), 20, arrival_step=0, arrival_time=0.0),
        ParityRequest("b", (11,), 5, arrival_step=3, arrival_time=1.0),  # 1 token: padded
    ]
    assert deviation_triggers(config, requests) == [
        "#54028: 0 < long_prefill_token_threshold = 2 < 1 + K = 4"
    ]
    with pytest.raises(ValueError, match="#54028"):
        run_case(config, requests)
    comparison, vllm_run, llmsched_run = run_case(config, requests, allow_deviations=True)
    assert comparison.vllm_error is not None
    assert comparison.vllm_error.startswith("AssertionError")
    assert comparison.llmsched_error is None
    step = comparison.first_difference
    assert step == len(vllm_run.steps) == comparison.steps_identical  # identical until then
    admitted = llmsched_run.steps[step]
    assert ("b", 1) in admitted["scheduled"] and "b" not in admitted["spec_tokens"]


def test_deviation_nonpositive_count_is_never_scheduled() -> None:
    """llmsched's running loop skips a count ``n <= 0``; the README says vLLM skips only
    ``n == 0``. A negative count needs ``C > M - s``, which neither scheduler lets happen
    (both keep ``C + n + s <= M``), so no input reaches it; and vLLM 0.33.0 clamps the
    count at zero anyway (``Scheduler._reserve_prefill_lookahead`` returns ``max(n, 0)``
    just before its ``n == 0`` skip). So there is no observable difference: at ``M`` both
    skip the zero count alike, and a vLLM request forced past ``M - s`` by hand (no public
    input can do that to llmsched) is skipped, not scheduled with a negative count
    (without the clamp, vLLM would schedule it with ``n = -11``)."""
    config = ParityConfig(
        "deviation-nonpositive", True, 0, False, "fcfs", num_gpu_blocks=64, max_model_len=32
    )
    request = ParityRequest("a", tuple(range(10, 30)), 100, arrival_step=0, arrival_time=0.0)
    comparison, vllm_run, _ = run_case(config, [request])
    assert comparison.identical, describe(comparison)
    # Async: with the step in flight ending at M - s, the next step's count is
    # M - C - s = 0: skipped though the request still runs, identically on both sides.
    zero = [s for s in vllm_run.steps if s["request_counts"] == (1, 0) and not s["scheduled"]]
    assert zero, [s["scheduled"] for s in vllm_run.steps]
    finished = [o for s in vllm_run.steps for o in s["outputs"] if o[2] is not None]
    assert [(rid, reason) for rid, _, reason, _ in finished] == [("a", "length")]

    side = VllmSide(dataclasses.replace(config, async_scheduling=False))
    side.add(request)
    out, prefill = side.schedule()
    side.update(out, prefill, {"a": [100]})
    vllm_request = side.scheduler.requests["a"]
    vllm_request.num_computed_tokens = config.max_model_len  # C > M - s: n = 21 - 32 < 0
    _, forced = side.schedule()
    assert forced["scheduled"] == [] and forced["total_num_scheduled_tokens"] == 0
    assert forced["request_counts"] == (1, 0)


def test_deviation_empty_decode_output_is_undone() -> None:
    """A decode step whose output has no token: vLLM leaves ``num_computed_tokens`` one
    ahead of the tokens, so the request is never scheduled again; llmsched undoes the
    step's positions and samples again."""
    config = ParityConfig(
        "deviation-empty-decode", False, 0, False, "fcfs", num_gpu_blocks=64, max_model_len=256
    )
    request = ParityRequest("a", tuple(range(10, 30)), 8, arrival_step=0, arrival_time=0.0)
    scheduled = {}
    for side in (VllmSide(config), LlmschedSide(config)):
        side.add(request)
        out, prefill = side.schedule()
        side.update(out, prefill, {"a": [100]})
        out, decode = side.schedule()
        side.update(out, decode, {})  # the decode step returns no token
        _, after = side.schedule()
        scheduled[side.name] = [prefill["scheduled"], decode["scheduled"], after["scheduled"]]
    assert scheduled["vllm"][:2] == scheduled["llmsched"][:2] == [[("a", 20)], [("a", 1)]]
    assert scheduled["vllm"][2] == []
    assert scheduled["llmsched"][2] == [("a", 1)]


def _stopped_session(side: Any, max_tokens: int = 2) -> ParityRequest:
    """A session ``s`` of 20 prompt tokens added to ``side`` and run (sync) until its first
    input stops at ``max_tokens``, waiting for its next input."""
    session = ParityRequest(
        "s", tuple(range(10, 30)), max_tokens, arrival_step=0, arrival_time=0.0, resumable=True
    )
    side.add(session)
    for token in range(100, 100 + max_tokens):
        out, summary = side.schedule()
        side.update(out, summary, {"s": [token]})
    return session


def test_deviation_a_stopped_sessions_drafts_are_dropped() -> None:
    """Drafts proposed after a streaming-input session's input stopped (an engine's drafter
    proposes for every request of the batch): vLLM keeps them on the waiting session
    (``num_tokens_with_spec`` counts them) until the drafter's next proposal replaces them;
    llmsched drops them, as it drops any waiting request's (they follow a token the next
    input discards). The steps stay the same."""
    config = ParityConfig(
        "deviation-session-drafts", False, 2, False, "fcfs", num_gpu_blocks=64, max_model_len=256
    )
    kept, scheduled = {}, {}
    for side in (VllmSide(config), LlmschedSide(config)):
        session = _stopped_session(side)
        if isinstance(side, LlmschedSide):
            side.scheduler.update_draft_token_ids(["s"], [[7, 8]])
            kept[side.name] = list(side.scheduler.get_request("s").spec_token_ids)
        else:
            side.update_draft_token_ids(["s"], [[7, 8]])
            kept[side.name] = list(side.scheduler.requests["s"].spec_token_ids)
        side.add_input(session, SessionInput(5, (40, 41, 42), 2, 1.0))
        _, summary = side.schedule()
        scheduled[side.name] = (summary["scheduled"], summary["spec_tokens"])
    assert kept == {"vllm": [7, 8], "llmsched": []}
    assert scheduled["vllm"] == scheduled["llmsched"] == ([("s", 3)], {})


def test_deviation_a_session_input_past_the_model_length_is_refused() -> None:
    """A streaming-input session's next input that brings it past ``max_model_len - 1``
    tokens: vLLM takes it and schedules the whole input, positions past ``max_model_len``
    (``C + n + s <= M`` broken: a runner has no such position); llmsched refuses the input
    (``InvalidRequestError`` naming the prompt), the session unchanged (an input queued
    behind a running one that would not fit ends the session at its stop)."""
    import llmsched

    config = ParityConfig(
        "deviation-session-length", False, 0, False, "fcfs", num_gpu_blocks=64, max_model_len=64
    )
    too_long = SessionInput(5, tuple(range(200, 250)), 2, 1.0)
    vllm_side = VllmSide(config)
    session = _stopped_session(vllm_side)
    vllm_side.add_input(session, too_long)
    _, summary = vllm_side.schedule()
    assert summary["scheduled"] == [("s", 50)]
    assert summary["num_computed_tokens"]["s"] + 50 + 1 > config.max_model_len

    ours = LlmschedSide(config)
    _stopped_session(ours)
    before = ours.scheduler.get_request("s")
    with pytest.raises(llmsched.InvalidRequestError, match="prompt_token_ids"):
        ours.add_input(session, too_long)
    after = ours.scheduler.get_request("s")
    assert (after.status, after.num_tokens) == (before.status, before.num_tokens)


def test_deviation_a_request_wedged_behind_waiting_kv_holders_runs() -> None:
    """Two streaming-input sessions keep 5 of 13 usable blocks each and take up their next
    inputs: the first's needs 5 more blocks, the second's one; nothing runs. vLLM's waiting
    loop stops at the first every step and never reaches the second, the only request that
    could free blocks: nothing is ever scheduled again. llmsched passes the first over and
    the second runs."""
    config = ParityConfig(
        "deviation-wedge",
        False,
        0,
        False,
        "fcfs",
        num_gpu_blocks=14,
        block_size=4,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=2,
        enable_chunked_prefill=False,
    )
    first, second = (
        ParityRequest(rid, tuple(range(10 + k, 30 + k)), 1, 0, float(k), resumable=True)
        for k, rid in enumerate(("a", "b"))
    )
    scheduled = {}
    for side in (VllmSide(config), LlmschedSide(config)):
        side.add(first)
        side.add(second)
        out, summary = side.schedule()
        side.update(out, summary, {"a": [100], "b": [101]})
        side.add_input(first, SessionInput(1, tuple(range(200, 220)), 1, 2.0))
        side.add_input(second, SessionInput(1, (300, 301, 302), 1, 3.0))
        scheduled[side.name] = [side.schedule()[1]["scheduled"] for _ in range(3)]
    assert scheduled["vllm"] == [[], [], []]
    assert scheduled["llmsched"][0] == [("b", 3)]


def test_deviation_a_request_that_outgrows_the_pool_stops_length_capped() -> None:
    """A pool of 2 usable blocks of 16 (vLLM's engine refuses a pool smaller than
    ``max_model_len``; vLLM's scheduler accepts one) and a 20-token prompt with 100 tokens
    to come: the two schedule identically while its KV fits; then vLLM preempts it (the
    only request) to make room for it, and never schedules it again (it waits for blocks
    the pool does not have); llmsched stops it where the pool is full, length-capped at the
    longest request the pool holds (33 tokens)."""
    config = ParityConfig("deviation-pool", False, 0, False, "fcfs", num_gpu_blocks=3)
    request = ParityRequest("big", tuple(range(10, 30)), 100, arrival_step=0, arrival_time=0.0)
    assert deviation_triggers(config, [request]) == [
        "big could outgrow the pool: 8 blocks > 2 usable"
    ]
    comparison, vllm_run, llmsched_run = run_case(config, [request], allow_deviations=True)
    assert comparison.llmsched_error is None
    assert comparison.vllm_error is not None and "no end" in comparison.vllm_error
    # The step that fills the pool: the same tokens scheduled, llmsched's output stops.
    step = comparison.first_difference
    assert step is not None and comparison.steps_identical == step
    assert vllm_run.steps[step]["scheduled"] == llmsched_run.steps[step]["scheduled"]
    assert vllm_run.steps[step]["outputs"][0][2] is None
    assert llmsched_run.steps[step]["outputs"][0][2] == "length"
    assert vllm_run.steps[step + 1]["preempted"] == ["big"]
    assert len(vllm_run.steps) > step + 100
    assert not any(s["scheduled"] for s in vllm_run.steps[step + 1 :])
    assert not any(s["preempted"] for s in llmsched_run.steps)
    outputs = [tokens for s in llmsched_run.steps for _, tokens, _, _ in s["outputs"]]
    assert sum(map(len, outputs)) == 33 - 20
    assert llmsched_run.steps[step + 1]["finished"] == ["big"]


def test_deviation_requests_whose_async_load_could_never_start_are_refused() -> None:
    """With a KV connector and speculative decoding, an asynchronous load must leave a
    speculative step's blocks free beside the loaded ones; vLLM accepts a request whose load
    cannot have both even in an empty pool, and its load never starts (the waiting queue
    blocks behind it); llmsched's ``add_request`` refuses it: the longest request the pool
    holds is one whose load leaves that room (16 tokens here: one of its 2 usable blocks of
    16 for the load, one for the step), a prompt of 15 tokens at most."""
    from benches.parity.connector import loads_async

    from llmsched import InvalidRequestError

    config = ParityConfig(
        "deviation-pool-load",
        False,
        3,
        False,
        "fcfs",
        num_gpu_blocks=3,
        kv_connector=True,
        kv_connector_async_loads=True,
    )
    prompt = (10, *range(100, 119))
    assert loads_async(prompt)
    request = ParityRequest("loaded", prompt, 4, arrival_step=0, arrival_time=0.0)
    assert blocks_needed(request, config) <= config.num_gpu_blocks - 1
    assert deviation_triggers(config, [request]) == [
        "loaded's KV load could never start: 3 blocks > 2"
    ]
    vllm_side = VllmSide(config)
    vllm_side.add(request)
    for _ in range(10):
        out, summary = vllm_side.schedule()
        assert summary["scheduled"] == [] and summary["kv_loads"] == []
        vllm_side.update(out, summary, {})
    assert vllm_side.has_requests()
    with pytest.raises(InvalidRequestError, match=r"<20 tokens>: at most 15 tokens"):
        LlmschedSide(config).add(request)


def _refused_configs() -> list[tuple[ParityConfig, str, list[ParityRequest]]]:
    """Budgets llmsched refuses, the field its ``ConfigError`` names, and requests of which
    vLLM then never schedules the last."""
    prompt = tuple(range(10, 19))
    return [
        # A one-token admission after a prefix hit (8 of its 9 tokens, computed for
        # "first") is padded to 1 + K = 4 tokens, more than the budget of 3.
        (
            ParityConfig(
                "refused-padded-decode",
                async_scheduling=False,
                num_speculative_tokens=3,
                enable_prefix_caching=True,
                policy="fcfs",
                num_gpu_blocks=64,
                max_model_len=64,
                max_num_seqs=2,
                max_num_batched_tokens=3,
                block_size=4,
            ),
            "num_speculative_tokens",
            [
                ParityRequest("first", prompt[:8], 2, arrival_step=0, arrival_time=0.0),
                ParityRequest("again", prompt, 4, arrival_step=12, arrival_time=1.0),
            ],
        ),
        # Chunked prefill off: a 40-token prompt never fits 32 scheduled tokens.
        (
            ParityConfig(
                "refused-unchunked-prompt",
                async_scheduling=False,
                num_speculative_tokens=0,
                enable_prefix_caching=True,
                policy="fcfs",
                num_gpu_blocks=64,
                max_model_len=64,
                max_num_seqs=2,
                max_num_batched_tokens=64,
                max_num_scheduled_tokens=32,
                enable_chunked_prefill=False,
            ),
            "max_num_scheduled_tokens",
            [ParityRequest("long", tuple(range(10, 50)), 4, arrival_step=0, arrival_time=0.0)],
        ),
    ]


@pytest.mark.parametrize(
    ("config", "field", "requests"), _refused_configs(), ids=lambda v: getattr(v, "name", "")
)
def test_deviation_budgets_below_an_unsplittable_step_are_refused(
    config: ParityConfig,
    field: str,
    requests: list[ParityRequest],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget below a padded decode (``1 + K``) or, with chunked prefill off, below the
    longest request: llmsched's ``SchedulerConfig`` refuses it with a ``ConfigError`` that
    names the field; vLLM accepts it, and a request that needs that step waits forever."""
    import llmsched

    with pytest.raises(llmsched.ConfigError, match=f"^{field}="):
        llmsched.SchedulerConfig(**config.llmsched_kwargs())
    assert (llmsched_refuses(config) or "").startswith(f"{field}=")
    assert deviation_triggers(config, requests) == [
        f"llmsched refuses the config: {llmsched_refuses(config)}"
    ]
    with pytest.raises(ValueError, match="llmsched refuses"):
        run_case(config, requests)

    blocked = requests[-1].request_id
    monkeypatch.setattr(harness, "MAX_LOOP_ITERATIONS", 200)
    run = drive(VllmSide, config, requests)
    assert run.error is not None and "no end after 200 loop iterations" in run.error
    assert not any(blocked in dict(step["scheduled"]) for step in run.steps)
    assert run.steps[-1]["request_counts"] == (0, 1)  # it waits, nothing runs


def test_deviation_an_image_no_step_takes_whole_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without chunked inputs, an image longer than the long-prefill threshold: while
    another request is eligible, every chunk that reaches the image is capped below it and
    rolled back to its start, so two such requests wait for each other forever in vLLM;
    llmsched refuses such a request at ``add_request``, naming the field."""
    import llmsched

    config = ParityConfig(
        "deviation-image-whole",
        async_scheduling=False,
        num_speculative_tokens=0,
        enable_prefix_caching=False,
        policy="fcfs",
        num_gpu_blocks=64,
        long_prefill_token_threshold=30,
        image_side=6,
        disable_chunked_mm_input=True,
    )
    requests = [
        ParityRequest(
            request_id=f"image-{i}",
            prompt=tuple([32000] * 36 + [5 + i] * 8),
            max_tokens=4,
            arrival_step=0,
            arrival_time=float(i),
            mm_inputs=((f"image-{i}", 0, 36),),
        )
        for i in range(2)
    ]
    found = deviation_triggers(config, requests)
    assert len(found) == 2 and all("which no step takes whole (30)" in line for line in found)

    side = LlmschedSide(config)
    for req in requests:
        with pytest.raises(llmsched.InvalidRequestError, match=r"mm_inputs\[0\]\.length=36"):
            side.add(req)
    assert not side.has_requests()

    monkeypatch.setattr(harness, "MAX_LOOP_ITERATIONS", 100)
    run = drive(VllmSide, config, requests)
    assert run.error is not None and "no end after 100 loop iterations" in run.error
    assert all(not step["scheduled"] for step in run.steps)
    assert run.steps[-1]["request_counts"] == (0, 2)


def _tie_wins(run: RunResult, requests: list[ParityRequest]) -> set[tuple[str, str]]:
    """``(winner, victim)`` for each preemption of a request while a request tied with it
    on ``(priority, arrival_time)`` kept running (scheduled by the same running loop)."""
    key = {r.request_id: (r.priority, r.arrival_time) for r in requests}
    wins: set[tuple[str, str]] = set()
    for step in run.steps:
        admitted = {*step["new"], *step["resumed"]}
        for rid, _ in step["scheduled"]:
            if rid not in admitted:
                wins.update((rid, v) for v in step["preempted"] if key[v] == key[rid])
    return wins


def test_deviation_tied_priority_victim() -> None:
    """Three running requests tied on ``(priority, arrival_time)``, a KV pool too small for
    all three. vLLM's victim is the first of them in running order, llmsched's the largest
    request id; steps are identical until then. Over the whole run vLLM's choices
    ping-pong (a request evicts the one that evicted it earlier, whose progress is lost),
    llmsched's never do: the victim of a tie is always the larger id."""
    config = ParityConfig(
        "deviation-tie",
        async_scheduling=False,
        num_speculative_tokens=0,
        enable_prefix_caching=False,
        policy="priority",
        num_gpu_blocks=7,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        block_size=4,
    )
    requests = [
        ParityRequest("a", tuple(range(100, 102)), 19, arrival_step=3, arrival_time=0.0),
        ParityRequest("b", tuple(range(200, 206)), 13, arrival_step=1, arrival_time=0.0),
        ParityRequest("c", tuple(range(300, 303)), 8, arrival_step=2, arrival_time=0.0),
    ]
    assert deviation_triggers(config, requests) == [
        "a and b tie on (priority, arrival_time) = (0, 0.0)",
        "a and c tie on (priority, arrival_time) = (0, 0.0)",
    ]
    with pytest.raises(ValueError, match="tie on"):
        run_case(config, requests)
    comparison, vllm_run, llmsched_run = run_case(config, requests, allow_deviations=True)
    assert comparison.vllm_error is None and comparison.llmsched_error is None

    step = comparison.first_difference
    assert step is not None and comparison.steps_identical >= step
    assert all(not s["preempted"] for s in vllm_run.steps[:step])
    running_order = [rid for rid, _ in vllm_run.steps[step - 1]["scheduled"]]
    assert running_order == ["b", "c", "a"]  # all running, all tied
    assert vllm_run.steps[step]["preempted"] == [running_order[0]]  # first in running order
    assert llmsched_run.steps[step]["preempted"] == [max(running_order)]  # largest id

    vllm_wins = _tie_wins(vllm_run, requests)
    assert ("a", "b") in vllm_wins and ("b", "a") in vllm_wins  # ping-pong
    llmsched_wins = _tie_wins(llmsched_run, requests)
    assert llmsched_wins and all(winner < victim for winner, victim in llmsched_wins)
    # Both finish every request (tokens identical, whatever the schedule).
    for run in (vllm_run, llmsched_run):
        outputs: dict[str, list[int]] = {}
        for s in run.steps:
            for rid, tokens, _, _ in s["outputs"]:
                outputs.setdefault(rid, []).extend(tokens)
        assert {rid: len(t) for rid, t in outputs.items()} == {"a": 19, "b": 13, "c": 8}


def test_deviation_undone_step_blocks_leave_the_prefix_cache() -> None:
    """A priority victim already scheduled in the step: vLLM as released leaves the blocks
    its allocation registered in the prefix cache, so a later request's prefix hit covers
    KV that no step computed; llmsched uncaches them, and so does the harness's emulation
    (``harness.UncacheUndoneSteps``), which makes the two identical again.

    ``v`` (priority 1) prefills 32 tokens in chunks (16, 8, 8; blocks of 4); ``x``
    (priority 0) decodes behind it. In step 2 ``v``'s last chunk gets two blocks, which
    vLLM registers right away, then ``x`` needs a block, none is free, and ``v`` is the
    victim: its step is undone. ``y`` later asks for the same 32-token prompt."""
    config = ParityConfig(
        "deviation-uncache",
        async_scheduling=False,
        num_speculative_tokens=0,
        enable_prefix_caching=True,
        policy="priority",
        num_gpu_blocks=10,
        max_model_len=64,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        block_size=4,
        long_prefill_token_threshold=8,
    )
    prompt = tuple(range(100, 132))
    requests = [
        ParityRequest("v", prompt, 1, arrival_step=0, arrival_time=0.0, priority=1),
        ParityRequest("x", tuple(range(500, 504)), 2, arrival_step=1, arrival_time=1.0),
        ParityRequest("y", prompt, 2, arrival_step=3, arrival_time=2.0),
    ]
    assert deviation_triggers(config, requests) == []

    # With the emulation (the harness's default): identical, and it uncached two blocks.
    comparison, patched_run, llmsched_run = run_case(config, requests)
    assert comparison.identical, describe(comparison)
    assert [s["uncached_blocks"] for s in patched_run.steps[:4]] == [0, 0, 2, 0]
    assert patched_run.steps[2]["preempted"] == ["v"]

    # vLLM as released: identical through the preemption, then y's prefix hit differs.
    plain_run = drive(functools.partial(VllmSide, emulate_uncache=False), config, requests)
    plain = compare(plain_run, llmsched_run)
    assert plain.first_difference == 3
    # Tokens of the prompt some step computed before y arrives: v's two chunks that ran.
    computed = max(
        s["num_computed_tokens"]["v"] + n
        for s in plain_run.steps[:3]
        for rid, n in s["scheduled"]
        if rid == "v"
    )
    assert computed == 24
    assert "y" in plain_run.steps[3]["new"]
    assert plain_run.steps[3]["num_computed_tokens"]["y"] == 28  # a hit on 4 uncomputed tokens
    assert llmsched_run.steps[3]["num_computed_tokens"]["y"] == 24


def test_deviation_drafts_for_requests_not_running() -> None:
    """Drafts given to a waiting request: vLLM keeps them and schedules them once the
    request runs (drafts for positions it has not reached), llmsched drops them. The
    harness never gives any (its llmsched side refuses to)."""
    config = ParityConfig(
        "deviation-drafts", False, 2, False, "fcfs", num_gpu_blocks=64, max_model_len=64
    )
    request = ParityRequest("a", tuple(range(10, 18)), 4, arrival_step=0, arrival_time=0.0)
    with pytest.raises(RunnerError, match="not running"):
        guarded = LlmschedSide(config)
        guarded.add(request)
        guarded.update_draft_token_ids(["a"], [[500, 501]])
    scheduled = {}
    vllm_side, llmsched_side = VllmSide(config), LlmschedSide(config)
    for side in (vllm_side, llmsched_side):
        side.add(request)
    vllm_side.update_draft_token_ids(["a"], [[500, 501]])
    llmsched_side.scheduler.update_draft_token_ids(["a"], [[500, 501]])  # past the guard
    for side in (vllm_side, llmsched_side):
        out, prefill = side.schedule()
        side.update(out, prefill, {"a": [77]})
        _, decode = side.schedule()
        scheduled[side.name] = [
            (prefill["scheduled"], prefill["spec_tokens"]),
            (decode["scheduled"], decode["spec_tokens"]),
        ]
    assert scheduled["vllm"][0] == scheduled["llmsched"][0] == ([("a", 8)], {})
    assert scheduled["vllm"][1] == ([("a", 3)], {"a": [500, 501]})
    assert scheduled["llmsched"][1] == ([("a", 1)], {})


def test_deviation_drafts_for_a_request_in_flight() -> None:
    """Synchronous scheduling, K = 1: drafts handed in for a request whose decode step is
    still in flight, then a second ``schedule()``. vLLM takes them and schedules a draft
    slot where the in-flight step's token belongs; once both outputs are applied it holds
    ``C = N - 2`` and its next step recomputes two tokens. llmsched refuses the drafts,
    naming the request, schedules nothing in the second step and keeps ``C = N - 1``."""
    import llmsched

    config = ParityConfig(
        "deviation-drafts-in-flight", False, 1, False, "fcfs", num_gpu_blocks=64, max_model_len=64
    )
    request = ParityRequest("a", tuple(range(10, 15)), 20, arrival_step=0, arrival_time=0.0)
    vllm_side, llmsched_side = VllmSide(config), LlmschedSide(config)
    decodes = {}
    for side in (vllm_side, llmsched_side):
        side.add(request)
        out, prefill = side.schedule()
        side.update(out, prefill, {"a": [77]})
        decodes[side.name] = side.schedule()
    assert decodes["vllm"][1]["scheduled"] == decodes["llmsched"][1]["scheduled"] == [("a", 1)]
    vllm_side.update_draft_token_ids(["a"], [[500]])
    with pytest.raises(llmsched.InvalidRequestError, match="step 2 is still in flight"):
        llmsched_side.update_draft_token_ids(["a"], [[500]])
    second = {side.name: side.schedule() for side in (vllm_side, llmsched_side)}
    assert second["vllm"][1]["scheduled"] == [("a", 1)]
    assert second["vllm"][1]["spec_tokens"] == {"a": [500]}
    assert second["llmsched"][1]["scheduled"] == []
    vllm_side.update(*decodes["vllm"], {"a": [78]})
    vllm_side.update(*second["vllm"], {"a": [79]})
    llmsched_side.update(*decodes["llmsched"], {"a": [78]})
    vllm_request = vllm_side.scheduler.requests["a"]
    assert (vllm_request.num_computed_tokens, vllm_request.num_tokens) == (6, 8)
    ours = llmsched_side.scheduler.get_request("a")
    assert (ours.num_computed_tokens, ours.num_tokens) == (6, 7)
    llmsched_side.scheduler.check_invariants()
    assert vllm_side.schedule()[1]["scheduled"] == [("a", 2)]
    assert llmsched_side.schedule()[1]["scheduled"] == [("a", 1)]


@pytest.mark.parametrize("seed", range(40))
def test_random_small_case(seed: int) -> None:
    """Odd small configs and workloads (``fuzz.make_case``); more seeds: ``python -m
    benches.parity.fuzz START COUNT``."""
    config, requests = make_case(seed)
    comparison, vllm_run, llmsched_run = run_case(config, requests)
    assert comparison.identical, f"seed {seed}: {config}\n" + describe(
        comparison, context=3, runs=(vllm_run, llmsched_run)
    )


def test_deviation_a_connector_answer_leaves_the_last_token_to_compute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A KV connector that says it holds a request's every token: vLLM's waiting loop takes
    the answer and trips its own assertion (no token left to schedule); llmsched clamps the
    answer to ``N - 1 - h`` tokens past the hit ``h``, and computes the last token, the one
    that samples."""
    from benches.parity import connector

    def every_token(
        prompt: Any, block_size: int, num_local: int, async_loads: bool = False
    ) -> tuple[int, bool]:
        return len(prompt) - num_local, False

    monkeypatch.setattr(connector, "matched_tokens", every_token)
    config = ParityConfig(
        "deviation-connector", False, 0, True, "fcfs", num_gpu_blocks=64, kv_connector=True
    )
    request = ParityRequest("a", tuple(range(10, 50)), 4, arrival_step=0, arrival_time=0.0)
    vllm_side = VllmSide(config)
    vllm_side.add(request)
    with pytest.raises(AssertionError):
        vllm_side.schedule()
    ours = LlmschedSide(config)
    ours.add(request)
    _, summary = ours.schedule()
    assert summary["scheduled"] == [("a", 1)]
    assert summary["num_computed_tokens"] == {"a": 39}
