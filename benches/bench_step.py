"""Per-step cost of ``schedule()`` + ``update_from_output()`` in steady decode.

Disabled by default (``--benchmark-disable`` in pyproject): a plain ``pytest`` runs each
case once, as a test. ``pytest benches --benchmark-enable`` measures.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmsched import ModelRunnerOutput, Scheduler, SchedulerConfig


def steady_decode(num_running: int) -> tuple[Scheduler, Any]:
    """``num_running`` requests past their prefill, each decoding one token per step."""
    cfg = SchedulerConfig(
        max_model_len=8192,
        max_num_seqs=num_running,
        max_num_batched_tokens=max(8192, num_running),
        num_gpu_blocks=num_running * 64 + 1,
        async_scheduling=False,
    )
    sched = Scheduler(cfg)
    for i in range(num_running):
        sched.add_request(f"r{i}", [i % 1000 + 1] * 16, max_tokens=4000)
    while True:
        so = sched.schedule()
        ones = np.ones(len(so.req_ids), dtype=np.int32)
        sched.update_from_output(so, ModelRunnerOutput(so.req_ids, ones * 7, ones))
        if sched.get_request_counts()[1] == 0 and len(so.req_ids) == num_running:
            break

    def one_step() -> int:
        so = sched.schedule()
        counts = np.ones(len(so.req_ids), dtype=np.int32)
        outs = sched.update_from_output(so, ModelRunnerOutput(so.req_ids, counts * 7, counts))
        return len(outs)

    return sched, one_step


@pytest.mark.parametrize("num_running", [64, 256, 1024])
def test_steady_decode_step(benchmark: Any, num_running: int) -> None:
    sched, one_step = steady_decode(num_running)
    assert benchmark(one_step) == num_running
    sched.check_invariants()
