"""Find and build models: Ultralytics model YAMLs by name or path.

Ultralytics resolves ``yolov8n.yaml`` to the shared ``yolov8.yaml`` with scale ``n``; this module
follows the same rule without building anything, so commands can reject a bad name before work starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["EXAMPLES", "example_names", "is_example", "model_names", "model_task", "resolve_model_yaml"]

#: The example model YAMLs shipped in the package (``cbam-max.yaml``, ...): nameable from any folder.
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "models"


@contextmanager
def model_names(modules: Iterable[Any] | None = None) -> Iterator[dict[str, Any]]:
    """Make the user's ``modules``, yolo-det's layer names and the example blocks of :mod:`yolo_det.analysis.zoo`
    resolvable in model YAMLs for the block, never replacing a name the process already binds (see
    :func:`yolo_det.analysis.names.custom_modules`)."""
    from ..core.untrusted.allow import allowed_user_modules
    from .names import custom_modules

    given = [m for m in (modules or []) if isinstance(m, str) and not m.endswith(".py")]
    with custom_modules(list(modules or [])) as added:
        with allowed_user_modules({*given, *(getattr(c, "__module__", "") for c in added.values())}):
            yield added


def resolve_model_yaml(model: str | Path) -> Path | None:
    """Return the YAML file Ultralytics would load for ``model``, or None when there is none.

    A bare name that is neither a file nor an Ultralytics name may be one of yolo-det's examples
    (``cbam-max.yaml``: :data:`EXAMPLES`), in a source checkout and in an installed wheel alike.

    Args:
        model: A path (``models/my.yaml``), an Ultralytics name (``yolov8n.yaml``, ``rtdetr-l.yaml``) or an
            example name.
    """
    path = Path(model).expanduser()
    if path.stem in {f"yolov{d}{x}6" for x in "nsmlx" for d in (5, 8)}:
        # Ultralytics builds yolov8n6.yaml from yolov8n-p6.yaml (yaml_model_load's rename), in the same folder
        path = path.with_name(re.sub(r"(\d+)([nslmx])6(.+)?$", r"\1\2-p6\3", path.stem) + path.suffix)
    unified = path.with_name(re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", path.stem) + path.suffix)
    for local in (unified, path):  # the order in which Ultralytics looks
        if local.is_file():
            return local.resolve()
    if path.parent.parts:  # a path with folders that does not exist
        return None
    from ..core.compat import check_yaml

    for candidate in (unified.name, path.name):
        try:
            found = check_yaml(candidate, hard=False)
        except Exception:  # check_yaml raises on ambiguous matches
            found = None
        if found:
            return Path(found).resolve()
    example = EXAMPLES / path.name
    if path.suffix in {".yaml", ".yml"} and example.is_file():
        return example.resolve()
    return None


def example_names() -> list[str]:
    """The file names of the example model YAMLs (``attention-mix.yaml``, ``cbam-max.yaml``, ...)."""
    return sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def is_example(path: str | Path) -> bool:
    """Whether ``path`` is one of the example model YAMLs."""
    try:
        return Path(path).resolve().parent == EXAMPLES.resolve()
    except OSError:
        return False


def model_task(model: str, task: Any = None) -> str | None:
    """The Ultralytics task of ``model`` (``detect``, ``segment``, ``pose``, ``obb``, ``classify``), or None when
    it cannot be told without loading a checkpoint. An explicit ``task=`` wins."""
    if isinstance(task, str) and task:
        return task
    if Path(model).suffix not in {".yaml", ".yml"}:
        return None
    path = resolve_model_yaml(model)
    if path is None:
        return None
    try:
        import yaml

        from ..core.compat import guess_model_task

        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        return str(guess_model_task(cfg)) if isinstance(cfg, dict) else None
    except Exception:
        return None
