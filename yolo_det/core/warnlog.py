"""Collect torch's non-determinism warnings while a run is in progress.

Under ``warn_only`` determinism, a CUDA kernel without a deterministic implementation emits a
``UserWarning`` ("... does not have a deterministic implementation, but you set
'torch.use_deterministic_algorithms(True, warn_only=True)'") and runs anyway. Python shows such a
warning once per call site, so a run log easily misses most of them. :class:`WarningLog` records every
occurrence (with a count per distinct message and the phase it happened in), still lets each distinct
message through to the user once, and restores the warnings machinery exactly when it stops.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any, cast

__all__ = ["NONDETERMINISM_PATTERN", "WarningLog"]

#: Messages that say an op is (or stays) non-deterministic.
NONDETERMINISM_PATTERN = re.compile(
    r".*(does not have a deterministic implementation|non-?deterministic|CUBLAS_WORKSPACE_CONFIG)",
    re.IGNORECASE | re.DOTALL,
)


class WarningLog:
    """Record non-determinism warnings between :meth:`start` and :meth:`stop`.

    Args:
        phase: A callable returning the name of the phase in force (stored with each entry).
    """

    def __init__(self, phase: Callable[[], str | None] = lambda: None) -> None:
        self._phase = phase
        self._entries: dict[tuple[str, str], dict[str, Any]] = {}
        self._saved: tuple[list[Any], Any] | None = None

    @property
    def active(self) -> bool:
        """Whether the log is recording."""
        return self._saved is not None

    def entries(self) -> list[dict[str, Any]]:
        """The recorded warnings: message, category, first location, phases and count, in first-seen order."""
        return [dict(e, phases=sorted(e["phases"])) for e in self._entries.values()]

    def start(self) -> None:
        """Begin recording (no-op when already recording)."""
        if self._saved is not None:
            return
        self._saved = (list(_filters()), warnings.showwarning)
        warnings.filterwarnings("always", message=NONDETERMINISM_PATTERN.pattern)
        # filterwarnings compiles with re.I only; make sure the DOTALL pattern object is the one used
        action, _, category, module, lineno = _filters()[0]
        _filters()[0] = (action, NONDETERMINISM_PATTERN, category, module, lineno)
        warnings._filters_mutated()  # type: ignore[attr-defined]
        original = warnings.showwarning

        def showwarning(
            message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: str | None = None
        ) -> None:
            text = str(message)
            if NONDETERMINISM_PATTERN.match(text):
                key = (category.__name__, text)
                entry = self._entries.get(key)
                if entry is None:
                    self._entries[key] = {
                        "message": text,
                        "category": category.__name__,
                        "filename": filename,
                        "lineno": lineno,
                        "count": 1,
                        "phases": {str(self._phase())},
                    }
                    original(message, category, filename, lineno, file, line)
                else:
                    entry["count"] += 1
                    entry["phases"].add(str(self._phase()))
                return
            original(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning

    def stop(self) -> None:
        """Stop recording and restore the warning filters and ``warnings.showwarning`` as they were."""
        if self._saved is None:
            return
        filters, showwarning = self._saved
        self._saved = None
        _filters()[:] = filters
        warnings._filters_mutated()  # type: ignore[attr-defined]
        warnings.showwarning = showwarning


def _filters() -> list[Any]:
    """``warnings.filters``: a list at run time (typeshed types it as a read-only sequence)."""
    return cast("list[Any]", warnings.filters)
