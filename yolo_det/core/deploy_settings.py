"""The deploy settings of the profile schema: ``batch_invariant`` (registered with
:func:`~yolo_det.core.profiles.register_setting` when :mod:`yolo_det.core.profiles` is imported).

``batch_invariant: true`` in the ``deploy`` or ``val`` phase makes an image's detections independent of
what else is in its batch and of the batch size: each image is letterboxed on its own (square, to the run's
``imgsz``) and the network runs one image at a time. The extension that applies it is
:class:`yolo_det.integrations.ultralytics.batch_invariance.BatchInvariance`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEPLOY_SETTINGS"]


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"must be true or false, got {value!r}")
    return value


#: The deploy settings as ``(name, default, check, doc)``, for :class:`~yolo_det.core.profiles.Setting`.
DEPLOY_SETTINGS: tuple[tuple[str, Any, Any, str], ...] = (
    (
        "batch_invariant",
        False,
        _check_bool,
        "an image's detections do not depend on its batch: per-image letterbox and per-image forward",
    ),
)
