"""``batch_invariant``: an image's detections do not depend on the other images of its batch.

Two things make a detector's output for one image depend on its batch, and this extension removes both:

- **Letterbox shared by the batch.** Ultralytics' predictor pads every image of a batch to the batch's
  shape (rectangular letterbox only when all images have one shape, square otherwise), and its rectangular
  validation loader gives each batch the shape of its widest image. Under the setting every image is
  letterboxed on its own, to the square ``imgsz`` of the run, whatever else is in the batch.
- **Kernels chosen by the batch.** cuDNN and cuBLAS pick algorithms by the whole input's shape, so the
  same image can take another kernel in a batch of 2 than in a batch of 16; on the CPU, oneDNN's
  convolutions may split their work by the batch when more than one thread runs. Under the setting the network
  runs one image at a time (a fixed internal batch of 1), each on a fresh, contiguous copy of its input,
  and the outputs are concatenated: the result for an image is the result of a batch of one.

:class:`BatchInvariance` (an extension the plugin registers with
:func:`~yolo_det.session.extensions.register_extension`) applies it to the objects the plugin hands
over (:meth:`DeterminismSession.hand_over`): ``"predictor"`` (an Ultralytics ``BasePredictor``: its
``pre_transform`` and ``inference``, set on the instance and taken away again on undo) and ``"validator"``
(an Ultralytics ``BaseValidator``: its ``dataloader`` is replaced, for the phase, by one over the same
images, letterboxed each on its own and loaded one at a time; the metrics are those of the same images
whatever ``batch=`` says). Nothing process-wide is changed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...session.extensions import Extension, PhaseContext

__all__ = ["MARK", "BatchInvariance", "concat_outputs", "per_image", "per_image_loader", "square_letterbox"]

#: Set on an object while batch invariance is applied to it.
MARK = "_yolo_det_batch_invariant"


def concat_outputs(parts: Sequence[Any]) -> Any:
    """Join the outputs of single-image forwards along the batch dimension.

    Tensors and arrays are concatenated; tuples, lists and dicts are joined item by item; anything else
    (None, numbers) is taken from the first part.
    """
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts), 0) if first.dim() else first
    if isinstance(first, np.ndarray):
        return np.concatenate(list(parts), 0) if first.ndim else first
    if isinstance(first, dict):
        return type(first)((k, concat_outputs([p[k] for p in parts])) for k in first)
    if isinstance(first, (list, tuple)):
        joined = [concat_outputs([p[i] for p in parts]) for i in range(len(first))]
        return type(first)(joined) if isinstance(first, list) else tuple(joined)
    return first


def per_image(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward(x, ...)`` run one image at a time: each ``x[i:i+1]`` as a fresh contiguous tensor.

    The result for image ``i`` is the result of a batch holding only that image, whatever the batch size
    and whatever the other images are.
    """

    def run(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] <= 1:
            return forward(x, *args, **kwargs)
        return concat_outputs(
            [
                forward(x[i : i + 1].clone(memory_format=torch.contiguous_format), *args, **kwargs)
                for i in range(x.shape[0])
            ]
        )

    run.__wrapped__ = forward  # type: ignore[attr-defined]
    return run


def square_letterbox(predictor: Any) -> Callable[[list[np.ndarray]], list[Any]]:
    """The predictor's pre-transform with every image letterboxed on its own to the square ``imgsz``."""
    from ...core.compat import LetterBox

    def pre_transform(images: list[np.ndarray]) -> list[Any]:
        box = LetterBox(
            predictor.imgsz,
            auto=False,
            scale_fill=bool(getattr(predictor, "scale_fill", False)),
            stride=predictor.model.stride,
        )
        return [box(image=im) for im in images]

    return pre_transform


def per_image_loader(loader: Any) -> Any:
    """A loader over the same images as ``loader``, letterboxed each on its own, one image per batch."""
    dataset = loader.dataset
    if getattr(dataset, "rect", False):
        dataset = copy.copy(dataset)  # the same files and labels; only the shared batch shapes are dropped
        dataset.rect = False
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=1,
        shuffle=False,
        num_workers=int(getattr(loader, "num_workers", 0) or 0),
        pin_memory=bool(getattr(loader, "pin_memory", False)),
        collate_fn=getattr(loader, "collate_fn", None) or getattr(dataset, "collate_fn", None),
    )


class BatchInvariance(Extension):
    """Applies ``batch_invariant: true`` to a handed-over predictor or validator; undo puts back what it had.

    ``hand_over(ctx, "predictor", predictor)`` sets ``pre_transform`` (per-image square letterbox) and
    ``inference`` (one image at a time) on the instance; ``hand_over(ctx, "validator", validator)`` replaces
    its ``dataloader`` (per-image letterbox, batches of one). Handing the same object over again while it
    is in force does nothing.
    """

    name = "batch_invariant"

    def hand_over(self, ctx: PhaseContext, what: str, obj: Any, **options: Any) -> Any:
        if what not in {"predictor", "validator"} or not ctx.settings.extra.get("batch_invariant", False):
            return None
        if obj is None or obj.__dict__.get(MARK):
            return None
        names: tuple[str, ...]
        if what == "predictor":
            names = ("pre_transform", "inference")
            before = {n: obj.__dict__[n] for n in names if n in obj.__dict__}
            obj.pre_transform = square_letterbox(obj)
            obj.inference = per_image(before.get("inference", type(obj).inference.__get__(obj)))
        else:
            loader = getattr(obj, "dataloader", None)
            if loader is None or not hasattr(loader, "dataset"):
                return None
            names = ("dataloader",)
            before = {"dataloader": loader}
            obj.dataloader = per_image_loader(loader)
        obj.__dict__[MARK] = True
        return obj, names, before

    def undo(self, token: Any) -> None:
        obj, names, before = token
        obj.__dict__.pop(MARK, None)
        for name in names:
            if name in before:
                obj.__dict__[name] = before[name]
            else:
                obj.__dict__.pop(name, None)
