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
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from llmsched._checks import COUNT, SEED, Range
from llmsched._core import MOONCAKE_BLOCK_TOKENS, prompt_token_ids

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "PRESETS",
    "LengthFit",
    "Preset",
    "RequestSpec",
    "Workload",
    "WorkloadError",
    "fit_to_max_model_len",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_workload",
    "synthetic",
]

U64_MASK = (1 << 64) - 1
"""Keys and block ids wrap to 64 bits, as the core takes them (system prompts' block ids
are negative)."""

TIMESTAMP = Range(0)
"""A Mooncake timestamp (milliseconds from the trace's start)."""
HASH_ID = Range(0, integer=True)


class WorkloadError(ValueError):
    """A workload that cannot be replayed: a bad trace row (named by file and line), a bad
    argument, or a request the configuration could never serve."""


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
    origin: str = ""
    """Where the request comes from, for error messages: ``"conv.csv, line 12"``."""

    def prompt_token_ids(self, vocab_size: int = 32000) -> npt.NDArray[np.int32]:
        """The prompt: ``prompt_len`` tokens in ``[1, vocab_size)`` of the request's own
        ``key``, or, with ``prefix_blocks``, block ``i`` the tokens of block id
        ``prefix_blocks[i]`` (requests naming a block share its tokens) and the rest its
        own; the core builds the same prompt when it replays the request."""
        return prompt_token_ids(
            self.key & U64_MASK,
            self.prompt_len,
            [b & U64_MASK for b in self.prefix_blocks],
            vocab_size,
        )


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


# Azure LLM inference trace 2023 (Patel et al., ISCA 2024): published figures.
_AZURE_CONV = Preset(
    "azure-conv",
    prompt=LengthFit(median=1020, mean=1155, maximum=14050),
    output=LengthFit(median=129, mean=211, maximum=1000),
    requests_per_second=19366 / 3600,
    source="synthetic, fitted to the Azure LLM inference trace 2023 (conversation)",
)
_AZURE_CODE = Preset(
    "azure-code",
    prompt=LengthFit(median=1469, mean=2048, maximum=7437),
    output=LengthFit(median=13, mean=28, maximum=1899),
    requests_per_second=8819 / 3600,
    source="synthetic, fitted to the Azure LLM inference trace 2023 (code)",
)
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        _AZURE_CONV,
        replace(
            _AZURE_CONV,
            name="azure-conv-chat",
            source=_AZURE_CONV.source + ", prompts opening with one of 8 shared system prompts",
            system_prompts=8,
        ),
        _AZURE_CODE,
    )
}


def synthetic(preset: str = "azure-conv", *, num_requests: int = 1000, seed: int = 0) -> Workload:
    """``num_requests`` requests drawn from a preset."""
    if preset not in PRESETS:
        raise WorkloadError(f"preset={preset!r}: not one of {', '.join(sorted(PRESETS))}")
    num_requests = int(_checked(COUNT, "num_requests", num_requests))
    seed = int(_checked(SEED, "seed", seed))
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
            origin=f"{preset} request {i}",
        )
        for i in range(num_requests)
    ]
    return Workload(preset, requests, fit.source)


def _checked(bound: Range, name: str, value: object) -> float:
    try:
        return bound.check(name, value)
    except ValueError as e:
        raise WorkloadError(str(e)) from None


def _limit(limit: int | None) -> int | None:
    return None if limit is None else int(_checked(COUNT, "limit", limit))


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def load_azure_csv(path: str | Path, *, limit: int | None = None) -> Workload:
    """The Azure LLM inference trace 2023 (CSV), arrivals relative to the first request.

    Every row is checked (three cells, a timestamp no earlier than the row before, token
    counts >= 1); a bad one raises ``WorkloadError`` naming the file and the line."""
    path = Path(path)
    limit = _limit(limit)
    requests: list[RequestSpec] = []
    start: datetime | None = None
    previous: datetime | None = None
    with _open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != list(AZURE_COLUMNS):
            raise WorkloadError(
                f"{path}, line 1: the header is {','.join(header or [])!r}, "
                f"expected {','.join(AZURE_COLUMNS)!r} (an Azure LLM inference trace CSV)"
            )
        for row in reader:
            if limit is not None and len(requests) >= limit:
                break
            where = f"{path}, line {reader.line_num}"
            if len(row) != len(AZURE_COLUMNS):
                raise WorkloadError(
                    f"{where}: {len(row)} cells {row!r}, expected {len(AZURE_COLUMNS)} "
                    f"({','.join(AZURE_COLUMNS)})"
                )
            stamp = _azure_time(row[0])
            if stamp is None:
                raise WorkloadError(
                    f"{where}: TIMESTAMP={row[0]!r} is not a time (YYYY-MM-DD HH:MM:SS.fffffff)"
                )
            if previous is not None and stamp < previous:
                raise WorkloadError(
                    f"{where}: TIMESTAMP={row[0]!r} is earlier than the row before's "
                    f"({previous}): a trace lists requests in arrival order"
                )
            start = start or stamp
            previous = stamp
            prompt_len, output_len = (
                int(_cell(COUNT, where, name, text))
                for name, text in zip(AZURE_COLUMNS[1:], row[1:], strict=True)
            )
            requests.append(
                RequestSpec(
                    f"{path.stem}-{len(requests)}",
                    (stamp - start).total_seconds(),
                    prompt_len,
                    output_len,
                    key=len(requests) + 1,
                    origin=where,
                )
            )
    return _nonempty(
        Workload(path.stem, requests, f"Azure LLM inference trace 2023 ({path.name})"), path
    )


_AZURE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")


def _azure_time(text: str) -> datetime | None:
    """``YYYY-MM-DD HH:MM:SS[.fraction]`` (the trace has seven fractional digits: more than
    datetime keeps, and more than Python 3.10's ``fromisoformat`` reads)."""
    match = _AZURE_TIME.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    microsecond = int((match.group(7) or "0").ljust(6, "0")[:6])
    try:
        return datetime(year, month, day, hour, minute, second, microsecond)
    except ValueError:
        return None


def _cell(bound: Range, where: str, name: str, text: str) -> float:
    try:
        return bound.parse(text.strip())
    except ValueError:
        raise WorkloadError(f"{where}: {name}={text!r}: must be {bound.describe()}") from None


def _field(bound: Range, where: str, row: dict[str, Any], name: str) -> float:
    if name not in row:
        raise WorkloadError(f"{where}: no {name!r} field")
    value = row[name]
    try:
        return bound.check(name, value)
    except ValueError as e:
        raise WorkloadError(f"{where}: {e}") from None


def _open(path: Path, newline: str | None = None) -> Any:
    try:
        return path.open(newline=newline, encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WorkloadError(f"{path}: a directory, not a trace file") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot be read ({e.strerror})") from None


def _nonempty(workload: Workload, path: Path) -> Workload:
    if not workload.requests:
        raise WorkloadError(f"{path}: the trace has no requests")
    return workload


def _lines(f: Any, path: Path) -> Iterator[tuple[int, str]]:
    try:
        yield from enumerate(f, start=1)
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def load_mooncake_jsonl(path: str | Path, *, limit: int | None = None) -> Workload:
    """The Mooncake trace (JSONL); prompts built from ``hash_ids`` so shared ids share tokens.

    Every line is checked (a JSON object with ``timestamp`` no earlier than the line
    before's, ``input_length`` and ``output_length`` >= 1, and at most one ``hash_ids``
    entry per 512 prompt tokens); a bad one raises ``WorkloadError`` naming the file and
    the line. Blank lines are skipped."""
    path = Path(path)
    limit = _limit(limit)
    requests: list[RequestSpec] = []
    previous = 0.0
    with _open(path) as f:
        for number, line in _lines(f, path):
            if limit is not None and len(requests) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise WorkloadError(f"{where}: expected a JSON object, got {line.strip()[:60]!r}")
            timestamp = _field(TIMESTAMP, where, row, "timestamp")
            if timestamp < previous:
                raise WorkloadError(
                    f"{where}: timestamp={row['timestamp']!r} is earlier than the line before's "
                    f"({previous:g}): a trace lists requests in arrival order"
                )
            previous = timestamp
            prompt_len = int(_field(COUNT, where, row, "input_length"))
            output_len = int(_field(COUNT, where, row, "output_length"))
            hash_ids = row.get("hash_ids", [])
            if not isinstance(hash_ids, list):
                raise WorkloadError(f"{where}: hash_ids={hash_ids!r}: must be a list of ids")
            try:
                blocks = tuple(
                    int(HASH_ID.check(f"hash_ids[{i}]", h)) for i, h in enumerate(hash_ids)
                )
            except ValueError as e:
                raise WorkloadError(f"{where}: {e}") from None
            most = -(-prompt_len // MOONCAKE_BLOCK_TOKENS)
            if len(blocks) > most:
                raise WorkloadError(
                    f"{where}: {len(blocks)} hash_ids for input_length={prompt_len}: at most "
                    f"{most} (one per {MOONCAKE_BLOCK_TOKENS} prompt tokens)"
                )
            requests.append(
                RequestSpec(
                    f"{path.stem}-{len(requests)}",
                    timestamp / 1000.0,
                    prompt_len,
                    output_len,
                    key=len(requests) + 1,
                    prefix_blocks=blocks,
                    origin=where,
                )
            )
    return _nonempty(Workload(path.stem, requests, f"Mooncake FAST'25 trace ({path.name})"), path)


def load_workload(
    source: str, *, limit: int | None = None, num_requests: int = 1000, seed: int = 0
) -> Workload:
    """A preset name, or a trace file (``.csv``: Azure, ``.jsonl``: Mooncake)."""
    if source in PRESETS:
        return synthetic(source, num_requests=_limit(limit) or num_requests, seed=seed)
    path = Path(source)
    if path.suffix == ".csv":
        return load_azure_csv(path, limit=limit)
    if path.suffix in (".jsonl", ".json"):
        return load_mooncake_jsonl(path, limit=limit)
    raise WorkloadError(
        f"workload={source!r}: not a preset ({', '.join(sorted(PRESETS))}) "
        "nor a .csv (Azure) or .jsonl (Mooncake) trace"
    )


def fit_to_max_model_len(
    workload: Workload, max_model_len: int, num_sampled_tokens_per_step: int = 1
) -> Workload:
    """Shortens requests that would not fit: outputs to ``M - 1``, then prompts so that
    ``prompt + output <= M`` and ``prompt <= M - s`` (a serving front-end truncates prompts
    likewise); ``s`` is the config's ``num_sampled_tokens_per_step``."""
    fitted: list[RequestSpec] = []
    truncated = 0
    for spec in workload.requests:
        output_len = min(spec.output_len, max_model_len - 1)
        prompt_len = min(
            spec.prompt_len, max_model_len - max(output_len, num_sampled_tokens_per_step)
        )
        if (prompt_len, output_len) != (spec.prompt_len, spec.output_len):
            truncated += 1
            spec = replace(spec, prompt_len=prompt_len, output_len=output_len)
        fitted.append(spec)
    return Workload(workload.name, fitted, workload.source, workload.truncated + truncated)
