"""Structured output in the parity harness: the engine's part, played the same way for
every side.

A structured-output request (``ParityRequest.grammar_at`` set) has its grammar compiled by
the "engine" at a fixed loop iteration, or failing to compile (``grammar_fails``). The
grammar is a stand-in that agrees with the deterministic runner: every token the runner
samples is valid (as with a real bitmask), a wrong draft is valid at about half of the
positions (so validation cuts some drafts and keeps others). Its state is its position in
the request's sequence, advanced by ``accept_tokens`` and written into the bitmask row, so
the bitmask shows how far each side advanced each grammar.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "GRAMMAR_ERROR",
    "ParityBackend",
    "ParityGrammar",
    "TokenRule",
    "grammar_valid_prefix",
    "install_parity_backend",
]

GRAMMAR_ERROR = "the parity grammar did not compile"

TokenRule = Callable[[int, int], bool]
"""Whether a request's grammar accepts ``token`` at ``position`` (the harness's rule:
``harness.grammar_accepts``, bound to the request)."""


def grammar_valid_prefix(accepts: TokenRule, position: int, tokens: list[int]) -> list[int]:
    """The longest prefix of ``tokens`` (drafts for ``position`` on, ``-1`` padding and
    what follows it stripped, as vLLM strips it) that the grammar accepts."""
    valid = []
    for j, token in enumerate(tokens):
        if token == -1 or not accepts(position + j, token):
            break
        valid.append(token)
    return valid


def _grammar_base() -> type:
    from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

    return StructuredOutputGrammar  # type: ignore[no-any-return]


class ParityGrammar(_grammar_base()):  # type: ignore[misc]
    """vLLM's ``StructuredOutputGrammar`` for one parity request: ``accepts`` (its rule),
    from position ``start`` (its prompt's length) on; ``key`` marks its bitmask rows."""

    def __init__(self, accepts: TokenRule, start: int, key: int) -> None:
        self.accepts = accepts
        self.start = start
        self.key = key
        self.position = start

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        for token in tokens:
            if not self.accepts(self.position, token):
                return False
            self.position += 1
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return grammar_valid_prefix(self.accepts, self.position, tokens)

    def rollback(self, num_tokens: int) -> None:
        self.position -= num_tokens

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        bitmask[batch_index, 0] = self.position
        bitmask[batch_index, 1] = self.key & 0x7FFF_FFFF

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        self.position = self.start


class ParityBackend:
    """The part of a structured-output backend vLLM's manager calls once grammars exist:
    the bitmask's allocation (two words per row: enough for :class:`ParityGrammar`)."""

    def allocate_token_bitmask(self, max_num_seqs: int) -> Any:
        import torch

        return torch.full((max_num_seqs, 2), -1, dtype=torch.int32)


def install_parity_backend(manager: Any) -> None:
    """Give vLLM's ``StructuredOutputManager`` the stand-in backend."""
    manager.backend = ParityBackend()
    manager.backend_name = "parity"
