"""Worker-invariant data on YOLOv5's own loader (the installed ``yolov5`` package), as a patched ``train.py`` runs it:
the loader ``create_dataloader`` built (``InfiniteDataLoader``, mosaic and mixup on) handed to
:meth:`yolo_det.integrations.yolov5.data.YOLOv5Data.build`, which builds the loader training takes its batches
from, at the loader level (no training)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from yolo_det.core.profiles import load_profile
from yolo_det.fixes import data_invariance as inv
from yolo_det.integrations.yolov5.data import EpochLoader, YOLOv5Data
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


def _run(like: Any, profile: Any, *, epochs: int = 2, start: int = 0) -> tuple[list[str], dict[str, Any], YOLOv5Data]:
    """Train-loop passes as the patched train.py makes them over the loader built from YOLOv5's ``like``: one digest
    per epoch (images and labels, as train() takes them), the section."""
    session = DeterminismSession(load_profile(profile), seed=SEED)
    session.begin()
    data = YOLOv5Data(session, SEED)
    try:
        session.enter("train")
        loader = data.build(like, start)  # the patched train_loader line
        digests = []
        for _ in range(epochs):
            batches = []
            for imgs, targets, paths, _shapes in loader:
                scope = {"train_loader": loader, "imgs": imgs, "targets": targets, "paths": paths}
                data.observe(scope)  # train()'s locals, from YOLOv5's on_train_batch_start
                batches.append((imgs, targets))
            digests.append(inv.batch_digest(batches))
        section = data.section(None)
    finally:
        session.end()
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
    assert isinstance(off[2][2].loader, EpochLoader)
    # each epoch depends on (seed, rank, epoch) only: a run resumed at epoch 1 (same worker count) sees its batches
    assert _run(_loader(images, hyp, 2, monkeypatch), off_profile, epochs=1, start=1)[0] == off[2][0][1:]
    assert off[2][0][0] != off[2][0][1]
    on = _run(_loader(images, hyp, 2, monkeypatch), "repro")[0]
    assert on not in [r[0] for r in off.values()]  # the keyed draws are what changed


def test_segment_trains_on_a_keyed_loader_too(
    hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """segment/train.py's patched line builds its loader the same way: masks included, any worker count."""
    from yolov5.utils.segment.dataloaders import create_dataloader

    from tests.task_data import make_dataset

    make_dataset(tmp_path, "segment", n=8)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    streams = []
    for workers in (0, 2):
        like, _ = create_dataloader(
            str(tmp_path / "images"), 64, 4, 32, hyp=hyp, augment=True, workers=workers, shuffle=True, seed=SEED,
            prefix="", overlap_mask=True, mask_downsample_ratio=4,
        )  # fmt: skip
        session = DeterminismSession(load_profile("repro"), seed=SEED)
        with session.run():
            session.enter("train")
            loader = YOLOv5Data(session, SEED).build(like, 0)
            assert loader.num_workers == workers
            streams.append([inv.batch_digest([(b[0], b[1], b[4]) for b in loader]) for _ in range(2)])
    assert streams[0] == streams[1]
    assert streams[0][0] != streams[0][1]


def test_yolov5_resume_at_an_epoch_boundary_with_another_worker_count(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _run(_loader(images, hyp, 0, monkeypatch), "repro")[0]
    resumed, section, _ = _run(_loader(images, hyp, 2, monkeypatch), "repro", epochs=1, start=1)
    assert resumed == full[1:]
    assert resumed != full[:1]
    assert section["fingerprint_epoch"] == 1


def test_the_keyed_loader_is_built_like_yolov5s_and_streams_on(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    like = _loader(images, hyp, 1, monkeypatch)
    outer, sampler = like.batch_sampler, like.batch_sampler.sampler
    plain = inv.batch_digest([next(like.iterator)[:2]])  # the iterator YOLOv5 made when it built its loader
    digests, _, data = _run(like, "repro", epochs=2)
    loader = data.loader
    assert loader is not like
    assert isinstance(loader, type(like))  # YOLOv5's InfiniteDataLoader, built over the keyed sampler
    assert (like.batch_sampler, like.batch_sampler.sampler) == (outer, sampler)  # YOLOv5's loader left as it was
    keys = loader.keys
    assert loader.batch_sampler.sampler is keys
    assert isinstance(keys, inv.KeyedBatchSampler)
    assert keys.repeat
    assert keys.inner.sampler is like.sampler  # YOLOv5's sampler, keyed
    assert (loader.num_workers, loader.collate_fn, loader.generator) == (1, like.collate_fn, like.generator)
    assert "__getitems__" in vars(like.dataset)
    assert "load_image" not in vars(like.dataset)
    assert data.tap.seen == 2
    assert digests[0] != digests[1]
    # one stream from the first epoch on: never told the epoch, it goes on into epoch 2
    third = inv.batch_digest([next(loader.iterator)[:2] for _ in range(len(loader))])
    assert third == _run(_loader(images, hyp, 0, monkeypatch), "repro", epochs=1, start=2)[0][0]
    assert third != plain


_RANK_DRIVER = """
import hashlib, json, sys
import torch
import torch.distributed as dist
import yaml
from yolov5.utils.dataloaders import InfiniteDataLoader, LoadImagesAndLabels
from yolo_det.fixes.data_invariance import keyed_loader

rank, store, images, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
hyp = json.loads(sys.argv[5])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
dataset = LoadImagesAndLabels(images, 64, 2, augment=True, hyp=hyp, stride=32, prefix="")
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)  # rank and world from gloo
loader = InfiniteDataLoader(dataset, batch_size=2, sampler=sampler, num_workers=rank,
                            collate_fn=LoadImagesAndLabels.collate_fn, generator=torch.Generator())
loader = keyed_loader(loader, SEED, rank=rank)  # what a run's YOLOv5Data.build gives under data_invariance
steps = [SAMPLES(b) for _ in range(2) for b in loader]
dist.barrier()
dist.destroy_process_group()
json.dump(steps, open(out, "w"))
"""


def _samples(batch: Any) -> list[str]:
    """A digest per sample of a YOLOv5 batch (its image and its label rows), sorted: the batch as a set."""
    import hashlib

    imgs, targets = batch[0], batch[1]
    out = []
    for i in range(imgs.shape[0]):
        h = hashlib.sha256(imgs[i].numpy().tobytes())
        h.update(targets[targets[:, 0] == i][:, 1:].numpy().tobytes())
        out.append(h.hexdigest())
    return sorted(out)


@pytest.mark.slow
def test_two_gloo_ranks_train_each_global_step_on_one_process_samples(
    images: Path, hyp: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import inspect
    import json
    import subprocess
    import sys
    import textwrap

    from helpers import subprocess_env

    one = inv.keyed_loader(_loader(images, hyp, 0, monkeypatch), SEED)  # 1 process at the global batch (4)
    reference = [_samples(b) for _ in range(2) for b in one]
    driver = tmp_path / "rank.py"
    helper = textwrap.dedent(inspect.getsource(_samples)).replace(
        "def _samples(batch: Any) -> list[str]:", "def SAMPLES(batch):"
    )
    driver.write_text(helper + _RANK_DRIVER.replace("SEED", str(SEED)))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(driver),
                str(r),
                str(tmp_path / "store"),
                str(images),
                str(tmp_path / f"{r}.json"),
                json.dumps(hyp),
            ],
            env=subprocess_env({"OMP_NUM_THREADS": "1"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)  # rank 1 builds its batches in a worker process, rank 0 in its own
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(reference) == 6  # 12 images: 3 global steps of 4, 2 epochs
    for step, (a, b) in enumerate(zip(*ranks, strict=True)):
        assert sorted(a + b) == reference[step], step  # the same samples, augmented the same way
        assert a != b
    assert reference[0] != reference[3]  # epochs are reshuffled: the comparison covers changing data


def _index_steps(n: int, world: int, batch: int, *, invariant: bool, sampler_seed: int = 0) -> list[list[list[int]]]:
    """Per rank, the indices of each step of 2 epochs (a rank's sampler built with explicit world and rank)."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    out = []
    for rank in range(world):
        data = TensorDataset(torch.arange(n))
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=sampler_seed)
        loader = (
            DataLoader(data, batch_size=batch, shuffle=True, generator=torch.Generator())
            if world == 1
            else DataLoader(data, batch_size=batch, sampler=sampler, generator=torch.Generator())
        )
        loader.generator.manual_seed(SEED)
        if invariant:
            loader = inv.keyed_loader(loader, SEED, rank=rank)
        steps = []
        for epoch in range(2):
            if not invariant and world > 1:
                sampler.set_epoch(epoch)
            steps.extend(b[0].tolist() for b in loader)
        out.append(steps)
    return out


def test_ddp_ranks_deal_out_one_process_order() -> None:
    (one,) = _index_steps(12, 1, 4, invariant=True)
    two = _index_steps(12, 2, 2, invariant=True)
    assert [sorted(a + b) for a, b in zip(*two, strict=True)] == [sorted(s) for s in one]
    assert one[0] != one[3]  # the second epoch is shuffled anew
    assert _index_steps(12, 2, 2, invariant=True, sampler_seed=99) == two  # the run's seed decides, not the sampler's
    off = _index_steps(12, 2, 2, invariant=False)
    assert [sorted(a + b) for a, b in zip(*off, strict=True)] != [sorted(s) for s in one]
    # 11 samples: the last global step holds the one process's last 3 and one repeated sample (the padding)
    (one,) = _index_steps(11, 1, 4, invariant=True)
    a, b = _index_steps(11, 2, 2, invariant=True)
    assert [sorted(x + y) for x, y in zip(a[:2], b[:2], strict=True)] == [sorted(s) for s in one[:2]]
    last = sorted(a[2] + b[2])
    assert len(last) == 4
    assert set(one[2]) <= set(last)
    assert len(a) == len(b) == 6
