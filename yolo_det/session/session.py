"""One run under a profile: the baseline state, a stack of phases, and what was observed.

:class:`DeterminismSession` is framework-agnostic; the Ultralytics and YOLOv5 integrations drive it
from their hooks. ``begin()`` snapshots the user's state (the *baseline*); ``enter(phase)`` applies a
phase's settings on top of whatever is in force and ``exit()`` puts that back; ``end()`` unwinds every
phase and restores the baseline exactly. Phases nest: validation inside training enters ``val`` on
top of ``train`` and returns to ``train`` afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..core import backward as _backward
from ..core import state as _state
from ..core.errors import YoloDetError
from ..fixes.intercept import interception, routed_calls
from ..core.profiles import PHASES, PhaseSettings, Profile, load_profile
from ..core.seeding import data_seed, rank_seed, seed_everything
from ..fixes.swaps import SwapRecord, swap_modules
from ..core.warnlog import WarningLog

__all__ = ["DeterminismSession"]


@dataclass
class _Frame:
    phase: str
    settings: PhaseSettings
    before: _state.DeterminismState
    contexts: list[AbstractContextManager[Any]] = field(default_factory=list)


class DeterminismSession:
    """Drive one run (a training, a validation, a prediction or an export) under a profile.

    Args:
        profile: A :class:`~yolo_det.core.profiles.Profile`, a built-in name or a profile file path.
        seed: The run's seed (Ultralytics ``seed=``, YOLOv5 ``--seed``); a phase's own ``seed`` wins.
        rank: This process's global rank (0 for a single process).
        world_size: Number of processes in the run.
    """

    def __init__(self, profile: Profile | str, *, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        self.profile = load_profile(profile)
        self.seed = seed
        self.rank = max(rank, 0)
        self.world_size = max(world_size, 1)
        self.baseline: _state.DeterminismState | None = None
        self.warnings = WarningLog(phase=lambda: self.phase)
        self.events: list[dict[str, Any]] = []
        self._stack: list[_Frame] = []
        self._toggles_at_begin = 0
        self._extensions: list[Any] = []
        self._swapped: list[tuple[Any, list[Any]]] = []
        self._routed_at_begin: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether :meth:`begin` was called and :meth:`end` was not."""
        return self.baseline is not None

    @property
    def phase(self) -> str | None:
        """The phase in force, or None."""
        return self._stack[-1].phase if self._stack else None

    @property
    def phases(self) -> tuple[str, ...]:
        """The stack of phases in force, outermost first."""
        return tuple(f.phase for f in self._stack)

    def add_extension(self, factory: Any) -> None:
        """Add ``factory(phase, settings, session) -> context manager | None``, entered with every phase.

        Extensions carry the phase-scoped behaviour that is not a process flag (functional interception,
        for instance); they are exited in reverse order when the phase is left, on error too.
        """
        self._extensions.append(factory)

    def begin(self) -> None:
        """Snapshot the baseline state and start recording warnings. Idempotent."""
        if self.baseline is not None:
            return
        env_keys = {k for p in PHASES for k in self.profile.phase(p).env}
        self.baseline = _state.snapshot(env_keys)
        self._toggles_at_begin = _backward.toggle_count()
        self._routed_at_begin = routed_calls()
        self.warnings.start()
        self._event("begin")

    def end(self) -> None:
        """Leave every phase, restore the baseline and stop recording. Idempotent; safe after errors."""
        if self.baseline is None:
            return
        errors: list[BaseException] = []
        while self._stack:
            try:
                self._pop()
            except BaseException as e:  # keep unwinding; report the first failure afterwards
                errors.append(e)
        try:
            self.restore_models()
        except BaseException as e:
            errors.append(e)
        try:
            _state.restore(self.baseline)
        finally:
            self.warnings.stop()
            self.baseline = None
            self._event("end")
        if errors:
            raise errors[0]

    @contextmanager
    def run(self) -> Iterator[DeterminismSession]:
        """``begin()`` ... ``end()`` around a block (the block may enter and exit phases)."""
        began = not self.active
        self.begin()
        try:
            yield self
        finally:
            if began:
                self.end()

    # -- phases ---------------------------------------------------------------------------------------
    def enter(self, phase: str) -> PhaseSettings:
        """Apply ``phase``'s settings on top of the current state and seed if the phase says so.

        Returns:
            The settings now in force.
        """
        settings = self.profile.phase(phase)
        if self.baseline is None:
            self.begin()
        before = _state.apply(settings)
        frame = _Frame(phase, settings, before)
        self._stack.append(frame)
        try:
            seed = settings.seed if settings.seed is not None else (self.seed if phase == "train" else None)
            if seed is not None:
                seed_everything(rank_seed(seed, self.rank) if phase == "train" else seed)
            if settings.intercept:
                cm = interception()
                cm.__enter__()
                frame.contexts.append(cm)
            for factory in self._extensions:
                cm = factory(phase, settings, self)
                if cm is not None:
                    cm.__enter__()
                    frame.contexts.append(cm)
        except BaseException:
            self._pop()
            raise
        self._event("enter", phase)
        return settings

    def exit(self, phase: str | None = None) -> None:
        """Leave the innermost phase (which must be ``phase`` when given) and restore what it replaced."""
        if not self._stack:
            return
        if phase is not None and self._stack[-1].phase != phase:
            if phase not in self.phases:
                return
            raise YoloDetError(
                f"cannot leave phase '{phase}' while '{self._stack[-1].phase}' is in force; "
                "leave phases in the reverse order they were entered"
            )
        self._pop()

    @contextmanager
    def phase_scope(self, phase: str) -> Iterator[PhaseSettings]:
        """Enter ``phase`` for the block and leave it afterwards, on error too."""
        settings = self.enter(phase)
        try:
            yield settings
        finally:
            self.exit(phase)

    def _pop(self) -> None:
        frame = self._stack.pop()
        try:
            while frame.contexts:
                frame.contexts.pop().__exit__(None, None, None)
        finally:
            _state.restore(frame.before)
            self._event("exit", frame.phase)

    def _event(self, kind: str, phase: str | None = None) -> None:
        self.events.append({"event": kind, "phase": phase, "time": time.time()})

    # -- models ---------------------------------------------------------------------------------------
    def prepare_model(self, model: Any, *, phase: str = "train", imgsz: int = 64) -> list[SwapRecord]:
        """Swap ``model``'s layers as ``phase``'s ``swaps`` policy says; :meth:`end` swaps them back.

        Args:
            model: The ``nn.Module`` that will run (for Ultralytics, the trainer's model, not its EMA).
            phase: Whose ``swaps`` policy applies.
            imgsz: Input size for the audit trace that decides the ``auto`` policy.

        Returns:
            The swaps made.
        """
        records = swap_modules(model, self.profile.phase(phase).swaps, imgsz=imgsz)
        if records:
            self._swapped.append((model, records))
        self._event("swap", phase)
        return records

    def restore_models(self) -> None:
        """Put every module swapped by :meth:`prepare_model` back to its PyTorch class."""
        while self._swapped:
            model, records = self._swapped.pop()
            modules = dict(model.named_modules())
            for r in records:
                m = modules.get(r.path)
                native = getattr(type(m), "_yolo_det_native", None)
                if m is not None and native is not None and type(m).__name__ == r.target:
                    m.__class__ = native

    def swaps(self) -> list[dict[str, str]]:
        """The swaps in force, as plain data."""
        return [r.to_dict() for _, records in self._swapped for r in records]

    def routed_calls(self) -> dict[str, int]:
        """Functional calls routed to deterministic implementations since :meth:`begin`."""
        now = routed_calls()
        return {k: v - self._routed_at_begin.get(k, 0) for k, v in now.items() if v - self._routed_at_begin.get(k, 0)}

    # -- reporting ------------------------------------------------------------------------------------
    def seeds(self) -> dict[str, Any]:
        """The seeds of this run: the user seed, this rank's RNG and data seeds, and every rank's RNG seed."""
        train_seed = self.profile.train.seed if self.profile.train.seed is not None else self.seed
        return {
            "seed": train_seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "rng_seed": rank_seed(train_seed, self.rank),
            "data_seed": data_seed(train_seed, self.rank),
            "rank_rng_seeds": [rank_seed(train_seed, r) for r in range(self.world_size)],
            "sampler_seed": train_seed,
        }

    def backward_toggles(self) -> int:
        """Backward passes run with determinism off since :meth:`begin`."""
        return _backward.toggle_count() - self._toggles_at_begin
