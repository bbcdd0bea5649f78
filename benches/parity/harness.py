"""Replays one workload through llmsched and through vLLM 0.33.0's v1 scheduler, step by step.

Both schedulers are driven by the same loop (:func:`drive`) and the same deterministic model
runner (:class:`Runner`), each with its own copy of the runner's state, and every step is
reduced to the same plain-data summary (:data:`STEP_KEYS`). :func:`compare` then lines the
two runs up step by step. If the two schedulers decide alike, the two runs are identical
down to every sampled token; the first step where they are not is the first decision that
differs.

The model runner
----------------
Everything the runner returns is a function of (request id, token position) only, so both
sides see the same tokens whatever the schedulers decide:

- the true token at index ``p`` of request ``r``'s sequence is :func:`target_token` (a
  splitmix64 hash), except that a request may carry an EOS (``EOS_TOKEN_ID``) or a stop
  token (``stop_token_id``) at a chosen output index;
- a request samples in a step iff the step's non-draft positions reach the end of its
  known tokens (a non-final prefill chunk returns an empty row); it then returns
  ``1 + a`` tokens, the true tokens at its next ``1 + a`` positions, ``a`` being the
  number of leading draft slots accepted;
- sync speculative decoding: after each step the runner proposes drafts for every request
  of the batch (:func:`propose_drafts`: a deterministic length in ``[0, K]``, each draft
  the true token with probability ~0.7, else a wrong one); both schedulers get them
  through ``update_draft_token_ids``, and acceptance compares the drafts the scheduler
  actually scheduled with the true tokens (a ``-1`` pad never matches);
- async speculative decoding: the scheduler only sees ``-1`` placeholders; the runner's
  own drafts are accepted by the same per-position rule (:func:`draft_accepted`), except
  that a request admitted in this step (padded to ``1 + K``) has no drafts and accepts
  none.

The runner tracks, per request, the tokens it has produced (``known``) and the positions
whose KV it has computed (``computed``), like a real runner's persistent batch; a request
admitted (new or resumed) restarts from the scheduler's ``num_computed_tokens``. For a
pooling model (``ParityConfig.pooling``) it samples nothing: a step that completes a prompt
returns the request's pooled output. For a diffusion model (``ParityConfig.diffusion``) a
step over a request's canvas (its drafts) emits nothing until the canvas's last denoising
step, which emits the whole canvas (:meth:`Runner.denoise`); the synchronous drafter
proposes the model's whole canvas. Structured-output requests get their grammars from
the "engine" at fixed loop iterations (``ParityRequest.grammar_at``; ``grammar.py``), with
a stand-in grammar that accepts every token the runner samples.

The engine loop
---------------
Sync (``EngineCore.step``): schedule, execute, apply the output, hand the drafts back.
Async: a batch queue of two, with ``EngineCore.step_with_batch_queue``'s rules: a step is
scheduled (and executed) whenever the scheduler has requests, and the oldest step's output
is applied only once the queue is full or nothing more can be scheduled, so step *t + 1*
is scheduled before step *t*'s output is applied; outputs are applied in order, once each.
Requests arrive, and some are aborted, at fixed loop iterations
(``ParityRequest.arrival_step``, ``abort_step``), so the waiting and running queues
interleave.

Deliberate deviations of llmsched (``docs/parity.md``, "Deliberate deviations") and how
the harness treats them. The comparison itself is never loosened: every step of every
case is compared in full. Instead each deviation is either kept out of the compared
workloads (:func:`deviation_triggers` lists what a case must avoid, and :func:`run_case`
refuses a case that does not), emulated on vLLM's side, or out of the runner's reach; and
``test_parity.test_deviation_*`` triggers each one on purpose and pins down the difference.

- no padding when ``0 < long_prefill_token_threshold < 1 + K`` (#54028): kept out (no
  case uses such a threshold; vLLM trips an assertion there);
- the running loop never schedules ``n <= 0``: unreachable while ``C + n + s <= M``
  holds, which both schedulers keep (vLLM since #53962); vLLM 0.33.0 also clamps the count
  at zero before its ``n == 0`` skip (``_reserve_prefill_lookahead``), so even a forced
  state would not tell the two apart;
- a decode step whose output has no token is undone: out of reach (this runner returns a
  token for every decode step);
- a request whose KV outgrows the whole pool stops, length-capped, where vLLM preempts it
  and never runs it again: kept out (:func:`blocks_needed`);
- ``SchedulerConfig`` refuses budgets that cannot fit an unsplittable step (a padded
  decode ``1 + K``, or with chunked prefill off the longest request): kept out (every
  config must be one llmsched accepts, :func:`llmsched_refuses`; vLLM accepts these and
  can then block its waiting queue forever);
- the priority victim is the largest ``(priority, arrival_time, request_id)`` where vLLM
  takes the first largest ``(priority, arrival_time)`` in running order: kept out (under
  the priority policy no two requests of a case share ``(priority, arrival_time)``,
  :func:`unique_priority_keys`; the two rules then pick the same victim);
- when a priority victim was already scheduled in the step, llmsched takes the blocks its
  allocation registered in the prefix cache out of the cache before freeing them:
  emulated (:class:`UncacheUndoneSteps` patches vLLM's scheduler to do the same, so the
  cache, the free queue and every later prefix hit agree; it counts what it uncached);
- ``update_draft_token_ids`` ignores requests that are not running: out of reach (drafts
  go only to the requests of the step just applied, running or finished; the llmsched
  side checks that none is waiting), and kept out for a streaming-input session whose
  input stopped in that step (no drafts go to a request whose output stopped);
- a session's input that would outgrow ``max_model_len`` is refused: kept out
  (:func:`deviation_triggers`);
- a waiting request wedged behind waiting KV holders (nothing runs, no blocks for it)
  lets a holder behind it run: out of reach (something runs whenever a waiting request
  cannot get blocks, or the holders wait for input).

So no step summary needs to be normalized for a deviation.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import traceback
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "EOS_TOKEN_ID",
    "STEP_KEYS",
    "Comparison",
    "HashLabels",
    "LlmschedSide",
    "ParityConfig",
    "ParityRequest",
    "RunResult",
    "Runner",
    "SessionInput",
    "UncacheUndoneSteps",
    "VllmSide",
    "blocks_needed",
    "compare",
    "coverage",
    "describe",
    "deviation_triggers",
    "drive",
    "llmsched_refuses",
    "output_rows",
    "run_case",
    "unique_priority_keys",
    "vllm_reference",
]

EOS_TOKEN_ID = 2
"""The EOS id of every request (the tiny model's, see ``llmsched/bench/vllm_reference.py``)."""

VOCAB_SIZE = 32000
FIRST_REGULAR_TOKEN = 10
"""Sampled tokens are in ``[10, VOCAB_SIZE)`` unless a stop is planted; stop ids are < 10."""

MAX_LOOP_ITERATIONS = 20_000

STEP_KEYS = (
    "aborted",
    "scheduled",
    "total_num_scheduled_tokens",
    "num_computed_tokens",
    "spec_tokens",
    "new",
    "resumed",
    "preempted",
    "finished",
    "block_ids",
    "block_hashes",
    "request_counts",
    "lora_ids",
    "structured_output",
    "encoder_inputs",
    "freed_encoder_outputs",
    "kv_loads",
    "outputs",
)
"""What is compared at every step.

``aborted`` lists the requests ``finish_requests`` aborted just before this step;
``scheduled`` is the ordered ``[(req_id, n)]`` list; ``num_computed_tokens`` is ``C``
before the step; ``spec_tokens`` the scheduled drafts (``-1``: placeholder or padding);
``new``, ``resumed`` are ordered, ``preempted`` and ``finished`` sorted; ``block_ids`` the
KV blocks sent to the runner per request, one list per KV-cache group (the whole table for
new and resumed requests, the null block where a sliding window skipped blocks; the newly
allocated ones otherwise); ``block_hashes`` the prefix-cache hashes of each
request admitted in this step (new or resumed: the hashes its prefix lookup used), one per
full block of its tokens, as :class:`HashLabels` (equal where the hashes are equal, so the
parent chain is compared whatever hash function each side uses); ``request_counts`` is
``(running, waiting)`` right after ``schedule()``; ``lora_ids`` the LoRA adapters the step
runs (sorted; vLLM's runner gathers them from the scheduled requests);
``structured_output`` the requests whose sampled token a grammar constrains, in the step's
order (the rows of its bitmask), and whether one awaits an earlier step's output
(``pending_structured_output_tokens``); ``encoder_inputs`` the images each request
encodes in the step (``{req_id: [input index]}``, vLLM's ``scheduled_encoder_inputs``) and
``freed_encoder_outputs`` the encoder outputs evicted since the previous step, in eviction
order (``free_encoder_mm_hashes``); ``kv_loads`` the requests whose KV connector loads
started across steps in this step, in the waiting loop's order (they wait in
``WAITING_FOR_REMOTE_KVS``); ``outputs`` is what
``update_from_output`` returned for this step: ``[(req_id, new_token_ids, finish_reason,
stop_reason)]`` in order.
"""


class HashLabels:
    """Block hashes as labels: each distinct hash is the number of distinct hashes seen
    before it in the run. Two runs that see their hashes in the same order label them
    alike exactly when their hashes are equal in the same places: a block's hash depends
    on its parent's, so the same tokens under another prefix hash (and label) apart."""

    def __init__(self) -> None:
        self._labels: dict[Any, int] = {}

    def admitted(
        self, summary: dict[str, Any], hashes_of: Callable[[str], Sequence[Any]]
    ) -> dict[str, list[int]]:
        """``summary``'s admitted requests (new or resumed) in scheduled order, each with its
        block hashes (``hashes_of(req_id)``) as labels."""
        admitted = set(summary["new"]) | set(summary["resumed"])
        labels = self._labels
        return {
            rid: [labels.setdefault(h, len(labels)) for h in hashes_of(rid)]
            for rid, _ in summary["scheduled"]
            if rid in admitted
        }


OutputRow = tuple[str, list[int], str | None, int | str | None]
"""One entry of a step's ``outputs``: ``(req_id, new_token_ids, finish_reason, stop_reason)``."""


def vllm_reference() -> ModuleType:
    """``llmsched.bench.vllm_reference``, which builds vLLM's scheduler offline (it imports
    vLLM lazily, so importing it is always safe)."""
    return importlib.import_module("llmsched.bench.vllm_reference")


# ----------------------------------------------------------------------------- tokens

_MASK64 = (1 << 64) - 1
_SALT_TOKEN = 0x7E57_70CE_0000_0001
_SALT_ACCEPT = 0xACCE_97ED_0000_0002
_SALT_DRAFT_LEN = 0xD4AF_71E2_0000_0003


def _mix(x: int) -> int:
    """splitmix64 on a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _hash(key: int, salt: int, position: int) -> int:
    return _mix(_mix(key ^ salt) + position)


@dataclass(frozen=True, slots=True)
class SessionInput:
    """A later input of a streaming-input session (``ParityRequest.inputs``)."""

    step: int
    """Loop iteration at which the driver adds it."""
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_time: float


@dataclass(frozen=True, slots=True)
class ParityRequest:
    """One request of a parity workload, with its planted stops and its arrival."""

    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int
    """Loop iteration at which the driver adds it (before that iteration's schedule)."""
    arrival_time: float
    """Given to both schedulers (the priority policy's tie-breaker)."""
    priority: int = 0
    eos_at: int | None = None
    """Output index at which the runner samples EOS, if any."""
    stop_token_id: int | None = None
    """A stop token id of the request (in ``[3, 10)``), sampled at ``stop_at``."""
    stop_at: int | None = None
    abort_step: int | None = None
    """Loop iteration at which the driver aborts it (``finish_requests``), if still live."""
    lora_id: int | None = None
    """The LoRA adapter it runs under, if any."""
    cache_salt: str | None = None
    skip_reading_prefix_cache: bool = False
    """Admitted without a prefix-cache lookup (vLLM's engine: prompt logprobs)."""
    grammar_at: int | None = None
    """Structured output: the loop iteration at which the engine is done compiling its
    grammar (None: its output is unconstrained); see ``grammar``."""
    grammar_fails: bool = False
    """Its grammar fails to compile (the request then fails with vLLM's error)."""
    report_reused_blocks: bool = False
    """With KV cache events, its prefix hits are reported too (``kv_cache_report_mode``)."""
    mm_inputs: tuple[tuple[str, int, int], ...] = ()
    """Its images: ``(identifier, offset, length)`` each, ``length`` placeholder tokens from
    ``offset`` on; images with one identifier share their encoder output."""
    resumable: bool = False
    """A streaming-input session (vLLM's resumable request): a stop ends its input, not the
    request, which keeps its KV and goes on with its next input (none planted: only
    ``max_tokens`` stops it)."""
    inputs: tuple[SessionInput, ...] = ()
    """A session's later inputs, in order."""
    end_step: int | None = None
    """Loop iteration at which the driver ends the session (an input that is not resumable),
    after its last input."""
    diffusion_canvas_length: int | None = None
    """A diffusion model's request: its canvas, narrower than the model's (None: the
    model's)."""
    diffusion_read_steps: int | None = None
    """A diffusion model's request: a read of that many denoising steps (its last emits the
    canvas)."""

    @property
    def key(self) -> int:
        return zlib.crc32(self.request_id.encode())

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def longest(self) -> int:
        """The most tokens it can reach: its prompt and output, and a session's later
        inputs and their outputs (each input discards the last token before it)."""
        return (
            self.prompt_len
            + self.max_tokens
            + sum(len(i.prompt) + i.max_tokens for i in self.inputs)
        )


def target_token(req: ParityRequest, position: int) -> int:
    """The true token at index ``position`` of ``req``'s sequence (prompt + outputs)."""
    out_index = position - req.prompt_len
    if req.eos_at is not None and out_index == req.eos_at:
        return EOS_TOKEN_ID
    if req.stop_at is not None and out_index == req.stop_at and req.stop_token_id is not None:
        return req.stop_token_id
    span = VOCAB_SIZE - FIRST_REGULAR_TOKEN
    return FIRST_REGULAR_TOKEN + _hash(req.key, _SALT_TOKEN, position) % span


_SALT_GRAMMAR = 0x67A3_3A12_0000_0004


def grammar_accepts(req: ParityRequest, position: int, token: int) -> bool:
    """The stand-in grammar of a structured-output request (``grammar.py``): every token the
    runner samples is valid, a wrong draft at about half of the positions."""
    return token == target_token(req, position) or _hash(req.key, _SALT_GRAMMAR, position) % 2 == 0


def draft_accepted(req: ParityRequest, position: int) -> bool:
    """Whether a draft for ``position`` is right (~70% of positions)."""
    return _hash(req.key, _SALT_ACCEPT, position) % 100 < 70


def _wrong_token(token: int) -> int:
    span = VOCAB_SIZE - FIRST_REGULAR_TOKEN
    return FIRST_REGULAR_TOKEN + (max(token, FIRST_REGULAR_TOKEN) - FIRST_REGULAR_TOKEN + 1) % span


def propose_drafts(req: ParityRequest, num_tokens: int, k: int) -> list[int]:
    """Sync drafts for positions ``num_tokens, num_tokens + 1, ...``: a deterministic count
    (K mostly, sometimes none, sometimes fewer), each the true token if accepted; now and
    then the last one is a ``-1`` pad."""
    h = _hash(req.key, _SALT_DRAFT_LEN, num_tokens)
    choice = h % 8
    if choice == 0:
        count = 0
    elif choice == 1 and k > 1:
        count = 1 + (h >> 8) % (k - 1)
    else:
        count = k
    drafts = []
    for j in range(count):
        true = target_token(req, num_tokens + j)
        drafts.append(true if draft_accepted(req, num_tokens + j) else _wrong_token(true))
    if choice == 2 and drafts:
        drafts[-1] = -1  # a drafter's padding: kept by both schedulers, never accepted
    return drafts


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True)
class ParityConfig:
    """One scheduler configuration, given to both sides with the same meaning."""

    name: str
    async_scheduling: bool
    num_speculative_tokens: int
    enable_prefix_caching: bool
    policy: str
    num_gpu_blocks: int
    max_model_len: int = 4096
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    block_size: int = 16
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    enable_chunked_prefill: bool = True
    max_num_scheduled_tokens: int | None = None
    max_num_active_seqs: int | None = None
    long_prefill_token_threshold_adaptive: bool = False
    max_loras: int = 0
    prefill_schedule_interval: int = 1
    use_v2_model_runner: bool = False
    """vLLM's side only: how vLLM reports resumed requests (with the V2 model runner, among
    the new ones, every token re-sent); llmsched's own side has no runner to follow."""
    pooling: bool = False
    """A pooling (embedding) model: no token is sampled, a request ends with its prompt's
    pooled output (llmsched: ``num_sampled_tokens_per_step=0``)."""
    kv_events: bool = False
    """vLLM's KV cache events on (``kv_events_config``): compared where both sides are vLLM
    schedulers (``plugin``), the events each ``update_from_output`` publishes."""
    kv_cache_groups: str = "full"
    """llmsched's ``kv_cache_groups``: vLLM's side gets one KV-cache group per entry
    (``FullAttentionSpec``, ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec`` or a
    ``MambaSpec``, aligned to the block size with prefix caching), in that order; ``""``:
    none (a model without a KV cache, its pool the null block alone). ``+eagle`` after an
    entry: the group holds the drafter's layers (vLLM's ``is_eagle_group``)."""
    latent_attention: bool = False
    """vLLM's side: its full-attention groups are multi-head latent attention
    (``MLAAttentionSpec``, DeepSeek-style models'), which vLLM manages as full attention;
    llmsched's side: full attention."""
    prefix_cache_retention_interval: int = 0
    """Both sides' (vLLM's engine default, 0; a block size: every sliding-window block and
    aligned Mamba state)."""
    mamba_prefill_checkpoint_alignment: int = 0
    """Both sides': with Mamba groups and prefix caching, their prefill checkpoints' alignment
    (vLLM's side: ``MambaSpec`` with one checkpoint block and this alignment; 0: none)."""
    speculative_method: str = "ngram"
    """vLLM's drafter: ``ngram`` (no slots of its own), ``eagle`` / ``eagle3`` (``K``
    lookahead slots and EAGLE's prefix-cache rule), ``mtp`` (a multi-module MTP drafter:
    EAGLE's, reading ``K`` prompt tokens ahead) or ``draft_model`` (``K`` lookahead slots and
    one draft slot per request)."""
    lookahead_block_hashes: bool = True
    """EAGLE's prefix-cache rule with prefix caching on: block hashes that cover the next
    token (vLLM 0.33's default), else a hit's last block dropped."""
    pipeline_parallel_size: int = 1
    """Both sides': pipeline stages, one step in flight per stage (the engine loop's batch
    queue)."""
    image_side: int = 0
    """A multimodal model (a tiny llava-1.5 on vLLM's side) whose images are at most
    ``image_side ** 2`` placeholder tokens (0: text only)."""
    max_num_encoder_input_tokens: int = 0
    """With ``image_side``: vLLM's scheduler config's encoder compute budget, which its
    ``MultiModalBudget`` raises to the largest image (llmsched's side gets the result)."""
    encoder_cache_size: int = 0
    """Likewise for the encoder cache."""
    disable_chunked_mm_input: bool = False
    mm_encoder_only: bool = False
    """With ``image_side``: an encoder instance (vLLM's ``mm_encoder_only``): the runner
    encodes and samples nothing, a request ends once its prompt is computed."""
    diffusion: bool = False
    """A diffusion LLM whose canvas is ``num_speculative_tokens`` (vLLM's side: a
    ``DiffusionConfig`` and its diffusion scheduler classes; llmsched's: nothing sampled,
    ``num_sampled_tokens_per_step=0``). The runner denoises (:meth:`Runner.denoise`)."""
    kv_connector: bool = False
    """A KV connector serves the engine: :class:`benches.parity.connector.ParityConnector`
    (vLLM's side and the plug-in load it; llmsched's own side asks its rule), whose store
    holds about one prompt in three."""
    kv_connector_async_loads: bool = False
    """With ``kv_connector``: its :class:`benches.parity.connector.AsyncParityConnector`,
    which loads half the prompts it holds across steps."""
    kv_load_failure_policy: str = "recompute"
    """With ``kv_connector``, vLLM's: a failed load is recomputed, or fails its request."""
    kv_role: str = "kv_producer"
    """With ``kv_connector``, vLLM's ``kv_role``: a producer's connector hands KV off (a
    request preempted for KV drops its output in flight), a consumer's loads into blocks (a
    freed block waits for the steps in flight that may write it); ``kv_both`` does both."""
    data_parallel_size: int = 1
    """vLLM's side only: a data-parallel rank of an MoE model (> 1), whose engine core keeps
    the prefill cadence: every step but each ``prefill_schedule_interval``-th is throttled
    (:meth:`throttles`), and the scheduler applies no cadence of its own (llmsched's side
    gets ``prefill_schedule_interval`` 1, as the plug-in gives its core)."""

    def group_kinds(self) -> list[str]:
        """The kinds of ``kv_cache_groups``, one per KV-cache group (a ``+eagle`` mark,
        a group holding the drafter's layers, left out)."""
        groups = self.kv_cache_groups.split(",") if self.kv_cache_groups else []
        return [kind.removesuffix("+eagle") for kind in groups]

    def max_concurrent_batches(self) -> int:
        """The engine's batch queue (vLLM's ``max_concurrent_batches``): one step per stage;
        with async scheduling, one more for the V2 runner, two without stages."""
        stages = self.pipeline_parallel_size
        if self.async_scheduling and self.use_v2_model_runner:
            return stages + 1
        return 2 if self.async_scheduling and stages == 1 else stages

    def throttles(self, step: int) -> bool:
        """Whether the engine throttles prefill in its ``step``-th schedule call (vLLM's
        ``DPEngineCoreProc._should_throttle_prefills``, on a counter shared by the ranks)."""
        interval = self.prefill_schedule_interval
        return self.data_parallel_size > 1 and interval > 1 and step % interval != 0

    def drafter_kwargs(self) -> dict[str, Any]:
        """llmsched's fields for the drafter, as vLLM derives them from its method."""
        k, method = self.num_speculative_tokens, self.speculative_method
        if k == 0 or method == "ngram":
            return {}
        eagle = method in ("eagle", "eagle3", "mtp")
        # Prompt tokens the drafter reads ahead of a chunk: one module's one, each module's
        # one more; a block's hash covers as many.
        prefill_lookahead = (k if method == "mtp" else 1) if eagle else 0
        hashes = (
            prefill_lookahead if self.enable_prefix_caching and self.lookahead_block_hashes else 0
        )
        return {
            "num_lookahead_tokens": k,
            "max_num_new_slots_for_drafting": int(method == "draft_model"),
            "num_hash_lookahead_tokens": hashes,
            "eagle_block_drop": eagle and not hashes,
            "num_prefill_lookahead_tokens": prefill_lookahead,
        }

    def encoder_kwargs(self) -> dict[str, Any]:
        """llmsched's fields for the encoder, as vLLM derives them for the model: each budget
        at least the largest image."""
        if not self.image_side:
            return {}
        largest = self.image_side**2
        return {
            "max_num_encoder_input_tokens": max(self.max_num_encoder_input_tokens, largest),
            "encoder_cache_size": max(self.encoder_cache_size, largest),
        }

    def llmsched_kwargs(self) -> dict[str, Any]:
        """llmsched's ``SchedulerConfig`` fields."""
        return {
            **self.drafter_kwargs(),
            **self.encoder_kwargs(),
            "disable_chunked_mm_input": self.disable_chunked_mm_input,
            "mm_encoder_only": self.mm_encoder_only,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            # vLLM's engine turns chunked prefill off for a model without a KV cache.
            "enable_chunked_prefill": self.enable_chunked_prefill and bool(self.group_kinds()),
            "long_prefill_token_threshold": self.long_prefill_token_threshold,
            "num_speculative_tokens": self.num_speculative_tokens,
            "async_scheduling": self.async_scheduling,
            "enable_prefix_caching": self.enable_prefix_caching,
            "policy": self.policy,
            "watermark": self.watermark,
            "max_num_scheduled_tokens": self.max_num_scheduled_tokens,
            "max_num_active_seqs": self.max_num_active_seqs,
            "long_prefill_token_threshold_adaptive": self.long_prefill_token_threshold_adaptive,
            "max_loras": self.max_loras,
            "prefill_schedule_interval": 1
            if self.data_parallel_size > 1
            else self.prefill_schedule_interval,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "num_sampled_tokens_per_step": 0 if self.pooling or self.diffusion else 1,
            "kv_cache_groups": self.kv_cache_groups,
            "prefix_cache_retention_interval": self.prefix_cache_retention_interval,
            "mamba_prefill_checkpoint_alignment": self.mamba_prefill_checkpoint_alignment,
            "kv_connector": self.kv_connector,
            # vLLM's requires_kv_delivery (a producer's) and defer_block_free (a consumer's
            # with steps in flight).
            "preemption_drops_in_flight_output": self.kv_connector
            and self.kv_role in ("kv_producer", "kv_both"),
            "recompute_kv_load_failures": self.kv_load_failure_policy == "recompute",
            "defer_block_free": self.kv_connector
            and self.kv_role in ("kv_consumer", "kv_both")
            and self.max_concurrent_batches() > 1,
        }

    def scheduler_kwargs(self) -> dict[str, Any]:
        """What ``vllm_reference.make_vllm_scheduler`` takes: the same fields, which it sets
        where vLLM's config keeps them (vLLM derives the sampled tokens per step from the
        model's runner), and the model runner."""
        shared = self.llmsched_kwargs()
        for derived in (
            "num_sampled_tokens_per_step",
            "mm_encoder_only",
            "preemption_drops_in_flight_output",
            "defer_block_free",
            "recompute_kv_load_failures",
            *self.drafter_kwargs(),
            *self.encoder_kwargs(),
        ):
            del shared[derived]
        # vLLM's config keeps the engine's cadence; its scheduler decides what it applies.
        shared["prefill_schedule_interval"] = self.prefill_schedule_interval
        # The flag as given: the builder turns it off without a KV cache, as vLLM's engine.
        shared["enable_chunked_prefill"] = self.enable_chunked_prefill
        if self.diffusion:
            # vLLM derives K from the diffusion config's canvas, not a drafter's.
            shared["num_speculative_tokens"] = 0
            shared["diffusion_canvas_length"] = self.num_speculative_tokens
        return {
            **shared,
            "use_v2_model_runner": self.use_v2_model_runner,
            "speculative_method": self.speculative_method,
            "lookahead_block_hashes": self.lookahead_block_hashes,
            "latent_attention": self.latent_attention,
            "data_parallel_size": self.data_parallel_size,
            "pooling": self.pooling,
            "kv_events": self.kv_events,
            "kv_connector": (
                (
                    "AsyncParityConnector" if self.kv_connector_async_loads else "ParityConnector",
                    "benches.parity.connector",
                )
                if self.kv_connector
                else None
            ),
            "kv_role": self.kv_role,
            "kv_load_failure_policy": self.kv_load_failure_policy,
            **(
                {
                    "image_side": self.image_side,
                    "max_num_encoder_input_tokens": self.max_num_encoder_input_tokens,
                    "encoder_cache_size": self.encoder_cache_size,
                    "mm_encoder_only": self.mm_encoder_only,
                }
                if self.image_side
                else {}
            ),
        }


def blocks_needed(req: ParityRequest, config: ParityConfig) -> int:
    """The most KV blocks ``req`` can ever hold under ``config``, every KV-cache group
    counted (past the usable pool, ``num_gpu_blocks - 1``, vLLM never finishes the request
    and llmsched stops it short of its output): a sliding-window group holds at most its
    window before the next token and a step's budget per step in flight, plus a block for a
    window starting mid-block; a chunked local group a chunk and the tokens in flight, plus a
    block for a chunk starting mid-block (each windowed group also the blocks of the
    drafter's lookahead slots); a Mamba group its state blocks, ``1 + K`` (with prefix
    caching, aligned: the state a step reads, one per draft token and, per step in flight,
    the state it writes and a checkpoint's)."""
    longest = min(req.longest + config.num_speculative_tokens, config.max_model_len)
    whole = -(-longest // config.block_size)
    steps_in_flight = 2 if config.async_scheduling else 1
    total = 0
    for kind in config.group_kinds():
        if kind == "full":
            total += whole
            continue
        if kind == "mamba" and config.enable_prefix_caching:
            # Aligned: the state a step reads, a block per draft token and, per step that
            # may be in flight, the state it writes and a prefill checkpoint block.
            per_step = 1 + int(config.mamba_prefill_checkpoint_alignment > 0)
            steps = max(steps_in_flight, config.pipeline_parallel_size)
            total += 1 + config.num_speculative_tokens + steps * per_step
            continue
        if kind == "mamba":
            # A state block per request and one per draft token, however long.
            total += 1 + config.num_speculative_tokens
            continue
        name, size = kind.split(":")
        # A window or a chunk that starts mid-block spans one block more.
        if name == "sliding_window":
            before, extra = int(size) - 1, 1
        else:
            before, extra = int(size), int(int(size) % config.block_size != 0)
        held = min(before + steps_in_flight * config.max_num_batched_tokens, config.max_model_len)
        lookahead = config.drafter_kwargs().get("num_lookahead_tokens", 0)
        total += min(
            whole, -(-held // config.block_size) + extra + -(-lookahead // config.block_size)
        )
    return total


def llmsched_refuses(config: ParityConfig) -> str | None:
    """Why llmsched's ``SchedulerConfig`` refuses ``config`` (its ``ConfigError``, which
    names the field first), or None if it accepts it. vLLM accepts some configs llmsched
    refuses (budgets below an unsplittable step): no compared case may use one."""
    import llmsched

    try:
        llmsched.SchedulerConfig(**config.llmsched_kwargs())
    except llmsched.ConfigError as exc:
        return str(exc)
    return None


def unique_priority_keys(requests: Sequence[ParityRequest]) -> list[ParityRequest]:
    """``requests`` with no two sharing ``(priority, arrival_time)``, for the priority
    policy: a request whose key an earlier one (in list order) already holds gets the next
    larger float as its arrival time (again if that is taken too). Only ties move: the
    order against every other arrival time is kept, and the later request of a tie ranks
    after the earlier one.

    With unique keys llmsched's priority victim (the largest ``(priority, arrival_time,
    request_id)``) and vLLM's (the first largest ``(priority, arrival_time)`` in running
    order) are the same request; they differ only on a tie (``test_deviation_tied_*``)."""
    seen: set[tuple[int, float]] = set()
    out = []
    for req in requests:
        t = req.arrival_time
        while (req.priority, t) in seen:
            t = math.nextafter(t, math.inf)
        seen.add((req.priority, t))
        out.append(req if t == req.arrival_time else replace(req, arrival_time=t))
    return out


def deviation_triggers(config: ParityConfig, requests: Sequence[ParityRequest]) -> list[str]:
    """What in this case would reach a deliberate deviation that the harness keeps out of
    its compared workloads (module docstring), one line each; empty if none."""
    found = []
    refused = llmsched_refuses(config)
    if refused is not None:
        found.append(f"llmsched refuses the config: {refused}")
    k = config.num_speculative_tokens
    if 0 < config.long_prefill_token_threshold < 1 + k:
        found.append(
            f"#54028: 0 < long_prefill_token_threshold = {config.long_prefill_token_threshold}"
            f" < 1 + K = {1 + k}"
        )
    if config.image_side and config.disable_chunked_mm_input:
        whole = min(
            config.max_num_scheduled_tokens or config.max_num_batched_tokens,
            config.max_num_batched_tokens
            - config.drafter_kwargs().get("max_num_new_slots_for_drafting", 0),
        )
        if config.long_prefill_token_threshold > 0:
            whole = min(whole, config.long_prefill_token_threshold)
        whole -= config.drafter_kwargs().get("num_prefill_lookahead_tokens", 0)
        for req in requests:
            longer = [length for _, _, length in req.mm_inputs if length > whole]
            if longer:
                found.append(
                    f"{req.request_id} has an image of {longer[0]} placeholders, which no step "
                    f"takes whole ({whole})"
                )
    usable = config.num_gpu_blocks - 1
    # With a connector and drafts, an asynchronous load leaves a speculative step's slots.
    spec_step = 1 + k + config.drafter_kwargs().get("num_lookahead_tokens", 0) if k else 0
    for req in requests:
        if req.resumable and req.longest > config.max_model_len - 1:
            found.append(
                f"session {req.request_id} could outgrow max_model_len: {req.longest} tokens "
                "(llmsched refuses or ends it, vLLM goes on)"
            )
        needed = blocks_needed(req, config)
        if needed > usable:
            found.append(
                f"{req.request_id} could outgrow the pool: {needed} blocks > {usable} usable"
            )
        if config.kv_connector and k:
            longest = min(req.prompt_len + req.max_tokens, config.max_model_len)
            load = -(-longest // config.block_size) + -(-spec_step // config.block_size)
            if load > usable:
                found.append(
                    f"{req.request_id}'s KV load could never start: {load} blocks > {usable}"
                )
    if config.policy == "priority":
        first: dict[tuple[int, float], str] = {}
        for req in requests:
            key = (req.priority, req.arrival_time)
            if key in first:
                found.append(
                    f"{first[key]} and {req.request_id} tie on (priority, arrival_time) = {key}"
                )
            first.setdefault(key, req.request_id)
    return found


# ----------------------------------------------------------------------------- runner


@dataclass(slots=True)
class _RunnerState:
    known: int
    prompt_len: int
    """The request's prompt: a session's grows with each input it takes up."""
    computed: int = 0
    delivered: int = 0
    """Output tokens the scheduler delivered (a dropped stale output is not among them)."""
    inputs: deque[tuple[int, ...]] = field(default_factory=deque)
    """A session's later inputs added and not yet taken up, oldest first."""
    waits_for_input: bool = False
    """A session whose input stopped with no later input added yet."""
    denoised: int = 0
    """A diffusion request's denoising steps on its current canvas."""

    def take_up(self, prompt: tuple[int, ...]) -> None:
        """A session's next input: its tokens are all it had but the last sampled one (whose
        KV was never computed), then the input's."""
        self.prompt_len += self.delivered - 1 + len(prompt)
        self.delivered = 0
        self.waits_for_input = False


class RunnerError(AssertionError):
    """The scheduler asked the runner for something a real runner could not do."""


class Runner:
    """The deterministic model runner (see the module docstring). One per side."""

    def __init__(self, config: ParityConfig) -> None:
        self.config = config
        self.requests: dict[str, ParityRequest] = {}
        self.state: dict[str, _RunnerState] = {}
        # The encoder outputs the runner holds, by identifier.
        self.encoder_outputs: set[str] = set()

    def add(self, req: ParityRequest) -> None:
        self.requests[req.request_id] = req
        self.state[req.request_id] = _RunnerState(known=req.prompt_len, prompt_len=req.prompt_len)

    def add_input(self, req_id: str, prompt: tuple[int, ...]) -> None:
        """A session's next input, taken up now if the session waits for one, else at its
        next stop (the engine's view of vLLM's streaming input)."""
        state = self.state[req_id]
        if state.waits_for_input:
            state.take_up(prompt)
        else:
            state.inputs.append(prompt)

    def execute(
        self, summary: dict[str, Any]
    ) -> tuple[dict[str, list[int]], tuple[list[str], list[list[int]]] | None]:
        """Sampled tokens per scheduled request (absent: empty row), and the sync drafts
        to hand back after the output is applied (None without sync spec decode)."""
        admitted = set(summary["new"]) | set(summary["resumed"])
        computed_before = summary["num_computed_tokens"]
        if self.config.image_side:
            self._encode(summary)
        spec = summary["spec_tokens"]
        sync = not self.config.async_scheduling
        sampled: dict[str, list[int]] = {}
        for rid, n in summary["scheduled"]:
            req = self.requests[rid]
            st = self.state[rid]
            drafts = spec.get(rid, [])
            if rid in admitted:
                # An admitted request's tokens are the scheduler's: its prompt and the
                # outputs it delivered (a preemption that dropped an output in flight
                # takes that token back).
                st.computed = computed_before[rid]
                st.known = st.prompt_len + st.delivered
                st.denoised = 0
            elif sync and computed_before[rid] < st.computed:
                # The scheduler took a running request back (a synchronous load's failed
                # blocks): the output it had in flight was dropped, it recomputes from there.
                st.computed = computed_before[rid]
                st.known = st.prompt_len + st.delivered
            st.computed += n - len(drafts)
            if st.computed < st.known:
                if drafts:
                    raise RunnerError(f"{rid}: draft slots scheduled in a non-final prefill chunk")
                continue  # a non-final prefill chunk: no sample
            if self.config.pooling or self.config.mm_encoder_only:
                sampled[rid] = []  # the prompt is done: pooled, or encoded; nothing sampled
                continue
            if self.config.diffusion:
                sampled[rid] = self.denoise(req, st, len(drafts))
                continue
            if st.computed > st.known:
                raise RunnerError(
                    f"{rid}: scheduled past its known tokens (computed {st.computed} > "
                    f"known {st.known})"
                )
            accepted = 0
            for j, draft in enumerate(drafts):
                position = st.known + j
                if sync:
                    ok = draft == target_token(req, position)
                else:
                    ok = rid not in admitted and draft_accepted(req, position)
                if not ok:
                    break
                accepted += 1
            sampled[rid] = [target_token(req, st.known + j) for j in range(accepted + 1)]
            st.known += accepted + 1
            st.computed += accepted
        drafts_out = None
        if sync and self.config.diffusion:
            # A diffusion worker proposes the model's whole canvas for every request.
            ids = [rid for rid, _ in summary["scheduled"]]
            k = self.config.num_speculative_tokens
            drafts_out = (
                ids,
                [
                    [target_token(self.requests[rid], self.state[rid].known + j) for j in range(k)]
                    for rid in ids
                ],
            )
        elif sync and self.config.num_speculative_tokens > 0:
            ids = [rid for rid, _ in summary["scheduled"]]
            drafts_out = (
                ids,
                [
                    propose_drafts(
                        self.requests[rid],
                        self.state[rid].known,
                        self.config.num_speculative_tokens,
                    )
                    for rid in ids
                ],
            )
        return sampled, drafts_out

    @staticmethod
    def denoise(req: ParityRequest, st: _RunnerState, canvas: int) -> list[int]:
        """A diffusion step over ``canvas`` positions: none emitted (the prompt's last chunk,
        or a denoising step short of the canvas's last), or the whole canvas, the true tokens
        there, on its last step: a read's ``diffusion_read_steps``-th, any other request's
        ``1 + key % 3``-th."""
        if canvas == 0:
            return []
        st.denoised += 1
        if st.denoised < (req.diffusion_read_steps or 1 + req.key % 3):
            return []
        st.denoised = 0
        tokens = [target_token(req, st.known + j) for j in range(canvas)]
        st.known += canvas
        st.computed += canvas
        return tokens

    def delivered(self, rows: Sequence[OutputRow] | None) -> None:
        """The scheduler delivered these outputs."""
        for row in rows or ():
            state = self.state.get(row[0])
            if state is not None:
                state.delivered += len(row[1])
                if row[2] is not None and self.requests[row[0]].resumable:
                    # A session's input stopped: it goes on with its next input.
                    if state.inputs:
                        state.take_up(state.inputs.popleft())
                    else:
                        state.waits_for_input = True

    def _encode(self, summary: dict[str, Any]) -> None:
        """A GPU runner's encoder step: frees the evicted outputs, encodes the step's images,
        then finds every image a scheduled chunk's placeholders need in its encoder cache
        (vLLM's runner asserts the same: a miss has no embeddings to gather)."""
        self.encoder_outputs.difference_update(summary["freed_encoder_outputs"])
        for rid, inputs in summary["encoder_inputs"].items():
            for i in inputs:
                self.encoder_outputs.add(self.requests[rid].mm_inputs[i][0])
        for rid, n in summary["scheduled"]:
            start = summary["num_computed_tokens"][rid]
            for identifier, offset, length in self.requests[rid].mm_inputs:
                overlaps = offset < start + n and start < offset + length
                if overlaps and identifier not in self.encoder_outputs:
                    raise RunnerError(
                        f"{rid}: tokens [{start}, {start + n}) need image {identifier!r} "
                        f"at [{offset}, {offset + length}), which is not encoded"
                    )


# ----------------------------------------------------------------------------- sides


class LlmschedSide:
    """llmsched's ``Scheduler`` behind the driver's interface."""

    name = "llmsched"

    def __init__(self, config: ParityConfig) -> None:
        import llmsched

        self._llmsched = llmsched
        self.config = config
        self.scheduler = llmsched.Scheduler(llmsched.SchedulerConfig(**config.llmsched_kwargs()))
        self.hash_labels = HashLabels()
        # The structured-output requests, whose drafts the "engine" validates.
        self.structured: dict[str, ParityRequest] = {}
        # With the parity connector: every prompt by request, the finished requests whose
        # KV it has sent (released at the next update) and is sending (at the one after).
        self.prompts: dict[str, tuple[int, ...]] = {}
        self._sent: list[str] = []
        self._sending_now: list[str] = []
        # The requests whose loads across steps the last step started: reported received
        # with its output; those that failed whole, and the blocks of those that failed from
        # a block on.
        self._receiving: list[str] = []
        self._failed: list[str] = []
        self._invalid: list[int] = []
        self._failed_once: set[str] = set()
        self._num_groups = len(config.group_kinds())

    def add(self, req: ParityRequest) -> None:
        self.prompts[req.request_id] = req.prompt
        if req.grammar_at is not None:
            self.structured[req.request_id] = req
        if self.config.pooling:
            self.scheduler.add_request(
                req.request_id,
                list(req.prompt),
                max_tokens=1,
                arrival_time=req.arrival_time,
                priority=req.priority,
                cache_salt=req.cache_salt,
            )
            return
        self.scheduler.add_request(
            req.request_id,
            list(req.prompt),
            max_tokens=req.max_tokens,
            eos_token_id=EOS_TOKEN_ID,
            stop_token_ids=() if req.stop_token_id is None else (req.stop_token_id,),
            arrival_time=req.arrival_time,
            priority=req.priority,
            lora_id=req.lora_id,
            cache_salt=req.cache_salt,
            skip_reading_prefix_cache=req.skip_reading_prefix_cache,
            structured_output=req.grammar_at is not None,
            mm_inputs=req.mm_inputs,
            resumable=req.resumable,
            diffusion_canvas_length=req.diffusion_canvas_length,
            diffusion_read_steps=req.diffusion_read_steps,
        )

    def add_input(self, req: ParityRequest, later: SessionInput | None) -> None:
        """A session's next input (None: its end), added under its id."""
        if later is None:
            self.scheduler.add_request(req.request_id, [0], max_tokens=1)
            return
        self.scheduler.add_request(
            req.request_id,
            list(later.prompt),
            max_tokens=later.max_tokens,
            eos_token_id=EOS_TOKEN_ID,
            arrival_time=later.arrival_time,
            resumable=True,
        )

    def compile_grammar(self, req: ParityRequest) -> None:
        """The engine is done compiling ``req``'s grammar (if the request is still live)."""
        with contextlib.suppress(self._llmsched.UnknownRequestError):
            self.scheduler.resolve_grammar(req.request_id, not req.grammar_fails)

    def has_requests(self) -> bool:
        return bool(self.scheduler.has_requests())

    def _external_kv(self, request: Any, num_local: int) -> tuple[int, bool]:
        """The parity connector's answer (its rule, as vLLM's side's connector applies it)."""
        from .connector import matched_tokens  # imports vLLM

        return matched_tokens(
            request.prompt_token_ids,
            self.config.block_size,
            num_local,
            self.config.kv_connector_async_loads,
        )

    def _release_finished_blocks(self, req_ids: Iterable[str], *, in_update: bool) -> None:
        """The parity connector's rule for the requests that just finished: blocks back at
        once, unless it sends the request's KV: then once the engine reports it sent, with
        the next output (for a request this output finished: the one after)."""
        from .connector import sends  # imports vLLM

        now = []
        sending = self._sending_now if in_update else self._sent
        for rid in req_ids:
            if self.scheduler.held_kv_blocks(rid) is None:
                continue
            if sends(self.prompts[rid]):
                sending.append(rid)
            elif not self.scheduler.kv_load_in_flight(rid):
                now.append(rid)
        if now:
            self.scheduler.release_kv_blocks(now)

    def _load_started(self, req_id: str) -> None:
        """A load across steps started: the parity connector's rule for how it ends (a
        request's first load only may fail)."""
        from .connector import failed_block, load_failure  # imports vLLM

        self._receiving.append(req_id)
        if req_id in self._failed_once:
            return
        failure = load_failure(self.prompts[req_id], self._num_groups)
        if failure is not None:
            self._failed_once.add(req_id)
        if failure == "whole":
            self._failed.append(req_id)
        elif failure == "block":
            blocks = [int(b) for b in self.scheduler.get_request(req_id).block_ids]
            self._invalid.append(failed_block(blocks))

    def _sync_load_done(self, req_id: str) -> None:
        """A synchronous load was scheduled: the parity connector's rule for whether it
        failed from a block on (a request's first load only; under sync scheduling only)."""
        from .connector import failed_block, sync_load_fails  # imports vLLM

        if req_id in self._failed_once or not sync_load_fails(
            self.prompts[req_id], self._num_groups
        ):
            return
        self._failed_once.add(req_id)
        self._invalid.append(
            failed_block([int(b) for b in self.scheduler.get_request(req_id).block_ids])
        )

    def _report_failed_loads(self) -> list[str]:
        """The runner's report of the loads that failed (as vLLM's side builds its sets),
        before the step's output is applied, as vLLM takes it; returns the requests to
        finish with an error once it is (under the policy "fail")."""
        if not self._failed and not self._invalid:
            return []
        failing = self.scheduler.fail_kv_loads(set(self._failed), set(self._invalid))
        self._failed, self._invalid = [], []
        return list(failing)

    def _fail_failed_loads(self, failing: list[str]) -> list[OutputRow]:
        """The requests whose loads failed under the policy "fail" finish with an error (as a
        set, as vLLM's)."""
        status = self._llmsched.RequestStatus.FINISHED_ERROR
        finished = self.scheduler.finish_requests(list(set(failing)), status) if failing else []
        return [(rid, [], "error", None) for rid in finished]

    def _report_transfers(self) -> None:
        """The runner's report: the loads the step started are in, and the KV of the
        requests sent since the previous update is sent, in the order vLLM reads them: its
        runner reports them as sets (built as the vLLM side builds them, so their order is
        the same in this process)."""
        received = list(set(self._receiving)) if self._receiving else []
        self.scheduler.finish_kv_transfers(received, list(set(self._sent)) if self._sent else [])
        self._receiving = []
        self._sent, self._sending_now = self._sending_now, []

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out = self.scheduler.schedule(
            throttle_prefills=throttle,
            external_kv=self._external_kv if self.config.kv_connector else None,
            # The parity connector's rule: KV it is sending frees blocks at the next output.
            pending_block_frees=(lambda: bool(self._sent)) if self.config.kv_connector else None,
        )
        for req_id, _, _ in out.kv_loads:
            self._load_started(req_id)
        if self.config.kv_connector and not self.config.async_scheduling:
            external = [int(n) for n in out.num_external_computed_tokens]
            first = len(out.req_ids) - len(external)
            for j, num_external in enumerate(external):
                if num_external > 0:
                    self._sync_load_done(out.req_ids[first + j])
        ids = list(out.req_ids)
        counts = [int(n) for n in out.num_scheduled_tokens]
        computed = [int(c) for c in out.num_computed_tokens]
        num_spec = [int(k) for k in out.num_spec_tokens]
        num_blocks = [int(k) for k in out.num_block_ids]
        flat_spec = [int(t) for t in out.spec_token_ids]
        flat_blocks = [int(b) for b in out.block_ids]
        spec: dict[str, list[int]] = {}
        s_off = 0
        for rid, k in zip(ids, num_spec, strict=True):
            if k:
                spec[rid] = flat_spec[s_off : s_off + k]
            s_off += k
        # One run of per-row counts per KV-cache group, group after group.
        blocks: dict[str, list[list[int]]] = {rid: [] for rid in ids}
        b_off = 0
        for at, nb in enumerate(num_blocks):
            blocks[ids[at % len(ids)]].append(flat_blocks[b_off : b_off + nb])
            b_off += nb
        summary = {
            "scheduled": list(zip(ids, counts, strict=True)),
            "total_num_scheduled_tokens": int(out.total_num_scheduled_tokens),
            "num_computed_tokens": dict(zip(ids, computed, strict=True)),
            "spec_tokens": spec,
            "new": list(out.new_req_ids),
            "resumed": list(out.resumed_req_ids),
            "preempted": sorted(out.preempted_req_ids),
            "finished": sorted(out.finished_req_ids),
            "block_ids": blocks,
            "request_counts": tuple(self.scheduler.get_request_counts()),
            "lora_ids": [int(lora) for lora in out.lora_ids],
            "structured_output": (
                [ids[i] for i in out.structured_output_rows.tolist()],
                bool(out.pending_structured_output_tokens),
            ),
            "encoder_inputs": _grouped(
                [ids[row] for row in out.encoder_input_rows.tolist()],
                out.encoder_input_ids.tolist(),
            ),
            "freed_encoder_outputs": list(out.freed_encoder_outputs),
            "kv_loads": [req_id for req_id, _, _ in out.kv_loads],
        }
        summary["block_hashes"] = self.hash_labels.admitted(
            summary, lambda rid: self.scheduler.get_request(rid).block_hashes
        )
        return out, summary

    def update(
        self, out: Any, summary: dict[str, Any], sampled: dict[str, list[int]]
    ) -> list[OutputRow]:
        ids = [rid for rid, _ in summary["scheduled"]]
        runner_output = self._llmsched.ModelRunnerOutput.from_lists(
            ids, [sampled.get(rid, []) for rid in ids]
        )
        failing = self._report_failed_loads() if self.config.kv_connector else []
        outputs = self.scheduler.update_from_output(out, runner_output)
        rows: list[OutputRow] = [
            (o.request_id, list(o.new_token_ids), o.finish_reason, o.stop_reason) for o in outputs
        ]
        if self.config.kv_connector:
            rows.extend(self._fail_failed_loads(failing))
        # The engine reports the requests whose grammar failed, after the others.
        rows.extend((rid, [], "error", None) for rid in self.scheduler.finish_failed_grammars())
        if self.config.kv_connector:
            self._release_finished_blocks(
                (row[0] for row in rows if row[2] is not None), in_update=True
            )
            self._report_transfers()
        return failures_by_id(rows, _grammar_failure_row)

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        # llmsched drops drafts given to a request that is not running, vLLM keeps them (a
        # documented deviation): the harness must never give any.
        waiting = set(self.scheduler.waiting_request_ids()).intersection(req_ids)
        if waiting:
            raise RunnerError(f"drafts for requests that are not running: {sorted(waiting)}")
        if self.structured:
            drafts = list(drafts)
            for i, rid in enumerate(req_ids):
                req = self.structured.get(rid)
                if req is None:
                    continue
                try:
                    request = self.scheduler.get_request(rid)
                except self._llmsched.UnknownRequestError:
                    continue  # finished: the core drops its drafts
                if not request.is_prefill_chunk:
                    from .grammar import grammar_valid_prefix  # imports vLLM

                    drafts[i] = grammar_valid_prefix(
                        partial(grammar_accepts, req), request.num_tokens, drafts[i]
                    )
        self.scheduler.update_draft_token_ids(req_ids, drafts)

    def abort(self, request_id: str) -> list[str]:
        status = self._llmsched.RequestStatus.FINISHED_ABORTED
        finished = list(self.scheduler.finish_requests(request_id, status))
        if self.config.kv_connector:
            self._release_finished_blocks(finished, in_update=False)
        return finished


def _grouped(keys: list[str], values: list[int]) -> dict[str, list[int]]:
    """``values`` by their ``keys``, in order."""
    out: dict[str, list[int]] = {}
    for key, value in zip(keys, values, strict=True):
        out.setdefault(key, []).append(value)
    return out


class UncacheUndoneSteps:
    """llmsched's uncaching of an undone step, emulated on one vLLM scheduler (a patch of
    that instance only; documented deviation, see the module docstring).

    vLLM registers a block in the prefix cache as soon as ``allocate_slots`` gives a
    request the slots for the tokens that fill it, before the step runs. When the running
    loop of the priority policy preempts a victim it had already scheduled in this step, it
    undoes the victim's step and frees its blocks, but the blocks that allocation registered
    stay cached: their KV is never computed, a later prefix hit (the victim's own, when it
    resumes, or another request's) reads it, and the free queue takes them at its tail as
    cached blocks. llmsched takes them out of the cache before freeing them (so they go to
    the head, as plain blocks). This patch makes vLLM do the same:

    - ``schedule`` forgets, as each step starts, what the previous step allocated;
    - ``kv_cache_manager.allocate_slots``, when it gives a RUNNING request its slots (only
      the running loop allocates for a running request), remembers how many of the
      request's blocks were cached before the call (``num_cached_block``);
    - ``_preempt_request``, for a victim that got its slots in this step, first evicts the
      blocks that allocation cached, ``req_to_blocks[before:num_cached_block]``, from the
      prefix cache (``BlockPool._maybe_evict_cached_block``: their hashes leave
      ``cached_block_hash_to_block`` and the block hash is reset) and sets the request's
      ``num_cached_block`` back to ``before``; vLLM then frees the blocks as usual.

    A request that preempts itself did not get its slots in the step: nothing to uncache,
    as in llmsched. ``take_count`` returns the blocks uncached since it was last called.
    Every KV-cache group alike (a sliding window's blocks it never cached stay uncached);
    needs prefix caching on.
    """

    def __init__(self, scheduler: Any) -> None:
        from vllm.v1.request import RequestStatus

        manager = scheduler.kv_cache_manager
        groups = manager.coordinator.single_type_managers
        pool = manager.block_pool
        cached_before: dict[str, list[int]] = {}
        self._count = 0
        original_schedule = scheduler.schedule
        original_allocate = manager.allocate_slots
        original_preempt = scheduler._preempt_request

        def schedule(*args: Any, **kwargs: Any) -> Any:
            cached_before.clear()
            return original_schedule(*args, **kwargs)

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            running = request.status == RequestStatus.RUNNING
            before = [group.num_cached_block.get(request.request_id, 0) for group in groups]
            new_blocks = original_allocate(request, *args, **kwargs)
            if running and new_blocks is not None:
                cached_before[request.request_id] = before
            return new_blocks

        def preempt_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            befores = cached_before.pop(request.request_id, None)
            for group, before in zip(groups, befores or (), strict=False):
                after = group.num_cached_block.get(request.request_id, 0)
                for block in group.req_to_blocks[request.request_id][before:after]:
                    if not block.is_null and pool._maybe_evict_cached_block(block):
                        self._count += 1
                group.num_cached_block[request.request_id] = min(before, after)
            return original_preempt(request, *args, **kwargs)

        scheduler.schedule = schedule
        manager.allocate_slots = allocate_slots
        scheduler._preempt_request = preempt_request

    def take_count(self) -> int:
        count, self._count = self._count, 0
        return count


def failures_by_id(rows: list[Any], is_failure: Callable[[Any], bool]) -> list[Any]:
    """``rows`` with the requests failed outside the per-request outputs (a grammar that
    did not compile) sorted by id: vLLM's scheduler finishes those in the order of a set
    of ids (which the process's hash seed decides), after every other output."""
    failed = sorted((row for row in rows if is_failure(row)), key=str)
    return [row for row in rows if not is_failure(row)] + failed


def _grammar_failure_row(row: OutputRow) -> bool:
    return row[2] == "error" and not row[1]


def output_rows(engine_outputs: dict[int, Any]) -> list[OutputRow]:
    """A step's ``EngineCoreOutputs`` (every client's) as the summary's ``outputs`` rows."""
    rows = []
    for client_outputs in engine_outputs.values():
        for o in client_outputs.outputs:
            reason = None if o.finish_reason is None else str(o.finish_reason)
            rows.append((o.request_id, list(o.new_token_ids), reason, o.stop_reason))
    return failures_by_id(rows, _grammar_failure_row)


class VllmSide:
    """vLLM 0.33.0's ``Scheduler``/``AsyncScheduler`` (``llmsched.bench.vllm_reference``), with
    llmsched's uncaching of undone steps emulated (:class:`UncacheUndoneSteps`) when prefix
    caching is on, unless ``emulate_uncache`` is False (vLLM exactly as released)."""

    name = "vllm"

    def __init__(self, config: ParityConfig, *, emulate_uncache: bool = True) -> None:
        self.ref = vllm_reference()
        if self.ref.EOS_TOKEN_ID != EOS_TOKEN_ID:
            raise AssertionError("vllm_reference.EOS_TOKEN_ID changed")
        from vllm.v1.outputs import DraftTokenIds

        self._draft_token_ids = DraftTokenIds
        self.config = config
        scheduler = self.ref.make_vllm_scheduler(**config.scheduler_kwargs())
        self.uncache = (
            UncacheUndoneSteps(scheduler)
            if emulate_uncache and config.enable_prefix_caching
            else None
        )
        self.scheduler = scheduler
        self.hash_labels = HashLabels()
        from .grammar import install_parity_backend  # imports vLLM

        install_parity_backend(scheduler.structured_output_manager)
        # Each structured-output request's grammar, compiling until the loop says.
        self.grammars: dict[str, Any] = {}

    def block_hashes(self, req_id: str) -> Sequence[Any]:
        """The prefix-cache hashes of a live request, as vLLM computes them."""
        return self.scheduler.requests[req_id].block_hashes  # type: ignore[no-any-return]

    def add(self, req: ParityRequest) -> None:
        request = self.ref.make_vllm_request(
            req.request_id,
            req.prompt,
            max_tokens=req.max_tokens,
            eos_token_id=EOS_TOKEN_ID,
            stop_token_ids=() if req.stop_token_id is None else (req.stop_token_id,),
            arrival_time=req.arrival_time,
            priority=req.priority,
            block_size=self.config.block_size,
            prefix_caching=self.config.enable_prefix_caching,
            lora_id=req.lora_id,
            cache_salt=req.cache_salt,
            skip_reading_prefix_cache=req.skip_reading_prefix_cache,
            structured_output=req.grammar_at is not None,
            pooling=self.config.pooling,
            report_reused_blocks=req.report_reused_blocks,
            num_hash_lookahead_tokens=self.config.drafter_kwargs().get(
                "num_hash_lookahead_tokens", 0
            ),
            mm_inputs=req.mm_inputs,
            resumable=req.resumable,
            diffusion_canvas_length=req.diffusion_canvas_length,
            diffusion_read_steps=req.diffusion_read_steps,
        )
        if request.structured_output_request is not None:
            from concurrent.futures import Future

            self.grammars[req.request_id] = request.structured_output_request.grammar = Future()
        self.scheduler.add_request(request)

    def add_input(self, req: ParityRequest, later: SessionInput | None) -> None:
        """A session's next input (None: its end: an input that is not resumable, as vLLM's
        engine sends once the input stream closes), added under its id."""
        request = self.ref.make_vllm_request(
            req.request_id,
            (0,) if later is None else later.prompt,
            max_tokens=1 if later is None else later.max_tokens,
            eos_token_id=EOS_TOKEN_ID,
            arrival_time=req.arrival_time if later is None else later.arrival_time,
            block_size=self.config.block_size,
            prefix_caching=self.config.enable_prefix_caching,
            num_hash_lookahead_tokens=self.config.drafter_kwargs().get(
                "num_hash_lookahead_tokens", 0
            ),
            resumable=later is not None,
        )
        self.scheduler.add_request(request)

    def compile_grammar(self, req: ParityRequest) -> None:
        """The engine is done compiling ``req``'s grammar: vLLM's scheduler finds out when
        its waiting loop next reaches the request."""
        from .grammar import GRAMMAR_ERROR, ParityGrammar

        future = self.grammars.pop(req.request_id)
        if req.grammar_fails:
            future.set_exception(RuntimeError(GRAMMAR_ERROR))
        else:
            future.set_result(ParityGrammar(partial(grammar_accepts, req), req.prompt_len, req.key))

    def has_requests(self) -> bool:
        return bool(self.scheduler.has_requests())

    def schedule(self, throttle: bool = False) -> tuple[Any, dict[str, Any]]:
        out = self.scheduler.schedule(throttle_prefills=throttle)
        summary = self.ref.step_summary(out)
        num_groups = len(self.scheduler.kv_cache_config.kv_cache_groups)
        blocks: dict[str, list[list[int]]] = {}
        for new_req in out.scheduled_new_reqs:
            blocks[new_req.req_id] = [[int(b) for b in group] for group in new_req.block_ids]
        cached = out.scheduled_cached_reqs
        for rid, new_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            blocks[rid] = (
                [[] for _ in range(num_groups)]
                if new_ids is None
                else [[int(b) for b in group] for group in new_ids]
            )
        summary["block_ids"] = {rid: blocks[rid] for rid, _ in summary["scheduled"]}
        summary["request_counts"] = tuple(self.scheduler.get_request_counts())
        requests = self.scheduler.requests
        adapters = {requests[rid].lora_request for rid in out.num_scheduled_tokens}
        summary["lora_ids"] = sorted(a.lora_int_id for a in adapters if a is not None)
        # The rows vLLM's get_grammar_bitmask picks, read from vLLM's requests right after
        # the step (as its engine asks for the bitmask).
        structured = [
            rid
            for rid in out.num_scheduled_tokens
            if requests[rid].use_structured_output and not requests[rid].is_prefill_chunk
        ]
        if bool(structured) != out.has_structured_output_requests:
            raise AssertionError("vLLM's has_structured_output_requests disagrees with its rows")
        summary["structured_output"] = (structured, out.pending_structured_output_tokens)
        summary["encoder_inputs"] = {
            rid: list(inputs) for rid, inputs in out.scheduled_encoder_inputs.items()
        }
        summary["freed_encoder_outputs"] = list(out.free_encoder_mm_hashes)
        summary["kv_loads"] = (
            self.scheduler.connector.take_loads_started() if self.config.kv_connector else []
        )
        summary["block_hashes"] = self.hash_labels.admitted(summary, self.block_hashes)
        # Not compared (vLLM's side only): what the emulation of llmsched uncached.
        summary["uncached_blocks"] = 0 if self.uncache is None else self.uncache.take_count()
        return out, summary

    def update(
        self, out: Any, summary: dict[str, Any], sampled: dict[str, list[int]]
    ) -> list[OutputRow]:
        engine_outputs = self.scheduler.update_from_output(out, self._runner_output(out, sampled))
        return output_rows(engine_outputs)

    def _runner_output(self, out: Any, sampled: dict[str, list[int]]) -> Any:
        """vLLM's ``ModelRunnerOutput`` for ``out``; with the parity connector, reporting
        the KV it has sent since the previous output."""
        output = self.ref.vllm_runner_output(out, sampled, pooling=self.config.pooling)
        if self.config.kv_connector:
            from vllm.v1.outputs import KVConnectorOutput

            connector = self.scheduler.connector
            sent, received = connector.take_sent(), connector.take_received()
            failed, invalid = connector.take_failed()
            output.kv_connector_output = KVConnectorOutput(
                finished_sending=set(sent) or None,
                finished_recving=set(received) or None,
                failed_recving=set(failed) or None,
                invalid_block_ids=set(invalid) or None,
            )
        return output

    def update_draft_token_ids(self, req_ids: list[str], drafts: list[list[int]]) -> None:
        self.scheduler.update_draft_token_ids(self._draft_token_ids(req_ids, drafts))

    def abort(self, request_id: str) -> list[str]:
        from vllm.v1.request import RequestStatus

        finished = self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        return [r.request_id for r in finished]


# ----------------------------------------------------------------------------- driver


@dataclass(slots=True)
class RunResult:
    side: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    """The exception (type, message, innermost frames) that ended the run early, if any."""


def drive(
    side_factory: Callable[[ParityConfig], Any],
    config: ParityConfig,
    requests: Sequence[ParityRequest],
) -> RunResult:
    """Replay ``requests`` through one scheduler with the shared runner and engine loop."""
    side = side_factory(config)
    result = RunResult(side=side.name)
    runner = Runner(config)
    pending = deque(sorted(requests, key=lambda r: r.arrival_step))  # stable: workload order
    aborts: dict[int, list[str]] = {}
    for req in requests:
        if req.abort_step is not None:
            aborts.setdefault(req.abort_step, []).append(req.request_id)
    grammars: dict[int, list[ParityRequest]] = {}
    for req in requests:
        if req.grammar_at is not None:
            grammars.setdefault(max(req.grammar_at, req.arrival_step), []).append(req)
    # Sessions' later inputs, and their ends (None), by loop iteration.
    inputs: dict[int, list[tuple[ParityRequest, SessionInput | None]]] = {}
    for req in requests:
        for later in req.inputs:
            inputs.setdefault(later.step, []).append((req, later))
        if req.end_step is not None:
            inputs.setdefault(req.end_step, []).append((req, None))
    aborted: list[str] = []
    in_flight: deque[tuple[Any, dict[str, Any], dict[str, list[int]]]] = deque()
    iteration = 0
    try:
        while True:
            while pending and pending[0].arrival_step <= iteration:
                req = pending.popleft()
                side.add(req)
                runner.add(req)
            for rid in aborts.pop(iteration, ()):
                aborted.extend(side.abort(rid))
            for req in grammars.pop(iteration, ()):
                side.compile_grammar(req)
            for req, later in inputs.pop(iteration, ()):
                side.add_input(req, later)
                if later is not None:
                    runner.add_input(req.request_id, later.prompt)
            if (
                not pending
                and not in_flight
                and not side.has_requests()
                and not grammars
                and not inputs
            ):
                break
            if iteration >= MAX_LOOP_ITERATIONS:
                raise RuntimeError(f"no end after {iteration} loop iterations")
            iteration += 1
            if not config.async_scheduling and config.pipeline_parallel_size == 1:
                if not side.has_requests():
                    continue  # idle until the next arrival
                out, summary = side.schedule(config.throttles(len(result.steps)))
                summary["aborted"], aborted = aborted, []
                sampled, drafts = runner.execute(summary)
                result.steps.append(summary)
                summary["outputs"] = side.update(out, summary, sampled)
                runner.delivered(summary["outputs"])
                if drafts is not None:
                    # Not for a request whose output stopped: finished, both schedulers drop
                    # them; a session going on, vLLM would keep them for its next input and
                    # llmsched drops them (a deliberate deviation, kept out here).
                    stopped = {row[0] for row in summary["outputs"] if row[2] is not None}
                    kept = [
                        (rid, draft)
                        for rid, draft in zip(*drafts, strict=True)
                        if rid not in stopped
                    ]
                    side.update_draft_token_ids([r for r, _ in kept], [d for _, d in kept])
                continue
            # Async or pipeline stages: a batch queue (of two, or one per stage), as
            # EngineCore.step_with_batch_queue: schedule whenever the scheduler has requests
            # (the queue is never full here); do not wait for the oldest step while the
            # queue has room and the new step ran something or more can be scheduled.
            depth = config.max_concurrent_batches()
            if side.has_requests():
                out, summary = side.schedule(config.throttles(len(result.steps)))
                summary["aborted"], aborted = aborted, []
                sampled, _ = runner.execute(summary)
                summary["outputs"] = None
                result.steps.append(summary)
                in_flight.append((out, summary, sampled))
                if len(in_flight) < depth and (
                    summary["total_num_scheduled_tokens"] > 0 or side.has_requests()
                ):
                    continue
            elif not in_flight:
                continue  # idle until the next arrival
            out, summary, sampled = in_flight.popleft()
            summary["outputs"] = side.update(out, summary, sampled)
            runner.delivered(summary["outputs"])
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)[-3:]
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames)
        result.error = f"{type(exc).__name__}: {exc} [{where}]"
    return result


# ----------------------------------------------------------------------------- comparison


@dataclass(slots=True)
class Comparison:
    steps_compared: int
    steps_identical: int
    first_difference: int | None
    """Index of the first step that differs (or exists on one side only), None if none."""
    detail: dict[str, Any] = field(default_factory=dict)
    """At the first difference: per differing key, ``{"vllm": ..., "llmsched": ...}``."""
    vllm_error: str | None = None
    llmsched_error: str | None = None

    @property
    def identical(self) -> bool:
        return (
            self.first_difference is None
            and self.vllm_error is None
            and self.llmsched_error is None
        )


def _diff_value(a: Any, b: Any) -> tuple[Any, Any]:
    """Trim two differing values to what differs (dicts: differing keys only)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        return {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys}
    return a, b


def compare(
    vllm_run: RunResult, llmsched_run: RunResult, keys: Sequence[str] = STEP_KEYS
) -> Comparison:
    """Line up two runs step by step over ``keys`` (the summary's, by default)."""
    a, b = vllm_run.steps, llmsched_run.steps
    identical = 0
    first: int | None = None
    detail: dict[str, Any] = {}
    for i in range(max(len(a), len(b))):
        sa = a[i] if i < len(a) else None
        sb = b[i] if i < len(b) else None
        if sa is not None and sb is not None and all(sa[k] == sb[k] for k in keys):
            identical += 1
            continue
        if first is None:
            first = i
            if sa is None or sb is None:
                detail = {"missing_on": "vllm" if sa is None else "llmsched"}
            else:
                for k in keys:
                    if sa[k] != sb[k]:
                        va, vb = _diff_value(sa[k], sb[k])
                        detail[k] = {"vllm": va, "llmsched": vb}
                detail["scheduled_vllm"] = sa["scheduled"]
    return Comparison(
        steps_compared=max(len(a), len(b)),
        steps_identical=identical,
        first_difference=first,
        detail=detail,
        vllm_error=vllm_run.error,
        llmsched_error=llmsched_run.error,
    )


def coverage(run: RunResult) -> dict[str, int]:
    """What one run exercised (counted on one side's steps)."""
    counts = {
        "steps": len(run.steps),
        "empty_steps": 0,
        "preemptions": 0,
        "resumptions": 0,
        "prefix_hit_admissions": 0,
        "draft_slots": 0,
        "padded_admissions": 0,
        "finished_stop": 0,
        "finished_length": 0,
        "uncached_blocks": 0,
        "encoded_images": 0,
        "evicted_images": 0,
        "kv_loads_started": 0,
    }
    for step in run.steps:
        counts["encoded_images"] += sum(len(i) for i in step["encoder_inputs"].values())
        counts["evicted_images"] += len(step["freed_encoder_outputs"])
        counts["kv_loads_started"] += len(step["kv_loads"])
        counts["uncached_blocks"] += step.get("uncached_blocks", 0)
        counts["empty_steps"] += step["total_num_scheduled_tokens"] == 0
        counts["preemptions"] += len(step["preempted"])
        counts["resumptions"] += len(step["resumed"])
        admitted = [*step["new"], *step["resumed"]]
        counts["prefix_hit_admissions"] += sum(
            step["num_computed_tokens"][rid] > 0 for rid in admitted
        )
        counts["draft_slots"] += sum(len(t) for t in step["spec_tokens"].values())
        counts["padded_admissions"] += sum(rid in step["spec_tokens"] for rid in admitted)
        for _, _, reason, _ in step["outputs"] or ():
            if reason == "stop":
                counts["finished_stop"] += 1
            elif reason == "length":
                counts["finished_length"] += 1
    return counts


def run_case(
    config: ParityConfig, requests: Sequence[ParityRequest], *, allow_deviations: bool = False
) -> tuple[Comparison, RunResult, RunResult]:
    """Both sides on one case, and their comparison. Raises ``ValueError`` if the case
    would reach a deviation the harness keeps out (:func:`deviation_triggers`), unless
    ``allow_deviations`` (the tests that trigger one on purpose)."""
    if not allow_deviations:
        found = deviation_triggers(config, requests)
        if found:
            raise ValueError(f"{config.name}: the case reaches a deviation: " + "; ".join(found))
    vllm_run = drive(VllmSide, config, requests)
    llmsched_run = drive(LlmschedSide, config, requests)
    return compare(vllm_run, llmsched_run), vllm_run, llmsched_run


def describe(comparison: Comparison, context: int = 0, runs: Iterable[RunResult] = ()) -> str:
    """A human-readable account of a comparison (for assertion messages and the report)."""
    lines = [f"steps compared {comparison.steps_compared}, identical {comparison.steps_identical}"]
    if comparison.vllm_error:
        lines.append(f"vLLM raised: {comparison.vllm_error}")
    if comparison.llmsched_error:
        lines.append(f"llmsched raised: {comparison.llmsched_error}")
    if comparison.first_difference is not None:
        lines.append(f"first difference at step {comparison.first_difference}:")
        for key, value in comparison.detail.items():
            lines.append(f"  {key}: {value}")
        if context:
            start = max(0, comparison.first_difference - context)
            for run in runs:
                for i in range(start, comparison.first_difference):
                    if i < len(run.steps):
                        lines.append(f"  [{run.side} step {i}] {run.steps[i]['scheduled']}")
    return "\n".join(lines)
