"""Run folders are written, never followed: a folder training writes into holds no symbolic link.

Ultralytics writes into its run folder by name (``args.yaml``, ``results.csv``, ``weights/last.pt``,
``weights/best.pt``, plots); a link there would send those writes, and the appends to ``results.csv``, to
the file it points to, wherever that is. A run folder received from someone else can hold such links, so
before a training writes into an existing run folder (a resumed run, a fixed ``name=`` with
``exist_ok=True`` or ``save_dir=``), :func:`check_no_links` refuses one that holds a link at any depth,
with one line naming it. The run folder itself, and the folders above it, are taken as the user names them:
a ``runs`` folder that is a link to a larger disk is the user's own layout, and the run is written into the
folder it points to (locked and recorded there).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

__all__ = ["MAX_ENTRIES", "check_no_links"]

#: The most entries of a run folder looked at (a run folder holds tens; more is refused, not walked).
MAX_ENTRIES = 100_000


def check_no_links(folder: str | os.PathLike[str]) -> None:
    """Refuse a run folder that holds a symbolic link (file or folder, at any depth); no-op when it is missing.

    Raises:
        ConfigError: One line naming the first link found and what to do.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        return
    seen = 0
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            seen += 1
            entry = Path(here) / name
            if entry.is_symlink():
                try:
                    target = os.readlink(entry)
                except OSError:
                    target = "?"
                raise ConfigError(
                    f"run folder '{root}' holds a symbolic link '{entry.relative_to(root)}' (to '{target}'); "
                    "training writes into its run folder and never through a link: replace the link by a copy "
                    "of what it points to (cp -L), or train into another folder"
                )
        if seen > MAX_ENTRIES:
            raise ConfigError(
                f"run folder '{root}' holds more than {MAX_ENTRIES} entries; train into a folder of its own"
            )
