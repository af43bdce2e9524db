"""Ultralytics integration: profiles applied per phase through Ultralytics' own callbacks.

Three ways in, from simplest:

- ``yolo_det.attach(model, "repro")`` on an ``ultralytics.YOLO`` registers the callbacks (idempotent)
  and guards ``model.train/val/predict/export`` so the process state is restored even when a call fails.
- ``model.train(trainer=yolo_det.trainer_class("repro"))``: a trainer class (the trainer of the model's
  task by default; any ``BaseTrainer`` subclass can be the base) that snapshots the state before
  Ultralytics' ``init_seeds`` and restores it after.
- ``Trainer(overrides=..., _callbacks=UltralyticsPlugin(profile).register(callbacks.get_default_callbacks()))``
  for a trainer you build yourself: the callbacks must be there when the trainer is built (Ultralytics runs
  ``on_pretrain_routine_start`` in its constructor). Registering on a trainer that already exists is refused
  when training starts (its initial weights would differ from the other routes').

Phase boundaries: ``train`` from ``on_pretrain_routine_start`` (right after ``init_seeds``) until
``teardown`` (which Ultralytics runs in ``train()``'s ``finally``, after its own ``unset_deterministic``);
``val`` between ``on_val_start`` and ``on_val_end`` (inside training and in ``model.val()``); ``deploy``
between ``on_predict_start``/``on_predict_end`` and ``on_export_start``/``on_export_end``. The validator
(at ``on_val_start``) and the predictor (at each ``on_predict_batch_start``) are handed to the session,
which applies ``batch_invariant`` to them (:mod:`yolo_det.session.batch_invariance`); a streaming
``predict`` is suspended each time it yields an item (the caller's loop body runs under the caller's state).

Endings (see :mod:`yolo_det.core.endings`): every training writes ``determinism.json`` however it ends
(``completed``, ``failed``, ``interrupted``, ``terminated``), with every weights file digested from disk;
SIGINT, SIGTERM and SIGHUP stop ``model.train()`` at the next batch or epoch boundary once the train phase
is entered, at once before (:mod:`yolo_det.core.signals`); the
run folder is locked against other live runs (:mod:`yolo_det.core.runlock`); one session per process
(:mod:`yolo_det.session.exclusive`).
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from ..core import runlock
from ..core.compat import EVENTS as _EVENTS
from ..core.compat import TASK_TRAINERS, task_trainer
from ..core.constants import global_rank
from ..core.endings import describe_ending, one_line, weights_files, weights_stats
from ..core.errors import YoloDetError
from ..core.modules import unwrap_model
from ..core.partial import set_aside_incomplete
from ..core.profiles import Profile, load_profile
from ..core.record import RECORD_NAME, build_record, state_dict_digest, write_record
from ..core.signals import defer_stops, safe_point, stop_signals
from ..core.state import snapshot
from ..core.testpoints import reach
from ..fixes import data_invariance as _data
from ..fixes.swaps import restore, unswap_modules
from ..layers.registry import registered_layers
from ..session.distributed import gather_states, rank_info, ranks_consistent, terminate_via_launcher
from ..session.session import DeterminismSession, note_restore_failure
from . import ultralytics_data as _stream
from .identity import run_identity
from .trainer_state import state_of
from .ultralytics_resume import UltralyticsResume, previous_record, segments_of

__all__ = ["UltralyticsPlugin", "attach", "detach", "trainer_class"]

_ATTACHED = "_yolo_det_plugin"
_GUARDED = ("train", "val", "predict", "export")
_RUN_ARGS = (
    "task",
    "model",
    "data",
    "epochs",
    "imgsz",
    "batch",
    "device",
    "seed",
    "deterministic",
    "amp",
    "workers",
    "optimizer",
    "lr0",
    "cache",
    "rect",
    "multi_scale",
    "close_mosaic",
    "fraction",
)


def _rank() -> int:
    return global_rank(-1)


def _is_plugin_callback(fn: Any) -> bool:
    return getattr(getattr(fn, "__func__", fn), "_yolo_det_callback", False)


def _callback(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn._yolo_det_callback = True  # type: ignore[attr-defined]
    return fn


class UltralyticsPlugin:
    """Applies a profile's phases to Ultralytics runs and writes ``determinism.json``.

    Args:
        profile: A :class:`~yolo_det.core.profiles.Profile`, a built-in name or a profile file path.
        record: Write ``determinism.json`` into the training run directory.

    Attributes:
        session: The run in progress (None between runs).
        record_path: Path of the last ``determinism.json`` written.
        export_record_path: Path of the last export record written (``<export>.determinism.json``).
        weights_digest: Weights digest of the last completed training run (of its ``last.pt`` as written).
        record_error: Why the last completed run's record could not be written (None when it was).
        warn_record_error: Warn (``UserWarning``) when a completed run's record cannot be written; the
            training still succeeds. The CLI turns this off and prints the line after the digest.
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

    # A pickled plugin (Ultralytics' DDP launcher pickles the callbacks) starts fresh in the worker.
    def __getstate__(self) -> dict[str, Any]:
        return {"profile": self.profile, "record": self.record}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["profile"], record=state["record"])  # type: ignore[misc]

    # -- registration ---------------------------------------------------------------------------------
    @property
    def callbacks(self) -> dict[str, list[Callable[[Any], None]]]:
        """``{event: [callback]}`` for Ultralytics' callback dicts."""
        return {event: [getattr(self, event)] for event in _EVENTS}

    def register(self, callbacks: dict[str, list[Callable[[Any], None]]]) -> dict[str, list[Callable[[Any], None]]]:
        """Add this plugin's callbacks to an Ultralytics callbacks dict, replacing any yolo-det callbacks
        already there (so registering twice, or after unpickling, never runs a phase twice)."""
        for event, fns in self.callbacks.items():
            existing = [f for f in callbacks.get(event, []) if not _is_plugin_callback(f)]
            callbacks[event] = existing + fns
        return callbacks

    # -- run control ----------------------------------------------------------------------------------
    def begin_run(self, owner: str = "guard") -> DeterminismSession:
        """Snapshot the baseline now (before Ultralytics touches any flag) and return the session."""
        if self.session is None or not self.session.active:
            session = DeterminismSession(self.profile, rank=max(_rank(), 0))
            session.begin()  # refused here, before anything changes, while another thread's session is active
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
        failures: list[BaseException] = []
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
        for step in steps:
            if step is None:
                continue
            try:
                step()
            except BaseException as e:
                failures.append(e)
        if failures:
            if error is None:
                raise failures[0]
            for failure in failures:
                note_restore_failure(error, failure)

    @contextmanager
    def guard(self, phase: str | None = None) -> Iterator[DeterminismSession]:
        """Begin a run (and enter ``phase``) for the block; restore the baseline afterwards, on error too.

        Nested guards (``model.val()`` called from inside a guarded call) leave the outer run alone.
        """
        outer = self.session is not None and self.session.active
        session = self.begin_run("guard")
        try:
            if phase is None:
                yield session
            else:
                with session.phase_scope(phase):
                    yield session
        except BaseException as error:
            if not outer:
                self._record_early_ending(error)
                self.end_run(error)
            raise
        if not outer:
            self.end_run()

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

    # -- training -------------------------------------------------------------------------------------
    def _ensure_train(self, trainer: Any) -> DeterminismSession:
        session = self.begin_run(owner="trainer")
        if "train" not in session.phases:
            _check_resume_folder(trainer)  # refused here: nothing recorded or touched
            save_dir = getattr(trainer, "save_dir", None)
            if save_dir is not None:
                if _rank() == -1:  # under DDP the launching process holds it
                    self._locks.append(runlock.acquire(save_dir))  # refused here: nothing recorded or touched
                session.run_dir = str(save_dir)
                self._weights_before = weights_stats(Path(save_dir) / "weights")
                if getattr(trainer, "resume", False):  # read before this run's record replaces it
                    self._previous = previous_record(str(trainer.args.resume or trainer.args.model))
            session.seed = int(getattr(trainer.args, "seed", 0) or 0)
            rank, world_size = rank_info()
            session.rank = rank
            session.world_size = max(int(getattr(trainer, "world_size", 1) or 1), world_size, 1)
            self._trainer = trainer
            if _rank() >= 0 and self._rank_signals is None:  # a DDP rank: the launcher stops it with SIGTERM
                self._rank_signals = ExitStack()
                self._rank_signals.enter_context(stop_signals())
            session.enter("train")
            self._release_stops = defer_stops()
            self._write_running(trainer)  # from the first second: never the record of another run next to ours
        return session

    def _warn_profile_change(self) -> None:
        """One line when a resumed run trains under another profile than the part before it."""
        before = (self._previous or {}).get("profile")
        if (
            self.resume is not None
            and self.resume.info is not None
            and isinstance(before, dict)
            and before.get("train") != self.profile.to_dict().get("train")
        ):
            print(
                f"yolo-det: resuming under the profile '{self.profile.name}', the run so far trained under "
                f"'{before.get('name')}': it continues, but not bit for bit as either would have (recorded)",
                file=sys.stderr,
                flush=True,
            )

    def _refuse_late_registration(self, trainer: Any) -> None:
        """Refuse a plugin registered on a trainer that already exists: Ultralytics ran ``on_pretrain_routine_start``
        (where the train phase seeds the run) in the trainer's constructor, without it, and has built the model
        since, so its initial weights would differ from every other route's for the same seed."""
        session = self.session
        if _rank() not in {-1, 0} or (session is not None and "train" in session.phases):
            return
        raise YoloDetError(
            "the yolo-det plugin was registered on a trainer that already existed, so the run would start from "
            "other initial weights than yolo-det's routes give for the same seed; use yolo_det.attach(model), "
            "model.train(trainer=yolo_det.trainer_class(...)), or pass the callbacks when building the trainer: "
            "Trainer(overrides=..., _callbacks=UltralyticsPlugin(...).register(callbacks.get_default_callbacks()))"
        )

    def _write_running(self, trainer: Any) -> None:
        """Write (replace) the record with status ``running`` (rank 0; a failure to write is kept, not raised)."""
        if not self.record or _rank() not in {-1, 0}:
            return
        try:
            self._write(trainer, None, running=True)
        except Exception as e:  # the training goes on; the final record says what it can
            self.record_error = f"could not write {RECORD_NAME}: {type(e).__name__}: {one_line(e)}"

    def _after_checkpoint(self, trainer: Any) -> None:
        """After each checkpoint: the record says how many epochs are checkpointed."""
        self._write_running(trainer)
        reach("record-updated")

    def _back_to_train(self) -> None:
        """Leave any phase entered on top of ``train`` whose end event never came."""
        session = self.session
        if session is not None and "train" in session.phases:
            while session.phase != "train":
                session.exit()
            self._entered.clear()

    @_callback
    def on_pretrain_routine_start(self, trainer: Any) -> None:
        """Enter the train phase right after Ultralytics' ``init_seeds``."""
        self._ensure_train(trainer)
        safe_point("train-begin")

    @_callback
    def on_pretrain_routine_end(self, trainer: Any) -> None:
        """Seed the data order, and wrap the scaler when the train phase disables determinism in backward."""
        self._refuse_late_registration(trainer)
        session = self._ensure_train(trainer)
        settings = self.profile.train
        if self.record and _rank() in {-1, 0}:
            state_of(trainer).identity = run_identity(trainer)  # data, start model, arguments (before any swap)
        session.hand_over("loader", getattr(trainer, "train_loader", None), epoch=_stream.start_epoch(trainer))
        if self.record:
            _stream.tap(trainer)  # the fingerprint of the first batches, for the record
        model = getattr(trainer, "model", None)
        model = getattr(model, "module", model)  # DistributedDataParallel
        if settings.swaps != "none" and isinstance(model, torch.nn.Module) and not self._swapped_for(trainer):
            imgsz = getattr(trainer.args, "imgsz", 64)
            session.prepare_model(model, imgsz=int(max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz))
            state_of(trainer).swapped = True
        session.wrap_scaler(trainer)  # backward: disable -> a ToggleScaler until the train phase ends
        self._stamp_checkpoint_yaml(trainer)
        self.resume = UltralyticsResume(int(session.seeds()["seed"]), rank=session.rank)
        self.resume.prepare(trainer)
        self.resume.wrap_save(trainer, self._after_checkpoint)
        self._warn_profile_change()
        self._write_running(trainer)  # now with the data and model fingerprints
        safe_point("train-setup")

    def _stamp_checkpoint_yaml(self, trainer: Any) -> None:
        """The YAML the checkpoints store: torch's names where the model names yolo-det's layers (plain Ultralytics
        rebuilds it), yolo-det's names and the run's ``--import`` modules under a key Ultralytics ignores."""
        from ..analysis.blocks import CHECKPOINT_KEY, portable_config
        from ..analysis.names import active_imports

        imports = active_imports()
        for net in (unwrap_model(getattr(trainer, "model", None)), getattr(getattr(trainer, "ema", None), "ema", None)):
            cfg = getattr(net, "yaml", None)
            if isinstance(net, torch.nn.Module) and isinstance(cfg, dict):
                portable = portable_config(cfg, imports)
                net.__dict__["yaml"] = portable  # a new dict: the user's model keeps its own
                self._portable = dict(portable[CHECKPOINT_KEY])

    @_callback
    def on_train_start(self, trainer: Any) -> None:
        """Record the flags in force as the first batch starts, on every rank (a collective under DDP)."""
        self._observed = snapshot().to_dict()
        if self.session is not None:
            self._ranks = gather_states(self.session)
        safe_point("train-start")

    @_callback
    def on_train_end(self, trainer: Any) -> None:
        """Write ``determinism.json`` with the weights digest (rank 0).

        A record that cannot be written (read-only folder, ``determinism.json`` a directory) does not
        fail the finished training: the weights digest is kept, and :attr:`record_error` says why.
        """
        if _rank() not in {-1, 0}:
            return
        self.record_error = None
        try:
            self._write(trainer, None)
        except Exception as e:  # the training itself succeeded
            self.record_error = (
                f"could not write {RECORD_NAME} in '{trainer.save_dir}': {type(e).__name__}: {one_line(e)}"
            )
            state_of(trainer).record_written = True  # the failure is this run's answer; never rewrite it as failed
            if self.warn_record_error:
                warnings.warn(f"yolo-det: {self.record_error}", UserWarning, stacklevel=2)

    @_callback
    def on_train_epoch_start(self, trainer: Any) -> None:
        """Make sure training continues under the train phase; seed the epoch's data order (and restore
        the saved state on the first epoch of a resumed run)."""
        self._back_to_train()
        if self.resume is not None:
            self.resume.on_train_epoch_start(trainer)
        safe_point("epoch-start")
        _data.set_epoch(getattr(trainer, "train_loader", None), int(getattr(trainer, "epoch", 0)))

    @_callback
    def on_train_batch_start(self, trainer: Any) -> None:
        """Count the iteration (resume bookkeeping); a safe point for a noted stop."""
        if self.resume is not None:
            self.resume.on_train_batch_start(trainer)
        safe_point("batch-start")

    @_callback
    def on_train_batch_end(self, trainer: Any) -> None:
        """Note optimizer steps (resume bookkeeping); a safe point for a noted stop."""
        if self.resume is not None:
            self.resume.on_train_batch_end(trainer)
        safe_point("batch-end")

    @_callback
    def on_train_epoch_end(self, trainer: Any) -> None:
        """Mark the epoch trained (its resume state is written after its checkpoint)."""
        if self.resume is not None:
            self.resume.on_train_epoch_end(trainer)
        safe_point("epoch-end")

    @_callback
    def on_fit_epoch_end(self, trainer: Any) -> None:
        """Make sure training continues under the train phase; write the resume state of the epoch."""
        self._back_to_train()
        if self.resume is not None:
            self.resume.on_fit_epoch_end(trainer)
        safe_point("fit-epoch-end")

    @_callback
    def teardown(self, trainer: Any) -> None:
        """Restore the state the run started from (Ultralytics calls this in ``train()``'s ``finally``)."""
        error = sys.exc_info()[1]  # Ultralytics runs teardown in train()'s finally: the exception ending it
        try:
            try:
                self._record_ending(trainer, error)
            finally:
                _stream.untap(trainer)  # the trainer's own preprocess_batch again
        except BaseException as e:
            if error is None:
                self.end_run()
                raise
            note_restore_failure(error, e)
        self.end_run(error)

    def _record_ending(self, trainer: Any, error: BaseException | None) -> None:
        """Write the record of a run that ended before ``on_train_end`` (rank 0, once); never raise for it."""
        session = self.session
        if not (
            self.record
            and session is not None
            and "train" in session.phases
            and _rank() in {-1, 0}
            and not self._written_for(trainer)
        ):
            return
        try:
            self._write(trainer, error)
        except Exception as e:  # never mask the error that ended the run
            where = getattr(trainer, "save_dir", None)
            self.record_error = (
                f"could not write {RECORD_NAME}"
                + (f" in '{where}'" if where is not None else "")
                + f": {type(e).__name__}: {one_line(e)}"
            )
            warnings.warn(f"yolo-det: {self.record_error}", UserWarning, stacklevel=3)

    def _record_early_ending(self, error: BaseException) -> None:
        """Record a run that ended after the train phase began but before Ultralytics' ``train()`` ran."""
        if self._trainer is not None:
            try:
                self._record_ending(self._trainer, error)
            except BaseException as e:  # an interrupt while writing: keep the first one
                note_restore_failure(error, e)

    @staticmethod
    def _swapped_for(trainer: Any) -> bool:
        return state_of(trainer).swapped

    def _written_for(self, trainer: Any) -> bool:
        return state_of(trainer).record_written

    def _write(self, trainer: Any, error: BaseException | None, *, running: bool = False) -> None:
        """Write ``determinism.json`` for a run that ended with ``error`` (None: completed), or one still
        ``running``."""
        if not self.record or self.session is None:
            return
        save_dir = getattr(trainer, "save_dir", None)
        if save_dir is None:
            return
        stopped = error is not None and state_of(trainer).stopped_on_purpose  # a clean stop
        running = running and error is None
        # Digests of the files as they are on disk (this run holds the folder: they are its own files).
        files = set_aside_incomplete(weights_files(Path(save_dir) / "weights", self._weights_before, self._digests))
        weights: dict[str, Any] = {"files": files}
        if (error is None and not running) or stopped:
            last = Path(getattr(trainer, "last", Path(save_dir) / "weights" / "last.pt")).resolve()
            entry = next((f for f in files if Path(f["file"]).resolve() == last and f.get("sha256")), None)
            if entry is not None:
                weights["file"] = entry["file"]
                weights["sha256"] = entry["sha256"]
                self.weights_digest = entry["sha256"]
            ema = getattr(getattr(trainer, "ema", None), "ema", None)
            if isinstance(ema, torch.nn.Module):  # the final EMA in float32 (the file holds it in float16)
                weights["ema_fp32_sha256"] = state_dict_digest(ema)
        args = getattr(trainer, "args", None)
        ending = describe_ending(error)
        # stopped on purpose after a saved epoch (verify --resume-at): resumable, not failed
        if stopped and error is not None:
            ending = {"status": "interrupted", "stopped": one_line(error)}
        if running:
            ending = {"status": "running"}
        record = build_record(
            self.session,
            framework="ultralytics",
            status=ending.pop("status"),
            state_at_train_start=self._observed,
            weights=weights,
            run={k: getattr(args, k, None) for k in _RUN_ARGS} | {"save_dir": str(save_dir)},
            ranks=self._ranks,
            rank_problems=ranks_consistent(self._ranks) if self._ranks else [],
            imports=self._portable.get("imports", []),
            checkpoint_yaml_layers=self._portable.get("layers", {}),
            **(state_of(trainer).identity or {}),
            data_stream=_stream.data_stream_section(
                trainer, int(self.session.seeds()["seed"]), state_of(trainer).identity
            ),
            **ending,
        )
        if self.resume is not None:
            record.update(self.resume.record_fields(trainer, self.profile, self._previous, flush=not running))
        else:
            record.update(
                segments=segments_of(self._previous), epochs_completed=int(getattr(trainer, "start_epoch", 0) or 0)
            )
        self.record_path = write_record(save_dir, record)
        if not running:
            state_of(trainer).record_written = True

    # -- validation, prediction, export -----------------------------------------------------------------
    @_callback
    def on_val_start(self, validator: Any) -> None:
        """Enter the val phase (on top of train inside training) and hand the validator over (its loader)."""
        self._phase_start("val", validator)
        if self.session is not None:
            self.session.hand_over("validator", validator, phase="val")

    @_callback
    def on_val_end(self, validator: Any) -> None:
        """Leave the val phase."""
        self._phase_end("val", validator)

    @_callback
    def on_predict_start(self, predictor: Any) -> None:
        """Enter the deploy phase for prediction."""
        self._phase_start("deploy", predictor)

    @_callback
    def on_predict_batch_start(self, predictor: Any) -> None:
        """Hand the predictor over before its batch is preprocessed (again after a streaming pause)."""
        session = self.session
        if session is not None and session.phase == "deploy":
            session.hand_over("predictor", predictor, phase="deploy")

    @_callback
    def on_predict_end(self, predictor: Any) -> None:
        """Leave the deploy phase."""
        self._phase_end("deploy", predictor)

    @_callback
    def on_export_start(self, exporter: Any) -> None:
        """Enter the deploy phase for export."""
        self._phase_start("deploy", exporter)

    @_callback
    def on_export_end(self, exporter: Any) -> None:
        """Leave the deploy phase."""
        self._phase_end("deploy", exporter)


# ---------------------------------------------------------------------------------------------------------
# YOLO model objects


def _guarded(plugin: UltralyticsPlugin, name: str, method: Callable[..., Any], owner: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        from ..analysis.gate import check_arguments
        from ..core.untrusted.allow import allowed_user_modules
        from ..core.untrusted.safeload import guarded_torch_load

        net = getattr(owner, "model", None)
        # the classes of the model being run are the user's own (built in this process): its checkpoints hold them
        own = {type(m).__module__ for m in net.modules()} if isinstance(net, torch.nn.Module) else set()
        with allowed_user_modules(own):
            check_arguments(kwargs)  # the one gate: every path-valued argument, before Ultralytics reads it
            with guarded_torch_load():  # whatever Ultralytics then loads goes through the allow-list
                return _call(*args, **kwargs)

    def _call(*args: Any, **kwargs: Any) -> Any:
        if name == "predict" and kwargs.get("stream"):
            return _guarded_stream(plugin, method(*args, **kwargs))
        if name == "export":
            return _export_standard(plugin, method, owner, args, kwargs)
        if name == "train":
            kwargs = _resume_into_its_folder(owner, kwargs)
            with stop_signals(), plugin.guard(), terminate_via_launcher():
                lock = _lock_fixed_folder(owner, kwargs)
                try:
                    return method(*args, **kwargs)
                finally:
                    if lock is not None:
                        lock.release()
        with plugin.guard():
            return method(*args, **kwargs)

    call._yolo_det_original = method  # type: ignore[attr-defined]
    return call


def _export_standard(
    plugin: UltralyticsPlugin, method: Callable[..., Any], owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Export with standard PyTorch modules (yolo-det layers turned back), then put them back; then, when the
    plugin keeps records, compare the export with the PyTorch model and write the export record beside it
    (:mod:`yolo_det.integrations.export_parity`)."""
    net = getattr(owner, "model", None)
    with plugin.guard() as session:
        records = unswap_modules(net) if isinstance(net, torch.nn.Module) else []
        try:
            result = method(*args, **kwargs)
        finally:
            if records and isinstance(net, torch.nn.Module):
                restore(net, records)
        if plugin.record and result and Path(str(result)).exists():
            from .export_parity import write_export_record

            with session.phase_scope("deploy"):
                plugin.export_record_path = write_export_record(owner, str(result), profile=plugin.profile)
    return result


def _resume_checkpoint(args: dict[str, Any], model: Any = None) -> str | None:
    """The checkpoint a training with ``args`` resumes from (None when it does not resume)."""
    resume = args.get("resume")
    if isinstance(resume, (str, Path)) and str(resume).strip() not in {"", "False", "false", "True", "true"}:
        return str(resume)
    if resume is True or str(resume).strip() in {"True", "true"}:
        if model is not None:
            ckpt = getattr(model, "ckpt_path", None)
            return str(ckpt) if ckpt else None
        if isinstance(args.get("model"), (str, Path)) and str(args["model"]).endswith(".pt"):
            return str(args["model"])
        try:
            from ..core.compat import get_latest_run

            return get_latest_run() or None
        except Exception:
            return None
    return None


def _resume_into_its_folder(model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of ``model.train(**kwargs)`` with ``save_dir`` set to the folder holding the resumed checkpoint
    (:func:`yolo_det.core.resume.resume_save_dir`); unchanged when the training does not resume."""
    from ..core.resume import resume_save_dir

    args = {**getattr(model, "overrides", {}), **kwargs}
    ckpt = _resume_checkpoint(args, model)
    if ckpt is None:
        return kwargs
    return {**kwargs, "save_dir": resume_save_dir(ckpt, args.get("save_dir"))}


def _check_resume_folder(trainer: Any) -> None:
    """Refuse a resumed trainer whose run folder is not the folder holding its checkpoint (a trainer built
    without yolo-det's routes, e.g. a plugin registered on it later)."""
    if not getattr(trainer, "resume", False):
        return
    from ..core.resume import resume_folder

    ckpt = str(getattr(trainer.args, "resume", None) or getattr(trainer.args, "model", ""))
    folder = resume_folder(ckpt, requested=None)
    save_dir = getattr(trainer, "save_dir", None)
    if save_dir is not None and Path(save_dir).resolve() != folder.resolve():
        from ..core.errors import ConfigError

        raise ConfigError(
            f"cannot resume '{ckpt}' into '{save_dir}': a resumed run writes into the folder that holds "
            f"its checkpoint ('{folder}'); train with yolo_det.attach(model) or "
            "trainer=yolo_det.trainer_class(...), which pass that folder to Ultralytics"
        )


def _lock_fixed_folder(model: Any, kwargs: dict[str, Any]) -> runlock.RunLock | None:
    """Lock the run folder of ``model.train(**kwargs)`` before Ultralytics writes into it (see
    :func:`_lock_planned_folder`)."""
    if kwargs.get("cfg"):
        return None
    args = {**getattr(model, "overrides", {}), **kwargs, "task": getattr(model, "task", None), "mode": "train"}
    return _lock_planned_folder(None, args)


def _lock_planned_folder(cfg: Any, overrides: dict[str, Any] | None) -> runlock.RunLock | None:
    """Lock the run folder a trainer built from ``cfg``/``overrides`` will use, before it writes anything,
    when the folder's name is fixed (``exist_ok=True`` or ``save_dir=``); a fresh folder (Ultralytics
    numbers it) is locked when training starts. Resumed runs are locked when training starts too."""
    if _rank() != -1:
        return None
    try:
        from ..core.compat import DEFAULT_CFG, DEFAULT_CFG_DICT, get_cfg, get_save_dir

        overrides = {k: v for k, v in (overrides or {}).items() if k in DEFAULT_CFG_DICT}
        args = get_cfg(DEFAULT_CFG if cfg is None else cfg, overrides)
        if getattr(args, "resume", None) or not (getattr(args, "exist_ok", False) or getattr(args, "save_dir", None)):
            return None
        folder = get_save_dir(args)
    except Exception:  # Ultralytics reports bad arguments its own way; the later lock still holds
        return None
    return runlock.acquire(folder)


def _guarded_stream(plugin: UltralyticsPlugin, gen: Iterator[Any]) -> Iterator[Any]:
    """Run a streaming prediction under the deploy phase only while the generator runs.

    Between items (while the caller's loop body runs) the session is suspended: the caller sees their
    own flags, environment and warning hooks, and changes they make there are what is given back at the
    end. Inside another run of the same plugin the stream simply runs under that run's phases.
    """
    if plugin.session is not None and plugin.session.active:
        yield from gen
        return
    plugin.begin_run("stream")
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration:
                break
            saved = plugin._suspend()
            try:
                yield item
            finally:
                plugin._resume(saved)
    except BaseException as error:
        try:
            close = getattr(gen, "close", None)
            if callable(close):
                close()
        except BaseException as e:
            note_restore_failure(error, e)
        plugin.end_run(error)
        raise
    plugin.end_run()


def attach(model: Any, profile: Profile | str = "repro", *, record: bool = True) -> UltralyticsPlugin:
    """Make an ``ultralytics.YOLO`` model run under ``profile``.

    Registers the plugin's callbacks on the model and guards ``train``, ``val``, ``predict`` and
    ``export`` so the process-wide state is restored after each call, also when it raises. Attaching
    again returns the same plugin (switched to ``profile``); callbacks are never registered twice.

    Args:
        model: An ``ultralytics.YOLO`` (or any ``ultralytics.engine.model.Model``).
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.core.profiles.Profile`.
        record: Write ``determinism.json`` into each training run directory.

    Returns:
        The plugin (``plugin.record_path`` and ``plugin.weights_digest`` describe the last training run).
    """
    if not hasattr(model, "callbacks") or not hasattr(model, "add_callback"):
        raise YoloDetError(f"attach() needs an ultralytics YOLO model, got {type(model).__name__}")
    plugin: UltralyticsPlugin | None = model.__dict__.get(_ATTACHED)
    if plugin is not None:
        plugin.profile = load_profile(profile)
        plugin.record = record
    else:
        plugin = UltralyticsPlugin(profile, record=record)
        model.__dict__[_ATTACHED] = plugin
        for name in _GUARDED:
            model.__dict__[name] = _guarded(plugin, name, getattr(model, name), model)
    plugin.register(model.callbacks)
    return plugin


def detach(model: Any) -> None:
    """Undo :func:`attach`: remove the callbacks and the guards. No-op if not attached."""
    plugin = model.__dict__.pop(_ATTACHED, None)
    if plugin is None:
        return
    for name in _GUARDED:
        model.__dict__.pop(name, None)
    for event in list(model.callbacks):
        model.callbacks[event] = [f for f in model.callbacks[event] if not _is_plugin_callback(f)]


def _task_trainer(task: str) -> type:
    if task not in TASK_TRAINERS:
        try:  # a task of a newer Ultralytics (its YOLO class maps every task to its trainer)
            from ultralytics import YOLO

            return YOLO.task_map.fget(None)[task]["trainer"]  # type: ignore[attr-defined]
        except Exception:
            raise YoloDetError(
                f"no Ultralytics trainer for task '{task}'; choose from {', '.join(TASK_TRAINERS)} "
                "or pass base= (a BaseTrainer subclass)"
            ) from None
    return task_trainer(task)


def _trainer_task(cfg: Any, overrides: dict[str, Any] | None) -> str:
    """The task a trainer is built for: ``task=`` of the arguments Ultralytics passes, else the model's."""
    over = overrides or {}
    task = over.get("task")
    if not task and isinstance(cfg, dict):
        task = cfg.get("task")
    if not task:
        model = over.get("model")
        if isinstance(model, (str, Path)):
            from ..analysis.models import model_task

            task = model_task(str(model))
    return str(task or "detect")


def _resume_overrides(overrides: dict[str, Any] | None) -> dict[str, Any] | None:
    """A trainer's ``overrides`` with ``save_dir`` set to the folder holding the resumed checkpoint."""
    from ..core.resume import resume_save_dir

    ckpt = _resume_checkpoint(overrides or {})
    if ckpt is None or overrides is None:
        return overrides
    return {**overrides, "save_dir": resume_save_dir(ckpt, overrides.get("save_dir"))}


def _with_profile(base: Any, resolved: Profile, record: bool) -> type:
    """``base`` extended so that it trains under ``resolved``."""

    def __init__(
        self: Any,
        cfg: Any = None,
        overrides: dict[str, Any] | None = None,
        _callbacks: dict[str, list[Any]] | None = None,
    ) -> None:
        from ..core.compat import DEFAULT_CFG
        from ..core.compat import callbacks as ul_callbacks

        plugin = UltralyticsPlugin(type(self).yolo_det_profile, record=type(self).yolo_det_record)
        self.yolo_det = plugin
        plugin.begin_run(owner="trainer-class")  # baseline before init_seeds touches anything
        try:
            lock = _lock_planned_folder(cfg, overrides)
            if lock is not None:
                plugin._locks.append(lock)
            overrides = _resume_overrides(overrides)
            cbs = {k: list(v) for k, v in (_callbacks or ul_callbacks.get_default_callbacks()).items()}
            plugin.register(cbs)
            base.__init__(self, DEFAULT_CFG if cfg is None else cfg, overrides, cbs)
            plugin._ensure_train(self)  # DDP ranks > 0 get no on_pretrain_routine_start
        except BaseException as error:
            plugin._record_early_ending(error)
            plugin.end_run(error)
            raise

    def train(self: Any) -> Any:
        with stop_signals(), terminate_via_launcher():
            try:
                result = base.train(self)
            except BaseException as error:
                self.yolo_det.end_run(error)
                raise
            self.yolo_det.end_run()
            return result

    return type(
        f"YoloDet{base.__name__}",
        (base,),
        {
            "__init__": __init__,
            "train": train,
            "yolo_det_profile": resolved,
            "yolo_det_record": record,
            "__doc__": f"{base.__name__} under the yolo-det profile '{resolved.name}'.",
            "__module__": __name__,
        },
    )


def trainer_class(profile: Profile | str = "repro", base: type | None = None, *, record: bool = True) -> type:
    """Return a trainer class that trains under ``profile``: ``model.train(trainer=trainer_class("repro"))``.

    Args:
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.core.profiles.Profile`.
        base: The trainer to extend (any ``ultralytics.engine.trainer.BaseTrainer`` subclass). By default the
            trainer of the model's task, as Ultralytics picks it: ``DetectionTrainer``, ``SegmentationTrainer``,
            ``PoseTrainer``, ``OBBTrainer`` or ``ClassificationTrainer`` (the task comes from the ``task``
            argument Ultralytics passes the trainer, else from the model YAML). The class returned then
            subclasses ``DetectionTrainer``; an instance for another task is of that task's trainer, extended
            the same way.
        record: Write ``determinism.json`` into the run directory.
    """
    resolved = load_profile(profile)
    from ..core.compat import BaseTrainer

    if base is not None:
        if not inspect.isclass(base) or not issubclass(base, BaseTrainer):
            raise YoloDetError(f"trainer_class() needs a BaseTrainer subclass as base, got {base!r}")
        return _with_profile(base, resolved, record)
    made: dict[str, type] = {}

    def for_task(task: str) -> type:
        if task not in made:
            made[task] = _with_profile(_task_trainer(task), resolved, record)
        return made[task]

    detect = for_task("detect")

    def __new__(
        cls: type,
        cfg: Any = None,
        overrides: dict[str, Any] | None = None,
        _callbacks: dict[str, list[Any]] | None = None,
    ) -> Any:
        task = _trainer_task(cfg, overrides)
        if task == "detect":
            return object.__new__(cls)
        return for_task(task)(cfg, overrides, _callbacks)  # not an instance of cls: its __init__ has run

    return type(
        "YoloDetTrainer",
        (detect,),
        {
            "__new__": __new__,
            "yolo_det_profile": resolved,
            "yolo_det_record": record,
            "yolo_det_trainer_for": staticmethod(for_task),
            "__doc__": f"The trainer of the model's task under the yolo-det profile '{resolved.name}'.",
            "__module__": __name__,
        },
    )
