"""Worker-invariant data: Ultralytics' own dataset and loader feed the same batches for any worker count."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from yolo_det.core.errors import ConfigError, ProfileError
from yolo_det.core.profiles import load_profile
from yolo_det.core.seeding import seed_dataloader
from yolo_det.fixes import data_invariance as inv
from yolo_det.tools.data_stream import explain_data_stream, neutral_args

SEED = 3
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

HYP = {"imgsz": 64, "mosaic": 1.0, "mixup": 0.5, "fliplr": 0.5, "flipud": 0.2, "degrees": 5.0}


def _dataset(data_yaml: str | Path, task: str = "detect") -> Any:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import DEFAULT_CFG

    cfg = get_cfg(DEFAULT_CFG, {**HYP, "task": task})
    data = check_det_dataset(str(data_yaml))
    return build_yolo_dataset(cfg, data["train"], 4, data, mode="train", stride=32)


def _ultralytics_loader(dataset: Any, workers: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    from ultralytics.data import build_dataloader

    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # Ultralytics caps workers at the CPU count
    loader = build_dataloader(dataset, batch=4, workers=workers, shuffle=True, device="cpu")
    assert loader.num_workers == workers  # the count under test is the one that ran
    return loader


def _plain_loader(dataset: Any, workers: int, persistent: bool) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
        collate_fn=dataset.collate_fn,
        generator=torch.Generator(),
    )


def _epochs(loader: Any, n: int) -> list[str]:
    """One digest per epoch of ``loader``'s batches."""
    out = [inv.batch_digest(list(loader)) for _ in range(n)]
    if hasattr(loader, "reset"):
        loader.reset()  # stop Ultralytics' persistent workers
    return out


def _stream(loader: Any, *, invariant: bool, epochs: int = 2, epoch: int = 0) -> list[str]:
    seed_dataloader(loader, SEED)
    return _epochs(inv.keyed_loader(loader, SEED, epoch=epoch) if invariant else loader, epochs)


@pytest.fixture(scope="module")
def demo_yaml() -> Path:
    from yolo_det.tools.demo import demo_data_yaml

    return demo_data_yaml()


def test_detect_stream_is_the_same_for_0_1_2_and_4_workers(demo_yaml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    streams = {
        w: _stream(_ultralytics_loader(_dataset(demo_yaml), w, monkeypatch), invariant=True) for w in (0, 1, 2, 4)
    }
    assert streams[0] == streams[1] == streams[2] == streams[4]
    assert streams[0][0] != streams[0][1]  # the two epochs differ: the comparison covers changing data
    # persistent workers on and off (a plain DataLoader): the same stream again
    for persistent in (True, False):
        assert _stream(_plain_loader(_dataset(demo_yaml), 2, persistent), invariant=True) == streams[0]


def test_without_invariance_the_stream_depends_on_the_worker_count(
    demo_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = {w: _stream(_ultralytics_loader(_dataset(demo_yaml), w, monkeypatch), invariant=False) for w in (0, 2)}
    assert off[0] != off[2]
    on = _stream(_ultralytics_loader(_dataset(demo_yaml), 2, monkeypatch), invariant=True)
    assert on not in off.values()  # the keyed draws are what changed


def test_resume_at_an_epoch_boundary_with_another_worker_count(
    demo_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _stream(_ultralytics_loader(_dataset(demo_yaml), 2, monkeypatch), invariant=True, epochs=2)
    resumed = _stream(_ultralytics_loader(_dataset(demo_yaml), 0, monkeypatch), invariant=True, epochs=1, epoch=1)
    assert resumed == full[1:]
    assert resumed != full[:1]
    # set_epoch leaves the stream under way alone; the next one (Ultralytics' reset) starts at the epoch named
    like = _ultralytics_loader(_dataset(demo_yaml), 1, monkeypatch)
    seed_dataloader(like, SEED)
    loader = inv.keyed_loader(like, SEED)
    assert isinstance(loader, type(like))
    assert loader.keys.repeat
    assert (loader.batch_size, loader.drop_last, loader.sampler) == (like.batch_size, like.drop_last, like.sampler)
    assert like.iterator is None  # the loader it was built like never started
    first = next(iter(loader))  # workers started, epoch 0 under way
    loader.keys.set_epoch(1)
    rest = list(loader)[: len(loader) - 1]  # the rest of epoch 0: its stream goes on
    assert inv.batch_digest([first, *rest]) == full[0]
    loader.reset()
    assert _epochs(loader, 1) == full[1:]


def test_segment_stream_is_the_same_for_0_and_2_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.task_data import make_dataset

    data = make_dataset(tmp_path / "seg", "segment", n=12)
    streams = [_stream(_ultralytics_loader(_dataset(data, "segment"), w, monkeypatch), invariant=True) for w in (0, 2)]
    assert streams[0] == streams[1]
    off = [_stream(_ultralytics_loader(_dataset(data, "segment"), w, monkeypatch), invariant=False) for w in (0, 2)]
    assert off[0] != off[1]


def test_in_process_loading_leaves_the_random_generators_and_the_loader_it_was_built_like(
    demo_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = _dataset(demo_yaml)
    like = _ultralytics_loader(dataset, 0, monkeypatch)
    sampler_before = like.batch_sampler.sampler
    mosaic = dataset.transforms.transforms[0].transforms[0]
    assert type(mosaic).__name__ == "Mosaic"
    assert mosaic.buffer_enabled
    loader = inv.keyed_loader(like, SEED)
    assert inv.data_mode(loader) == inv.MODE_KEYED
    assert inv.data_mode(like) == inv.MODE_WORKER
    assert like.batch_sampler.sampler is sampler_before  # the loader it was built like is left as it was
    assert not mosaic.buffer_enabled

    def states() -> tuple[Any, Any, Any]:
        return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()

    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    before = states()
    next(iter(loader))
    after = states()
    assert after[0] == before[0]
    assert np.array_equal(after[1], before[1])
    assert torch.equal(after[2], before[2])
    loader.reset()
    control = _ultralytics_loader(_dataset(demo_yaml), 0, monkeypatch)
    next(iter(control))  # control: Ultralytics' own loading draws from the process generators
    assert random.getstate() != before[0]
    control.reset()


def test_loaders_it_cannot_key_are_refused_with_one_line() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(8))
    with pytest.raises(ConfigError, match="batch sampler"):
        inv.keyed_loader(torch.utils.data.DataLoader(data, batch_size=None), 0)

    class NotALoader:  # batches, but not a DataLoader: nothing to build like it
        def __init__(self, loader: torch.utils.data.DataLoader) -> None:
            self.dataset, self.sampler, self.batch_size, self.drop_last = data, loader.sampler, 2, False

    with pytest.raises(ConfigError, match="torch DataLoader"):
        inv.keyed_loader(NotALoader(torch.utils.data.DataLoader(data, batch_size=2)), 0)
    assert "__getitems__" not in vars(data)

    class OwnItems(torch.utils.data.TensorDataset):
        def __getitems__(self, indices: list[int]) -> list[Any]:
            return [self[i] for i in indices]

    with pytest.raises(ConfigError, match="has one of its own"):
        inv.keyed_loader(torch.utils.data.DataLoader(OwnItems(torch.arange(8)), batch_size=2), 0)

    class Started(torch.utils.data.DataLoader):  # a DataLoader that starts its iterator when built
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.iterator = super().__iter__()

    like = Started(data, batch_size=2)
    started = inv.keyed_loader(like, 0)  # built over the keyed sampler: its iterator draws keyed batches at once
    assert isinstance(started, Started)
    assert not started.keys.repeat
    assert inv.data_mode(started) == inv.MODE_KEYED
    assert next(started.iterator)[0].tolist() == [0, 1]
    assert "__getitems__" in vars(data)
    assert [b[0].tolist() for b in started] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_sample_seeds_depend_on_every_part_of_the_key() -> None:
    base = inv.sample_seeds(0, 0, 0)
    assert inv.sample_seeds(0, 0, 0)[0] == base[0]
    assert len({inv.sample_seeds(*k)[0] for k in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1))}) == 4
    with pytest.raises(ValueError, match="index"):
        inv.sample_seeds(0, 0, -1)


def test_the_setting_is_on_in_repro_training_only_and_checked() -> None:
    repro = load_profile("repro")
    assert repro.train.extra["data_invariance"] is True
    assert repro.val.extra["data_invariance"] is False
    assert load_profile("balanced").train.extra["data_invariance"] is False
    assert repro.train.replace(data_invariance=False).extra["data_invariance"] is False
    with pytest.raises(ProfileError, match="'data_invariance' must be true or false"):
        repro.train.replace(data_invariance="yes")


def _section(**changes: Any) -> dict[str, Any]:
    base = {
        "mode": "keyed",
        "workers": 2,
        "seed": 0,
        "dataset": "d" * 64,
        "augment": {"mosaic": 1.0},
        "fingerprint": "f" * 64,
        "fingerprint_batches": 2,
        "fingerprint_epoch": 0,
    }
    return base | changes


def test_diff_explains_a_worker_count_difference() -> None:
    from yolo_det.tools.diff import diff_records

    keyed = explain_data_stream(_section(), _section(workers=0))
    assert [(r.name, r.changes_data) for r in keyed] == [
        ("data stream: workers", False),
        ("data stream: first batches", False),
    ]
    off = explain_data_stream(
        _section(mode="worker-stream"), _section(mode="worker-stream", workers=0, fingerprint="e" * 64)
    )
    assert off[0].name == "data stream: workers"
    assert off[0].changes_data
    assert "without data_invariance" in off[0].note
    assert off[-1].name == "data stream: first batches"
    assert "workers" in off[-1].note
    reasons = {
        r.name
        for r in explain_data_stream(
            _section(), _section(seed=1, dataset="x", fingerprint="e", augment={"mosaic": 0.0})
        )
    }
    assert {
        "data stream: seed",
        "data stream: dataset",
        "data stream: mosaic=",
        "data stream: first batches",
    } <= reasons
    assert explain_data_stream(_section(), _section()) == []
    assert neutral_args(_section(), _section()) == {"workers"}
    assert explain_data_stream(None, _section())[0].changes_data

    def record(section: dict[str, Any]) -> dict[str, Any]:
        return {"status": "completed", "run": {"workers": section["workers"]}, "data_stream": section}

    report = diff_records(record(_section()), record(_section(workers=0)))
    workers = [d for d in report.differences if d.name in ("workers=", "data stream: workers")]
    assert workers
    assert not any(d.changes_bits for d in workers)
    report = diff_records(record(_section(mode="worker-stream")), record(_section(mode="worker-stream", workers=0)))
    assert any(d.name == "data stream: workers" and d.changes_bits for d in report.differences)


def _workers_trainer(workers: int) -> type:
    """Ultralytics' detection trainer without its CPU rule (``workers=0`` on a CPU), for this test only."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    class WorkersTrainer(DetectionTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.args.workers = workers

    return WorkersTrainer


@pytest.mark.slow
def test_training_gives_the_same_weights_for_0_and_2_workers(tmp_path: Path, demo_yaml: Path) -> None:
    import json

    from ultralytics import YOLO

    from yolo_det import trainer_class
    from yolo_det.core.record import RECORD_NAME

    def train(workers: int, epochs: int) -> dict[str, Any]:
        name = f"w{workers}e{epochs}"
        YOLO("yolov8n.yaml").train(
            trainer=trainer_class("repro", base=_workers_trainer(workers)),
            data=str(demo_yaml),
            project=str(tmp_path),
            name=name,
            epochs=epochs,
            imgsz=64,
            batch=16,
            device="cpu",
            workers=workers,
            close_mosaic=0,
            mosaic=1.0,
            seed=SEED,
            plots=False,
            val=False,
            exist_ok=True,
        )
        return json.loads((tmp_path / name / RECORD_NAME).read_text())

    a, b = train(0, 2), train(2, 2)
    assert (a["data_stream"]["workers"], b["data_stream"]["workers"]) == (0, 2)
    assert a["data_stream"]["mode"] == b["data_stream"]["mode"] == inv.MODE_KEYED
    assert a["data_stream"]["fingerprint"] == b["data_stream"]["fingerprint"] is not None
    assert a["data_stream"]["dataset"] == b["data_stream"]["dataset"] is not None
    assert a["weights"]["sha256"] == b["weights"]["sha256"]
    assert train(2, 1)["weights"]["sha256"] != b["weights"]["sha256"]  # the second epoch changed the weights


def _partners(dataset: Any, keys: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> dict[int, list[int]]:
    """The mix partners each sample of one batch drew (mosaic tiles and mixup partner, in order), by index."""
    mosaic, mixup = dataset.transforms.transforms[0].transforms[0], dataset.transforms.transforms[1]
    drawn: dict[int, list[int]] = {}
    current: list[int] = []
    own_item = type(dataset).__getitem__

    def item(self: Any, index: int) -> Any:
        current[:] = [int(index)]
        drawn.setdefault(int(index), [])
        return own_item(self, index)

    def spy(cls: type) -> None:
        own = cls.get_indexes

        def get_indexes(self: Any) -> Any:
            got = own(self)
            drawn[current[0]].extend(got if isinstance(got, list) else [got])
            return got

        monkeypatch.setattr(cls, "get_indexes", get_indexes)

    monkeypatch.setattr(type(dataset), "__getitem__", item)
    spy(type(mosaic))
    spy(type(mixup))
    try:
        dataset.__getitems__(keys)
    finally:
        monkeypatch.undo()
    return drawn


def test_mix_partners_are_drawn_over_the_whole_dataset_by_the_sample_s_key(
    demo_yaml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = _dataset(demo_yaml)
    mosaic, mixup = dataset.transforms.transforms[0].transforms[0], dataset.transforms.transforms[1]
    assert mosaic.buffer_enabled  # Ultralytics' own rule: partners from the worker's recent images
    inv.keyed_loader(_plain_loader(dataset, 0, False), SEED)
    assert not mosaic.buffer_enabled  # Ultralytics' rule without the buffer: uniform over the dataset
    assert "get_indexes" not in vars(mosaic)  # its own rule, unchanged
    assert "get_indexes" not in vars(mixup)
    batch = [0, 5, 9, 13, 20, 33, 41, 47]
    drawn = _partners(dataset, [(1, i) for i in batch], monkeypatch)
    assert sum(len(p) for p in drawn.values()) >= 3 * len(batch)  # mosaic (and mixup) did draw partners
    assert set().union(*drawn.values()) - set(batch)  # partners come from outside the sample's batch
    # a sample draws the same partners in any batch: they depend on (seed, epoch, index) only
    alone = _partners(dataset, [(1, 13)], monkeypatch)
    elsewhere = _partners(dataset, [(1, 2), (1, 13), (1, 30)], monkeypatch)
    assert alone[13] == elsewhere[13] == drawn[13]
    assert _partners(dataset, [(2, 13)], monkeypatch)[13] != drawn[13]  # another epoch, other partners
    # over a few epochs every image of the dataset is somebody's partner
    seen: set[int] = set()
    for epoch in range(3):
        seen |= set().union(*_partners(dataset, [(epoch, i) for i in range(len(dataset))], monkeypatch).values())
    assert seen == set(range(len(dataset)))
