"""Every Ultralytics task trains under `repro` from the CLI and through `trainer_class()`, with equal digests; the
CLI run traces its first step (`--trace-ops`), so every task is traced too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import small_train_tokens
from tests.task_data import TASK_MODELS, make_dataset
from yolo_det.cli import main
from yolo_det.tools.trace import read_trace
from yolo_det.tools.trace.bisect import bisect_paths

TINY = small_train_tokens(batch=4, nbs=4, exist_ok=None)


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "determinism.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("task", ["segment", "pose", "obb", "classify"])
def test_each_task_trains_twice_with_equal_digests(task, tmp_path, capsys):
    """Run 1: `yolo-det train --trace-ops first:1` (attach). Run 2: `model.train(trainer=trainer_class("repro"))`
    with no base: the trainer of the model's task is chosen, and both runs end with the same weights (the trace
    of run 1 changed nothing)."""
    from ultralytics import YOLO

    from yolo_det import trainer_class
    from yolo_det.core.compat import TASK_TRAINERS

    data = make_dataset(tmp_path / "data", task)
    model_name = TASK_MODELS[task]
    assert (
        main(
            [
                "train",
                "--profile",
                "repro",
                "--trace-ops",
                "first:1",
                f"model={model_name}",
                f"data={data}",
                *TINY,
                f"project={tmp_path}",
                "name=cli",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    cli = _record(tmp_path / "cli")
    assert cli["status"] == "completed"
    assert cli["run"]["task"] == task
    assert f"weights digest: {cli['weights']['sha256']}" in out
    # the task's first step is traced: every module call, a gradient for each parameter the optimizer steps
    trace = tmp_path / "cli" / "ops-trace-rank0.jsonl"
    assert f"op trace: {trace}" in out
    (step, *_) = read_trace(trace).steps
    assert len(step.micro[0].forward) > 100
    assert len({e[1] for e in step.micro[0].backward if e[0] == "grad"}) == len(step.optimizer)
    assert bisect_paths(trace, trace).equal

    seen: list[type] = []
    model = YOLO(model_name)
    model.add_callback("on_train_start", lambda trainer: seen.append(type(trainer)))
    args = dict(a.split("=", 1) for a in TINY)
    model.train(
        trainer=trainer_class("repro"),
        data=data,
        project=str(tmp_path),
        name="cls",
        **{k: (False if v == "false" else v if k == "device" else int(v)) for k, v in args.items()},
    )
    expected = TASK_TRAINERS[task][1]
    assert [c.__name__ for c in seen] == [f"YoloDet{expected}"]
    assert expected in [b.__name__ for b in seen[0].__mro__]
    again = _record(tmp_path / "cls")
    assert again["status"] == "completed"
    assert again["profile"]["name"] == "repro"
    assert again["weights"]["sha256"] == cli["weights"]["sha256"]


def test_demo_data_is_refused_for_a_model_of_another_task(capsys):
    assert main(["train", "model=yolov8n-cls.yaml", "epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "demo data is for detection" in err
    assert "classify" in err
    assert len(err.strip().splitlines()) == 1


def test_classify_data_may_be_a_folder(tmp_path):
    from yolo_det.tools.prepare import prepare

    folder = make_dataset(tmp_path / "cls", "classify")
    _, args = prepare("repro", ["model=yolov8n-cls.yaml", f"data={folder}", "epochs=1"])
    assert args["data"] == str(Path(folder).resolve())


def test_trainer_class_with_a_base_keeps_it():
    from ultralytics.models.yolo.segment import SegmentationTrainer

    from yolo_det import trainer_class

    cls = trainer_class("repro", base=SegmentationTrainer)
    assert issubclass(cls, SegmentationTrainer)
    assert cls.__name__ == "YoloDetSegmentationTrainer"
    default = trainer_class("repro")
    from ultralytics.models.yolo.detect import DetectionTrainer

    assert issubclass(default, DetectionTrainer)
    assert issubclass(
        default.yolo_det_trainer_for("pose"),
        __import__("ultralytics.models.yolo.pose", fromlist=["PoseTrainer"]).PoseTrainer,
    )
