"""How a command's refusal of bad input looks, for the command-line tests."""

from __future__ import annotations

import subprocess


def one_line(run: subprocess.CompletedProcess[str], *names: str) -> str:
    """Asserts a refusal: exit status 2, no traceback, one line on stderr naming every one
    of ``names``; returns the line."""
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
