"""What the tests share, in one place: the repository's root, its example model YAMLs, a subprocess's environment."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The repository root (the folder holding pyproject.toml).
ROOT = Path(__file__).resolve().parent.parent
#: The example model YAMLs of data/models.
MODELS = ROOT / "data" / "models"
#: The bundled demo dataset.
DEMO = ROOT / "data" / "demo"


def subprocess_env(extra: Mapping[str, str] | None = None, *, path: Sequence[str | Path] = ()) -> dict[str, str]:
    """The environment for a ``python`` subprocess of a test: this one's, with the repository (and ``path``)
    first on ``PYTHONPATH``, Ultralytics offline, and no yolo-det debugging or testing hooks, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["YOLO_OFFLINE"] = "1"
    for name in ("YOLO_DET_DEBUG", "YOLO_DET_TEST_SIGNAL_AT"):
        env.pop(name, None)
    env.update(extra or {})
    return env
