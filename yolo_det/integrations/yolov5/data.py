"""The training loader of a patched YOLOv5 run, built where YOLOv5 builds it, and what its data depended on.

The patched line ``train_loader, dataset = ydet.train_loader(create_dataloader)(...)`` hands the loader YOLOv5's
``create_dataloader`` built to :meth:`YOLOv5Data.build` (in ``train()``, before training starts; every rank), which
returns the loader ``train()`` trains with, built like YOLOv5's (its dataset, sampler, batch size, workers,
collate and worker seeding), with the run's seeds (the session's ``hand_over``) and the epoch the run starts at:

- under a profile with ``data_invariance`` (on in ``repro``), a keyed loader
  (:func:`~yolo_det.fixes.data_invariance.keyed_loader`, YOLOv5's ``InfiniteDataLoader`` class over a keyed batch
  sampler given at construction): every random draw of a sample (mosaic partners, affine, HSV, flips, mixup,
  copy-paste) is keyed to (seed, epoch, index), and its one stream of passes starts at the run's first epoch, so a
  resumed run, with any worker count, continues the stream of the uninterrupted one;
- else an :class:`EpochLoader`: each pass (one per epoch) a new iterator, its generator seeded first for (seed,
  rank, epoch), so an epoch's order and worker seeds depend on those only (a resumed run sees the same epochs).

Nothing is changed in a loader after it was built: YOLOv5's own loader is dropped unused. In the run's first epoch
the first batches pass a :class:`~yolo_det.fixes.data_invariance.BatchTap` as ``train()`` takes them (YOLOv5's
``on_train_batch_start`` callback, :meth:`YOLOv5Data.observe`), for the record's fingerprint.

:meth:`YOLOv5Data.section` is the record's ``data_stream`` (the keys of the Ultralytics integration's, see
:func:`yolo_det.integrations.ultralytics.data.data_stream_section`), which ``yolo-det diff`` and
``verify --against`` explain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from ...core.datafp import dataset_fingerprint
from ...core.errors import ConfigError
from ...core.plain import plain_value
from ...core.seeding import epoch_data_seed
from ...fixes import data_invariance as _data

__all__ = ["AUGMENT_HYP", "AUGMENT_OPT", "FINGERPRINT_BATCHES", "EpochLoader", "YOLOv5Data"]

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
#: What an :class:`EpochLoader` takes from YOLOv5's loader (besides its dataset and generator).
_LIKE = ("batch_size", "sampler", "drop_last", "num_workers", "collate_fn", "pin_memory", "worker_init_fn")


class EpochLoader(DataLoader[Any]):
    """YOLOv5's training loader without ``data_invariance``, built like ``like`` (YOLOv5's ``create_dataloader``
    settings: dataset, sampler, batch size, workers, pinning, collate, worker seeding, generator): every ``iter()``
    is one epoch's pass, ``epoch`` first, on a new iterator whose generator is first seeded with
    :func:`~yolo_det.core.seeding.epoch_data_seed` ``(seed, rank, epoch)``: the shuffle order and the worker seeds of
    an epoch depend on (seed, rank, epoch) only, never on the epochs before (a resumed run sees the same epochs)."""

    def __init__(self, like: Any, *, seed: int, rank: int = 0, epoch: int = 0) -> None:
        settings = {k: getattr(like, k) for k in _LIKE}
        super().__init__(like.dataset, generator=like.generator or torch.Generator(), **settings)
        self.data_seed, self.rank, self.epoch = int(seed), max(int(rank), 0), int(epoch)

    def __iter__(self) -> Any:  # a new DataLoader iterator
        self.generator.manual_seed(epoch_data_seed(self.data_seed, self.rank, self.epoch))
        self.epoch += 1
        return super().__iter__()


class YOLOv5Data:
    """The training loader of one YOLOv5 run: built once, fingerprinted as trained.

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
        self.first_epoch: int | None = None
        self.tap = _data.BatchTap(FINGERPRINT_BATCHES)

    def build(self, like: Any, epoch: int) -> DataLoader[Any]:
        """The loader ``train()`` trains with, built like YOLOv5's ``like``, its first pass epoch ``epoch`` (see the
        module docstring); ``like`` itself is left as it is.

        Raises:
            ConfigError: Under ``data_invariance``, ``like`` yields single samples or its dataset cannot be keyed.
        """
        self.session.hand_over("loader", like)  # the run's seeds
        loader: DataLoader[Any]
        if self.session.profile.train.extra.get("data_invariance", False):
            seed = int(self.session.seeds()["seed"])
            loader = _data.keyed_loader(like, seed, rank=self.rank, epoch=int(epoch))
        else:
            loader = EpochLoader(like, seed=self.seed, rank=self.rank, epoch=int(epoch))
        self.loader, self.first_epoch = loader, int(epoch)
        return loader

    def observe(self, scope: Mapping[str, Any]) -> bool:
        """Feed the tap the batch ``train()`` just took (its locals ``imgs``, ``targets`` and, when segmenting,
        ``masks``: the tensors of the batch, in the loader's order); return whether it wants more.

        Raises:
            ConfigError: ``train()``'s ``train_loader`` is not the loader :meth:`build` built (a tree patched by an
                earlier yolo-det, without the ``train_loader`` line).
        """
        if scope.get("train_loader") is not self.loader:
            raise ConfigError(
                "train() trains on a loader yolo-det did not build (a tree patched by an earlier yolo-det); "
                "patch it again: yolo-det patch-yolov5 DIR"
            )
        batch = tuple(scope[k] for k in ("imgs", "targets", "masks") if isinstance(scope.get(k), torch.Tensor))
        if batch:  # else the record says no batch was fingerprinted
            self.tap.feed(batch)
        return self.tap.seen < self.tap.limit

    def section(self, opt: Any) -> dict[str, Any]:
        """The record's ``data_stream`` section.

        Keys: ``mode`` (``keyed`` or ``worker-stream``; None when no training loader was built), ``workers``
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
            "mode": _data.data_mode(loader) if loader is not None else None,
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
