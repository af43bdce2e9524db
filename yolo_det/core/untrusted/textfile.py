"""Small text files from others (profiles, records) read within a size limit, so a huge one is refused at once."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_TEXT_BYTES", "TextTooLarge", "read_text"]

#: Largest profile or record read (a real one is a few kB; a 20 MB one-line file is not one).
MAX_TEXT_BYTES = 4 * 2**20


class TextTooLarge(ValueError):
    """A text file is bigger than the limit for its kind."""


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_TEXT_BYTES, what: str = "file") -> str:
    """The UTF-8 text of ``path``, read only when it holds at most ``limit`` bytes.

    Raises:
        TextTooLarge: The file is bigger (one line naming it and the limit).
        OSError, UnicodeDecodeError: As ``Path.read_text``.
    """
    with open(Path(path), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TextTooLarge(f"{what} '{path}' is bigger than {limit} bytes, more than any {what} yolo-det writes")
    return data.decode("utf-8")
