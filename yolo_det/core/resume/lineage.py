"""What a resumed run knows of the parts before it, whatever framework trained them.

The earlier part's ``determinism.json`` (:func:`previous_record`, read before this part's record replaces it),
the record's ``segments`` built from it (:func:`segments_of`), and the line a resume without a usable resume
state prints (:func:`warn_no_state`). The Ultralytics and YOLOv5 integrations and ``yolo-det train`` share them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..record_schema import RECORD_NAME

__all__ = ["NO_STATE_WARNING", "previous_record", "segments_of", "warn_no_state"]

NO_STATE_WARNING = (
    "yolo-det: no resume state for {ckpt} ({why}); the run continues, but not bit for bit as "
    "the uninterrupted run would have"
)


def warn_no_state(ckpt: str | Path, why: str | None) -> None:
    """Say on stderr that the resume from ``ckpt`` found no usable resume state (``why``) and is not bitwise."""
    print(NO_STATE_WARNING.format(ckpt=ckpt, why=why), file=sys.stderr, flush=True)


def previous_record(checkpoint: str | Path) -> dict[str, Any] | None:
    """The ``determinism.json`` of the run that wrote ``checkpoint`` (``<run>/weights/last.pt``), if any."""
    path = Path(checkpoint).resolve().parent.parent / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
