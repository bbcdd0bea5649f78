"""The parity matrix: workloads (synthetic presets and public traces) x scheduler configs.

Workloads (24 requests each unless noted), lengths scaled down to keep runs short:

- ``synthetic-conv``, ``synthetic-code``: ``llmsched.sim.workload.synthetic`` presets;
- ``synthetic-chat``: the conversation preset with short prompts and long outputs, so
  that many requests decode at once (budget contention, draft truncation);
- ``azure-conv``, ``azure-code``: the first requests of the Azure LLM inference trace 2023;
- ``mooncake``: the first requests of the Mooncake conversation trace, prompts built from
  ``hash_ids`` by ``RequestSpec.prompt_token_ids`` and then cut to a fraction of their
  length: a prompt's first tokens are kept, so prompts that share leading ``hash_ids``
  still share their (shortened) prefix (here every request shares block 0, i.e. up to 512
  tokens);
- ``mooncake-turns``: later Mooncake requests that continue an earlier conversation (they
  share several leading ``hash_ids`` with it), each next to the request it continues, so
  prefix-cache hits go deep;
- ``shuffled-blocks`` (edge cases only): prompts made of a few 16-token blocks of a
  five-block alphabet, in any order and repeated, some the previous prompt shifted by a
  few blocks: the same tokens recur under other prefixes, so a prefix hit must follow the
  blocks' parent chain, not their tokens alone.

Prompts are cut to ``ceil(len / prompt_scale)`` tokens (a prefix of the trace's prompt),
outputs to ``min(ceil(len / output_scale), output_cap)``. Arrival times are kept (their
relative order: the priority policy's tie-breaker) and mapped to loop iterations spread
over ``arrival_span`` iterations. Some requests get an EOS or a stop token at a planted
output index; with the priority policy every request gets a priority in {0, 1, 2}, and
requests that would tie on ``(priority, arrival_time)`` (the trace's equal timestamps, the
extra requests that copy an earlier one's arrival) are moved apart by the smallest float
step (``harness.unique_priority_keys``): on a tie llmsched deliberately picks another
priority victim than vLLM.

Configs: every combination of sync/async scheduling, ``K`` in {0, 1, 3} (ngram-style
drafts), prefix caching on/off, FCFS/priority, and a roomy or a small KV pool (KV
pressure: preemption), plus a few edge cases (:func:`edge_cases`).
"""

from __future__ import annotations

import math
import os
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .harness import (
    ParityConfig,
    ParityRequest,
    SessionInput,
    blocks_needed,
    unique_priority_keys,
)

if TYPE_CHECKING:
    from llmsched.sim.workload import RequestSpec

__all__ = [
    "WORKLOADS",
    "Case",
    "WorkloadDef",
    "base_cases",
    "build_requests",
    "case_by_id",
    "case_params",
    "cases",
    "edge_cases",
    "missing_trace",
]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("LLMSCHED_TRACES", _PROJECT_ROOT.parent / "shared" / "traces"))


@dataclass(frozen=True, slots=True)
class WorkloadDef:
    name: str
    source: str
    """A ``llmsched.sim.workload`` preset, ``trace:<relative path>`` or ``turns:<path>``."""
    num_requests: int = 24
    prompt_scale: int = 4
    output_scale: int = 4
    output_cap: int = 96
    arrival_span: int = 40
    pressure_output_factor: int = 4
    """Under KV pressure, outputs are this many times longer (decode growth preempts)."""
    pressure_blocks: int | None = None
    """The tight pool's size, if not three average prompts' worth of blocks."""
    cross_product: bool = True
    """Whether :func:`base_cases` runs it under every config (else edge cases only)."""


WORKLOADS: dict[str, WorkloadDef] = {
    w.name: w
    for w in (
        WorkloadDef("synthetic-conv", "azure-conv"),
        # Short prompts, long outputs: many requests decode at once.
        WorkloadDef(
            "synthetic-chat",
            "azure-conv",
            num_requests=32,
            prompt_scale=128,
            output_scale=2,
            output_cap=160,
            arrival_span=30,
            pressure_output_factor=2,
            pressure_blocks=40,
        ),
        WorkloadDef(
            "synthetic-code",
            "azure-code",
            output_scale=1,
            output_cap=48,
            pressure_output_factor=8,
        ),
        WorkloadDef("azure-conv", "trace:azure-llm-2023/conv.csv"),
        WorkloadDef(
            "azure-code",
            "trace:azure-llm-2023/code.csv",
            output_scale=1,
            output_cap=48,
            pressure_output_factor=8,
        ),
        WorkloadDef(
            "mooncake",
            "trace:mooncake-fast25/conversation.jsonl",
            prompt_scale=8,
            output_scale=8,
            output_cap=64,
        ),
        WorkloadDef(
            "mooncake-turns",
            "turns:mooncake-fast25/conversation.jsonl",
            num_requests=16,
            prompt_scale=8,
            output_scale=8,
            output_cap=48,
        ),
        WorkloadDef(
            "shuffled-blocks",
            "blocks:16",
            prompt_scale=1,
            output_scale=1,
            output_cap=40,
            arrival_span=30,
            cross_product=False,
        ),
    )
}


def missing_trace(workload: str) -> str | None:
    """Why ``workload`` cannot be built here (its trace file is absent), or None.

    The traces are the workplace's (``../shared/traces`` beside the clone, or
    ``LLMSCHED_TRACES``); the synthetic workloads need none.
    """
    kind, _, rel = WORKLOADS[workload].source.partition(":")
    if kind in ("trace", "turns") and not (TRACES / rel).is_file():
        return f"trace {TRACES / rel} not found (set LLMSCHED_TRACES)"
    return None


@dataclass(frozen=True, slots=True)
class _BlockSpec:
    """A request of a ``blocks:`` workload (the fields of ``RequestSpec`` it needs)."""

    request_id: str
    arrival_time: float
    prompt: tuple[int, ...]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.prompt


def _block_specs(workload: WorkloadDef, block_tokens: int) -> list[_BlockSpec]:
    """Prompts of two to six blocks of ``block_tokens`` tokens from an alphabet of five, in
    any order and repeated, and a tail of the request's own; two in five are instead the
    previous prompt without its first blocks (its later blocks first here), plus a few
    more. Some prompts share a true prefix (hits), many hold another prompt's blocks under
    another prefix (no hit: the parent differs)."""
    rng = random.Random(zlib.crc32(workload.name.encode()))
    alphabet = [tuple(rng.randrange(10, 32000) for _ in range(block_tokens)) for _ in range(5)]
    specs = []
    previous: list[int] = []
    for i in range(workload.num_requests):
        if len(previous) > 1 and rng.random() < 0.4:
            letters = previous[rng.randrange(1, len(previous)) :]
            letters += [rng.randrange(5) for _ in range(rng.randrange(3))]
        else:
            letters = [rng.randrange(5) for _ in range(rng.randrange(2, 7))]
        previous = letters
        tail = tuple(rng.randrange(10, 32000) for _ in range(rng.randrange(block_tokens)))
        prompt = tuple(t for letter in letters for t in alphabet[letter]) + tail
        specs.append(_BlockSpec(f"blocks-{i}", float(i), prompt, rng.randrange(4, 40)))
    return specs


def _trace_specs(workload: WorkloadDef) -> list[RequestSpec] | list[_BlockSpec]:
    from llmsched.sim import workload as wl

    kind, _, rel = workload.source.partition(":")
    if kind == "blocks":
        return _block_specs(workload, int(rel))
    if not kind or not rel:
        return wl.synthetic(
            workload.source, num_requests=workload.num_requests, seed=zlib.crc32(b"parity")
        ).requests
    path = TRACES / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path}: trace not found (set LLMSCHED_TRACES)")
    if kind == "trace":
        return wl.load_workload(str(path), limit=workload.num_requests).requests
    # turns: pairs (earlier request, later request continuing it), in trace order.
    specs = wl.load_mooncake_jsonl(path, limit=600).requests
    chosen: dict[int, RequestSpec] = {}
    for i, spec in enumerate(specs):
        if len(chosen) >= workload.num_requests:
            break
        for j in range(i - 1, max(-1, i - 300), -1):
            other = specs[j].prefix_blocks
            shared = 0
            for x, y in zip(other, spec.prefix_blocks, strict=False):
                if x != y:
                    break
                shared += 1
            if shared >= 3:
                chosen.setdefault(j, specs[j])
                chosen.setdefault(i, spec)
                break
    ordered = [chosen[k] for k in sorted(chosen)][: workload.num_requests]
    # Bring the pair members close in time: keep the order, space them evenly.
    return [replace(spec, arrival_time=float(i)) for i, spec in enumerate(ordered)]


@cache
def _base_requests(name: str) -> tuple[ParityRequest, ...]:
    """The workload's requests with priority 0 (independent of the config)."""
    workload = WORKLOADS[name]
    specs = _trace_specs(workload)
    rng = random.Random(zlib.crc32(name.encode()))
    t0 = min(s.arrival_time for s in specs)
    t_max = max(s.arrival_time for s in specs) - t0
    out = []
    for spec in specs:
        prompt_len = max(1, math.ceil(spec.prompt_len / workload.prompt_scale))
        prompt = tuple(int(t) for t in spec.prompt_token_ids()[:prompt_len])
        max_tokens = max(
            1, min(math.ceil(spec.output_len / workload.output_scale), workload.output_cap)
        )
        rel = spec.arrival_time - t0
        arrival_step = round(rel / t_max * workload.arrival_span) if t_max > 0 else 0
        u = rng.random()
        eos_at = stop_id = stop_at = None
        if u < 0.2:
            eos_at = rng.randrange(max_tokens)
        elif u < 0.35:
            stop_id = rng.randrange(3, 10)
            stop_at = rng.randrange(max_tokens)
        out.append(
            ParityRequest(
                request_id=spec.request_id,
                prompt=prompt,
                max_tokens=max_tokens,
                arrival_step=arrival_step,
                arrival_time=float(spec.arrival_time),
                priority=rng.randrange(3),  # replaced by 0 under FCFS
                eos_at=eos_at,
                stop_token_id=stop_id,
                stop_at=stop_at,
            )
        )
    out.extend(_extra_requests(out, rng))
    return tuple(out)


def _extra_requests(base: list[ParityRequest], rng: random.Random) -> list[ParityRequest]:
    """Requests added to every workload for the rules a trace rarely reaches, and aborts.

    - Three repeats of earlier prompts, cut to ``16 k + 1`` tokens and arriving a few
      steps later: with prefix caching they hit ``16 k`` tokens and leave one to compute,
      which is what the waiting loop pads to ``1 + K``.
    - A repeat cut to a whole number of blocks (the hit stops one block short).
    - Two one-token prompts (padded too, when a running request is scheduled).
    - Two requests with ``max_tokens=1``.
    - Two requests aborted a few steps after they arrive.
    """
    extra: list[ParityRequest] = []
    for i, tail in ((1, 1), (len(base) // 2, 1), (len(base) - 3, 1), (4, 0)):
        src = base[i]
        k = max(1, (src.prompt_len - 1) // 16)
        extra.append(
            replace(
                src,
                request_id=f"{src.request_id}-again",
                prompt=src.prompt[: 16 * k + tail],
                max_tokens=8,
                arrival_step=src.arrival_step + 4 + i % 5,
                arrival_time=src.arrival_time + 0.5,
                eos_at=None,
                stop_token_id=None,
                stop_at=None,
            )
        )
    for j, src in enumerate((base[2], base[len(base) // 3])):
        extra.append(
            replace(
                src,
                request_id=f"tiny-{j}",
                prompt=src.prompt[:1],
                max_tokens=6,
                arrival_step=src.arrival_step + 2,
                eos_at=None,
                stop_token_id=None,
                stop_at=None,
            )
        )
    for j, src in enumerate((base[3], base[-2])):
        extra.append(
            replace(
                src,
                request_id=f"one-{j}",
                prompt=src.prompt[: 1 + src.prompt_len // 2],
                max_tokens=1,
                arrival_step=src.arrival_step + 1,
            )
        )
    for i in rng.sample(range(len(base)), 2):
        base[i] = replace(base[i], abort_step=base[i].arrival_step + rng.randrange(2, 15))
    return extra


@dataclass(frozen=True, slots=True)
class Case:
    """One workload under one config."""

    workload: str
    config: ParityConfig
    output_factor: int = 1
    lora_adapters: int = 0
    """LoRA adapters the requests run under (ids 1..n, round robin), every third request
    under none."""
    cache_salts: int = 0
    """Cache salts the requests carry (round robin), every third request none."""
    prefix_cache_skippers: bool = False
    """Every fourth request skips reading the prefix cache (as for prompt logprobs)."""
    structured_output: bool = False
    """Two requests in three use structured output: the engine compiles a grammar 0 to 3
    loop iterations after the request arrives; one grammar in seven fails to compile."""
    hit_reporters: bool = False
    """Every second request asks for KV cache events of its prefix hits."""
    images: int = 0
    """Distinct images (the config's largest, ``image_side ** 2`` placeholder tokens each)
    the requests carry: two requests in three hold one or two of them (round robin, so
    requests share images), and every fourth resends the previous request's prompt and
    images when they fit it (prefix hits through images)."""
    sessions: bool = False
    """One request in three is a streaming-input session with one to three later inputs
    (see :func:`with_sessions`)."""

    @property
    def id(self) -> str:
        return f"{self.workload}/{self.config.name}"

    def requests(self) -> list[ParityRequest]:
        out = build_requests(self.workload, self.config, output_factor=self.output_factor)
        if self.lora_adapters:
            out = [
                replace(r, lora_id=None if i % 3 == 2 else 1 + i % self.lora_adapters)
                for i, r in enumerate(out)
            ]
        if self.cache_salts:
            out = [
                replace(r, cache_salt=None if i % 3 == 0 else f"salt-{i % self.cache_salts}")
                for i, r in enumerate(out)
            ]
        if self.prefix_cache_skippers:
            out = [replace(r, skip_reading_prefix_cache=i % 4 == 1) for i, r in enumerate(out)]
        if self.structured_output:
            out = [
                r
                if i % 3 == 0
                else replace(r, grammar_at=r.arrival_step + i % 4, grammar_fails=i % 7 == 1)
                for i, r in enumerate(out)
            ]
        if self.hit_reporters:
            out = [replace(r, report_reused_blocks=i % 2 == 0) for i, r in enumerate(out)]
        if self.images:
            out = with_images(out, self.images, self.config.image_side**2)
        if self.sessions:
            out = with_sessions(out, self.config)
        if self.config.diffusion:
            out = with_diffusion(out, self.config.num_speculative_tokens)
        return out


def with_diffusion(requests: list[ParityRequest], canvas: int) -> list[ParityRequest]:
    """``requests`` for a diffusion model of ``canvas`` positions: every third asks for half
    the canvas, every fourth is a read of one or two denoising steps (with steps in flight,
    one step's read waits for its output)."""
    return [
        replace(
            r,
            diffusion_canvas_length=max(1, canvas // 2) if i % 3 == 1 else None,
            diffusion_read_steps=1 + i // 4 % 2 if i % 4 == 2 else None,
        )
        for i, r in enumerate(requests)
    ]


#: The token an image's placeholders hold in a prompt (llava's ``<image>``).
IMAGE_TOKEN = 32000


def with_images(requests: list[ParityRequest], images: int, length: int) -> list[ParityRequest]:
    """``requests`` with images of ``length`` placeholder tokens (see ``Case.images``)."""
    out: list[ParityRequest] = []
    counter = 0
    for i, r in enumerate(requests):
        previous = out[-1] if out else None
        if i % 4 == 3 and previous is not None and previous.prompt_len <= r.prompt_len:
            out.append(replace(r, prompt=previous.prompt, mm_inputs=previous.mm_inputs))
            continue
        if i % 3 == 2 or r.prompt_len <= length:
            out.append(r)
            continue
        prompt = list(r.prompt)
        inputs = []
        # The first image somewhere in the first half, a second after it if it fits.
        offset = (i * 7) % max(1, (r.prompt_len - length) // 2 + 1)
        for _ in range(1 + i % 2):
            if offset + length > r.prompt_len:
                break
            identifier = f"image-{counter % images}"
            counter += 1
            prompt[offset : offset + length] = [IMAGE_TOKEN] * length
            inputs.append((identifier, offset, length))
            offset += length + 1 + i % 5
        out.append(replace(r, prompt=tuple(prompt), mm_inputs=tuple(inputs)))
    return out


def with_sessions(requests: list[ParityRequest], config: ParityConfig) -> list[ParityRequest]:
    """``requests`` with one in three a streaming-input session: no planted stop (its
    inputs end at ``max_tokens``), one to three later inputs (1 to 33 tokens, up to 12
    outputs each), each added 1 to 30 or 40 to 120 loop iterations after the one before (so
    some wait their turn behind a running input, and some find the session waiting), then
    its end; one session in seven is aborted after its first input instead. A session stays
    within ``max_model_len`` and half the usable pool, as :func:`build_requests` keeps every
    request; under the priority policy its inputs keep its arrival time (vLLM re-keys a
    queued request in place)."""
    limit = min(
        config.max_model_len - 1,
        (config.num_gpu_blocks - 1) // 2 * config.block_size - config.num_speculative_tokens,
    )
    out = []
    for i, r in enumerate(requests):
        if i % 3 != 1:
            out.append(r)
            continue
        rng = random.Random(zlib.crc32(r.request_id.encode()))
        step, total, inputs = r.arrival_step, r.longest, []
        for j in range(rng.randint(1, 3)):
            # Soon (queued behind the running input) or late (the session waits for it).
            step += rng.randint(1, 30) if rng.random() < 0.5 else rng.randint(40, 120)
            length, max_tokens = rng.choice((1, 3, 7, 16, 33)), rng.randint(1, 12)
            if total + length + max_tokens > limit:
                break
            total += length + max_tokens
            prompt = tuple(rng.randrange(10, 32000) for _ in range(length))
            arrival = r.arrival_time + (0 if config.policy == "priority" else j + 1)
            inputs.append(SessionInput(step, prompt, max_tokens, arrival))
        abort_step = end_step = None
        if i % 7 == 1 and inputs:
            abort_step = inputs[0].step + rng.randint(0, 20)
            inputs = [later for later in inputs if later.step < abort_step]
        else:
            end_step = step + rng.randint(1, 30)
        out.append(
            replace(
                r,
                resumable=True,
                eos_at=None,
                stop_token_id=None,
                stop_at=None,
                abort_step=abort_step,
                inputs=tuple(inputs),
                end_step=end_step,
            )
        )
    return out


def build_requests(
    name: str, config: ParityConfig, *, output_factor: int = 1
) -> list[ParityRequest]:
    """The workload's requests fitted to ``config``: outputs ``output_factor`` times longer;
    prompts shorter than ``max_model_len``; every request needing at most half the usable
    KV pool (prompts cut first; none without a KV cache), so that a small pool holds several
    requests (a request that outgrows the whole pool wedges vLLM, deviation 4); priorities
    only under the priority policy (vLLM's front-end rejects a priority without it), and
    there with no two requests tied on ``(priority, arrival_time)``."""
    out = []
    cap_tokens = (config.num_gpu_blocks - 1) // 2 * config.block_size
    allowed = cap_tokens - config.num_speculative_tokens if config.group_kinds() else math.inf
    for req in _base_requests(name):
        prompt = req.prompt[: config.max_model_len - 1]
        max_tokens = req.max_tokens * output_factor
        if len(prompt) + max_tokens > allowed:
            if max_tokens >= allowed:
                max_tokens = max(1, allowed // 2)
            prompt = prompt[: max(1, allowed - max_tokens)]
        req = replace(req, prompt=prompt, max_tokens=max_tokens)
        if config.policy != "priority":
            req = replace(req, priority=0)
        out.append(req)
    return unique_priority_keys(out) if config.policy == "priority" else out


def _pool_sizes(name: str) -> tuple[int, int]:
    """(roomy, tight) KV pool sizes for a workload: roomy never preempts; tight holds about
    three average prompts, so decode growth preempts running requests.

    A workload whose trace is absent gets a placeholder (0, 0): its cases keep their ids
    and are skipped (:func:`case_params`), and building their requests raises."""
    if missing_trace(name):
        return 0, 0
    probe = ParityConfig("probe", False, 3, False, "fcfs", num_gpu_blocks=1 << 30)
    reqs = _base_requests(name)
    needs = [blocks_needed(r, probe) for r in reqs]
    roomy = 2 * sum(needs) + 1
    prompt_blocks = [-(-min(r.prompt_len, probe.max_model_len - 1) // 16) for r in reqs]
    tight = math.ceil(3 * sum(prompt_blocks) / len(prompt_blocks)) + 1
    return roomy, WORKLOADS[name].pressure_blocks or tight


def base_cases(name: str) -> Iterator[Case]:
    """The cross product for one workload (KV pressure: the tight pool, longer outputs)."""
    roomy, tight = _pool_sizes(name)
    for async_scheduling in (False, True):
        for k in (0, 1, 3):
            for apc in (False, True):
                for policy in ("fcfs", "priority"):
                    for pressure in (False, True):
                        label = "-".join(
                            [
                                "async" if async_scheduling else "sync",
                                f"K{k}",
                                "apc" if apc else "noapc",
                                "prio" if policy == "priority" else "fcfs",
                                *(["kv"] if pressure else []),
                            ]
                        )
                        config = ParityConfig(
                            name=label,
                            async_scheduling=async_scheduling,
                            num_speculative_tokens=k,
                            enable_prefix_caching=apc,
                            policy=policy,
                            num_gpu_blocks=tight if pressure else roomy,
                        )
                        factor = WORKLOADS[name].pressure_output_factor if pressure else 1
                        yield Case(name, config, output_factor=factor)


def _hybrid_case(workload: str, config: ParityConfig, **fields: Any) -> Case:
    """A case of ``config`` (its pool left 0) on ``workload`` under KV pressure: the pool
    is the single-group tight pool per group, and at least the largest request's blocks
    over every group (so llmsched refuses none); ``fields`` are the case's others (images,
    sessions: see :class:`Case`)."""
    factor = WORKLOADS[workload].pressure_output_factor
    if missing_trace(workload):
        # Its requests cannot be built here: the placeholder pool of _pool_sizes, and the
        # case is skipped (case_params).
        return Case(workload, config, output_factor=factor, hit_reporters=True, **fields)
    num_groups = len(config.group_kinds())
    roomy = replace(config, num_gpu_blocks=1 << 30)
    largest = max(
        (
            blocks_needed(r, roomy)
            for r in Case(workload, roomy, output_factor=factor, **fields).requests()
        ),
        default=0,
    )
    pool = max(num_groups * _pool_sizes(workload)[1], largest + 1)
    return Case(
        workload,
        replace(config, num_gpu_blocks=pool),
        output_factor=factor,
        hit_reporters=True,
        **fields,
    )


def _hybrid_apc(
    name: str, groups: str, policy: str, async_scheduling: bool, **fields: Any
) -> ParityConfig:
    """A config of the KV-cache groups ``groups`` with prefix caching (Mamba groups' state
    aligned, vLLM's ``mamba_cache_mode`` "align"), without drafts unless ``fields`` say, KV
    events compared, its pool left 0 for :func:`_hybrid_case`."""
    fields.setdefault("num_speculative_tokens", 0)
    return ParityConfig(
        name,
        kv_events=True,
        async_scheduling=async_scheduling,
        enable_prefix_caching=True,
        policy=policy,
        num_gpu_blocks=0,
        kv_cache_groups=groups,
        **fields,
    )


def edge_cases() -> list[Case]:
    """Cases beyond the cross product. Long-prefill thresholds stay >= 1 + K (see the
    harness docstring: llmsched deliberately does not pad below that), and every budget
    fits a padded decode (``1 + K``) and, with chunked prefill off, the longest request
    (llmsched refuses smaller ones)."""
    out: list[Case] = []
    for a in (False, True):
        mode = "async" if a else "sync"
        # Requests reach max_model_len: the running loop's M - C - s cap, the padding guard.
        for k in (1, 3):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-tightM-{mode}-K{k}-apc",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=2048,
                        max_model_len=288,
                    ),
                    output_factor=4,
                )
            )
        # A long-prefill threshold, few sequences, a small token budget.
        for k in (0, 3):
            for policy in ("fcfs", "priority"):
                out.append(
                    Case(
                        "azure-code",
                        ParityConfig(
                            f"edge-lpt-{mode}-K{k}-apc-{policy[:4]}",
                            async_scheduling=a,
                            num_speculative_tokens=k,
                            enable_prefix_caching=True,
                            policy=policy,
                            num_gpu_blocks=4096,
                            max_num_seqs=4,
                            max_num_batched_tokens=256,
                            long_prefill_token_threshold=48,
                        ),
                    )
                )
        # A token budget smaller than the decode batch: drafts cut by the budget, and a
        # padded admission that does not fit the budget ends the waiting loop.
        for k in (1, 3):
            out.append(
                Case(
                    "synthetic-chat",
                    ParityConfig(
                        f"edge-budget-{mode}-K{k}-apc-fcfs",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=_pool_sizes("synthetic-chat")[0],
                        max_num_seqs=16,
                        max_num_batched_tokens=30,
                    ),
                )
            )
        # Knobs vLLM only has in SchedulerConfig: an admission cap below max_num_seqs, a
        # scheduled-token cap below the batch budget, the adaptive long-prefill threshold.
        for k in (0, 3):
            out.append(
                Case(
                    "azure-conv",
                    ParityConfig(
                        f"edge-active-adaptive-{mode}-K{k}-apc-prio",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="priority",
                        num_gpu_blocks=_pool_sizes("azure-conv")[0],
                        max_num_seqs=8,
                        max_num_active_seqs=3,
                        max_num_batched_tokens=256,
                        max_num_scheduled_tokens=200,
                        long_prefill_token_threshold=32,
                        long_prefill_token_threshold_adaptive=True,
                    ),
                )
            )
        # Chunked prefill off: a prompt that does not fit the budget blocks the queue.
        out.append(
            Case(
                "azure-conv",
                ParityConfig(
                    f"edge-nochunk-{mode}-K1-apc-fcfs",
                    async_scheduling=a,
                    num_speculative_tokens=1,
                    enable_prefix_caching=True,
                    policy="fcfs",
                    num_gpu_blocks=_pool_sizes("azure-conv")[0],
                    max_model_len=1024,
                    max_num_batched_tokens=1024,
                    enable_chunked_prefill=False,
                ),
            )
        )
        # A watermark under KV pressure.
        out.append(
            Case(
                "mooncake",
                ParityConfig(
                    f"edge-watermark-{mode}-K1-apc-prio-kv",
                    async_scheduling=a,
                    num_speculative_tokens=1,
                    enable_prefix_caching=True,
                    policy="priority",
                    num_gpu_blocks=_pool_sizes("mooncake")[1] + 16,
                    watermark=0.05,
                ),
                output_factor=4,
            )
        )
        # The watermark's edges: admissions that leave exactly the watermark free (with
        # preemption going on), and, with a watermark above half the pool, admissions into
        # an empty batch, which the watermark does not hold back.
        for workload, watermark, edge in (
            ("synthetic-chat", 0.1, "exact"),
            ("azure-conv", 0.6, "idle"),
        ):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-watermark-{edge}-{mode}-K1-apc-fcfs-kv",
                        async_scheduling=a,
                        num_speculative_tokens=1,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=_pool_sizes(workload)[1],
                        watermark=watermark,
                    ),
                    output_factor=WORKLOADS[workload].pressure_output_factor,
                )
            )
        # Blocks whose tokens recur under other prefixes: each hit follows the parent chain.
        roomy, tight = _pool_sizes("shuffled-blocks")
        for k in (0, 1):
            out.append(
                Case(
                    "shuffled-blocks",
                    ParityConfig(
                        f"edge-shuffled-{mode}-K{k}-apc-fcfs",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=roomy,
                    ),
                )
            )
            out.append(
                Case(
                    "shuffled-blocks",
                    ParityConfig(
                        f"edge-shuffled-{mode}-K{k}-apc-prio-kv",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="priority",
                        num_gpu_blocks=tight,
                    ),
                    output_factor=4,
                )
            )
        # Two LoRA adapters and plain requests, one adapter per step: requests under a
        # second adapter wait without blocking the others; adapters key the prefix cache.
        roomy, tight = _pool_sizes("synthetic-conv")
        for k, policy, pressure in ((0, "fcfs", True), (3, "priority", False)):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-lora-{mode}-K{k}-apc-{policy[:4]}" + ("-kv" if pressure else ""),
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=tight if pressure else roomy,
                        max_loras=1,
                    ),
                    output_factor=WORKLOADS["synthetic-conv"].pressure_output_factor
                    if pressure
                    else 1,
                    lora_adapters=2,
                )
            )
        # Structured output: requests wait for their grammars without blocking the others,
        # a grammar that fails fails its request; sync drafts are cut to what the grammar
        # accepts.
        for k, policy, pressure in ((0, "fcfs", True), (3, "priority", True), (1, "fcfs", False)):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-grammar-{mode}-K{k}-apc-{policy[:4]}" + ("-kv" if pressure else ""),
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes("synthetic-conv")[1 if pressure else 0],
                    ),
                    output_factor=WORKLOADS["synthetic-conv"].pressure_output_factor
                    if pressure
                    else 1,
                    structured_output=True,
                )
            )
        # Multimodal inputs (a tiny llava-1.5, images of 36 placeholder tokens): encoder
        # budgets and caches small enough to bind (chunks stop before images, outputs are
        # evicted and encoded again), images shared by requests, prefix hits through images;
        # chunks that never split an image; EAGLE-3's one-token shift.
        for k, policy, pressure, budget, cache_size, no_split, method in (
            (0, "fcfs", True, 64, 100, False, "ngram"),
            (1, "priority", False, 100, 72, True, "ngram"),
            (3, "fcfs", False, 40, 100, False, "eagle3"),
            (0, "priority", True, 36, 36, False, "ngram"),
        ):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-mm-{mode}-K{k}-apc-{policy[:4]}-enc{budget}-cache{cache_size}"
                        + ("-nosplit" if no_split else "")
                        + ("" if method == "ngram" else f"-{method}")
                        + ("-kv" if pressure else ""),
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes("synthetic-conv")[1 if pressure else 0],
                        speculative_method=method,
                        image_side=6,
                        max_num_encoder_input_tokens=budget,
                        encoder_cache_size=cache_size,
                        disable_chunked_mm_input=no_split,
                    ),
                    output_factor=WORKLOADS["synthetic-conv"].pressure_output_factor
                    if pressure
                    else 1,
                    images=5,
                )
            )
        # A pooling (embedding) model: no token sampled, each request ends with its prompt
        # (chunked, with and without shared prefixes); pools a few blocks above the longest
        # prompt's, so admissions wait for blocks.
        for workload, apc, policy, blocks in (
            ("synthetic-conv", True, "fcfs", 30),
            ("mooncake", False, "priority", 118),
        ):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-pool-{mode}-{'apc' if apc else 'noapc'}-{policy[:4]}",
                        async_scheduling=a,
                        num_speculative_tokens=0,
                        enable_prefix_caching=apc,
                        policy=policy,
                        num_gpu_blocks=blocks,
                        max_num_batched_tokens=256,
                        pooling=True,
                    ),
                )
            )
        # Models without a KV cache (no KV-cache group, a pool of the null block alone,
        # chunked prefill off as vLLM's engine turns it off): an encoder-only pooling model
        # (BERT), its prompts each taken whole; and multimodal encoder instances, which take
        # prompts longer than the budget in chunks, encode the images within their encoder
        # budget and cache, and end a request once its prompt is computed, sampling nothing.
        out.append(
            Case(
                "synthetic-conv",
                ParityConfig(
                    f"edge-nokv-pool-{mode}-prio",
                    async_scheduling=a,
                    num_speculative_tokens=0,
                    enable_prefix_caching=False,
                    policy="priority",
                    num_gpu_blocks=1,
                    max_num_batched_tokens=4096,
                    kv_cache_groups="",
                    pooling=True,
                ),
            )
        )
        for policy, tokens, budget, cache_size in (
            ("fcfs", 512, 64, 100),
            ("priority", 128, 36, 36),
        ):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-encoder-instance-{mode}-{policy[:4]}-tokens{tokens}-enc{budget}"
                        f"-cache{cache_size}",
                        async_scheduling=a,
                        num_speculative_tokens=0,
                        enable_prefix_caching=False,
                        policy=policy,
                        num_gpu_blocks=1,
                        max_num_batched_tokens=tokens,
                        kv_cache_groups="",
                        image_side=6,
                        max_num_encoder_input_tokens=budget,
                        encoder_cache_size=cache_size,
                        mm_encoder_only=True,
                    ),
                    images=5,
                )
            )
        # Diffusion LLMs (vLLM's diffusion scheduler classes): a canvas of K positions
        # denoised as drafts, half of it for some requests, reads deferred under async
        # scheduling while their steps are in flight, canvases emitted after 1 to 3
        # denoising steps; with prefix caching and KV pressure, and without.
        for workload, k, apc, policy, pressure in (
            ("synthetic-conv", 4, True, "fcfs", True),
            ("azure-code", 8, False, "priority", False),
        ):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-diffusion-{mode}-K{k}-{'apc' if apc else 'noapc'}-{policy[:4]}"
                        + ("-kv" if pressure else ""),
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=apc,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes(workload)[1 if pressure else 0],
                        diffusion=True,
                    ),
                    output_factor=WORKLOADS[workload].pressure_output_factor if pressure else 1,
                )
            )
        # KV cache events (compared on vLLM's objects only): blocks stored by allocations
        # and by outputs (async, drafts), evicted under KV pressure, uncached by undone
        # steps (priority: the configs whose plain cases undo one, synthetic-code's sync
        # K3 and azure-code's async K1), hits reported to the requests that ask.
        for workload, k, policy in (
            ("synthetic-conv", 0, "fcfs"),
            ("azure-code", 1, "priority"),
            ("synthetic-code", 3, "priority"),
        ):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-events-{mode}-K{k}-apc-{policy[:4]}-kv",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes(workload)[1],
                        kv_events=True,
                    ),
                    output_factor=WORKLOADS[workload].pressure_output_factor,
                    hit_reporters=True,
                )
            )
        # A KV connector (the parity connector's store holds one prompt in three): loads
        # past the prefix hit, with prefix caching on and off, a roomy pool and KV pressure.
        # Under sync scheduling one in four first synchronous loads fails from a block on.
        # Its asynchronous variant loads half of those across steps (WAITING_FOR_REMOTE_KVS),
        # two in five first loads failing (recomputed, or failing their requests);
        # in a pool a quarter tighter still, with a budget of 64 tokens that keeps prefills
        # in flight for many steps, a load must leave them room.
        for workload, k, apc, pool, loads in (
            ("synthetic-conv", 0, True, "kv", "sync"),
            ("synthetic-code", 1, False, "roomy", "sync"),
            ("synthetic-code", 3, True, "kv", "sync"),
            ("synthetic-conv", 0, True, "kv", "async"),
            ("synthetic-code", 1, False, "roomy", "async"),
            ("synthetic-code", 3, True, "kv", "async"),
            ("synthetic-code", 3, True, "tightkv", "async"),
        ):
            roomy, tight = _pool_sizes(workload)
            # A connector that also loads (kv_both, a decode instance's role), with steps in
            # flight: a freed block waits for the steps that may still write it.
            variants = [("kv_producer", "recompute")]
            if a and loads == "async" and pool != "roomy":
                variants.append(("kv_both", "recompute"))
            if k == 0 and (loads == "async" or not a):
                # A failed load fails its request (vLLM's kv_load_failure_policy "fail"):
                # asynchronous loads', and synchronous ones' (under sync scheduling).
                variants.append(("kv_producer", "fail"))
            for role, policy in variants:
                out.append(
                    Case(
                        workload,
                        ParityConfig(
                            f"edge-kvconn{'' if loads == 'sync' else '-asyncload'}"
                            f"{'-both' if role == 'kv_both' else ''}"
                            f"{'-failpolicy' if policy == 'fail' else ''}-{mode}-K{k}-"
                            f"{'apc' if apc else 'noapc'}-fcfs-{pool}",
                            async_scheduling=a,
                            num_speculative_tokens=k,
                            enable_prefix_caching=apc,
                            policy="fcfs",
                            num_gpu_blocks={
                                "roomy": roomy,
                                "kv": tight,
                                "tightkv": tight * 3 // 4,
                            }[pool],
                            **({"max_num_batched_tokens": 64} if pool == "tightkv" else {}),
                            kv_connector=True,
                            kv_connector_async_loads=loads == "async",
                            kv_role=role,
                            kv_load_failure_policy=policy,
                        ),
                        output_factor=WORKLOADS[workload].pressure_output_factor
                        if pool != "roomy"
                        else 1,
                    )
                )
        # A KV connector over a hybrid model's groups (sliding windows beside full
        # attention, the connector SupportsHMA): its tokens past the hybrid hit loaded into
        # every group (null blocks where a window left them behind), synchronously and
        # across steps, under KV pressure; a finished request's blocks behind a window freed
        # before the connector is handed its tables; loads that fail, fail whole (a block id
        # names one group's block, so vLLM takes failed loads by request), recomputed or
        # failing their requests; with steps in flight, a consumer's frees deferred.
        # Beside Mamba groups (prefix caching off, as Mamba runs here): every load brings
        # its request's state with its tokens, and each Mamba group's state blocks are
        # allocated with the load.
        hybrid_connectors = [
            ("sliding_window:64,full", "sync", "kv_producer", "recompute"),
            ("full,sliding_window:32,sliding_window:32", "async", "kv_producer", "recompute"),
            ("sliding_window:64,full", "async", "kv_producer", "fail"),
            ("mamba,full", "sync", "kv_producer", "recompute"),
            ("full,mamba,sliding_window:32", "async", "kv_producer", "fail"),
        ]
        if a:
            hybrid_connectors += [
                ("full,sliding_window:32", "async", "kv_both", "recompute"),
                ("mamba,full", "async", "kv_both", "recompute"),
            ]
        for groups, loads, role, policy in hybrid_connectors:
            apc = "mamba" not in groups
            out.append(
                _hybrid_case(
                    "synthetic-code",
                    ParityConfig(
                        f"edge-kvconn-hybrid{'-mamba' if not apc else ''}"
                        f"{'' if loads == 'sync' else '-asyncload'}"
                        f"{'-both' if role == 'kv_both' else ''}"
                        f"{'-failpolicy' if policy == 'fail' else ''}-{mode}-K0-"
                        f"{'apc' if apc else 'noapc'}-fcfs-kv",
                        async_scheduling=a,
                        num_speculative_tokens=0,
                        enable_prefix_caching=apc,
                        policy="fcfs",
                        num_gpu_blocks=0,
                        kv_cache_groups=groups,
                        kv_connector=True,
                        kv_connector_async_loads=loads == "async",
                        kv_role=role,
                        kv_load_failure_policy=policy,
                    ),
                )
            )
        # Streaming-input sessions among plain requests: inputs queued behind a running one
        # and inputs to sessions waiting for them (holding runner slots: few of them), under
        # KV pressure (sessions preempted, stopping while preempted), priority and drafts,
        # and EAGLE's lookahead hashes (a kept hash covering a discarded token).
        for k, policy, method, pool in (
            (0, "fcfs", "ngram", "kv"),
            (3, "priority", "ngram", "kv"),
            (1, "fcfs", "eagle", "roomy"),
        ):
            roomy, tight = _pool_sizes("synthetic-chat")
            out.append(
                Case(
                    "synthetic-chat",
                    ParityConfig(
                        f"edge-sessions-{mode}-K{k}{'-eagle' if method == 'eagle' else ''}"
                        f"-apc-{policy[:4]}-{pool}",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=roomy if pool == "roomy" else tight,
                        max_num_seqs=6,
                        speculative_method=method,
                    ),
                    output_factor=2 if pool == "kv" else 1,
                    sessions=True,
                )
            )
        # Sessions beside aligned Mamba (sync only: a stop rolls C back, and a recurrent
        # state folded by a step in flight cannot be): a later input resumes from the
        # state the session kept, mid-block, and its chunk realigns at the next boundary.
        beside_mamba = [("mamba,full", "fcfs"), ("full,mamba,sliding_window:64", "priority")]
        for groups, policy in [] if a else beside_mamba:
            out.append(
                _hybrid_case(
                    "synthetic-chat",
                    _hybrid_apc(
                        f"edge-sessions-mamba-{groups.count('mamba')}m-{mode}-apc-{policy[:4]}-kv",
                        groups,
                        policy,
                        a,
                        max_num_seqs=6,
                    ),
                    sessions=True,
                )
            )
        # Multi-head latent attention (DeepSeek-style models): vLLM manages its group as
        # full attention; prefix hits, KV pressure, drafts.
        for k, policy in ((0, "fcfs"), (3, "priority")):
            out.append(
                Case(
                    "mooncake-turns",
                    ParityConfig(
                        f"edge-mla-{mode}-K{k}-apc-{policy[:4]}-kv",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes("mooncake-turns")[1],
                        latent_attention=True,
                    ),
                    output_factor=4,
                )
            )
        # Cache salts: requests share cached blocks only under the same salt.
        for workload in ("synthetic-conv", "mooncake-turns"):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-salt-{mode}-K1-apc-fcfs-kv",
                        async_scheduling=a,
                        num_speculative_tokens=1,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=_pool_sizes(workload)[1],
                    ),
                    output_factor=4,
                    cache_salts=2,
                )
            )
        # Requests that skip reading the prefix cache (prompt logprobs) among ones that hit.
        for workload in ("synthetic-conv", "mooncake-turns"):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-skipread-{mode}-K1-apc-prio-kv",
                        async_scheduling=a,
                        num_speculative_tokens=1,
                        enable_prefix_caching=True,
                        policy="priority",
                        num_gpu_blocks=_pool_sizes(workload)[1],
                    ),
                    output_factor=4,
                    prefix_cache_skippers=True,
                )
            )
        # Prefill cadence: prefill (admissions and prompt chunks) held back while requests
        # decode, released every few executed steps, and whenever the waiting requests
        # outgrew the last prefill step; with a long-prefill threshold, several chunks.
        for interval, workload, k in ((2, "synthetic-chat", 0), (4, "azure-code", 3)):
            out.append(
                Case(
                    workload,
                    ParityConfig(
                        f"edge-cadence{interval}-{mode}-K{k}-apc-fcfs",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy="fcfs",
                        num_gpu_blocks=_pool_sizes(workload)[0],
                        max_num_batched_tokens=256,
                        long_prefill_token_threshold=64,
                        prefill_schedule_interval=interval,
                    ),
                )
            )
        out.append(
            Case(
                "mooncake",
                ParityConfig(
                    f"edge-cadence3-{mode}-K1-apc-prio-kv",
                    async_scheduling=a,
                    num_speculative_tokens=1,
                    enable_prefix_caching=True,
                    policy="priority",
                    num_gpu_blocks=_pool_sizes("mooncake")[1],
                    prefill_schedule_interval=3,
                ),
                output_factor=4,
            )
        )
        # Hybrid models: sliding-window KV-cache groups beside a full-attention one, in
        # Gemma 3's order (three sliding groups, then the full one) and full first; vLLM's
        # hybrid prefix hit (null blocks before a window's run), blocks leaving the window,
        # KV pressure; vLLM's engine retention (0: only the blocks a resend can hit) and
        # every block (an interval of one block); KV cache events per group, hits reported.
        for tag, workload, groups, k, policy, retention in (
            ("swa", "synthetic-conv", ",".join(["sliding_window:64"] * 3 + ["full"]), 0, "fcfs", 0),
            ("swa", "mooncake-turns", "full,sliding_window:100", 1, "priority", 0),
            ("swa", "azure-code", "sliding_window:40,full", 3, "fcfs", 16),
            # Llama 4's chunked local attention beside full attention, and all three kinds.
            (
                "chunked",
                "synthetic-code",
                "chunked_local:64,chunked_local:64,full",
                1,
                "priority",
                0,
            ),
            ("mixed", "mooncake-turns", "full,chunked_local:128,sliding_window:96", 0, "fcfs", 0),
        ):
            out.append(
                _hybrid_case(
                    workload,
                    _hybrid_apc(
                        f"edge-hybrid-{tag}-r{retention}-{mode}-K{k}-apc-{policy[:4]}-kv",
                        groups,
                        policy,
                        a,
                        num_speculative_tokens=k,
                        prefix_cache_retention_interval=retention,
                    ),
                )
            )
        # Pipeline stages: two steps in flight in a synchronous engine (the first stage gets
        # the sampled tokens back with the step), and with async scheduling the V2 runner's
        # decode stagger (a request decodes once per trip through the stages).
        for stages, policy, pressure in ((2, "fcfs", True), (3, "priority", False)):
            roomy, tight = _pool_sizes("synthetic-conv")
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-pp{stages}-{mode}-K0-apc-{policy[:4]}" + ("-kv" if pressure else ""),
                        async_scheduling=a,
                        num_speculative_tokens=0,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=tight if pressure else roomy,
                        pipeline_parallel_size=stages,
                    ),
                    output_factor=WORKLOADS["synthetic-conv"].pressure_output_factor
                    if pressure
                    else 1,
                )
            )
        # A data-parallel rank of an MoE model: its engine core throttles prefill to every
        # 3rd step on a counter the ranks share, the scheduler keeps no cadence of its own.
        for k, policy in ((0, "fcfs"), (3, "priority")):
            out.append(
                Case(
                    "synthetic-conv",
                    ParityConfig(
                        f"edge-dp2-cadence3-{mode}-K{k}-apc-{policy[:4]}",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes("synthetic-conv")[0],
                        prefill_schedule_interval=3,
                        data_parallel_size=2,
                    ),
                )
            )
        # Mamba hybrids (Granite 4, Jamba: Mamba layers beside attention ones) without
        # prefix caching: 1 + K state blocks per request in each Mamba group from its first
        # step, the attention groups' tables growing, all from one pool under pressure.
        for workload, groups, k, policy in (
            ("synthetic-conv", "mamba,full,mamba", 0, "fcfs"),
            ("azure-code", "mamba,mamba,mamba,full", 3, "priority"),
            ("mooncake-turns", "full,mamba,sliding_window:64", 1, "fcfs"),
        ):
            out.append(
                _hybrid_case(
                    workload,
                    ParityConfig(
                        f"edge-mamba-{groups.count('mamba')}m-{mode}-K{k}-noapc-{policy[:4]}-kv",
                        async_scheduling=a,
                        num_speculative_tokens=k,
                        enable_prefix_caching=False,
                        policy=policy,
                        num_gpu_blocks=0,
                        kv_cache_groups=groups,
                    ),
                )
            )
        # Mamba hybrids with prefix caching (vLLM's mamba_cache_mode "align"): prompt chunks
        # end on block boundaries, a Mamba group holds the states a step reads and writes
        # among null blocks, caches the one a resend (or a shared prefix's end, or every
        # retention interval) can resume from, and a hit needs that state cached. A
        # long-prefill threshold below the block size makes chunks end mid-block. Mamba2
        # and gated DeltaNet layers write a prompt's last boundary state into a prefill
        # checkpoint block from inside its last chunk (checkpoint alignment c > 0).
        for workload, groups, policy, retention, threshold, checkpoints in (
            ("mooncake-turns", "mamba,full,mamba", "fcfs", 0, 0, 0),
            ("shuffled-blocks", "full,mamba", "priority", 0, 0, 0),
            ("azure-code", "mamba,mamba,mamba,full", "fcfs", 16, 0, 0),
            ("mooncake-turns", "full,mamba,sliding_window:64", "priority", 64, 0, 0),
            ("shuffled-blocks", "mamba,full", "fcfs", 0, 12, 0),
            ("mooncake-turns", "mamba,full,mamba", "priority", 0, 0, 1),
            ("shuffled-blocks", "full,mamba", "fcfs", 0, 0, 8),
            ("azure-code", "mamba,mamba,mamba,full", "priority", 16, 0, 1),
            ("mooncake-turns", "full,mamba,sliding_window:64", "fcfs", 64, 0, 1),
        ):
            out.append(
                _hybrid_case(
                    workload,
                    _hybrid_apc(
                        f"edge-mamba-{groups.count('mamba')}m-{mode}-apc-r{retention}-t{threshold}"
                        f"-c{checkpoints}-{policy[:4]}-kv",
                        groups,
                        policy,
                        a,
                        long_prefill_token_threshold=threshold,
                        mamba_prefill_checkpoint_alignment=checkpoints,
                        prefix_cache_retention_interval=retention,
                    ),
                )
            )
        # Aligned Mamba beside multimodal inputs (a vision-language hybrid): the encoder
        # budget and cache cut chunks after the alignment, mid-block before an image, and
        # the next chunk realigns at the block's end; prefix hits resume inside images.
        for groups, policy, budget, cache_size, checkpoints in (
            ("mamba,full", "fcfs", 40, 72, 0),
            ("full,mamba,sliding_window:64", "priority", 36, 36, 1),
        ):
            out.append(
                _hybrid_case(
                    "synthetic-conv",
                    _hybrid_apc(
                        f"edge-mm-mamba-{groups.count('mamba')}m-{mode}-apc-c{checkpoints}"
                        f"-{policy[:4]}-enc{budget}-cache{cache_size}-kv",
                        groups,
                        policy,
                        a,
                        mamba_prefill_checkpoint_alignment=checkpoints,
                        image_side=6,
                        max_num_encoder_input_tokens=budget,
                        encoder_cache_size=cache_size,
                    ),
                    images=5,
                )
            )
        # Aligned Mamba beside drafts (Qwen3-Next and Qwen3.5 draft with one MTP module): a Mamba
        # group's table ends with a block per draft token after its state's; a step that
        # passes a boundary moves those it leaves behind to the table's end and takes the
        # new state's block; EAGLE's block drop moves the cached boundary a block back.
        for workload, groups, policy, method, k, hashes, checkpoints in (
            ("mooncake-turns", "full,mamba", "fcfs", "eagle3", 2, True, 0),
            ("shuffled-blocks", "mamba,full,mamba", "priority", "ngram", 3, True, 1),
            ("azure-code", "full,mamba,sliding_window:64", "fcfs", "eagle", 3, False, 0),
            ("synthetic-conv", "mamba,full", "priority", "mtp", 1, False, 1),
        ):
            rule = "" if method == "ngram" else ("-hashes" if hashes else "-drop")
            out.append(
                _hybrid_case(
                    workload,
                    _hybrid_apc(
                        f"edge-{method}{rule}-mamba-{groups.count('mamba')}m-{mode}-K{k}-apc"
                        f"-c{checkpoints}-{policy[:4]}-kv",
                        groups,
                        policy,
                        a,
                        num_speculative_tokens=k,
                        speculative_method=method,
                        lookahead_block_hashes=hashes,
                        mamba_prefill_checkpoint_alignment=checkpoints,
                    ),
                )
            )
        # Drafters with a model (EAGLE K=3, multi-module MTP, a draft model): K lookahead
        # slots capped at max_model_len, EAGLE's prefix-cache rule (lookahead hashes, where
        # prompts that share blocks go on with other tokens, and their KV events; or the last
        # hit block dropped), a draft model's draft slot, under KV pressure and preemption.
        window = "sliding_window:40"
        swa = f"{window},full"
        for workload, method, hashes, policy, pressure, m, groups in (
            ("shuffled-blocks", "eagle", True, "fcfs", True, 4096, "full"),
            # Over a sliding window and full attention, lookahead hashes.
            ("azure-code", "eagle3", True, "priority", True, 1024, swa),
            # The block drop over a sliding window and full attention: on every group (none
            # holds the drafter's layers), or on the kind of the one that does (full
            # attention: the window's hits keep their last block).
            ("shuffled-blocks", "eagle", False, "fcfs", True, 4096, swa),
            ("azure-code", "eagle3", False, "priority", True, 1024, swa + "+eagle"),
            # Two window groups and no full attention.
            ("synthetic-conv", "eagle", False, "fcfs", True, 4096, f"{window},{window}"),
            ("synthetic-conv", "eagle", False, "priority", True, 4096, "full"),
            ("synthetic-conv", "eagle3", True, "fcfs", False, 288, "full"),
            ("synthetic-conv", "draft_model", True, "priority", True, 4096, "full"),
            # A multi-module MTP drafter: it reads K prompt tokens ahead, so chunks end K
            # or more before a prompt's end, the last K - 1 computed tokens stay uncached,
            # and block hashes cover the K tokens after each block.
            ("shuffled-blocks", "mtp", True, "fcfs", True, 4096, "full"),
            ("synthetic-conv", "mtp", False, "priority", True, 4096, "full"),
            ("synthetic-conv", "mtp", True, "fcfs", False, 288, "full"),
        ):
            roomy, tight = _pool_sizes(workload)
            rule = "" if method == "draft_model" else ("-hashes" if hashes else "-drop")
            rule += "-swa" if groups != "full" else ""
            rule += "-drafterfull" if groups.endswith("+eagle") else ""
            rule += "-windowsonly" if "full" not in groups else ""
            config = ParityConfig(
                f"edge-{method}{rule}-{mode}-K3-apc-{policy[:4]}"
                + ("-kv" if pressure else f"-M{m}"),
                async_scheduling=a,
                num_speculative_tokens=3,
                speculative_method=method,
                lookahead_block_hashes=hashes,
                enable_prefix_caching=True,
                policy=policy,
                num_gpu_blocks=tight if pressure else roomy,
                max_model_len=m,
                # The lookahead tokens in the stored events.
                kv_events=hashes,
                kv_cache_groups=groups,
            )
            if groups == "full":
                out.append(Case(workload, config, output_factor=4))
            else:
                # A pool for every group, under pressure.
                out.append(_hybrid_case(workload, replace(config, num_gpu_blocks=0)))
        # Few sequences under KV pressure, bigger blocks.
        for policy in ("fcfs", "priority"):
            out.append(
                Case(
                    "mooncake-turns",
                    ParityConfig(
                        f"edge-seqcap-B32-{mode}-K3-apc-{policy[:4]}-kv",
                        async_scheduling=a,
                        num_speculative_tokens=3,
                        enable_prefix_caching=True,
                        policy=policy,
                        num_gpu_blocks=_pool_sizes("mooncake-turns")[1] // 2 + 1,
                        max_num_seqs=3,
                        block_size=32,
                    ),
                    output_factor=4,
                )
            )
    return out


def cases() -> list[Case]:
    """Every case of the matrix: the cross product per workload, then the edge cases."""
    out = [case for name in WORKLOADS if WORKLOADS[name].cross_product for case in base_cases(name)]
    out.extend(edge_cases())
    return out


def case_params(selected: list[Case]) -> list[Any]:
    """``selected`` as pytest parameters named by case id; a case whose trace is absent is
    skipped, saying which file is missing."""
    import pytest

    params = []
    for case in selected:
        reason = missing_trace(case.workload)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(case, id=case.id, marks=marks))
    return params


def case_by_id(case_id: str) -> Case:
    """The matrix case ``case_id``, for a test that needs that one; skips the test when its
    trace is absent."""
    import pytest

    case = next(c for c in cases() if c.id == case_id)
    reason = missing_trace(case.workload)
    if reason:
        pytest.skip(reason)
    return case
