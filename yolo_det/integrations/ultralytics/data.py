"""What an Ultralytics run's training data depended on: the record's ``data_stream`` section.

The plugin hands the training loader to the session (``data_invariance`` makes it worker-invariant there,
:mod:`yolo_det.fixes.data_invariance`), tells an invariant loader each epoch as it starts, and puts a
:class:`~yolo_det.fixes.data_invariance.BatchTap` in front of the trainer's ``preprocess_batch`` for the
fingerprint of the first batches. :func:`data_stream_section` turns that into the record's section, which
:mod:`yolo_det.tools.data_stream` explains for ``diff``.
"""

from __future__ import annotations

from typing import Any

from ...fixes import data_invariance as _data

__all__ = ["AUGMENT_ARGS", "FINGERPRINT_BATCHES", "data_stream_section", "start_epoch", "tap", "untap"]

#: Ultralytics arguments that decide what a training sample's augmentation draws.
AUGMENT_ARGS = (
    "imgsz",
    "mosaic",
    "mixup",
    "cutmix",
    "copy_paste",
    "copy_paste_mode",
    "degrees",
    "translate",
    "scale",
    "shear",
    "perspective",
    "flipud",
    "fliplr",
    "hsv_h",
    "hsv_s",
    "hsv_v",
    "bgr",
    "close_mosaic",
    "cache",
    "rect",
    "fraction",
    "multi_scale",
    "auto_augment",
    "erasing",
)
#: Batches the fingerprint covers.
FINGERPRINT_BATCHES = 2
_TAP_ATTR = "preprocess_batch"


def start_epoch(trainer: Any) -> int:
    """The epoch a run (a resumed one included) starts training at."""
    return int(getattr(trainer, "start_epoch", 0) or 0)


def tap(trainer: Any) -> _data.BatchTap | None:
    """Put a tap in front of ``trainer.preprocess_batch`` (once); return it (None when there is nothing to tap)."""
    current = getattr(trainer, _TAP_ATTR, None)
    existing = getattr(current, "_yolo_det_tap", None)
    if isinstance(existing, _data.BatchTap):
        return existing
    if not callable(current):
        return None
    batch_tap = _data.BatchTap(FINGERPRINT_BATCHES)
    setattr(trainer, _TAP_ATTR, batch_tap.wrap(current))
    return batch_tap


def untap(trainer: Any) -> None:
    """Take the tap away (the trainer's own ``preprocess_batch`` again)."""
    current = vars(trainer).get(_TAP_ATTR) if hasattr(trainer, "__dict__") else None
    if getattr(current, "_yolo_det_tap", None) is not None:
        del trainer.__dict__[_TAP_ATTR]


def _dataset_digest(value: Any) -> str | None:
    """The dataset fingerprint's own digest (images, labels, lists, names), None without one."""
    digest = value.get("sha256") if isinstance(value, dict) and "error" not in value else None
    return digest if isinstance(digest, str) else None


def data_stream_section(trainer: Any, seed: int, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record's ``data_stream``: what the batches the run trained on depended on.

    Keys: ``mode`` (``keyed`` or ``worker-stream``), ``workers`` (the loader's worker count after
    Ultralytics' rules), ``seed``, ``dataset`` (the data fingerprint's sha256, None without one),
    ``augment`` (the augmentation arguments), ``fingerprint`` (sha256 of the first batches' inputs, None
    before any), ``fingerprint_batches`` and ``fingerprint_epoch``.
    """
    loader = getattr(trainer, "train_loader", None)
    args = getattr(trainer, "args", None)
    batch_tap = getattr(getattr(trainer, _TAP_ATTR, None), "_yolo_det_tap", None)
    return {
        "mode": _data.data_mode(loader) if loader is not None else None,
        "workers": int(getattr(loader, "num_workers", 0)) if loader is not None else None,
        "seed": int(seed),
        "dataset": _dataset_digest((identity or {}).get("data")),
        "augment": {k: getattr(args, k, None) for k in AUGMENT_ARGS if hasattr(args, k)},
        "fingerprint": batch_tap.digest if isinstance(batch_tap, _data.BatchTap) else None,
        "fingerprint_batches": batch_tap.seen if isinstance(batch_tap, _data.BatchTap) else 0,
        "fingerprint_epoch": start_epoch(trainer),
    }
