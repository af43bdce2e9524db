"""Instance attributes replaced for a while and put back exactly as they were.

Wrapping a trainer's bound methods (``trainer.optimizer_step = wrapped``) sets an instance attribute that
shadows the class's method. Putting it back means restoring the instance's own value where it had one, and
removing the attribute where it had none, so the class's method shows through again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SavedAttributes"]

_MISSING = object()


class SavedAttributes:
    """The instance's own values of some attributes, kept so :meth:`restore` can put each back."""

    def __init__(self) -> None:
        self._obj: Any = None
        self._saved: dict[str, Any] = {}

    def save(self, obj: Any, *names: str) -> None:
        """Remember ``obj``'s own values of ``names`` (or that it has none) before they are replaced."""
        self._obj = obj
        for name in names:
            self._saved.setdefault(name, obj.__dict__.get(name, _MISSING))

    def restore(self) -> None:
        """Put every saved attribute back: the old value, or no instance attribute at all. Idempotent."""
        obj, saved = self._obj, self._saved
        self._obj, self._saved = None, {}
        if obj is None:
            return
        for name, value in saved.items():
            if value is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = value
