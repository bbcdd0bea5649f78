"""llmsched simulate [WORKLOAD] replays a workload (a preset name, an Azure .csv or a
Mooncake .jsonl trace) through the engine and the simulated runner in virtual time and
reports throughput, latencies, preemptions, prefix-cache hits and KV usage. Every
SchedulerConfig field is a flag (--max-num-seqs 128, --no-async-scheduling...).

Bad input (a flag, a trace row, an output path) ends the command before the replay with
one line on stderr naming it, and exit status 2. Ctrl-C ends the replay, prints the
report of what was replayed so far marked partial, and exits with status 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from llmsched._checks import COUNT, SEED, Range
from llmsched._cli import (
    Formatter,
    Parser,
    add_config_flags,
    command_line,
    config_from_flags,
    default_of,
    json_destination,
    markdown_destination,
    number,
    write_markdown_section,
)
from llmsched._core import SchedulerConfig
from llmsched.sim.compare import comparison, load_measured
from llmsched.sim.cost import COST_TERM, CostModel, load_cost_model
from llmsched.sim.plots import PLOT_HINT, write_plots
from llmsched.sim.report import SimulationReport
from llmsched.sim.simulate import ACCEPTANCE_RATE, TIME_SCALE, simulate
from llmsched.sim.workload import PRESETS, Workload, load_workload

__all__ = ["SIMULATE_DEFAULTS", "WITHOUT_FLAGS", "main", "parser"]


# The simulator's defaults where they differ from SchedulerConfig's: vLLM's class defaults
# (which SchedulerConfig keeps) are sized for small GPUs; the simulated GPU is an 8B model
# on one 80 GB datacenter GPU: a long context, a large batch, and a pool of 16,384 blocks
# (262k tokens, the model's KV in about 34 GB).
SIMULATE_DEFAULTS: dict[str, Any] = {
    "max_model_len": 16384,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "num_gpu_blocks": 16384,
}

#: ``SchedulerConfig`` fields of an engine's observers: no one takes KV cache events or
#: block residency events in a simulation (whose clock is not the wall's).
OBSERVERS = ("enable_kv_cache_events", "kv_cache_metrics_sample")
#: ``SchedulerConfig`` fields ``simulate`` has no flag for: its workloads cannot exercise
#: them (no request names a LoRA adapter), its engine has no use for them (the observers')
#: or does not model them yet (one pipeline stage, one full-attention KV-cache group, a
#: model that samples: not an encoder instance).
WITHOUT_FLAGS = (
    "max_loras",
    "mm_encoder_only",
    *OBSERVERS,
    "pipeline_parallel_size",
    "kv_cache_groups",
    "prefix_cache_retention_interval",
    "mamba_prefill_checkpoint_alignment",
)


def parser() -> argparse.ArgumentParser:
    """The command's argument parser: the workload, the replay's options, the cost model's
    terms and every ``SchedulerConfig`` field."""
    sim = Parser(
        prog="llmsched simulate",
        description=__doc__,
        formatter_class=Formatter,
        allow_abbrev=False,
    )
    sim.add_argument(
        "workload",
        nargs="?",
        default="azure-conv-chat",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a trace file (.csv, .jsonl)",
    )
    # The numbers a replay takes: flag, range, metavar, default (the library's), help.
    numbers: list[tuple[str, Range, str, Any, str]] = [
        ("--limit", COUNT, "N", None, "replay only the first N requests (default: all of a trace)"),
        ("--num-requests", COUNT, "N", default_of(load_workload, "num_requests"),
         "requests drawn from a preset"),
        ("--seed", SEED, "N", default_of(simulate, "seed"),
         "seeds a preset's draws and the simulated runner's tokens"),
        ("--time-scale", TIME_SCALE, "X", default_of(simulate, "time_scale"),
         "multiply arrival times by X (> 1: slower arrivals)"),
        ("--acceptance-rate", ACCEPTANCE_RATE, "P", default_of(simulate, "acceptance_rate"),
         "probability that a draft token is accepted (spec decode)"),
    ]  # fmt: skip
    for flag, bound, metavar, default, help in numbers:
        sim.add_argument(flag, type=number(bound), metavar=metavar, default=default, help=help)
    sim.add_argument(
        "--cost-model",
        metavar="FILE",
        help="a cost model for an engine (JSON: its terms, and the scheduler settings it was "
        "measured under); the flags below still override it",
    )
    sim.add_argument(
        "--scheduler-cost",
        metavar="FILE",
        help="the scheduler's terms from another cost-model file (one `llmsched calibrate "
        "--scheduler vllm` wrote: the engine under vLLM's own scheduler); flags still override",
    )
    sim.add_argument(
        "--measured",
        metavar="REPORT",
        help="a real engine's report of the same replay (llmsched replay-engine --json): its "
        "figures beside the prediction's, with the errors, in the report and the charts",
    )
    sim.add_argument("--json", metavar="PATH", help="write the full report as JSON to PATH")
    sim.add_argument(
        "--plot",
        metavar="DIR",
        help=f"write PNG charts into DIR, named after the workload ({PLOT_HINT})",
    )
    sim.add_argument(
        "--markdown",
        metavar="PAGE",
        help="also write the report (and the charts of --plot) as a section of the markdown "
        "page PAGE, one section per workload (the page's other sections and prose are kept)",
    )
    sim.add_argument(
        "--no-progress", action="store_true", help="no progress bar (none when stderr is a pipe)"
    )
    cost = sim.add_argument_group(
        "cost model (milliseconds)",
        "step = fixed + each term below x its count in the step, the scheduler's own time"
        " included; add_request is charged once per request when it arrives",
    )
    for f in fields(CostModel):
        cost.add_argument(
            "--" + f.name.replace("_", "-"),
            type=number(COST_TERM),
            metavar="MS",
            default=f.default,
            help=f.metadata["help"],
        )
    add_config_flags(
        sim,
        SIMULATE_DEFAULTS,
        "vLLM's are sized for small GPUs, the simulated GPU is an 8B model on one 80 GB GPU",
        omit=WITHOUT_FLAGS,
    )
    return sim


def _plot_destination(path: str | None) -> Path | None:
    """Refuses, before any work, a chart folder that could not be written (creating it if
    need be), or charts without matplotlib."""
    if path is None:
        return None
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--plot {path}: a file, not a folder")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"--plot needs matplotlib: {PLOT_HINT}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--plot {path}: cannot create the folder ({e.strerror})") from None
    if not os.access(out, os.W_OK):
        raise ValueError(f"--plot {path}: not writable")
    return out


class _Output:
    """The report on stdout: a rich table in a terminal, plain aligned text in a pipe."""

    def __init__(self) -> None:
        from rich.console import Console

        console = Console()
        self.console = console if console.is_terminal else None
        self.lines: list[str] = []
        """Everything printed, as plain text."""

    def line(self, text: str) -> None:
        self.lines.append(text)
        if self.console is None:
            print(text, flush=True)
        else:
            self.console.print(text, markup=False, highlight=True)

    def report(self, report: SimulationReport) -> None:
        self.lines.extend(report.table().splitlines())
        if self.console is None:
            print(report.table())
            return
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for name, value in report.rows():
            style = "yellow" if report.partial and name == "requests" else None
            table.add_row(name, value, style=style)
        self.console.print(table)

    def header(self, config: SchedulerConfig, replayed: Workload) -> None:
        self.line(
            f"llmsched simulate: {replayed.name} ({replayed.source}), "
            f"{len(replayed.requests):,} requests"
        )
        self.line(
            f"  {'async' if config.async_scheduling else 'sync'} scheduling, "
            f"K={config.num_speculative_tokens}, max_model_len={config.max_model_len:,}, "
            f"max_num_seqs={config.max_num_seqs}, "
            f"max_num_batched_tokens={config.max_num_batched_tokens:,}, "
            f"KV {config.num_gpu_blocks:,} blocks x {config.block_size} tokens, "
            f"prefix caching {'on' if config.enable_prefix_caching else 'off'}, {config.policy}"
        )


def main(argv: list[str]) -> int:
    """Runs ``llmsched simulate ARGV``; returns the exit status (0: every request finished,
    1: some did not, 130: interrupted). Bad input raises, for the caller to report."""
    sim = parser()
    args = sim.parse_args(argv)
    if args.cost_model is not None or args.scheduler_cost is not None:
        # The files' values become the defaults: the flags given still win.
        cost, engine = CostModel(), {}
        if args.cost_model is not None:
            model = load_cost_model(args.cost_model)
            # An engine that published KV events or block residency: nothing takes them in
            # a simulation.
            cost = model.cost
            engine = {k: v for k, v in model.engine.items() if k not in OBSERVERS}
        if args.scheduler_cost is not None:
            cost = cost.with_scheduler_of(
                load_cost_model(args.scheduler_cost, "--scheduler-cost").cost
            )
        sim.set_defaults(**{f.name: getattr(cost, f.name) for f in fields(CostModel)}, **engine)
        args = sim.parse_args(argv)
    config = config_from_flags(args)
    json_path = json_destination(args.json)
    page = markdown_destination(args.markdown)
    plot_dir = _plot_destination(args.plot)
    workload = load_workload(
        args.workload, limit=args.limit, num_requests=args.num_requests, seed=args.seed
    )
    measured = (
        None
        if args.measured is None
        else load_measured(
            args.measured, workload=workload.name, num_requests=len(workload.requests)
        )
    )
    cost = CostModel(**{f.name: getattr(args, f.name) for f in fields(CostModel)})
    out = _Output()
    report = simulate(
        config,
        workload,
        cost=cost,
        seed=args.seed,
        acceptance_rate=args.acceptance_rate,
        time_scale=args.time_scale,
        progress=not args.no_progress and sys.stderr.isatty(),
        interruptible=True,
        on_start=lambda replayed: out.header(config, replayed),
    )
    if measured is not None:
        report.measured = comparison(asdict(report), measured)
    out.report(report)
    if report.truncated_requests:
        out.line(f"  ({report.truncated_requests:,} requests truncated to max_model_len)")
    if report.partial:
        out.line("  (partial report: the replay was interrupted)")
    if json_path is not None:
        json_path.write_text(report.to_json())
        out.line(f"  report written to {json_path}")
    charts = write_plots(report, plot_dir, measured) if plot_dir is not None else []
    for path in charts:
        out.line(f"  chart written to {path}")
    if page is not None:
        key = f"simulate {report.workload}"
        lines = [line for line in out.lines if "written to" not in line]
        write_markdown_section(page, key, command_line("llmsched simulate", argv), lines, charts)
        out.line(f"  section '{key}' written to {page}")
    if report.partial:
        return 130
    return 0 if report.num_finished == report.num_requests else 1
