"""``simulate --measured REPORT``: a real engine's figures beside the prediction's.

The measured report here is a simulation's own JSON report under another cost model (it
has ``replay-engine``'s shape; the engine suite compares with a real engine's): the
comparison must carry each figure of both reports and the prediction's error, computed
here from the two reports; a report of another replay, or one missing a figure, is one line
naming it, before the replay.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.refusals import one_line

SCRIPT = Path(sys.executable).with_name("llmsched")
REPLAY = ("azure-conv", "--num-requests", "24", "--no-progress")
#: Where each compared figure sits in a report (the same list as the command's, written
#: out again so that a change to one is caught by the other).
FIGURES = {
    "TTFT p50": ("latency_seconds", "ttft", "p50"),
    "TTFT p90": ("latency_seconds", "ttft", "p90"),
    "TPOT p50": ("latency_seconds", "tpot", "p50"),
    "TPOT p90": ("latency_seconds", "tpot", "p90"),
    "E2E p50": ("latency_seconds", "e2e", "p50"),
    "E2E p90": ("latency_seconds", "e2e", "p90"),
    "output tok/s": ("throughput", "output_tokens_per_s"),
}


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), "simulate", *args], capture_output=True, text=True, timeout=120
    )


def _at(report: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = report
    for key in path:
        value = value[key]
    return float(value)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("measured") / "engine.json"
    run = _simulate(*REPLAY, "--fixed-ms", "9", "--json", str(path))
    assert run.returncode == 0, run.stderr
    return path


def test_the_report_carries_both_figures_and_the_error(measured: Path, tmp_path: Path) -> None:
    out = tmp_path / "predicted.json"
    run = _simulate(*REPLAY, "--measured", str(measured), "--json", str(out))
    assert run.returncode == 0, run.stderr
    engine, predicted = json.loads(measured.read_text()), json.loads(out.read_text())
    rows = {row["metric"]: row for row in predicted["measured"]}
    assert list(rows) == list(FIGURES)
    for label, path in FIGURES.items():
        want, got = _at(engine, path), _at(predicted, path)
        assert rows[label]["measured"] == pytest.approx(want)
        assert rows[label]["predicted"] == pytest.approx(got)
        assert rows[label]["error"] == pytest.approx((got - want) / want)
        assert f"measured {label}" in run.stdout
    # A 6 ms step costs less than a 9 ms one: every latency is predicted lower.
    assert all(rows[label]["error"] < 0 for label in FIGURES if label.startswith("E2E"))


def test_a_report_of_another_replay_isone_line(measured: Path) -> None:
    other = [*REPLAY]
    other[2] = "12"
    one_line(_simulate(*other, "--measured", str(measured)), "--measured", "24", "12")


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (
            lambda r: r["latency_seconds"]["tpot"].pop("p90"),
            ["latency_seconds.tpot.p90", "missing"],
        ),
        (lambda r: r["throughput"].update(output_tokens_per_s="fast"), ["output_tokens_per_s"]),
    ],
)
def test_a_report_missing_a_figure_isone_line(
    measured: Path, tmp_path: Path, edit: Any, names: list[str]
) -> None:
    report = json.loads(measured.read_text())
    edit(report)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    one_line(_simulate(*REPLAY, "--measured", str(bad)), str(bad), *names)


def test_the_plots_draw_the_measured_cdfs_too(measured: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = _simulate(*REPLAY, "--measured", str(measured), "--plot", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert len(list(tmp_path.glob("*_latency_cdfs.png"))) == 1
