"""``shards: K`` in an Ultralytics run: the same weights on 1, 2, ... K ranks (see :mod:`yolo_det.fixes.shards`).

The trainer seam's ``get_dataloader`` calls :func:`check` and builds the training loader cut into this rank's
shards (:func:`~yolo_det.fixes.shards.sharded_loader`; an error changes nothing), then :func:`install` puts a
:class:`~yolo_det.fixes.shards.ShardedStep` in place of the trainer's model (DDP's wrapper is dropped: the step
gathers the shards itself, and every rank takes rank 0's start state once); the trainer seam's
``preprocess_batch`` preprocesses a sharded step shard by shard (:mod:`.seam`). :func:`uninstall` gives the
trainer its model back (at ``teardown``).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.compat import contact
from ...core.compat import world_size as trainer_world_size
from ...core.errors import ConfigError
from ...fixes.shards import ShardedStep, ShardLayout, broadcast_state
from ..trainer_state import state_of
from .seam import SEAM_FIX, has_seam

__all__ = ["check", "install", "uninstall"]

_REFUSED = {
    "rect": "rectangular batches are shaped per batch of one rank",
    "multi_scale": "the image size of a step is drawn from each rank's own generator",
    "compile": "a compiled model runs its forward and loss apart",
}


def check(trainer: Any, shards: int, rank: int, world: int) -> ShardLayout:
    """Refuse, in one line, what ``shards`` cannot make rank-free (a trainer without the seam included); return the
    rank's :class:`~yolo_det.fixes.shards.ShardLayout` for ``trainer``'s global batch."""
    if not has_seam(trainer):
        raise ConfigError(
            f"shards: {shards} needs yolo-det's trainer seam, and {type(trainer).__name__} was built without it; "
            f"train with {SEAM_FIX}"
        )
    for key, why in _REFUSED.items():
        value = getattr(trainer.args, key, None)  # compile: an argument of newer releases
        if value and value not in {"False", "false"}:
            raise ConfigError(f"shards: {shards} cannot train with {key}={value} ({why}); set {key}=False")
    return ShardLayout.checked(int(shards), world, rank, int(contact(trainer, "batch_size", "the shard layout")))


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
        scaler=lambda: contact(trainer, "scaler", "each shard's backward"),
        epoch=lambda: int(contact(trainer, "epoch", "the shards' random layers")),
        loss_scale=float(trainer_world_size(trainer)) if int(ULTRALYTICS_RANK) != -1 else 1.0,
    )
    if not sees_through(step, inner):
        raise ConfigError(
            f"shards needs an Ultralytics whose trainer finds its model inside a wrapper (unwrap_model; 8.3.253 and "
            f"8.4 have it, {ultralytics_version()} does not); upgrade ultralytics or remove shards from the profile"
        )
    if layout.world > 1:
        broadcast_state(inner)  # every rank starts from rank 0's weights, as DDP's constructor would give
    trainer.model = step  # DDP's wrapper (its reducer and hooks) goes with the last reference to it
    state_of(trainer).shards = layout
    return step


def uninstall(trainer: Any) -> None:
    """Give ``trainer`` its model back (no-op when :func:`install` did not run)."""
    state = state_of(trainer)
    if state.shards is None:
        return
    state.shards = None
    if isinstance(trainer.model, ShardedStep):
        trainer.model = trainer.model.module
