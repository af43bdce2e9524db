"""Every attribute of Ultralytics' trainer a guarantee rests on, taken away as a release that renamed it would: one
line at start naming it and the installed release, never a run that completes and records the guarantee.

Each row of the contacts table in docs/architecture.md that ``core/compat.contact`` reads has its case here, on the
real trainer class; the attribute is removed right before yolo-det first reads it (a callback ahead of yolo-det's
own, or the user's ``get_dataloader``, which the seam calls first).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import small_train
from yolo_det import trainer_class
from yolo_det.core.compat import MissingContact, ultralytics_version
from yolo_det.core.record import RECORD_NAME

pytestmark = pytest.mark.slow

SMALL = small_train(imgsz=32, batch=8, nbs=8, fraction=0.25, val=False)
SHARDS = "name: shards2\nextends: repro\ntrain:\n  shards: 2\n"

#: ``attribute -> (on the trainer or its args, where it is taken away, the profile that reads it)``.
CASES: dict[str, tuple[str, str, str]] = {
    "save_dir": ("trainer", "on_pretrain_routine_start", "repro"),
    "resume": ("trainer", "on_pretrain_routine_start", "repro"),
    "seed": ("args", "on_pretrain_routine_start", "repro"),
    "start_epoch": ("trainer", "on_pretrain_routine_start", "repro"),
    "batch_size": ("trainer", "get_dataloader", "shards"),
    "train_loader": ("trainer", "on_pretrain_routine_end", "repro"),
    "model": ("trainer", "on_pretrain_routine_end", "repro"),
    "imgsz": ("args", "on_pretrain_routine_end", "repro"),
    "epoch": ("trainer", "on_train_epoch_start", "repro"),
}


def _take(trainer: Any, holder: str, name: str) -> None:
    """Take ``name`` away from the trainer (or its arguments), once."""
    if holder == "args" and hasattr(trainer.args, name):
        delattr(trainer.args, name)
    elif holder == "trainer":
        vars(trainer).pop(name, None)


@pytest.mark.parametrize("name", list(CASES))
def test_an_attribute_a_guarantee_rests_on_gone_is_one_line_at_start(name: str, tmp_path: Path, demo_data: str) -> None:
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    holder, point, profile = CASES[name]
    if profile == "shards":
        (tmp_path / "shards2.yaml").write_text(SHARDS)
        profile = str(tmp_path / "shards2.yaml")

    class Renamed(DetectionTrainer):  # a user's trainer: the seam calls its get_dataloader first
        def get_dataloader(self, *args: Any, **kwargs: Any) -> Any:
            if point == "get_dataloader":
                _take(self, holder, name)
            return super().get_dataloader(*args, **kwargs)

    model = YOLO("yolov8n.yaml")
    if point != "get_dataloader":  # ahead of yolo-det's own callback for the event
        model.callbacks[point].insert(0, lambda t: _take(t, holder, name))
    with pytest.raises(MissingContact) as e:
        model.train(
            trainer=trainer_class(profile, base=Renamed), data=demo_data, project=str(tmp_path), name="r", **SMALL
        )
    message = str(e.value)
    assert "\n" not in message
    assert f"has no attribute {name}, which yolo-det reads for" in message
    assert f"Ultralytics {ultralytics_version()}" in message
    for record in tmp_path.rglob(RECORD_NAME):  # never a completed run that claims what it could not check
        assert json.loads(record.read_text())["status"] == "failed"
