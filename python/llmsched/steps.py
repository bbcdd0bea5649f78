"""What a step asks of the model, in the terms a step-cost model charges for.

One home for the step's shape: ``llmsched simulate``'s cost model charges it, and the vLLM
plug-in's step log (:data:`STEP_LOG_ENV`) records it beside the time the engine took, for
``llmsched calibrate`` to fit the cost model to; and for the log's name and format, which the
plug-in writes and ``calibrate`` reads.

A scheduled request decodes when its step is one sampled position plus its draft slots, and
prefills otherwise (a prompt chunk, or the tokens a resumed request recomputes). The shape
counts what a step's cost grows with: the prefilling requests, those the runner sets up (new
or resumed) and lets go (finished at the step before), the prefill tokens and the attention
they compute (each chunk of ``n`` tokens after ``C`` computed ones attends to
``n*C + n*(n+1)/2`` positions), the decode requests, those decoding for the first time, and
the context the decode requests read (``C + n`` each).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from llmsched._core import SchedulerOutput

__all__ = ["STEP_LOG_ENV", "STEP_LOG_FORMAT", "StepShape", "step_shape"]

STEP_LOG_ENV = "LLMSCHED_STEP_LOG"
"""The environment variable that turns the plug-in's step log on: the file it appends to."""
STEP_LOG_FORMAT = "llmsched-step-log/2"
"""The step log header's format marker."""


class StepShape(NamedTuple):
    """What a step asks of the model (see the module doc)."""

    prefill_requests: int
    new_requests: int
    finished_requests: int
    prefill_tokens: int
    prefill_attention: int
    decode_requests: int
    first_decodes: int
    decode_context: int


def step_shape(so: SchedulerOutput) -> StepShape:
    """The shape of a step the core decided, read from its columns."""
    n = so.num_scheduled_tokens.astype(np.int64)
    if len(n) == 0:
        return StepShape(0, 0, 0, 0, 0, 0, 0, 0)
    c = so.num_computed_tokens.astype(np.int64)
    decode = (n - so.num_spec_tokens) == 1
    prefill = ~decode
    n_p, c_p = n[prefill], c[prefill]
    return StepShape(
        prefill_requests=int(prefill.sum()),
        new_requests=len(so.new_req_ids) + len(so.resumed_req_ids),
        finished_requests=len(so.finished_req_ids),
        prefill_tokens=int(n_p.sum()),
        prefill_attention=int((n_p * c_p + n_p * (n_p + 1) // 2).sum()),
        decode_requests=int(decode.sum()),
        first_decodes=int((so.num_output_tokens[decode] == 1).sum()),
        decode_context=int((c[decode] + n[decode]).sum()),
    )
