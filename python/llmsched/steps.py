"""What a step asks of the model, in the terms a step-cost model charges for.

One home for the step's shape: ``llmsched simulate``'s cost model charges it, and the vLLM
plug-in's step log (:data:`STEP_LOG_ENV`) records it beside the time the engine took, for
``llmsched calibrate`` to fit the cost model to; and for the log's name and format, which the
plug-in writes and ``calibrate`` reads.

A scheduled request counts as a decode request when its step is one sampled position plus
its draft slots; every other scheduled token counts as a prefill token; the context tokens
are those attention reads (each request's computed tokens after the step).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from llmsched._core import SchedulerOutput

__all__ = ["STEP_LOG_ENV", "STEP_LOG_FORMAT", "StepShape", "step_shape"]

STEP_LOG_ENV = "LLMSCHED_STEP_LOG"
"""The environment variable that turns the plug-in's step log on: the file it appends to."""
STEP_LOG_FORMAT = "llmsched-step-log/1"
"""The step log header's format marker."""


class StepShape(NamedTuple):
    """A step's prefill tokens, decode requests and context tokens (see the module doc)."""

    prefill_tokens: int
    decode_requests: int
    context_tokens: int


def step_shape(so: SchedulerOutput) -> StepShape:
    """The shape of a step the core decided, read from its columns."""
    n = so.num_scheduled_tokens.astype(np.int64)
    if len(n) == 0:
        return StepShape(0, 0, 0)
    decode = (n - so.num_spec_tokens) == 1
    return StepShape(
        prefill_tokens=int(n[~decode].sum()),
        decode_requests=int(decode.sum()),
        context_tokens=int((so.num_computed_tokens + n).sum()),
    )
