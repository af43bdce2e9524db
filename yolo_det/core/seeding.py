"""Seeds: the process RNGs, per-rank seeds, and the dataloader's shuffle generator and workers.

One user seed drives everything. Rank ``r`` of a run with seed ``s`` seeds python, numpy and torch
(all CUDA devices included) with ``s + 1 + r``, the convention of Ultralytics and YOLOv5, so a
single-process run seeds exactly as the plain frameworks do. The data order uses a seed that is the
same on every rank (a ``DistributedSampler`` must shuffle identically on all ranks) and the loader's
generator, which also decides the worker seeds, gets a per-rank seed derived from it.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["data_seed", "epoch_data_seed", "rank_seed", "seed_dataloader", "seed_everything", "seed_worker"]

_U64 = 1 << 64
# A fixed odd 64-bit constant that spreads small seeds over the generator's state (the value Ultralytics
# also adds to its loader seed, so plain Ultralytics and yolo-det shuffle the same way).
_DATA_SALT = 6148914691236517205
_EPOCH_STRIDE = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"a seed must be a non-negative integer, got {seed!r}")
    return seed


def rank_seed(seed: int, rank: int = 0) -> int:
    """The RNG seed of ``rank`` (0 for a single process) in a run with user seed ``seed``."""
    return (_check_seed(seed) + 1 + max(rank, 0)) % 2**32


def data_seed(seed: int, rank: int = 0) -> int:
    """The seed of rank ``rank``'s dataloader generator (shuffle order and worker seeds)."""
    return (_DATA_SALT + max(rank, 0) + _check_seed(seed)) % _U64


def epoch_data_seed(seed: int, rank: int = 0, epoch: int = 0) -> int:
    """The seed of rank ``rank``'s dataloader generator at the start of ``epoch`` (0-based).

    Epoch 0 is :func:`data_seed`; later epochs add a multiple of an odd 64-bit constant, so the data order
    (and the worker seeds) of an epoch depend on (seed, rank, epoch) only, never on earlier epochs: a
    resumed run shuffles its epochs as the uninterrupted run did.
    """
    return (data_seed(seed, rank) + max(epoch, 0) * _EPOCH_STRIDE) % _U64


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG and torch (CPU and every CUDA device) with ``seed``."""
    seed = _check_seed(seed) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for a DataLoader: seed python and numpy from the worker's torch seed.

    The worker's torch seed is ``base_seed + worker_id``, where ``base_seed`` is drawn from the loader's
    generator, so a seeded generator gives every worker the same seeds in every run.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def seed_dataloader(loader: Any, seed: int, *, rank: int = 0) -> bool:
    """Make ``loader``'s shuffle order and worker seeds a function of ``seed``.

    Sets the loader's generator to :func:`data_seed` and, for a ``DistributedSampler``, its ``seed`` to the
    user seed (identical on all ranks). Call it before the loader's first iteration.

    Returns:
        True if the loader had a generator or distributed sampler to seed.
    """
    seeded = False
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(data_seed(seed, rank))
        seeded = True
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, torch.utils.data.distributed.DistributedSampler):
        sampler.seed = _check_seed(seed)
        seeded = True
    inner = getattr(sampler, "generator", None)
    if isinstance(inner, torch.Generator) and inner is not generator:
        inner.manual_seed(data_seed(seed, rank))
        seeded = True
    return seeded
