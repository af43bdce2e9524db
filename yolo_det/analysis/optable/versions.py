"""Torch version strings and version ranges (>=2.1,<2.4)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ...core.errors import ConfigError
from .schema import _CLAUSE

__all__ = ["parse_version", "torch_version", "version_in"]


def parse_version(version: str | Iterable[int]) -> tuple[int, int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14, 1)``. Local and pre-release suffixes are ignored.

    Raises:
        ConfigError: The string does not start with a version number.
    """
    if not isinstance(version, str):
        parts = [int(p) for p in version]
    else:
        m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
        if m is None:
            raise ConfigError(f"'{version}' is not a torch version; give it like 2.1 or 2.14.1")
        parts = [int(p) for p in m.group(1).split(".")]
    parts = (parts + [0, 0, 0])[:3]
    return parts[0], parts[1], parts[2]


def torch_version() -> str:
    """The running torch's version string."""
    import torch

    return str(torch.__version__)


def version_in(spec: str, version: str | tuple[int, int, int]) -> bool:
    """Whether ``version`` satisfies ``spec``, a comma-separated list like ``">=2.1,<2.14"`` (empty: any).

    Raises:
        ConfigError: A clause of ``spec`` is not ``<op><version>``.
    """
    v = parse_version(version) if isinstance(version, str) else version
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ConfigError(
                f"bad version clause '{clause}' in '{spec}'; use >=, <=, ==, !=, > or < and a version, e.g. >=2.1,<2.14"
            )
        op, bound = m.group(1), parse_version(m.group(2))
        ok = {">=": v >= bound, "<=": v <= bound, "==": v == bound, "!=": v != bound, ">": v > bound, "<": v < bound}[
            op
        ]
        if not ok:
            return False
    return True
