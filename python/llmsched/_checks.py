"""Range checks shared by the library's arguments and the command line's flags: one
``Range`` per kind of number, so that both refuse the same values with the same words."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["COUNT", "SEED", "Range"]


@dataclass(frozen=True, slots=True)
class Range:
    """Finite numbers from ``low`` (excluded if ``low_open``) to ``high``; integers only if
    ``integer``."""

    low: float
    high: float = math.inf
    low_open: bool = False
    integer: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.high == math.inf:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return f"{kind} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def accepts(self, value: float) -> bool:
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.low_open else value >= self.low

    def check(self, name: str, value: object) -> float:
        """``value``, range-checked (an ``int`` if ``integer``); ``ValueError`` naming ``name``
        and the value."""
        number: float | None = None
        if not isinstance(value, bool) and isinstance(value, numbers.Real):
            if not self.integer:
                number = float(value)
            elif isinstance(value, numbers.Integral):
                number = int(value)
        if number is None or not self.accepts(number):
            raise ValueError(f"{name}={value!r}: must be {self.describe()}")
        return number

    def parse(self, text: str) -> float:
        """A number read from ``text`` (a flag or a trace cell), range-checked; ``ValueError``
        with the reason alone (the caller names the flag or the cell)."""
        try:
            number: float = int(text) if self.integer else float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {self.describe()}") from None
        if not self.accepts(number):
            raise ValueError(f"{text!r} is not {self.describe()}")
        return number


COUNT = Range(1, integer=True)
"""A count of things that must be at least one: tokens of a request, requests, steps, rounds."""
SEED = Range(0, integer=True)
"""A random seed, or any other integer >= 0."""
