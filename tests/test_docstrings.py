"""Runtime docstrings: every public class, method and property of the extension documents
itself (``help(llmsched.Scheduler)``), from one source.

The source is the Rust binding's documentation; the stub (``_core.pyi``), which type
checkers and editors read, repeats it, and this test holds the two equal, the way
stubtest holds their signatures equal. Docstrings name no file that does not ship.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from tests.stub_docs import same_text

import llmsched
from llmsched import _core

STUB = Path(llmsched.__file__).with_name("_core.pyi")


def stub_docstrings() -> dict[str, str | None]:
    """``Class`` and ``Class.member`` -> the stub's docstring (None if it has none). A
    private class is the stub's own (a protocol for type checkers), not the extension's."""
    tree = ast.parse(STUB.read_text())
    out: dict[str, str | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out[node.name] = ast.get_docstring(node)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and (
                    not item.name.startswith("_") or item.name == "__new__"
                ):
                    out[f"{node.name}.{item.name}"] = ast.get_docstring(item)
    return out


STUB_DOCS = stub_docstrings()
PUBLIC = [name for name in STUB_DOCS if name.split(".")[-1] != "__new__"]


def runtime(name: str) -> Any:
    obj: Any = _core
    for part in name.split("."):
        obj = getattr(obj, part) if not isinstance(obj, type) else obj.__dict__[part]
    return obj


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_runtime_docstring_equal_to_the_stubs(name: str) -> None:
    doc = runtime(name).__doc__
    assert isinstance(doc, str) and doc.strip(), f"{name} has no runtime docstring"
    expected = inspect.cleandoc(doc)
    assert same_text(STUB_DOCS[name], expected), (
        f"the stub's docstring of {name} differs from the runtime's (python -m "
        f'tests.stub_docs rewrites them); the runtime\'s is:\n"""{expected}"""'
    )


def test_help_documents_the_scheduler() -> None:
    text = "\n".join(
        inspect.getdoc(getattr(_core.Scheduler, name)) or ""
        for name in ("schedule", "get_request", "update_draft_token_ids", "stats")
    )
    for counter in ("num_steps", "num_preemptions", "prefix_cache_hits"):
        assert counter in text
    for field in _core.SchedulerConfig().to_dict():
        assert inspect.getdoc(getattr(_core.SchedulerConfig, field)), field


@pytest.mark.parametrize("name", PUBLIC)
def test_docstrings_name_no_file_that_does_not_ship(name: str) -> None:
    doc = runtime(name).__doc__ or ""
    assert not re.search(r"\.rs\b|\.md\b|rust/|docs/|tests/|\bspec\b", doc), doc
