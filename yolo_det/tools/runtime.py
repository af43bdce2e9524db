"""Helpers shared by ``verify`` and ``bench``: quiet Ultralytics runs, throwaway run folders, PNG output.

- :func:`quiet_ultralytics` sends Ultralytics' log lines to stderr (so ``--json`` owns stdout) and, unless
  asked to be verbose, raises its logger to WARNING, which also hides its progress bars. Both are put
  back afterwards, on error too.
- :func:`run_folder` gives the ``project=`` folder of the runs: the user's when given, else a temporary
  folder removed afterwards, so a verification or a benchmark leaves nothing behind.
- :func:`save_figure` renders a matplotlib figure to PNG with the Agg canvas (no pyplot, no global
  backend switch) and writes it atomically.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..core.fileio import atomic_write_bytes

__all__ = ["new_figure", "quiet_ultralytics", "run_folder", "save_figure", "unwrap_model"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@contextmanager
def quiet_ultralytics(verbose: bool = False) -> Iterator[None]:
    """Route Ultralytics' logging to stderr for the block; below WARNING it is dropped unless ``verbose``."""
    from ultralytics.utils import LOGGER

    saved_level = LOGGER.level
    swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
    try:
        for handler in LOGGER.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) is sys.stdout:
                swapped.append((handler, handler.setStream(sys.stderr)))
        if not verbose:
            LOGGER.setLevel(logging.WARNING)
        yield
    finally:
        LOGGER.setLevel(saved_level)
        for handler, stream in swapped:
            handler.setStream(stream)


@contextmanager
def run_folder(project: Any) -> Iterator[str]:
    """Yield the ``project=`` folder for the runs: ``project`` itself, or a temporary folder removed afterwards."""
    if project is not None:
        yield str(project)
        return
    with tempfile.TemporaryDirectory(prefix="yolo-det-") as tmp:
        yield tmp


def unwrap_model(model: Any) -> Any:
    """The module inside DDP/DataParallel/``torch.compile`` wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or inner is model:
            return model
        model = inner


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
