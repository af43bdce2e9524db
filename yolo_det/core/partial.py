"""Weights files cut short (a full disk, a size limit, a write error): set aside, never left looking like good ones.

Ultralytics writes ``last.pt`` and ``best.pt`` in place; a write that fails half way leaves a file with the
right name and part of the bytes, which a later ``resume=`` or ``yolo-det digest`` would take for a
checkpoint. A ``torch.save`` file is a zip archive whose directory is written last, so a file cut short has
no end-of-directory record. :func:`set_aside_incomplete` renames every such file this run wrote to
``<name>.incomplete`` (a rename needs no free space) and says so in its entry of the record.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["INCOMPLETE_SUFFIX", "is_complete_checkpoint", "set_aside_incomplete"]

INCOMPLETE_SUFFIX = ".incomplete"


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a whole zip archive (as ``torch.save`` writes): its end-of-directory record is there."""
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _free_name(path: Path) -> Path:
    candidate = path.with_name(path.name + INCOMPLETE_SUFFIX)
    n = 2
    while candidate.exists():
        candidate = path.with_name(f"{path.name}{INCOMPLETE_SUFFIX}{n}")
        n += 1
    return candidate


def set_aside_incomplete(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rename the weights files this run wrote that are cut short; return the entries updated.

    Args:
        files: Entries of :func:`yolo_det.core.endings.weights_files` (``file``, ``sha256``,
            ``written_by_this_run``). Only a file that could not be read back (``sha256`` None), that this run
            wrote, and that is not a whole zip archive is renamed; its entry gets ``"incomplete": true`` and
            ``"renamed_from"`` (the old path), and ``file`` names where it is now (or stays, with
            ``"rename_error"``, when even the rename fails).
    """
    out = []
    for entry in files:
        path = Path(str(entry.get("file", "")))
        if (
            entry.get("sha256") is None
            and entry.get("written_by_this_run", True)
            and path.is_file()
            and not is_complete_checkpoint(path)
        ):
            entry = dict(entry, incomplete=True)
            target = _free_name(path)
            try:
                os.replace(path, target)
                entry.update(file=str(target), renamed_from=str(path))
            except OSError as e:
                entry["rename_error"] = f"{type(e).__name__}: {e.strerror or e}"
        out.append(entry)
    return out
