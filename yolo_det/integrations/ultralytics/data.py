"""What an Ultralytics run's training data depended on: the record's ``data_stream`` section.

The trainer seam builds the training loader worker-invariant under ``data_invariance``
(:mod:`yolo_det.fixes.data_invariance`, in ``get_dataloader``), the plugin tells a keyed loader each epoch as it
starts, and puts a
:class:`~yolo_det.fixes.data_invariance.BatchTap` among the trainer seam's batch observers for the
fingerprint of the first batches. :func:`data_stream_section` turns that into the record's section, which
:mod:`yolo_det.tools.data_stream` explains for ``diff``.
"""

from __future__ import annotations

from typing import Any

from ...core.compat import contact
from ...fixes import data_invariance as _data
from ..trainer_state import state_of
from .seam import BatchObserver, observe

__all__ = ["AUGMENT_ARGS", "FINGERPRINT_BATCHES", "data_stream_section", "start_epoch", "tap"]

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


def start_epoch(trainer: Any) -> int:
    """The epoch a run (a resumed one included) starts training at."""
    return int(contact(trainer, "start_epoch", "the data stream of a resumed run"))


class _Tap(BatchObserver):
    """The seam's observer feeding a :class:`~yolo_det.fixes.data_invariance.BatchTap` each batch as loaded."""

    def __init__(self, batch_tap: _data.BatchTap) -> None:
        self.tap = batch_tap

    def before_batch(self, trainer: Any, batch: Any) -> None:
        self.tap.feed(batch)


def tap(trainer: Any) -> _data.BatchTap:
    """Put a tap among ``trainer``'s batch observers (once); return it.

    Raises:
        ConfigError: ``trainer`` has no trainer seam (one line with the fix).
    """
    state = state_of(trainer)
    if isinstance(state.tap, _Tap):
        return state.tap.tap
    observer = _Tap(_data.BatchTap(FINGERPRINT_BATCHES))
    observe(trainer, observer, "the record's data fingerprint")
    state.tap = observer
    return observer.tap


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
    observer = state_of(trainer).tap
    batch_tap = observer.tap if isinstance(observer, _Tap) else None
    return {
        "mode": _data.data_mode(loader) if loader is not None else None,
        "workers": int(getattr(loader, "num_workers", 0)) if loader is not None else None,
        "seed": int(seed),
        "dataset": _dataset_digest((identity or {}).get("data")),
        "augment": {k: getattr(trainer.args, k) for k in AUGMENT_ARGS if hasattr(trainer.args, k)},
        "fingerprint": batch_tap.digest if isinstance(batch_tap, _data.BatchTap) else None,
        "fingerprint_batches": batch_tap.seen if isinstance(batch_tap, _data.BatchTap) else 0,
        "fingerprint_epoch": start_epoch(trainer),
    }
