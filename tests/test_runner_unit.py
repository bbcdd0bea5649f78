"""Unit tests of the simulated runner's numpy mechanics, the engine loop and the output
checks. Runner tests feed hand-built scheduler outputs (``StepOutput``), so that they can
also send what no correct scheduler sends (a negative count, a padded step past ``M``);
engine tests drive the compiled ``llmsched.Scheduler``, checking its invariants every step."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

from llmsched import (
    ConfigError,
    Engine,
    RequestStatus,
    SchedulerConfig,
    SchedulerOutput,
    SimulatedModelRunner,
)
from llmsched.sim.checks import check_scheduler_output

# ---------------------------------------------------------------------------- helpers


def runner_config(**overrides: Any) -> SchedulerConfig:
    """A small sync config for the runner tests: M=64, 4-token blocks, 8 sequences."""
    fields = {"max_model_len": 64, "block_size": 4, "max_num_seqs": 8, "async_scheduling": False}
    return SchedulerConfig(**{**fields, **overrides})


@dataclasses.dataclass(frozen=True)
class StepOutput:
    """A hand-built stand-in with the fields of ``llmsched.SchedulerOutput`` (_core.pyi)."""

    step_id: int
    req_ids: list[str]
    num_scheduled_tokens: np.ndarray
    num_computed_tokens: np.ndarray
    num_spec_tokens: np.ndarray
    spec_token_ids: np.ndarray
    num_output_tokens: np.ndarray
    num_block_ids: np.ndarray
    block_ids: np.ndarray
    num_all_token_ids: np.ndarray
    all_token_ids: np.ndarray
    lora_ids: np.ndarray
    structured_output_rows: np.ndarray
    pending_structured_output_tokens: bool
    drafts_unused: bool
    new_block_ids_to_zero: Any
    num_new_token_ids: Any
    new_token_ids: Any
    encoder_input_rows: Any
    encoder_input_ids: Any
    external_encoder_input_rows: Any
    external_encoder_input_ids: Any
    num_external_computed_tokens: Any
    freed_encoder_outputs: list[str]
    kv_loads: list[tuple[str, int, int]]
    total_num_scheduled_tokens: int
    new_req_ids: list[str]
    resumed_req_ids: list[str]
    rescheduled_req_ids: list[str]
    preempted_req_ids: list[str]
    finished_req_ids: list[str]

    def __len__(self) -> int:
        return len(self.req_ids)


_step_ids = itertools.count(1)


def i32(values: Any) -> np.ndarray:
    """A read-only 1-D int32 array, like the real output's."""
    array = np.asarray(values, dtype=np.int32).reshape(-1)
    array.flags.writeable = False
    return array


def make_so(*reqs: dict[str, Any], finished: tuple[str, ...] = ()) -> StepOutput:
    """One entry per scheduled request: id, n, C, and optionally spec (draft ids), blocks
    (new block ids), tokens (all_token_ids, for new/resumed), resumed (bool)."""
    admitted = [r for r in reqs if "tokens" in r]
    return StepOutput(
        step_id=next(_step_ids),
        req_ids=[r["id"] for r in reqs],
        num_scheduled_tokens=i32([r["n"] for r in reqs]),
        num_computed_tokens=i32([r["C"] for r in reqs]),
        num_spec_tokens=i32([len(r.get("spec", ())) for r in reqs]),
        spec_token_ids=i32([t for r in reqs for t in r.get("spec", ())]),
        num_output_tokens=i32([0 for _ in reqs]),
        num_block_ids=i32([len(r.get("blocks", ())) for r in reqs]),
        block_ids=i32([b for r in reqs for b in r.get("blocks", ())]),
        num_all_token_ids=i32([len(r.get("tokens", ())) for r in reqs]),
        all_token_ids=i32([t for r in reqs for t in r.get("tokens", ())]),
        lora_ids=i32([]),
        structured_output_rows=i32([]),
        pending_structured_output_tokens=False,
        drafts_unused=True,
        new_block_ids_to_zero=i32([]),
        num_new_token_ids=i32([]),
        new_token_ids=i32([]),
        encoder_input_rows=i32([]),
        encoder_input_ids=i32([]),
        external_encoder_input_rows=i32([]),
        external_encoder_input_ids=i32([]),
        num_external_computed_tokens=i32([]),
        freed_encoder_outputs=[],
        kv_loads=[],
        total_num_scheduled_tokens=sum(r["n"] for r in reqs),
        new_req_ids=[r["id"] for r in admitted if not r.get("resumed")],
        resumed_req_ids=[r["id"] for r in admitted if r.get("resumed")],
        rescheduled_req_ids=[],
        preempted_req_ids=[],
        finished_req_ids=list(finished),
    )


def rows_of(output: Any) -> list[list[int]]:
    ends = np.cumsum(output.num_sampled)
    starts = ends - output.num_sampled
    return [output.sampled_token_ids[a:b].tolist() for a, b in zip(starts, ends, strict=True)]


def test_hand_built_output_has_the_fields_of_the_real_one() -> None:
    """``StepOutput`` has exactly the public attributes of ``llmsched.SchedulerOutput``."""
    real = {name for name in dir(SchedulerOutput) if not name.startswith("_")}
    assert {field.name for field in dataclasses.fields(StepOutput)} == real


# ---------------------------------------------------------------------------- runner


def test_prefill_then_decode_expands_counts_like_vllm() -> None:
    """Positions, input ids and slot mapping of a prefill then a decode, as vLLM builds them."""
    runner = SimulatedModelRunner(runner_config(), seed=3)
    prompt = [11, 12, 13, 14, 15]
    so = make_so({"id": "a", "n": 5, "C": 0, "blocks": [7, 9], "tokens": prompt})
    out = runner.execute_model(so)
    assert out.req_ids is so.req_ids
    assert rows_of(out) == [[runner.target_token("a", 5)]]
    step = runner.last_step_inputs
    assert step is not None
    assert step.positions.tolist() == [0, 1, 2, 3, 4]
    assert step.input_ids.tolist() == prompt
    assert step.slot_mapping.tolist() == [28, 29, 30, 31, 36]  # block 7, then block 9
    assert (runner.num_tokens("a"), runner.num_computed_tokens("a")) == (6, 5)

    out = runner.execute_model(make_so({"id": "a", "n": 1, "C": 5}))
    assert runner.last_step_inputs.input_ids.tolist() == [runner.target_token("a", 5)]
    assert rows_of(out) == [[runner.target_token("a", 6)]]
    assert runner.token_ids("a") == prompt + [runner.target_token("a", i) for i in (5, 6)]


def test_negative_count_raises_numpys_repeat_error() -> None:
    """A count of -1 fails in ``np.repeat`` with numpy's own message, as in vLLM."""
    runner = SimulatedModelRunner(runner_config())
    runner.execute_model(
        make_so(
            {"id": "a", "n": 3, "C": 0, "blocks": [1], "tokens": [1, 2, 3]},
            {"id": "b", "n": 2, "C": 0, "blocks": [2], "tokens": [4, 5]},
        )
    )
    bad = make_so({"id": "a", "n": 1, "C": 3}, {"id": "b", "n": -1, "C": 2})
    with pytest.raises(ValueError, match=r"^repeats may not contain negative values\.$"):
        runner.execute_model(bad)


def test_sampled_tokens_past_max_model_len_raise_vllms_assertion() -> None:
    """Accepted drafts ending past ``M`` raise vLLM's assertion with its exact message."""
    # C=5, n=3 with two real drafts, M=8: C + n + s = 9, and both drafts are accepted.
    runner = SimulatedModelRunner(
        runner_config(max_model_len=8, num_speculative_tokens=2), acceptance_rate=1.0
    )
    runner.execute_model(make_so({"id": "a", "n": 5, "C": 0, "blocks": [1, 2], "tokens": [1] * 5}))
    _, flat, counts = runner.take_draft_token_ids()
    drafts = [flat.tolist()]
    assert counts.tolist() == [2]
    assert drafts == [[runner.target_token("a", 6), runner.target_token("a", 7)]]
    message = (
        "Sampled token IDs exceed the max model length. "
        "Total number of tokens: 9 > max_model_len: 8"
    )
    with pytest.raises(AssertionError) as info:
        runner.execute_model(make_so({"id": "a", "n": 3, "C": 5, "spec": drafts[0]}))
    assert str(info.value) == message


def test_non_final_prefill_chunk_returns_an_empty_row() -> None:
    """A prefill chunk that stops short of the prompt's end samples nothing."""
    runner = SimulatedModelRunner(runner_config())
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


def test_async_drafts_are_the_runners_own_and_accepted_deterministically() -> None:
    """Async: placeholder slots hold the runner's own drafts; rate 1 accepts all, 0 none."""
    config = runner_config(num_speculative_tokens=2, async_scheduling=True)
    for rate, expected_accepts in ((1.0, [2, 2]), (0.0, [0, 0])):
        runner = SimulatedModelRunner(config, seed=1, acceptance_rate=rate)
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


def test_async_mixed_acceptance_matches_the_drafts_the_runner_proposed() -> None:
    """Async at rate 0.5: each step accepts the leading drafts equal to T, reproducibly."""
    config = runner_config(max_model_len=256, num_speculative_tokens=3, async_scheduling=True)
    results = []
    for _ in range(2):  # same seed, same everything
        runner = SimulatedModelRunner(config, seed=7, acceptance_rate=0.5)
        runner.execute_model(
            make_so({"id": "r", "n": 2, "C": 0, "blocks": list(range(1, 40)), "tokens": [1, 2]})
        )
        accepted, c = [], 2
        for _ in range(20):
            base = runner.num_tokens("r")
            drafts = runner.tokens.proposals(
                runner.tokens.request_key("r"), np.arange(base, base + 3, dtype=np.int64)
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


def test_accept_padded_drafts_turns_a_padding_slot_into_a_real_draft() -> None:
    """Sync: padded slots are rejected, unless ``accept_padded_drafts`` makes them drafts."""
    config = runner_config(num_speculative_tokens=2)
    for accept_padded, expected in ((False, 1), (True, 3)):
        runner = SimulatedModelRunner(
            config, acceptance_rate=1.0, accept_padded_drafts=accept_padded
        )
        so = make_so(
            {"id": "p", "n": 3, "C": 4, "spec": [-1, -1], "blocks": [1, 2], "tokens": [9] * 5}
        )
        row = rows_of(runner.execute_model(so))[0]
        assert row == [runner.target_token("p", 5 + j) for j in range(expected)]
        assert runner.num_computed_tokens("p") == runner.num_tokens("p") - 1
        req_ids, flat, counts = runner.take_draft_token_ids()
        assert req_ids == ["p"] and counts.tolist() == [2]
        assert flat.tolist() == [runner.target_token("p", 5 + expected + j) for j in range(2)]
        assert runner.take_draft_token_ids() is None


def test_sync_real_drafts_stop_at_the_first_mismatch() -> None:
    """Sync: drafts are accepted up to the first one that differs from T, then T is sampled."""
    runner = SimulatedModelRunner(runner_config(num_speculative_tokens=3))
    runner.execute_model(
        make_so({"id": "a", "n": 3, "C": 0, "blocks": [1, 2], "tokens": [1, 2, 3]})
    )
    T = [runner.target_token("a", i) for i in range(3, 8)]
    wrong = (T[2] + 1) % runner.vocab_size
    out = runner.execute_model(make_so({"id": "a", "n": 4, "C": 3, "spec": [T[1], wrong, T[3]]}))
    assert rows_of(out) == [[T[1], T[2]]]  # one accepted draft, then the recovered token
    assert (runner.num_tokens("a"), runner.num_computed_tokens("a")) == (6, 5)


def test_targets_avoid_eos_unless_drawn() -> None:
    """T never hits EOS by chance, and hits it at about ``eos_probability`` when asked to."""
    config = runner_config()
    plain = SimulatedModelRunner(config, vocab_size=5, eos_token_id=2)
    tokens = {plain.target_token("x", i) for i in range(500)}
    assert tokens == {0, 1, 3, 4}
    eos = SimulatedModelRunner(config, eos_token_id=2, eos_probability=0.25)
    hits = sum(eos.target_token("x", i) == 2 for i in range(2000))
    assert 350 < hits < 650


def test_contract_violations_are_assertion_errors() -> None:
    """Null block, short block table, unknown request, C behind the truth: AssertionError."""
    runner = SimulatedModelRunner(runner_config(max_model_len=16))
    with pytest.raises(AssertionError, match="null block"):
        runner.execute_model(make_so({"id": "a", "n": 2, "C": 0, "blocks": [0], "tokens": [1, 2]}))
    runner = SimulatedModelRunner(runner_config(max_model_len=16))
    with pytest.raises(AssertionError, match="block table has 1 blocks"):
        runner.execute_model(make_so({"id": "a", "n": 5, "C": 0, "blocks": [1], "tokens": [1] * 5}))
    runner.execute_model(make_so({"id": "b", "n": 4, "C": 0, "blocks": [2], "tokens": [1] * 4}))
    with pytest.raises(AssertionError, match="no state"):
        runner.execute_model(make_so({"id": "zzz", "n": 1, "C": 0}))
    with pytest.raises(
        AssertionError, match="scheduler's num_computed_tokens 3 < the runner's true 4"
    ):
        runner.execute_model(make_so({"id": "b", "n": 1, "C": 3}))


def test_rows_are_recycled_and_grow_by_doubling() -> None:
    """Token rows double when full and finished requests give theirs back."""
    runner = SimulatedModelRunner(runner_config(max_num_seqs=2, max_model_len=8))
    ids = [f"r{i}" for i in range(5)]
    so = make_so(
        *({"id": r, "n": 2, "C": 0, "blocks": [i + 1], "tokens": [i, i]} for i, r in enumerate(ids))
    )
    out = runner.execute_model(so)
    assert runner.num_live_requests == 5 and runner.batch.tokens.shape == (8, 8)
    assert rows_of(out) == [[runner.target_token(r, 2)] for r in ids]
    assert [runner.token_ids(r)[:2] for r in ids] == [[i, i] for i in range(5)]
    out = runner.execute_model(make_so(finished=tuple(ids[:4])))
    assert len(out) == 0 and runner.num_live_requests == 1
    assert runner.token_ids("r4") == [4, 4, runner.target_token("r4", 2)]


# ------------------------------------------------------- the pre-#53962 symptoms, by hand

# Spec §3.5's worked example: M=32, K=1; "late" arrives with N=31 and C=30 = M-1-K while
# "filler" decodes. vLLM before #53962 padded it to n=1+K=2, leaving C=M. These outputs are
# written by hand: the compiled scheduler refuses to pad there (tests/test_seed_boundary.py).
LATE = {"id": "late", "n": 2, "C": 30, "spec": [-1], "blocks": [2, 3], "tokens": list(range(31))}


def _up_to_the_padded_step(
    async_scheduling: bool, **runner_kwargs: Any
) -> tuple[SimulatedModelRunner, StepOutput]:
    """Run filler's prefill and first decode; return the runner and the padded step."""
    config = runner_config(
        max_model_len=32, block_size=16, num_speculative_tokens=1, async_scheduling=async_scheduling
    )
    runner = SimulatedModelRunner(config, acceptance_rate=1.0, **runner_kwargs)

    def drafts() -> list[int]:  # sync: the drafts the runner proposed; async: a placeholder
        taken = runner.take_draft_token_ids()
        return [-1] if taken is None else taken[1].tolist()

    runner.execute_model(
        make_so({"id": "filler", "n": 4, "C": 0, "blocks": [1], "tokens": [1] * 4})
    )
    runner.execute_model(make_so({"id": "filler", "n": 2, "C": 4, "spec": drafts()}))
    padded = make_so({"id": "filler", "n": 2, "C": 6, "spec": drafts()}, LATE)
    with pytest.raises(AssertionError, match=r"'late': C=30, n=2, s=1, M=32"):
        check_scheduler_output(config, padded)
    return runner, padded


def test_pre_53962_padding_overruns_the_row_in_sync() -> None:
    """Sync, padded slot taken as a real draft: vLLM's "exceed the max model length" assertion."""
    runner, padded = _up_to_the_padded_step(False, accept_padded_drafts=True)
    with pytest.raises(AssertionError, match=r"Total number of tokens: 33 > max_model_len: 32$"):
        runner.execute_model(padded)
    runner, padded = _up_to_the_padded_step(False)  # padded slot rejected: the row just fills
    assert rows_of(runner.execute_model(padded))[1] == [runner.target_token("late", 31)]
    assert runner.num_tokens("late") == 32


def test_pre_53962_padding_sends_a_negative_count_in_async() -> None:
    """Async: the padded step fills the row, and the next step's n = M - C - s = -1 fails."""
    runner, padded = _up_to_the_padded_step(True)
    runner.execute_model(padded)
    assert runner.num_tokens("late") == 32
    # Scheduled before the padded step's output is applied, with C optimistic: C = 32.
    after = make_so(
        {"id": "filler", "n": 2, "C": 8, "spec": [-1]}, {"id": "late", "n": -1, "C": 32}
    )
    with pytest.raises(ValueError, match=r"^repeats may not contain negative values\.$"):
        runner.execute_model(after)


# ---------------------------------------------------------------------------- output checks


def test_check_scheduler_output_names_the_request_breaking_the_cap() -> None:
    """``check_scheduler_output`` names the request with C + n + s > M, or a bad padding."""
    config = runner_config(max_model_len=8)
    check_scheduler_output(config, make_so({"id": "a", "n": 1, "C": 6}))
    with pytest.raises(AssertionError, match=r"'a': C=7, n=1, s=1, M=8"):
        check_scheduler_output(config, make_so({"id": "a", "n": 1, "C": 7}))
    padded = runner_config(num_speculative_tokens=2)
    with pytest.raises(AssertionError, match="padded admission"):
        check_scheduler_output(
            padded,
            make_so({"id": "b", "n": 2, "C": 3, "spec": [-1], "blocks": [1], "tokens": [1] * 4}),
        )


# ---------------------------------------------------------------------------- engine


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("num_spec", [0, 2])
def test_engine_outputs_are_the_target_sequence(async_scheduling: bool, num_spec: int) -> None:
    """Every output is T in order, ending at EOS ("stop"), max_tokens or M ("length")."""
    config = SchedulerConfig(
        max_model_len=40,
        block_size=4,
        num_speculative_tokens=num_spec,
        async_scheduling=async_scheduling,
        max_num_seqs=4,
        max_num_batched_tokens=24,
    )
    runner = SimulatedModelRunner(
        config, seed=5, acceptance_rate=0.6, eos_token_id=0, eos_probability=0.03
    )
    step_ids: list[int] = []
    engine = Engine(
        config, runner, check_invariants=True, on_schedule=lambda so: step_ids.append(so.step_id)
    )
    prompts = {f"q{i}": list(range(1, 3 + 3 * i)) for i in range(8)}
    for req_id, prompt in prompts.items():
        engine.add_request(req_id, prompt, max_tokens=30, eos_token_id=0)
    results = engine.run(max_steps=10_000)
    assert not engine.has_unfinished_requests() and runner.num_live_requests == 0
    assert engine.last_applied_step_id == step_ids[-1]  # every scheduled step was applied
    for req_id, prompt in prompts.items():
        tokens = results[req_id].output_token_ids
        expected = [runner.target_token(req_id, len(prompt) + j) for j in range(len(tokens))]
        assert tokens == expected and results[req_id].finished
        assert 0 not in tokens[:-1]
        if tokens[-1] == 0:
            assert results[req_id].finish_reason == "stop"
        else:
            assert results[req_id].finish_reason == "length"
            assert len(tokens) == 30 or len(prompt) + len(tokens) == 40


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("num_spec", [0, 2])
def test_engine_under_kv_pressure_preempts_and_keeps_the_targets(
    async_scheduling: bool, num_spec: int
) -> None:
    """With too few KV blocks requests are preempted and resumed, and outputs are still T."""
    config = SchedulerConfig(
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
    assert engine.scheduler.stats()["num_preemptions"] > 0
    for req_id, prompt in prompts.items():
        tokens = results[req_id].output_token_ids
        assert tokens == [runner.target_token(req_id, len(prompt) + j) for j in range(len(tokens))]
        assert results[req_id].finished and 0 < len(tokens) <= 25


def test_engine_rejects_a_runner_with_another_max_model_len() -> None:
    """An engine and a runner that disagree on ``max_model_len`` are a ConfigError."""
    runner = SimulatedModelRunner(runner_config(max_model_len=32))
    with pytest.raises(ConfigError, match="max_model_len"):
        Engine(runner_config(max_model_len=64), runner)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_late_arrival_at_m_minus_1_minus_k_runs_to_the_length_cap(async_scheduling: bool) -> None:
    """The worked example above on the real scheduler: late gets n=1, one token, "length"."""
    config = SchedulerConfig(
        max_model_len=32, num_speculative_tokens=1, async_scheduling=async_scheduling
    )
    runner = SimulatedModelRunner(config, acceptance_rate=1.0, accept_padded_drafts=True)
    late_steps: list[tuple[int, int, int]] = []

    def log(so: SchedulerOutput) -> None:
        if "late" in so.req_ids:
            i = so.req_ids.index("late")
            c, n = int(so.num_computed_tokens[i]), int(so.num_scheduled_tokens[i])
            late_steps.append((c, n, int(so.num_spec_tokens[i])))

    engine = Engine(config, runner, check_invariants=True, on_schedule=log)
    engine.add_request("filler", [1] * 4, max_tokens=20)
    engine.step()
    engine.step()
    engine.add_request("late", LATE["tokens"], max_tokens=10, num_computed_tokens=30)
    results = engine.run(max_steps=1000)
    assert late_steps == [(30, 1, 0)]
    assert results["late"].output_token_ids == [runner.target_token("late", 31)]
    assert results["late"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert len(results["filler"].output_token_ids) == 20


def test_requests_sharing_the_only_block_finish_one_after_another() -> None:
    """One usable block of 16 tokens: "b" is scheduled only once "a" has finished."""
    scheduled: list[list[str]] = []
    engine = Engine(
        SchedulerConfig(max_model_len=64, num_gpu_blocks=2, max_num_seqs=2),
        check_invariants=True,
        on_schedule=lambda so: scheduled.append(so.req_ids),
    )
    engine.add_request("a", list(range(4)), max_tokens=12)
    engine.add_request("b", list(range(4)), max_tokens=12)
    results = engine.run(max_steps=1000)
    steps_of = {r: [i for i, ids in enumerate(scheduled) if r in ids] for r in "ab"}
    assert max(steps_of["a"]) < min(steps_of["b"])
    assert engine.scheduler.stats()["num_preemptions"] == 0
    assert [len(results[r].output_token_ids) for r in "ab"] == [12, 12]
    assert results["a"].finished and results["b"].finished
