"""Workloads to replay: synthetic presets fitted to public traces' published figures.

A preset draws prompt and output lengths from log-normal distributions whose median and
mean match the trace's (``sigma = sqrt(2 ln(mean / median))``), clipped to the trace's
maximum, and Poisson arrivals at the trace's mean rate. Token ids are drawn from a seeded
generator: the same seed gives the same workload on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["PRESETS", "LengthFit", "Preset", "RequestSpec", "synthetic"]


@dataclass(frozen=True, slots=True)
class LengthFit:
    """A log-normal length distribution given by its median, mean and maximum."""

    median: float
    mean: float
    maximum: int

    def sample(self, rng: np.random.Generator, size: int) -> npt.NDArray[np.int64]:
        sigma = math.sqrt(2.0 * math.log(self.mean / self.median))
        values = rng.lognormal(mean=math.log(self.median), sigma=sigma, size=size)
        return np.clip(np.rint(values), 1, self.maximum).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    prompt: LengthFit
    output: LengthFit
    requests_per_second: float
    source: str


PRESETS: dict[str, Preset] = {
    # Azure LLM inference trace 2023 (Patel et al., ISCA 2024), figures from shared/traces.
    "azure-conv": Preset(
        "azure-conv",
        prompt=LengthFit(median=1020, mean=1155, maximum=14050),
        output=LengthFit(median=129, mean=211, maximum=1000),
        requests_per_second=19366 / 3600,
        source="Azure LLM inference trace 2023, conversation",
    ),
    "azure-code": Preset(
        "azure-code",
        prompt=LengthFit(median=1469, mean=2048, maximum=7437),
        output=LengthFit(median=13, mean=28, maximum=1899),
        requests_per_second=8819 / 3600,
        source="Azure LLM inference trace 2023, code",
    ),
}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    request_id: str
    arrival_time: float
    prompt_token_ids: npt.NDArray[np.int32]
    max_tokens: int


def synthetic(
    preset: str = "azure-conv",
    *,
    num_requests: int = 1000,
    max_model_len: int = 16384,
    seed: int = 0,
    vocab_size: int = 32000,
) -> list[RequestSpec]:
    """``num_requests`` requests of a preset; prompts that would not leave room for their
    outputs under ``max_model_len`` are shortened, as a serving front-end truncates them."""
    fit = PRESETS[preset]
    rng = np.random.default_rng(seed)
    prompt_lens = fit.prompt.sample(rng, num_requests)
    output_lens = fit.output.sample(rng, num_requests)
    gaps = rng.exponential(1.0 / fit.requests_per_second, size=num_requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    specs = []
    for i in range(num_requests):
        output_len = int(min(output_lens[i], max_model_len - 1))
        prompt_len = int(max(1, min(prompt_lens[i], max_model_len - output_len)))
        tokens = rng.integers(0, vocab_size, size=prompt_len, dtype=np.int32)
        specs.append(RequestSpec(f"req-{i}", float(arrivals[i]), tokens, output_len))
    return specs
