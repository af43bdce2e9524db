"""YOLOv5 integration: what a YOLOv5 tree patched by ``yolo-det patch-yolov5`` calls at run time.

A patched script imports this package (``from yolo_det.integrations import yolov5 as ydet``) and calls the
functions below; they live in :mod:`.run`. The rooms, one concern each: :mod:`.run` (the run and one function
per patched line), :mod:`.resume` (bitwise resume), :mod:`.data` (the training loader and the record's
``data_stream``), :mod:`.patch` (the patcher).
"""

from __future__ import annotations

from .run import *  # noqa: F403 - the names a patched script calls are those of .run
from .run import __all__ as __all__
