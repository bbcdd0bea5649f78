"""SchedulerConfig: vLLM's names and defaults, validation that names the field, a value object
shared by the scheduler."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from llmsched import (
    ConfigError,
    LlmschedError,
    Scheduler,
    SchedulerConfig,
)


def test_config_defaults_are_vllms() -> None:
    cfg = SchedulerConfig()
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.block_size) == (128, 2048, 16)
    assert cfg.max_num_scheduled_tokens == cfg.max_num_batched_tokens
    assert cfg.max_num_active_seqs == cfg.max_num_seqs
    assert cfg.enable_chunked_prefill and cfg.scheduler_reserve_full_isl
    assert cfg.async_scheduling  # vLLM resolves async scheduling on by default
    assert (cfg.long_prefill_token_threshold, cfg.num_speculative_tokens, cfg.watermark) == (
        0,
        0,
        0,
    )
    assert cfg.num_sampled_tokens_per_step == 1
    assert cfg.policy == "fcfs" and cfg.enable_prefix_caching


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_model_len", 0),
        ("max_model_len", -5),
        ("max_model_len", 1),  # no room for the sampled token
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 64),  # below max_num_seqs=128
        ("block_size", 0),
        ("num_gpu_blocks", 1),  # only the null block
        ("long_prefill_token_threshold", -1),
        ("long_prefill_token_threshold", 4096),  # above max_model_len
        ("num_speculative_tokens", -1),
        ("num_lookahead_tokens", 1),  # without speculative decoding
        ("max_num_new_slots_for_drafting", 1),  # without speculative decoding
        ("num_sampled_tokens_per_step", 2),
        ("watermark", 1.0),
        ("watermark", -0.1),
        ("watermark", float("nan")),
        ("max_num_active_seqs", 1000),  # above max_num_seqs
        ("policy", "lifo"),
        ("enable_prefix_caching", "yes"),
        ("max_model_len", "2048"),
        ("max_model_len", 2048.0),
        ("async_scheduling", 1),
        ("max_num_seqs", True),
        ("prefill_schedule_interval", 0),
        ("no_such_field", 1),
    ],
)
def test_invalid_config_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        SchedulerConfig(**{field: value})
    assert isinstance(info.value, ValueError) and isinstance(info.value, LlmschedError)


def test_chunked_prefill_off_needs_a_budget_of_max_model_len() -> None:
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        SchedulerConfig(enable_chunked_prefill=False, max_model_len=4096)
    SchedulerConfig(enable_chunked_prefill=False, max_model_len=2048)


def test_budgets_must_fit_the_steps_that_cannot_be_split() -> None:
    """Found by fuzzing: a budget below a padded decode (1 + K), or below the longest
    request with chunked prefill off, left a request waiting forever; both are refused."""
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=4, max_num_scheduled_tokens=4)
    SchedulerConfig(num_speculative_tokens=4, max_num_scheduled_tokens=5)
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SchedulerConfig(
            num_speculative_tokens=4,
            max_num_new_slots_for_drafting=4,
            max_num_seqs=8,
            max_num_batched_tokens=8,
        )
    with pytest.raises(ConfigError, match="max_num_scheduled_tokens"):
        SchedulerConfig(
            enable_chunked_prefill=False, max_model_len=2048, max_num_scheduled_tokens=1024
        )
    SchedulerConfig(enable_chunked_prefill=False, max_model_len=2048, max_num_scheduled_tokens=2047)


def test_config_is_a_value() -> None:
    cfg = SchedulerConfig(max_model_len=4096, num_speculative_tokens=2)
    assert cfg == SchedulerConfig(num_speculative_tokens=2, max_model_len=4096)
    assert hash(cfg) == hash(SchedulerConfig(num_speculative_tokens=2, max_model_len=4096))
    assert cfg != SchedulerConfig(max_model_len=4096)
    # A derived value and the same value given explicitly are the same config.
    assert SchedulerConfig() == SchedulerConfig(max_num_scheduled_tokens=2048)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    bigger = cfg.replace(max_num_batched_tokens=4096)
    assert bigger.max_num_scheduled_tokens == 4096  # still derived after replace
    assert cfg.max_num_batched_tokens == 2048  # immutable
    with pytest.raises(ConfigError, match="max_model_len"):
        cfg.replace(max_model_len=0)
    assert cfg.to_dict()["max_model_len"] == 4096
    assert "max_model_len=4096" in repr(cfg)
    with pytest.raises(AttributeError):
        cfg.max_model_len = 8  # type: ignore[misc]


def test_scheduler_shares_its_config_object() -> None:
    cfg = SchedulerConfig(max_model_len=512)
    assert Scheduler(cfg).config is cfg
    with pytest.raises(ConfigError, match="config"):
        Scheduler({"max_model_len": 512})  # type: ignore[arg-type]


def test_reconfigure_takes_a_new_config_before_the_first_request_only() -> None:
    """``reconfigure`` (vLLM's engines and tests set a scheduler's budgets and flags after
    building it): the new config rules every step from then on; once a request was added,
    or a step scheduled, it is refused and nothing changes."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=4))
    sched.set_pause_state(1)
    one_seq = sched.config.replace(max_num_seqs=1)
    sched.reconfigure(one_seq)
    assert sched.config is one_seq
    assert sched.pause_state == 1  # kept
    sched.set_pause_state(0)
    for req_id in ("a", "b"):
        sched.add_request(req_id, [1, 2, 3], max_tokens=2)
    assert list(sched.schedule().req_ids) == ["a"]  # max_num_seqs=1 holds
    with pytest.raises(ConfigError, match="before the scheduler's first request"):
        sched.reconfigure(SchedulerConfig())
    assert sched.config is one_seq
    assert sched.get_request_counts() == (1, 1)

    stepped = Scheduler(SchedulerConfig())
    stepped.schedule()
    with pytest.raises(ConfigError, match="before the scheduler's first request"):
        stepped.reconfigure(SchedulerConfig(max_num_seqs=1))
    assert stepped.config.max_num_seqs == 128
    with pytest.raises(ConfigError, match="config: must be a SchedulerConfig"):
        Scheduler(SchedulerConfig()).reconfigure({"max_num_seqs": 1})  # type: ignore[arg-type]
