"""Unit tests of the simulated runner's numpy mechanics, the engine loop and the output
checks, with no compiled extension: ``llmsched._core`` is replaced, for each test only, by
a stub module whose ``Scheduler`` is a tiny vLLM-like fake (FCFS, chunked prefill, sync
drafts or async placeholders, unlimited KV blocks, no preemption)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

# ---------------------------------------------------------------------------- the stub


@dataclasses.dataclass(frozen=True)
class FakeConfig:
    max_model_len: int = 64
    block_size: int = 4
    num_speculative_tokens: int = 0
    num_sampled_tokens_per_step: int = 1
    async_scheduling: bool = False
    max_num_seqs: int = 8
    max_num_scheduled_tokens: int = 64

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FakeSchedulerOutput:
    req_ids: list[str]
    num_scheduled_tokens: np.ndarray
    num_computed_tokens: np.ndarray
    num_spec_tokens: np.ndarray
    spec_token_ids: np.ndarray
    num_block_ids: np.ndarray
    block_ids: np.ndarray
    num_all_token_ids: np.ndarray
    all_token_ids: np.ndarray
    total_num_scheduled_tokens: int
    new_req_ids: list[str] = dataclasses.field(default_factory=list)
    resumed_req_ids: list[str] = dataclasses.field(default_factory=list)
    preempted_req_ids: list[str] = dataclasses.field(default_factory=list)
    finished_req_ids: list[str] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.req_ids)


def i32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.int32).reshape(-1)


def make_so(*reqs: dict[str, Any], finished: tuple[str, ...] = ()) -> FakeSchedulerOutput:
    """One entry per scheduled request: id, n, C, and optionally spec (draft ids), blocks
    (new block ids), tokens (all_token_ids, for new/resumed), resumed (bool)."""
    admitted = [r for r in reqs if "tokens" in r]
    return FakeSchedulerOutput(
        req_ids=[r["id"] for r in reqs],
        num_scheduled_tokens=i32([r["n"] for r in reqs]),
        num_computed_tokens=i32([r["C"] for r in reqs]),
        num_spec_tokens=i32([len(r.get("spec", ())) for r in reqs]),
        spec_token_ids=i32([t for r in reqs for t in r.get("spec", ())]),
        num_block_ids=i32([len(r.get("blocks", ())) for r in reqs]),
        block_ids=i32([b for r in reqs for b in r.get("blocks", ())]),
        num_all_token_ids=i32([len(r.get("tokens", ())) for r in reqs]),
        all_token_ids=i32([t for r in reqs for t in r.get("tokens", ())]),
        total_num_scheduled_tokens=sum(r["n"] for r in reqs),
        new_req_ids=[r["id"] for r in admitted if not r.get("resumed")],
        resumed_req_ids=[r["id"] for r in admitted if r.get("resumed")],
        finished_req_ids=list(finished),
    )


@dataclasses.dataclass
class FakeRequest:
    request_id: str
    tokens: list[int]
    num_prompt: int
    max_tokens: int
    eos_token_id: int | None
    C: int = 0
    P: int = 0
    F: int = 0
    spec: list[int] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    is_prefill_chunk: bool = False


@dataclasses.dataclass
class FakeRequestOutput:
    request_id: str
    new_token_ids: list[int]
    status: int
    finished: bool
    finish_reason: str | None = None
    stop_reason: int | None = None


class FakeScheduler:
    """The counting rules of spec §3.1, §3.3, §3.6 and §4.1-4.3 in miniature."""

    def __init__(self, config: FakeConfig, *, pre_53962_padding: bool = False) -> None:
        self.config = config
        self.pre_fix = pre_53962_padding  # the padding guard and n check before vLLM #53962
        self.requests: dict[str, FakeRequest] = {}
        self.running: list[FakeRequest] = []
        self.waiting: deque[FakeRequest] = deque()
        self.finished: list[str] = []
        self.next_block = 1

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        *,
        max_tokens: int,
        eos_token_id: int | None = None,
        num_computed_tokens: int = 0,
    ) -> None:
        prompt = list(prompt_token_ids)
        r = FakeRequest(request_id, prompt, len(prompt), max_tokens, eos_token_id)
        r.C = num_computed_tokens  # e.g. KV received from a prefill worker
        self.requests[request_id] = r
        self.waiting.append(r)

    def _alloc(self, r: FakeRequest, n: int) -> list[int]:
        cfg = self.config
        need = -(-min(r.C + n, cfg.max_model_len) // cfg.block_size) - len(r.blocks)
        new = list(range(self.next_block, self.next_block + max(need, 0)))
        self.next_block += len(new)
        r.blocks += new
        return new

    def schedule(self) -> FakeSchedulerOutput:
        cfg = self.config
        M, s, K = cfg.max_model_len, cfg.num_sampled_tokens_per_step, cfg.num_speculative_tokens
        budget = cfg.max_num_scheduled_tokens
        entries: list[dict[str, Any]] = []
        for r in self.running:
            if budget <= 0:
                break
            if r.P > 0 and r.num_prompt + r.max_tokens <= r.C + 2 - r.P:
                continue  # async: the in-flight step already reaches max_tokens
            n = min(len(r.tokens) + len(r.spec) + r.P - r.C, budget, M - r.C - s)
            if n == 0 or (n < 0 and not self.pre_fix):
                continue
            k = n + r.C - len(r.tokens) - r.P
            entry = {"r": r, "id": r.request_id, "n": n, "C": r.C, "blocks": self._alloc(r, n)}
            entry["spec"] = r.spec[:k] if k > 0 else []
            r.spec = []
            entries.append(entry)
            budget -= n
        prefill_scheduled = any(e["r"].is_prefill_chunk for e in entries)
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            r = self.waiting[0]
            n, spec = len(r.tokens) - r.C, []
            if K and s and n == 1 and not prefill_scheduled and (entries or r.C > 0):
                padded = 1 + K  # spec §3.5
                if r.C + padded + (0 if self.pre_fix else s) <= M:
                    if padded > budget:
                        break
                    n, spec = padded, [-1] * K
            n = min(n, budget)
            self.waiting.popleft()
            self._alloc(r, n)
            self.running.append(r)
            entries.append(
                {"r": r, "id": r.request_id, "n": n, "C": r.C, "blocks": list(r.blocks)}
                | {"tokens": list(r.tokens), "spec": spec}
            )
            budget -= n
        so = make_so(*entries, finished=tuple(self.finished))
        self.finished = []
        for e in entries:
            r = e["r"]
            r.C += e["n"]
            r.F += e["n"]
            r.is_prefill_chunk = len(r.tokens) + r.P > r.C
            if cfg.async_scheduling and not r.is_prefill_chunk:
                r.P += s + len(e.get("spec", ()))
                r.spec = [-1] * K
        return so

    def update_from_output(self, so: FakeSchedulerOutput, ro: Any) -> list[FakeRequestOutput]:
        M = self.config.max_model_len
        outputs = []
        ends = np.cumsum(ro.num_sampled)
        for i, req_id in enumerate(so.req_ids):
            gen = ro.sampled_token_ids[ends[i] - ro.num_sampled[i] : ends[i]].tolist()
            r = self.requests.get(req_id)
            if r is None:
                continue
            r.F -= int(so.num_scheduled_tokens[i])
            k = int(so.num_spec_tokens[i])
            if k and gen:
                rejected = k - (len(gen) - 1)
                r.C -= rejected
                if r.P > 0:
                    r.P -= rejected
            if not gen:
                continue
            original, stopped = len(gen), False
            for j, token in enumerate(gen, start=1):
                r.tokens.append(token)
                if (
                    token == r.eos_token_id
                    or len(r.tokens) >= M
                    or len(r.tokens) - r.num_prompt >= r.max_tokens
                ):
                    r.C -= original - j
                    gen, stopped = gen[:j], True
                    break
            if r.P > 0:
                r.P -= original
            assert r.P >= 0
            outputs.append(FakeRequestOutput(req_id, gen, 7 if stopped else 5, stopped))
            if stopped:
                del self.requests[req_id]
                self.running.remove(r)
                self.finished.append(req_id)
        return outputs

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        for req_id, ids in zip(req_ids, drafts, strict=True):
            r = self.requests.get(req_id)
            if r is not None:
                r.spec = [] if r.is_prefill_chunk else list(ids)

    def finish_requests(self, request_ids: Any, status: int) -> list[str]:
        done = []
        for req_id in [request_ids] if isinstance(request_ids, str) else list(request_ids):
            r = self.requests.pop(req_id, None)
            if r is not None:
                (self.running if r in self.running else self.waiting).remove(r)
                self.finished.append(req_id)
                done.append(req_id)
        return done

    def has_requests(self) -> bool:
        return bool(self.running or self.waiting or self.finished)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)

    def check_invariants(self) -> None:
        for r in self.running:
            assert r.P >= 0 and r.F >= 0 and 0 <= r.C <= self.config.max_model_len
            if r.F == 0 and not r.is_prefill_chunk:
                assert len(r.tokens) - 1 == r.C and r.P == 0


def _make_core_stub() -> types.ModuleType:
    core = types.ModuleType("llmsched._core")

    class LlmschedError(Exception):
        pass

    class ConfigError(LlmschedError, ValueError):
        pass

    class OutputMismatchError(LlmschedError, ValueError):
        pass

    core.__dict__.update(
        LlmschedError=LlmschedError,
        ConfigError=ConfigError,
        OutputMismatchError=OutputMismatchError,
        Scheduler=FakeScheduler,
        SchedulerConfig=FakeConfig,
        __version__="0+stub",
    )

    def __getattr__(name: str) -> type:  # any other name of _core.pyi: a placeholder type
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (), {})
        setattr(core, name, placeholder)
        return placeholder

    core.__getattr__ = __getattr__  # type: ignore[method-assign]
    return core


@pytest.fixture
def llm() -> Iterator[types.SimpleNamespace]:
    """Import llmsched's Python modules against the stub; restore sys.modules afterwards."""
    ours = [name for name in sys.modules if name == "llmsched" or name.startswith("llmsched.")]
    saved = {name: sys.modules.pop(name) for name in ours}
    sys.modules["llmsched._core"] = _make_core_stub()
    try:
        yield types.SimpleNamespace(
            core=sys.modules["llmsched._core"],
            runner=importlib.import_module("llmsched.runner"),
            engine=importlib.import_module("llmsched.engine"),
            testing=importlib.import_module("llmsched.testing"),
        )
    finally:
        for name in [n for n in sys.modules if n == "llmsched" or n.startswith("llmsched.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def rows_of(output: Any) -> list[list[int]]:
    ends = np.cumsum(output.num_sampled)
    starts = ends - output.num_sampled
    return [output.sampled_token_ids[a:b].tolist() for a, b in zip(starts, ends, strict=True)]


# ---------------------------------------------------------------------------- runner


def test_prefill_then_decode_expands_counts_like_vllm(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig(), seed=3)
    prompt = [11, 12, 13, 14, 15]
    so = make_so({"id": "a", "n": 5, "C": 0, "blocks": [7, 9], "tokens": prompt})
    out = runner.execute_model(so)
    assert out.req_ids is so.req_ids
    assert rows_of(out) == [[runner.target_token("a", 5)]]
    step = runner.last_step_inputs
    assert step.positions.tolist() == [0, 1, 2, 3, 4]
    assert step.input_ids.tolist() == prompt
    assert step.slot_mapping.tolist() == [28, 29, 30, 31, 36]  # block 7, then block 9
    assert (runner.num_tokens("a"), runner.num_computed_tokens("a")) == (6, 5)

    out = runner.execute_model(make_so({"id": "a", "n": 1, "C": 5}))
    assert runner.last_step_inputs.input_ids.tolist() == [runner.target_token("a", 5)]
    assert rows_of(out) == [[runner.target_token("a", 6)]]
    assert runner.token_ids("a") == prompt + [runner.target_token("a", i) for i in (5, 6)]


def test_negative_count_raises_numpys_repeat_error(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig())
    runner.execute_model(
        make_so(
            {"id": "a", "n": 3, "C": 0, "blocks": [1], "tokens": [1, 2, 3]},
            {"id": "b", "n": 2, "C": 0, "blocks": [2], "tokens": [4, 5]},
        )
    )
    bad = make_so({"id": "a", "n": 1, "C": 3}, {"id": "b", "n": -1, "C": 2})
    with pytest.raises(ValueError, match=r"^repeats may not contain negative values\.$"):
        runner.execute_model(bad)


def test_sampled_tokens_past_max_model_len_raise_vllms_assertion(llm: Any) -> None:
    # The pre-#53962 padding: C_new + 1 + K == M, and a runner whose padded slot holds a
    # real (accepted) draft writes one token past the row (spec Appendix C).
    config = FakeConfig(max_model_len=8, num_speculative_tokens=1)
    runner = llm.runner.SimulatedModelRunner(config, accept_padded_drafts=True, acceptance_rate=1.0)
    so = make_so(
        {"id": "a", "n": 2, "C": 6, "spec": [-1], "blocks": [1, 2], "tokens": list(range(7))}
    )
    message = (
        "Sampled token IDs exceed the max model length. "
        "Total number of tokens: 9 > max_model_len: 8"
    )
    with pytest.raises(AssertionError) as info:
        runner.execute_model(so)
    assert str(info.value) == message


def test_non_final_prefill_chunk_returns_an_empty_row(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig())
    prompt = list(range(100, 110))
    so = make_so(
        {"id": "a", "n": 4, "C": 0, "blocks": [1], "tokens": prompt},
        {"id": "b", "n": 2, "C": 0, "blocks": [2], "tokens": [1, 2]},
    )
    out = runner.execute_model(so)
    assert out.num_sampled.tolist() == [0, 1]
    assert rows_of(out) == [[], [runner.target_token("b", 2)]]
    assert (runner.num_tokens("a"), runner.num_computed_tokens("a")) == (10, 4)
    out = runner.execute_model(make_so({"id": "a", "n": 6, "C": 4, "blocks": [3, 4]}))
    assert rows_of(out) == [[runner.target_token("a", 10)]]
    assert runner.last_step_inputs.input_ids.tolist() == prompt[4:]


def test_async_drafts_are_the_runners_own_and_accepted_deterministically(llm: Any) -> None:
    config = FakeConfig(num_speculative_tokens=2, async_scheduling=True)
    for rate, expected_accepts in ((1.0, [2, 2]), (0.0, [0, 0])):
        runner = llm.runner.SimulatedModelRunner(config, seed=1, acceptance_rate=rate)
        T = [runner.target_token("a", i) for i in range(20)]
        out = runner.execute_model(
            make_so({"id": "a", "n": 4, "C": 0, "blocks": [1], "tokens": [5, 6, 7, 8]})
        )
        assert rows_of(out) == [[T[4]]]
        assert runner.take_draft_token_ids() is None  # async: drafts stay in the runner
        produced, optimistic_c = [T[4]], 4
        for accepts in expected_accepts:
            # The scheduler sends placeholders and an optimistic C (all drafts accepted).
            so = make_so({"id": "a", "n": 3, "C": optimistic_c, "spec": [-1, -1], "blocks": [2]})
            row = rows_of(runner.execute_model(so))[0]
            assert len(row) == accepts + 1
            produced += row
            optimistic_c += 3
        assert produced == T[4 : 4 + len(produced)]
        assert runner.num_computed_tokens("a") == runner.num_tokens("a") - 1


def test_async_mixed_acceptance_matches_the_drafts_the_runner_proposed(llm: Any) -> None:
    config = FakeConfig(max_model_len=256, num_speculative_tokens=3, async_scheduling=True)
    results = []
    for _ in range(2):  # same seed, same everything
        runner = llm.runner.SimulatedModelRunner(config, seed=7, acceptance_rate=0.5)
        runner.execute_model(
            make_so({"id": "r", "n": 2, "C": 0, "blocks": list(range(1, 40)), "tokens": [1, 2]})
        )
        accepted, c = [], 2
        for _ in range(20):
            base = runner.num_tokens("r")
            drafts = runner._proposals(
                runner._request_key("r"), np.arange(base, base + 3, dtype=np.int64)
            )
            targets = [runner.target_token("r", base + j) for j in range(3)]
            leading = next((j for j in range(3) if drafts[j] != targets[j]), 3)
            row = rows_of(
                runner.execute_model(make_so({"id": "r", "n": 4, "C": c, "spec": [-1] * 3}))
            )[0]
            assert row == [runner.target_token("r", base + j) for j in range(leading + 1)]
            accepted.append(leading)
            c += 4
        assert 0 < sum(accepted) < 60
        results.append(runner.token_ids("r"))
    assert results[0] == results[1]


def test_accept_padded_drafts_turns_a_padding_slot_into_a_real_draft(llm: Any) -> None:
    config = FakeConfig(num_speculative_tokens=2)  # sync
    for accept_padded, expected in ((False, 1), (True, 3)):
        runner = llm.runner.SimulatedModelRunner(
            config, acceptance_rate=1.0, accept_padded_drafts=accept_padded
        )
        so = make_so(
            {"id": "p", "n": 3, "C": 4, "spec": [-1, -1], "blocks": [1, 2], "tokens": [9] * 5}
        )
        row = rows_of(runner.execute_model(so))[0]
        assert row == [runner.target_token("p", 5 + j) for j in range(expected)]
        assert runner.num_computed_tokens("p") == runner.num_tokens("p") - 1
        req_ids, drafts = runner.take_draft_token_ids()
        assert req_ids == ["p"] and drafts == [
            [runner.target_token("p", 5 + expected + j) for j in range(2)]
        ]
        assert runner.take_draft_token_ids() is None


def test_sync_real_drafts_stop_at_the_first_mismatch(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig(num_speculative_tokens=3))
    runner.execute_model(
        make_so({"id": "a", "n": 3, "C": 0, "blocks": [1, 2], "tokens": [1, 2, 3]})
    )
    T = [runner.target_token("a", i) for i in range(3, 8)]
    wrong = (T[2] + 1) % runner.vocab_size
    out = runner.execute_model(make_so({"id": "a", "n": 4, "C": 3, "spec": [T[1], wrong, T[3]]}))
    assert rows_of(out) == [[T[1], T[2]]]  # one accepted draft, then the recovered token
    assert (runner.num_tokens("a"), runner.num_computed_tokens("a")) == (6, 5)


def test_targets_avoid_eos_unless_drawn(llm: Any) -> None:
    config = FakeConfig()
    plain = llm.runner.SimulatedModelRunner(config, vocab_size=5, eos_token_id=2)
    tokens = {plain.target_token("x", i) for i in range(500)}
    assert tokens == {0, 1, 3, 4}
    eos = llm.runner.SimulatedModelRunner(config, eos_token_id=2, eos_probability=0.25)
    hits = sum(eos.target_token("x", i) == 2 for i in range(2000))
    assert 350 < hits < 650


def test_contract_violations_are_assertion_errors(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig(max_model_len=16))
    with pytest.raises(AssertionError, match="null block"):
        runner.execute_model(make_so({"id": "a", "n": 2, "C": 0, "blocks": [0], "tokens": [1, 2]}))
    runner = llm.runner.SimulatedModelRunner(FakeConfig(max_model_len=16))
    with pytest.raises(AssertionError, match="block table has 1 blocks"):
        runner.execute_model(make_so({"id": "a", "n": 5, "C": 0, "blocks": [1], "tokens": [1] * 5}))
    runner.execute_model(make_so({"id": "b", "n": 4, "C": 0, "blocks": [2], "tokens": [1] * 4}))
    with pytest.raises(AssertionError, match="no state"):
        runner.execute_model(make_so({"id": "zzz", "n": 1, "C": 0}))
    with pytest.raises(
        AssertionError, match="scheduler's num_computed_tokens 3 < the runner's true 4"
    ):
        runner.execute_model(make_so({"id": "b", "n": 1, "C": 3}))


def test_rows_are_recycled_and_grow_by_doubling(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig(max_num_seqs=2, max_model_len=8))
    ids = [f"r{i}" for i in range(5)]
    so = make_so(
        *({"id": r, "n": 2, "C": 0, "blocks": [i + 1], "tokens": [i, i]} for i, r in enumerate(ids))
    )
    out = runner.execute_model(so)
    assert runner.num_live_requests == 5 and runner._tokens.shape == (8, 8)
    assert rows_of(out) == [[runner.target_token(r, 2)] for r in ids]
    assert [runner.token_ids(r)[:2] for r in ids] == [[i, i] for i in range(5)]
    out = runner.execute_model(make_so(finished=tuple(ids[:4])))
    assert len(out) == 0 and runner.num_live_requests == 1
    assert runner.token_ids("r4") == [4, 4, runner.target_token("r4", 2)]


# ---------------------------------------------------------------------------- engine


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_spec", [0, 2])
def test_engine_outputs_are_the_target_sequence(
    llm: Any, async_scheduling: bool, num_spec: int
) -> None:
    config = FakeConfig(
        max_model_len=40,
        num_speculative_tokens=num_spec,
        async_scheduling=async_scheduling,
        max_num_seqs=4,
        max_num_scheduled_tokens=24,
    )
    runner = llm.runner.SimulatedModelRunner(
        config, seed=5, acceptance_rate=0.6, eos_token_id=0, eos_probability=0.03
    )
    engine = llm.engine.Engine(config, runner, check_invariants=True)
    prompts = {f"q{i}": list(range(1, 3 + 3 * i)) for i in range(8)}
    for req_id, prompt in prompts.items():
        engine.add_request(req_id, prompt, max_tokens=30, eos_token_id=0)
    results = engine.run(max_steps=10_000)
    assert not engine.has_unfinished_requests() and runner.num_live_requests == 0
    for req_id, prompt in prompts.items():
        tokens = results[req_id].output_token_ids
        expected = [runner.target_token(req_id, len(prompt) + j) for j in range(len(tokens))]
        assert tokens == expected and results[req_id].finished
        stops = 0 in tokens or len(tokens) == 30 or len(prompt) + len(tokens) == 40
        assert stops and 0 not in tokens[:-1]


def test_engine_rejects_a_runner_with_another_max_model_len(llm: Any) -> None:
    runner = llm.runner.SimulatedModelRunner(FakeConfig(max_model_len=32))
    with pytest.raises(llm.core.ConfigError, match="max_model_len"):
        llm.engine.Engine(FakeConfig(max_model_len=64), runner)


def test_check_scheduler_output_names_the_request_breaking_the_cap(llm: Any) -> None:
    config = FakeConfig(max_model_len=8)
    llm.testing.check_scheduler_output(config, make_so({"id": "a", "n": 1, "C": 6}))
    with pytest.raises(AssertionError, match=r"'a': C=7, n=1, s=1, M=8"):
        llm.testing.check_scheduler_output(config, make_so({"id": "a", "n": 1, "C": 7}))
    padded = FakeConfig(num_speculative_tokens=2)
    with pytest.raises(AssertionError, match="padded admission"):
        llm.testing.check_scheduler_output(
            padded,
            make_so({"id": "b", "n": 2, "C": 3, "spec": [-1], "blocks": [1], "tokens": [1] * 4}),
        )


def _padding_example(llm: Any, *, async_scheduling: bool, pre_fix: bool, **kwargs: Any) -> Any:
    """Spec §3.5's worked example: M=32, K=1; a request with N=31 and C=30 arrives while a
    filler decodes. Before #53962 it is padded to n=2, which leaves C=M."""
    config = FakeConfig(
        max_model_len=32, num_speculative_tokens=1, async_scheduling=async_scheduling
    )
    runner = llm.runner.SimulatedModelRunner(config, acceptance_rate=1.0, **kwargs)
    engine = llm.engine.Engine(config, runner, check_invariants=kwargs.pop("check", False))
    engine.scheduler.pre_fix = pre_fix
    engine.add_request("filler", [1, 2, 3, 4], max_tokens=20)
    engine.step()
    engine.step()
    engine.add_request("late", list(range(31)), max_tokens=10, num_computed_tokens=30)
    return engine


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_fixed_padding_guard_runs_to_length_cap(llm: Any, async_scheduling: bool) -> None:
    engine = _padding_example(
        llm, async_scheduling=async_scheduling, pre_fix=False, accept_padded_drafts=True
    )
    results = engine.run(max_steps=1000)
    assert results["late"].output_token_ids == [engine.runner.target_token("late", 31)]


def test_pre_fix_padding_fails_like_vllm(llm: Any) -> None:
    engine = _padding_example(llm, async_scheduling=True, pre_fix=True)
    with pytest.raises(ValueError, match=r"^repeats may not contain negative values\.$"):
        engine.run(max_steps=1000)
    engine = _padding_example(llm, async_scheduling=False, pre_fix=True, accept_padded_drafts=True)
    with pytest.raises(AssertionError, match=r"Total number of tokens: 33 > max_model_len: 32$"):
        engine.run(max_steps=1000)
    engine = _padding_example(llm, async_scheduling=False, pre_fix=True)
    engine.run(max_steps=1000)  # sync, padding rejected: no overrun (spec §3.5)
    engine = _padding_example(llm, async_scheduling=True, pre_fix=True)
    engine._check = True
    with pytest.raises(AssertionError, match=r"'late': C=30, n=2, s=1, M=32"):
        engine.run(max_steps=1000)


# ---------------------------------------------------------------------------- the real core


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_spec", [0, 2])
def test_engine_with_the_compiled_scheduler(async_scheduling: bool, num_spec: int) -> None:
    """The same end-to-end check against llmsched._core, with KV pressure (preemptions)."""
    core = pytest.importorskip("llmsched._core")
    from llmsched.engine import Engine
    from llmsched.runner import SimulatedModelRunner

    config = core.SchedulerConfig(
        max_model_len=48,
        block_size=4,
        num_gpu_blocks=30,
        max_num_seqs=5,
        max_num_batched_tokens=32,
        num_speculative_tokens=num_spec,
        async_scheduling=async_scheduling,
    )
    runner = SimulatedModelRunner(config, seed=11, acceptance_rate=0.6, eos_token_id=0)
    engine = Engine(config, runner, check_invariants=True)
    prompts = {f"c{i}": [1 + i % 7] * (2 + 5 * i) for i in range(9)}
    for req_id, prompt in prompts.items():
        engine.add_request(req_id, prompt, max_tokens=25, eos_token_id=0)
    results = engine.run(max_steps=20_000)
    assert not engine.has_unfinished_requests() and runner.num_live_requests == 0
    for req_id, prompt in prompts.items():
        tokens = results[req_id].output_token_ids
        assert tokens == [runner.target_token(req_id, len(prompt) + j) for j in range(len(tokens))]
        assert results[req_id].finished and 0 < len(tokens) <= 25


def test_requests_sharing_the_only_block_finish_one_after_another() -> None:
    core = pytest.importorskip("llmsched._core")
    from llmsched.engine import Engine

    # One usable block of 16 tokens: "b" waits until "a" has finished and freed it.
    engine = Engine(core.SchedulerConfig(max_model_len=64, num_gpu_blocks=2, max_num_seqs=2))
    engine.add_request("a", list(range(4)), max_tokens=12)
    engine.add_request("b", list(range(4)), max_tokens=12)
    results = engine.run(max_steps=1000)
    assert results["a"].finished and results["b"].finished
