"""Workloads, the virtual-time simulator, and the ``llmsched`` command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from benches.parity.matrix import TRACES  # one setting for every suite: LLMSCHED_TRACES

from llmsched import SchedulerConfig
from llmsched.cli import main
from llmsched.sim.cost import TERMS, CostModel
from llmsched.sim.simulate import check_workload, simulate
from llmsched.sim.workload import (
    MOONCAKE_BLOCK_TOKENS,
    PRESETS,
    RequestSpec,
    Workload,
    WorkloadError,
    fit_to_max_model_len,
    load_azure_csv,
    load_mooncake_jsonl,
    load_workload,
    synthetic,
)

needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"the workplace's traces are not at {TRACES}"
)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_match_their_traces_published_medians(preset: str) -> None:
    fit = PRESETS[preset]
    workload = synthetic(preset, num_requests=20000, seed=3)
    prompts = np.array([r.prompt_len for r in workload.requests])
    outputs = np.array([r.output_len for r in workload.requests])
    assert abs(np.median(prompts) / fit.prompt.median - 1) < 0.05
    assert abs(np.median(outputs) / fit.output.median - 1) < 0.05
    assert prompts.max() <= fit.prompt.maximum and outputs.max() <= fit.output.maximum
    rate = len(workload.requests) / workload.duration
    assert abs(rate / fit.requests_per_second - 1) < 0.05


def test_prompts_are_deterministic_and_mooncake_blocks_are_shared() -> None:
    a = synthetic("azure-conv", num_requests=3, seed=1)
    b = synthetic("azure-conv", num_requests=3, seed=1)
    assert [r.prompt_token_ids().tolist() for r in a.requests] == [
        r.prompt_token_ids().tolist() for r in b.requests
    ]
    first = RequestSpec("x", 0.0, 1000, 1, key=1, prefix_blocks=(7, 8))
    second = RequestSpec("y", 0.0, 700, 1, key=2, prefix_blocks=(7, 9))
    x, y = first.prompt_token_ids(), second.prompt_token_ids()
    assert len(x) == 1000 and len(y) == 700
    assert (x[:MOONCAKE_BLOCK_TOKENS] == y[:MOONCAKE_BLOCK_TOKENS]).all()
    assert (x[MOONCAKE_BLOCK_TOKENS:700] != y[MOONCAKE_BLOCK_TOKENS:700]).any()
    assert x.dtype == np.int32 and x.min() >= 1


def test_fit_to_max_model_len_keeps_room_for_outputs() -> None:
    workload = Workload("w", [RequestSpec("a", 0.0, 5000, 3000, key=1)], "test")
    fitted = fit_to_max_model_len(workload, 4096)
    (spec,) = fitted.requests
    assert (spec.prompt_len, spec.output_len, fitted.truncated) == (1096, 3000, 1)


def test_simulation_reports_every_request_and_consistent_figures() -> None:
    config = SchedulerConfig(max_model_len=4096, max_num_seqs=32, num_gpu_blocks=600)
    workload = synthetic("azure-conv", num_requests=60, seed=2)
    report = simulate(config, workload, check_invariants=True, time_scale=0.2)
    assert report.num_finished == report.num_requests == 60
    expected = sum(min(r.output_len, 4095) for r in fit_to_max_model_len(workload, 4096).requests)
    assert report.output_tokens == expected
    lat = report.latency_seconds
    assert 0 < lat["ttft"]["p50"] <= lat["ttft"]["p90"] <= lat["ttft"]["p99"]
    assert lat["ttft"]["p50"] <= lat["e2e"]["p50"]
    assert all(v >= 0 for v in report.latencies["queue"])
    assert report.kv_usage["peak"] <= 1.0
    assert report.throughput["output_tokens_per_s"] > 0
    # Virtual time is the cost model's: no step is cheaper than its fixed cost.
    assert report.virtual_seconds >= report.num_steps * CostModel().fixed_ms / 1000 * 0.5
    json.loads(report.to_json())


def test_a_step_costs_its_kv_blocks_in_use_and_an_idle_engine_its_wake_up() -> None:
    """Only the KV blocks in use (1 ms each) and wake-ups (5 ms) charged: a request of a
    30-token prompt and 5 outputs, alone, holds the blocks its ``C + n`` tokens fill at each
    step (16-token blocks: 30, 31 and 32 tokens fill 2, then 33 and 34 fill 3): 12 ms, after
    a 5 ms wake-up. A second one arriving long after wakes the engine again; the first's
    blocks, back in the free queue, are not charged to it."""
    terms = dict.fromkeys(TERMS, 0.0) | {"kv_block_ms": 1.0, "wake_ms": 5.0}
    config = SchedulerConfig(max_model_len=256, block_size=16, num_gpu_blocks=64)
    requests = [RequestSpec("a", 0.0, 30, 5, key=1), RequestSpec("b", 10.0, 30, 5, key=2)]
    report = simulate(config, Workload("w", requests, "test"), cost=CostModel(**terms))
    e2e, ttft = report.latencies["e2e"], report.latencies["ttft"]
    assert e2e == pytest.approx([0.017, 0.017]) and ttft == pytest.approx([0.007, 0.007])
    assert report.virtual_seconds == pytest.approx(10.017)


def test_a_step_of_a_batch_shape_the_engine_has_not_run_costs_more() -> None:
    """Only 1 ms a step and 3 ms for a batch shape (requests, tokens scheduled) not run
    before: two requests of 30-token prompts and 3 outputs, together, prefill as (2, 60)
    and decode as (2, 2) twice: 4 + 4 + 1 ms. Two more like them later run shapes the
    engine has run: 3 ms. A request alone runs (1, 30) and (1, 1), shapes of the warm-up
    the engine is taken to have had: 3 ms too."""
    terms = dict.fromkeys(TERMS, 0.0) | {"fixed_ms": 1.0, "new_shape_ms": 3.0}
    config = SchedulerConfig(max_model_len=256, block_size=16, num_gpu_blocks=64)
    arrivals = [0.0, 0.0, 10.0, 10.0, 20.0]
    requests = [RequestSpec(f"r{i}", at, 30, 3, key=i + 1) for i, at in enumerate(arrivals)]
    report = simulate(config, Workload("w", requests, "test"), cost=CostModel(**terms))
    assert report.latencies["e2e"] == pytest.approx([0.009, 0.009, 0.003, 0.003, 0.003])
    assert report.latencies["ttft"] == pytest.approx([0.004, 0.004, 0.001, 0.001, 0.001])


def test_preemptions_are_reported_under_kv_pressure() -> None:
    config = SchedulerConfig(max_model_len=2048, max_num_seqs=64, num_gpu_blocks=300)
    report = simulate(config, synthetic("azure-conv", num_requests=80, seed=5), time_scale=0.01)
    assert report.num_finished == 80
    assert report.num_preemptions > 0
    assert report.kv_usage["peak"] > 0.9


def test_spec_decode_acceptance_is_reported() -> None:
    config = SchedulerConfig(max_model_len=4096, num_speculative_tokens=3, num_gpu_blocks=2000)
    report = simulate(config, synthetic("azure-code", num_requests=30), acceptance_rate=0.6)
    assert report.num_finished == 30
    assert 0.3 < report.spec_decode["acceptance_rate"] < 0.9


def test_cli_runs_the_embedded_default_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    assert main(["simulate", "--num-requests", "40", "--json", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    for heading in ("TTFT", "TPOT", "end-to-end", "preemptions", "prefix cache", "KV cache"):
        assert heading in printed
    report = json.loads(out.read_text())
    assert report["num_finished"] == 40
    assert report["config"]["max_model_len"] == 16384


def test_cli_rejects_a_bad_flag_value_with_the_field_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--num-requests", "5", "--max-num-seqs", "0", "--no-progress"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    assert main(["simulate", "no-such-workload"]) == 2


@needs_traces
def test_azure_trace_loads_with_relative_arrivals() -> None:
    workload = load_azure_csv(TRACES / "azure-llm-2023" / "conv.csv", limit=100)
    assert len(workload.requests) == 100
    assert workload.requests[0].arrival_time == 0.0
    arrivals = [r.arrival_time for r in workload.requests]
    assert arrivals == sorted(arrivals)
    assert (
        load_workload(str(TRACES / "azure-llm-2023" / "code.csv"), limit=5).requests[0].prompt_len
        > 0
    )


@needs_traces
def test_mooncake_replay_hits_the_prefix_cache() -> None:
    """Issue 3's replay, small enough for every test run: the first 150 conversation
    requests with every invariant checked; shared hash_ids must turn into cache hits."""
    workload = load_mooncake_jsonl(TRACES / "mooncake-fast25" / "conversation.jsonl", limit=150)
    shared = sum(1 for r in workload.requests if r.prefix_blocks and r.prefix_blocks[0] == 0)
    assert shared > 0
    config = SchedulerConfig(
        max_model_len=32768, max_num_seqs=64, max_num_batched_tokens=8192, num_gpu_blocks=20000
    )
    report = simulate(config, workload, check_invariants=True)
    assert report.num_finished == 150
    assert report.prefix_cache["hit_rate"] > 0.03
    assert math.isfinite(report.latency_seconds["ttft"]["p99"])
    print(
        f"\nMooncake, first 150 requests: prefix-cache hit rate "
        f"{report.prefix_cache['hit_rate']:.1%}, preemptions {report.num_preemptions}"
    )


# ------------------------------------------------------------------ bad input (library)


def test_trace_loaders_refuse_a_bad_row_with_a_value_error_naming_file_and_line(
    tmp_path: Path,
) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,5,-1\n")
    with pytest.raises(WorkloadError, match=r"t\.csv, line 2: GeneratedTokens='-1'"):
        load_azure_csv(csv_path)
    jsonl_path = tmp_path / "t.jsonl"
    jsonl_path.write_text('{"timestamp": 0, "input_length": 0, "output_length": 1}\n')
    with pytest.raises(WorkloadError, match=r"t\.jsonl, line 1: input_length=0"):
        load_mooncake_jsonl(jsonl_path)
    assert issubclass(WorkloadError, ValueError)
    with pytest.raises(WorkloadError, match="limit=0"):
        load_azure_csv(csv_path, limit=0)
    with pytest.raises(WorkloadError, match="num_requests=0"):
        synthetic("azure-conv", num_requests=0)


def test_simulate_refuses_bad_arguments_and_an_unservable_request() -> None:
    config = SchedulerConfig(max_model_len=4096, num_gpu_blocks=100)
    workload = synthetic("azure-conv", num_requests=3)
    with pytest.raises(ValueError, match="fixed_ms=-6"):
        CostModel(fixed_ms=-6)
    with pytest.raises(ValueError, match="time_scale=-1"):
        simulate(config, workload, time_scale=-1)
    with pytest.raises(ValueError, match="acceptance_rate=2"):
        simulate(config, workload, acceptance_rate=2)
    with pytest.raises(WorkloadError, match="no requests"):
        simulate(config, Workload("w", [], "test"))
    big = Workload("w", [RequestSpec("a", 0.0, 1000, 1000, key=1, origin="w.csv, line 9")], "t")
    with pytest.raises(WorkloadError, match=r"w\.csv, line 9: max_tokens=1000.*outgrows the KV"):
        check_workload(config, big)
    assert config.max_request_len == 99 * 16 + 1


def test_fitting_leaves_the_room_the_config_samples_per_step() -> None:
    workload = Workload("w", [RequestSpec("a", 0.0, 5000, 1, key=1)], "test")
    (spec,) = fit_to_max_model_len(workload, 4096, 3).requests
    assert (spec.prompt_len, spec.output_len) == (4093, 1)


def test_azure_timestamps_with_any_fraction_parse_on_every_python(tmp_path: Path) -> None:
    # Python 3.10's datetime.fromisoformat reads only 3 or 6 fractional digits.
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46,5,1\n"
        "2023-11-16 18:15:46.5,5,1\n"
        "2023-11-16 18:15:47.2500001,5,1\n"
    )
    assert [r.arrival_time for r in load_azure_csv(path).requests] == [0.0, 0.5, 1.25]
    assert load_azure_csv(path).requests[2].origin == f"{path}, line 4"
