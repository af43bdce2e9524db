"""The one Ultralytics log silencer: its logger quieter, and its lines off stdout, for a block.

Used where yolo-det builds or trains models for its own purposes (the model loader, ``verify``,
``bench``), so that a ``--json`` report owns stdout and Ultralytics' progress lines do not drown the
result. The logger's level, its handlers' streams and ``sys.stdout`` are put back afterwards, on error too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet_ultralytics"]


@contextlib.contextmanager
def quiet_ultralytics(
    verbose: bool = False, *, level: int = logging.WARNING, drop_stdout: bool = False
) -> Iterator[None]:
    """Route Ultralytics' logging to stderr for the block; below ``level`` it is dropped unless ``verbose``.

    Args:
        verbose: Keep every log line (still on stderr).
        level: The logger's level for the block when not ``verbose`` (WARNING also hides the progress bars).
        drop_stdout: Also swallow what the block prints to ``sys.stdout`` (model summaries while building).
    """
    from .compat import LOGGER

    saved_level = LOGGER.level
    swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
    try:
        with contextlib.ExitStack() as stack:
            for handler in LOGGER.handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                    swapped.append((handler, handler.setStream(sys.stderr)))
            if not verbose:
                LOGGER.setLevel(level)
            if drop_stdout:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            yield
    finally:
        LOGGER.setLevel(saved_level)
        for handler, stream in swapped:
            handler.setStream(stream)
