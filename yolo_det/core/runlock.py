"""One live yolo-det run per run folder.

A training holds an exclusive ``flock`` on its run folder (the directory itself) from the moment the
folder is known until it has written its record. A second run (another process) that would write into the same
folder is refused with :class:`RunFolderBusy` (one line naming the holder; exit code 2 from the CLI)
before it writes anything yolo-det controls. The lock belongs to the open file, so the kernel drops it
when the holder dies, however it dies: a killed run never blocks the next one. While the lock is held,
``<run folder>/.yolo-det.lock`` names the holder (pid, host, start time) for the message only; it is
removed when the run ends (one left by a killed process is ignored and replaced).

Within one process the lock is re-entrant (the CLI takes it before Ultralytics builds its trainer, the
plugin again when training starts).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .errors import YoloDetError
from .fileio import atomic_write_text

__all__ = ["LOCK_NAME", "RunFolderBusy", "RunLock", "acquire"]

LOCK_NAME = ".yolo-det.lock"

_held: dict[str, RunLock] = {}
_guard = threading.Lock()


class RunFolderBusy(YoloDetError):
    """The run folder is in use by another live yolo-det run."""


class RunLock:
    """A held lock on one run folder; :meth:`release` it (re-entrant: one release per :func:`acquire`)."""

    def __init__(self, folder: Path, fd: int | None) -> None:
        self.folder = folder
        self.path = folder / LOCK_NAME
        self._fd = fd
        self._count = 1

    @property
    def held(self) -> bool:
        """Whether the lock is still held."""
        return self._count > 0

    def release(self) -> None:
        """Give the lock up (after the last release of a re-entrant hold, remove the lock file). Idempotent."""
        with _guard:
            if self._count <= 0:
                return
            self._count -= 1
            if self._count:
                return
            _held.pop(str(self.folder), None)
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                if json.loads(self.path.read_text(encoding="utf-8"))["pid"] == os.getpid():
                    self.path.unlink()  # ours: nobody else can write it while we hold the folder
        finally:
            os.close(fd)  # closes the open file description: the kernel drops the lock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"pid {int(info['pid'])} on {info['host']}, started {started}"
    except Exception:  # the description is best effort
        return "another process"


def acquire(folder: str | os.PathLike[str]) -> RunLock:
    """Lock ``folder`` (created if missing) for this run.

    Raises:
        RunFolderBusy: Another live process holds the folder.
        ConfigError: The folder holds a symbolic link (:func:`yolo_det.core.runfolder.check_no_links`).
    """
    import fcntl

    folder = Path(folder).resolve()
    key = str(folder)
    with _guard:
        lock = _held.get(key)
        if lock is not None and lock.held:
            lock._count += 1
            return lock
    from .runfolder import check_no_links

    check_no_links(folder)  # never written through a link a received run folder holds
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunFolderBusy(
            f"run folder '{folder}' is in use by another yolo-det run ({_holder(folder / LOCK_NAME)}); "
            "wait for it to end or choose another name= or project="
        ) from None
    except BaseException:
        os.close(fd)
        raise
    lock = RunLock(folder, fd)
    with _guard:
        _held[key] = lock
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "argv": list(sys.argv),
    }
    with contextlib.suppress(OSError):  # the description is best effort (a read-only folder has none)
        atomic_write_text(lock.path, json.dumps(info) + "\n")
    return lock
