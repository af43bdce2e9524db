"""Checkpoints yolo-det wrote itself: known by the SHA-256 of their bytes, kept outside every run folder.

While yolo-det runs Ultralytics (:func:`~.safeload.guarded_torch_load`), every ``torch.save`` of the process
is followed by :func:`note_written`: the digest of the bytes it serialized goes into a store under the user's
cache folder (``written/`` in :func:`yolo_det.core.datafp.cache_dir`, one empty file per digest, each created
atomically) and into this process's memory. :func:`is_own` answers whether a file's bytes are among them.

The store is never read from, nor written from, a run folder: a record (``determinism.json``) received with a
run folder can list any digest, so it is never what makes a file trusted. A received checkpoint is trusted
only when this machine's yolo-det serialized exactly the same bytes; a single changed byte makes it a file
from others again. See ``docs/security.md``.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

__all__ = ["is_own", "note_written", "store_dir"]

_HEX = re.compile(r"[0-9a-f]{64}")
_MEMORY: dict[str, set[str]] = {}
_LOCK = threading.Lock()


def store_dir() -> Path:
    """The folder of the digests of checkpoints yolo-det wrote on this machine (in the user's cache folder)."""
    from ..datafp import cache_dir

    return cache_dir() / "written"


def _memory() -> set[str]:
    with _LOCK:
        return _MEMORY.setdefault(str(store_dir()), set())


def digest(data: bytes) -> str:
    """SHA-256 hex digest of a checkpoint's bytes."""
    return hashlib.sha256(data).hexdigest()


def note_written(data: bytes) -> str:
    """Record that this process serialized the checkpoint bytes ``data``; return their digest.

    The digest is kept in memory and in :func:`store_dir` (created atomically; a store that cannot be written,
    a read-only home, leaves the memory entry only).
    """
    from ..fileio import atomic_write_bytes

    hexdigest = digest(data)
    mem = _memory()
    with _LOCK:
        mem.add(hexdigest)
    folder = store_dir()
    try:
        if not (folder / hexdigest).is_file():
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(folder / hexdigest, b"")
    except OSError:
        pass
    return hexdigest


def is_own(data: bytes) -> bool:
    """Whether yolo-det on this machine serialized exactly the bytes ``data`` (see the module docstring)."""
    hexdigest = digest(data)
    if not _HEX.fullmatch(hexdigest):
        return False
    if hexdigest in _memory():
        return True
    try:
        return (store_dir() / hexdigest).is_file() and not os.path.islink(store_dir() / hexdigest)
    except OSError:
        return False
