"""Contract tests: every Ultralytics internal yolo-det names (yolo_det.core.compat) is there, as used.

An Ultralytics release that moves, renames or drops one fails here, by name, rather than somewhere in a
training.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from helpers import subprocess_env
from yolo_det.core import compat


@pytest.mark.parametrize("name", sorted(compat.INTERNALS))
def test_every_internal_resolves(name):
    module, attribute = compat.INTERNALS[name]
    value = compat.internal(name)
    assert value is not None
    if attribute is None:
        assert inspect.ismodule(value)
        assert value.__name__ == module


def test_the_internals_are_what_yolo_det_uses_them_as():
    from yolo_det.core.compat import BaseTrainer, Model, callbacks, get_save_dir, guess_model_task, tasks

    for name in (
        "DetectionModel",
        "SegmentationModel",
        "PoseModel",
        "OBBModel",
        "ClassificationModel",
        "RTDETRDetectionModel",
        "yaml_model_load",
        "parse_model",
    ):
        assert hasattr(tasks, name), name
    assert guess_model_task({"head": [[-1, 1, "Classify", [10]]]}) == "classify"
    for method in ("train", "run_callbacks", "add_callback", "save_model", "_setup_train"):
        assert callable(getattr(BaseTrainer, method, None)), method
    for method in ("train", "val", "predict", "export", "add_callback"):
        assert callable(getattr(Model, method, None)), method
    assert callable(callbacks.get_default_callbacks)
    assert list(inspect.signature(get_save_dir).parameters)[:1] == ["args"]


def test_every_event_the_plugin_registers_is_an_ultralytics_event():
    from yolo_det.core.compat import callbacks

    events = set(callbacks.get_default_callbacks())
    assert set(compat.EVENTS) - events == set()
    assert len(set(compat.EVENTS)) == len(compat.EVENTS)


@pytest.mark.parametrize("task", sorted(compat.TASK_TRAINERS))
def test_each_task_trainer_is_the_one_ultralytics_uses(task):
    from ultralytics import YOLO

    assert compat.task_trainer(task) is YOLO.task_map.fget(None)[task]["trainer"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        compat.nothing_here  # noqa: B018
    with pytest.raises(ImportError):
        exec("from yolo_det.core.compat import nothing_here", {})


def test_importing_compat_imports_no_ultralytics():
    code = "import sys, yolo_det.core.compat; print(sorted(m for m in sys.modules if m.startswith('ultralytics')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert out.stdout.strip() == "[]", out.stderr
