"""Ultralytics' checkpoint writes of ``last.pt`` and ``best.pt``, made atomic while it saves.

Ultralytics writes a checkpoint with ``Path.write_bytes`` on the trainer's ``last``/``best`` paths: a full disk
or a kill half way would leave a file cut short. For the time of one ``save_model`` those paths write through a
temporary file renamed over the target (fault point ``weights-file-writing``), so the previous checkpoint stays
whole until the new one is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.testpoints import reach

__all__ = ["with_atomic_weights"]


class _AtomicPath(type(Path())):  # type: ignore[misc]
    """A weights path whose ``write_bytes`` replaces the file atomically (all or nothing)."""

    def write_bytes(self, data: Any) -> int:
        from ...core.fileio import atomic_file

        view = memoryview(data)
        with atomic_file(self, sync=False) as f:
            f.write(view)
            reach("weights-file-writing")
        return view.nbytes


def with_atomic_weights(trainer: Any, save: Any) -> Any:
    """Run Ultralytics' ``save_model`` with its ``last``/``best`` paths writing atomically; put them back after."""
    kept = {k: getattr(trainer, k) for k in ("last", "best") if isinstance(getattr(trainer, k, None), Path)}
    try:
        for k, path in kept.items():
            setattr(trainer, k, _AtomicPath(path))
        return save()
    finally:
        for k, path in kept.items():
            setattr(trainer, k, path)
