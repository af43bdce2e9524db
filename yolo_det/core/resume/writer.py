"""Writing resume states on a background thread, overlapping the copy with the next training steps."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .state import host_copy, save_state


class StateWriter:
    """Writes resume states on a background thread.

    :meth:`submit` hands over a state whose tensors may be live (the model's parameters, the optimizer's
    moments). The thread first copies them (one memcpy each), then serialises the copy and writes it
    atomically. The caller guarantees that nobody changes the live tensors until :meth:`wait_copied`
    returns (the integrations call it before the first optimizer update after a save),
    so the training waits at most for the copy, which overlaps the first forward and backward passes.
    :meth:`wait` blocks until every state submitted is on disk and raises the first write error;
    :meth:`close` waits and stops the thread.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yolo-det-resume")
        self._pending: list[Any] = []
        self._copied: list[Any] = []
        self._early: list[Any] = []
        self.seconds_writing = 0.0
        self.seconds_waited = 0.0

    def submit(self, path: str | os.PathLike[str], state: Mapping[str, Any], *, early: tuple[str, ...] = ()) -> None:
        """Write ``state`` to ``path`` in the background (after any earlier state).

        The entries named in ``early`` are copied first; :meth:`wait_early` waits for them only.
        """
        import threading

        first, copied = threading.Event(), threading.Event()
        if self._pool is None:
            self._write(path, state, early, first, copied)
            return
        self._early.append(first)
        self._copied.append(copied)
        self._pending.append(self._pool.submit(self._write, path, state, early, first, copied))

    def _write(
        self, path: str | os.PathLike[str], state: Mapping[str, Any], early: tuple[str, ...], first: Any, copied: Any
    ) -> None:
        import time

        t0 = time.perf_counter()
        try:
            try:
                snapshot = {k: host_copy(state[k]) for k in early if k in state}
            finally:
                first.set()
            snapshot.update({k: host_copy(v) for k, v in state.items() if k not in snapshot})
        finally:
            copied.set()
        save_state(path, {k: snapshot[k] for k in state})
        self.seconds_writing += time.perf_counter() - t0

    def wait_early(self) -> None:
        """Block until the ``early`` entries of every submitted state have been copied."""
        events, self._early = self._early, []
        for event in events:
            event.wait()

    def wait_copied(self) -> None:
        """Block until every submitted state has been copied (the live tensors may change after that)."""
        import time

        events, self._copied = self._copied, []
        t0 = time.perf_counter()
        for event in events:
            event.wait()
        if events:
            self.seconds_waited += time.perf_counter() - t0

    def wait(self) -> None:
        """Block until every submitted state is written; raise the first error."""
        import time

        self.wait_copied()
        pending, self._pending = self._pending, []
        t0 = time.perf_counter()
        for future in pending:
            future.result()
        if pending:
            self.seconds_waited += time.perf_counter() - t0

    def close(self) -> None:
        """Wait for the writes, then stop the thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
