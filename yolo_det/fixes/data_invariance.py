"""Worker-invariant data: every random draw of a training sample is keyed by (seed, epoch, sample index).

Length: one mechanism: the keyed batch sampler, the keyed items and the mix transforms' buffer make one loader.

A data loader feeds the same batches whatever its worker count when nothing a sample's augmentation draws
depends on which worker built it or what that worker built before. :func:`keyed_loader` builds such a loader
like a map-style loader with a batch sampler (Ultralytics' ``build_dataloader``, a plain ``DataLoader``): of its
class, with its settings, over its dataset, the keys given at construction (the trainer seam builds Ultralytics'
training loader so, in ``get_dataloader``):

- **The key travels with the index.** The batch sampler (:class:`KeyedBatchSampler`, in the main process, where
  the epoch is known) yields ``(epoch, index)`` pairs instead of indices, and seeds the loader's shuffle
  generator with :func:`~yolo_det.core.seeding.epoch_data_seed` at the start of every pass, so the order of
  epoch ``e`` depends on (seed, rank, e) only. Worker copies of the dataset never need to be told the epoch,
  which also holds with persistent workers and Ultralytics' ``InfiniteDataLoader``.
- **Each sample reseeds the process RNGs from its key.** The dataset gets an instance attribute
  ``__getitems__`` (the batch entry point a ``DataLoader`` calls when it exists, :func:`key_items`): for each
  pair it seeds python's ``random``, numpy's global RNG and torch's CPU generator from a hash of (seed, epoch,
  index) (:func:`sample_seeds`) and calls the dataset's own ``__getitem__``. In the training process
  (``workers=0``) the three generators are put back after every batch, so the training's random streams
  are those a loader running in workers would leave.
- **Mix partners are drawn over the whole dataset.** Ultralytics draws mosaic partners from each worker's
  ``buffer`` of recently loaded images, a history that depends on the worker count. Under invariance the mix
  transforms' buffer is switched off (``buffer_enabled``), so ``Mosaic``, ``MixUp``, ``CutMix`` and
  ``CopyPaste`` draw their partners by Ultralytics' own rule without it: uniformly over the whole dataset (what
  Ultralytics itself does with ``cache=ram``), from the sample's keyed RNG. A sample's partners then depend on
  (seed, epoch, index) only: not on its batch, worker, rank or shard, and the augmentation has Ultralytics'
  distribution (the same transforms with the same probabilities, partners from a pool as wide as the dataset).

YOLOv5's ``LoadImagesAndLabels`` draws its mosaic and mixup partners uniformly over the dataset (python's
``random``), never from a worker's history: keyed by the sample, those draws are worker-invariant as they are.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, get_worker_info

from ..core.errors import ConfigError
from ..core.seeding import epoch_data_seed

__all__ = [
    "MODE_KEYED",
    "MODE_WORKER",
    "BatchTap",
    "KeyedBatchSampler",
    "KeyedLoader",
    "batch_digest",
    "build_keyed",
    "data_mode",
    "key_items",
    "keyed_loader",
    "keyed_sampler",
    "repeats",
    "sample_seeds",
]

#: The data-order/augmentation mode of a loader made worker-invariant.
MODE_KEYED = "keyed"
#: The mode of a loader left as the framework made it (draws depend on each worker's history).
MODE_WORKER = "worker-stream"

_PERSON = b"yolo-det/data"  # keeps these seeds apart from every other use of the run's seed
_MAX_WALK = 64  # transforms visited per dataset (Ultralytics nests a handful)


def sample_seeds(seed: int, epoch: int, index: int) -> tuple[int, int, int]:
    """The seeds of python's ``random``, numpy's global RNG and torch for one sample.

    A hash (BLAKE2b) of (seed, epoch, index): independent of the worker, the rank, the batch and everything
    loaded before.

    Returns:
        (python seed: a 128-bit int, numpy seed: a 32-bit int, torch seed: a 63-bit int).
    """
    for name, value in (("seed", seed), ("epoch", epoch), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"sample_seeds needs a non-negative integer {name}, got {value!r}")
    key = b"%d|%d|%d" % (int(seed), int(epoch), int(index))
    digest = hashlib.blake2b(key, digest_size=28, person=_PERSON).digest()
    return (
        int.from_bytes(digest[:16], "little"),
        int.from_bytes(digest[16:20], "little"),
        int.from_bytes(digest[20:28], "little") & ((1 << 63) - 1),
    )


def _seed_sample(seed: int, epoch: int, index: int) -> None:
    py_seed, np_seed, torch_seed = sample_seeds(seed, epoch, index)
    random.seed(py_seed)
    np.random.seed(np_seed)
    torch.random.default_generator.manual_seed(torch_seed)


class KeyedBatchSampler:
    """A batch sampler that yields ``(epoch, index)`` pairs: the batches of ``inner``, keyed by the epoch.

    ``len`` is the batches of one epoch; ``batch_size``, ``sampler`` and ``drop_last`` are ``inner``'s. Each
    ``iter()`` is one pass, epoch :attr:`epoch`, after which :attr:`epoch` counts on; with ``repeat`` (a loader
    that wraps its batch sampler in a repeater that asks for it once per iterator, as Ultralytics' and YOLOv5's
    ``InfiniteDataLoader`` do) each ``iter()`` is an endless stream of passes, epochs :attr:`epoch`,
    :attr:`epoch` + 1, ...: a new iterator of the loader (a reset, or batches prefetched past the end of an
    epoch and thrown away) starts again at the epoch :meth:`set_epoch` last named, and an iterator already
    running is never touched.

    At the start of each pass the loader's shuffle generator is seeded with
    :func:`~yolo_det.core.seeding.epoch_data_seed` ``(seed, rank, epoch)`` (the order is the one the plugins
    give the same seed without invariance) and a sampler with ``set_epoch`` (``DistributedSampler``) is told
    the epoch, so the order of an epoch never depends on earlier ones.

    Under a ``DistributedSampler`` (DDP) the ranks deal out one global order instead of the sampler's: the order a
    single process would shuffle with the same seed (rank 0's generator seed), padded as ``DistributedSampler``
    pads it. Global step ``k`` covers its ``k``-th slice of ``world x batch`` samples, and rank ``r`` takes the
    ``r``-th part: the samples of one global step with ``W`` ranks at batch ``b`` are those of one process at
    batch ``W x b`` (the last step also holds the padding's repeated samples when the dataset does not divide by
    ``W``).
    """

    def __init__(
        self,
        inner: Any,
        *,
        seed: int,
        rank: int = 0,
        epoch: int = 0,
        generator: torch.Generator | None = None,
        repeat: bool = False,
    ) -> None:
        self.inner = inner
        self.seed = int(seed)
        self.rank = max(int(rank), 0)
        self.epoch = int(epoch)
        self.generator = generator
        self.repeat = bool(repeat)
        self.batch_size = getattr(inner, "batch_size", None)
        self.sampler = getattr(inner, "sampler", None)
        self.drop_last = bool(getattr(inner, "drop_last", False))

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass (with ``repeat``: the first epoch of the next stream)."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.epoch
        if not self.repeat:
            self.epoch += 1
            yield from self._keyed_pass(epoch)
            return
        while True:
            yield from self._keyed_pass(epoch)
            epoch += 1

    def _keyed_pass(self, epoch: int) -> Iterator[list[tuple[int, int]]]:
        if self.generator is not None:
            self.generator.manual_seed(epoch_data_seed(self.seed, self.rank, epoch))
            # what a DataLoader iterator started right after that seeding draws first (its workers' base seed):
            # the order is then the one yolo-det gives the same seed without invariance
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        set_sampler_epoch = getattr(getattr(self.inner, "sampler", None), "set_epoch", None)
        if callable(set_sampler_epoch):
            set_sampler_epoch(epoch)
        for batch in self.batches(epoch):
            yield [(epoch, int(i)) for i in batch]

    def batches(self, epoch: int) -> Iterator[list[int]]:
        """The sample indices of each batch of epoch ``epoch`` (after the pass's seeding)."""
        return self._global_slices(epoch) if _dealt(self.inner) else iter(self.inner)

    def _global_slices(self, epoch: int) -> Iterator[list[int]]:
        """This rank's batches of epoch ``epoch`` under a ``DistributedSampler`` (see the class docstring)."""
        sampler = self.inner.sampler
        n, world, rank = len(sampler.dataset), int(sampler.num_replicas), int(sampler.rank)
        if sampler.shuffle:
            generator = torch.Generator()
            generator.manual_seed(epoch_data_seed(self.seed, 0, epoch))
            torch.empty((), dtype=torch.int64).random_(generator=generator)  # as a single process's loader draws
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = list(range(n))
        per_rank, total = int(sampler.num_samples), int(sampler.total_size)
        if total <= n:
            order = order[:total]  # the sampler's drop_last
        else:
            order = (order * -(-total // n))[:total]  # padded with the order's own first samples
        size = int(self.inner.batch_size)
        for k in range(len(self.inner)):
            part = min(size, per_rank - k * size)  # each rank's share of global step k
            start = k * size * world + rank * part
            yield order[start : start + part]


def _dealt(inner: Any) -> bool:
    """Whether ``inner`` batches a ``DistributedSampler`` with the plain rules this module deals out itself."""
    return (
        isinstance(inner, BatchSampler)
        and type(inner.sampler) is DistributedSampler
        and isinstance(inner.batch_size, int)
        and inner.batch_size > 0
    )


class _KeyedItems:
    """The dataset's ``__getitems__`` under invariance: each ``(epoch, index)`` reseeded from its key."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = int(seed)
        self._walked: int | None = None

    def __call__(self, keys: Iterable[Any]) -> list[Any]:
        dataset = self.dataset
        getitem = type(dataset).__getitem__
        transforms = getattr(dataset, "transforms", None)
        if id(transforms) != self._walked:  # Ultralytics rebuilds them (close_mosaic)
            _buffer_off(transforms)
            self._walked = id(transforms)
        # in a worker process the generators are the worker's own and reseeded per sample: nothing to keep
        saved = (
            None
            if get_worker_info() is not None
            else (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
        )
        try:
            out = []
            for key in keys:
                if isinstance(key, tuple):
                    epoch, index = key
                    _seed_sample(self.seed, epoch, index)
                    out.append(getitem(dataset, index))
                else:  # an index from another loader: the dataset as it is
                    out.append(getitem(dataset, key))
            return out
        finally:
            if saved is not None:
                random.setstate(saved[0])
                np.random.set_state(saved[1])
                torch.random.set_rng_state(saved[2])


def _buffer_off(root: Any) -> None:
    """Switch off the buffer of every mix transform under ``root``: its ``get_indexes`` then draws uniformly over
    the dataset (Ultralytics' rule without the buffer), never from what the worker loaded before."""
    stack: list[Any] = [root]
    seen: set[int] = set()
    while stack and len(seen) < _MAX_WALK:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(getattr(obj, "buffer_enabled", None), bool) and obj.buffer_enabled:
            obj.buffer_enabled = False
        inner = getattr(obj, "transforms", None)
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
        stack.append(getattr(obj, "pre_transform", None))


def key_items(dataset: Any, seed: int) -> None:
    """Give ``dataset`` the ``__getitems__`` that reseeds every ``(epoch, index)`` key (see the module docstring).

    ``__getitems__`` is the batch entry point a ``DataLoader`` calls when the dataset has one; call this before
    a loader over ``dataset`` starts its workers (they take a copy of it).

    Raises:
        ConfigError: ``dataset`` is not map-style, or has a ``__getitems__`` of its own.
    """
    if not hasattr(type(dataset), "__getitem__"):
        raise ConfigError(f"data invariance needs a map-style dataset (with __getitem__), got {type(dataset).__name__}")
    own = getattr(dataset, "__getitems__", None)
    if own is not None and not isinstance(own, _KeyedItems):
        raise ConfigError(
            f"data invariance keys each sample through the dataset's __getitems__, and {type(dataset).__name__} "
            "has one of its own; use a dataset without __getitems__ or turn data_invariance off"
        )
    items = _KeyedItems(dataset, seed)
    dataset.__getitems__ = items
    _buffer_off(getattr(dataset, "transforms", None))
    items._walked = id(getattr(dataset, "transforms", None))


class KeyedLoader:
    """The mixin of a loader built over a :class:`KeyedBatchSampler` (:func:`keyed_loader`).

    A ``DataLoader`` built from a batch sampler keeps ``batch_size=None``, ``drop_last=False`` and a
    ``SequentialSampler``; code that reads them (Ultralytics' trainer: the last batch's size, ``drop_last``,
    ``sampler.set_epoch`` under DDP) reads the keyed sampler's instead, which are those of the loader it was
    built like. :attr:`keys` is the keyed batch sampler.
    """

    keys: KeyedBatchSampler

    def __init__(self, *args: Any, keys: KeyedBatchSampler, **kwargs: Any) -> None:
        self.keys = keys
        super().__init__(*args, batch_sampler=keys, **kwargs)  # type: ignore[call-arg]

    batch_size = property(lambda self: self.keys.batch_size, lambda self, value: None)
    drop_last = property(lambda self: self.keys.drop_last, lambda self, value: None)
    sampler = property(lambda self: self.keys.sampler, lambda self, value: None)


_LOADER_CLASSES: dict[type, type] = {}
#: The settings of a ``DataLoader`` a keyed loader takes from the loader it is built like.
_SETTINGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def repeats(loader: Any) -> bool:
    """Whether ``loader`` wraps its batch sampler in a repeater (Ultralytics' and YOLOv5's ``InfiniteDataLoader``:
    ``loader.batch_sampler.sampler`` is the ``BatchSampler``)."""
    outer = getattr(loader, "batch_sampler", None)
    return not isinstance(outer, (BatchSampler, KeyedBatchSampler)) and isinstance(
        getattr(outer, "sampler", None), (BatchSampler, KeyedBatchSampler)
    )


def build_keyed(like: Any, keys: KeyedBatchSampler, *, collate_fn: Any = None) -> DataLoader[Any]:
    """A loader of ``like``'s class and settings (workers, collate, pinning, worker seeding, generator, prefetch)
    over ``like``'s dataset that batches with ``keys`` (:class:`KeyedLoader`); ``collate_fn`` replaces ``like``'s.

    ``like`` itself is left as it is. The dataset gets keyed items (:func:`key_items`).
    """
    base = type(like)
    if not isinstance(like, DataLoader):
        raise ConfigError(f"data invariance needs a torch DataLoader to build its loader like, got {base.__name__}")
    if base not in _LOADER_CLASSES:
        _LOADER_CLASSES[base] = type(
            base.__name__,
            (KeyedLoader, base),
            {"__doc__": base.__doc__, "__module__": __name__, "__qualname__": f"KeyedLoader.{base.__qualname__}"},
        )
    settings = {k: getattr(like, k) for k in _SETTINGS if hasattr(like, k)}
    if collate_fn is not None:
        settings["collate_fn"] = collate_fn
    key_items(like.dataset, keys.seed)
    loader: DataLoader[Any] = _LOADER_CLASSES[base](like.dataset, keys=keys, **settings)
    return loader


def keyed_sampler(like: Any, seed: int, *, kind: type = KeyedBatchSampler, **options: Any) -> Any:
    """A keyed batch sampler (``kind``, with ``options``: ``rank``, ``epoch``, a shard ``layout``) of ``like``'s
    batches: its sampler, batch size, ``drop_last`` and generator; a stream per iterator when ``like`` repeats.

    Raises:
        ConfigError: ``like`` yields single samples (no batch size).
    """
    if not isinstance(getattr(like, "batch_size", None), int):
        raise ConfigError(
            "data invariance needs a loader that batches with a batch sampler (batch_size set); "
            "this one yields single samples"
        )
    generator = getattr(like, "generator", None)
    return kind(
        BatchSampler(like.sampler, like.batch_size, bool(like.drop_last)),
        seed=seed,
        generator=generator if isinstance(generator, torch.Generator) else None,
        repeat=repeats(like),
        **options,
    )


def keyed_loader(like: Any, seed: int, *, rank: int = 0, epoch: int = 0) -> DataLoader[Any]:
    """A worker-invariant loader built like ``like`` (see the module docstring and :func:`build_keyed`).

    Args:
        like: A ``DataLoader`` (or Ultralytics' or YOLOv5's ``InfiniteDataLoader``) over a map-style dataset.
        seed: The run's seed.
        rank: The process rank (only the shuffle order of a rank depends on it, never the augmentation).
        epoch: The epoch of its first pass (:meth:`KeyedBatchSampler.set_epoch` moves it).

    Raises:
        ConfigError: The loader yields single samples, or its dataset cannot be keyed.
    """
    return build_keyed(like, keyed_sampler(like, seed, rank=rank, epoch=epoch))


def data_mode(loader: Any) -> str:
    """:data:`MODE_KEYED` for a keyed loader (:class:`KeyedLoader`), else :data:`MODE_WORKER`."""
    return MODE_KEYED if isinstance(loader, KeyedLoader) else MODE_WORKER


def _feed(h: Any, value: Any, name: str) -> None:
    if isinstance(value, torch.Tensor):
        arr = value.detach().cpu().contiguous().numpy()
    elif isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _feed(h, value[key], f"{name}.{key}")
        return
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in value):
        for i, v in enumerate(value):
            _feed(h, v, f"{name}[{i}]")
        return
    else:
        return
    h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
    h.update(arr.tobytes())


def batch_digest(batches: Iterable[Any]) -> str:
    """sha256 of the inputs of ``batches``: every tensor or array of each batch (a dict, tuple or tensor), in
    key order, with its dtype and shape; other values (file names, shapes as tuples) are left out."""
    h = hashlib.sha256()
    for i, batch in enumerate(batches):
        _feed(h, batch, f"b{i}")
    return h.hexdigest()


class BatchTap:
    """The fingerprint of the first ``limit`` batches a run trains on (see :func:`batch_digest`).

    :meth:`feed` it each batch as it arrives, before any change (the trainer seam's observer does, and YOLOv5's
    ``on_train_batch_start``).
    """

    def __init__(self, limit: int = 2) -> None:
        self.limit = int(limit)
        self.seen = 0
        self._hash = hashlib.sha256()

    @property
    def digest(self) -> str | None:
        """The sha256 of the batches seen, or None before the first one."""
        return self._hash.hexdigest() if self.seen else None

    def feed(self, batch: Any) -> None:
        """Digest ``batch`` if fewer than ``limit`` were seen."""
        if self.seen < self.limit:
            _feed(self._hash, batch, f"b{self.seen}")
            self.seen += 1
