"""What the train phase asked for, checked in force at the end of the run: the record's ``guarantees``.

A profile asking for a guarantee is not the run having it. Each one is checked against what the run showed:

- ``flags``: the process state (torch's determinism flags, cuDNN, TF32, the tracked variables) read at every
  optimizer step by a batch observer of the trainer seam (:class:`FlagWatch`): in force when every step ran
  under the state the train phase set (the one read at ``on_train_start``). A callback or a library that turns
  a flag during the run shows here.
- ``data_invariance`` (``data_invariance`` or ``shards`` asked): the training loader at the end of the run is the
  keyed one (Ultralytics builds a new loader on an out-of-memory retry, for example).
- ``shards``: the trainer still trains the shard step, with the layout of each step (shards, ranks, batch).

A guarantee asked and not in force is one line at the end of the run (:func:`say_broken`, rank 0) and
``in_force: false`` in the record. Without the seam no step is observed: ``flags.in_force`` is null.
"""

from __future__ import annotations

import sys
from typing import Any

from ...core.state import DeterminismState, snapshot
from ...fixes import data_invariance as _data
from ...fixes.shards import ShardedBatchSampler, ShardedStep
from ..trainer_state import state_of
from .seam import BatchObserver, has_seam, observe

__all__ = ["FlagWatch", "guarantees_section", "say_broken", "watch_flags"]


class FlagWatch(BatchObserver):
    """The process states seen at the optimizer steps, each with the number of steps that ran under it."""

    def __init__(self) -> None:
        self.seen: dict[DeterminismState, int] = {}

    def after_step(self, trainer: Any) -> None:
        state = snapshot()
        self.seen[state] = self.seen.get(state, 0) + 1


def watch_flags(trainer: Any) -> None:
    """Read the process state at every optimizer step of ``trainer`` (once; nothing without the seam)."""
    state = state_of(trainer)
    if state.flags is None and has_seam(trainer):
        state.flags = FlagWatch()
        observe(trainer, state.flags, "the flags seen at each step")


def _flags(trainer: Any, expected: dict[str, Any] | None) -> dict[str, Any]:
    watch = state_of(trainer).flags
    if not isinstance(watch, FlagWatch) or expected is None:
        return {"in_force": None, "steps": 0, "differing": {}}
    differing: dict[str, list[Any]] = {}
    off = 0
    for state, count in watch.seen.items():
        values = state.to_dict()
        changed = {k: v for k, v in values.items() if expected.get(k) != v}
        if changed:
            off += count
            for key, value in changed.items():
                differing.setdefault(key, [expected.get(key)])
                if value not in differing[key]:
                    differing[key].append(value)
    return {
        "in_force": off == 0,
        "steps": sum(watch.seen.values()),
        "steps_off": off,
        "differing": differing,  # key -> [as the train phase set it, what steps saw instead...]
    }


def guarantees_section(trainer: Any, profile: Any, expected: dict[str, Any] | None) -> dict[str, Any]:
    """The record's ``guarantees``: each guarantee the train phase asks for, and whether the run had it."""
    settings = profile.train
    shards = settings.extra.get("shards")
    out: dict[str, Any] = {"flags": _flags(trainer, expected)}
    if settings.extra.get("data_invariance", False) or shards:
        loader = vars(trainer).get("train_loader")  # none when the run ended before Ultralytics built it
        mode = _data.data_mode(loader) if loader is not None else None
        out["data_invariance"] = {"in_force": mode == _data.MODE_KEYED, "loader": mode}
    if shards:
        layout = state_of(trainer).shards
        out["shards"] = {
            "in_force": layout is not None
            and isinstance(trainer.model, ShardedStep)
            and isinstance(getattr(vars(trainer).get("train_loader"), "keys", None), ShardedBatchSampler),
            "layout": None
            if layout is None
            else {"shards": layout.shards, "world": layout.world, "rank": layout.rank, "batch": layout.batch},
        }
    return out


def say_broken(section: dict[str, Any]) -> None:
    """One line (stderr) naming each guarantee asked and not in force at the end of the run; nothing otherwise."""
    broken = []
    flags = section.get("flags") or {}
    if flags.get("in_force") is False:
        what = ", ".join(f"{k}={v[1:]} (set: {v[0]})" for k, v in flags["differing"].items())
        broken.append(f"{flags['steps_off']} of {flags['steps']} optimizer steps ran with {what}")
    for name in ("data_invariance", "shards"):
        if (section.get(name) or {}).get("in_force") is False:
            broken.append(f"{name} was not in force at the end of the run")
    if broken:
        print(
            f"yolo-det: the train phase's guarantees did not all hold: {'; '.join(broken)} (the record says so)",
            file=sys.stderr,
            flush=True,
        )
