"""Find and build models: Ultralytics model YAMLs by name or path.

Ultralytics resolves ``yolov8n.yaml`` to the shared ``yolov8.yaml`` with scale ``n``; this module
follows the same rule without building anything, so commands can reject a bad name before work starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["model_names", "resolve_model_yaml"]


@contextmanager
def model_names() -> Iterator[None]:
    """Make yolo-det's layer names and the example blocks of :mod:`yolo_det.analysis.zoo` resolvable in model YAMLs
    for the block (the commands build models from ``data/models/*.yaml`` and rewritten YAMLs this way)."""
    from ..layers.registry import registered, registered_layers
    from .zoo import ZOO_MODULES

    with registered_layers(), registered(ZOO_MODULES):
        yield


def resolve_model_yaml(model: str | Path) -> Path | None:
    """Return the YAML file Ultralytics would load for ``model``, or None when there is none.

    Args:
        model: A path (``models/my.yaml``) or an Ultralytics name (``yolov8n.yaml``, ``rtdetr-l.yaml``).
    """
    path = Path(model).expanduser()
    if path.is_file():
        return path.resolve()
    if path.parent.parts:  # a path with folders that does not exist
        return None
    from ultralytics.utils.checks import check_yaml

    unified = re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", path.stem) + path.suffix
    for candidate in (path.name, unified):
        try:
            found = check_yaml(candidate, hard=False)
        except Exception:  # noqa: BLE001 - check_yaml raises on ambiguous matches
            found = None
        if found:
            return Path(found).resolve()
    return None
