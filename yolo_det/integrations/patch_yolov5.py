"""Patch a YOLOv5 tree so its scripts run under yolo-det profiles (``yolo-det patch-yolov5 DIR``).

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
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..core.errors import PatchError, ProfileError
from ..core.fileio import atomic_write_text, new_file_mode
from ..core.profiles import load_profile

__all__ = [
    "BACKUP_SUFFIX",
    "FILES",
    "MARKER",
    "Edit",
    "FilePlan",
    "NotRecognised",
    "PatchPlan",
    "apply_plan",
    "find_tree",
    "patch_text",
    "plan",
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


def _insert(name: str, anchor: str, pattern: str, kind: Literal["before", "after"], code: str,
            patched: str) -> Edit:
    return Edit(name, anchor, re.compile(pattern), kind, "{indent}" + code + "  " + MARKER,
                re.compile(r"(?P<indent>[ \t]*)" + patched + r"  " + re.escape(MARKER) + r"[ \t]*$"))


_IMPORT = Edit(
    "import", "from utils.general import ...",
    re.compile(r"(?P<indent>)from (?:yolov5\.)?utils\.general import\b"), "before", _IMPORT_LINE,
    re.compile(r"(?P<indent>)" + re.escape(_IMPORT_LINE) + r"[ \t]*$"),
)
_TRAINING = _insert("training", "def train(", r"(?P<indent>)def train\(", "before",
                    "@ydet.training", r"@ydet\.training")
_INIT_SEEDS = Edit(
    "init_seeds", "init_seeds(opt.seed + 1 + RANK, deterministic=True)",
    re.compile(r"(?P<indent>[ \t]+)init_seeds\((?P<call>opt\.seed\b[^#]*)\)[ \t]*$"), "replace",
    "{indent}ydet.init_seeds(init_seeds, {call})  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)ydet\.init_seeds\(init_seeds, (?P<call>[^#]*)\)  " + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}init_seeds({call})",
)
_BACKWARD = Edit(
    "backward", "scaler.scale(loss).backward()",
    re.compile(r"(?P<indent>[ \t]+)scaler\.scale\((?P<loss>\w+)\)\.backward\(\)[ \t]*$"), "replace",
    "{indent}ydet.backward(scaler.scale({loss}))  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)ydet\.backward\(scaler\.scale\((?P<loss>\w+)\)\)  "
               + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}scaler.scale({loss}).backward()",
)
_MODEL_DETECT = _insert("prepare_model", "amp = check_amp(model)", r"(?P<indent>[ \t]+)amp = check_amp\(model\)",
                        "before", "model = ydet.prepare_model(model)", r"model = ydet\.prepare_model\(model\)")
_MODEL_CLASSIFY = _insert("prepare_model", "model = model.to(device)",
                          r"(?P<indent>[ \t]+)model = model\.to\(device\)[ \t]*(?:#.*)?$", "after",
                          "model = ydet.prepare_model(model)", r"model = ydet\.prepare_model\(model\)")
_OPTION_PATCHED = r"ydet\.add_argument\(parser(?:, default=[^#]*)?\)"
_OPTION_TRAIN = _insert("option", "parser.add_argument('--seed', ...)",
                        r"(?P<indent>[ \t]+)parser\.add_argument\(['\"]--seed['\"].*\)[ \t]*(?:#.*)?$", "after",
                        "ydet.add_argument(parser{args})", _OPTION_PATCHED)
_OPTION_RUN = _insert("option", "parser = argparse.ArgumentParser()",
                      r"(?P<indent>[ \t]+)parser = argparse\.ArgumentParser\(\)[ \t]*(?:#.*)?$", "after",
                      "ydet.add_argument(parser{args})", _OPTION_PATCHED)
_VALIDATION = _insert("validation", "def run(", r"(?P<indent>)def run\(", "before",
                      "@ydet.validation", r"@ydet\.validation")
_DEPLOYMENT = _insert("deployment", "def run(", r"(?P<indent>)def run\(", "before",
                      "@ydet.deployment", r"@ydet\.deployment")

_LAST_OPT_STEP = Edit(
    "last_opt_step", "last_opt_step = -1",
    re.compile(r"(?P<indent>[ \t]+)last_opt_step = -1[ \t]*$"), "replace",
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
        out.append((body, line[len(body):]))
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
            raise NotRecognised(path, f"line {number} is marked '{MARKER}' but is not a line this version of "
                                      f"yolo-det writes: {body.strip()!r}; restore it by hand (see the backup "
                                      f"*{BACKUP_SUFFIX} or 'git diff')")
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
            raise NotRecognised(path, f"expected exactly one line like `{edit.anchor}` for the '{edit.name}' edit, "
                                      f"{found}; left unchanged")
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
        raise PatchError(f"'{directory}' is not a YOLOv5 tree: {', '.join(missing)} not found; give the folder of "
                         f"a YOLOv5 clone or of the installed yolov5 package")
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
        link = next((p for p in [*reversed(path.relative_to(root).parents), path.relative_to(root)]
                     if p != Path(".") and (root / p).is_symlink()), Path(rel))
        raise PatchError(f"{root / link} is a symbolic link to {os.path.realpath(root / link)}, outside the tree; "
                         "yolo-det writes nothing outside the folder it patches: replace the link by a copy "
                         "(or patch the tree it points to)")
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
            raise PatchError(f"{path} and {root / targets[target]} are the same file ({target}); the patch edits "
                             "each differently: replace the link by a copy")
        targets[target] = rel
        text = None
        try:
            text = _read(path, rel)
            new = revert_text(text, edits, path=rel) if reverse else \
                patch_text(text, edits, path=rel, default_profile=default_profile)
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
            raise PatchError(f"{root / f.path} is read-only; make the YOLOv5 tree writable (or patch a copy) and run "
                             "again")
    folders = {_target(root, f).parent for f in files} | {(root / f.path).parent for f in files}
    for folder in sorted(folders):
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".yolo-det-probe.")
        except OSError as e:
            raise PatchError(f"cannot write in {folder} ({e.strerror or e}); make the YOLOv5 tree writable "
                             f"(or patch a copy) and run again") from None
        os.close(fd)
        os.unlink(probe)
    if backup:
        for f in files:
            target = root / (f.path + BACKUP_SUFFIX)
            if target.exists() and not os.access(target, os.W_OK):
                raise PatchError(f"cannot overwrite the backup {target}; remove it and run again")


def _write_temp(target: Path, text: str) -> Path:
    """Write ``text`` to a new temporary file next to ``target`` (flushed, with ``target``'s mode); return it."""
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = new_file_mode()  # as open() would make it: 0o666 less the umask
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _replace(tmp: Path, target: Path) -> None:
    """Rename a staged file over its target."""
    os.replace(tmp, target)


def _previous(path: Path) -> str | None:
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def apply_plan(result: PatchPlan, *, backup: bool = True) -> list[Path]:
    """Write the plan's changes, all or nothing: for each file a backup of its current text and the new text.

    Every file is checked for writability first, so a read-only tree changes nothing. Then every backup and
    new text is written to a temporary file next to its target, and only when all are written are they
    renamed into place. If anything fails or is interrupted (``KeyboardInterrupt`` included), the temporary
    files are removed and the files already renamed are put back, and the exception is raised again
    (an ``OSError`` as a :class:`PatchError`).

    Returns:
        The paths written (backups excluded).

    Raises:
        PatchError: The tree is not writable, or a write failed (the tree is left as it was).
    """
    root = result.root
    files = result.changes
    _check_writable(root, files, backup)
    staged: list[tuple[Path, Path, str | None]] = []  # (temporary file, target, previous text or None)
    done: list[tuple[Path, str | None]] = []
    try:
        for f in files:
            if backup:
                bak = root / (f.path + BACKUP_SUFFIX)
                staged.append((_write_temp(bak, f.old or ""), bak, _previous(bak)))
            target = _target(root, f)
            staged.append((_write_temp(target, f.new or ""), target, f.old or ""))
        for tmp, target, previous in staged:
            _replace(tmp, target)
            done.append((target, previous))
    except BaseException as e:
        for tmp, _, _ in staged:
            tmp.unlink(missing_ok=True)
        for target, previous in reversed(done):
            try:
                if previous is None:
                    target.unlink(missing_ok=True)
                else:
                    atomic_write_text(target, previous)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise PatchError(f"writing the YOLOv5 tree failed ({e}); nothing was changed") from None
        raise
    return [root / f.path for f in files]
