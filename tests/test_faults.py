"""Fault matrix: an exception at any callback event (and inside a toggled backward) leaves no trace."""

from __future__ import annotations

import pytest
import torch

from helpers import small_train
from statecheck import assert_same_state, global_state
from yolo_det import attach, trainer_class

pytestmark = pytest.mark.slow

# Every training event Ultralytics fires (it declares on_before_zero_grad and optimizer_step but never fires them).
TRAIN_EVENTS = (
    "on_pretrain_routine_start",
    "on_pretrain_routine_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_val_start",
    "on_val_batch_start",
    "on_val_batch_end",
    "on_val_end",
    "on_fit_epoch_end",
    "on_model_save",
    "on_train_end",
    "teardown",
)
VAL_EVENTS = ("on_val_start", "on_val_batch_start", "on_val_batch_end", "on_val_end")
PREDICT_EVENTS = (
    "on_predict_start",
    "on_predict_batch_start",
    "on_predict_postprocess_end",
    "on_predict_batch_end",
    "on_predict_end",
)
EXPORT_EVENTS = ("on_export_start", "on_export_end")
# 12 images in 2 batches at 32 px, validated: every training and validation event still fires, on less data
SMALL = small_train(imgsz=32, batch=8, fraction=0.25)


class Injected(RuntimeError):
    """The fault the matrix injects."""


def raiser(event: str):
    def callback(obj):
        raise Injected(f"injected at {event}")

    return callback


def add_first(model, event: str, fn) -> None:
    model.callbacks[event].insert(0, fn)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trained checkpoint for the validation, prediction and export rows."""
    from ultralytics import YOLO

    from yolo_det.tools.demo import demo_data_yaml

    folder = tmp_path_factory.mktemp("trained")
    YOLO("yolov8n.yaml").train(data=str(demo_data_yaml()), project=str(folder), name="base", **SMALL)
    return folder / "base" / "weights" / "last.pt"


@pytest.mark.parametrize("event", TRAIN_EVENTS)
@pytest.mark.parametrize("position", ["after", "before"])
def test_training_fault_at_every_event(event, position, tmp_path, demo_data):
    from ultralytics import YOLO

    torch.use_deterministic_algorithms(True, warn_only=True)  # a non-default user state to return to
    model = YOLO("yolov8n.yaml")
    attach(model, "balanced")
    if position == "before":
        add_first(model, event, raiser(event))  # runs before the plugin's own callback for that event
    else:
        model.add_callback(event, raiser(event))
    before = global_state()
    with pytest.raises(Injected):
        model.train(data=demo_data, project=str(tmp_path), name="run", **SMALL)
    assert_same_state(before, global_state())


@pytest.mark.parametrize("event", ["on_pretrain_routine_end", "on_train_batch_end", "on_val_start", "teardown"])
def test_training_fault_with_trainer_class(event, tmp_path, demo_data):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    add_first(model, event, raiser(event))  # runs before the plugin's own callback for that event
    before = global_state()
    with pytest.raises(Injected):
        model.train(trainer=trainer_class("repro"), data=demo_data, project=str(tmp_path), name="run", **SMALL)
    assert_same_state(before, global_state())


@pytest.mark.parametrize("event", VAL_EVENTS)
def test_validation_fault(event, trained, demo_data, tmp_path):
    from ultralytics import YOLO

    model = YOLO(str(trained))
    attach(model, "fast")
    model.add_callback(event, raiser(event))
    before = global_state()
    with pytest.raises(Injected):
        model.val(data=demo_data, imgsz=64, batch=8, device="cpu", plots=False, project=str(tmp_path), name="v")
    assert_same_state(before, global_state())


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("event", PREDICT_EVENTS)
def test_prediction_fault(event, stream, trained, demo_data):
    from pathlib import Path

    from ultralytics import YOLO

    model = YOLO(str(trained))
    attach(model, "fast")
    model.add_callback(event, raiser(event))
    images = sorted((Path(demo_data).parent / "demo" / "images" / "val").glob("*.png"))[:2]
    before = global_state()
    with pytest.raises(Injected):
        result = model.predict([str(p) for p in images], imgsz=64, device="cpu", verbose=False, stream=stream)
        if stream:
            list(result)
    assert_same_state(before, global_state())


@pytest.mark.parametrize("event", EXPORT_EVENTS)
def test_export_fault(event, trained, tmp_path):
    import shutil

    from ultralytics import YOLO

    weights = tmp_path / "w.pt"
    shutil.copy(trained, weights)
    model = YOLO(str(weights))
    attach(model, "repro")
    model.add_callback(event, raiser(event))
    before = global_state()
    with pytest.raises(Injected):
        model.export(format="torchscript", imgsz=64, device="cpu")
    assert_same_state(before, global_state())


def test_fault_inside_toggled_backward_during_training(tmp_path, demo_data):
    """A backward pass that raises while determinism is toggled off: the run fails, the state does not leak."""
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    class BoomBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            assert not torch.are_deterministic_algorithms_enabled()  # toggled off by the balanced profile
            raise Injected("injected in backward")

    class BoomTrainer(DetectionTrainer):
        def get_model(self, cfg=None, weights=None, verbose=True):
            model = super().get_model(cfg=cfg, weights=weights, verbose=verbose)
            model.model[0].register_forward_hook(_boom_hook)
            return model

    _BOOM[0] = BoomBackward
    torch.use_deterministic_algorithms(True)
    model = YOLO("yolov8n.yaml")  # Ultralytics' Model() sets CUBLAS_WORKSPACE_CONFIG itself
    before = global_state()
    with pytest.raises(Injected):
        model.train(
            trainer=trainer_class("balanced", base=BoomTrainer),
            data=demo_data,
            project=str(tmp_path),
            name="boom",
            **SMALL,
        )
    assert_same_state(before, global_state())
    assert torch.are_deterministic_algorithms_enabled()


_BOOM: list = [None]


def _boom_hook(module, inputs, output):
    return _BOOM[0].apply(output) if output.requires_grad else output
