"""How a run ended, and which weights files it left on disk, for ``determinism.json``.

Four endings: ``completed``; ``failed`` (an exception: its type and a one-line message);
``interrupted`` (SIGINT, Ctrl-C: :class:`KeyboardInterrupt`); ``terminated`` (SIGTERM or SIGHUP, which
yolo-det handles like Ctrl-C: :class:`~yolo_det.core.signals.Terminated`; the record names the signal).

Every weights file in the run's ``weights`` folder (``last.pt``, ``best.pt``, ``epochN.pt``) is listed
with the digest of the file as it is on disk (read back with :func:`~yolo_det.core.record.checkpoint_digest`,
the digest ``yolo-det digest`` prints, which reads tensors only and runs nothing the file names), never
of a model in memory: after an interruption the
in-memory EMA has moved on from the last file written. A file that cannot be read back (cut short by
the interruption) is listed with its error instead of a digest. Files that were already there before
the run started and that it did not rewrite are marked ``"written_by_this_run": false``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .signals import Terminated, pending

__all__ = ["describe_ending", "one_line", "weights_files", "weights_stats"]

_MESSAGE_LIMIT = 500


def one_line(exc: BaseException) -> str:
    """``str(exc)`` on one line, at most 500 characters."""
    return " ".join(str(exc).split())[:_MESSAGE_LIMIT]


def describe_ending(exc: BaseException | None) -> dict[str, Any]:
    """The ``status`` of a run that ended with ``exc`` (None: it completed), with the error or signal.

    An error raised while a stop signal was noted and not yet acted on (a rank whose peers were stopped first
    fails in a collective) ends the run as that signal's stop, the error kept beside it.

    Returns:
        ``{"status": ...}`` plus ``"signal"`` for ``terminated`` and ``"error": {"type", "message"}``
        for ``failed`` (and for a stop that surfaced as an error).
    """
    if exc is None:
        return {"status": "completed"}
    if isinstance(exc, Terminated):
        return {"status": "terminated", "signal": exc.signal_name, "signal_number": exc.signum}
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "signal": "SIGINT"}
    error = {"type": type(exc).__name__, "message": one_line(exc)}
    signum = pending()
    if signum is not None:  # a stop was noted first: the error is how it reached this process (its peers left)
        stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        return {**describe_ending(stop), "error": error}
    return {"status": "failed", "error": error}


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def weights_stats(weights_dir: str | os.PathLike[str]) -> dict[str, tuple[int, int, int, int]]:
    """``{file name: identity}`` of the ``*.pt`` files in ``weights_dir`` now (taken when a run starts)."""
    folder = Path(weights_dir)
    out: dict[str, tuple[int, int, int, int]] = {}
    try:
        entries = list(folder.iterdir())
    except OSError:
        return out
    for p in entries:
        try:
            if p.suffix == ".pt" and p.is_file():
                out[p.name] = _stat_key(p.stat())
        except OSError:
            continue
    return out


def _sort_key(p: Path) -> tuple[int, int, str]:
    order = {"last.pt": 0, "best.pt": 1}
    if p.name in order:
        return (order[p.name], 0, p.name)
    digits = "".join(c for c in p.stem if c.isdigit())
    return (2, int(digits) if digits else -1, p.name)


def weights_files(
    weights_dir: str | os.PathLike[str],
    before: Mapping[str, tuple[int, int, int, int]] | None = None,
    cache: dict[str, tuple[tuple[int, int, int, int], dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Every ``*.pt`` weights file in ``weights_dir`` with its weights digest read back from the file.

    Resume states (``yolo-det-resume.*.pt``, :mod:`yolo_det.core.resume`) are not weights files and are
    left out; the record's ``resume`` data names them.

    Args:
        weights_dir: The run's ``weights`` folder.
        before: :func:`weights_stats` taken when the run started; files it lists unchanged are marked
            ``"written_by_this_run": false``.
        cache: Entries of earlier calls by file name, reused while the file's identity (device, inode, size,
            modification time) is unchanged (a run rewriting its record at every checkpoint digests each file once).

    Returns:
        ``[{"file", "bytes", "sha256", "written_by_this_run"}]`` (``"error"`` instead of a digest for a
        file that cannot be read back): ``last.pt``, ``best.pt``, then epoch files in epoch order.
    """
    from .record import checkpoint_digest
    from .resume import is_state_file

    folder = Path(weights_dir)
    try:
        paths = sorted(
            (p for p in folder.iterdir() if p.suffix == ".pt" and p.is_file() and not is_state_file(p)), key=_sort_key
        )
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for p in paths:
        entry: dict[str, Any] = {"file": str(p)}
        try:
            st = p.stat()
            known = cache.get(p.name) if cache is not None else None
            if known is not None and known[0] == _stat_key(st):
                out.append(dict(known[1]))
                continue
            entry["bytes"] = st.st_size
            entry["written_by_this_run"] = before is None or before.get(p.name) != _stat_key(st)
            entry["sha256"] = checkpoint_digest(p)
            if cache is not None:
                cache[p.name] = (_stat_key(st), dict(entry))
        except Exception as e:  # a file cut short is reported, not fatal
            entry["sha256"] = None
            entry["error"] = f"{type(e).__name__}: {one_line(e)}"
        out.append(entry)
    return out
