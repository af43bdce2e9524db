"""Helpers shared by ``verify`` and ``bench``: throwaway run folders, PNG output.

(Quiet Ultralytics runs: :func:`yolo_det.core.quiet.quiet_ultralytics`.)

- :func:`run_folder` gives the ``project=`` folder of the runs: the user's when given, else a temporary
  folder removed afterwards, so a verification or a benchmark leaves nothing behind.
- :func:`save_figure` renders a matplotlib figure to PNG with the Agg canvas (no pyplot, no global
  backend switch) and writes it atomically.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core.fileio import atomic_write_bytes
from ..core.modules import unwrap_model

__all__ = ["new_figure", "run_folder", "save_figure", "unwrap_model"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@contextmanager
def run_folder(project: Any) -> Iterator[str]:
    """Yield the ``project=`` folder for the runs: ``project`` itself, or a temporary folder removed afterwards."""
    if project is not None:
        yield str(project)
        return
    with tempfile.TemporaryDirectory(prefix="yolo-det-") as tmp:
        yield tmp


def new_figure(width: float = 8.0, height: float = 4.5) -> Any:
    """A matplotlib ``Figure`` with an Agg canvas (no pyplot state, no backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Render ``fig`` as PNG and write it to ``path`` atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    if not data.startswith(PNG_SIGNATURE):  # pragma: no cover - matplotlib always writes PNG here
        raise RuntimeError("matplotlib did not produce a PNG")
    return atomic_write_bytes(path, data)
