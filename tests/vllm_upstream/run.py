"""Run vLLM 0.33.0's own scheduler unit tests against ``llmsched.vllm``.

Usage (in a venv holding ``vllm==0.33.0``, with llmsched importable, e.g. through
``PYTHONPATH=python``; ``make test-vllm-upstream`` does this)::

    python tests/vllm_upstream/run.py                  # the selection; exit 1 iff one fails
    python tests/vllm_upstream/run.py --all            # every test of the files, excluded too
    python tests/vllm_upstream/run.py -- -k priority   # extra arguments go to pytest

What it does:

1. Downloads vLLM 0.33.0's sdist from PyPI's file host (once; cached in
   ``~/.cache/llmsched/vllm-0.33.0-tests/``, or ``$LLMSCHED_VLLM_TESTS_CACHE``), checks its
   SHA-256, and extracts only the test files the scheduler tests need (``tests/v1/core/``,
   ``tests/v1/kv_connector/unit/`` and the helpers they import). Nothing of vLLM's is
   copied into this repository.
2. Writes the models the tests name as local directories of those names in the
   extracted tree (the tests run from there): ``facebook/opt-125m`` and
   ``facebook/opt-350m``, their ``config.json`` only (architecture, sizes, position limit;
   no weights, no tokenizer), and
   ``llava-hf/llava-1.5-7b-hf``, its ``config.json``, image-processor config and a stand-in
   tokenizer (vLLM builds the model's multimodal processor to size the encoder budget; no
   weights). vLLM's ``ModelConfig`` takes an existing directory for a local model, so the
   hub is never asked (it is also set offline).
3. Runs pytest on ``selection.FILES`` (``tests/v1/core/test_scheduler.py``,
   ``test_async_scheduler.py``, ``test_worker_slot_overflow.py``,
   ``test_priority_preemption_bug.py``, ``test_deferred_block_free.py``,
   ``test_swa_inflight_window_free.py``, and the KV-connector
   unit tests that drive a scheduler: remote prefill and decode lifecycles, load failures,
   invalid blocks, the offloading connector's scheduler tests) with
   the extracted tree as rootdir and an empty ini file of its own (this repository's pytest
   configuration does not apply), and :class:`conftest.UpstreamPlugin` as a plugin: vLLM's
   helpers build ``llmsched.vllm.Scheduler`` / ``AsyncScheduler``, and the tests
   ``selection.py`` excludes are deselected; an included test that builds no llmsched
   scheduler fails (it would prove nothing).
4. Prints a summary: included tests passed / failed, excluded tests with their reasons.
   The exit status is non-zero iff an included test fails (or a test is unclassified, or
   pytest itself fails).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from collections import Counter
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent

VLLM_VERSION = "0.33.0"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/f7/25/"
    "aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz"
)
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"

#: What is extracted from the sdist (paths under its top directory): the test package
#: markers, the core and KV-connector unit tests and the helpers they import. Not vLLM's
#: top-level conftest.py: it imports the model-running stack, which the scheduler tests do
#: not use.
EXTRACT_PREFIXES = (
    "tests/__init__.py",
    "tests/utils.py",
    "tests/v1/__init__.py",
    "tests/v1/utils.py",
    "tests/v1/core/",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/",
)

#: facebook/opt-125m's config as far as vLLM's config step reads it (architecture, sizes,
#: position limit: ``max_model_len`` defaults to 2,048 from it, as in vLLM's CI).
OPT_125M_CONFIG: dict[str, object] = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "do_layer_norm_before": True,
    "ffn_dim": 3072,
    "hidden_size": 768,
    "word_embed_proj_dim": 768,
    "max_position_embeddings": 2048,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "torch_dtype": "float16",
}
#: The model name the tests use, resolved as a directory relative to the extracted tree.
OPT_125M = "facebook/opt-125m"
#: facebook/opt-350m's config as far as vLLM's config step reads it (a test of
#: ``test_priority_preemption_bug.py`` names it): opt-125m's but for its sizes.
OPT_350M_CONFIG: dict[str, object] = {
    **OPT_125M_CONFIG,
    "ffn_dim": 4096,
    "hidden_size": 1024,
    "word_embed_proj_dim": 512,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
}
OPT_350M = "facebook/opt-350m"

#: llava-1.5-7b's language model as far as vLLM reads it (``max_model_len`` defaults to
#: 4,096 from it). Its vision tower is CLIP at 336 px in 14-px patches: (336 // 14) ** 2 =
#: 576 placeholder tokens per image, which sizes the scheduler's encoder budget as in vLLM's
#: CI (the tests assert on it); ``vllm_reference.write_llava_model`` writes the model.
LLAVA_1_5_TEXT_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "vocab_size": 32064,
    "torch_dtype": "float16",
}
#: The multimodal model name the tests use, a directory relative to the extracted tree.
LLAVA_1_5 = "llava-hf/llava-1.5-7b-hf"


def cache_dir() -> Path:
    """Where the sdist, the extracted tests and the offline hub cache live."""
    default = Path.home() / ".cache" / "llmsched" / f"vllm-{VLLM_VERSION}-tests"
    return Path(os.environ.get("LLMSCHED_VLLM_TESTS_CACHE", default))


def sha256_of(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sdist(cache: Path) -> Path:
    """The verified sdist, downloaded into ``cache`` unless a verified copy is there."""
    target = cache / f"vllm-{VLLM_VERSION}.tar.gz"
    if target.is_file() and sha256_of(target) == SDIST_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    print(f"downloading {SDIST_URL}", file=sys.stderr)
    fd, tmp_name = tempfile.mkstemp(dir=cache, suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(SDIST_URL, timeout=120) as resp:
            shutil.copyfileobj(resp, out)
        got = sha256_of(tmp)
        if got != SDIST_SHA256:
            raise SystemExit(f"sha256 mismatch for {SDIST_URL}: {got} != {SDIST_SHA256}")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def extract_tests(sdist: Path, dest: Path) -> Path:
    """Extract :data:`EXTRACT_PREFIXES` from the sdist into ``dest`` (replacing an older
    extraction); returns ``dest``."""
    marker = dest / ".extracted-from"
    # What was extracted: the sdist and the prefixes (a new prefix extracts again).
    extracted = "\n".join((SDIST_SHA256, *EXTRACT_PREFIXES))
    if marker.is_file() and marker.read_text() == extracted:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    top = f"vllm-{VLLM_VERSION}/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(top) or not member.isfile():
                continue
            rel = member.name[len(top) :]
            if rel.startswith(EXTRACT_PREFIXES):
                member.name = rel
                members.append(member)
        tar.extractall(dest, members=members, filter="data")
    marker.write_text(extracted)
    return dest


def write_local_model(root: Path) -> Path:
    """``root/facebook/opt-125m/config.json`` (and opt-350m's) and
    ``root/llava-hf/llava-1.5-7b-hf/``: the models the tests name, as local ones; returns
    the first."""
    for name, config in ((OPT_350M, OPT_350M_CONFIG), (OPT_125M, OPT_125M_CONFIG)):
        model = root / name
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    from llmsched.bench.vllm_reference import write_llava_model

    write_llava_model(
        root / LLAVA_1_5, image_size=336, patch_size=14, text_config=LLAVA_1_5_TEXT_CONFIG
    )
    return model


def load_local(name: str) -> ModuleType:
    """Import ``<this directory>/<name>.py`` under a private module name."""
    spec = importlib.util.spec_from_file_location(
        f"llmsched_vllm_upstream_{name}", HERE / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def summarize(plugin: object, run_all: bool, excluded: dict[str, str]) -> list[str]:
    """The summary's lines."""
    out = plugin.outcomes  # type: ignore[attr-defined]
    lines = [""]
    lines.append(f"vLLM {VLLM_VERSION} scheduler tests against llmsched.vllm")
    if out.excluded:
        lines.append(f"excluded ({len(out.excluded)} tests):")
        by_reason: dict[str, list[str]] = {}
        for nodeid, reason in out.excluded.items():
            by_reason.setdefault(reason, []).append(nodeid)
        for reason, ids in by_reason.items():
            names = sorted({i.split("::", 1)[1].split("[", 1)[0] for i in ids})
            lines.append(f"  {len(ids):3d}  {reason}: {', '.join(names)}")
    if out.skipped:
        lines.append(f"skipped by vLLM's tests themselves ({len(out.skipped)}):")
        lines.extend(f"  {nodeid}" for nodeid in out.skipped)
    if out.no_scheduler:
        lines.append(f"never built llmsched.vllm's scheduler ({len(out.no_scheduler)}):")
        lines.extend(f"  {nodeid}" for nodeid in out.no_scheduler)
    if out.unclassified:
        lines.append(f"unclassified in selection.py ({len(out.unclassified)}):")
        lines.extend(f"  {nodeid}" for nodeid in out.unclassified)
    passing_excluded = [
        nodeid for nodeid in out.passed if nodeid in excluded or nodeid.split("[", 1)[0] in excluded
    ]
    if run_all and passing_excluded:
        lines.append(f"excluded but passing ({len(passing_excluded)}):")
        lines.extend(f"  {nodeid}" for nodeid in passing_excluded)
    if out.failed:
        label = "failed" if run_all else "FAILED (included)"
        lines.append(f"{label} ({len(out.failed)}):")
        for nodeid in out.failed:
            base = nodeid.split("[", 1)[0]
            why = excluded.get(nodeid) or excluded.get(base)
            lines.append(f"  {nodeid}" + (f"    [excluded: {why}]" if why else ""))
    counts = Counter(
        {
            "ran": len(out.passed) + len(out.failed),
            "passed": len(out.passed),
            "failed": len(out.failed),
            "skipped": len(out.skipped),
            "excluded": len(out.excluded),
        }
    )
    lines.append(
        "summary: {ran} ran, {passed} passed, {failed} failed, {skipped} skipped, "
        "{excluded} excluded".format(**counts)
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Fetch, extract, run; print the summary; the exit status (0 iff nothing included
    failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--all", action="store_true", help="run the excluded tests too")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    selection = load_local("selection")
    conftest = load_local("conftest")
    cache = cache_dir()
    root = extract_tests(fetch_sdist(cache), cache / "src")
    write_local_model(root)
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }.items():
        os.environ[key] = value

    import pytest

    ini = cache / "pytest.ini"
    ini.write_text("[pytest]\n")
    included = frozenset(selection.INCLUDED)
    excluded = dict(selection.EXCLUDED)
    plugin = conftest.UpstreamPlugin(included=included, excluded=excluded, run_all=args.all)
    os.chdir(root)
    sys.path.insert(0, str(root))
    status = pytest.main(
        [
            "-c",
            str(ini),
            "--rootdir",
            str(root),
            "-p",
            "no:cacheprovider",
            "-q",
            "-rfE",
            *selection.FILES,
            *args.pytest_args,
        ],
        plugins=[plugin],
    )
    print("\n".join(summarize(plugin, args.all, excluded)))
    out = plugin.outcomes
    if (out.failed and not args.all) or out.unclassified:
        return 1
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return int(status)
    return 0


if __name__ == "__main__":
    sys.exit(main())
