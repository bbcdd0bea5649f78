"""The virtual duration of a model step: what ``llmsched simulate`` charges for each step.

    step = fixed + prefill_token * prefill tokens + decode_request * decode requests
                 + kv_token * context tokens read by attention

A scheduled request counts as a decode request when its step is one sampled position plus
its draft slots; every other scheduled token counts as a prefill token. The defaults are
sized for an 8B-parameter model on one datacenter GPU; every term can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from llmsched._checks import Range
from llmsched._core import SchedulerOutput

__all__ = ["COST_TERM", "CostModel"]

COST_TERM = Range(0)
"""Every cost-model term, in milliseconds."""


@dataclass(frozen=True, slots=True)
class CostModel:
    """Virtual duration of one model step, in milliseconds per unit (each field's
    ``metadata["help"]`` says what it charges for)."""

    fixed_ms: float = field(default=6.0, metadata={"help": "cost of every step"})
    prefill_token_ms: float = field(default=0.06, metadata={"help": "per prompt token computed"})
    decode_request_ms: float = field(default=0.08, metadata={"help": "per request decoding"})
    kv_token_ms: float = field(
        default=0.00002, metadata={"help": "per context token read by attention"}
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            COST_TERM.check(f.name, getattr(self, f.name))

    def step_seconds(self, so: SchedulerOutput) -> float:
        n = so.num_scheduled_tokens.astype(np.int64)
        if len(n) == 0:
            return 0.0
        decode = (n - so.num_spec_tokens) == 1
        prefill_tokens = int(n[~decode].sum())
        context_tokens = int((so.num_computed_tokens + n).sum())
        ms = (
            self.fixed_ms
            + self.prefill_token_ms * prefill_tokens
            + self.decode_request_ms * int(decode.sum())
            + self.kv_token_ms * context_tokens
        )
        return ms / 1000.0
