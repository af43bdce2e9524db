"""What a resumed Ultralytics run knows of the parts before it, beyond what every framework's run knows.

The arguments the resume changed that change the trained weights (:func:`changed_overrides`, reasons not to
expect the bitwise result). The earlier part's record and the ``segments`` built from it are shared with the
YOLOv5 integration: :mod:`yolo_det.core.resume.lineage`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.resume import read_checkpoint

__all__ = ["RESULT_OVERRIDES", "changed_overrides", "mosaic_changed"]


#: Arguments Ultralytics lets a resumed run change that change the trained weights (``check_resume``'s allowed
#: list less those that only name or decorate outputs).
RESULT_OVERRIDES = (
    "imgsz",
    "batch",
    "device",
    "close_mosaic",
    "augmentations",
    "workers",
    "cache",
    "patience",
    "time",
    "freeze",
    "channels_last",
    "distill_model",
)


def changed_overrides(ckpt: Path, trainer: Any) -> dict[str, list[Any]]:
    """``{name: [checkpoint value, value now]}`` for each :data:`RESULT_OVERRIDES` argument the resume changed."""
    try:
        stored = read_checkpoint(ckpt).train_args
    except Exception:
        return {}
    args = getattr(trainer, "args", None)
    out = {}
    for key in RESULT_OVERRIDES:
        if key in stored and hasattr(args, key):
            was, now = stored[key], getattr(args, key)
            if str(was) != str(now):
                out[key] = [was, now if isinstance(now, (str, int, float, bool, type(None))) else str(now)]
    return out


def mosaic_changed(trainer: Any, state: dict[str, Any]) -> str | None:
    """One line when Ultralytics' setup of the resumed run switched mosaic off or on against the saved state.

    Ultralytics 8.3 closes mosaic at resume when ``close_mosaic`` reaches back before the resumed epoch, while
    its uninterrupted run closes it only at the epoch ``epochs - close_mosaic`` (never when that is below 0).
    """
    saved = (state.get("data") or {}).get("mosaic")
    now = getattr(getattr(getattr(trainer, "train_loader", None), "dataset", None), "mosaic", None)
    if not isinstance(saved, bool) or not isinstance(now, bool) or saved == now:
        return None
    return (
        f"Ultralytics resumed with mosaic {'on' if now else 'off'} where the uninterrupted run had it "
        f"{'on' if saved else 'off'} (close_mosaic={getattr(trainer.args, 'close_mosaic', '?')}, "
        f"epochs={getattr(trainer, 'epochs', '?')}): the run continues, but not bit for bit as the uninterrupted "
        "run would have"
    )
