"""``shards: K`` in an Ultralytics run: the same weights on 1, 2, ... K ranks (see :mod:`yolo_det.fixes.shards`).

The plugin calls :func:`check` before the training loader is handed over (an error changes nothing), the session
cuts the loader into shards, then :func:`install` puts a :class:`~yolo_det.fixes.shards.ShardedStep` in place of
the trainer's model (DDP's wrapper is dropped: the step gathers the shards itself, and every rank takes rank 0's
start state once) and makes ``preprocess_batch`` preprocess each shard. :func:`uninstall` gives the trainer its
model and ``preprocess_batch`` back (at ``teardown``).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.errors import ConfigError
from ...fixes.shards import ShardedBatch, ShardedStep, ShardLayout, broadcast_state

__all__ = ["ShardPreprocess", "check", "install", "layout_for", "uninstall"]

_REFUSED = {
    "rect": "rectangular batches are shaped per batch of one rank",
    "multi_scale": "the image size of a step is drawn from each rank's own generator",
    "compile": "a compiled model runs its forward and loss apart",
}


def layout_for(trainer: Any, shards: int, rank: int, world: int) -> ShardLayout:
    """The rank's :class:`~yolo_det.fixes.shards.ShardLayout` for ``trainer``'s global batch."""
    return ShardLayout.checked(int(shards), world, rank, int(getattr(trainer, "batch_size", 0) or 0))


def check(trainer: Any, shards: int, rank: int, world: int) -> ShardLayout:
    """Refuse, in one line, what ``shards`` cannot make rank-free; return the layout."""
    args = getattr(trainer, "args", None)
    for key, why in _REFUSED.items():
        value = getattr(args, key, None)
        if value and value not in {"False", "false"}:
            raise ConfigError(f"shards: {shards} cannot train with {key}={value} ({why}); set {key}=False")
    return layout_for(trainer, shards, rank, world)


class ShardPreprocess:
    """``trainer.preprocess_batch`` under ``shards``: a :class:`ShardedBatch` is preprocessed shard by shard."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.__wrapped__ = inner

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(batch, ShardedBatch):
            return ShardedBatch([self.inner(dict(shard), *args, **kwargs) for shard in batch.shards])
        return self.inner(batch, *args, **kwargs)


def install(trainer: Any, layout: ShardLayout, seed: int) -> ShardedStep:
    """Make ``trainer`` train ``layout``'s shards (see the module)."""
    from ...core.compat import ULTRALYTICS_RANK, sees_through, ultralytics_version

    current = trainer.model
    if isinstance(current, ShardedStep):
        return current
    inner = current.module if isinstance(current, torch.nn.parallel.DistributedDataParallel) else current
    step = ShardedStep(
        inner,
        layout=layout,
        seed=seed,
        scaler=lambda: getattr(trainer, "scaler", None),
        epoch=lambda: int(getattr(trainer, "epoch", 0) or 0),
        loss_scale=float(max(int(getattr(trainer, "world_size", 1) or 1), 1)) if int(ULTRALYTICS_RANK) != -1 else 1.0,
    )
    if not sees_through(step, inner):
        raise ConfigError(
            f"shards needs an Ultralytics whose trainer finds its model inside a wrapper (unwrap_model; 8.3.253 and "
            f"8.4 have it, {ultralytics_version()} does not); upgrade ultralytics or remove shards from the profile"
        )
    if layout.world > 1:
        broadcast_state(inner)  # every rank starts from rank 0's weights, as DDP's constructor would give
    trainer.model = step  # DDP's wrapper (its reducer and hooks) goes with the last reference to it
    trainer.__dict__["preprocess_batch"] = ShardPreprocess(trainer.preprocess_batch)
    trainer.__dict__["yolo_det_shards"] = layout
    return step


def uninstall(trainer: Any) -> None:
    """Give ``trainer`` its model and ``preprocess_batch`` back (no-op when :func:`install` did not run)."""
    if trainer.__dict__.pop("yolo_det_shards", None) is None:
        return
    step = getattr(trainer, "model", None)
    if isinstance(step, ShardedStep):
        trainer.model = step.module
    current = trainer.__dict__.get("preprocess_batch")
    if isinstance(current, ShardPreprocess):
        del trainer.__dict__["preprocess_batch"]
    elif current is not None and isinstance(getattr(current, "__wrapped__", None), ShardPreprocess):
        trainer.__dict__["preprocess_batch"] = current.__wrapped__.inner  # under another wrapper (a tap)
