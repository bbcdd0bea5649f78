"""The stub's docstrings, generated from the extension's own (its one source).

``python -m tests.stub_docs`` rewrites every docstring of ``python/llmsched/_core.pyi``
(classes, methods, properties, ``__new__`` excepted) with the compiled module's runtime
docstring, which the Rust binding's documentation defines; ``tests/test_docstrings.py``
fails while the two differ.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

from llmsched import _core

STUB = Path(__file__).resolve().parent.parent / "python" / "llmsched" / "_core.pyi"
WIDTH = 100


def documented_nodes(tree: ast.Module) -> list[tuple[str, ast.ClassDef | ast.FunctionDef]]:
    """``(name, node)`` for every class of the stub and every public member of one."""
    out: list[tuple[str, ast.ClassDef | ast.FunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out.append((node.name, node))
            out.extend(
                (f"{node.name}.{item.name}", item)
                for item in node.body
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
            )
    return out


def runtime_doc(name: str) -> str | None:
    obj: Any = _core
    for part in name.split("."):
        obj = obj.__dict__.get(part) if isinstance(obj, type) else getattr(obj, part, None)
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def same_text(a: str | None, b: str | None) -> bool:
    """Equal but for line breaks and indentation (the stub wraps long lines)."""
    return (a is None) == (b is None) and " ".join((a or "").split()) == " ".join((b or "").split())


def _docstring_source(doc: str, indent: str) -> str:
    """``doc`` as a triple-quoted literal at ``indent``, long lines wrapped."""
    lines: list[str] = []
    for line in doc.splitlines():
        room = WIDTH - len(indent) - (3 if not lines else 0) - 3
        lines.extend(textwrap.wrap(line, room, break_on_hyphens=False) or [""])
    body = "\n".join(indent + line if i and line else line for i, line in enumerate(lines))
    return f'"""{body}"""'


def rewrite(source: str) -> str:
    """``source`` with each documented node's docstring set to the runtime's."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(lineno: int, col: int) -> int:
        return offsets[lineno - 1] + col

    edits: list[tuple[int, int, str]] = []
    for name, node in documented_nodes(tree):
        doc = runtime_doc(name)
        if doc is None:
            continue
        first = node.body[0]
        indent = " " * (node.col_offset + 4)
        text = _docstring_source(doc, indent)
        has_doc = (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        )
        is_ellipsis = (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and first.value.value is Ellipsis
        )
        assert first.end_lineno is not None and first.end_col_offset is not None
        start = at(first.lineno, first.col_offset)
        end = at(first.end_lineno, first.end_col_offset)
        if has_doc:
            edits.append((start, end, text))
        elif is_ellipsis and len(node.body) == 1:
            # `def f(self) -> int: ...` becomes a def with a docstring body.
            edits.append((start, end, "\n" + indent + text))
        else:
            edits.append((start, start, text + "\n\n" + indent))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def main() -> int:
    STUB.write_text(rewrite(STUB.read_text()))
    print(f"rewrote the docstrings of {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
