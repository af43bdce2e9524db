"""The trainer seam: where yolo-det meets Ultralytics' trainer, as methods of the trainer's class.

:class:`SeamTrainer` is a mixin composed with the trainer of the model's task or the user's own
(:func:`seam_trainer`); :func:`~yolo_det.integrations.ultralytics.trainer_class`, :func:`attach
<yolo_det.integrations.ultralytics.attach>`, the CLI and torchrun's ranks all train through it. It overrides
Ultralytics' trainer methods (``model.train(trainer=...)`` is Ultralytics' documented extension point), so no
method of a live object is ever replaced:

- ``preprocess_batch``: the batch observers registered on the trainer (:func:`observe`: the record's data tap,
  ``verify``'s recorder, the op tracer) see each batch as the loader gave it and as preprocessed, one ordered
  list, in the order they registered; a sharded step (:class:`~yolo_det.fixes.shards.ShardedBatch`) is
  preprocessed shard by shard.
- ``optimizer_step``: the same observers, before and after each optimizer step.
- ``get_dataloader``: the training loader, built with what the profile asks for in it (:attr:`TrainerState.build_loader
  <yolo_det.integrations.trainer_state.TrainerState.build_loader>`: worker-invariant data, shards) from the
  loader Ultralytics builds, at construction: the loader Ultralytics built is never iterated and never changed.
- ``save_model``: the run's checkpoint hook (:attr:`TrainerState.around_save
  <yolo_det.integrations.trainer_state.TrainerState.around_save>`: the resume state written before the
  checkpoint, ``last.pt``/``best.pt`` written atomically).
- the constructor and ``_setup_ddp``, ``_setup_train``, ``final_eval``, ``train``: one rank of an outside launcher's
  job (:class:`~yolo_det.integrations.ultralytics.launcher.LauncherTrainer`, each the base's own outside such a job).

A trainer built without the seam (the plugin's callbacks registered in a trainer the user controls) gets what
callbacks can give; what needs the seam says so in one line at start (:func:`say_missing`).
"""

from __future__ import annotations

import sys
from typing import Any

from ...core.compat import require_methods
from ...core.errors import ConfigError
from ...fixes.shards import ShardedBatch
from ..trainer_state import state_of
from .launcher import LAUNCHER_METHODS, LauncherTrainer

__all__ = [
    "SEAM_FIX",
    "SEAM_METHODS",
    "BatchObserver",
    "SeamTrainer",
    "has_seam",
    "is_plugin_callback",
    "observe",
    "say_missing",
    "seam_section",
    "seam_trainer",
    "unobserve",
]

#: What a user who registers the callbacks in a trainer of their own does to get what needs the seam.
SEAM_FIX = "model.train(trainer=yolo_det.trainer_class(profile, base=YourTrainer))"
#: The methods of Ultralytics' trainer the seam overrides (each calls the base's own).
SEAM_METHODS = ("get_dataloader", "preprocess_batch", "optimizer_step", "save_model")

_MADE: dict[type, type] = {}


class BatchObserver:
    """Something that watches each training batch and optimizer step (every method does nothing by default).

    Observers only read (the batch, the trainer); one that stops the run sets ``trainer.stop``.
    """

    def before_batch(self, trainer: Any, batch: Any) -> None:
        """The batch as the loader gave it, before ``preprocess_batch``."""

    def after_batch(self, trainer: Any, batch: Any) -> None:
        """The batch ``preprocess_batch`` returned."""

    def before_step(self, trainer: Any) -> None:
        """Right before the optimizer step (the gradients it applies are in place)."""

    def after_step(self, trainer: Any) -> None:
        """Right after the optimizer step."""


class SeamTrainer(LauncherTrainer):
    """The mixin of the trainer seam (see the module docstring); first in the bases of :func:`seam_trainer`."""

    callbacks: dict[str, list[Any]]  # the base trainer's, set in its constructor

    def get_dataloader(self, dataset_path: Any, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
        parent: Any = super()
        loader = parent.get_dataloader(dataset_path, batch_size=batch_size, rank=rank, mode=mode)
        if mode != "train":
            return loader
        if state_of(self).build_loader is None:
            # Ultralytics 8.4 runs on_pretrain_routine_start on rank 0 only: yolo-det's own callback enters the train
            # phase on the other DDP ranks here, before their training loader is built
            for fn in self.callbacks.get("on_pretrain_routine_start", []):
                if is_plugin_callback(fn):
                    fn(self)
        build = state_of(self).build_loader
        return loader if build is None else build(self, loader)

    def preprocess_batch(self, batch: Any) -> Any:
        observers = tuple(state_of(self).observers)
        for observer in observers:
            observer.before_batch(self, batch)
        parent: Any = super()
        if isinstance(batch, ShardedBatch):
            out = ShardedBatch([parent.preprocess_batch(dict(shard)) for shard in batch.shards])
        else:
            out = parent.preprocess_batch(batch)
        for observer in observers:
            observer.after_batch(self, out)
        return out

    def optimizer_step(self) -> None:
        observers = tuple(state_of(self).observers)
        for observer in observers:
            observer.before_step(self)
        parent: Any = super()
        parent.optimizer_step()
        for observer in observers:
            observer.after_step(self)

    def save_model(self) -> Any:
        parent: Any = super()
        around = state_of(self).around_save
        return parent.save_model() if around is None else around(self, parent.save_model)


def is_plugin_callback(fn: Any) -> bool:
    """Whether ``fn`` is one of the yolo-det plugin's callbacks (bound or not)."""
    return getattr(getattr(fn, "__func__", fn), "_yolo_det_callback", False)


def has_seam(trainer: Any) -> bool:
    """Whether ``trainer`` trains through the seam (its class composes :class:`SeamTrainer`)."""
    return isinstance(trainer, SeamTrainer)


def seam_trainer(base: type) -> type:
    """``base`` (a ``BaseTrainer`` subclass) composed with :class:`SeamTrainer` (``base`` itself when it has it).

    Raises:
        MissingContact: ``base`` lacks a method the seam overrides (:data:`SEAM_METHODS`,
            :data:`~yolo_det.integrations.ultralytics.launcher.LAUNCHER_METHODS`): one line naming it and the
            installed Ultralytics, before anything is built.
    """
    require_methods(base, SEAM_METHODS + LAUNCHER_METHODS, "yolo-det's trainer seam")
    if issubclass(base, SeamTrainer):
        return base
    if base not in _MADE:
        _MADE[base] = type(
            base.__name__,
            (SeamTrainer, base),
            {"__doc__": base.__doc__, "__module__": __name__, "__qualname__": f"seam.{base.__qualname__}"},
        )
    return _MADE[base]


def observe(trainer: Any, observer: BatchObserver, what: str) -> None:
    """Add ``observer`` to ``trainer``'s batch observers (once), or refuse in one line naming ``what`` needs it."""
    if not has_seam(trainer):
        raise ConfigError(
            f"{what} needs yolo-det's trainer seam, and {type(trainer).__name__} was built without it; "
            f"train with {SEAM_FIX}"
        )
    observers = state_of(trainer).observers
    if observer not in observers:
        observers.append(observer)


def unobserve(trainer: Any, observer: BatchObserver) -> None:
    """Take ``observer`` off ``trainer``'s batch observers (no-op when it is not on them)."""
    observers = state_of(trainer).observers
    if observer in observers:
        observers.remove(observer)


def seam_section(trainer: Any, record: bool, invariant: bool = False) -> dict[str, Any]:
    """The record's ``trainer_seam``: whether ``trainer`` trains through the seam, and what it leaves off without it
    (``invariant``: the profile asks for worker-invariant data; shards are refused instead:
    :func:`yolo_det.integrations.ultralytics.shards.check`)."""
    seam = has_seam(trainer)
    off = [] if seam else ["bitwise resume (no resume state is written with the checkpoints)"]
    if invariant and not seam:
        off.append("worker-invariant data (data_invariance: the loader is built in the seam's get_dataloader)")
    if record and not seam:
        off.append("the data fingerprint of the batches trained")
    return {"in_force": seam, "off": off}


def say_missing(trainer: Any, record: bool, invariant: bool = False) -> None:
    """One line at start (stderr) naming what a run without the seam leaves off, and the fix; nothing with it."""
    off = seam_section(trainer, record, invariant)["off"]
    if off:
        print(
            f"yolo-det: {type(trainer).__name__} was built without yolo-det's trainer seam (its callbacks only), so "
            f"this run leaves off: {'; '.join(off)}; for them train with {SEAM_FIX}",
            file=sys.stderr,
            flush=True,
        )
