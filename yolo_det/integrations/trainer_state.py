"""What yolo-det keeps on an Ultralytics trainer while it trains: one documented object.

The plugin's callbacks receive the trainer, not the plugin's own bookkeeping, and code that stops a
training on purpose (``yolo-det verify --resume-at``) only has the trainer too. Everything they share lives
in one :class:`TrainerState` at ``trainer.yolo_det_state`` (:func:`state_of`), never in loose attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    """

    identity: dict[str, Any] | None = None
    swapped: bool = False
    record_written: bool = False
    stopped_on_purpose: bool = False
    op_trace: Callable[[], dict[str, Any]] | None = None


def state_of(trainer: Any) -> TrainerState:
    """The :class:`TrainerState` of ``trainer`` (made and attached on first use)."""
    state = getattr(trainer, ATTRIBUTE, None)
    if not isinstance(state, TrainerState):
        state = TrainerState()
        setattr(trainer, ATTRIBUTE, state)
    return state
