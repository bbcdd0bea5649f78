"""Lets ``pytest tests/parity`` run in the vLLM 0.33.0 venv as it is.

pyproject's ``addopts`` passes ``--benchmark-disable``, an option of pytest-benchmark, which
a vLLM venv without ``requirements.txt`` installed (plain ``make vllm-env``) does not
have; without it pytest refuses the option before collecting anything. Where
pytest-benchmark is missing, this registers the option as a no-op; where it is installed,
pytest-benchmark's own stays.
"""

from __future__ import annotations

import contextlib

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    with contextlib.suppress(ValueError):  # already registered by pytest-benchmark
        parser.addoption(
            "--benchmark-disable",
            action="store_true",
            default=False,
            help="no-op here: pytest-benchmark is not installed",
        )
