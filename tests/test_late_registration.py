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
    tmp_path: Path, demo_data: str, capfd: pytest.CaptureFixture[str]
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
    capfd.readouterr()
    trainer.train()
    assert _start_weights(tmp_path / "built") == _start_weights(tmp_path / "attach")
    # the callbacks route: what needs the seam is named in one line at start, with the fix, and recorded as off
    lines = [line for line in capfd.readouterr().err.splitlines() if "trainer seam" in line]
    assert len(lines) == 1
    assert "bitwise resume" in lines[0]
    assert "trainer_class(profile, base=YourTrainer)" in lines[0]
    assert "data_invariance" in lines[0]  # repro asks for keyed data: the loader is built in the seam
    built = json.loads((tmp_path / "built" / RECORD_NAME).read_text())
    assert built["trainer_seam"]["in_force"] is False
    assert any("bitwise resume" in off for off in built["trainer_seam"]["off"])
    assert any("data_invariance" in off for off in built["trainer_seam"]["off"])
    assert built["guarantees"]["data_invariance"] == {"in_force": False, "loader": "worker-stream"}
    assert built["data_stream"]["mode"] == "worker-stream"
    assert built["data_stream"]["fingerprint"] is None
    attached = json.loads((tmp_path / "attach" / RECORD_NAME).read_text())
    assert attached["trainer_seam"] == {"in_force": True, "off": []}
    assert attached["guarantees"]["data_invariance"] == {"in_force": True, "loader": "keyed"}
    assert attached["data_stream"]["mode"] == "keyed"
    assert attached["data_stream"]["fingerprint"]


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
