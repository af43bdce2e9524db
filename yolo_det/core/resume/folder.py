"""The folder a resumed run writes into: the run folder that holds its checkpoint, never another."""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import read_checkpoint


def run_folder_of(checkpoint: str | os.PathLike[str]) -> Path | None:
    """The run folder holding ``checkpoint`` (``RUN`` for ``RUN/weights/last.pt``); None when the file is not
    in a ``weights`` folder."""
    path = Path(checkpoint).expanduser().absolute()
    return path.parent.parent if path.parent.name == "weights" else None


def _same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def resume_folder(
    checkpoint: str | os.PathLike[str], *, stored: str | None = None, requested: str | os.PathLike[str] | None = None
) -> Path:
    """The folder a run resumed from ``checkpoint`` writes into: the run folder that holds the checkpoint.

    Ultralytics writes a resumed run into the ``save_dir`` stored in the checkpoint, which for a copied,
    moved or renamed run folder is another run's folder. yolo-det passes the folder returned here as
    ``save_dir`` instead, so a resumed run never writes outside the folder that holds its checkpoint.

    Args:
        checkpoint: The checkpoint being resumed.
        stored: The ``save_dir`` stored in the checkpoint (for the messages).
        requested: A ``save_dir`` the caller asked for; it must be that same folder.

    Raises:
        ConfigError: The checkpoint is not in a run's ``weights`` folder, ``requested`` names another folder,
            the folder holds a completed run (whose files resuming would overwrite), or it holds a symbolic link.
    """
    import json

    from ..errors import ConfigError
    from ..record import RECORD_NAME

    ckpt = Path(checkpoint).expanduser().absolute()
    folder = run_folder_of(ckpt)
    where = f"'{stored}'" if stored else "the folder stored in it"
    if folder is None:
        raise ConfigError(
            f"cannot resume '{ckpt}': it is not in a run's weights/ folder, and the run would write into "
            f"{where}; copy it to NEW_RUN/weights/last.pt and resume that"
        )
    if requested not in (None, "") and not _same_folder(requested, folder):
        raise ConfigError(
            f"cannot resume '{ckpt}' into '{requested}': a resumed run writes into the folder that holds "
            f"its checkpoint ('{folder}'); copy the run folder to '{requested}' and resume the copy"
        )
    from ..runfolder import check_no_links

    check_no_links(folder)  # a received run folder's links are never written through
    try:
        record = json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("status") == "completed":
        raise ConfigError(
            f"cannot resume '{ckpt}': '{folder}' holds a completed run whose files resuming would "
            "overwrite; copy the checkpoint to NEW_RUN/weights/last.pt and resume that"
        )
    return folder


def resume_save_dir(checkpoint: str | os.PathLike[str], requested: str | os.PathLike[str] | None = None) -> str:
    """The ``save_dir`` to pass to a run resumed from ``checkpoint`` (see :func:`resume_folder`)."""
    stored = None
    try:
        stored = read_checkpoint(Path(checkpoint).expanduser()).train_args.get("save_dir")
    except Exception:  # the framework reports an unreadable checkpoint its own way
        stored = None
    return str(resume_folder(checkpoint, stored=stored if isinstance(stored, str) else None, requested=requested))
