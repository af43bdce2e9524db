"""Atomic file writes, file digests, and checking an output path before any work starts.

The one home of these helpers: every file yolo-det writes goes through :func:`atomic_file` (or the
``atomic_write_*`` functions and :func:`copy_file` built on it): it is first written to a temporary file in the
same folder, flushed and then renamed over the target, so a reader never sees half a file and a crash never
leaves one. The target is replaced, never followed: a symbolic link there is replaced by the new file, and the
file it pointed to is left as it was. A new file gets the mode ``open()`` would give it (``0o666`` less the
umask); a replaced file keeps its mode (a replaced link gets a new file's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError

__all__ = [
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "check_output_path",
    "copy_file",
    "file_sha256",
    "new_file_mode",
]

_CHUNK = 1 << 20

_umask_lock = threading.Lock()


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file here: ``0o666`` less the process umask (``0o644`` under umask 022)."""
    with _umask_lock:  # the umask can only be read by setting it; it is put back at once
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_file(path: str | os.PathLike[str], *, mode: int | None = None, sync: bool = True) -> Iterator[IO[bytes]]:
    """A binary file to write; when the block ends without an error it replaces ``path`` atomically.

    Args:
        path: Target file. Its folder must exist.
        mode: Permission bits for the new file; by default those of the file being replaced, else those of
            any new file (``0o666`` less the umask; ``mkstemp``'s private ``0o600`` is never left behind).
        sync: ``fsync`` the data before the rename (off for large files that are checked when read back).

    On an error (or an interrupt) the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    if mode is None:
        try:
            st = path.lstat()  # a link's target is never looked at, nor written
            mode = new_file_mode() if stat.S_ISLNK(st.st_mode) else st.st_mode & 0o777
        except FileNotFoundError:
            mode = new_file_mode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and return the path (see :func:`atomic_file` for ``mode``)."""
    with atomic_file(path, mode=mode) as f:
        f.write(data)
    return Path(path)


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, times: bool = False) -> Path:
    """Copy ``src``'s bytes (and mode) to ``dst`` atomically, replacing ``dst`` (a link there is replaced, never
    followed); ``times`` keeps ``src``'s access and modification times too. Return ``dst``."""
    st = os.stat(src)
    with open(src, "rb") as fin, atomic_file(dst, mode=st.st_mode & 0o777) as out:
        shutil.copyfileobj(fin, out, _CHUNK)
        if times:
            out.flush()
            os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
    return Path(dst)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically and return the path."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically and return the path."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 hex digest of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def check_output_path(path: str | os.PathLike[str] | None, *, suffix: str | tuple[str, ...], what: str) -> Path | None:
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
