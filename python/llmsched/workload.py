"""Workloads to replay: public trace files, and synthetic presets fitted to them.

A workload is a list of ``RequestSpec``: arrival time, prompt length, output length, and
(for the Mooncake trace) the ids of the 512-token prompt blocks that requests share. Prompt
tokens are built on demand, deterministically, so a replay never holds every prompt in
memory and the same workload gives the same tokens on every machine.

Formats (see ``shared/traces/README.md`` of the project's workplace):

- Azure LLM inference trace 2023 (CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``);
- Mooncake FAST'25 trace (JSONL: ``timestamp`` in ms, ``input_length``, ``output_length``,
  ``hash_ids``: prompts sharing a leading run of ids share that prefix);
- synthetic presets: log-normal prompt and output lengths whose median and mean match a
  trace's published figures (``sigma = sqrt(2 ln(mean / median))``), clipped to its maximum,
  with Poisson arrivals at its mean rate.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "PRESETS",
    "LengthFit",
    "Preset",
    "RequestSpec",
    "Workload",
    "fit_to_max_model_len",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_workload",
    "synthetic",
]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry of the Mooncake trace."""


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer, on arrays (numpy wraps uint64 arithmetic silently)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _tokens(key: int, count: int, vocab_size: int) -> npt.NDArray[np.int32]:
    """``count`` tokens in ``[1, vocab_size)`` determined by ``key``."""
    base = np.uint64((key * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF)
    index = np.arange(count, dtype=np.uint64)
    values = _mix(index + base) % np.uint64(vocab_size - 1)
    return (values + np.uint64(1)).astype(np.int32)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. ``prompt_token_ids()`` builds its prompt on demand."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    key: int
    """Seeds the prompt's tokens (requests without shared blocks)."""
    prefix_blocks: tuple[int, ...] = ()
    """Mooncake ``hash_ids``: block ``i`` of the prompt is tokens of id ``prefix_blocks[i]``."""

    def prompt_token_ids(self, vocab_size: int = 32000) -> npt.NDArray[np.int32]:
        if not self.prefix_blocks:
            return _tokens(self.key, self.prompt_len, vocab_size)
        blocks = [
            _tokens((0x4D6F_6F6E << 32) + block_id, MOONCAKE_BLOCK_TOKENS, vocab_size)
            for block_id in self.prefix_blocks
        ]
        shared = np.concatenate(blocks)
        if len(shared) >= self.prompt_len:
            return shared[: self.prompt_len]
        # The rest of the prompt is the request's own.
        own = _tokens(self.key, self.prompt_len - len(shared), vocab_size)
        return np.concatenate([shared, own])


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: list[RequestSpec]
    source: str
    truncated: int = 0
    """Requests shortened to fit ``max_model_len``."""

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival_time if self.requests else 0.0


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
    system_prompts: int = 0
    """> 0: each prompt starts with one of this many shared system prompts of
    ``MOONCAKE_BLOCK_TOKENS`` tokens (chosen with Zipf weights, so a few are common), as
    chat deployments send them."""


PRESETS: dict[str, Preset] = {
    # Azure LLM inference trace 2023 (Patel et al., ISCA 2024): published figures.
    "azure-conv": Preset(
        "azure-conv",
        prompt=LengthFit(median=1020, mean=1155, maximum=14050),
        output=LengthFit(median=129, mean=211, maximum=1000),
        requests_per_second=19366 / 3600,
        source="synthetic, fitted to the Azure LLM inference trace 2023 (conversation)",
    ),
    "azure-conv-chat": Preset(
        "azure-conv-chat",
        prompt=LengthFit(median=1020, mean=1155, maximum=14050),
        output=LengthFit(median=129, mean=211, maximum=1000),
        requests_per_second=19366 / 3600,
        source="synthetic, fitted to the Azure LLM inference trace 2023 (conversation), "
        "prompts opening with one of 8 shared system prompts",
        system_prompts=8,
    ),
    "azure-code": Preset(
        "azure-code",
        prompt=LengthFit(median=1469, mean=2048, maximum=7437),
        output=LengthFit(median=13, mean=28, maximum=1899),
        requests_per_second=8819 / 3600,
        source="synthetic, fitted to the Azure LLM inference trace 2023 (code)",
    ),
}


def synthetic(preset: str = "azure-conv", *, num_requests: int = 1000, seed: int = 0) -> Workload:
    """``num_requests`` requests drawn from a preset."""
    fit = PRESETS[preset]
    rng = np.random.default_rng(seed)
    prompt_lens = fit.prompt.sample(rng, num_requests)
    output_lens = fit.output.sample(rng, num_requests)
    gaps = rng.exponential(1.0 / fit.requests_per_second, size=num_requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    keys = rng.integers(0, 2**62, size=num_requests)
    systems: list[tuple[int, ...]] = [()] * num_requests
    if fit.system_prompts:
        weights = 1.0 / np.arange(1, fit.system_prompts + 1)
        choice = rng.choice(fit.system_prompts, size=num_requests, p=weights / weights.sum())
        # A system prompt is one shared block id of MOONCAKE_BLOCK_TOKENS tokens.
        systems = [(-1 - int(c),) for c in choice]
    requests = [
        RequestSpec(
            f"{preset}-{i}",
            float(arrivals[i]),
            int(prompt_lens[i]),
            int(output_lens[i]),
            int(keys[i]),
            systems[i],
        )
        for i in range(num_requests)
    ]
    return Workload(preset, requests, fit.source)


def load_azure_csv(path: str | Path, *, limit: int | None = None) -> Workload:
    """The Azure LLM inference trace 2023 (CSV), arrivals relative to the first request."""
    path = Path(path)
    requests: list[RequestSpec] = []
    start: datetime | None = None
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit is not None and i >= limit:
                break
            # Seven fractional digits: trim to the microseconds datetime parses.
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            start = start or stamp
            requests.append(
                RequestSpec(
                    f"{path.stem}-{i}",
                    (stamp - start).total_seconds(),
                    max(1, int(row["ContextTokens"])),
                    max(1, int(row["GeneratedTokens"])),
                    key=i + 1,
                )
            )
    return Workload(path.stem, requests, f"Azure LLM inference trace 2023 ({path.name})")


def load_mooncake_jsonl(path: str | Path, *, limit: int | None = None) -> Workload:
    """The Mooncake trace (JSONL); prompts built from ``hash_ids`` so shared ids share tokens."""
    path = Path(path)
    requests: list[RequestSpec] = []
    with path.open() as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            requests.append(
                RequestSpec(
                    f"{path.stem}-{i}",
                    float(row["timestamp"]) / 1000.0,
                    max(1, int(row["input_length"])),
                    max(1, int(row["output_length"])),
                    key=i + 1,
                    prefix_blocks=tuple(int(h) for h in row["hash_ids"]),
                )
            )
    return Workload(path.stem, requests, f"Mooncake FAST'25 trace ({path.name})")


def load_workload(
    source: str, *, limit: int | None = None, num_requests: int = 1000, seed: int = 0
) -> Workload:
    """A preset name, or a trace file (``.csv``: Azure, ``.jsonl``: Mooncake)."""
    if source in PRESETS:
        return synthetic(source, num_requests=limit or num_requests, seed=seed)
    path = Path(source)
    if path.suffix == ".csv":
        return load_azure_csv(path, limit=limit)
    if path.suffix in (".jsonl", ".json"):
        return load_mooncake_jsonl(path, limit=limit)
    raise ValueError(
        f"workload={source!r}: not a preset ({', '.join(sorted(PRESETS))}) "
        "nor a .csv (Azure) or .jsonl (Mooncake) trace"
    )


def fit_to_max_model_len(workload: Workload, max_model_len: int) -> Workload:
    """Shortens requests that would not fit: outputs to ``M - 1``, then prompts so that
    ``prompt + output <= M`` (a serving front-end truncates prompts likewise)."""
    fitted: list[RequestSpec] = []
    truncated = 0
    for spec in workload.requests:
        output_len = min(spec.output_len, max_model_len - 1)
        prompt_len = min(spec.prompt_len, max_model_len - output_len)
        if (prompt_len, output_len) != (spec.prompt_len, spec.output_len):
            truncated += 1
            spec = RequestSpec(
                spec.request_id,
                spec.arrival_time,
                prompt_len,
                output_len,
                spec.key,
                spec.prefix_blocks,
            )
        fitted.append(spec)
    return Workload(workload.name, fitted, workload.source, workload.truncated + truncated)
