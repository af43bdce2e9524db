"""One run under a profile: the baseline state, a stack of phases, and what was observed.

Length: one class, :class:`DeterminismSession`: the phase stack, suspend and resume, the hand-overs and
what was observed share its state.

:class:`DeterminismSession` is framework-agnostic; the Ultralytics and YOLOv5 integrations drive it
from their hooks. ``begin()`` snapshots the user's state (the *baseline*); ``enter(phase)`` applies a
phase's settings on top of whatever is in force and ``exit()`` puts that back; ``end()`` unwinds every
phase and restores the baseline exactly. Phases nest: validation inside training enters ``val`` on
top of ``train`` and returns to ``train`` afterwards.

The session is the only place a phase is applied and undone: every concern (flags and environment,
seeds, the backward toggle, swaps, interception) is an extension of :mod:`yolo_det.session.extensions`
with ``apply``/``undo``. Integrations only say *when* a phase begins and ends, and hand over the model
(:meth:`DeterminismSession.prepare_model`) and the scaler (:meth:`DeterminismSession.wrap_scaler`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..core import backward as _backward
from ..core import state as _state
from ..core.errors import YoloDetError
from ..core.machine import machine_fingerprint
from ..core.profiles import PHASES, PhaseSettings, Profile, load_profile
from ..core.project import run_sources
from ..core.record import recorded_env
from ..core.seeding import data_seed, rank_seed
from ..core.warnlog import WarningLog
from ..fixes.intercept import routed_calls
from ..fixes.swaps import SwapRecord
from . import exclusive as _exclusive
from .extensions import ContextExtension, Extension, PhaseContext, Seeds, Swaps, default_extensions

__all__ = ["DeterminismSession", "note_restore_failure", "run_every"]


def note_restore_failure(error: BaseException, failure: BaseException) -> None:
    """Attach ``failure`` (raised while restoring state because of ``error``) to ``error``, and warn.

    ``error`` stays the exception that propagates: restoring never replaces the reason a run ended.
    """
    if failure is error:
        return
    text = (
        f"yolo-det: restoring the state after {type(error).__name__} also failed: {type(failure).__name__}: {failure}"
    )
    _state.add_note(error, text)
    try:
        import warnings

        warnings.warn(" ".join(text.split()), RuntimeWarning, stacklevel=3)
    except Exception:  # a warning filter set to "error" must not replace the error either
        pass


def run_every(steps: Iterable[Callable[[], Any] | None]) -> list[BaseException]:
    """Run every step (None: skipped), also after one fails; return the failures in order."""
    failures: list[BaseException] = []
    for step in steps:
        if step is not None:
            try:
                step()
            except BaseException as e:
                failures.append(e)
    return failures


@dataclass
class _Frame:
    phase: str | None  # None: the session's own frame (what is handed over outside any phase)
    settings: PhaseSettings | None
    undo: list[tuple[Extension, Any]] = field(default_factory=list)

    def unwind(self) -> None:
        """Undo every applied extension, newest first; keep going after a failure and raise the first."""
        undo, self.undo = self.undo, []
        failures = run_every(functools.partial(ext.undo, token) for ext, token in reversed(undo))
        if failures:
            raise failures[0]


class DeterminismSession:
    """Drive one run (a training, a validation, a prediction or an export) under a profile.

    One session is active per process at a time: :meth:`begin` refuses with
    :class:`~yolo_det.session.exclusive.ConcurrentSessionError` while a session of another thread is active
    (torch's flags are process-wide); sessions of the same thread nest.

    Args:
        profile: A :class:`~yolo_det.core.profiles.Profile`, a built-in name or a profile file path.
        seed: The run's seed (Ultralytics ``seed=``, YOLOv5 ``--seed``); a phase's own ``seed`` wins. None
            leaves the random generators alone (unless a phase sets a seed).
        rank: This process's global rank (0 for a single process).
        world_size: Number of processes in the run.
    """

    def __init__(
        self,
        profile: Profile | str,
        *,
        seed: int | None = 0,
        rank: int = 0,
        world_size: int = 1,
        extensions: list[Extension] | None = None,
    ) -> None:
        self.profile = load_profile(profile)
        self.seed = seed
        self.rank = max(rank, 0)
        self.world_size = max(world_size, 1)
        self.baseline: _state.DeterminismState | None = None
        self.warnings = WarningLog(phase=lambda: self.phase)
        self.events: list[dict[str, Any]] = []
        self._stack: list[_Frame] = []
        self._toggles_at_begin = 0
        #: Applied in order when a phase is entered, undone in reverse when it is left.
        self.extensions: list[Extension] = default_extensions() if extensions is None else list(extensions)
        self._own = _Frame(None, None)  # what is handed over outside any phase; undone by end()
        self._routed_at_begin: dict[str, int] = {}
        self.run_dir: str | None = None  # set by an integration once it knows the run folder
        #: The recorded environment variables as they were when the train phase was first in force
        #: (a record written after the run has ended still describes the training, not the teardown).
        self.train_env: dict[str, str | None] | None = None
        self.train_machine: dict[str, Any] | None = None
        #: The user's project and installed packages as training started (:func:`~yolo_det.core.project.run_sources`).
        self.train_sources: dict[str, Any] | None = None

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
        return tuple(f.phase for f in self._stack if f.phase is not None)

    def add_extension(self, factory: Extension | Callable[[str, PhaseSettings, Any], Any]) -> None:
        """Add an :class:`~yolo_det.session.extensions.Extension`, or a
        ``factory(phase, settings, session) -> context manager | None``, applied with every phase after the
        built-in ones; they are undone in reverse order when the phase is left, on error too.
        """
        self.extensions.append(factory if isinstance(factory, Extension) else ContextExtension(factory))

    def begin(self, baseline: _state.DeterminismState | None = None) -> None:
        """Snapshot the baseline state (or take ``baseline``, a :meth:`snapshot` made earlier) and start recording
        warnings. Idempotent."""
        if self.baseline is not None:
            return
        _state.preload()  # before anything changes: an interrupt in this import leaves nothing to undo
        _exclusive.claim(self)  # one session per process (see yolo_det.session.exclusive)
        try:
            self.baseline = baseline if baseline is not None else self.snapshot()
            self._toggles_at_begin = _backward.toggle_count()
            self._routed_at_begin = routed_calls()
            self.warnings.start()
        except BaseException:
            self.baseline = None
            _exclusive.release(self)
            raise
        self._event("begin")

    def end(self) -> None:
        """Leave every phase, restore the baseline and stop recording. Idempotent; safe after errors.

        Each step runs even when an earlier one fails; the first failure is raised at the end. A caller
        ending the session because of an error should use :meth:`end_after` so that error is kept.
        """
        if self.baseline is None:
            return
        pops = [self._pop] * len(self._stack)  # each leaves a phase, also when its undo fails
        errors = run_every([*pops, self._own.unwind, functools.partial(_state.restore, self.baseline)])
        errors += run_every([self.warnings.stop])
        self.baseline = None
        _exclusive.release(self)
        self._event("end")
        if errors:
            raise errors[0]

    def snapshot(self) -> _state.DeterminismState:
        """The process state now, with every variable the profile's phases set (what :meth:`begin` keeps)."""
        return _state.snapshot({k for p in PHASES for k in self.profile.phase(p).env})

    def suspend(self) -> tuple[str, ...]:
        """Leave every phase and give the process its baseline back, keeping the run for :meth:`resume`.

        Used around the user's own code between the items of a streaming prediction: while suspended,
        nothing of the session is in force (flags, environment, warning hooks, interception) and the
        session does not count as active for :mod:`yolo_det.session.exclusive`.

        Returns:
            The phases that were in force, outermost first (pass them to :meth:`resume`).
        """
        if self.baseline is None:
            return ()
        phases = self.phases
        pops = [self._pop] * len(self._stack)
        errors = run_every([*pops, functools.partial(_state.restore, self.baseline), self.warnings.stop])
        _exclusive.release(self)
        self._event("suspend")
        if errors:
            raise errors[0]
        return phases

    def resume(self, phases: tuple[str, ...]) -> None:
        """Continue after :meth:`suspend`: the state in force now becomes the baseline given back later, and
        ``phases`` are entered again (without seeding again)."""
        if self.baseline is None:
            raise YoloDetError("resume() needs a session that began and has not ended")
        _exclusive.claim(self)
        try:
            self.baseline = self.snapshot()
            self.warnings.start()
            self._event("resume")
            for phase in phases:
                self.enter(phase, seed=False)
        except BaseException as error:
            try:
                self.suspend()
            except BaseException as e:
                note_restore_failure(error, e)
            raise

    def end_after(self, error: BaseException) -> None:
        """:meth:`end` while ``error`` propagates: a failure to end is attached to ``error`` as a note and
        warned about, never raised in its place."""
        try:
            self.end()
        except BaseException as e:
            note_restore_failure(error, e)

    @contextmanager
    def run(self) -> Iterator[DeterminismSession]:
        """``begin()`` ... ``end()`` around a block (the block may enter and exit phases)."""
        began = not self.active
        self.begin()
        try:
            yield self
        except BaseException as error:
            if began:
                self.end_after(error)
            raise
        if began:
            self.end()

    # -- phases ---------------------------------------------------------------------------------------
    def enter(self, phase: str, *, seed: bool = True) -> PhaseSettings:
        """Apply ``phase``'s settings on top of the current state and seed if the phase says so.

        Args:
            phase: ``train``, ``val`` or ``deploy``.
            seed: Seed as the phase says (False when re-entering a phase after :meth:`resume`).

        Returns:
            The settings now in force.
        """
        settings = self.profile.phase(phase)
        if self.baseline is None:
            self.begin()
        frame = _Frame(phase, settings)
        self._stack.append(frame)
        ctx = PhaseContext(self, phase, settings)
        try:
            for ext in self.extensions:
                if not seed and isinstance(ext, Seeds):
                    continue
                token = ext.apply(ctx)
                if token is not None:
                    frame.undo.append((ext, token))
        except BaseException as error:
            try:
                self._pop()
            except BaseException as e:
                note_restore_failure(error, e)
            raise
        if phase == "train" and self.train_env is None:
            self.train_env = recorded_env()
            self.train_machine = machine_fingerprint()
            self.train_sources = run_sources()
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
        except BaseException as error:
            try:
                self.exit(phase)
            except BaseException as e:
                note_restore_failure(error, e)
            raise
        self.exit(phase)

    def _pop(self) -> None:
        frame = self._stack.pop()
        try:
            frame.unwind()
        finally:
            self._event("exit", frame.phase)

    def _event(self, kind: str, phase: str | None = None) -> None:
        self.events.append({"event": kind, "phase": phase, "time": time.time()})

    def reseed(self) -> int | None:
        """Seed again as entering the phase in force did (for frameworks that seed after the phase began).

        Returns:
            The seed used, or None when the phase leaves the generators alone.
        """
        phase = self.phase or "train"
        ctx = PhaseContext(self, phase, self.profile.phase(phase))
        seed = None
        for ext in self.extensions:
            if isinstance(ext, Seeds):
                seed = ext.seed_for(ctx)
                ext.apply(ctx)
        return seed

    # -- handing over -------------------------------------------------------------------------------------
    def hand_over(self, what: str, obj: Any, *, phase: str | None = None, **options: Any) -> list[Any]:
        """Apply ``phase``'s settings (default: the phase in force, else ``train``) to an object of the run.

        Each extension decides whether ``what`` concerns it (``"model"``: swaps; ``"scaler"``: the
        backward toggle, ``obj`` holding the scaler as ``.scaler``). What is applied is undone when that
        phase is left, or by :meth:`end` when the phase is not in force.

        Returns:
            The tokens of the extensions that changed something.
        """
        phase = phase or self.phase or "train"
        settings = self.profile.phase(phase)
        frame = next((f for f in reversed(self._stack) if f.phase == phase), self._own)
        ctx = PhaseContext(self, phase, settings)
        tokens = []
        for ext in self.extensions:
            token = ext.hand_over(ctx, what, obj, **options)
            if token is not None:
                frame.undo.append((ext, token))
                tokens.append(token)
        return tokens

    def prepare_model(
        self, model: Any, *, phase: str = "train", imgsz: int = 64, decided: dict[str, str] | None = None
    ) -> list[SwapRecord]:
        """Swap ``model``'s layers as ``phase``'s ``swaps`` policy says; undone with the phase or by :meth:`end`.

        Args:
            model: The ``nn.Module`` that will run (for Ultralytics, the trainer's model, not its EMA).
            phase: Whose ``swaps`` policy applies.
            imgsz: Input size for the audit trace that decides the ``auto`` policy.
            decided: A decision already taken (module path -> reason): skips the audit.

        Returns:
            The swaps made.
        """
        tokens = self.hand_over("model", model, phase=phase, imgsz=imgsz, decided=decided)
        self._event("swap", phase)
        return [
            r
            for token in tokens
            if isinstance(token, tuple) and len(token) == 2 and isinstance(token[1], list)
            for r in token[1]
            if isinstance(r, SwapRecord)
        ]

    def wrap_scaler(self, holder: Any, *, phase: str | None = None) -> bool:
        """Hand over the object holding the training loop's scaler (``holder.scaler``).

        Under ``backward: disable`` the scaler is wrapped in a :class:`~yolo_det.core.backward.ToggleScaler`
        until the phase is left. Returns whether it was wrapped.
        """
        return bool(self.hand_over("scaler", holder, phase=phase))

    @contextmanager
    def backward_scope(self) -> Iterator[None]:
        """Determinism off for the block when the phase in force says ``backward: disable``."""
        settings = self.profile.phase(self.phase or "train")
        with _backward.backward_scope(settings.backward == "disable"):
            yield

    def backward(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``tensor.backward(*args, **kwargs)`` under the phase in force's ``backward`` setting."""
        with self.backward_scope():
            tensor.backward(*args, **kwargs)

    def swaps(self) -> list[dict[str, str]]:
        """The swaps in force, as plain data."""
        return [
            r.to_dict()
            for frame in (self._own, *self._stack)
            for ext, token in frame.undo
            if isinstance(ext, Swaps)
            for r in token[1]
        ]

    def routed_calls(self) -> dict[str, int]:
        """Functional calls routed to deterministic implementations since :meth:`begin`."""
        now = routed_calls()
        return {k: v - self._routed_at_begin.get(k, 0) for k, v in now.items() if v - self._routed_at_begin.get(k, 0)}

    # -- reporting ------------------------------------------------------------------------------------
    def seeds(self) -> dict[str, Any]:
        """The seeds of this run: the user seed, this rank's RNG and data seeds, and every rank's RNG seed."""
        train_seed = self.profile.train.seed if self.profile.train.seed is not None else (self.seed or 0)
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
