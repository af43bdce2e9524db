"""Which optimizer steps an op trace covers: ``--trace-ops STEPS`` parsed into a range."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.errors import ConfigError

__all__ = ["MAX_TRACED_STEPS", "StepRange", "parse_steps"]

#: More steps than this in one trace is refused: a trace is for finding one step, not for logging a run.
MAX_TRACED_STEPS = 1000

_FORM = re.compile(r"^\s*(?:first[\s:=]*(?P<first>\d+)|(?P<a>\d+)(?:\s*-\s*(?P<b>\d+))?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class StepRange:
    """Optimizer steps ``first`` to ``last`` (1-based, both included), counted from the start of this process."""

    first: int
    last: int

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and self.first <= step <= self.last

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def parse_steps(text: str | int | StepRange) -> StepRange:
    """Parse ``"3-5"`` (steps 3 to 5), ``"7"`` (step 7 only) or ``"first 4"`` / ``"first:4"`` (steps 1 to 4).

    Raises:
        ConfigError: Anything else, a step below 1, a range that ends before it starts or longer than
            :data:`MAX_TRACED_STEPS` (one line).
    """
    if isinstance(text, StepRange):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    m = _FORM.match(text) if isinstance(text, str) and len(text) < 64 else None
    if m is None:
        raise ConfigError(
            f"--trace-ops: cannot read {str(text)[:40]!r}; pass a step (7), a range (3-5) or the first steps (first:4)"
        )
    if m.group("first") is not None:
        first, last = 1, int(m.group("first"))
    else:
        first = int(m.group("a"))
        last = int(m.group("b")) if m.group("b") is not None else first
    if first < 1 or last < first:
        raise ConfigError(f"--trace-ops: steps count from 1 and a range ends after it starts, got {text!r}")
    if last - first + 1 > MAX_TRACED_STEPS:
        raise ConfigError(f"--trace-ops: at most {MAX_TRACED_STEPS} steps in one trace, got {last - first + 1}")
    return StepRange(first, last)
