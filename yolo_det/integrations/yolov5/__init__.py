"""YOLOv5 integration: what a YOLOv5 tree patched by ``yolo-det patch-yolov5`` calls at run time.

A patched script imports this package (``from yolo_det.integrations import yolov5 as ydet``) and calls the
functions below; they live in :mod:`.run`. The rooms, one concern each: :mod:`.run` (the run and one function
per patched line), :mod:`.resume` (bitwise resume), :mod:`.data` (the training loader and the record's
``data_stream``), :mod:`.patch` (the patcher: the plan), :mod:`.edits` (its edit table), :mod:`.writer` (its
journalled writer).

The names of :mod:`.run` resolve on first use, so the patcher's modules (which ``yolo-det patch-yolov5``
imports) load without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_ROOMS = ("run", "resume", "data", "gate", "patch", "edits", "writer")


def __getattr__(name: str) -> Any:
    if name in _ROOMS:
        return import_module(f"{__name__}.{name}")
    if name.startswith("__") and name != "__all__":
        raise AttributeError(name)
    run = import_module(f"{__name__}.run")
    try:
        return getattr(run, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_ROOMS, *import_module(f"{__name__}.run").__all__})
