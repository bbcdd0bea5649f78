"""Random small parity cases: odd configs and workloads the matrix does not cover.

Each seed gives one case (:func:`make_case`): block sizes down to 1, ``max_model_len``
from 24, tiny KV pools (down to the largest request's blocks plus one), tiny token
budgets, one to eight sequences, ``K`` up to 5, chunked prefill on or off, long-prefill
thresholds (0 or at least ``1 + K``, see the harness docstring), watermarks, FCFS or
priority with tied arrival times, prompts sharing prefixes, planted stops, aborts.

Only cases that keep out of the deviations the harness does not compare
(``harness.deviation_triggers``): token budgets are raised to fit a padded decode
(``1 + K``: llmsched refuses a smaller budget, vLLM accepts it and can block forever), and
under the priority policy tied ``(priority, arrival_time)`` keys are moved apart by the
smallest float step (``harness.unique_priority_keys``; on a tie the two schedulers pick
different victims on purpose). Both adjustments come after every random draw, so a seed
gives the same case as before wherever it did not need them.

``test_parity`` runs a few seeds; more from the command line, in the vLLM 0.33.0 venv
(``make vllm-env`` installs llmsched there)::

    "$(benches/vllm-env.sh reference)"/bin/python -m benches.parity.fuzz 0 2000

prints every seed whose steps differ, with the first difference, then the cases and steps
compared and what they exercised, and exits non-zero if any differ.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter

from .harness import (
    ParityConfig,
    ParityRequest,
    blocks_needed,
    coverage,
    describe,
    deviation_triggers,
    run_case,
    unique_priority_keys,
)

__all__ = ["make_case"]

_SUMMARY_COUNTS = (
    "preemptions",
    "resumptions",
    "prefix_hit_admissions",
    "padded_admissions",
    "draft_slots",
    "finished_stop",
    "finished_length",
    "uncached_blocks",
)
"""The ``harness.coverage`` counts the summary line totals over all seeds."""


def make_case(seed: int) -> tuple[ParityConfig, list[ParityRequest]]:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 8, 16])
    max_model_len = rng.randint(24, 400)
    max_num_seqs = rng.randint(1, 8)
    k = rng.choice([0, 0, 1, 2, 3, 5])
    chunked = rng.random() < 0.85
    if chunked:
        # At least 1 + K: a padded decode must fit one step (llmsched refuses less).
        budget = max(rng.randint(max(max_num_seqs, 2), 96), 1 + k)
    else:  # vLLM requires max_num_batched_tokens >= max_model_len without chunking
        budget = rng.randint(max_model_len, max_model_len + 64)
    threshold = 0 if rng.random() < 0.6 else rng.randint(1 + k, max_model_len)
    async_scheduling = rng.random() < 0.5
    prefix_caching = rng.random() < 0.6
    policy = rng.choice(["fcfs", "priority"])
    watermark = rng.choice([0.0, 0.0, 0.01, 0.1])

    prefixes = [[rng.randint(10, 31000) for _ in range(max_model_len)] for _ in range(3)]
    requests = []
    for i in range(rng.randint(1, 16)):
        if rng.random() < 0.5:
            prompt_len = rng.randint(1, max_model_len - 1)
        else:
            prompt_len = rng.randint(1, max(1, max_model_len // 4))
        if rng.random() < 0.6:  # share a prefix with other requests
            shared = rng.randint(0, prompt_len)
            prompt = rng.choice(prefixes)[:shared]
            prompt += [rng.randint(10, 31000) for _ in range(prompt_len - shared)]
        else:
            prompt = [rng.randint(10, 31000) for _ in range(prompt_len)]
        max_tokens = rng.randint(1, max_model_len) if rng.random() < 0.3 else rng.randint(1, 40)
        u = rng.random()
        eos_at = rng.randrange(max_tokens) if u < 0.2 else None
        stop_id, stop_at = (None, None)
        if 0.2 <= u < 0.35:
            stop_id, stop_at = rng.randint(3, 9), rng.randrange(max_tokens)
        arrival = rng.randint(0, 25)
        requests.append(
            ParityRequest(
                request_id=f"r{i}",
                prompt=tuple(prompt),
                max_tokens=max_tokens,
                arrival_step=arrival,
                arrival_time=float(rng.choice([0, arrival, i])),  # ties: broken below
                priority=rng.randint(0, 2) if policy == "priority" else 0,
                eos_at=eos_at,
                stop_token_id=stop_id,
                stop_at=stop_at,
                abort_step=arrival + rng.randint(0, 30) if rng.random() < 0.1 else None,
            )
        )
    probe = ParityConfig(
        "probe",
        async_scheduling,
        k,
        prefix_caching,
        policy,
        num_gpu_blocks=1 << 30,
        max_model_len=max_model_len,
        block_size=block_size,
    )
    largest = max(blocks_needed(r, probe) for r in requests)
    config = ParityConfig(
        f"fuzz-{seed}",
        async_scheduling=async_scheduling,
        num_speculative_tokens=k,
        enable_prefix_caching=prefix_caching,
        policy=policy,
        num_gpu_blocks=largest + 1 + rng.choice([0, 0, 1, 3, 10, 50, 1000]),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        block_size=block_size,
        long_prefill_token_threshold=threshold,
        watermark=watermark,
        enable_chunked_prefill=chunked,
    )
    if policy == "priority":
        requests = unique_priority_keys(requests)
    found = deviation_triggers(config, requests)
    assert not found, f"seed {seed}: {found}"
    return config, requests


def main(argv: list[str]) -> int:
    start = int(argv[0]) if argv else 0
    count = int(argv[1]) if len(argv) > 1 else 200
    started = time.perf_counter()
    differing = 0
    steps = steps_identical = 0
    totals: Counter[str] = Counter()
    for seed in range(start, start + count):
        config, requests = make_case(seed)
        comparison, vllm_run, llmsched_run = run_case(config, requests)
        steps += comparison.steps_compared
        steps_identical += comparison.steps_identical
        totals.update(coverage(vllm_run))
        if not comparison.identical:
            differing += 1
            print(f"seed {seed} DIFFERS: {config}")
            print(describe(comparison, context=3, runs=(vllm_run, llmsched_run)), flush=True)
    elapsed = time.perf_counter() - started
    exercised = ", ".join(f"{key} {totals[key]:,}" for key in _SUMMARY_COUNTS)
    print(
        f"seeds {start}..{start + count - 1}: {count - differing} of {count} cases identical "
        f"at every step, {differing} differ; {steps_identical:,} of {steps:,} steps identical "
        f"({elapsed:.0f} s)\nexercised (vLLM's side): {exercised}"
    )
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
