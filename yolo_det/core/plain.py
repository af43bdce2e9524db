"""Plain JSON values: the one converter for what a record or a resume state stores.

Arguments come as namespaces, paths, tuples and objects of other projects; the record holds only JSON
values. :func:`plain_value` turns a value into ``None``, ``bool``, ``int``, ``float``, ``str``, lists and
string-keyed dicts, recursively; anything else becomes text (``repr`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["plain_value"]


def plain_value(value: Any, other: Callable[[Any], Any] = repr) -> Any:
    """``value`` as plain JSON data: paths as text, mappings and sequences recursively.

    Args:
        value: Any value.
        other: What becomes of anything else (``repr`` by default; its result is used as is).
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v, other) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v, other) for v in value]
    return other(value)
