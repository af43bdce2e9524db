"""What a resumed Ultralytics run knows of the parts before it, beyond what every framework's run knows.

The arguments the resume changed that change the trained weights (:func:`changed_overrides`, reasons not to
expect the bitwise result). The earlier part's record and the ``segments`` built from it are shared with the
YOLOv5 integration: :mod:`yolo_det.core.resume.lineage`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.compat import mosaic_on
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
    """One line when the resumed run trains its first epoch with mosaic on or off where the uninterrupted run would not.

    Read at the resumed run's first batch, from what Ultralytics really did: the state holds whether the epoch
    before the resumed one trained with mosaic (:func:`~yolo_det.core.compat.mosaic_on`, read at its checkpoint),
    and the dataset's transforms now say whether this one does. An uninterrupted run closes mosaic once, at the
    first epoch ``e >= epochs - close_mosaic`` while it is on, so an epoch trained with mosaic is followed by one
    without only at ``epochs - close_mosaic``. Ultralytics 8.3 closes mosaic at resume when ``close_mosaic``
    reaches back before the resumed epoch (``close_mosaic`` 10 by default, over ``epochs``), where its
    uninterrupted run never closes it (it closes at ``epoch == epochs - close_mosaic`` only).
    """
    saved = (state.get("data") or {}).get("mosaic")
    now = mosaic_on(trainer.train_loader.dataset)
    if not isinstance(saved, bool) or not isinstance(now, bool):
        return None
    start, epochs, close = int(trainer.start_epoch), int(trainer.epochs), int(trainer.args.close_mosaic or 0)
    expected = saved and not (close and start == epochs - close)
    if now == expected:
        return None
    return (
        f"Ultralytics resumed epoch {start + 1} with mosaic {'on' if now else 'off'} where the uninterrupted run "
        f"has it {'on' if expected else 'off'} (close_mosaic={close}, epochs={epochs}): the run continues, but not "
        "bit for bit as the uninterrupted run would have"
    )
