"""The patch's journalled writer: a plan's files written all or nothing, whatever interrupts it.

Every new text and backup is first written to a temporary file next to its target, then all are renamed into
place; any exception or interruption (Ctrl-C) before the last rename removes the temporary files and puts back
every file already renamed, so the tree is as it was. A journal at the tree's root names what is staged and
what is renamed, so that even a SIGKILL is undone (or completed) by the next run (:func:`repair`).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ...core.errors import PatchError
from ...core.fileio import atomic_write_text, copy_file, new_file_mode
from .edits import FILES, MARKER
from .patch import BACKUP_SUFFIX, FilePlan, PatchPlan, _inside, find_tree

__all__ = ["DEFERRED_SIGNALS", "JOURNAL", "apply_plan", "pending_journal", "repair"]


def _target(root: Path, f: FilePlan) -> Path:
    return f.target if f.target is not None else _inside(root, f.path)


def _check_writable(root: Path, files: Sequence[FilePlan], backup: bool) -> None:
    for f in files:
        path = _target(root, f)
        mode = path.stat().st_mode
        if not os.access(path, os.W_OK) or not mode & stat.S_IWUSR:
            raise PatchError(
                f"{root / f.path} is read-only; make the YOLOv5 tree writable (or patch a copy) and run again"
            )
    folders = {_target(root, f).parent for f in files} | {(root / f.path).parent for f in files}
    for folder in sorted(folders):
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".yolo-det-probe.")
        except OSError as e:
            raise PatchError(
                f"cannot write in {folder} ({e.strerror or e}); make the YOLOv5 tree writable "
                f"(or patch a copy) and run again"
            ) from None
        os.close(fd)
        os.unlink(probe)
    if backup:
        for f in files:
            target = root / (f.path + BACKUP_SUFFIX)
            if target.exists() and not os.access(target, os.W_OK):
                raise PatchError(f"cannot overwrite the backup {target}; remove it and run again")


#: The journal of an operation in progress, at the tree's root: what is staged and what is renamed, so that an
#: interruption (even SIGKILL) is undone by the next run (or ``--repair``).
JOURNAL = ".yolo-det-patch.journal"
_NEW = ".yolo-det-new"
_ORIG = ".yolo-det-orig"
#: Signals deferred while the tree is being changed: each is delivered once the tree is whole again.
DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

#: Test hook: called with the name of each point of :func:`apply_plan` (``stage:<file>``, ``link:<file>``,
#: ``rename:<file>``, ``commit``, ``cleanup:<file>``, ``rollback:<file>``), to inject a signal or a crash there.
fault_hook: Callable[[str], None] | None = None


class _Deferred:
    """Signals received while the tree is changed: recorded, not acted on."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)


@contextmanager
def _deferred_signals() -> Iterator[_Deferred]:
    """Record SIGINT, SIGTERM and SIGHUP instead of acting on them for the block (main thread only); then put
    the previous handlers back and deliver the first signal received to them (Ctrl-C raises KeyboardInterrupt
    as usual, once the tree is whole)."""
    deferred = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return
    previous = {}
    try:
        for signum in DEFERRED_SIGNALS:
            previous[signum] = signal.signal(signum, deferred)
        yield deferred
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if deferred.received:
            signal.raise_signal(deferred.received[0])


class _Stop(BaseException):
    """A deferred signal arrived before the commit point: undo, then let the signal act."""


def _point(name: str, deferred: _Deferred | None = None) -> None:
    if fault_hook is not None:
        fault_hook(name)
    if deferred is not None and deferred.received:
        raise _Stop


@dataclass
class _Entry:
    """One file the operation writes: ``path`` gets the staged ``new`` file; ``orig`` keeps its previous inode."""

    rel: str
    path: Path
    existed: bool

    @property
    def new(self) -> Path:
        return self.path.with_name(self.path.name + _NEW)

    @property
    def orig(self) -> Path:
        return self.path.with_name(self.path.name + _ORIG)

    def to_json(self) -> dict[str, Any]:
        return {"rel": self.rel, "path": str(self.path), "existed": self.existed}


def _write_temp(target: Path, text: str, staged: Path | None = None) -> Path:
    """Write ``text`` to ``staged`` (default: a new temporary file next to ``target``), flushed, with ``target``'s
    mode; return it."""
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = new_file_mode()  # as open() would make it: 0o666 less the umask
    if staged is None:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    else:
        fd, name = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), str(staged)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _replace(tmp: Path, target: Path) -> None:
    """Rename a staged file over its target."""
    os.replace(tmp, target)


def _keep_original(path: Path, orig: Path) -> None:
    """Make ``orig`` a second name of ``path``'s current file (a copy where hard links are not possible)."""
    try:
        os.link(path, orig)
    except OSError:
        copy_file(path, orig, times=True)  # atomic: a copy cut short is never taken for the original


def _write_journal(root: Path, entries: Sequence[_Entry], committed: bool) -> None:
    atomic_write_text(
        root / JOURNAL,
        json.dumps({"version": 1, "committed": committed, "files": [e.to_json() for e in entries]}, indent=1) + "\n",
    )


def _read_journal(root: Path) -> tuple[list[_Entry], bool] | None:
    path = root / JOURNAL
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = []
        for item in data["files"]:
            entry = _Entry(str(item["rel"]), Path(item["path"]), bool(item["existed"]))
            real = Path(os.path.realpath(entry.path.parent))
            if real != root and root not in real.parents:
                raise ValueError("a path outside the tree")
            # a journal is read from the tree, which may come from others: it names only the files this command
            # writes, and only a backup can be one that did not exist before (and is removed on undo)
            script = entry.rel[: -len(BACKUP_SUFFIX)] if entry.rel.endswith(BACKUP_SUFFIX) else entry.rel
            if script not in FILES or (not entry.existed and script == entry.rel):
                raise ValueError(f"a file this command does not write: {entry.rel[:80]!r}")
            entries.append(entry)
        return entries, bool(data["committed"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PatchError(
            f"{path} is not a journal this version of yolo-det reads ({type(e).__name__}); restore the "
            f"tree with 'git checkout' and remove the file"
        ) from None


def _undo(root: Path, entries: Sequence[_Entry]) -> None:
    """Put every file back as it was (the journal's order reversed), then drop the journal."""
    for e in reversed(entries):
        _point(f"rollback:{e.rel}")
        if e.existed:
            if e.orig.exists():
                os.replace(e.orig, e.path)
                e.orig.unlink(missing_ok=True)  # a rename between two names of one file leaves both
        elif not e.new.exists():
            e.path.unlink(missing_ok=True)  # created by this operation
        e.new.unlink(missing_ok=True)
        e.orig.with_name(e.orig.name + ".part").unlink(missing_ok=True)
    _drop_journal(root)


def _finish(root: Path, entries: Sequence[_Entry]) -> None:
    """After the commit point: drop the kept originals and the journal."""
    for e in entries:
        _point(f"cleanup:{e.rel}")
        e.orig.unlink(missing_ok=True)
        e.new.unlink(missing_ok=True)
        e.orig.with_name(e.orig.name + ".part").unlink(missing_ok=True)
    _drop_journal(root)


def _drop_journal(root: Path) -> None:
    for stray in root.glob(f".{JOURNAL}.*.tmp"):  # an atomic write of the journal cut short
        stray.unlink(missing_ok=True)
    (root / JOURNAL).unlink(missing_ok=True)


def pending_journal(directory: str | os.PathLike[str]) -> Path | None:
    """The journal an interrupted operation left in the tree at ``directory``, or None."""
    root = find_tree(directory)
    found = root / JOURNAL
    return found if found.exists() or any(root.glob(f".{JOURNAL}.*.tmp")) else None


def repair(directory: str | os.PathLike[str]) -> str | None:
    """Finish what an interrupted operation left (``SIGKILL``, power loss): undone when it stopped before its commit
    point, completed after it. Returns what was done (``"rolled back"``/``"completed"``), or None when nothing
    was pending."""
    root = find_tree(directory)
    if pending_journal(root) is None:
        return None
    with _deferred_signals():
        found = _read_journal(root)
        if found is None:  # only the journal's own temporary file: nothing was staged yet
            _drop_journal(root)
            return "rolled back"
        entries, committed = found
        if committed:
            _finish(root, entries)
            return "completed"
        _undo(root, entries)
        return "rolled back"


def apply_plan(result: PatchPlan, *, backup: bool = True) -> list[Path]:
    """Write the plan's changes, all or nothing: for each file a backup of its current text and the new text.

    Every file is checked for writability first, so a read-only tree changes nothing. A journal naming every
    file to be written is saved at the tree's root first; then every new text and backup is staged next to its
    target; then each target's current file is kept under a second name and the staged file renamed over it;
    the journal is marked committed and the kept files removed. SIGINT, SIGTERM and SIGHUP are deferred for the
    whole operation: one arriving before the commit point undoes everything (a second one changes nothing), one
    after it lets the operation finish; either way it is then delivered. An exception undoes everything too. A
    SIGKILL leaves the journal, and :func:`repair` (run automatically by the next ``patch-yolov5``) undoes or
    completes the operation.

    Returns:
        The paths written (backups excluded).

    Raises:
        PatchError: The tree is not writable, a file was not recognised, a journal is pending, or a write failed
            (the tree is left as it was).
    """
    root = result.root
    if result.unrecognised:  # a line marked by a patch this version did not write is named first
        f = min(result.unrecognised, key=lambda u: f"is marked '{MARKER}'" not in (u.error or ""))
        raise PatchError(
            f"{root / f.path}: not recognised: {f.error}; nothing was changed (the tree is patched whole or not at all)"
        )
    if pending_journal(root) is not None:
        raise PatchError(
            f"an interrupted patch-yolov5 left {root / JOURNAL}; run 'yolo-det patch-yolov5 {root} --repair' first"
        )
    files = result.changes
    if not files:
        return []
    with _deferred_signals():  # the probes it writes are never left behind
        _check_writable(root, files, backup)
    entries: list[_Entry] = []
    texts: list[str] = []
    for f in files:
        if backup:
            bak = root / (f.path + BACKUP_SUFFIX)
            entries.append(_Entry(f.path + BACKUP_SUFFIX, bak, bak.exists() or bak.is_symlink()))
            texts.append(f.old or "")
        entries.append(_Entry(f.path, _target(root, f), True))
        texts.append(f.new or "")
    for e in entries:
        for extra in (e.new, e.orig):
            if extra.exists() or extra.is_symlink():
                raise PatchError(f"{extra} is in the way (left by an earlier run?); remove it and run again")
    with _deferred_signals() as deferred:
        journal_written = False
        try:
            _point("journal", deferred)
            _write_journal(root, entries, committed=False)
            journal_written = True
            for e, text in zip(entries, texts, strict=True):
                _point(f"stage:{e.rel}", deferred)
                _write_temp(e.path, text, e.new)
            for e in entries:
                _point(f"link:{e.rel}", deferred)
                if e.existed:
                    _keep_original(e.path, e.orig)
                _point(f"rename:{e.rel}", deferred)
                _replace(e.new, e.path)
            _point("commit", deferred)
            _write_journal(root, entries, committed=True)
        except BaseException as exc:
            if journal_written:
                _undo(root, entries)
            else:
                _drop_journal(root)
            if isinstance(exc, _Stop):
                return []  # the deferred signal is delivered when the block ends
            if isinstance(exc, OSError):
                raise PatchError(f"writing the YOLOv5 tree failed ({exc}); nothing was changed") from None
            raise
        _finish(root, entries)
    return [root / f.path for f in files]
