"""Reading a training checkpoint's epoch, arguments and resumability without running its code."""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..fileio import file_sha256
from ..plain import plain_value
from ..untrusted.container import no_checkpoint
from ..untrusted.safeload import Inert
from ..untrusted.safeload import read_checkpoint as safe_read


@dataclass
class CheckpointInfo:
    """What :func:`read_checkpoint` found in a training checkpoint.

    Attributes:
        path: The checkpoint file.
        epoch: The last completed epoch (0-based); -1 in a finished (stripped) checkpoint.
        updates: The EMA update count (Ultralytics) or None.
        train_args: The training arguments stored in it (``train_args`` of Ultralytics, ``opt`` of YOLOv5).
        has_optimizer: Whether the optimizer state is still in it.
        sha256: SHA-256 of the file's bytes.
    """

    path: Path
    epoch: int
    updates: int | None
    train_args: dict[str, Any] = field(default_factory=dict)
    has_optimizer: bool = False
    sha256: str = ""

    @property
    def resumable(self) -> bool:
        """Whether the framework would resume from it (an unfinished training: epoch >= 0, an optimizer, and
        epochs left to train)."""
        return self.epoch >= 0 and self.has_optimizer and not self.finished

    @property
    def finished(self) -> bool:
        """Whether its last completed epoch is the final one (a run killed after its final checkpoint, before
        Ultralytics stripped it), or it is a stripped, finished checkpoint."""
        epochs = self.train_args.get("epochs")
        if self.epoch < 0:
            return True
        return isinstance(epochs, int) and not isinstance(epochs, bool) and self.epoch + 1 >= epochs


def _inert_text(value: Any) -> str:
    if isinstance(value, Inert):  # a pathlib.Path and the like: keep its text
        args = value.__dict__.get("inert_args", ())
        return "/".join(str(a) for a in args) if args and all(isinstance(a, str) for a in args) else repr(value)
    return str(value)


def _plain(value: Any) -> Any:
    return plain_value(value, _inert_text)


def _arguments(obj: Any) -> dict[str, Any]:
    """The training arguments a read checkpoint object stores (``train_args``, or YOLOv5's ``opt``), as plain values."""
    if not isinstance(obj, Mapping):
        return {}
    args = obj.get("train_args")
    if args is None:
        args = obj.get("opt")  # YOLOv5
    if isinstance(args, Inert):
        state = args.state
        args = state if isinstance(state, Mapping) else {}
    elif isinstance(args, (argparse.Namespace, types.SimpleNamespace)):  # read as values by the allow-list
        args = vars(args)
    return _plain(args) if isinstance(args, Mapping) else {}


def stored_arguments(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The training arguments stored in checkpoint ``path`` (``{}`` when it stores none), read safely.

    Raises:
        ModelError: The file is refused by the allow-list (a call off the list).
    """
    return _arguments(safe_read(Path(path)))


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read the epoch, the arguments and the resumability of a training checkpoint, safely.

    Nothing named in the file is imported or run (see the module docstring).

    Raises:
        ModelError: The file is missing or is not a training checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise no_checkpoint(path)
    obj = safe_read(path)  # imports and calls nothing the file names
    if not isinstance(obj, Mapping) or "epoch" not in obj:
        raise ModelError(f"'{path}' is not a training checkpoint (no 'epoch' in it); pass the last.pt of a run")
    args = _arguments(obj)
    epoch = obj.get("epoch")
    updates = obj.get("updates")
    return CheckpointInfo(
        path=path,
        epoch=int(epoch) if isinstance(epoch, int) else -1,
        updates=int(updates) if isinstance(updates, int) else None,
        train_args=args,
        has_optimizer=obj.get("optimizer") is not None,
        sha256=file_sha256(path),
    )
