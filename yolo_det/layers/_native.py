"""PyTorch's own functional ops, as torch defines them, for the layers' pass-through and probe calls.

:mod:`yolo_det.fixes.intercept` replaces some ``torch.nn.functional`` attributes while a phase asks for
interception; the layers call the originals through this module so a pass-through never loops back
into the interception. A function already replaced when this module is imported is unwrapped.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F

__all__ = ["NAMES", "original"]

#: The ``torch.nn.functional`` functions :mod:`yolo_det.fixes.intercept` may replace.
NAMES = (
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "interpolate",
    "upsample",
    "grid_sample",
    "pad",
    "cross_entropy",
    "nll_loss",
)


def _unwrap(fn: Any) -> Any:
    while getattr(fn, "_yolo_det_router", False):
        fn = fn.__wrapped__
    return fn


_ORIGINALS = {name: _unwrap(getattr(F, name)) for name in NAMES}


def original(name: str) -> Any:
    """The original ``torch.nn.functional.<name>``."""
    return _ORIGINALS[name]


interpolate = _ORIGINALS["interpolate"]
grid_sample = _ORIGINALS["grid_sample"]
pad = _ORIGINALS["pad"]
cross_entropy = _ORIGINALS["cross_entropy"]
nll_loss = _ORIGINALS["nll_loss"]
