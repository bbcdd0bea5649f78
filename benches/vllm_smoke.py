"""Smoke test: vLLM 0.33.0's scheduler and llmsched, step by step on one small workload.

Run inside the vLLM reference environment::

    make vllm-smoke

Four requests (prompts of 10 to 200 tokens, 8 output tokens each) go through both
schedulers with the same trivial model runner: one token for every scheduled request whose
computed tokens reach the end of its prompt this step, an empty row for a partial prefill
chunk. The script prints each step's (request, tokens) list from both side by side and
exits non-zero on the first difference.
"""

from __future__ import annotations

import sys
from typing import Any

import llmsched.bench.vllm_reference as ref
from llmsched import ModelRunnerOutput, Scheduler, SchedulerConfig

PROMPT_LENS = (10, 75, 140, 200)
MAX_TOKENS = 8
SAMPLED_TOKEN = 7  # never a stop token here
CONFIG: dict[str, Any] = dict(
    max_model_len=1024,
    max_num_seqs=4,
    max_num_batched_tokens=128,  # small, so the longer prompts are chunked
    block_size=16,
    num_gpu_blocks=64,
)


def prompts() -> dict[str, list[int]]:
    return {
        f"r{i}": [(31 * i + j) % 1000 + 10 for j in range(n)] for i, n in enumerate(PROMPT_LENS)
    }


def sample(
    scheduled: list[tuple[str, int]], computed: dict[str, int], prompt_len: dict[str, int]
) -> dict[str, list[int]]:
    """The trivial runner: a token iff the step reaches the end of the prompt."""
    return {rid: [SAMPLED_TOKEN] for rid, n in scheduled if computed[rid] + n >= prompt_len[rid]}


def run_vllm() -> list[dict[str, Any]]:
    sched = ref.make_vllm_scheduler(**CONFIG)
    prompt_len = {}
    for rid, toks in prompts().items():
        prompt_len[rid] = len(toks)
        sched.add_request(
            ref.make_vllm_request(rid, toks, max_tokens=MAX_TOKENS, block_size=CONFIG["block_size"])
        )
    steps = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        s = ref.step_summary(out)
        sampled = sample(s["scheduled"], s["num_computed_tokens"], prompt_len)
        sched.update_from_output(out, ref.vllm_runner_output(out, sampled))
        steps.append(s)
        assert len(steps) < 1000, "vLLM did not finish"
    return steps


def run_llmsched() -> list[dict[str, Any]]:
    sched = Scheduler(
        SchedulerConfig(**CONFIG, async_scheduling=False, enable_prefix_caching=False)
    )
    prompt_len = {}
    for rid, toks in prompts().items():
        prompt_len[rid] = len(toks)
        sched.add_request(rid, toks, max_tokens=MAX_TOKENS, arrival_time=0.0)
    steps = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        ids = out.req_ids
        scheduled = [(r, int(n)) for r, n in zip(ids, out.num_scheduled_tokens, strict=True)]
        computed = {r: int(c) for r, c in zip(ids, out.num_computed_tokens, strict=True)}
        sampled = sample(scheduled, computed, prompt_len)
        rows = [sampled.get(rid, []) for rid in ids]
        sched.update_from_output(out, ModelRunnerOutput.from_lists(ids, rows))
        steps.append(
            {
                "scheduled": scheduled,
                "num_computed_tokens": computed,
                "new": list(out.new_req_ids),
                "resumed": list(out.resumed_req_ids),
                "preempted": sorted(out.preempted_req_ids),
                "finished": sorted(out.finished_req_ids),
            }
        )
        assert len(steps) < 1000, "llmsched did not finish"
    return steps


def fmt(scheduled: list[tuple[str, int]]) -> str:
    return " ".join(f"{rid}:{n}" for rid, n in scheduled) or "-"


def main() -> int:
    if not ref.vllm_available():
        print("vLLM is not importable here: run it in the vLLM 0.33.0 venv (make vllm-smoke)")
        return 2
    a, b = run_vllm(), run_llmsched()
    keys = ("scheduled", "num_computed_tokens", "new", "resumed", "preempted", "finished")
    print(f"config: {CONFIG}, prompts {PROMPT_LENS}, max_tokens {MAX_TOKENS}")
    print(f"{'step':>4}  {'vLLM 0.33.0':<44}  {'llmsched':<44}")
    mismatches = 0
    for i in range(max(len(a), len(b))):
        sa = a[i] if i < len(a) else None
        sb = b[i] if i < len(b) else None
        same = sa is not None and sb is not None and all(sa[k] == sb[k] for k in keys)
        mismatches += not same
        left = fmt(sa["scheduled"]) if sa else "(done)"
        right = fmt(sb["scheduled"]) if sb else "(done)"
        print(f"{i:>4}  {left:<44}  {right:<44}{'' if same else '  <-- DIFFERS'}")
        if not same and sa and sb:
            for k in keys:
                if sa[k] != sb[k]:
                    print(f"        {k}: vLLM {sa[k]} | llmsched {sb[k]}")
    print(f"steps: vLLM {len(a)}, llmsched {len(b)}; differing steps: {mismatches}")
    assert mismatches == 0, "vLLM and llmsched disagree"
    print("OK: identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
