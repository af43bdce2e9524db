"""A local font, so no run downloads one.

Ultralytics (when plotting labels) and YOLOv5 (in ``check_dataset``) download ``Arial.ttf`` into their
settings folder unless a file of that name is already there. :func:`ensure_local_font` puts the
DejaVu Sans font that matplotlib ships under that name, so no run needs to download a font.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..core.fileio import atomic_write_bytes

__all__ = ["ensure_local_font"]


def _font_source() -> Path | None:
    try:
        import matplotlib
    except ImportError:  # pragma: no cover - matplotlib is an Ultralytics dependency
        return None
    path = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    return path if path.is_file() else None


def ensure_local_font(folders: Iterable[str | os.PathLike[str]] | None = None, name: str = "Arial.ttf") -> list[Path]:
    """Make sure ``name`` exists in each folder where Ultralytics or YOLOv5 would download it.

    A font already there is left alone. By default the folders are Ultralytics' settings folder and
    YOLOv5's (both honour their ``*_CONFIG_DIR`` variables).

    Returns:
        The font paths that exist afterwards.
    """
    if folders is None:
        folders = _font_folders()
    source = _font_source()
    found = []
    for folder in folders:
        target = Path(folder) / name
        if not target.exists() and source is not None:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(target, source.read_bytes())
            except OSError:
                continue
        if target.exists():
            found.append(target)
    return found


def _font_folders() -> list[Path]:
    folders = []
    try:
        from ..core.compat import USER_CONFIG_DIR

        folders.append(Path(USER_CONFIG_DIR))
    except ImportError:  # pragma: no cover - ultralytics is a dependency
        pass
    yolov5_dir = os.environ.get("YOLOV5_CONFIG_DIR")
    if yolov5_dir:
        folders.append(Path(yolov5_dir))
    else:
        base = Path.home() / ".config"
        folders.append((base if base.is_dir() else Path(tempfile.gettempdir())) / "Ultralytics")
    return list(dict.fromkeys(folders))
