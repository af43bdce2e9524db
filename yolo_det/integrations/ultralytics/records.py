"""The record of an Ultralytics training: ``determinism.json`` written for every ending.

:class:`RunRecords` writes the record of the run in progress: with status ``running`` from the train phase's
first second (and after each checkpoint, with the epochs checkpointed), then once for the ending (``completed``
at ``on_train_end``; ``failed``, ``interrupted`` or ``terminated`` from ``teardown`` or from a guard that
ends the run before Ultralytics' ``train()`` ran). Every weights file is digested from disk; the record
itself is built by :func:`yolo_det.core.record.build_record` and written atomically. Once the record of the ending
is written, the observers registered with :func:`observe_final_record` are told (the experiment trackers,
:mod:`.trackers`).
"""

from __future__ import annotations

import contextlib
import errno
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ...core.endings import describe_ending, one_line, weights_files
from ...core.launcher import launch_identity
from ...core.partial import set_aside_incomplete
from ...core.record import RECORD_NAME, build_record, state_dict_digest, write_record
from ...core.resume.lineage import segments_of
from ...core.testpoints import reach
from ...session.distributed import ranks_consistent
from ...session.session import note_restore_failure
from ..trainer_state import state_of
from . import data as _stream
from .guarantees import guarantees_section
from .runs import RunControl, process_rank
from .seam import seam_section

__all__ = ["RUN_ARGS", "RunRecords", "observe_final_record"]

#: The training arguments the record's ``run`` section keeps.
RUN_ARGS = (
    "task",
    "model",
    "data",
    "epochs",
    "imgsz",
    "batch",
    "device",
    "seed",
    "deterministic",
    "amp",
    "workers",
    "optimizer",
    "lr0",
    "cache",
    "rect",
    "multi_scale",
    "close_mosaic",
    "fraction",
)

#: The errors of a full disk: no space, no quota, a file size limit.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

#: Told ``(trainer, path, record)`` once the record of a run's ending is written (rank 0).
_FINAL_OBSERVERS: list[Callable[[Any, Path, Mapping[str, Any]], Any]] = []


def observe_final_record(observer: Callable[[Any, Path, Mapping[str, Any]], Any]) -> None:
    """Tell ``observer(trainer, path, record)`` of every final record (``completed``, ``failed``, ...) once it is
    written; an observer that raises is one line, and the run and its record stand. Registering twice is a no-op."""
    if observer not in _FINAL_OBSERVERS:
        _FINAL_OBSERVERS.append(observer)


def _tell_observers(trainer: Any, path: Path, record: Mapping[str, Any]) -> None:
    for observer in _FINAL_OBSERVERS:
        try:
            observer(trainer, path, record)
        except Exception as e:
            print(f"yolo-det: {RECORD_NAME} written, not shown elsewhere: {one_line(e)}", file=sys.stderr, flush=True)


class RunRecords(RunControl):
    """Writes ``determinism.json`` for the run in progress (see the module docstring)."""

    def _write_running(
        self, trainer: Any, rewriting: frozenset[str] = frozenset(), *, checkpointed: bool = False
    ) -> None:
        """Write (replace) the record with status ``running`` (rank 0); the weights files named in ``rewriting``
        are listed without size or digest (about to be replaced); ``checkpointed``: right after an epoch's
        checkpoint, whose ``last.pt`` digest joins ``epoch_weights``.

        A full disk (no space, quota, file size limit) stops the run: raised, so that it fails naming it while the
        record on disk still lists only files as they are. Another failure is kept, not raised, and the training
        goes on; when it was the record before a checkpoint, the record still on disk (which lists the files that
        checkpoint replaces) is removed, so that no record lists a file that is not on disk."""
        if not self.record or process_rank() not in {-1, 0}:
            return
        try:
            self._write(trainer, None, running=True, rewriting=rewriting, checkpointed=checkpointed)
        except Exception as e:  # the training goes on; the final record says what it can
            if isinstance(e, OSError) and e.errno in _NO_SPACE:
                raise
            self.record_error = f"could not write {RECORD_NAME}: {type(e).__name__}: {one_line(e)}"
            if rewriting:
                with contextlib.suppress(OSError):
                    Path(trainer.save_dir, RECORD_NAME).unlink()

    def _before_checkpoint_record(self, trainer: Any) -> None:
        """Before each checkpoint: the files it replaces are listed without a size or digest, so that the record
        never lists one that is not on disk, whenever the run is killed."""
        if not Path(trainer.save_dir, RECORD_NAME).is_file():
            return  # no record yet: nothing lists the files
        self._write_running(trainer, frozenset({Path(trainer.last).name, Path(trainer.best).name}))

    def _after_checkpoint(self, trainer: Any) -> None:
        """After each checkpoint: the record says how many epochs are checkpointed, and their weights digests."""
        self._write_running(trainer, checkpointed=True)
        reach("record-updated")

    def _record_ending(self, trainer: Any, error: BaseException | None) -> None:
        """Write the record of a run that ended before ``on_train_end`` (rank 0, once); never raise for it."""
        session = self.session
        if not (
            self.record
            and session is not None
            and "train" in session.phases
            and process_rank() in {-1, 0}
            and not state_of(trainer).record_written
        ):
            return
        try:
            self._write(trainer, error)
        except Exception as e:  # never mask the error that ended the run
            self.record_error = (
                f"could not write {RECORD_NAME} in '{trainer.save_dir}': {type(e).__name__}: {one_line(e)}"
            )
            warnings.warn(f"yolo-det: {self.record_error}", UserWarning, stacklevel=3)

    def _record_early_ending(self, error: BaseException) -> None:
        """Record a run that ended after the train phase began but before Ultralytics' ``train()`` ran."""
        if self._trainer is not None:
            try:
                self._record_ending(self._trainer, error)
            except BaseException as e:  # an interrupt while writing: keep the first one
                note_restore_failure(error, e)

    def _write(
        self,
        trainer: Any,
        error: BaseException | None,
        *,
        running: bool = False,
        rewriting: frozenset[str] = frozenset(),
        checkpointed: bool = False,
    ) -> None:
        """Write ``determinism.json`` for a run that ended with ``error`` (None: completed), or one still
        ``running`` (``checkpointed``: right after the checkpoint of an epoch)."""
        if not self.record or self.session is None:
            return
        save_dir = trainer.save_dir
        stopped = error is not None and state_of(trainer).stopped_on_purpose  # a clean stop
        running = running and error is None
        # Digests of the files as they are on disk (this run holds the folder: they are its own files).
        files = set_aside_incomplete(weights_files(Path(save_dir) / "weights", self._weights_before, self._digests))
        files = [
            {"file": f["file"], "sha256": None, "error": "being replaced by the checkpoint in progress"}
            if Path(f["file"]).name in rewriting
            else f
            for f in files
        ]
        weights: dict[str, Any] = {"files": files}
        last = Path(trainer.last).resolve()
        entry = next((f for f in files if Path(f["file"]).resolve() == last and f.get("sha256")), None)
        epoch_weights = state_of(trainer).epoch_weights
        if checkpointed and entry is not None and self.resume is not None and self.resume.checkpointed:
            epoch_weights[self.resume.checkpointed] = entry["sha256"]  # the weights after that epoch
        if (error is None and not running) or stopped:
            if entry is not None:
                weights["file"] = entry["file"]
                weights["sha256"] = entry["sha256"]
                self.weights_digest = entry["sha256"]
            ema = getattr(getattr(trainer, "ema", None), "ema", None)
            if isinstance(ema, torch.nn.Module):  # the final EMA in float32 (the file holds it in float16)
                weights["ema_fp32_sha256"] = state_dict_digest(ema)
        ending = describe_ending(error)
        # stopped on purpose after a saved epoch (verify --resume-at): resumable, not failed
        if stopped and error is not None:
            ending = {"status": "interrupted", "stopped": one_line(error)}
        if running:
            ending = {"status": "running"}
        record = build_record(
            self.session,
            framework="ultralytics",
            status=ending.pop("status"),
            state_at_train_start=self._observed,
            weights=weights,
            run={k: getattr(trainer.args, k, None) for k in RUN_ARGS} | {"save_dir": str(save_dir)},
            ranks=self._ranks,
            launch=launch_identity(),
            rank_problems=ranks_consistent(self._ranks) if self._ranks else [],
            imports=self._portable.get("imports", []),
            checkpoint_yaml_layers=self._portable.get("layers", {}),
            **({"checkpoint_needs": dict(self._plain)} if self._plain else {}),
            **(state_of(trainer).identity or {}),
            **({"op_trace": trace()} if (trace := state_of(trainer).op_trace) is not None else {}),
            trainer_seam=seam_section(
                trainer, self.record, bool(self.profile.train.extra.get("data_invariance", False))
            ),
            epoch_weights=[{"epoch": e, "sha256": d} for e, d in sorted(epoch_weights.items())],
            **({} if running else {"guarantees": guarantees_section(trainer, self.profile, self._observed)}),
            data_stream=_stream.data_stream_section(
                trainer, int(self.session.seeds()["seed"]), state_of(trainer).identity
            ),
            **ending,
        )
        if self.resume is not None:
            record.update(self.resume.record_fields(trainer, self.profile, self._previous, flush=not running))
        else:
            record.update(segments=segments_of(self._previous), epochs_completed=int(trainer.start_epoch))
        reach("record-writing")
        self.record_path = write_record(save_dir, record)
        if not running:
            state_of(trainer).record_written = True
            _tell_observers(trainer, self.record_path, record)
