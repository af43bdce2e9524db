"""Worker-invariant data: every random draw of a training sample is keyed by (seed, epoch, sample index).

Length: one mechanism: the sampler, the keyed items and the mix transforms' buffer change one loader and are undone
together.

A data loader feeds the same batches whatever its worker count when nothing a sample's augmentation draws
depends on which worker built it or what that worker built before. :func:`make_invariant` makes that so for
a map-style loader with a batch sampler (Ultralytics' ``build_dataloader``, a plain ``DataLoader``):

- **The key travels with the index.** The loader's batch sampler is wrapped (:class:`KeyedBatchSampler`, in
  the main process, where the epoch is known): it yields ``(epoch, index)`` pairs instead of indices, and
  seeds the loader's shuffle generator with :func:`~yolo_det.core.seeding.epoch_data_seed` at the start of
  every pass, so the order of epoch ``e`` depends on (seed, rank, e) only. Worker copies of the dataset
  never need to be told the epoch, which also holds with persistent workers and Ultralytics'
  ``InfiniteDataLoader``.
- **Each sample reseeds the process RNGs from its key.** The dataset gets an instance attribute
  ``__getitems__`` (the batch entry point a ``DataLoader`` calls when it exists): for each pair it seeds
  python's ``random``, numpy's global RNG and torch's CPU generator from a hash of (seed, epoch, index)
  (:func:`sample_seeds`) and calls the dataset's own ``__getitem__``. In the training process
  (``workers=0``) the three generators are put back after every batch, so the training's random streams
  are those a loader running in workers would leave.
- **Mix partners are drawn over the whole dataset.** Ultralytics draws mosaic partners from each worker's
  ``buffer`` of recently loaded images, a history that depends on the worker count. Under invariance the mix
  transforms' buffer is switched off (``buffer_enabled``), so ``Mosaic``, ``MixUp``, ``CutMix`` and
  ``CopyPaste`` draw their partners by Ultralytics' own rule without it: uniformly over the whole dataset (what
  Ultralytics itself does with ``cache=ram``), from the sample's keyed RNG. A sample's partners then depend on
  (seed, epoch, index) only: not on its batch, worker, rank or shard, and the augmentation has Ultralytics'
  distribution (the same transforms with the same probabilities, partners from a pool as wide as the dataset).

:func:`restore` undoes everything :func:`make_invariant` changed on the loader, its dataset and transforms.

YOLOv5's ``LoadImagesAndLabels`` draws its mosaic and mixup partners uniformly over the dataset (python's
``random``), never from a worker's history: keyed by the sample, those draws are worker-invariant as they are.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, get_worker_info

from ..core import compat
from ..core.errors import ConfigError
from ..core.seeding import epoch_data_seed

__all__ = [
    "MODE_KEYED",
    "MODE_WORKER",
    "BatchTap",
    "InvarianceToken",
    "KeyedBatchSampler",
    "batch_digest",
    "data_mode",
    "keyed_sampler",
    "make_invariant",
    "restore",
    "sample_seeds",
    "set_epoch",
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
    """A batch sampler that yields ``(epoch, index)`` pairs, one epoch per pass.

    Pass ``k`` after :meth:`set_epoch` ``(e)`` (or after construction with ``epoch=e``) is epoch ``e + k``.
    At the start of each pass the loader's shuffle generator is seeded with
    :func:`~yolo_det.core.seeding.epoch_data_seed` ``(seed, rank, epoch)`` (the order is the one the plugins
    give the same seed without invariance) and a sampler with ``set_epoch``
    (``DistributedSampler``) is told the epoch, so the order of an epoch never depends on earlier ones.

    Under a ``DistributedSampler`` (DDP) the ranks deal out one global order instead of the sampler's: the order a
    single process would shuffle with the same seed (rank 0's generator seed), padded as ``DistributedSampler``
    pads it. Global step ``k`` covers its ``k``-th slice of ``world x batch`` samples, and rank ``r`` takes the
    ``r``-th part: the samples of one global step with ``W`` ranks at batch ``b`` are those of one process at
    batch ``W x b`` (the last step also holds the padding's repeated samples when the dataset does not divide by
    ``W``).
    """

    def __init__(
        self, inner: Any, *, seed: int, rank: int = 0, epoch: int = 0, generator: torch.Generator | None = None
    ) -> None:
        self.inner = inner
        self.seed = int(seed)
        self.rank = max(int(rank), 0)
        self.next_epoch = int(epoch)
        self.generator = generator

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch ``epoch`` (the ones after it count on from there)."""
        self.next_epoch = int(epoch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.next_epoch
        self.next_epoch += 1
        if self.generator is not None:
            self.generator.manual_seed(epoch_data_seed(self.seed, self.rank, epoch))
            # what a DataLoader iterator started right after that seeding draws first (its workers' base seed):
            # the order is then the one yolo-det gives the same seed without invariance
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        set_sampler_epoch = getattr(getattr(self.inner, "sampler", None), "set_epoch", None)
        if callable(set_sampler_epoch):
            set_sampler_epoch(epoch)
        batches = self._global_slices(epoch) if _dealt(self.inner) else self.inner
        for batch in batches:
            yield [(epoch, int(i)) for i in batch]

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
        self.changed: dict[int, tuple[Any, bool]] = {}  # id -> (mix transform, its buffer_enabled before)
        self._walked: int | None = None

    def __call__(self, keys: Iterable[Any]) -> list[Any]:
        dataset = self.dataset
        getitem = type(dataset).__getitem__
        transforms = getattr(dataset, "transforms", None)
        if id(transforms) != self._walked:  # Ultralytics rebuilds them (close_mosaic)
            _buffer_off(transforms, self)
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


def _buffer_off(root: Any, items: _KeyedItems) -> None:
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
            items.changed.setdefault(id(obj), (obj, True))
            obj.buffer_enabled = False
        inner = getattr(obj, "transforms", None)
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
        stack.append(getattr(obj, "pre_transform", None))


@dataclass
class InvarianceToken:
    """What :func:`make_invariant` changed, for :func:`restore`."""

    loader: Any
    holder: Any  # the object whose attribute held the batch sampler (the loader, or its _RepeatSampler)
    attr: str
    original: Any
    items: _KeyedItems
    had_getitems: bool
    getitems_before: Any = None
    restored: bool = field(default=False)


def _sampler_slot(loader: Any) -> tuple[Any, str]:
    """Where the loader's batch sampler lives: ``(loader, "batch_sampler")`` or Ultralytics' repeat wrapper."""
    outer = getattr(loader, "batch_sampler", None)
    if outer is None:
        raise ConfigError(
            "data invariance needs a loader that batches with a batch sampler (batch_size set); "
            "this one yields single samples"
        )
    inner = getattr(outer, "sampler", None)
    if not isinstance(outer, (BatchSampler, KeyedBatchSampler)) and isinstance(
        inner, (BatchSampler, KeyedBatchSampler)
    ):
        return outer, "sampler"  # InfiniteDataLoader: _RepeatSampler(batch_sampler)
    return loader, "batch_sampler"


def keyed_sampler(loader: Any) -> KeyedBatchSampler | None:
    """The :class:`KeyedBatchSampler` of a loader made invariant, else None."""
    try:
        holder, attr = _sampler_slot(loader)
    except ConfigError:
        return None
    current = getattr(holder, attr, None)
    return current if isinstance(current, KeyedBatchSampler) else None


def data_mode(loader: Any) -> str:
    """:data:`MODE_KEYED` for a loader made invariant, else :data:`MODE_WORKER`."""
    return MODE_KEYED if keyed_sampler(loader) is not None else MODE_WORKER


class _LazyPasses:
    """A ``DataLoader`` iterator over ``loader`` made (its workers started) when the first batch is asked for."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self.live: Iterator[Any] | None = None

    def __iter__(self) -> _LazyPasses:
        return self

    def __next__(self) -> Any:
        if self.live is None:
            self.live = iter(DataLoader.__iter__(self.loader))
        return next(self.live)

    def _shutdown_workers(self) -> None:
        shutdown = getattr(self.live, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        self.live = None


def _drop_iterator(loader: Any) -> None:
    """Stop a loader's live iterator (its workers hold copies made before the change)."""
    live_iter = getattr(loader, "iterator", None)
    if live_iter is not None and callable(getattr(loader, "reset", None)):
        # Ultralytics' InfiniteDataLoader (8.3's makes no iterator of its own: it gets a lazy one)
        if not compat.stop_loader(loader):
            loader.iterator = _LazyPasses(loader)
    elif live_iter is not None and isinstance(loader, DataLoader):
        # YOLOv5's InfiniteDataLoader: one iterator made in __init__, no reset(); its successor is made on
        # the first batch asked for, so it sees the loader as it is then
        shutdown = getattr(live_iter, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        loader.iterator = _LazyPasses(loader)
    live = getattr(loader, "_iterator", None)
    if live is not None:  # a plain DataLoader with persistent workers
        shutdown = getattr(live, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        loader._iterator = None


def make_invariant(loader: Any, seed: int, *, rank: int = 0, epoch: int = 0) -> InvarianceToken:
    """Make ``loader``'s batches independent of its worker count (see the module docstring).

    Call it before iterating (a live iterator is stopped: its workers hold the old dataset; YOLOv5's
    ``InfiniteDataLoader``, which makes its iterator when it is built, gets a new one made at its next batch).
    The next pass over the loader is epoch ``epoch``; :func:`set_epoch` moves it (a resumed run starts at its
    epoch).

    Args:
        loader: A ``DataLoader`` (or Ultralytics' or YOLOv5's ``InfiniteDataLoader``) over a map-style dataset.
        seed: The run's seed.
        rank: The process rank (only the shuffle order of a rank depends on it, never the augmentation).
        epoch: The epoch of the next pass.

    Returns:
        A token for :func:`restore`.

    Raises:
        ConfigError: The loader has no batch sampler, is invariant already, or runs workers it cannot stop.
    """
    if keyed_sampler(loader) is not None:
        raise ConfigError("this loader is worker-invariant already; restore() it before making it invariant again")
    holder, attr = _sampler_slot(loader)
    dataset = loader.dataset
    if not hasattr(type(dataset), "__getitem__"):
        raise ConfigError(f"data invariance needs a map-style dataset (with __getitem__), got {type(dataset).__name__}")
    _drop_iterator(loader)
    if getattr(loader, "iterator", None) is not None and not isinstance(loader.iterator, _LazyPasses):
        raise ConfigError(
            "this loader's workers are already running and it has no reset(); make it worker-invariant "
            "before its first iteration"
        )
    original = getattr(holder, attr)
    generator = getattr(loader, "generator", None)
    keyed = KeyedBatchSampler(
        original,
        seed=seed,
        rank=rank,
        epoch=epoch,
        generator=generator if isinstance(generator, torch.Generator) else None,
    )
    items = _KeyedItems(dataset, seed)
    had = "__getitems__" in vars(dataset)
    before = vars(dataset).get("__getitems__")
    if holder is loader:
        object.__setattr__(loader, attr, keyed)  # DataLoader refuses to set it after construction
    else:
        setattr(holder, attr, keyed)
    dataset.__getitems__ = items
    _buffer_off(getattr(dataset, "transforms", None), items)
    items._walked = id(getattr(dataset, "transforms", None))
    return InvarianceToken(loader, holder, attr, original, items, had, before)


def set_epoch(loader: Any, epoch: int) -> bool:
    """Make the next pass of an invariant loader epoch ``epoch``; a pass already under way is dropped.

    Returns:
        True if the loader is invariant (else nothing is done).
    """
    keyed = keyed_sampler(loader)
    if keyed is None:
        return False
    _drop_iterator(loader)
    keyed.set_epoch(epoch)
    return True


def restore(token: InvarianceToken) -> None:
    """Undo :func:`make_invariant`: the batch sampler, the dataset's ``__getitems__``, the mix transforms' buffer."""
    if token.restored:
        return
    token.restored = True
    _drop_iterator(token.loader)
    if token.holder is token.loader:
        object.__setattr__(token.loader, token.attr, token.original)
    else:
        setattr(token.holder, token.attr, token.original)
    dataset = token.items.dataset
    if token.had_getitems:
        dataset.__getitems__ = token.getitems_before
    else:
        vars(dataset).pop("__getitems__", None)
    for obj, value in token.items.changed.values():
        obj.buffer_enabled = value
    token.items.changed.clear()


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

    :meth:`wrap` puts it in front of a function that receives each batch (the trainer's
    ``preprocess_batch``): it digests the batch as it arrives, before any change, then calls the function.
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

    def wrap(self, fn: Any) -> Any:
        """``fn`` with this tap in front of it."""

        def tapped(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self.feed(batch)
            return fn(batch, *args, **kwargs)

        tapped.__wrapped__ = fn  # type: ignore[attr-defined]
        tapped._yolo_det_tap = self  # type: ignore[attr-defined]
        return tapped
