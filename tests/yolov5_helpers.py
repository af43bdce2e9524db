"""The installed ``yolov5`` package, for tests that copy it (the project never ships YOLOv5's code)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest


def installed_yolov5() -> Path:
    """The folder of the installed ``yolov5`` package; skip (or fail, under ``make test``) without it."""
    spec = importlib.util.find_spec("yolov5")
    if spec is None or not spec.submodule_search_locations:
        message = "the yolov5 package is not installed (make test installs it)"
        if os.environ.get("YOLO_DET_REQUIRE_YOLOV5"):
            pytest.fail(message)
        pytest.skip(message)
    return Path(next(iter(spec.submodule_search_locations)))


def copy_yolov5(dst: Path, *, runnable: bool = False) -> Path:
    """Copy the installed package to ``dst``; ``runnable`` also mends what stops 7.0.14 on NumPy >= 2.4."""
    shutil.copytree(installed_yolov5(), dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if runnable and not hasattr(np, "trapz"):  # 7.0.14 integrates PR curves with np.trapz, gone in NumPy 2.4
        metrics = dst / "utils" / "metrics.py"
        metrics.write_text(metrics.read_text(encoding="utf-8").replace("np.trapz(", "np.trapezoid("), encoding="utf-8")
    return dst
