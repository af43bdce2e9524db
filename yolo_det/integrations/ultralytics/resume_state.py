"""The state of an Ultralytics trainer that a bitwise resume saves at a checkpoint and puts back.

:func:`capture_state` takes what the rest of the run depends on (weights, EMA, optimizer, pending gradients,
scaler, the data loader's generator and mosaic buffer, the RNG); :func:`restore_state` loads it into the
trainer of the resumed run. The file format, its checks and its writer are :mod:`yolo_det.core.resume`'s;
when to capture and restore is :class:`~yolo_det.integrations.ultralytics.resume.UltralyticsResume`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.compat import mosaic_on, optimizer_state
from ...core.compat import world_size as trainer_world_size
from ...core.modules import unwrap_model
from ...core.resume import get_rng_state
from ..trainer_state import state_of

__all__ = ["capture_state", "restore_state"]


def _restore_buffer(dataset: Any, saved: list[int] | None) -> None:
    """Put back the dataset's mosaic buffer: the recently loaded images that mosaic draws its partners from.

    With ``workers=0`` it lives in the training process and carries over from epoch to epoch (with workers,
    each epoch's workers start from an empty one). The images are loaded again, in the saved order, which
    rebuilds the list exactly (``load_image`` appends what it loads).
    """
    buffer = getattr(dataset, "buffer", None)
    if saved is None or not isinstance(buffer, list) or not callable(getattr(dataset, "load_image", None)):
        return
    ims = getattr(dataset, "ims", None)
    if isinstance(ims, list) and getattr(dataset, "cache", None) != "ram":
        for i in buffer:
            ims[i] = None
            dataset.im_hw0[i] = dataset.im_hw[i] = None
    buffer.clear()
    for i in saved:
        dataset.load_image(i)


def _float_state(module: torch.nn.Module, *, buffers: bool | None = None) -> dict[str, torch.Tensor]:
    """The module's state dict (live tensors, the writer copies them); ``buffers`` True/False: only the
    buffers/only the parameters."""
    # keep_vars: the tensors themselves, no detach() here (under interception every torch call is dispatched
    # through a mode); the writer thread detaches and copies them.
    out = {}
    for k, v in module.state_dict(keep_vars=True).items():
        if buffers is not None:
            is_param = type(v) is torch.nn.Parameter or (
                type(v) is not torch.Tensor and isinstance(v, torch.nn.Parameter)
            )
            if is_param == buffers:
                continue
        out[k] = v
    return out


def capture_state(
    trainer: Any, epoch: int, *, seed: int, rank: int, last_opt_step: int, batches_per_epoch: int
) -> dict[str, Any]:
    """The state the rest of the run depends on (see :mod:`yolo_det.core.resume`), after ``epoch``.

    ``last_opt_step``: the iteration of the uninterrupted run's last optimizer step; ``batches_per_epoch``:
    the loader's length.
    """
    model = unwrap_model(trainer.model)
    ema, optimizer, scaler = trainer.ema, trainer.optimizer, trainer.scaler
    dataset, generator = trainer.train_loader.dataset, trainer.train_loader.generator
    layout = state_of(trainer).shards
    return {
        "epoch": epoch,
        "updates": getattr(ema, "updates", None),
        "rank": rank,
        "world_size": trainer_world_size(trainer),
        "shards": layout.shards if layout is not None else None,
        "seed": seed,
        "rng": get_rng_state(),
        "model": _float_state(model, buffers=False),
        "model_buffers": _float_state(model, buffers=True),
        "ema": _float_state(ema.ema) if ema is not None else None,
        "optimizer": optimizer_state(optimizer) if optimizer is not None else None,
        "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
        "last_opt_step": last_opt_step,
        "accumulate": trainer.accumulate,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "data": {
            "generator": generator.get_state() if isinstance(generator, torch.Generator) else None,
            "mosaic": mosaic_on(dataset),
            "buffer": [int(i) for i in buffer]
            if isinstance(buffer := getattr(dataset, "buffer", None), list)
            else None,
            "batches_per_epoch": batches_per_epoch,
        },
    }


def restore_state(trainer: Any, state: dict[str, Any]) -> torch.nn.Module:
    """Load a captured ``state`` into ``trainer`` (all but the RNG and the step counters); return its model."""
    model = unwrap_model(trainer.model)
    model.load_state_dict({**state["model"], **(state.get("model_buffers") or {})})
    ema = trainer.ema
    if ema is not None and state.get("ema") is not None:
        ema.ema.load_state_dict(state["ema"])
        ema.updates = state["updates"]
    optimizer = trainer.optimizer
    if optimizer is not None and state.get("optimizer") is not None:
        saved = state["optimizer"]
        for group, current in zip(saved["param_groups"], optimizer.param_groups):
            if "fused" in current:
                group["fused"] = current["fused"]  # the device in use picks the kernel, as Ultralytics does
        optimizer.load_state_dict(saved)
    grads = state.get("grads") or {}
    for name, p in model.named_parameters():
        if name in grads:
            p.grad = grads[name].to(device=p.device, dtype=p.dtype).clone()
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    _restore_buffer(trainer.train_loader.dataset, (state.get("data") or {}).get("buffer"))
    if state.get("accumulate") is not None:
        trainer.accumulate = int(state["accumulate"])
    return model
