"""The op table's vocabulary: passes, node kinds, effects, the keys of a table file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, get_args

__all__ = ["BEHAVIOUR", "EFFECTS"]

Effect = Literal["alert", "warn_only", "silent", "review"]
When = Literal["always", "native_path", "never"]
Pass = Literal["forward", "backward"]
NodeKind = Literal["extension", "python_function"]

EFFECTS: tuple[str, ...] = get_args(Effect)
_WHENS: tuple[str, ...] = get_args(When)
_PASSES: tuple[str, ...] = get_args(Pass)
_NODE_KINDS: tuple[str, ...] = get_args(NodeKind)

_NONDET, _WARNS, _CUSTOM = (
    "non-deterministic, no message",
    "warns; non-deterministic",
    "custom backward (its torch ops were checked)",
)
#: What happens, per effect, under each deterministic mode (``strict``, ``warn`` = warn_only, ``off``).
BEHAVIOUR: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        effect: MappingProxyType(dict(zip(("strict", "warn", "off"), modes)))
        for effect, modes in {
            "alert": ("raises RuntimeError", _WARNS, _NONDET),
            "warn_only": ("deterministic algorithm", _WARNS, _NONDET),
            "silent": (_NONDET, _NONDET, _NONDET),
            "review": (_CUSTOM, _CUSTOM, _CUSTOM),
        }.items()
    }
)

_ENTRY_KEYS = (
    "id",
    "kernel",
    "pass",
    "effect",
    "ops",
    "forward_ops",
    "nodes",
    "functions",
    "node_kinds",
    "args",
    "cpu_alerts",
    "triggered_by",
    "condition",
    "versions",
    "fix",
)
_REQUIRED = ("id", "kernel", "pass", "effect", "versions", "fix")
_TOP_KEYS = ("schema", "checked_against", "messages", "entries")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_DEFAULT = "nondeterministic_ops.yaml"
