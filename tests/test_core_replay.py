"""The core's replay (``llmsched._core.Replay``, behind ``llmsched simulate``) against its
checker: the same replay through the Python engine loop and the runner that asserts what
vLLM's asserts (``tests/reference_replay.py``). Every request's times, the timeline, the
step count and the scheduler's counters must agree, sync and async, with and without
speculative decoding, prefix caching and preemption."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.reference_replay import columns, reference_replay

from llmsched import InternalError, InvalidRequestError, SchedulerConfig
from llmsched._core import COST_TERMS, Replay, prompt_token_ids
from llmsched.sim._hashing import GOLDEN, finalize64
from llmsched.sim.cost import CostModel
from llmsched.sim.simulate import check_workload, simulate
from llmsched.sim.workload import RequestSpec, Workload, synthetic

# Every term non-zero, so that a term charged wrongly shows in the times.
COST = CostModel(
    fixed_ms=2.0,
    prefill_request_ms=0.3,
    new_request_ms=0.2,
    finished_request_ms=0.1,
    prefill_token_ms=0.01,
    prefill_attention_ms=1e-5,
    decode_request_ms=0.05,
    first_decode_ms=0.04,
    decode_context_ms=1e-4,
    kv_block_ms=0.002,
    add_request_ms=0.5,
    add_batch_ms=0.8,
    wake_ms=1.5,
    new_shape_ms=0.7,
    scheduler_step_ms=0.03,
    scheduler_request_ms=0.002,
    scheduler_token_ms=0.0001,
)


def workload(num_requests: int, seed: int, *, shared: bool) -> Workload:
    """Short requests at a busy rate; with ``shared``, Mooncake-style prefix blocks (the
    first of three common ones), so that prompts share cached blocks."""
    rng = np.random.default_rng(seed)
    requests = []
    arrival = 0.0
    for i in range(num_requests):
        arrival += float(rng.exponential(0.004))
        prompt = int(rng.integers(1, 1200))
        blocks = (int(rng.integers(0, 3)), 100 + i) if shared else ()
        requests.append(
            RequestSpec(f"r{i}", arrival, prompt, int(rng.integers(1, 40)), 7 * i + seed, blocks)
        )
    return Workload("test", requests, "test")


def config(**fields: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "block_size": 16,
        "num_gpu_blocks": 400,
    }
    return SchedulerConfig(**{**base, **fields})


def assert_replays_agree(
    cfg: SchedulerConfig,
    work: Workload,
    *,
    cost: CostModel = COST,
    acceptance_rate: float = 0.7,
    time_scale: float = 1.0,
    seed: int = 0,
) -> None:
    report = simulate(
        cfg, work, cost=cost, acceptance_rate=acceptance_rate, time_scale=time_scale, seed=seed
    )
    fitted = check_workload(cfg, work)
    ref = reference_replay(
        cfg, fitted, cost, acceptance_rate=acceptance_rate, time_scale=time_scale, seed=seed
    )
    expected = columns(ref)
    specs = sorted(fitted.requests, key=lambda r: r.arrival_time)
    assert [s.request_id for s in specs] == list(ref.times)
    replay = _replay(cfg, fitted, cost, acceptance_rate, time_scale, seed)
    got = replay.times()
    for name in ("scheduled", "first_token", "finished"):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    for name in ("num_output", "preemptions"):
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert got["finish_reason"] == list(expected["finish_reason"])
    assert replay.num_steps == ref.num_steps
    assert replay.stats() == ref.stats
    timeline = replay.timeline()
    for name in ("time", "kv_usage"):
        np.testing.assert_allclose(timeline[name], ref.timeline[name], rtol=1e-9, err_msg=name)
    for name in ("running", "waiting"):
        np.testing.assert_array_equal(timeline[name], ref.timeline[name], err_msg=name)
    # simulate's report is the replay's.
    assert report.num_steps == ref.num_steps
    assert report.num_finished == int(np.isfinite(expected["finished"]).sum())


def _replay(
    cfg: SchedulerConfig,
    fitted: Workload,
    cost: CostModel,
    acceptance_rate: float,
    time_scale: float,
    seed: int,
) -> Replay:
    from llmsched.sim.simulate import _replay_of

    specs = sorted(fitted.requests, key=lambda r: r.arrival_time)
    arrivals = np.array([s.arrival_time for s in specs]) * time_scale
    replay = _replay_of(cfg, cost, specs, arrivals, seed, acceptance_rate, True)
    assert replay.run(1e9)
    return replay


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("num_speculative_tokens", [0, 2])
@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_the_core_replays_as_the_python_engine_loop_does(
    async_scheduling: bool, num_speculative_tokens: int, enable_prefix_caching: bool
) -> None:
    cfg = config(
        async_scheduling=async_scheduling,
        num_speculative_tokens=num_speculative_tokens,
        enable_prefix_caching=enable_prefix_caching,
    )
    assert_replays_agree(cfg, workload(40, 1, shared=enable_prefix_caching))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_replays_agree_on_a_pooling_model(async_scheduling: bool) -> None:
    """``num_sampled_tokens_per_step=0``: requests sample nothing and finish once their
    prompt is computed."""
    cfg = config(async_scheduling=async_scheduling, num_sampled_tokens_per_step=0)
    assert_replays_agree(cfg, workload(20, 4, shared=True))


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_replays_agree_under_preemption(async_scheduling: bool) -> None:
    """A pool of 160 blocks for up to 8 requests of up to 1,240 tokens: requests are
    preempted and resumed."""
    cfg = config(async_scheduling=async_scheduling, num_gpu_blocks=160, num_speculative_tokens=1)
    work = workload(40, 2, shared=True)
    assert_replays_agree(cfg, work)
    assert simulate(cfg, work, cost=COST).num_preemptions > 0


def test_the_replays_agree_with_idle_gaps_and_the_default_cost() -> None:
    """Arrivals stretched 50 times: the engine waits idle between requests and wakes up."""
    assert_replays_agree(config(), workload(15, 3, shared=False), time_scale=50.0)
    assert_replays_agree(config(), workload(15, 3, shared=False), cost=CostModel())


@given(
    seed=st.integers(0, 2**32),
    acceptance_rate=st.sampled_from([0.0, 0.5, 1.0]),
    async_scheduling=st.booleans(),
    num_speculative_tokens=st.integers(0, 3),
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.sampled_from([64, 200, 512]),
    num_gpu_blocks=st.integers(90, 300),
    policy=st.sampled_from(["fcfs", "priority"]),
)
def test_the_replays_agree_on_random_settings(
    seed: int,
    acceptance_rate: float,
    async_scheduling: bool,
    num_speculative_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_gpu_blocks: int,
    policy: str,
) -> None:
    cfg = config(
        async_scheduling=async_scheduling,
        num_speculative_tokens=num_speculative_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_gpu_blocks=num_gpu_blocks,
        policy=policy,
        enable_prefix_caching=seed % 2 == 0,
    )
    work = workload(12, seed, shared=seed % 3 == 0)
    assert_replays_agree(cfg, work, acceptance_rate=acceptance_rate, seed=seed)


def test_the_default_workload_replays_as_the_python_loop_does() -> None:
    """``llmsched simulate``'s own default: 60 requests of its preset."""
    cfg = SchedulerConfig(
        max_model_len=16384, max_num_seqs=256, max_num_batched_tokens=8192, num_gpu_blocks=16384
    )
    assert_replays_agree(cfg, synthetic("azure-conv-chat", num_requests=60), cost=CostModel())


def test_prompts_are_the_workload_formula() -> None:
    """The core builds each prompt from its key and blocks: checked against the formula
    written out here (tokens ``finalize64(i + key * GOLDEN) % (V - 1) + 1``)."""

    def tokens(key: int, count: int, vocab: int) -> np.ndarray:
        base = np.uint64((key * int(GOLDEN)) % 2**64)
        return finalize64(np.arange(count, dtype=np.uint64) + base) % np.uint64(vocab - 1) + 1

    block_key = 0x4D6F_6F6E << 32
    own = prompt_token_ids(12345, 1000, [], 32000)
    np.testing.assert_array_equal(own, tokens(12345, 1000, 32000))
    mixed = prompt_token_ids(9, 1300, [3, 2**64 - 1], 50)
    expected = np.concatenate(
        [tokens(block_key + 3, 512, 50), tokens(block_key - 1, 512, 50), tokens(9, 276, 50)]
    )
    np.testing.assert_array_equal(mixed, expected)
    np.testing.assert_array_equal(prompt_token_ids(9, 700, [3, 4], 50)[:512], expected[:512])


def _columns(n: int) -> list[object]:
    return [
        [f"r{i}" for i in range(n)],
        [0.0] * n,
        [10] * n,
        [2] * n,
        list(range(n)),
        [0] * n,
        [],
    ]


def test_bad_replay_arguments_name_what_is_wrong() -> None:
    cost = dict(zip(COST_TERMS, [0.0] * len(COST_TERMS), strict=True))
    cfg = config()
    with pytest.raises(InvalidRequestError, match="cost: the term new_shape_ms is missing"):
        Replay(cfg, {k: v for k, v in cost.items() if k != "new_shape_ms"}, *_columns(2))
    with pytest.raises(InvalidRequestError, match=r"wake_ms.*-1.*>= 0"):
        Replay(cfg, {**cost, "wake_ms": -1.0}, *_columns(2))
    columns = _columns(2)
    columns[1] = [0.5, 0.1]
    with pytest.raises(InvalidRequestError, match=r'arrival_time.*"r1".*arrival order'):
        Replay(cfg, cost, *columns)
    columns = _columns(2)
    columns[2] = [10]
    with pytest.raises(InvalidRequestError, match="prompt_lens: 1 values for 2 requests"):
        Replay(cfg, cost, *columns)
    with pytest.raises(InvalidRequestError, match="acceptance_rate"):
        Replay(cfg, cost, *_columns(2), acceptance_rate=1.5)
    columns = _columns(2)
    columns[2] = [10, 2049]
    with pytest.raises(InvalidRequestError, match='prompt_len=2049: request "r1"'):
        Replay(cfg, cost, *columns)
    columns = _columns(2)
    columns[5] = [1, 1]
    with pytest.raises(InvalidRequestError, match="0 block ids, but num_prefix_blocks counts 2"):
        Replay(cfg, cost, *columns)
    with pytest.raises(InvalidRequestError, match="cost: must map each term"):
        Replay(cfg, [1.0] * len(COST_TERMS), *_columns(2))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="vocab_size=2147483648"):
        Replay(cfg, cost, *_columns(2), vocab_size=2**31)
    with pytest.raises(InvalidRequestError, match="warm_up_tokens=-1"):
        Replay(cfg, cost, *_columns(2), warm_up_tokens=-1)
    with pytest.raises(InvalidRequestError, match="vocab_size: must be in"):
        prompt_token_ids(1, 10, [], 2**31)
    replay = Replay(cfg, cost, *_columns(2))
    with pytest.raises(InvalidRequestError, match="seconds"):
        replay.run(-1.0)
    assert replay.run(10.0) and replay.done and replay.num_finished == 2


def test_a_request_refused_on_arrival_stops_the_replay_which_stays_stopped() -> None:
    """``simulate`` checks its workload first; a replay given a prompt longer than
    ``max_model_len`` raises the scheduler's error when the request arrives, and every
    later call says the replay cannot go on."""
    cost = dict(zip(COST_TERMS, [1.0] * len(COST_TERMS), strict=True))
    columns = _columns(2)
    columns[1] = [0.0, 5.0]
    columns[2] = [10, 2048]  # max_model_len: no room left for a sampled token
    replay = Replay(config(), cost, *columns)
    with pytest.raises(InvalidRequestError, match="2048") as refused:
        replay.run(10.0)
    assert "prompt" in str(refused.value)
    assert replay.num_arrived == 1 and replay.num_finished == 1
    with pytest.raises(InternalError, match="cannot go on"):
        replay.run(10.0)


def test_cost_terms_are_the_core_order() -> None:
    assert tuple(f for f in CostModel.__dataclass_fields__) == COST_TERMS
    assert replace(COST, wake_ms=2.0).wake_ms == 2.0
