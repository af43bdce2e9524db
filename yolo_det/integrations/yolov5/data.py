"""What a patched YOLOv5 run's training data depended on, and worker-invariant batches for it.

No line of the patch is needed for the data: YOLOv5's own ``on_train_epoch_start`` callback (registered by
:class:`~yolo_det.integrations.yolov5.resume.YOLOv5Resume`, every rank) calls :meth:`YOLOv5Data.epoch_start`
with ``train()``'s ``train_loader`` and ``epoch`` at the start of every epoch:

- the first time, the loader is handed to the run's session (its seeds), and under a profile with
  ``data_invariance`` (on in ``repro``) :func:`key_loader` keys every random draw of a sample (mosaic partners,
  affine, HSV, flips, mixup, copy-paste) to (seed, epoch, index): the one loader yolo-det keys after it was
  built (YOLOv5 builds it inside ``train()``, where no hook reaches);
  :func:`~yolo_det.integrations.yolov5.resume.realign_loader` then starts its iterator again, over the keyed
  sampler from this epoch on: a resumed run, with any worker count, continues the stream of the uninterrupted
  one;
- every later epoch, a keyed loader's stream goes on (its keyed sampler is told the epoch, for a new stream);
  another loader is realigned (:func:`~yolo_det.integrations.yolov5.resume.realign_loader`);
- in the run's first epoch the loader's first batches pass a :class:`~yolo_det.fixes.data_invariance.BatchTap`
  (in the training process, as YOLOv5 takes them), for the record's fingerprint.

:meth:`YOLOv5Data.section` is the record's ``data_stream`` (the keys of the Ultralytics integration's, see
:func:`yolo_det.integrations.ultralytics.data.data_stream_section`), which ``yolo-det diff`` and
``verify --against`` explain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ...core.datafp import dataset_fingerprint
from ...core.errors import ConfigError
from ...core.plain import plain_value
from ...fixes import data_invariance as _data
from .resume import realign_loader

__all__ = ["AUGMENT_HYP", "AUGMENT_OPT", "FINGERPRINT_BATCHES", "YOLOv5Data", "key_loader"]

#: YOLOv5 hyperparameters that decide what a training sample's augmentation draws.
AUGMENT_HYP = (
    "mosaic",
    "mixup",
    "copy_paste",
    "degrees",
    "translate",
    "scale",
    "shear",
    "perspective",
    "flipud",
    "fliplr",
    "hsv_h",
    "hsv_s",
    "hsv_v",
)
#: YOLOv5 options that decide what the training batches hold.
AUGMENT_OPT = ("imgsz", "img_size", "batch_size", "cache", "rect", "image_weights", "quad", "multi_scale", "single_cls")
#: Batches the fingerprint covers.
FINGERPRINT_BATCHES = 2


def key_loader(loader: Any, seed: int, *, rank: int = 0, epoch: int = 0) -> _data.KeyedBatchSampler:
    """Key YOLOv5's training loader (its ``InfiniteDataLoader``) for worker-invariant data; return the keyed sampler.

    YOLOv5 keeps the loader's batch sampler in a plain attribute of its repeat wrapper
    (``loader.batch_sampler.sampler``): the keyed sampler (a stream from ``epoch`` on) takes its place there and the
    dataset gets keyed items. The loader's running iterator still draws from the old one: start a new one
    (:func:`~yolo_det.integrations.yolov5.resume.realign_loader`) before the next batch.

    Raises:
        ConfigError: ``loader`` does not repeat its batch sampler, or its dataset cannot be keyed.
    """
    if not _data.repeats(loader):
        raise ConfigError(
            f"data invariance keys YOLOv5's InfiniteDataLoader, and this training loader is a {type(loader).__name__}; "
            "turn data_invariance off in the profile"
        )
    keys: _data.KeyedBatchSampler = _data.keyed_sampler(loader, seed, rank=rank, epoch=epoch)
    _data.key_items(loader.dataset, seed)
    loader.batch_sampler.sampler = keys
    return keys


class _TappedPasses:
    """A loader iterator whose batches pass the tap first (the tensors of each batch: images, targets, masks)."""

    def __init__(self, inner: Any, tap: _data.BatchTap) -> None:
        self.inner = inner
        self.tap = tap

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self.inner)
        if isinstance(batch, (tuple, list)):
            self.tap.feed(tuple(v for v in batch if isinstance(v, torch.Tensor)))
        else:
            self.tap.feed(batch)
        return batch

    def _shutdown_workers(self) -> None:
        shutdown = getattr(self.inner, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()


class YOLOv5Data:
    """The training loader of one YOLOv5 run: handed over once, aligned every epoch, fingerprinted.

    Args:
        session: The run's :class:`~yolo_det.session.session.DeterminismSession`.
        seed: The user's ``--seed``.
        rank: This process's rank (0 for a single process).
    """

    def __init__(self, session: Any, seed: int, rank: int = 0) -> None:
        self.session = session
        self.seed = int(seed)
        self.rank = max(int(rank), 0)
        self.loader: Any = None
        self.keys: _data.KeyedBatchSampler | None = None
        self.mode: str | None = None
        self.first_epoch: int | None = None
        self.tap = _data.BatchTap(FINGERPRINT_BATCHES)

    def epoch_start(self, loader: Any, epoch: int) -> None:
        """Align ``loader`` for ``epoch`` (called by YOLOv5's ``on_train_epoch_start``; see the module docstring)."""
        if loader is None:
            return
        if self.loader is None:
            self.loader, self.first_epoch = loader, int(epoch)
            self.session.hand_over("loader", loader)  # the run's seeds
            if self.session.profile.train.extra.get("data_invariance", False):
                seed = int(self.session.seeds()["seed"])
                self.keys = key_loader(loader, seed, rank=self.rank, epoch=int(epoch))
            self.mode = _data.MODE_KEYED if self.keys is not None else _data.MODE_WORKER
            realign_loader(loader, self.seed, self.rank, int(epoch))
        elif self.keys is not None and loader is self.loader:
            self.keys.set_epoch(int(epoch))  # the running stream goes on; a new one would start here
        else:
            realign_loader(loader, self.seed, self.rank, int(epoch))
        iterator = getattr(loader, "iterator", None)
        if loader is self.loader and self.tap.seen < self.tap.limit and iterator is not None:
            loader.iterator = _TappedPasses(iterator, self.tap)

    def close(self) -> None:
        """Take the tap away from the loader's iterator if it is still there."""
        iterator = getattr(self.loader, "iterator", None)
        if isinstance(iterator, _TappedPasses):
            self.loader.iterator = iterator.inner

    def section(self, opt: Any) -> dict[str, Any]:
        """The record's ``data_stream`` section.

        Keys: ``mode`` (``keyed`` or ``worker-stream``; None when training never started an epoch), ``workers``
        (the loader's worker count after YOLOv5's rule ``min(cpus // devices, batch, --workers)``), ``seed``,
        ``dataset`` (the training images' and labels' fingerprint, sha256), ``augment`` (the augmentation
        hyperparameters and options), ``fingerprint`` (sha256 of the first batches' tensors), ``fingerprint_batches``
        and ``fingerprint_epoch``.
        """
        loader = self.loader
        dataset = getattr(loader, "dataset", None)
        hyp = getattr(dataset, "hyp", None)
        augment = {k: plain_value(hyp[k]) for k in AUGMENT_HYP if isinstance(hyp, dict) and k in hyp}
        augment.update({k: plain_value(getattr(opt, k)) for k in AUGMENT_OPT if hasattr(opt, k)})
        return {
            "mode": self.mode,
            "workers": int(getattr(loader, "num_workers", 0)) if loader is not None else None,
            "seed": self.seed,
            "dataset": _dataset_digest(dataset),
            "augment": augment,
            "fingerprint": self.tap.digest,
            "fingerprint_batches": self.tap.seen,
            "fingerprint_epoch": self.first_epoch or 0,
        }


def _dataset_digest(dataset: Any) -> str | None:
    """The fingerprint (sha256) of a YOLOv5 dataset's images and their label files, None when it has none."""
    files = getattr(dataset, "im_files", None)
    if not isinstance(files, (list, tuple)) or not files:
        return None
    try:
        digest = dataset_fingerprint({"train": [str(f) for f in files]}).get("sha256")
    except (OSError, ValueError):  # a missing or unreadable file: the record says it is not known
        return None
    return digest if isinstance(digest, str) else None
