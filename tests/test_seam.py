"""The trainer seam: yolo-det's methods of the trainer class, composed with Ultralytics' trainers or the user's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import small_train
from yolo_det import trainer_class
from yolo_det.core.errors import ConfigError
from yolo_det.core.record import RECORD_NAME
from yolo_det.fixes.shards import ShardedBatch
from yolo_det.integrations.trainer_state import state_of
from yolo_det.integrations.ultralytics.launcher import LAUNCHER_METHODS
from yolo_det.integrations.ultralytics.seam import (
    SEAM_FIX,
    SEAM_METHODS,
    BatchObserver,
    SeamTrainer,
    has_seam,
    observe,
    seam_trainer,
    unobserve,
)

SMALL = small_train(imgsz=32, batch=8, nbs=8, fraction=0.25, val=False)


class _Log(BatchObserver):
    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self.name = name
        self.log = log

    def before_batch(self, trainer: Any, batch: Any) -> None:
        self.log.append((self.name, "before", batch["img"].dtype))

    def after_batch(self, trainer: Any, batch: Any) -> None:
        self.log.append((self.name, "after", batch["img"].dtype))


def _trainer(cls: type, tmp_path: Path, demo_data: str) -> Any:
    return cls(overrides={"model": "yolov8n.yaml", "data": demo_data, "project": str(tmp_path), "name": "t", **SMALL})


def _batch() -> dict[str, Any]:
    return {"img": torch.zeros((2, 3, 32, 32), dtype=torch.uint8), "im_file": ["a.jpg", "b.jpg"]}


def test_the_seam_runs_its_observers_in_order_around_the_trainers_own_preprocess(tmp_path, demo_data):
    from ultralytics.models.yolo.detect import DetectionTrainer

    cls = seam_trainer(DetectionTrainer)
    assert issubclass(cls, DetectionTrainer)
    assert cls.__mro__[1] is SeamTrainer
    assert seam_trainer(cls) is cls
    assert seam_trainer(DetectionTrainer) is cls
    trainer = _trainer(cls, tmp_path, demo_data)
    assert has_seam(trainer)
    assert "preprocess_batch" not in vars(trainer)
    log: list[tuple[str, str, Any]] = []
    first, second = _Log("first", log), _Log("second", log)
    observe(trainer, first, "a test")
    observe(trainer, second, "a test")
    observe(trainer, first, "a test")  # once
    out = trainer.preprocess_batch(_batch())
    assert out["img"].dtype == torch.float32  # DetectionTrainer's own preprocessing ran
    assert log == [
        ("first", "before", torch.uint8),
        ("second", "before", torch.uint8),
        ("first", "after", torch.float32),
        ("second", "after", torch.float32),
    ]
    unobserve(trainer, first)
    log.clear()
    trainer.preprocess_batch(_batch())
    assert [name for name, _, _ in log] == ["second", "second"]
    assert state_of(trainer).observers == [second]


def test_the_seam_preprocesses_a_sharded_step_shard_by_shard(tmp_path, demo_data):
    from ultralytics.models.yolo.detect import DetectionTrainer

    trainer = _trainer(seam_trainer(DetectionTrainer), tmp_path, demo_data)
    out = trainer.preprocess_batch(ShardedBatch([_batch(), _batch()]))
    assert isinstance(out, ShardedBatch)
    assert len(out.shards) == 2
    assert all(s["img"].dtype == torch.float32 for s in out.shards)
    plain = DetectionTrainer.preprocess_batch(trainer, _batch())  # without the seam a sharded step is not known
    assert plain["img"].dtype == torch.float32


def test_an_observer_on_a_trainer_without_the_seam_is_refused_in_one_line(tmp_path, demo_data):
    from ultralytics.models.yolo.detect import DetectionTrainer

    trainer = _trainer(DetectionTrainer, tmp_path, demo_data)
    with pytest.raises(ConfigError) as e:
        observe(trainer, BatchObserver(), "the op trace")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("the op trace needs yolo-det's trainer seam")
    assert SEAM_FIX in message
    assert state_of(trainer).observers == []


@pytest.mark.parametrize(("profile", "keyed"), [("repro", True), ("balanced", False)])
def test_the_seam_builds_the_training_loader_keyed_where_ultralytics_builds_it(tmp_path, demo_data, profile, keyed):
    from ultralytics.data.build import InfiniteDataLoader

    from yolo_det.fixes import data_invariance as inv

    trainer = _trainer(trainer_class(profile), tmp_path, demo_data)  # the run begins: the train phase is entered
    try:
        trainer.setup_model()  # the dataset's stride comes from the model, as in Ultralytics' _setup_train
        train = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
        val = trainer.get_dataloader(trainer.data["val"], batch_size=4, rank=-1, mode="val")
        assert isinstance(train, InfiniteDataLoader)  # Ultralytics' own class: its reset() and close() stay
        assert isinstance(train, inv.KeyedLoader) is keyed
        assert not isinstance(val, inv.KeyedLoader)  # validation batches are Ultralytics' as they are
        assert (train.batch_size, train.drop_last) == (4, False)  # what Ultralytics reads after building it
        assert len(train) == -(-len(train.dataset) // 4)
        if keyed:
            assert train.keys.repeat
            assert train.keys.epoch == 0  # the trainer's start epoch; told each epoch as it starts
            assert train.iterator is None  # nothing iterated before training asks
    finally:
        trainer.yolo_det.end_run()


def _user_trainer() -> type:
    from ultralytics.models.yolo.detect import DetectionTrainer

    class UserTrainer(DetectionTrainer):
        """A user's trainer: its own callback and its own ``get_dataloader``."""

        loaders: list[str] = []
        epochs_seen: list[int] = []

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.add_callback("on_train_epoch_end", lambda t: UserTrainer.epochs_seen.append(int(t.epoch)))

        def get_dataloader(self, dataset_path: str, batch_size: int = 16, rank: int = 0, mode: str = "train") -> Any:
            UserTrainer.loaders.append(mode)
            return super().get_dataloader(dataset_path, batch_size=batch_size, rank=rank, mode=mode)

    return UserTrainer


@pytest.mark.slow
def test_a_user_trainer_with_its_own_callbacks_and_loader_trains_bitwise_through_the_seam(tmp_path, demo_data):
    from ultralytics import YOLO

    user = _user_trainer()
    digests = {}
    for name, seed in (("a", 1), ("b", 1), ("other-seed", 2)):
        user.loaders.clear()
        user.epochs_seen.clear()
        YOLO("yolov8n.yaml").train(
            trainer=trainer_class("repro", base=user),
            data=demo_data,
            project=str(tmp_path),
            name=name,
            seed=seed,
            **small_train(imgsz=32, batch=8, nbs=8, fraction=0.25, val=False, epochs=2),
        )
        assert user.loaders[0] == "train"
        assert user.epochs_seen == [0, 1]
        record = json.loads((tmp_path / name / RECORD_NAME).read_text())
        assert record["status"] == "completed"
        assert record["trainer_seam"] == {"in_force": True, "off": []}
        flags = record["guarantees"]["flags"]
        assert flags["in_force"] is True
        assert flags["steps"] >= 2
        assert record["guarantees"]["data_invariance"] == {"in_force": True, "loader": "keyed"}
        assert record["data_stream"]["mode"] == "keyed"
        assert record["data_stream"]["fingerprint"]
        digests[name] = record["weights"]["sha256"]
    assert digests["a"] == digests["b"]
    assert digests["other-seed"] != digests["a"]


@pytest.mark.parametrize("method", SEAM_METHODS + LAUNCHER_METHODS)
def test_a_trainer_method_yolo_det_extends_missing_is_refused_at_start(method, monkeypatch, tmp_path, demo_data):
    from ultralytics import YOLO
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolo_det import attach
    from yolo_det.core.compat import MissingContact, ultralytics_version
    from yolo_det.integrations.ultralytics import seam

    monkeypatch.setattr(seam, "_MADE", {})  # the classes composed before the release "lost" the method
    for cls in DetectionTrainer.__mro__:  # as a release without it: gone from the real classes
        if method in vars(cls):
            monkeypatch.delattr(cls, method)
    with pytest.raises(MissingContact) as e:
        trainer_class("repro")
    message = str(e.value)
    assert "\n" not in message
    assert f"has no method {method}" in message
    assert f"Ultralytics {ultralytics_version()}" in message
    model = YOLO("yolov8n.yaml")
    attach(model, "repro")
    with pytest.raises(MissingContact, match=f"has no method {method}"):
        model.train(data=demo_data, project=str(tmp_path), name="refused", **SMALL)
    assert not (tmp_path / "refused").exists()  # refused before the trainer was built: no run, no record


@pytest.mark.slow
def test_a_flag_turned_during_the_run_is_one_line_at_the_end_and_in_the_record(tmp_path, demo_data, capfd):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_batch_end", lambda t: torch.use_deterministic_algorithms(False))  # a library's
    before = torch.are_deterministic_algorithms_enabled()
    capfd.readouterr()
    model.train(
        trainer=trainer_class("repro"),
        data=demo_data,
        project=str(tmp_path),
        name="turned",
        seed=1,
        **small_train(imgsz=32, batch=8, nbs=8, fraction=0.25, val=False, epochs=2),
    )
    assert torch.are_deterministic_algorithms_enabled() is before  # the state before the run, restored
    flags = json.loads((tmp_path / "turned" / RECORD_NAME).read_text())["guarantees"]["flags"]
    assert flags["in_force"] is False
    assert 1 <= flags["steps_off"] < flags["steps"]  # the first step ran as set, the ones after the callback did not
    assert flags["differing"]["deterministic_algorithms"] == ["strict", "off"]
    lines = [line for line in capfd.readouterr().err.splitlines() if "guarantees did not all hold" in line]
    assert len(lines) == 1
    assert "optimizer steps ran with deterministic_algorithms=" in lines[0]


def test_an_attribute_a_guarantee_rests_on_missing_is_one_line_naming_it_and_the_release(tmp_path, demo_data):
    from ultralytics.models.yolo.detect import DetectionTrainer

    from yolo_det.core.compat import MissingContact, contact, ultralytics_version

    trainer = _trainer(DetectionTrainer, tmp_path, demo_data)
    assert contact(trainer, "start_epoch", "resume") == 0  # control: the real trainer has it
    del trainer.start_epoch  # as a release that renamed it
    with pytest.raises(MissingContact) as e:
        contact(trainer, "start_epoch", "the data stream of a resumed run")
    message = str(e.value)
    assert "\n" not in message
    assert f"DetectionTrainer of Ultralytics {ultralytics_version()} has no attribute start_epoch" in message
    assert "the data stream of a resumed run" in message


@pytest.mark.slow
def test_a_run_whose_loader_is_not_where_yolo_det_reads_it_fails_at_start_never_completes_keyless(tmp_path, demo_data):
    from ultralytics import YOLO

    from yolo_det.core.compat import MissingContact

    model = YOLO("yolov8n.yaml")
    # before the plugin's own callback: the trainer as a release that keeps its loader under another name
    model.callbacks["on_pretrain_routine_end"].insert(0, lambda t: setattr(t, "loader", vars(t).pop("train_loader")))
    with pytest.raises(MissingContact, match="has no attribute train_loader, which yolo-det reads for data_invari"):
        model.train(trainer=trainer_class("repro"), data=demo_data, project=str(tmp_path), name="renamed", **SMALL)
    record = json.loads((tmp_path / "renamed" / RECORD_NAME).read_text())
    assert record["status"] == "failed"  # never a completed run that claims keyed data
    assert record["error"]["type"] == "MissingContact"
    assert "train_loader" in record["error"]["message"]
