"""Atomic file writes, and checking an output path before any work starts.

A file yolo-det writes is first written to a temporary file in the same folder, flushed to disk and
then renamed over the target, so a reader never sees half a file and a crash never leaves one.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "new_file_mode"]

_umask_lock = threading.Lock()


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file here: ``0o666`` less the process umask (``0o644`` under umask 022)."""
    with _umask_lock:  # the umask can only be read by setting it; it is put back at once
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and return the path.

    Args:
        path: Target file. Its folder must exist.
        data: The bytes to write.
        mode: Permission bits for the new file; by default those of the file being replaced, else those of
            any new file (``0o666`` less the umask; ``mkstemp``'s private ``0o600`` is never left behind).
    """
    path = Path(path)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically and return the path."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def check_output_path(path: str | os.PathLike[str] | None, *, suffix: str | tuple[str, ...],
                      what: str) -> Path | None:
    """Check an output file path before any work starts; return it as a Path (or None).

    Raises:
        ConfigError: The suffix is wrong or the folder does not exist or is not writable.
    """
    if path is None:
        return None
    p = Path(path).expanduser()
    suffixes = (suffix,) if isinstance(suffix, str) else suffix
    if p.suffix.lower() not in suffixes:
        raise ConfigError(f"{what} '{p}' must end with {' or '.join(suffixes)}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"cannot write {what} '{p}': folder '{folder}' does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"cannot write {what} '{p}': folder '{folder}' is not writable")
    if p.is_dir():
        raise ConfigError(f"cannot write {what} '{p}': it is a folder")
    return p
