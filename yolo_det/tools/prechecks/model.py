"""Pre-checks of ``model=``: a checkpoint holds a model to train from, a model YAML names modules that resolve."""

from __future__ import annotations

from ...core.errors import ModelError

_TASK_OF_CLASS = {
    "DetectionModel": "detect",
    "SegmentationModel": "segment",
    "PoseModel": "pose",
    "ClassificationModel": "classify",
    "OBBModel": "obb",
    "WorldModel": "detect",
    "YOLOEModel": "detect",
    "YOLOESegModel": "segment",
    "RTDETRDetectionModel": "detect",
}


def check_checkpoint_model(path: str, names: list[str]) -> str | None:
    """A ``model=FILE.pt`` must hold a model for Ultralytics to train from, judged from the ``module.name`` globals
    its pickle references (:func:`yolo_det.core.untrusted.safeload.checkpoint_globals`: nothing imported or run).

    Returns:
        The model's task when an Ultralytics model class tells it (``DetectionModel`` -> detect, ...), else None.

    Raises:
        ModelError: The pickle references no model class (a state dict, ``{"epoch": 3}``, a bare tensor).
    """
    tasks = {
        _TASK_OF_CLASS[n.rsplit(".", 1)[1]]
        for n in names
        if n.startswith("ultralytics.") and n.rsplit(".", 1)[1] in _TASK_OF_CLASS
    }
    modules = [n for n in names if n.startswith(("torch.nn.modules.", "ultralytics.nn.")) or n.endswith("Model")]
    if not tasks and not modules:
        raise ModelError(
            f"'{path}' holds no model Ultralytics can train from (its pickle names no model class: a "
            "state dict or other data); pass a checkpoint saved by Ultralytics, or a model YAML"
        )
    return tasks.pop() if len(tasks) == 1 else None


def check_model_yaml(model: str) -> None:
    """A model YAML must be within YAML bounds and name only modules Ultralytics (with yolo-det's layers) resolves.

    Raises:
        ModelError: Not found, malformed, beyond bounds, or a module name is unknown (file, line, close match).
    """
    from ...analysis.loader import _read_yaml, check_yaml_modules
    from ...analysis.models import model_names, resolve_model_yaml
    from ...core.compat import tasks

    path = resolve_model_yaml(model)
    if path is None:
        raise ModelError(f"model YAML '{model}' not found; give a path or an Ultralytics name such as yolov8n.yaml")
    text, cfg = _read_yaml(path)
    with model_names():
        check_yaml_modules(cfg, text, str(path), vars(tasks))
