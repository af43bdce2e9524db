"""Bounded YAML: see :mod:`yolo_det.core.untrusted.safe_yaml` (this name stays for existing imports)."""

from .untrusted.safe_yaml import (
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_NODES,
    BoundedLoader,
    YamlLimitError,
    compose,
    expanded_size,
    flow_depth_check,
    load,
    prescan,
    short,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_NODES",
    "BoundedLoader",
    "YamlLimitError",
    "compose",
    "expanded_size",
    "flow_depth_check",
    "load",
    "prescan",
    "short",
]
