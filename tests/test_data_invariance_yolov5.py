"""Worker-invariant data on YOLOv5's own loader (the installed ``yolov5`` package), as a patched ``train.py`` runs it:
the loader from ``create_dataloader`` (``InfiniteDataLoader``, mosaic and mixup on) handed to a run's session and
aligned every epoch by :class:`yolo_det.integrations.yolov5_data.YOLOv5Data`, at the loader level (no training)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from yolo_det.core.profiles import load_profile
from yolo_det.fixes import data_invariance as inv
from yolo_det.integrations.yolov5_data import YOLOv5Data
from yolo_det.session.session import DeterminismSession
from yolov5_helpers import installed_yolov5

SEED = 3
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.task_data import make_dataset

    installed_yolov5()
    root = tmp_path_factory.mktemp("yolov5-data")
    make_dataset(root, "detect", n=12)
    return root / "images"


@pytest.fixture(scope="module")
def hyp() -> dict[str, Any]:
    import yaml

    text = (installed_yolov5() / "data" / "hyps" / "hyp.scratch-low.yaml").read_text(encoding="utf-8")
    return {**yaml.safe_load(text), "mosaic": 1.0, "mixup": 0.5, "degrees": 5.0, "flipud": 0.2}


def _loader(images: Path, hyp: dict[str, Any], workers: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    from yolov5.utils.dataloaders import create_dataloader

    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # YOLOv5 caps workers at the CPU count
    loader, _ = create_dataloader(
        str(images), 64, 4, 32, hyp=hyp, augment=True, workers=workers, shuffle=True, seed=SEED, prefix=""
    )
    assert loader.num_workers == workers  # the count under test is the one that ran
    return loader


def _run(loader: Any, profile: Any, *, epochs: int = 2, start: int = 0) -> tuple[list[str], dict[str, Any], YOLOv5Data]:
    """Train-loop passes over ``loader`` as the patched train.py makes them: one digest per epoch, the section."""
    session = DeterminismSession(load_profile(profile), seed=SEED)
    session.begin()
    data = YOLOv5Data(session, SEED)
    try:
        session.enter("train")
        digests = []
        for epoch in range(start, start + epochs):
            data.epoch_start(loader, epoch)  # YOLOv5's on_train_epoch_start
            digests.append(inv.batch_digest([b[:2] for b in loader]))  # images and labels, as train() takes them
        section = data.section(None)
    finally:
        session.end()
        data.close()
    return digests, section, data


def test_yolov5_stream_is_the_same_for_0_1_2_and_4_workers(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {w: _run(_loader(images, hyp, w, monkeypatch), "repro") for w in (0, 1, 2, 4)}
    streams = {w: r[0] for w, r in runs.items()}
    assert streams[0] == streams[1] == streams[2] == streams[4]
    assert streams[0][0] != streams[0][1]  # the two epochs differ: the comparison covers changing data
    sections = {w: r[1] for w, r in runs.items()}
    assert {s["mode"] for s in sections.values()} == {inv.MODE_KEYED}
    assert [s["workers"] for s in sections.values()] == [0, 1, 2, 4]
    fingerprints = {s["fingerprint"] for s in sections.values()}
    assert len(fingerprints) == 1
    assert None not in fingerprints
    assert sections[0]["fingerprint_batches"] == 2
    assert sections[0]["augment"]["mosaic"] == 1.0


def test_without_invariance_the_yolov5_stream_depends_on_the_worker_count(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    off_profile = tmp_path / "off.yaml"
    off_profile.write_text("name: repro-worker-stream\nextends: repro\ntrain:\n  data_invariance: false\n")
    off = {w: _run(_loader(images, hyp, w, monkeypatch), off_profile) for w in (0, 2)}
    assert off[0][0] != off[2][0]
    assert off[0][1]["fingerprint"] != off[2][1]["fingerprint"]
    assert {r[1]["mode"] for r in off.values()} == {inv.MODE_WORKER}
    on = _run(_loader(images, hyp, 2, monkeypatch), "repro")[0]
    assert on not in [r[0] for r in off.values()]  # the keyed draws are what changed


def test_yolov5_resume_at_an_epoch_boundary_with_another_worker_count(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _run(_loader(images, hyp, 0, monkeypatch), "repro")[0]
    resumed, section, _ = _run(_loader(images, hyp, 2, monkeypatch), "repro", epochs=1, start=1)
    assert resumed == full[1:]
    assert resumed != full[:1]
    assert section["fingerprint_epoch"] == 1


def test_the_session_gives_yolov5s_loader_back(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = _loader(images, hyp, 1, monkeypatch)
    dataset, sampler = loader.dataset, loader.batch_sampler.sampler
    plain = inv.batch_digest([next(loader.iterator)[:2]])  # the iterator YOLOv5 made when it built the loader
    _, _, data = _run(loader, "repro", epochs=1)
    assert inv.data_mode(loader) == inv.MODE_WORKER
    assert loader.batch_sampler.sampler is sampler  # the _RepeatSampler holds YOLOv5's batch sampler again
    assert "__getitems__" not in vars(dataset)
    assert "load_image" not in vars(dataset)
    assert type(loader.iterator).__name__ == "_LazyPasses"  # workers stopped; a new pass starts when asked
    assert data.tap.seen == 2
    assert len(next(loader.iterator)[0]) == 4
    assert plain
