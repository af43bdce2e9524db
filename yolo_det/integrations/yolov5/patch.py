"""Patch a YOLOv5 tree so its scripts run under yolo-det profiles (``yolo-det patch-yolov5 DIR``).

Length: one command: the edit table, the text patcher and the all-or-nothing writer with its journal.

The patch is a handful of one-line edits per script, each anchored on a line whose text is stable across
YOLOv5 tags and the ``yolov5`` PyPI package (whose imports read ``from yolov5.utils...``), not on line
numbers. Every line the patch writes ends with ``# yolo-det``; the edits call
:mod:`yolo_det.integrations.yolov5` and keep YOLOv5's behaviour when ``--det-profile`` is not given.

==================  ================================================  ==========================================
edit                anchor (the line looked for)                      change
==================  ================================================  ==========================================
import              ``from utils.general import ...``                 ``from yolo_det.integrations import
                                                                      yolov5 as ydet`` inserted before it
training            ``def train(``                                    ``@ydet.training`` inserted before it
init_seeds          ``init_seeds(opt.seed + 1 + RANK, ...)``          becomes ``ydet.init_seeds(init_seeds, ...)``
prepare_model       ``amp = check_amp(model)`` (``model =             ``model = ydet.prepare_model(model)``
                    model.to(device)`` in classify)                   inserted before (after) it
last_opt_step       ``last_opt_step = -1`` (detect and segment)       becomes ``last_opt_step =
                                                                      ydet.last_opt_step(-1)``
backward            ``scaler.scale(loss).backward()``                 becomes ``ydet.backward(scaler.scale(loss))``
option              ``parser.add_argument('--seed', ...`` (train)     ``ydet.add_argument(parser)`` inserted
                    ``parser = argparse.ArgumentParser()`` (others)   after it
validation          ``def run(`` in ``val.py``                        ``@ydet.validation`` inserted before it
deployment          ``def run(`` in detect/export/predict             ``@ydet.deployment`` inserted before it
==================  ================================================  ==========================================

Patching is idempotent: a file is first brought back to its unpatched text (every ``# yolo-det`` line
reverted) and the edits applied to that, so a second run finds nothing to change. A file where an anchor
is missing or ambiguous is left untouched and reported with the line that was looked for. Files are
written atomically, each after a backup of its previous text (``<file>.yolo-det.bak``).

Nothing is written outside the tree: the tree is its real path, and a file (or a folder above it) that is
a symbolic link resolving outside the tree is refused before anything is written. A symbolic link inside
the tree stays a link: the file it points to is patched (two links to one file are refused). The whole
operation is atomic: every new text and backup is first written to a temporary file next to its target,
then all are renamed into place; any exception or interruption (Ctrl-C) before the last rename removes the
temporary files and puts back every file already renamed, so the tree is as it was.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from ...core.errors import PatchError, ProfileError
from ...core.fileio import atomic_write_text, new_file_mode
from ...core.profiles import load_profile

__all__ = [
    "BACKUP_SUFFIX",
    "DEFERRED_SIGNALS",
    "FILES",
    "JOURNAL",
    "MARKER",
    "Edit",
    "FilePlan",
    "NotRecognised",
    "PatchPlan",
    "apply_plan",
    "find_tree",
    "patch_text",
    "pending_journal",
    "plan",
    "repair",
    "revert_text",
    "unified_diff",
]

#: Every line the patch writes ends with this comment.
MARKER = "# yolo-det"
#: Suffix of the backup written next to a file before it is changed.
BACKUP_SUFFIX = ".yolo-det.bak"

_IMPORT_LINE = f"from yolo_det.integrations import yolov5 as ydet  {MARKER}"


@dataclass(frozen=True)
class Edit:
    """One anchored edit of a YOLOv5 script.

    Attributes:
        name: Short name shown in reports.
        anchor: The line looked for, as a reader would write it (shown when it is not found).
        pattern: Regex matching the anchor line (without its line ending); the named group ``indent`` is
            the line's indentation.
        kind: ``before``/``after``: insert a line before/after the anchor; ``replace``: rewrite the anchor.
        template: The new line, formatted with the pattern's named groups and ``args`` (the option line's
            extra arguments).
        patched: Regex matching the line this edit writes.
        restore: For ``replace`` edits, the original line, formatted with ``patched``'s named groups.
    """

    name: str
    anchor: str
    pattern: re.Pattern[str]
    kind: Literal["before", "after", "replace"]
    template: str
    patched: re.Pattern[str]
    restore: str = ""


def _insert(name: str, anchor: str, pattern: str, kind: Literal["before", "after"], code: str, patched: str) -> Edit:
    return Edit(
        name,
        anchor,
        re.compile(pattern),
        kind,
        "{indent}" + code + "  " + MARKER,
        re.compile(r"(?P<indent>[ \t]*)" + patched + r"  " + re.escape(MARKER) + r"[ \t]*$"),
    )


_IMPORT = Edit(
    "import",
    "from utils.general import ...",
    re.compile(r"(?P<indent>)from (?:yolov5\.)?utils\.general import\b"),
    "before",
    _IMPORT_LINE,
    re.compile(r"(?P<indent>)" + re.escape(_IMPORT_LINE) + r"[ \t]*$"),
)
_TRAINING = _insert(
    "training", "def train(", r"(?P<indent>)def train\(", "before", "@ydet.training", r"@ydet\.training"
)
_INIT_SEEDS = Edit(
    "init_seeds",
    "init_seeds(opt.seed + 1 + RANK, deterministic=True)",
    re.compile(r"(?P<indent>[ \t]+)init_seeds\((?P<call>opt\.seed\b[^#]*)\)[ \t]*$"),
    "replace",
    "{indent}ydet.init_seeds(init_seeds, {call})  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)ydet\.init_seeds\(init_seeds, (?P<call>[^#]*)\)  " + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}init_seeds({call})",
)
_BACKWARD = Edit(
    "backward",
    "scaler.scale(loss).backward()",
    re.compile(r"(?P<indent>[ \t]+)scaler\.scale\((?P<loss>\w+)\)\.backward\(\)[ \t]*$"),
    "replace",
    "{indent}ydet.backward(scaler.scale({loss}))  " + MARKER,
    re.compile(
        r"(?P<indent>[ \t]+)ydet\.backward\(scaler\.scale\((?P<loss>\w+)\)\)  " + re.escape(MARKER) + r"[ \t]*$"
    ),
    "{indent}scaler.scale({loss}).backward()",
)
_MODEL_DETECT = _insert(
    "prepare_model",
    "amp = check_amp(model)",
    r"(?P<indent>[ \t]+)amp = check_amp\(model\)",
    "before",
    "model = ydet.prepare_model(model)",
    r"model = ydet\.prepare_model\(model\)",
)
_MODEL_CLASSIFY = _insert(
    "prepare_model",
    "model = model.to(device)",
    r"(?P<indent>[ \t]+)model = model\.to\(device\)[ \t]*(?:#.*)?$",
    "after",
    "model = ydet.prepare_model(model)",
    r"model = ydet\.prepare_model\(model\)",
)
_OPTION_PATCHED = r"ydet\.add_argument\(parser(?:, default=[^#]*)?\)"
_OPTION_TRAIN = _insert(
    "option",
    "parser.add_argument('--seed', ...)",
    r"(?P<indent>[ \t]+)parser\.add_argument\(['\"]--seed['\"].*\)[ \t]*(?:#.*)?$",
    "after",
    "ydet.add_argument(parser{args})",
    _OPTION_PATCHED,
)
_OPTION_RUN = _insert(
    "option",
    "parser = argparse.ArgumentParser()",
    r"(?P<indent>[ \t]+)parser = argparse\.ArgumentParser\(\)[ \t]*(?:#.*)?$",
    "after",
    "ydet.add_argument(parser{args})",
    _OPTION_PATCHED,
)
_VALIDATION = _insert(
    "validation", "def run(", r"(?P<indent>)def run\(", "before", "@ydet.validation", r"@ydet\.validation"
)
_DEPLOYMENT = _insert(
    "deployment", "def run(", r"(?P<indent>)def run\(", "before", "@ydet.deployment", r"@ydet\.deployment"
)

_LAST_OPT_STEP = Edit(
    "last_opt_step",
    "last_opt_step = -1",
    re.compile(r"(?P<indent>[ \t]+)last_opt_step = -1[ \t]*$"),
    "replace",
    "{indent}last_opt_step = ydet.last_opt_step(-1)  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)last_opt_step = ydet\.last_opt_step\(-1\)  " + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}last_opt_step = -1",
)

_TRAIN_EDITS = (_IMPORT, _TRAINING, _INIT_SEEDS, _MODEL_DETECT, _LAST_OPT_STEP, _BACKWARD, _OPTION_TRAIN)

#: The files the patch changes (relative to the tree's root) and their edits. ``train.py`` and ``val.py``
#: must exist; the others are patched where the tag has them.
FILES: dict[str, tuple[Edit, ...]] = {
    "train.py": _TRAIN_EDITS,
    "segment/train.py": _TRAIN_EDITS,
    "classify/train.py": (_IMPORT, _TRAINING, _INIT_SEEDS, _MODEL_CLASSIFY, _BACKWARD, _OPTION_TRAIN),
    "val.py": (_IMPORT, _VALIDATION),
    "segment/val.py": (_IMPORT, _VALIDATION),
    "classify/val.py": (_IMPORT, _VALIDATION),
    "detect.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "export.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "segment/predict.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "classify/predict.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
}
_REQUIRED = ("train.py", "val.py", "utils/general.py", "models/yolo.py")


class NotRecognised(PatchError):
    """A file does not have the line an edit is anchored on (or has it more than once)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.detail = message


# ---------------------------------------------------------------------------------------------------------
# text transforms


def _split(text: str) -> list[tuple[str, str]]:
    """Lines as (body, line ending)."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        out.append((body, line[len(body) :]))
    return out


def _newline(lines: Sequence[tuple[str, str]]) -> str:
    for _, end in lines:
        if end:
            return end
    return "\n"


def revert_text(text: str, edits: Iterable[Edit], *, path: str = "<text>") -> str:
    """Return ``text`` with every line written by ``edits`` reverted (unpatched text is returned as is).

    Raises:
        NotRecognised: A line carries the ``# yolo-det`` marker but no edit of this version wrote it.
    """
    edits = tuple(edits)
    out: list[str] = []
    for number, (body, end) in enumerate(_split(text), start=1):
        if MARKER not in body:
            out.append(body + end)
            continue
        for edit in edits:
            m = edit.patched.fullmatch(body)
            if m is None:
                continue
            if edit.kind == "replace":
                out.append(edit.restore.format(**m.groupdict()) + end)
            break
        else:
            raise NotRecognised(
                path,
                f"line {number} is marked '{MARKER}' but is not a line this version of "
                f"yolo-det writes: {body.strip()!r}; restore it by hand (see the backup "
                f"*{BACKUP_SUFFIX} or 'git diff')",
            )
    return "".join(out)


def patch_text(text: str, edits: Iterable[Edit], *, path: str = "<text>", default_profile: str | None = None) -> str:
    """Return the patched form of ``text`` (patched or not).

    Args:
        text: The file's text.
        edits: The file's edits (see :data:`FILES`).
        path: Shown in errors.
        default_profile: Written as the ``--det-profile`` default (None: YOLOv5's behaviour by default).

    Raises:
        NotRecognised: An anchor is missing or ambiguous, or a marked line is unknown.
    """
    edits = tuple(edits)
    lines = _split(revert_text(text, edits, path=path))
    args = "" if default_profile is None else f", default={default_profile!r}"
    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    replace: dict[int, str] = {}
    for edit in edits:
        hits = [(i, m) for i, (body, _) in enumerate(lines) if (m := edit.pattern.match(body))]
        if len(hits) != 1:
            found = "found none" if not hits else f"found {len(hits)} (lines {', '.join(str(i + 1) for i, _ in hits)})"
            raise NotRecognised(
                path,
                f"expected exactly one line like `{edit.anchor}` for the '{edit.name}' edit, {found}; left unchanged",
            )
        i, m = hits[0]
        new = edit.template.format(args=args, **m.groupdict())
        if edit.kind == "before":
            before.setdefault(i, []).append(new)
        elif edit.kind == "after":
            after.setdefault(i, []).append(new)
        else:
            if i in replace:
                raise NotRecognised(path, f"two edits rewrite line {i + 1}; left unchanged")
            replace[i] = new
    newline = _newline(lines)
    out: list[str] = []
    for i, (body, end) in enumerate(lines):
        out.extend(line + newline for line in before.get(i, []))
        out.append(replace.get(i, body) + (end if end or i not in after else newline))
        out.extend(line + (end or newline) for line in after.get(i, []))
    return "".join(out)


def unified_diff(path: str, old: str, new: str, *, context: int = 3) -> str:
    """A git-style unified diff of one file (``a/PATH`` -> ``b/PATH``), ``""`` when equal."""
    if old == new:
        return ""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    body = []
    for line in difflib.unified_diff(old_lines, new_lines, f"a/{path}", f"b/{path}", n=context):
        if not line.endswith(("\n", "\r")):
            line += "\n\\ No newline at end of file\n"
        body.append(line)
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


# ---------------------------------------------------------------------------------------------------------
# trees


def find_tree(directory: str | os.PathLike[str]) -> Path:
    """Return the root of the YOLOv5 tree at ``directory`` (a clone, or the installed ``yolov5`` package).

    Raises:
        PatchError: ``directory`` does not exist or is not a YOLOv5 tree.
    """
    root = Path(directory).expanduser()
    if root.is_dir():
        root = Path(os.path.realpath(root))  # the tree is where the folder really is
    if not root.is_dir():
        raise PatchError(f"'{directory}' is not a folder; give the folder of a YOLOv5 clone (the one with train.py)")
    missing = [name for name in _REQUIRED if not (root / name).is_file()]
    if missing:
        raise PatchError(
            f"'{directory}' is not a YOLOv5 tree: {', '.join(missing)} not found; give the folder of "
            f"a YOLOv5 clone or of the installed yolov5 package"
        )
    return root


@dataclass
class FilePlan:
    """What patching (or reverting) does to one file.

    Attributes:
        path: Path relative to the tree root (``/``-separated).
        old: The file's current text (None when the file is absent from this tree).
        new: The text it gets (None when absent or not recognised).
        error: Why the file is left untouched (not recognised), or None.
        target: The real path written (the file a symbolic link inside the tree points to).
    """

    path: str
    old: str | None
    new: str | None = None
    error: str | None = None
    target: Path | None = None

    @property
    def changes(self) -> bool:
        """Whether the file would be written."""
        return self.old is not None and self.new is not None and self.new != self.old

    @property
    def patched(self) -> bool:
        """Whether the file currently holds lines written by the patch."""
        return self.old is not None and MARKER in self.old

    def diff(self) -> str:
        """Unified diff of the change (empty when nothing changes)."""
        return unified_diff(self.path, self.old or "", self.new or "") if self.changes else ""

    def summary(self) -> list[str]:
        """Changed lines as ``line N: text`` (numbers of the new text for additions, old for removals)."""
        if not self.changes:
            return []
        out = []
        old, new = (self.old or "").splitlines(), (self.new or "").splitlines()
        matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in {"replace", "delete"}:
                out += [f"  -{i + 1}: {line.strip()}" for i, line in enumerate(old[i1:i2], start=i1)]
            if tag in {"replace", "insert"}:
                out += [f"  +{j + 1}: {line.strip()}" for j, line in enumerate(new[j1:j2], start=j1)]
        return out


@dataclass
class PatchPlan:
    """The files of a tree and what an operation does to each."""

    root: Path
    reverse: bool
    files: list[FilePlan] = field(default_factory=list)

    @property
    def changes(self) -> list[FilePlan]:
        """Files that would be written."""
        return [f for f in self.files if f.changes]

    @property
    def unrecognised(self) -> list[FilePlan]:
        """Files left untouched because an anchor was not found."""
        return [f for f in self.files if f.error is not None]

    def diff(self) -> str:
        """Unified diff of every change, ``git apply``-able from the tree root."""
        return "".join(f.diff() for f in self.files)


def _read(path: Path, rel: str) -> str:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except UnicodeDecodeError:
        raise NotRecognised(rel, "is not UTF-8 text; left unchanged") from None
    except OSError as e:
        raise PatchError(f"cannot read {path}: {e.strerror or e}") from None


def _inside(root: Path, rel: str) -> Path:
    """The real path of ``root / rel``, refusing one that leaves the tree (through a symbolic link)."""
    path = root / rel
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        link = next(
            (
                p
                for p in [*reversed(path.relative_to(root).parents), path.relative_to(root)]
                if p != Path(".") and (root / p).is_symlink()
            ),
            Path(rel),
        )
        raise PatchError(
            f"{root / link} is a symbolic link to {os.path.realpath(root / link)}, outside the tree; "
            "yolo-det writes nothing outside the folder it patches: replace the link by a copy "
            "(or patch the tree it points to)"
        )
    return real


def plan(directory: str | os.PathLike[str], *, reverse: bool = False, default_profile: str | None = None) -> PatchPlan:
    """Work out, without writing anything, what patching (or ``reverse``) does to the tree at ``directory``.

    Raises:
        PatchError: Not a YOLOv5 tree, a file cannot be read, a file or folder links outside the tree, two
            files are links to one, or the profile is unknown.
    """
    if default_profile is not None:
        try:
            load_profile(default_profile)
        except ProfileError as e:
            raise PatchError(f"--profile: {' '.join(str(e).split())}") from None
    root = find_tree(directory)
    result = PatchPlan(root=root, reverse=reverse)
    targets: dict[Path, str] = {}
    for rel, edits in FILES.items():
        path = root / rel
        if not path.is_file():
            continue
        target = _inside(root, rel)
        _inside(root, rel + BACKUP_SUFFIX)
        if (root / (rel + BACKUP_SUFFIX)).is_symlink():
            raise PatchError(f"the backup {root / (rel + BACKUP_SUFFIX)} is a symbolic link; remove it and run again")
        if target in targets:
            raise PatchError(
                f"{path} and {root / targets[target]} are the same file ({target}); the patch edits "
                "each differently: replace the link by a copy"
            )
        targets[target] = rel
        text = None
        try:
            text = _read(path, rel)
            new = (
                revert_text(text, edits, path=rel)
                if reverse
                else patch_text(text, edits, path=rel, default_profile=default_profile)
            )
            result.files.append(FilePlan(rel, text, new, target=target))
        except NotRecognised as e:
            result.files.append(FilePlan(rel, text, None, e.detail, target=target))
    return result


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
        part = orig.with_name(orig.name + ".part")
        shutil.copy2(path, part)
        os.replace(part, orig)  # a copy cut short is never taken for the original


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
