"""Deprecated: the YOLOv5 patcher is :mod:`yolo_det.integrations.yolov5.patch` (with :mod:`.yolov5.edits` and
:mod:`.yolov5.writer`); this module hands their public names on under the old path."""

from __future__ import annotations

import warnings

from .yolov5.edits import BACKUP_SUFFIX, FILES, MARKER, Edit, NotRecognised, patch_text, revert_text, unified_diff
from .yolov5.patch import FilePlan, PatchPlan, find_tree, plan
from .yolov5.writer import DEFERRED_SIGNALS, JOURNAL, apply_plan, pending_journal, repair

__all__ = [
    "BACKUP_SUFFIX",
    "DEFERRED_SIGNALS",
    "FILES",
    "JOURNAL",
    "MARKER",
    "Edit",
    "FilePlan",
    "NotRecognised",
    "PatchPlan",
    "apply_plan",
    "find_tree",
    "patch_text",
    "pending_journal",
    "plan",
    "repair",
    "revert_text",
    "unified_diff",
]

warnings.warn(
    "yolo_det.integrations.patch_yolov5 is deprecated; import yolo_det.integrations.yolov5.patch "
    "(plan, the edit table) and yolo_det.integrations.yolov5.writer (apply_plan, repair) instead",
    DeprecationWarning,
    stacklevel=2,
)
