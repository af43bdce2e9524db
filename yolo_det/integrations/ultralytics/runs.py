"""The run in progress: the plugin's session, from its beginning to the restored baseline.

:class:`RunControl` holds what one run of the plugin keeps (the :class:`~yolo_det.session.session.DeterminismSession`,
the run folder's locks, the resume bookkeeping, the record's inputs) and its lifecycle: :meth:`~RunControl.begin_run`
snapshots the baseline, :meth:`~RunControl.end_run` restores it (every step, also when one fails), the phases of
validation, prediction and export are entered and left around their Ultralytics events, and a streaming
prediction suspends the run between items. :class:`~yolo_det.integrations.ultralytics.UltralyticsPlugin` builds on
it; the callbacks themselves live there.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ...core import runlock
from ...core.constants import global_rank
from ...core.profiles import Profile, load_profile
from ...layers.registry import registered_layers
from ...session.session import DeterminismSession, note_restore_failure, run_every
from .resume import UltralyticsResume

__all__ = ["RunControl", "process_rank"]


def process_rank() -> int:
    """This process's global rank (-1 outside a distributed run)."""
    return global_rank(-1)


class RunControl:
    """The state of the plugin's run in progress and its lifecycle (see the module docstring).

    Args:
        profile: A :class:`~yolo_det.core.profiles.Profile`, a built-in name or a profile file path.
        record: Write ``determinism.json`` into the training run directory.
    """

    def __init__(self, profile: Profile | str = "repro", *, record: bool = True) -> None:
        self.profile = load_profile(profile)
        self.record = record
        self.session: DeterminismSession | None = None
        self.record_path: Path | None = None
        self.export_record_path: Path | None = None
        self.weights_digest: str | None = None
        self.record_error: str | None = None
        self.warn_record_error = True
        self._locks: list[runlock.RunLock] = []
        self._weights_before: dict[str, Any] | None = None
        self._owner: str | None = None  # who began the session: guard, trainer, trainer-class or "<phase>:<id>"
        self._observed: dict[str, Any] | None = None
        self._ranks: list[dict[str, Any]] = []
        self._entered: set[int] = set()
        self._names: Any = None
        self._trainer: Any = None  # the trainer of the run in progress (for a record of an early ending)
        self.resume: UltralyticsResume | None = None
        self._previous: dict[str, Any] | None = None
        self._rank_signals: ExitStack | None = None  # a DDP rank takes stop signals while it trains
        self._digests: dict[str, Any] = {}  # weights file digests of the run in progress (by file identity)
        self._release_stops: Callable[[], None] | None = None  # stops wait for a safe point while training
        self._portable: dict[str, Any] = {}  # what the checkpoints' YAML keeps under yolo-det's key
        self._plain: dict[str, Any] = {}  # what plain Ultralytics needs to rebuild the checkpoints' model
        self.asked: dict[str, Any] = {}  # the arguments the run was asked for (model.train(**kwargs), overrides)
        self.adjusted: dict[str, Any] = {}  # those Ultralytics changed itself (identity.adjusted_args)

    # A pickled plugin (Ultralytics' DDP launcher pickles the callbacks) starts fresh in the worker.
    def __getstate__(self) -> dict[str, Any]:
        return {"profile": self.profile, "record": self.record}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["profile"], record=state["record"])  # type: ignore[misc]

    # -- run control ----------------------------------------------------------------------------------
    def begin_run(self, owner: str = "guard", baseline: Any = None) -> DeterminismSession:
        """Snapshot the baseline now (before Ultralytics touches any flag; or take ``baseline``, one taken
        earlier with :meth:`DeterminismSession.snapshot`) and return the session."""
        if self.session is None or not self.session.active:
            session = DeterminismSession(self.profile, rank=max(process_rank(), 0))
            session.begin(baseline)  # refused here, before anything changes, while another thread's session is active
            names = registered_layers()  # yolo-det layer names resolve in model YAMLs while the run lasts
            try:
                names.__enter__()
            except BaseException as error:
                session.end_after(error)
                raise
            self.session, self._owner, self._names = session, owner, names
        return self.session

    def end_run(self, error: BaseException | None = None) -> None:
        """Restore the baseline, release the run folder and forget the session. Idempotent.

        Every step runs even if an earlier one fails. With ``error`` (the exception that is ending the
        run) a failure here is attached to it as a note and warned about, never raised in its place.
        """
        session, self.session, self._owner = self.session, None, None
        names, self._names = self._names, None
        locks, self._locks = self._locks, []
        self._entered.clear()
        self._trainer = None
        self._weights_before = None
        self._digests = {}
        resume, self.resume, self._previous = self.resume, None, None
        rank_signals, self._rank_signals = self._rank_signals, None
        release_stops, self._release_stops = self._release_stops, None
        steps = [
            release_stops,
            resume.close if resume is not None else None,
            session.end if session is not None else None,
            (lambda: names.__exit__(None, None, None)) if names is not None else None,
            *(lock.release for lock in reversed(locks)),
            rank_signals.close if rank_signals is not None else None,
        ]
        failures = run_every(steps)
        if failures:
            if error is None:
                raise failures[0]
            for failure in failures:
                note_restore_failure(error, failure)

    def _phase_start(self, phase: str, obj: Any) -> None:
        if self.session is None or not self.session.active:
            self.begin_run(owner=f"{phase}:{id(obj)}")
        session = self.session
        if session is None:  # pragma: no cover - begin_run always sets it
            return
        if id(obj) in self._entered:  # a start without an end (Ultralytics skips on_val_end on ranks > 0)
            self._phase_end(phase, obj)
            session = self.begin_run(owner=f"{phase}:{id(obj)}")
        session.enter(phase)
        self._entered.add(id(obj))

    def _phase_end(self, phase: str, obj: Any) -> None:
        if self.session is None or id(obj) not in self._entered:
            return
        self._entered.discard(id(obj))
        if phase in self.session.phases:
            while self.session.phase != phase:
                self.session.exit()
            self.session.exit(phase)
        if self._owner == f"{phase}:{id(obj)}":
            self.end_run()

    def _suspend(self) -> tuple[Any, ...]:
        """Take the running session out of force (see :meth:`DeterminismSession.suspend`); keep it for later."""
        session, names = self.session, self._names
        saved = (session, self._owner, set(self._entered), session.suspend() if session is not None else ())
        self.session, self._owner, self._names = None, None, None
        self._entered = set()
        if names is not None:
            names.__exit__(None, None, None)
        return saved

    def _resume(self, saved: tuple[Any, ...]) -> None:
        """Put a session taken out by :meth:`_suspend` back in force."""
        session, owner, entered, phases = saved
        if session is None:
            return
        names = registered_layers()
        names.__enter__()
        try:
            session.resume(phases)
        except BaseException:
            names.__exit__(None, None, None)
            raise
        self.session, self._owner, self._entered, self._names = session, owner, entered, names
