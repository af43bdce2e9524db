"""What yolo-det keeps on an Ultralytics trainer while it trains: one documented object.

The plugin's callbacks receive the trainer, not the plugin's own bookkeeping, and code that stops a
training on purpose (``yolo-det verify --resume-at``) only has the trainer too. Everything they share lives
in one :class:`TrainerState` at ``trainer.yolo_det_state`` (:func:`state_of`), never in loose attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ATTRIBUTE", "TrainerState", "state_of"]

#: The trainer attribute holding the state.
ATTRIBUTE = "yolo_det_state"


@dataclass
class TrainerState:
    """yolo-det's state on one trainer.

    Attributes:
        identity: What the run is made from (data, start model, arguments; :func:`run_identity`), taken
            before any layer swap; merged into the record.
        swapped: The train phase's layer swaps were applied to this trainer's model.
        record_written: ``determinism.json`` was written for this run, or its failure reported: never
            written again for a later ending.
        stopped_on_purpose: The run was stopped on purpose after a saved epoch (``verify --resume-at``);
            the exception that stops it is recorded as ``interrupted``, not ``failed``.
        op_trace: What ``--trace-ops`` asked for and traced so far (the tracer's ``summary``), for the record.
        observers: The batch observers the trainer seam runs in ``preprocess_batch`` and ``optimizer_step``, in
            order (:func:`yolo_det.integrations.ultralytics.seam.observe`).
        around_save: ``(trainer, save) -> result``: what the seam's ``save_model`` runs around Ultralytics' own
            ``save`` (None: Ultralytics' alone).
        tap: The fingerprint of the first batches (a :class:`~yolo_det.fixes.data_invariance.BatchTap`), None
            when the run takes none.
        build_loader: ``(trainer, loader) -> loader``: what the seam's ``get_dataloader`` builds the training loader
            with from the one Ultralytics built (None: Ultralytics' as it is).
        shards: The :class:`~yolo_det.fixes.shards.ShardLayout` the run trains under (None: no shards).
        flags: The process states seen at the optimizer steps (a
            :class:`~yolo_det.integrations.ultralytics.guarantees.FlagWatch`), None when not observed.
        epoch_weights: ``{epoch: weights digest}`` of ``last.pt`` right after each epoch's checkpoint (1-based), for
            the record's ``epoch_weights``.
    """

    identity: dict[str, Any] | None = None
    swapped: bool = False
    record_written: bool = False
    stopped_on_purpose: bool = False
    op_trace: Callable[[], dict[str, Any]] | None = None
    observers: list[Any] = field(default_factory=list)
    around_save: Callable[[Any, Callable[[], Any]], Any] | None = None
    tap: Any = None
    build_loader: Callable[[Any, Any], Any] | None = None
    shards: Any = None
    flags: Any = None
    epoch_weights: dict[int, str] = field(default_factory=dict)


def state_of(trainer: Any) -> TrainerState:
    """The :class:`TrainerState` of ``trainer`` (made and attached on first use)."""
    state = getattr(trainer, ATTRIBUTE, None)
    if not isinstance(state, TrainerState):
        state = TrainerState()
        setattr(trainer, ATTRIBUTE, state)
    return state
