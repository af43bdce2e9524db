"""What a resumed Ultralytics run knows of the parts before it.

The earlier part's ``determinism.json`` (:func:`previous_record`, read before this part's record replaces it),
the record's ``segments`` built from it (:func:`segments_of`), and the arguments the resume changed that change
the trained weights (:func:`changed_overrides`, reasons not to expect the bitwise result). The YOLOv5 integration
and ``yolo-det train`` read the earlier record the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...core.record import RECORD_NAME
from ...core.resume import read_checkpoint

__all__ = ["RESULT_OVERRIDES", "changed_overrides", "previous_record", "segments_of"]


def previous_record(checkpoint: str | Path) -> dict[str, Any] | None:
    """The ``determinism.json`` of the run that wrote ``checkpoint`` (``<run>/weights/last.pt``), if any."""
    path = Path(checkpoint).resolve().parent.parent / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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


def segments_of(previous: dict[str, Any] | None, resumed_at: int | None = None) -> list[dict[str, Any]]:
    """The ``segments`` of a run resumed from a run whose record is ``previous``: its own segments, then the
    previous part itself (a part whose record still said ``running`` was killed: it says ``killed``, and its
    ``epochs_completed`` is that of the checkpoint resumed, ``resumed_at``, if the kill came between the
    checkpoint and the record's update)."""
    if previous is None:
        return []
    earlier = previous.get("segments")
    part = {k: v for k, v in previous.items() if k != "segments"}
    if part.get("status") == "running":
        part["status"] = "killed"
        part["ending"] = (
            "no ending recorded: the process stopped after its last checkpoint without updating its record "
            "(killed: SIGKILL, power loss; or its record could not be written: a full disk)"
        )
        done = part.get("epochs_completed")
        if isinstance(resumed_at, int) and (not isinstance(done, int) or done < resumed_at):
            part["epochs_completed"] = resumed_at
    return [*(earlier if isinstance(earlier, list) else []), part]
