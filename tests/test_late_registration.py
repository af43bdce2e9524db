"""The plugin gives the same initial weights however it is attached, or refuses the late registration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import small_train
from yolo_det.core.errors import YoloDetError
from yolo_det.core.record import RECORD_NAME
from yolo_det.integrations.ultralytics import UltralyticsPlugin, attach

pytestmark = pytest.mark.slow

SMALL = small_train(imgsz=32, batch=8, nbs=8, fraction=0.25, val=False, seed=3)


def _start_weights(folder: Path) -> str:
    return json.loads((folder / RECORD_NAME).read_text())["model"]["start_weights_sha256"]


def test_callbacks_given_to_the_trainer_start_from_the_documented_routes_weights(
    tmp_path: Path, demo_data: str
) -> None:
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.utils import callbacks

    model = YOLO("yolov8n.yaml")
    attach(model, "repro")
    model.train(data=demo_data, project=str(tmp_path), name="attach", **SMALL)

    plugin = UltralyticsPlugin("repro")
    trainer = DetectionTrainer(
        overrides={"model": "yolov8n.yaml", "data": demo_data, "project": str(tmp_path), "name": "built", **SMALL},
        _callbacks=plugin.register(callbacks.get_default_callbacks()),
    )
    trainer.train()
    assert _start_weights(tmp_path / "built") == _start_weights(tmp_path / "attach")


def test_registering_on_an_existing_trainer_is_refused_in_one_line(tmp_path: Path, demo_data: str) -> None:
    from ultralytics.models.yolo.detect import DetectionTrainer

    trainer = DetectionTrainer(
        overrides={"model": "yolov8n.yaml", "data": demo_data, "project": str(tmp_path), "name": "late", **SMALL}
    )
    UltralyticsPlugin("repro").register(trainer.callbacks)
    with pytest.raises(YoloDetError) as e:
        trainer.train()
    message = str(e.value)
    assert "\n" not in message
    assert "registered on a trainer that already existed" in message
    assert "yolo_det.attach(model)" in message
    assert "_callbacks=" in message
    assert not (tmp_path / "late" / RECORD_NAME).exists()
