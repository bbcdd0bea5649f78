"""The ``llmsched`` console script, run as a user runs it: in a subprocess.

Bad input ends it with one line on stderr that names the culprit (flag, or file and line),
exit status 2, no traceback and no report; Ctrl-C gives a partial report and 130; a closed
pipe ends it quietly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.refusals import one_line

from llmsched import SchedulerConfig
from llmsched.sim.cli import SIMULATE_DEFAULTS, WITHOUT_FLAGS
from llmsched.sim.cli import parser as simulate_parser
from llmsched.sim.plots import chart_paths

SCRIPT = Path(sys.executable).with_name("llmsched")
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"
LATER_ROW = "2023-11-16 18:15:47.0000000,200,10\n"
SMALL = ["simulate", "--num-requests", "4", "--no-progress"]


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"the console script is not installed at {SCRIPT}"
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def refused(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """Asserts a refusal: exit 2, one line on stderr naming every ``names``, no report."""
    line = one_line(result, *names)
    assert "TTFT" not in result.stdout  # no report, not even a partial one
    return line


def trace(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ trace rows


@pytest.mark.parametrize(
    ("text", "line", "names"),
    [
        ("ts,prompt,output\n" + ROW, 1, ["header", "TIMESTAMP,ContextTokens,GeneratedTokens"]),
        (AZURE_HEADER + "2023-11-16 18:15:46.6805900,374\n", 2, ["2 cells"]),
        (AZURE_HEADER + ROW + "2023-11-16 18:15:47.0,12a,4\n", 3, ["ContextTokens", "'12a'"]),
        (AZURE_HEADER + "yesterday,12,4\n", 2, ["TIMESTAMP", "'yesterday'"]),
        (AZURE_HEADER + "2023-11-16 18:15:46.6805900,374,0\n", 2, ["GeneratedTokens", "'0'"]),
        (AZURE_HEADER + "2023-11-16 18:15:46.6805900,-5,3\n", 2, ["ContextTokens", "'-5'"]),
        (AZURE_HEADER + LATER_ROW + ROW, 3, ["TIMESTAMP", "earlier"]),
    ],
    ids=["wrong-header", "short-row", "non-numeric", "bad-time", "zero", "negative", "order"],
)
def test_a_bad_azure_row_is_named_by_file_and_line(
    tmp_path: Path, text: str, line: int, names: list[str]
) -> None:
    path = trace(tmp_path, "azure.csv", text)
    refused(run("simulate", path, "--no-progress"), f"{path}, line {line}", *names)


@pytest.mark.parametrize(
    ("text", "line", "names"),
    [
        ('{"timestamp": 0, "input_length": 10, "hash_ids": [0]}\n', 1, ["'output_length'"]),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
            '{"timestamp": 5, "input_length": 10, "output_length": -2}\n',
            2,
            ["output_length=-2"],
        ),
        ('{"timestamp": 0, "input_length": "10", "output_length": 2}\n', 1, ["input_length"]),
        ('{"timestamp": 0, "input_length": 10, "output_length": 2}\n[1, 2]\n', 2, ["JSON object"]),
        ('{"timestamp": 0, "input_length": 10\n', 1, ["not JSON"]),
        (
            '{"timestamp": 9, "input_length": 10, "output_length": 2}\n'
            '{"timestamp": 3, "input_length": 10, "output_length": 2}\n',
            2,
            ["timestamp=3", "earlier"],
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]}\n',
            1,
            ["2 hash_ids", "input_length=10"],
        ),
        ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [-1]}\n', 1, []),
    ],
    ids=[
        "no-output_length",
        "negative",
        "string",
        "not-an-object",
        "not-json",
        "order",
        "hash-ids-beyond-prompt",
        "negative-hash-id",
    ],
)
def test_a_bad_mooncake_line_is_named_by_file_and_line(
    tmp_path: Path, text: str, line: int, names: list[str]
) -> None:
    path = trace(tmp_path, "mooncake.jsonl", text)
    refused(run("simulate", path, "--no-progress"), f"{path}, line {line}", *names)


def test_a_header_only_trace_is_refused_not_reported_as_nans(tmp_path: Path) -> None:
    path = trace(tmp_path, "empty.csv", AZURE_HEADER)
    refused(run("simulate", path), path, "no requests")
    refused(run("simulate", trace(tmp_path, "empty.jsonl", "\n")), "empty.jsonl", "no requests")


def test_a_missing_trace_and_an_unknown_workload_are_named(tmp_path: Path) -> None:
    refused(run("simulate", str(tmp_path / "gone.csv")), "gone.csv", "no such file")
    refused(run("simulate", "no-such-preset"), "workload='no-such-preset'", "azure-conv")


def test_a_request_whose_kv_could_outgrow_the_pool_is_named_by_its_row(tmp_path: Path) -> None:
    path = trace(tmp_path, "big.csv", AZURE_HEADER + ROW + "2023-11-16 18:15:47.0,4000,800\n")
    line = refused(
        run(
            "simulate", path, "--no-progress", "--max-model-len", "16384", "--num-gpu-blocks", "300"
        ),
        f"{path}, line 3",
        "outgrows the KV pool",
    )
    assert "299 usable blocks" in line


# ------------------------------------------------------------------ flags


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--num-requests", "0"], ["--num-requests", "'0'"]),
        (["--limit", "-3"], ["--limit", "'-3'"]),
        (["--seed", "-1"], ["--seed"]),
        (["--fixed-ms", "-6"], ["--fixed-ms", "'-6'"]),
        (["--decode-context-ms", "nan"], ["--decode-context-ms", "'nan'"]),
        (["--time-scale", "-1"], ["--time-scale", "'-1'"]),
        (["--time-scale", "0"], ["--time-scale"]),
        (["--acceptance-rate", "1.5"], ["--acceptance-rate"]),
        (["--num-requests", "many"], ["--num-requests", "'many'"]),
        (["--max-num-seqs", "0"], ["max_num_seqs", "0"]),
        (["--policy", "lifo"], ["policy", "lifo"]),
    ],
    ids=lambda v: "_".join(v) if isinstance(v, list) else None,
)
def test_a_bad_number_is_refused_where_it_is_parsed(flags: list[str], names: list[str]) -> None:
    refused(run(*SMALL, *flags), *names)


def test_an_unknown_flag_or_command_is_one_line_naming_it() -> None:
    result = run("simulate", "--num-request", "5")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "llmsched simulate: error: unrecognized arguments: --num-request"
        " (see llmsched simulate --help)\n"
    )
    result = run("simulte")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "invalid choice: 'simulte'" in result.stderr and "'simulate'" in result.stderr


def test_help_has_no_rest_markup_and_every_flag_has_help_and_its_default() -> None:
    top = run("--help")
    assert top.returncode == 0 and "``" not in top.stdout
    for command in ("simulate", "bench"):
        result = run(command, "--help")
        assert result.returncode == 0
        assert "``" not in result.stdout and ":class:" not in result.stdout
        options = result.stdout.split("options:", 1)[1]
        # Each option's entry: its flags, then its help text (which may wrap).
        entries = re.split(r"\n  (?=-)", options)[1:]
        assert entries
        for entry in entries:
            flags, _, text = entry.partition("  ")
            if flags.startswith("-h"):
                continue
            assert text.strip(), f"{command}: {flags} has no help text"
            assert "default" in " ".join(entry.split()), f"{command}: {flags} shows no default"


def test_each_config_flags_help_is_the_fields_own_documentation() -> None:
    helps = {action.dest: action.help or "" for action in simulate_parser()._actions}
    assert not set(WITHOUT_FLAGS) & set(helps)
    for name in set(SchedulerConfig().to_dict()) - set(WITHOUT_FLAGS):
        doc = " ".join((getattr(SchedulerConfig, name).__doc__ or "").split()).replace("``", "")
        opening = " ".join(helps[name].split()[:5]).rstrip(";.")
        assert len(opening) > 10 and doc.startswith(opening), (name, helps[name], doc)
    assert helps["max_num_batched_tokens"].startswith("The input budget of a step")


def test_the_cli_defaults_are_the_librarys_or_the_help_says_why() -> None:
    help_text = " ".join(run("simulate", "--help").stdout.split())
    library = SchedulerConfig().to_dict()
    for name in ("max_model_len", "max_num_seqs", "num_gpu_blocks"):
        assert SIMULATE_DEFAULTS[name] != library[name]
        assert f"SchedulerConfig's default: {library[name]:,}" in help_text
    assert "vLLM's are sized for small GPUs" in help_text
    for name, value in library.items():
        flag = "--" + name.replace("_", "-")
        if name in WITHOUT_FLAGS:
            assert flag not in help_text
        elif name not in SIMULATE_DEFAULTS and not isinstance(value, bool) and value is not None:
            assert flag in help_text


# ------------------------------------------------------------------ destinations


def test_output_destinations_are_checked_before_the_replay(tmp_path: Path) -> None:
    started = time.monotonic()
    refused(run(*SMALL, "--json", str(tmp_path / "missing" / "r.json")), "--json", "missing")
    refused(run(*SMALL, "--json", str(tmp_path)), "--json", "a folder")
    a_file = tmp_path / "charts"
    a_file.write_text("not a folder")
    refused(run(*SMALL, "--plot", str(a_file)), "--plot", "a file")
    assert time.monotonic() - started < 60


def test_plot_without_matplotlib_gives_the_readmes_install_hint(tmp_path: Path) -> None:
    # A matplotlib that cannot be imported, ahead of any installed one.
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    line = refused(run(*SMALL, "--plot", str(tmp_path / "charts"), env=env), "--plot")
    assert "pip install 'llmsched[plot]'" in line
    readme = Path(__file__).resolve().parents[1] / "README.md"
    if readme.exists():  # the source tree's README (absent where only the wheel is)
        assert "pip install 'llmsched[plot]'" in readme.read_text()


def test_chart_file_names_carry_the_workloads_name(tmp_path: Path) -> None:
    a = chart_paths(tmp_path, "conv")
    b = chart_paths(tmp_path, "azure-conv-chat")
    assert not set(a) & set(b)
    assert [p.name for p in a] == ["conv_kv_and_queues.png", "conv_latency_cdfs.png"]
    assert all(p.parent == tmp_path for p in (*a, *b))
    assert chart_paths(tmp_path, "../x y")[0].name == "x_y_kv_and_queues.png"


def test_plots_of_two_workloads_share_a_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for preset in ("azure-conv", "azure-code"):
        result = run(*SMALL, preset, "--plot", str(tmp_path))
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for w in ("azure-conv", "azure-code") for p in chart_paths(tmp_path, w)
    )


# ------------------------------------------------------------------ interruption, pipes, output


def test_ctrl_c_prints_a_partial_report_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "partial.json"
    process = subprocess.Popen(
        [str(SCRIPT), "simulate", "--num-requests", "200000", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    # The header is printed once the workload is checked, as the replay starts.
    header = process.stdout.readline() + process.stdout.readline()
    assert "200,000 requests" in header
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "of 200,000 (partial" in stdout and "TTFT" in stdout
    assert "partial report" in stdout
    report = json.loads(out.read_text())
    assert report["partial"] is True and report["num_requests"] == 200_000
    assert report["num_finished"] < 200_000


def test_ctrl_c_in_a_terminal_stops_bench_with_one_line() -> None:
    """A terminal's Ctrl-C signals the whole process group: bench and the single-threaded
    interpreter it reruns itself in. One "interrupted" line, status 130, no traceback."""
    process = subprocess.Popen(
        [str(SCRIPT), "bench", "decode-64", "--steps", "100000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(3.0)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.splitlines() == ["llmsched: interrupted"]


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    # Enough requests that the report is written after the pipe is closed: a replay of
    # 30 can finish, its report in the pipe's buffer, before the reader closes it.
    process = subprocess.Popen(
        [str(SCRIPT), "simulate", "--num-requests", "50000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith("llmsched simulate:")
    process.stdout.close()  # as `| head -1` does
    stderr = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=120) == 141
    assert stderr == ""


def test_the_report_is_plain_text_in_a_pipe_and_a_table_in_a_terminal() -> None:
    piped = run(*SMALL, env={"NO_COLOR": "1", "TERM": "dumb"})
    assert piped.returncode == 0
    assert "\x1b[" not in piped.stdout
    assert re.search(r"^  requests +4 finished of 4$", piped.stdout, re.M)
    assert re.search(r"^  TTFT \(s\) +p50 ", piped.stdout, re.M)
    # FORCE_COLOR makes rich treat the pipe as a terminal.
    terminal = run(*SMALL, env={"FORCE_COLOR": "1", "COLUMNS": "120"})
    assert terminal.returncode == 0
    assert "\x1b[" in terminal.stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", terminal.stdout)
    assert re.search(r"requests +4 finished of 4", plain)


def test_bench_reports_warm_and_cold_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ("--steps", "5", "--no-scaling", "--vllm", "off", "--cold-mib", "2", "--json")
    result = run("bench", *args, str(out), "decode-64")
    assert result.returncode == 0, result.stderr
    assert "warm step" in result.stdout and "cold step" in result.stdout
    report = json.loads(out.read_text())
    assert report["cold_mib"] == 2
    (case,) = report["cases"]
    for figure in ("llmsched", "llmsched_cold"):
        assert case[figure]["requests_per_step"] == 64 and case[figure]["step_us"] > 0
    assert report["memory"]["bytes_per_waiting_request"] > 0


def test_bench_refuses_a_negative_cold_working_set() -> None:
    result = run("bench", "--cold-mib", "-1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("llmsched bench: error: argument --cold-mib")


def test_the_cold_figure_evicts_before_each_timed_call() -> None:
    """Before ``schedule()`` and again before the update, every timed step."""
    from llmsched.bench.step import CASES, LlmschedStepper, measure

    calls: list[str] = []
    measure(CASES["decode-64"], steps=4, warmup=2, evict=lambda: calls.append("evict"))
    assert calls == ["evict"] * 8
    # ``between`` runs while the step is in flight: after schedule(), before the update.
    stepper = LlmschedStepper(CASES["decode-64"])
    in_flight: list[int] = []
    stepper.between = lambda: in_flight.append(stepper.sched.num_steps_in_flight)
    stepper.step()
    assert in_flight == [1]


def test_the_lora_case_runs_two_of_its_four_adapters_at_a_time() -> None:
    from llmsched.bench.step import CASES, LlmschedStepper

    stepper = LlmschedStepper(CASES["lora-churn"])
    for _ in range(3):
        _, _, scheduled, _ = stepper.step()
    running = {stepper.sched.get_request(rid).lora_id for rid in stepper.known}
    assert running == {1, 2, 3, 4}  # every adapter has requests, running or waiting
    assert 0 < scheduled < CASES["lora-churn"].running  # half of them wait


def test_the_multimodal_case_is_bound_by_its_encoder() -> None:
    """Its first step encodes as many images as the budget holds (four, one output each in a
    cache of four), so most requests with an image wait; their prompts done, the four
    outputs stay cached unreferenced until the next images need the room."""
    from llmsched.bench.step import CASES, ENCODER_IMAGES, IMAGE_TOKENS, LlmschedStepper

    case = CASES["multimodal-churn"]
    stepper = LlmschedStepper(case)
    _, _, scheduled, _ = stepper.step()
    assert stepper.sched.encoder_cache_state() == (0, ENCODER_IMAGES * IMAGE_TOKENS, ENCODER_IMAGES)
    assert 0 < scheduled < case.running


# ------------------------------------------------------------------ pages of figures


def test_a_markdown_page_gets_one_section_per_workload_and_keeps_its_prose(
    tmp_path: Path,
) -> None:
    page = tmp_path / "simulate.md"
    page.write_text("# Figures\n\nProse written by hand.\n")
    first = run(*SMALL, "--markdown", str(page))
    assert first.returncode == 0, first.stderr
    text = page.read_text()
    assert text.startswith("# Figures\n\nProse written by hand.\n")
    section = text.split("<!-- section simulate azure-conv-chat -->", 1)[1]
    # The command line that measured it (less the page), then what it printed.
    assert "`llmsched simulate --num-requests 4 --no-progress`" in section
    assert "4 finished of 4" in section and "TTFT (s)" in section
    assert "written to" not in section
    # Again with other figures: the section is replaced, not appended, and another
    # workload gets a section of its own.
    again = run("simulate", "--num-requests", "6", "--no-progress", "--markdown", str(page))
    assert again.returncode == 0, again.stderr
    run(*SMALL, "azure-code", "--markdown", str(page))
    text = page.read_text()
    assert text.count("<!-- section simulate azure-conv-chat -->") == 1
    conv = text.split("<!-- section simulate azure-conv-chat -->", 1)[1].split("<!-- /", 1)[0]
    assert "6 finished of 6" in conv and "4 finished of 4" not in conv
    assert "<!-- section simulate azure-code -->" in text
    assert text.startswith("# Figures\n\nProse written by hand.\n")


def test_a_markdown_page_that_cannot_be_written_is_refused_before_the_replay(
    tmp_path: Path,
) -> None:
    refused(run(*SMALL, "--markdown", str(tmp_path)), "--markdown", str(tmp_path))
    missing = tmp_path / "no" / "page.md"
    refused(run(*SMALL, "--markdown", str(missing)), "--markdown", str(missing))


def test_bench_writes_its_table_as_a_section(tmp_path: Path) -> None:
    page = tmp_path / "performance.md"
    result = run(
        "bench", "decode-64", "--steps", "5", "--no-scaling", "--cold-mib", "0",
        "--vllm", "off", "--markdown", str(page),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    section = page.read_text().split("<!-- section bench -->", 1)[1]
    assert "`llmsched bench decode-64 --steps 5" in section
    assert "--markdown" not in section
    table_row = next(line for line in result.stdout.splitlines() if line.startswith("decode-64"))
    assert table_row in section


# ------------------------------------------------------------------ --cost-model

COST_FILE = {
    "cost_model": {
        "fixed_ms": 1.5,
        "prefill_request_ms": 0.2,
        "new_request_ms": 0.1,
        "finished_request_ms": 0.05,
        "prefill_token_ms": 0.02,
        "prefill_attention_ms": 1e-6,
        "decode_request_ms": 0.3,
        "first_decode_ms": 0.04,
        "decode_context_ms": 0.0001,
        "kv_block_ms": 0.002,
        "add_request_ms": 0.5,
        "add_batch_ms": 0.3,
        "wake_ms": 0.7,
        "new_shape_ms": 0.9,
        "scheduler_step_ms": 0.03,
        "scheduler_request_ms": 0.001,
        "scheduler_token_ms": 0.0,
    },
    "engine": {"max_model_len": 4096, "max_num_seqs": 4, "num_gpu_blocks": 1024},
}


def _simulated(tmp_path: Path, *flags: str) -> dict[str, object]:
    out = tmp_path / "report.json"
    result = run(*SMALL, *flags, "--json", str(out))
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(out.read_text())
    return report


def test_a_cost_model_file_sets_the_terms_and_the_engine_and_flags_override_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(COST_FILE))
    default = _simulated(tmp_path)
    fitted = _simulated(tmp_path, "--cost-model", str(path))
    assert fitted["cost_model"] == COST_FILE["cost_model"]
    config = fitted["config"]
    assert isinstance(config, dict)
    for name, value in COST_FILE["engine"].items():
        assert config[name] == value
    assert fitted["latency_seconds"] != default["latency_seconds"]
    overridden = _simulated(
        tmp_path, "--cost-model", str(path), "--max-num-seqs", "2", "--fixed-ms", "9"
    )
    config = overridden["config"]
    cost = overridden["cost_model"]
    assert isinstance(config, dict) and isinstance(cost, dict)
    assert config["max_num_seqs"] == 2 and config["num_gpu_blocks"] == 1024
    assert cost["fixed_ms"] == 9 and cost["decode_request_ms"] == 0.3


def test_scheduler_cost_takes_the_schedulers_terms_from_another_file(tmp_path: Path) -> None:
    """--scheduler-cost FILE: the scheduler's terms from FILE, every other term (and the
    engine) from --cost-model; a slower scheduler makes every latency longer."""
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps(COST_FILE))
    slow = json.loads(json.dumps(COST_FILE))
    slow["cost_model"] = {name: 0.0 for name in slow["cost_model"]}
    slow["cost_model"].update(scheduler_step_ms=2.0, scheduler_request_ms=0.5)
    del slow["engine"]
    scheduler = tmp_path / "vllm.json"
    scheduler.write_text(json.dumps(slow))
    fast = _simulated(tmp_path, "--cost-model", str(engine))
    swapped = _simulated(tmp_path, "--cost-model", str(engine), "--scheduler-cost", str(scheduler))
    cost = swapped["cost_model"]
    assert isinstance(cost, dict)
    for name, value in COST_FILE["cost_model"].items():
        expected = slow["cost_model"][name] if name.startswith("scheduler_") else value
        assert cost[name] == expected, name
    assert swapped["config"] == fast["config"]
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("p50", "p90"):
            assert swapped["latency_seconds"][metric][stat] > fast["latency_seconds"][metric][stat]
    flagged = _simulated(
        tmp_path, "--scheduler-cost", str(scheduler), "--scheduler-request-ms", "0.25"
    )["cost_model"]
    assert isinstance(flagged, dict)
    assert flagged["scheduler_request_ms"] == 0.25 and flagged["scheduler_step_ms"] == 2.0
    del slow["cost_model"]["scheduler_token_ms"]
    scheduler.write_text(json.dumps(slow))
    refused(
        run(*SMALL, "--cost-model", str(engine), "--scheduler-cost", str(scheduler)),
        "--scheduler-cost",
        str(scheduler),
        "cost_model.scheduler_token_ms",
        "calibrate again",
    )
    # Every refusal of the file names the flag it came by.
    for broken in ([], {**COST_FILE, "engine": []}):
        scheduler.write_text(json.dumps(broken))
        refused(
            run(*SMALL, "--cost-model", str(engine), "--scheduler-cost", str(scheduler)),
            f"--scheduler-cost {scheduler}:",
        )


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (
            lambda d: d["cost_model"].pop("decode_context_ms"),
            ["cost_model.decode_context_ms", "missing"],
        ),
        (lambda d: d["cost_model"].update(fixed_ms=-2), ["cost_model.fixed_ms=-2"]),
        (lambda d: d["cost_model"].update(fixed_ms="fast"), ["cost_model.fixed_ms='fast'"]),
        (lambda d: d["cost_model"].update(warp_ms=1), ["cost_model.warp_ms", "not a term"]),
        (lambda d: d["engine"].update(max_num_sequences=3), ["engine.max_num_sequences"]),
        (lambda d: d.update(extra=1), ["unknown key 'extra'"]),
    ],
)
def test_a_bad_cost_model_file_is_one_line_naming_the_file_and_the_entry(
    tmp_path: Path, change: object, names: list[str]
) -> None:
    data = json.loads(json.dumps(COST_FILE))
    change(data)  # type: ignore[operator]
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(data))
    refused(run(*SMALL, "--cost-model", str(path)), "--cost-model", str(path), *names)


def test_a_cost_model_file_that_is_not_json_or_missing_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text("{fixed_ms: 1")
    refused(run(*SMALL, "--cost-model", str(path)), str(path), "not JSON")
    refused(run(*SMALL, "--cost-model", str(tmp_path / "none.json")), "cannot read it")


def test_a_diffusion_llm_is_refused_in_one_line() -> None:
    """Nothing sampled with a canvas of drafts is a diffusion LLM, which the simulated model
    does not run (before the core served diffusion models, simulate ran it as pooling)."""
    result = run(
        "simulate",
        "--num-requests",
        "20",
        "--no-progress",
        "--num-sampled-tokens-per-step",
        "0",
        "--num-speculative-tokens",
        "3",
    )
    refused(result, "num_sampled_tokens_per_step=0", "diffusion LLM")
