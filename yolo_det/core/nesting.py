"""A process-wide change made on the outermost entry of a block and undone on its outermost exit.

Several features swap a global for the length of a block (``torch.nn.functional``'s functions routed,
Ultralytics' ``parse_model`` wrapped, deterministic algorithms off for a backward pass). Blocks nest, and
threads enter them concurrently: :class:`NestedPatch` counts the entries under a lock, applies the change
on the first and undoes it on the last, on error too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

__all__ = ["NestedPatch"]

_T = TypeVar("_T")


class NestedPatch(Generic[_T]):
    """``apply()`` on the outermost entry of :meth:`scope`, ``undo(token)`` with what it returned on the outermost exit.

    Args:
        apply: Makes the change; returns what ``undo`` needs (the values it replaced).
        undo: Puts back what ``apply`` changed.
        lock: The lock the entries are counted under (the module's own, when other code takes it too).

    Attributes:
        depth: How many blocks are entered now (0: the change is not in force).
    """

    def __init__(
        self,
        apply: Callable[[], _T],
        undo: Callable[[_T], None],
        *,
        lock: threading.Lock | threading.RLock | None = None,
    ) -> None:
        self._apply = apply
        self._undo = undo
        self.lock: Any = lock if lock is not None else threading.RLock()
        self.depth = 0
        self._token: _T | None = None

    def scope(self) -> AbstractContextManager[None]:
        """The block: the change is in force inside it, whatever other blocks are entered around or within."""
        return self._scope()

    @contextmanager
    def _scope(self) -> Iterator[None]:
        with self.lock:
            if self.depth == 0:
                self._token = self._apply()
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0:
                    token, self._token = self._token, None
                    self._undo(token)  # type: ignore[arg-type]
