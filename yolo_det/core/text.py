"""Text from files shown on a terminal: control characters escaped, so a value can never act on the terminal.

A record, a saved verify file, a model YAML or a YOLOv5 script is someone else's text. Printed as it is, an
ESC sequence in it can erase or rewrite lines already shown, a carriage return can overwrite the line it is
on, and a bidirectional override can reorder what is read. :func:`printable` writes every such character as
a visible escape (``\\x1b``, ``\\r``, ``\\u202e``); everything else, non-ASCII letters included, is kept.

:func:`short` is a bounded ``repr`` for error messages: a value from a file is never shown whole.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

__all__ = ["printable", "short"]

# C0 controls but tab and newline, DEL, C1 controls, and the Unicode direction marks, embeddings, overrides and
# isolates (what reorders text on screen)
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_WITH_NEWLINES = re.compile(f"[{_UNSAFE}]")
_WITHOUT_NEWLINES = re.compile(f"[{_UNSAFE}\n\t]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if c in named:
        return named[c]
    return f"\\x{ord(c):02x}" if ord(c) <= 0xFF else f"\\u{ord(c):04x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with control and direction-changing characters written as visible escapes.

    Args:
        text: What is about to be shown.
        newlines: Keep newlines and tabs (text made of lines); False escapes them too (a single value, which
            must not start a line of its own).
    """
    return (_WITH_NEWLINES if newlines else _WITHOUT_NEWLINES).sub(_escape, str(text))


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxdict = 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def short(value: Any) -> str:
    """``repr(value)`` cut to a readable length (at most about 200 characters, however big the value)."""
    return _REPR.repr(value)[:200]
