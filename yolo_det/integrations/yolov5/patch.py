"""Patch a YOLOv5 tree so its scripts run under yolo-det profiles (``yolo-det patch-yolov5 DIR``).

This module plans (:func:`plan`: what patching, or reverting, does to each file of a tree; nothing written);
the edits are :mod:`.edits`, the all-or-nothing writer :mod:`.writer`.

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
train_loader        ``train_loader, dataset = create_dataloader(``    becomes ``train_loader, dataset =
                    (detect and segment)                              ydet.train_loader(create_dataloader)(``
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
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import PatchError, ProfileError
from ...core.profiles import load_profile
from .edits import BACKUP_SUFFIX, FILES, MARKER, Edit, NotRecognised, patch_text, revert_text, unified_diff

__all__ = [
    "BACKUP_SUFFIX",
    "FILES",
    "MARKER",
    "Edit",
    "FilePlan",
    "NotRecognised",
    "PatchPlan",
    "find_tree",
    "patch_text",
    "plan",
    "revert_text",
    "unified_diff",
]

_REQUIRED = ("train.py", "val.py", "utils/general.py", "models/yolo.py")

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
