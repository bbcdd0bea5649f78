"""``llmsched.vllm`` with an encoder-cache connector (``ec_transfer_config``: disaggregated
encoding), against vLLM 0.33.0's own scheduler with the same connector: vLLM's
``ECExampleConnector`` as a consumer, whose store (a directory) holds some images' encoder
outputs. Runs where vLLM is importable (``make parity-test``)."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is installed in its own venv: make parity-test")

from tests.parity.references import BLOCK, reference
from vllm.config import ECTransferConfig

from llmsched.bench import vllm_reference as ref

#: Images whose encoder outputs the connector's store holds.
STORED = ("stored-1", "stored-2")


def _pair(store: Path, **overrides: Any) -> tuple[Any, Any]:
    """vLLM's scheduler and the plug-in, on one multimodal config with the connector."""
    theirs = reference(
        image_side=4,
        max_num_encoder_input_tokens=20,
        encoder_cache_size=40,
        max_num_batched_tokens=128,
        **overrides,
    )
    for identifier in STORED:
        (store / identifier).mkdir(parents=True)
        (store / identifier / "encoder_cache.safetensors").write_bytes(b"")
    config = copy.copy(theirs.vllm_config)
    object.__setattr__(
        config,
        "ec_transfer_config",
        ECTransferConfig(
            ec_connector="ECExampleConnector",
            ec_role="ec_consumer",
            ec_connector_extra_config={"shared_storage_path": str(store)},
        ),
    )
    theirs.vllm_config = config
    return ref.scheduler_from(theirs, type(theirs)), ref.scheduler_from(theirs)


def _requests() -> list[Any]:
    def make(req_id: str, prompt_len: int, *images: tuple[str, int, int]) -> Any:
        return ref.make_vllm_request(
            req_id,
            list(range(1, prompt_len + 1)),
            max_tokens=4,
            block_size=BLOCK,
            mm_inputs=images,
        )

    return [
        make("a", 40, ("stored-1", 4, 9)),
        make("b", 40, ("local-1", 2, 9)),
        # Shares a's stored image, and has another stored one.
        make("c", 50, ("stored-1", 2, 9), ("stored-2", 20, 16)),
        make("d", 30),
        # Its image does not fit the budget beside b's: its chunk stops before it.
        make("e", 40, ("local-2", 10, 16)),
    ]


def _run(sched: Any, max_steps: int = 40) -> list[Any]:
    """Every step's decisions, connector metadata and outputs, and the encoder cache."""
    for request in _requests():
        sched.add_request(request)
    rows = []
    for _ in range(max_steps):
        if not sched.has_requests():
            break
        so = sched.schedule()
        metadata = [(m.mm_hash, m.num_token) for m in so.ec_connector_metadata.mm_datas]
        # A request past its prompt samples a token; a prefill chunk none.
        sampled = {
            rid: [7]
            for rid in so.num_scheduled_tokens
            if sched.requests[rid].num_computed_tokens >= sched.requests[rid].num_prompt_tokens
        }
        outputs = [
            (o.request_id, list(o.new_token_ids), o.finish_reason, o.ec_transfer_params)
            for eco in sched.update_from_output(so, ref.vllm_runner_output(so, sampled)).values()
            for o in eco.outputs
        ]
        rows.append(
            (
                dict(so.num_scheduled_tokens),
                so.scheduled_encoder_inputs,
                metadata,
                sorted(so.free_encoder_mm_hashes),
                outputs,
                {k: set(v) for k, v in sched.encoder_cache_manager.cached.items()},
            )
        )
    return rows


def test_encoder_outputs_the_connector_has_are_loaded_as_vllms(tmp_path: Path) -> None:
    theirs, ours = _pair(tmp_path)
    expected = _run(theirs)
    assert _run(ours) == expected
    # The stored images were loaded (in the connector's metadata), never encoded. c's second
    # one (16 embeddings) still waited a step, its chunk stopping before it: b's took 9 of
    # the 20 the encoder may compute, and vLLM checks that budget before it asks the
    # connector.
    loaded = [hash_ for row in expected for hash_, _ in row[2]]
    encoded = {(rid, i) for row in expected for rid, inputs in row[1].items() for i in inputs}
    assert sorted(set(loaded)) == list(STORED)
    assert encoded == {("b", 0), ("e", 0)}
    assert expected[0][0]["c"] == 20 and expected[0][2] == [("stored-1", 9)]
    assert expected[1][2] == [("stored-2", 16)]
    assert not ours.has_requests() and ours.core.num_used_blocks == 0


def test_requests_whose_outputs_are_in_transit_wait_as_vllms(tmp_path: Path) -> None:
    """``ensure_cache_available`` says c's outputs are in transit for its first three asks:
    vLLM's loops pass it over, and the plug-in's too."""
    theirs, ours = _pair(tmp_path)
    results = []
    for sched in (theirs, ours):
        asks: list[tuple[str, int]] = []

        def ensure(request: Any, num_computed_tokens: int, asks: list[Any] = asks) -> bool:
            asks.append((request.request_id, num_computed_tokens))
            return request.request_id != "c" or sum(a[0] == "c" for a in asks) > 3

        sched.ec_connector.ensure_cache_available = ensure
        results.append((_run(sched), asks))
    assert results[1] == results[0]
    assert ("c", 0) in results[0][1]


def test_deviation_an_encoder_connectors_delayed_free_is_not_honoured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A connector whose ``request_finished`` asks to delay freeing a request's KV blocks:
    vLLM keeps the request and its blocks until a KV connector reports them sent, which
    none does here, so they never come back; the plug-in frees them (with a warning), and
    the outputs, ``ec_transfer_params`` included, are vLLM's (deviation 16)."""
    theirs, ours = _pair(tmp_path)
    for sched in (theirs, ours):
        sched.ec_connector.request_finished = lambda request: (True, {"id": request.request_id})
    expected = _run(theirs)
    with caplog.at_level(logging.WARNING, logger="llmsched.vllm._ec_connector"):
        assert _run(ours) == expected
    assert "deviation 16" in caplog.text
    finished = [o for row in expected for o in row[4] if o[2] is not None]
    assert {o[0]: o[3] for o in finished} == {r: {"id": r} for r in "abcde"}
    # vLLM's blocks stay in use, its requests kept; the plug-in's are free.
    assert set(theirs.requests) == set("abcde") and theirs.get_kv_cache_usage() > 0
    assert not ours.requests and ours.get_kv_cache_usage() == 0
