"""The deploy settings of the profile schema: ``batch_invariant`` (registered with :func:`register_setting`).

``batch_invariant: true`` in the ``deploy`` or ``val`` phase makes an image's detections independent of
what else is in its batch and of the batch size: each image is letterboxed on its own (square, to the run's
``imgsz``) and the network runs one image at a time. The extension that applies it is
:class:`yolo_det.session.batch_invariance.BatchInvariance`.
"""

from __future__ import annotations

from typing import Any

from .profiles import Setting, register_setting

__all__ = ["BATCH_INVARIANT", "DEPLOY_SETTINGS", "register_deploy_settings"]


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"must be true or false, got {value!r}")
    return value


#: ``batch_invariant``: per-image letterbox and per-image forward in prediction and validation.
BATCH_INVARIANT = Setting(
    "batch_invariant",
    default=False,
    check=_check_bool,
    doc="an image's detections do not depend on its batch: per-image letterbox and per-image forward",
)

#: Every deploy setting, registered when :mod:`yolo_det.core.profiles` is imported.
DEPLOY_SETTINGS = (BATCH_INVARIANT,)


def register_deploy_settings() -> None:
    """Register the deploy settings (idempotent)."""
    for setting in DEPLOY_SETTINGS:
        register_setting(setting)
