"""What the tests share, in one place: the repository's root and its example model YAMLs."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the folder holding pyproject.toml).
ROOT = Path(__file__).resolve().parent.parent
#: The example model YAMLs of data/models.
MODELS = ROOT / "data" / "models"
#: The bundled demo dataset.
DEMO = ROOT / "data" / "demo"
