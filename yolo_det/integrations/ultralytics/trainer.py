"""The second way in: :func:`trainer_class`, a trainer class that trains under a profile.

``model.train(trainer=yolo_det.trainer_class("repro"))``: the class extends the trainer of the model's task
(:func:`_task_trainer`; any ``BaseTrainer`` subclass can be the base instead). Its constructor checks the labels
the run will read (:func:`yolo_det.analysis.datacheck.check_training_data`), begins the plugin's run before
Ultralytics' ``init_seeds`` (the baseline snapshot), locks a run folder whose name is fixed, resumes into the
checkpoint's folder and registers the plugin's callbacks; its ``train`` takes the stop signals and restores the
state afterwards, also when training raises.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ...analysis.datacheck import check_training_data
from ...core.compat import TASK_TRAINERS
from ...core.compat import task_trainer as compat_task_trainer
from ...core.errors import YoloDetError
from ...core.profiles import Profile, load_profile
from ...core.signals import stop_signals
from ...session.distributed import terminate_via_launcher
from .folders import lock_planned_folder, resume_overrides
from .plugin import UltralyticsPlugin
from .seam import seam_trainer

__all__ = ["trainer_class"]


def _task_trainer(task: str) -> type:
    """The trainer class Ultralytics uses for ``task`` (a task of a newer Ultralytics included)."""
    if task not in TASK_TRAINERS:
        try:  # a task of a newer Ultralytics (its YOLO class maps every task to its trainer)
            from ultralytics import YOLO

            return YOLO.task_map.fget(None)[task]["trainer"]  # type: ignore[attr-defined]
        except Exception:
            raise YoloDetError(
                f"no Ultralytics trainer for task '{task}'; choose from {', '.join(TASK_TRAINERS)} "
                "or pass base= (a BaseTrainer subclass)"
            ) from None
    return compat_task_trainer(task)


def _trainer_task(cfg: Any, overrides: dict[str, Any] | None) -> str:
    """The task a trainer is built for: ``task=`` of the arguments Ultralytics passes, else the model's."""
    over = overrides or {}
    task = over.get("task")
    if not task and isinstance(cfg, dict):
        task = cfg.get("task")
    if not task:
        model = over.get("model")
        if isinstance(model, (str, Path)):
            from ...analysis.models import model_task

            task = model_task(str(model))
    return str(task or "detect")


def _with_profile(base: Any, resolved: Profile, record: bool) -> type:
    """``base`` extended so that it trains under ``resolved`` through the trainer seam (:mod:`.seam`; which also
    trains it as one rank of an outside launcher's job)."""
    base = seam_trainer(base)

    def __init__(
        self: Any,
        cfg: Any = None,
        overrides: dict[str, Any] | None = None,
        _callbacks: dict[str, list[Any]] | None = None,
    ) -> None:
        from ...core.compat import DEFAULT_CFG
        from ...core.compat import callbacks as ul_callbacks

        given = {**(cfg if isinstance(cfg, dict) else {}), **(overrides or {})}
        check_training_data(given, task=_trainer_task(cfg, overrides))  # before anything is written
        plugin = UltralyticsPlugin(type(self).yolo_det_profile, record=type(self).yolo_det_record)
        self.yolo_det = plugin
        plugin.begin_run(owner="trainer-class")  # baseline before init_seeds touches anything
        try:
            lock = lock_planned_folder(cfg, overrides)
            if lock is not None:
                plugin._locks.append(lock)
            overrides = resume_overrides(overrides)
            plugin.asked = dict(overrides or {})
            cbs = {k: list(v) for k, v in (_callbacks or ul_callbacks.get_default_callbacks()).items()}
            plugin.register(cbs)
            base.__init__(self, DEFAULT_CFG if cfg is None else cfg, overrides, cbs)
            plugin._ensure_train(self)  # DDP ranks > 0 get no on_pretrain_routine_start
        except BaseException as error:
            plugin._record_early_ending(error)
            plugin.end_run(error)
            raise

    def train(self: Any) -> Any:
        with stop_signals(), terminate_via_launcher():
            try:
                result = base.train(self)
            except BaseException as error:
                self.yolo_det.end_run(error)
                raise
            self.yolo_det.end_run()
            return result

    return type(
        f"YoloDet{base.__name__}",
        (base,),
        {
            "__init__": __init__,
            "train": train,
            "yolo_det_profile": resolved,
            "yolo_det_record": record,
            "__doc__": f"{base.__name__} under the yolo-det profile '{resolved.name}'.",
            "__module__": __name__,
        },
    )


def trainer_class(profile: Profile | str = "repro", base: type | None = None, *, record: bool = True) -> type:
    """Return a trainer class that trains under ``profile``: ``model.train(trainer=trainer_class("repro"))``.

    Args:
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.core.profiles.Profile`.
        base: The trainer to extend (any ``ultralytics.engine.trainer.BaseTrainer`` subclass). By default the
            trainer of the model's task, as Ultralytics picks it: ``DetectionTrainer``, ``SegmentationTrainer``,
            ``PoseTrainer``, ``OBBTrainer`` or ``ClassificationTrainer`` (the task comes from the ``task``
            argument Ultralytics passes the trainer, else from the model YAML). The class returned then
            subclasses ``DetectionTrainer``; an instance for another task is of that task's trainer, extended
            the same way.
        record: Write ``determinism.json`` into the run directory.
    """
    resolved = load_profile(profile)
    from ...core.compat import BaseTrainer

    if base is not None:
        if not inspect.isclass(base) or not issubclass(base, BaseTrainer):
            raise YoloDetError(f"trainer_class() needs a BaseTrainer subclass as base, got {base!r}")
        return _with_profile(base, resolved, record)
    made: dict[str, type] = {}

    def for_task(task: str) -> type:
        if task not in made:
            made[task] = _with_profile(_task_trainer(task), resolved, record)
        return made[task]

    detect = for_task("detect")

    def __new__(
        cls: type,
        cfg: Any = None,
        overrides: dict[str, Any] | None = None,
        _callbacks: dict[str, list[Any]] | None = None,
    ) -> Any:
        task = _trainer_task(cfg, overrides)
        if task == "detect":
            return object.__new__(cls)
        return for_task(task)(cfg, overrides, _callbacks)  # not an instance of cls: its __init__ has run

    return type(
        "YoloDetTrainer",
        (detect,),
        {
            "__new__": __new__,
            "yolo_det_profile": resolved,
            "yolo_det_record": record,
            "yolo_det_trainer_for": staticmethod(for_task),
            "__doc__": f"The trainer of the model's task under the yolo-det profile '{resolved.name}'.",
            "__module__": __name__,
        },
    )
