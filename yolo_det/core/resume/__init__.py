"""Resume state: what an interrupted training needs, beyond its checkpoint, to continue bit for bit.

A training checkpoint (Ultralytics' ``last.pt``, YOLOv5's ``last.pt``) holds the epoch, the EMA and the
optimizer, but rounded to float16, and no RNG or data-order state. A run resumed from it continues from
different numbers than the run that was interrupted. yolo-det writes, at every checkpoint save, a *resume
state* file next to the checkpoint (``weights/yolo-det-resume.last.pt``; ``...last.rank1.pt`` for rank 1
under DDP) holding:

- the RNG states: python ``random``, numpy's global RNG, torch CPU and every CUDA device;
- the live model and the EMA in full precision, the optimizer state in full precision, the gradients
  accumulated but not yet applied, and the step bookkeeping (last optimizer step, accumulation);
- the AMP scaler, the epoch, the data-loader state (the shuffle generator, the mosaic flag);
- the checkpoint it belongs to (``epoch`` and EMA ``updates``), so a stale file is never used.

The file holds tensors and plain Python values only: it loads with ``torch.load(weights_only=True)``.
The checkpoint itself is not changed, so it still loads in plain Ultralytics/YOLOv5 without yolo-det.

Reading a checkpoint's arguments (what resuming will train on) uses :func:`read_checkpoint`, which never
imports or runs code named in the file (it reads it with :func:`yolo_det.core.untrusted.safeload.read_checkpoint`:
every class the pickle names is an inert placeholder).

The package, one concern a module: :mod:`.checkpoint` (reading a checkpoint safely), :mod:`.rng` (the RNG
states), :mod:`.state` (the state file: its name, writing, loading and matching it to a checkpoint),
:mod:`.writer` (writing it on a background thread), :mod:`.arguments` (the arguments of a command-line
resume) and :mod:`.folder` (the folder a resumed run writes into).
"""

from __future__ import annotations

from ..fileio import file_sha256
from .arguments import RESUME_ALLOWED, is_resume, resume_arguments
from .checkpoint import CheckpointInfo, read_checkpoint
from .folder import resume_folder, resume_save_dir, run_folder_of
from .rng import get_rng_state, set_rng_state
from .state import (
    FORMAT,
    NUMPY_COPY_DTYPES,
    find_state,
    host_copy,
    is_state_file,
    load_state,
    previous_state_path,
    save_state,
    state_bytes,
    state_files,
    state_path,
)
from .writer import StateWriter

__all__ = [
    "FORMAT",
    "NUMPY_COPY_DTYPES",
    "RESUME_ALLOWED",
    "CheckpointInfo",
    "StateWriter",
    "file_sha256",
    "find_state",
    "get_rng_state",
    "host_copy",
    "is_resume",
    "is_state_file",
    "load_state",
    "previous_state_path",
    "read_checkpoint",
    "resume_arguments",
    "resume_folder",
    "resume_save_dir",
    "run_folder_of",
    "save_state",
    "state_bytes",
    "set_rng_state",
    "state_files",
    "state_path",
]
