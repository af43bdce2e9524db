"""Seeds: one user seed drives the process RNGs, the per-rank seeds and the data order."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from yolo_det.core.seeding import data_seed, rank_seed, seed_dataloader, seed_everything, seed_worker


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_repeats_and_differs():
    seed_everything(3)
    a = draws()
    seed_everything(3)
    assert draws() == a
    seed_everything(4)
    assert draws() != a


def test_rank_and_data_seeds():
    assert rank_seed(0, 0) == 1  # Ultralytics/YOLOv5 convention: seed + 1 + rank
    assert len({rank_seed(5, r) for r in range(8)}) == 8
    assert len({data_seed(5, r) for r in range(8)}) == 8
    assert data_seed(5, 0) != data_seed(6, 0)
    with pytest.raises(ValueError, match="non-negative integer"):
        rank_seed(-1)
    with pytest.raises(ValueError):
        data_seed(True)  # type: ignore[arg-type]


def order(loader: DataLoader) -> list[int]:
    return [int(i) for (batch,) in loader for i in batch]


def make_loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(64)), batch_size=8, shuffle=True, generator=torch.Generator())


def test_seed_dataloader_drives_shuffle_order():
    runs = {}
    for seed in (0, 0, 1):
        loader = make_loader()
        torch.manual_seed(1234 + len(runs))  # the global RNG must not matter
        assert seed_dataloader(loader, seed)
        runs.setdefault(seed, []).append(order(loader))
    assert runs[0][0] == runs[0][1]
    assert runs[0][0] != runs[1][0]
    assert sorted(runs[1][0]) == list(range(64))


def test_distributed_sampler_gets_the_same_seed_on_every_rank():
    ds = TensorDataset(torch.arange(40))
    shards = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=rank * 100)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, generator=torch.Generator())
        seed_dataloader(loader, 9, rank=rank)
        assert sampler.seed == 9
        shards.append(order(loader))
    assert sorted(shards[0] + shards[1]) == list(range(40))  # a partition: no sample twice, none missed


def test_seed_worker_follows_torch_initial_seed():
    torch.manual_seed(77)
    seed_worker(0)
    a = (random.random(), float(np.random.rand()))
    torch.manual_seed(77)
    seed_worker(0)
    assert (random.random(), float(np.random.rand())) == a


def test_seed_dataloader_without_generator_reports_nothing_to_seed():
    assert not seed_dataloader(object(), 0)
    assert not seed_dataloader(None, 0)
