"""Contract tests: every Ultralytics internal yolo-det names (yolo_det.core.compat) is there, as used.

An Ultralytics release that moves, renames or drops one fails here, by name, rather than somewhere in a
training.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
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


# -- the internals whose behaviour differs between Ultralytics versions (compat's table) ---------------------
def test_run_folder_is_what_ultralytics_gives_and_creates_nothing(tmp_path):
    from types import SimpleNamespace

    args = SimpleNamespace(project=str(tmp_path / "p"), name="n", task="detect", mode="train", exist_ok=False)
    assert compat.run_folder(args) == (tmp_path / "p" / "n").resolve()
    assert not (tmp_path / "p").exists()  # Ultralytics 8.3's get_save_dir would have created it
    (tmp_path / "p" / "n").mkdir(parents=True)
    assert compat.run_folder(args).name != "n"  # numbered past the existing folder (control)
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["n"]
    import ultralytics.utils.files as files

    assert files.increment_path.__module__ == "ultralytics.utils.files"  # restored


def test_loss_components_of_each_version_shape():
    import torch

    one_tensor = torch.tensor([1.0, 2.0, 3.0])  # Ultralytics 8.3
    assert compat.loss_components(one_tensor)[0] is None
    assert [float(v) for v in compat.loss_components(one_tensor)[1]] == [1.0, 2.0, 3.0]
    parts = (torch.tensor(1.0), torch.tensor(2.0))  # Ultralytics 8.4
    assert compat.loss_components(parts) == (None, list(parts))
    assert compat.loss_components({"box": 1.0, "cls": 2.0}) == (["box", "cls"], [1.0, 2.0])
    assert compat.loss_components(torch.tensor(4.0)) == (None, [torch.tensor(4.0)])


def test_optimizer_state_holds_plain_numbers_and_loads_weights_only(tmp_path):
    import numpy as np
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9)
    optimizer.param_groups[0]["lr"] = np.interp(0.5, [0, 1], [0.0, 0.2])  # as Ultralytics 8.3's warmup sets it
    torch.save(optimizer.state_dict(), tmp_path / "raw.pt")
    with pytest.raises(Exception, match="(?i)weights only"):  # control: NumPy scalars do not load
        torch.load(tmp_path / "raw.pt", weights_only=True)
    state = compat.optimizer_state(optimizer)
    torch.save(state, tmp_path / "plain.pt")
    loaded = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert type(loaded["param_groups"][0]["lr"]) is float
    assert loaded["param_groups"][0]["lr"] == 0.1
    assert type(optimizer.param_groups[0]["lr"]).__module__ == "numpy"  # the optimizer itself is untouched


def test_label_verdict_is_ultralytics_own_check_with_the_arguments_of_the_release(tmp_path):
    label = tmp_path / "labels" / "a.txt"
    label.parent.mkdir()
    label.write_text("5 0.5 0.5 0.2 0.2\n")
    rules = {"keypoint": False, "nkpt": 0, "ndim": 0}
    found, fault = compat.label_verdict(str(label), classes=3, single_cls=False, **rules)
    assert found
    assert "exceeds dataset class count 3" in fault
    assert compat.label_verdict(str(label), classes=6, single_cls=False, **rules) == (True, None)  # control
    passed_on = compat._release(compat.ultralytics_version()) >= compat.LABEL_SINGLE_CLS_FROM
    assert (compat.label_verdict(str(label), classes=3, single_cls=True, **rules)[1] is None) == passed_on
    missing = str(tmp_path / "labels" / "b.txt")  # a background image
    assert compat.label_verdict(missing, classes=3, single_cls=False, **rules) == (False, None)


def test_the_installed_ultralytics_version_is_in_the_declared_range():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    lowest = re.search(r'"ultralytics>=([\d.]+)"', text).group(1)
    version = tuple(int(p) for p in compat.ultralytics_version().split(".")[:3])
    assert version >= tuple(int(p) for p in lowest.split("."))


@pytest.mark.parametrize("name", sorted(compat.EARLIER))
def test_an_internal_an_older_release_keeps_elsewhere_resolves_where_this_release_has_it(name):
    import importlib

    found = []
    for module, attribute in (compat.INTERNALS[name], compat.EARLIER[name]):
        try:
            found.append(getattr(importlib.import_module(module), attribute))
        except (ImportError, AttributeError):
            pass
    assert found, f"{name}: in neither place"
    assert compat.internal(name) is found[0]


def test_the_tracker_integrations_have_the_globals_yolo_det_reads(tmp_path):
    # as a user with the integrations on runs them (8.3 defines WRITER only then), outside a test runner (under
    # one, Ultralytics' TensorBoard module stops before it defines WRITER); the settings in a folder of the test's.
    # An integration whose package is not installed here is not checked (it defines no run handle, and is never
    # registered): the test extra installs them all
    env = subprocess_env({"YOLO_CONFIG_DIR": str(tmp_path)})
    for name in ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "GITHUB_ACTIONS", "GITHUB_WORKFLOW", "RUNNER_OS"):
        env.pop(name, None)
    packages = {"MLflow": "mlflow", "Weights & Biases": "wandb", "TensorBoard": "tensorboard", "Comet": "comet_ml"}
    packages |= {"ClearML": "clearml", "DVC": "dvclive"}
    installed = {k for k, v in packages.items() if importlib.util.find_spec(v) is not None}
    code = (
        "import json; from ultralytics.utils import SETTINGS\n"
        "SETTINGS.update(mlflow=True, wandb=True, tensorboard=True, comet=True, clearml=True, dvc=True)\n"
        "from yolo_det.core import compat; from yolo_det.integrations.ultralytics import trackers\n"
        "print(json.dumps({k: [a for a in (t.event, t.handle) if not hasattr(compat.internal(t.integration), a)]"
        " for k, t in trackers.TRACKERS.items()}))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(missing) == set(packages)
    assert {"MLflow", "Weights & Biases", "TensorBoard"} <= installed
    assert {k: v for k, v in missing.items() if k in installed} == {k: [] for k in installed}
    from yolo_det.integrations.ultralytics.trackers import TRACKERS

    assert {t.integration for t in TRACKERS.values()} <= set(compat.INTERNALS)
