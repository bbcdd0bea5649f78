"""Per-step cost of ``schedule()`` + ``update_from_output()``, llmsched against vLLM.

Each case puts a scheduler in a steady state, then times many steps. Only the scheduler's
calls are timed (``schedule``, ``update_from_output``, and ``update_draft_token_ids`` in
spec decode); building the runner's output is not, for either implementation. When
``vllm`` is importable (``make vllm-env``), every case also runs vLLM 0.33.0's own v1
scheduler on the same workload, and the report gives the ratio from the same run.

Cases: steady decode at 64 / 256 / 1024 / 4096 running requests, prefill-heavy (chunked
prefill of 2,000-token prompts beside decodes), spec decode K=3, prefix caching (decodes
sharing a 1,024-token prefix), KV pressure with preemptions, a 100,000-request waiting
queue behind 256 running requests, LoRA churn (four adapters, two at a time) and
structured-output churn (one request in four under a grammar). Two sweeps show how the
cost grows with running requests (it must be linear) and with waiting requests (it must
not grow).

Warm and cold: back to back, the scheduler's data stays in the CPU caches from one call to
the next. In an engine a model step, the sampler and Python bookkeeping run in between, and
the next call starts cold. The cold figure (:class:`Evictor`) writes one byte in every
cache line of an unrelated buffer (8 MiB by default: a few MiB of host-side work per
model step; 32 MiB, this machine's L3, leaves nothing warm) before ``schedule()`` and
again before ``update_from_output()``, untimed, as that work would.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmsched._checks import Range
from llmsched._core import Scheduler, SchedulerConfig
from llmsched.outputs import ModelRunnerOutput

__all__ = [
    "CASES",
    "COLD_MIB",
    "Case",
    "Evictor",
    "Measurement",
    "measure",
    "run_benchmarks",
    "vllm_available",
]


@dataclass(frozen=True, slots=True)
class Case:
    """A benchmark workload, described so that both schedulers can build it."""

    name: str
    running: int
    waiting: int = 0
    prompt_len: int = 16
    max_tokens: int = 6000
    shared_prefix: int = 0
    num_speculative_tokens: int = 0
    prefix_caching: bool = False
    num_gpu_blocks: int | None = None
    """Default: enough KV for every running request to decode ``max_tokens``."""
    max_num_batched_tokens: int = 8192
    max_num_seqs: int | None = None
    max_model_len: int = 8192
    churn_max_tokens: int = 0
    """> 0: requests finish after this many tokens and new ones replace them."""
    churn_spread: int = 0
    """> 0: request ``i`` finishes after ``churn_max_tokens + i % churn_spread`` tokens, so
    requests finish a few at a time, as an engine's do, and the running order drifts from
    the order the requests arrived in."""
    block_size: int = 16
    max_loras: int = 0
    num_loras: int = 0
    """> 0: request ``i`` runs under LoRA adapter ``i % num_loras + 1``, at most
    ``max_loras`` adapters at a time."""
    structured_every: int = 0
    """> 0: every n-th request uses structured output (a grammar that accepts every token,
    compiled when the request arrives): vLLM's schedulers then build the step's grammar
    bitmask (timed with ``schedule()``) and advance each grammar with its tokens."""
    kv_cache_groups: str = "full"
    """The KV-cache groups (llmsched's field): a hybrid model's sliding-window groups
    beside a full-attention one."""
    image_every: int = 0
    """> 0: every n-th request carries an image of :data:`IMAGE_TOKENS` placeholders at
    :data:`IMAGE_OFFSET` of its prompt, one of :data:`NUM_IMAGES` (requests share them): a
    multimodal model, a tiny llava-1.5 on vLLM's side, with an encoder budget and cache of
    :data:`ENCODER_IMAGES` images."""

    def image_of(self, i: int) -> list[tuple[str, int, int]]:
        """The case's ``i``-th request's images, as ``(identifier, offset, length)``."""
        if self.image_every <= 0 or i % self.image_every:
            return []
        return [(f"image-{i // self.image_every % NUM_IMAGES}", IMAGE_OFFSET, IMAGE_TOKENS)]

    def is_structured(self, i: int) -> bool:
        """Whether the case's ``i``-th request uses structured output."""
        return self.structured_every > 0 and i % self.structured_every == 0

    def lora_of(self, i: int) -> int | None:
        """The LoRA adapter of the case's ``i``-th request, if any."""
        return i % self.num_loras + 1 if self.num_loras else None

    def max_tokens_of(self, i: int) -> int:
        """``max_tokens`` of the case's ``i``-th request."""
        if not self.churn_max_tokens:
            return self.max_tokens
        return self.churn_max_tokens + (i % self.churn_spread if self.churn_spread else 0)

    def config_kwargs(self) -> dict[str, Any]:
        num_groups = len(self.kv_cache_groups.split(","))
        blocks_per_request = num_groups * -(
            -(self.prompt_len + self.max_tokens + 4) // self.block_size
        )
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs or self.running,
            "max_num_batched_tokens": max(self.max_num_batched_tokens, self.running),
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks or self.running * blocks_per_request + 64,
            "num_speculative_tokens": self.num_speculative_tokens,
            "enable_prefix_caching": self.prefix_caching,
            "async_scheduling": False,
            "max_loras": self.max_loras,
            "kv_cache_groups": self.kv_cache_groups,
            **(
                {
                    "max_num_encoder_input_tokens": ENCODER_IMAGES * IMAGE_TOKENS,
                    "encoder_cache_size": ENCODER_IMAGES * IMAGE_TOKENS,
                }
                if self.image_every
                else {}
            ),
        }

    def vllm_kwargs(self) -> dict[str, Any]:
        """``config_kwargs`` as ``vllm_reference.make_vllm_scheduler`` takes them: with
        images, a llava-1.5 whose images are :data:`IMAGE_TOKENS` placeholders."""
        kwargs = self.config_kwargs()
        if self.image_every:
            kwargs["image_side"] = math.isqrt(IMAGE_TOKENS)
        return kwargs


#: The multimodal case's images: placeholders each (a square: llava's patches), where they
#: start in a prompt, how many distinct ones, and how many the encoder budget and cache hold.
IMAGE_TOKENS = 64
IMAGE_OFFSET = 8
NUM_IMAGES = 32
ENCODER_IMAGES = 4

CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("decode-64", running=64),
        Case("decode-256", running=256),
        Case("decode-1024", running=1024),
        Case("decode-4096", running=4096, max_tokens=3000, max_num_batched_tokens=8192),
        Case("decode-churn", running=1024, churn_max_tokens=64, churn_spread=128),
        # A hybrid model (a sliding-window group beside the full-attention one): every
        # step gives back the blocks that left the 512-token window.
        Case("hybrid-1024", running=1024, kv_cache_groups="sliding_window:512,full"),
        Case(
            "prefill-heavy",
            running=64,
            waiting=400,
            prompt_len=2000,
            churn_max_tokens=32,
            max_num_seqs=128,
            num_gpu_blocks=128 * 140,
        ),
        Case("spec-decode-k3", running=256, num_speculative_tokens=3),
        Case(
            "prefix-caching", running=256, prompt_len=1100, shared_prefix=1024, prefix_caching=True
        ),
        Case(
            "kv-pressure",
            running=256,
            prompt_len=200,
            max_tokens=4000,
            num_gpu_blocks=256 * 20,
            max_num_seqs=256,
        ),
        Case("waiting-100k", running=256, waiting=100_000, max_num_seqs=256),
        # Four adapters, two at a time: requests finish and others are admitted under
        # vLLM's max_loras rule (those under a third adapter wait).
        Case(
            "lora-churn",
            running=1024,
            churn_max_tokens=64,
            churn_spread=128,
            max_loras=2,
            num_loras=4,
        ),
        # One request in two with an image, churning: the encoder budget and cache (four
        # images) bind, images are shared and evicted.
        Case(
            "multimodal-churn",
            running=1024,
            prompt_len=96,
            churn_max_tokens=64,
            churn_spread=128,
            image_every=2,
        ),
        # One request in four under a grammar, churning: each waits for its grammar, each
        # step builds the bitmask of those decoding.
        Case(
            "structured-churn",
            running=1024,
            churn_max_tokens=64,
            churn_spread=128,
            structured_every=4,
        ),
    )
}

SCALING_RUNNING = (64, 128, 256, 512, 1024, 2048, 4096)
SCALING_WAITING = (0, 1000, 10_000, 100_000)


def _prompt(case: Case, i: int) -> list[int]:
    shared = [(7 * j) % 30000 + 1 for j in range(case.shared_prefix)]
    own = [((i * 131 + j) % 30000) + 1 for j in range(case.prompt_len - case.shared_prefix)]
    return shared + own


class Stepper(Protocol):
    """One implementation driven through a case, one step at a time."""

    between: Callable[[], None]
    """Runs, untimed, between ``schedule()`` and the update (the model step's place)."""

    def step(self) -> tuple[float, float, int, int]:
        """Runs a step: (seconds in schedule, seconds in update, requests scheduled,
        tokens scheduled)."""
        ...


def _nothing() -> None:
    pass


COLD_MIB = Range(0, 4096, integer=True)
"""The cold figure's working set, in MiB (0: no cold figure)."""


class Evictor:
    """Stands in for the work an engine does between the scheduler's calls: writes one
    byte in every 64-byte cache line of a buffer of ``mib`` MiB, which evicts what the
    scheduler left in the caches up to that size."""

    def __init__(self, mib: int) -> None:
        self.buffer = np.zeros(mib << 20, dtype=np.uint8)
        self.lines = self.buffer[::64]

    def __call__(self) -> None:
        self.lines += 1


class LlmschedStepper:
    """llmsched's ``Scheduler`` through its Python API, with a stand-in runner (untimed)
    between the calls that samples one token per request, and every draft."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.between = _nothing
        self.sched = Scheduler(SchedulerConfig(**case.config_kwargs()))
        self.known: dict[str, int] = {}
        self.next_id = 0
        for _ in range(case.running + case.waiting):
            self._add()

    def _add(self) -> None:
        case, i = self.case, self.next_id
        self.next_id += 1
        rid, prompt = f"r{i}", _prompt(case, i)
        structured = case.is_structured(i)
        self.sched.add_request(
            rid,
            prompt,
            max_tokens=case.max_tokens_of(i),
            lora_id=case.lora_of(i),
            structured_output=structured,
            mm_inputs=case.image_of(i),
        )
        if structured:
            self.sched.resolve_grammar(rid, True)
        self.known[rid] = len(prompt)

    def step(self) -> tuple[float, float, int, int]:
        sched, known, k = self.sched, self.known, self.case.num_speculative_tokens
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        # The runner (untimed): one token per request whose step reaches its known
        # tokens, plus every draft accepted.
        ids = so.req_ids
        ends = (so.num_computed_tokens + so.num_scheduled_tokens - so.num_spec_tokens).tolist()
        spec = so.num_spec_tokens.tolist()
        counts = np.zeros(len(ids), dtype=np.int32)
        for i, rid in enumerate(ids):
            if ends[i] >= known[rid]:
                counts[i] = 1 + spec[i]
                known[rid] += counts[i]
        runner_output = ModelRunnerOutput(ids, np.full(int(counts.sum()), 7, np.int32), counts)
        # Drafts flat, as a drafter holds them: K ids for each request that sampled.
        drafted = [rid for i, rid in enumerate(ids) if counts[i]]
        drafts = (
            drafted,
            np.full(k * len(drafted), 7, np.int32),
            np.full(len(drafted), k, np.int32),
        )
        self.between()
        t2 = time.perf_counter()
        outputs = sched.update_from_output(so, runner_output)
        if k:
            sched.update_draft_token_ids(*drafts)
        t3 = time.perf_counter()
        for rid in outputs.finished_req_ids:
            del known[rid]
            if self.case.churn_max_tokens:
                self._add()
        return t1 - t0, t3 - t2, len(ids), so.total_num_scheduled_tokens


class VllmStepper:
    """vLLM 0.33.0's own scheduler, driven as vLLM's engine drives it: vLLM ``Request``s in,
    ``SchedulerOutput`` and ``ModelRunnerOutput`` objects through."""

    def __init__(self, case: Case) -> None:
        from llmsched.bench.vllm_reference import make_vllm_scheduler

        self.case = case
        self.between = _nothing
        reference = make_vllm_scheduler(**case.vllm_kwargs())
        if case.structured_every:
            reference.structured_output_manager.backend = _AcceptingBackend()
        self.sched = self._scheduler(reference)
        self.next_id = 0
        for _ in range(case.running + case.waiting):
            self._add()

    def _scheduler(self, reference: Any) -> Any:
        return reference

    def _add(self) -> Any:
        from llmsched.bench.vllm_reference import make_vllm_request

        case = self.case
        request = make_vllm_request(
            f"r{self.next_id}",
            _prompt(case, self.next_id),
            max_tokens=case.max_tokens_of(self.next_id),
            block_size=case.block_size,
            prefix_caching=case.prefix_caching,
            lora_id=case.lora_of(self.next_id),
            structured_output=case.is_structured(self.next_id),
            mm_inputs=case.image_of(self.next_id),
        )
        if request.structured_output_request is not None:
            request.structured_output_request.grammar = _AcceptingGrammar()
        self.next_id += 1
        self.sched.add_request(request)
        return request

    def _samples(self, so: Any) -> dict[str, bool]:
        """Whether each request of the scheduler output samples a token this step (the
        step reaches the end of its prompt and output so far)."""
        requests, spec = self.sched.requests, so.scheduled_spec_decode_tokens
        out = {}
        for rid in so.num_scheduled_tokens:
            request = requests[rid]
            out[rid] = request.num_computed_tokens - len(spec.get(rid, ())) >= request.num_tokens
        return out

    def _finished(self, request_id: str) -> None:
        if self.case.churn_max_tokens:
            self._add()

    def step(self) -> tuple[float, float, int, int]:
        from vllm.v1.outputs import DraftTokenIds

        from llmsched.bench.vllm_reference import vllm_runner_output

        sched, k = self.sched, self.case.num_speculative_tokens
        t0 = time.perf_counter()
        so = sched.schedule()
        sched.get_grammar_bitmask(so)
        t1 = time.perf_counter()
        spec = so.scheduled_spec_decode_tokens
        sampled = {
            rid: [7] * (1 + len(spec.get(rid, ())))
            for rid, samples in self._samples(so).items()
            if samples
        }
        output = vllm_runner_output(so, sampled)
        drafts = DraftTokenIds(list(sampled), [[7] * k for _ in sampled])
        self.between()
        t2 = time.perf_counter()
        result = sched.update_from_output(so, output)
        if k:
            sched.update_draft_token_ids(drafts)
        t3 = time.perf_counter()
        for outputs in result.values():
            for out in outputs.outputs:
                if out.finish_reason is not None:
                    self._finished(out.request_id)
        return t1 - t0, t3 - t2, len(so.num_scheduled_tokens), so.total_num_scheduled_tokens


class _AcceptingGrammar:
    """A vLLM grammar that accepts every token and constrains nothing (its bitmask row
    stays as allocated): the scheduler's share of structured output, without a backend's."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False


class _AcceptingBackend:
    """The backend part vLLM's structured-output manager calls: the bitmask's allocation."""

    def allocate_token_bitmask(self, max_num_seqs: int) -> Any:
        import torch

        return torch.full((max_num_seqs, 1), -1, dtype=torch.int32)


class PluginStepper(VllmStepper):
    """``llmsched.vllm.Scheduler`` (the plug-in) driven as :class:`VllmStepper` drives
    vLLM's, on the very configs of vLLM's scheduler. The plug-in keeps no vLLM ``Request``
    to read, so the stepper counts each request's tokens itself, as a model runner does."""

    def __init__(self, case: Case) -> None:
        self.known: dict[str, int] = {}  # request id -> tokens so far
        super().__init__(case)

    def _scheduler(self, reference: Any) -> Any:
        from llmsched.bench.vllm_reference import scheduler_from

        return scheduler_from(reference)

    def _add(self) -> Any:
        request = super()._add()
        self.known[request.request_id] = request.num_prompt_tokens
        return request

    def _samples(self, so: Any) -> dict[str, bool]:
        cached = so.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for new_req in so.scheduled_new_reqs:
            computed[new_req.req_id] = new_req.num_computed_tokens
        spec, known = so.scheduled_spec_decode_tokens, self.known
        out = {}
        for rid, n in so.num_scheduled_tokens.items():
            drafts = len(spec.get(rid, ()))
            out[rid] = samples = computed[rid] + n - drafts >= known[rid]
            if samples:
                known[rid] += 1 + drafts
        return out

    def _finished(self, request_id: str) -> None:
        del self.known[request_id]
        super()._finished(request_id)


def vllm_available() -> bool:
    try:
        from llmsched.bench.vllm_reference import vllm_available as available
    except ImportError:
        return False
    return available()


@dataclass
class Measurement:
    case: str
    implementation: str
    steps: int
    requests_per_step: float
    tokens_per_step: float
    schedule_us: float
    update_us: float
    step_us: float
    samples_us: list[float] = field(repr=False, default_factory=list)

    @property
    def ns_per_request(self) -> float:
        return 1000.0 * self.step_us / max(self.requests_per_step, 1.0)

    @property
    def ns_per_token(self) -> float:
        """The step's cost per token scheduled (prompt tokens, in a prefill step)."""
        return 1000.0 * self.step_us / max(self.tokens_per_step, 1.0)


def measure(
    case: Case,
    implementation: str = "llmsched",
    *,
    steps: int = 300,
    warmup: int = 200,
    evict: Callable[[], None] | None = None,
) -> Measurement:
    """Median per-step cost over ``steps`` steps, after the case reached its steady state.

    ``evict`` (an :class:`Evictor`) runs before every timed call: the cold figure."""
    steppers: dict[str, Callable[[Case], Stepper]] = {
        "llmsched": LlmschedStepper,
        "llmsched.vllm": PluginStepper,
        "vllm": VllmStepper,
    }
    make = steppers[implementation]
    stepper = make(case)
    for _ in range(warmup):
        stepper.step()
    before_step = evict or _nothing
    stepper.between = before_step
    sched_t, upd_t, total, sizes, tokens = [], [], [], [], []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(steps):
            before_step()
            s, u, n, t = stepper.step()
            sched_t.append(s)
            upd_t.append(u)
            total.append(s + u)
            sizes.append(n)
            tokens.append(t)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Measurement(
        case=case.name,
        implementation=implementation,
        steps=steps,
        requests_per_step=statistics.fmean(sizes),
        tokens_per_step=statistics.fmean(tokens),
        schedule_us=1e6 * statistics.median(sched_t),
        update_us=1e6 * statistics.median(upd_t),
        step_us=1e6 * statistics.median(total),
        samples_us=[1e6 * t for t in total],
    )


def run_benchmarks(
    cases: list[str] | None = None,
    *,
    with_vllm: bool | None = None,
    steps: int = 300,
    scaling: bool = True,
    cold_mib: int = 8,
    print_row: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the cases (and the scaling sweeps), printing a row per case as it completes:
    warm, and cold after evicting ``cold_mib`` MiB (0: warm only)."""
    use_vllm = vllm_available() if with_vllm is None else with_vllm
    cold_mib = int(COLD_MIB.check("cold_mib", cold_mib))
    evict = Evictor(cold_mib) if cold_mib > 0 else None
    results: dict[str, Any] = {
        "cold_mib": cold_mib,
        "cases": [],
        "scaling_running": [],
        "scaling_waiting": [],
    }
    table = _Table(cold=evict is not None, vllm=use_vllm)
    print_row(table.header())
    for name in cases or list(CASES):
        entry, cells = _measure_case(CASES[name], steps, evict, use_vllm)
        print_row(table.row(cells))
        results["cases"].append(entry)
    for line in _per_token_lines(results["cases"]):
        print_row(line)
    if scaling:
        _scaling_sweeps(results, steps, print_row)
    memory = memory_in_fresh_process()
    results["memory"] = memory
    print_row("")
    print_row(
        f"memory (RSS growth, 16-token prompts): {memory['bytes_per_waiting_request']:,.0f} "
        f"bytes per waiting request, {memory['bytes_per_running_request']:,.0f} per running "
        f"request; the 100,000-request waiting queue holds "
        f"{memory['waiting_queue_rss_bytes'] / 2**20:,.1f} MiB"
    )
    return results


class _Table:
    """The printed table's columns: llmsched warm (and cold), then vLLM's and the plug-in's."""

    def __init__(self, cold: bool, vllm: bool) -> None:
        columns = [("case", -15), ("reqs/step", 10), ("schedule", 10), ("update", 10)]
        columns += [("warm step", 10), ("ns/req", 7)]
        if cold:
            columns += [("cold step", 10), ("ns/req", 7)]
        if vllm:
            columns += [("vLLM warm", 10), ("x warm", 7)]
            if cold:
                columns += [("vLLM cold", 10), ("x cold", 7)]
            columns += [("plug-in", 10), ("x plug-in", 10)]
        self.columns = columns

    def header(self) -> str:
        return self.row([name for name, _ in self.columns])

    def row(self, cells: list[str]) -> str:
        return "".join(
            f"{cell:<{-width}}" if width < 0 else f"{cell:>{width}}"
            for cell, (_, width) in zip(cells, self.columns, strict=True)
        )


def _us(m: Measurement) -> str:
    return f"{m.step_us / 1000:.2f}ms" if m.step_us >= 1000 else f"{m.step_us:.1f}us"


def _measure_case(
    case: Case, steps: int, evict: Evictor | None, use_vllm: bool
) -> tuple[dict[str, Any], list[str]]:
    """One case on llmsched (warm, and cold with ``evict``), and on vLLM and the plug-in
    with ``use_vllm``: its results entry and its table cells."""
    ours = measure(case, "llmsched", steps=steps)
    entry: dict[str, Any] = {"case": case.name, "llmsched": _plain(ours)}
    cells = [case.name, f"{ours.requests_per_step:.0f}", f"{ours.schedule_us:.1f}us"]
    cells += [f"{ours.update_us:.1f}us", _us(ours), f"{ours.ns_per_request:.0f}"]
    if evict:
        ours_cold = measure(case, "llmsched", steps=steps, evict=evict)
        entry["llmsched_cold"] = _plain(ours_cold)
        cells += [_us(ours_cold), f"{ours_cold.ns_per_request:.0f}"]
    if use_vllm:
        vllm_steps = max(30, steps // 5)
        theirs = measure(case, "vllm", steps=vllm_steps, warmup=20)
        entry["vllm"] = _plain(theirs)
        entry["ratio"] = theirs.step_us / ours.step_us
        cells += [_us(theirs), f"{entry['ratio']:.0f}x"]
        if evict:
            theirs_cold = measure(case, "vllm", steps=vllm_steps, warmup=20, evict=evict)
            entry["vllm_cold"] = _plain(theirs_cold)
            entry["ratio_cold"] = theirs_cold.step_us / ours_cold.step_us
            cells += [_us(theirs_cold), f"{entry['ratio_cold']:.0f}x"]
        # llmsched.vllm: the core behind vLLM's objects, as a vLLM engine runs it.
        plugin = measure(case, "llmsched.vllm", steps=max(30, steps // 2), warmup=50)
        entry["llmsched.vllm"] = _plain(plugin)
        entry["plugin_ratio"] = theirs.step_us / plugin.step_us
        cells += [_us(plugin), f"{entry['plugin_ratio']:.0f}x"]
    return entry, cells


def _per_token_lines(entries: list[dict[str, Any]]) -> list[str]:
    """For the cases that schedule many tokens per request, the cost per scheduled token."""
    lines = []
    for entry in entries:
        ours = entry["llmsched"]
        if ours["tokens_per_step"] < 2 * ours["requests_per_step"]:
            continue  # mostly decode: the cost per request says it
        figures = [f"{ours['ns_per_token']:.1f} ns warm"]
        if "llmsched_cold" in entry:
            figures.append(f"{entry['llmsched_cold']['ns_per_token']:.1f} cold")
        if "vllm" in entry:
            figures.append(f"vLLM {entry['vllm']['ns_per_token']:.1f}")
        lines.append(
            f"{entry['case']}: {ours['tokens_per_step']:,.0f} tokens per step, cost per "
            f"scheduled token: {', '.join(figures)}"
        )
    return lines


def _scaling_sweeps(results: dict[str, Any], steps: int, print_row: Callable[[str], None]) -> None:
    """The step's cost against running requests (linear) and waiting requests (flat)."""
    print_row("")
    print_row("per-step cost against running requests (steady decode; linear means flat ns/req):")
    for running in SCALING_RUNNING:
        m = measure(Case(f"decode-{running}", running=running, max_tokens=3000), steps=steps)
        results["scaling_running"].append({"running": running, **_plain(m)})
        print_row(
            f"  {running:>6} running  {m.step_us:>9.1f} us/step  {m.ns_per_request:>6.0f} ns/req"
        )
    print_row("per-step cost against waiting requests (256 running; must stay flat):")
    for waiting in SCALING_WAITING:
        m = measure(
            Case(f"waiting-{waiting}", running=256, waiting=waiting, max_num_seqs=256),
            steps=steps,
        )
        results["scaling_waiting"].append({"waiting": waiting, **_plain(m)})
        print_row(f"  {waiting:>6} waiting  {m.step_us:>9.1f} us/step")


def _rss_bytes() -> int:
    """This process's resident set size, from Linux's /proc (0 where it is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_per_request(waiting: int = 100_000, running: int = 4096) -> dict[str, float]:
    """Resident memory the scheduler holds per request (16-token prompts, ids kept as the
    Python strings the binding hands back): a queue of ``waiting`` waiting requests, and
    what ``running`` requests add once they run (block tables, step state). Measured as
    the growth of this process's RSS, so allocator slack is included."""
    prompt = np.arange(1, 17, dtype=np.int32)
    config = SchedulerConfig(
        max_model_len=2048,
        max_num_seqs=max(running, 256),
        max_num_batched_tokens=8192,
        num_gpu_blocks=8 * running + 64,  # 5 blocks each at most: the pool is not measured
        enable_prefix_caching=False,
        async_scheduling=False,
    )
    # Running first: memory the waiting queue freed would be reused without growing RSS.
    gc.collect()
    sched = Scheduler(config)
    before = _rss_bytes()
    for i in range(running):
        sched.add_request(f"r{i}", prompt, max_tokens=64)
    while len(sched.running_request_ids()) < running:  # admitted a token budget at a time
        so = sched.schedule()
        ends = (so.num_computed_tokens + so.num_scheduled_tokens).tolist()
        rows = [[7] if end >= len(prompt) else [] for end in ends]  # chunks sample nothing
        sched.update_from_output(so, ModelRunnerOutput.from_lists(so.req_ids, rows))
    running_rss = _rss_bytes() - before
    queue = Scheduler(config)
    before = _rss_bytes()
    for i in range(waiting):
        queue.add_request(f"w{i}", prompt, max_tokens=64)
    queue_rss = _rss_bytes() - before
    return {
        "waiting_queue_rss_bytes": queue_rss,
        "bytes_per_waiting_request": queue_rss / waiting,
        "bytes_per_running_request": running_rss / running,
    }


def memory_in_fresh_process() -> dict[str, float]:
    """:func:`memory_per_request` in a new interpreter: in this one the benchmarks before
    it have left freed heap that new requests would reuse without growing the RSS."""
    code = (
        "import json; from llmsched.bench.step import memory_per_request as m; "
        "print(json.dumps(m()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def _plain(m: Measurement) -> dict[str, Any]:
    return {
        "steps": m.steps,
        "requests_per_step": m.requests_per_step,
        "schedule_us": m.schedule_us,
        "update_us": m.update_us,
        "step_us": m.step_us,
        "ns_per_request": m.ns_per_request,
        "tokens_per_step": m.tokens_per_step,
        "ns_per_token": m.ns_per_token,
    }
