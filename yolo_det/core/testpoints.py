"""Named points in the code where a test can interrupt a run deterministically (no sleeps, no timing).

Code calls :func:`reach` with a point's name; a test installs a hook with :func:`hooked` that raises or
sends a signal at the point it names. Without a hook, :func:`reach` does nothing.

Points: ``resume-state-written`` (a checkpoint's resume state is on disk, the checkpoint is not written yet),
``checkpoint-written`` (the checkpoint is on disk, the record not yet updated), ``record-writing`` (a record
is built and about to be written: a hook raising ``OSError(ENOSPC)`` there is a full disk at that write),
``record-updated``, ``rank-states-written`` (rank 0 wrote the states the other ranks of an outside launcher's
job sent it, before its own state and the checkpoint), ``weights-file-writing`` (Ultralytics' checkpoint
write of ``last.pt``/``best.pt`` has written its temporary file, not yet renamed over the file),
``weights-file-saving`` (a ``torch.save`` to a
path under the load guard, such as Ultralytics' final ``strip_optimizer`` rewrite of ``last.pt``, has written
its temporary file, not yet renamed over the file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["hooked", "reach"]

_hook: Callable[[str], None] | None = None


def reach(point: str) -> None:
    """Called by the code at ``point``: runs the installed hook, if any."""
    if _hook is not None:
        _hook(point)


@contextmanager
def hooked(hook: Callable[[str], None]) -> Iterator[None]:
    """Install ``hook`` (called with each point's name) for the block; the previous hook is put back."""
    global _hook
    previous, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = previous
