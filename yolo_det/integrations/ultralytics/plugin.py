"""The third way in, and what the other two register: :class:`UltralyticsPlugin` and its callbacks.

The callbacks say *when*: ``train`` from ``on_pretrain_routine_start`` (right after ``init_seeds``) until
``teardown``; ``val`` between ``on_val_start`` and ``on_val_end``; ``deploy`` between the predict and export
events. What happens then lives in the rooms around: the session and its phases (:mod:`.runs`), the record
(:mod:`.records`), the run folders (:mod:`.folders`), resuming (:mod:`.resume`) and the data stream
(:mod:`.data`). Registering on a trainer you build yourself:
``Trainer(overrides=..., _callbacks=UltralyticsPlugin(profile).register(callbacks.get_default_callbacks()))``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from ...core import runlock
from ...core.compat import EVENTS as _EVENTS
from ...core.compat import contact
from ...core.compat import world_size as trainer_world_size
from ...core.endings import one_line, weights_stats
from ...core.errors import YoloDetError
from ...core.modules import unwrap_model
from ...core.record import RECORD_NAME
from ...core.resume.lineage import previous_record
from ...core.signals import defer_stops, safe_point, stop_signals
from ...core.state import snapshot
from ...fixes import data_invariance as _data
from ...fixes.shards import sharded_loader
from ...session.distributed import gather_states, rank_info
from ...session.extensions import register_extension
from ...session.session import DeterminismSession, note_restore_failure
from ..identity import run_identity
from ..trainer_state import state_of
from . import data as _stream
from . import shards as _shards
from .batch_invariance import BatchInvariance
from .folders import check_resume_folder
from .guarantees import guarantees_section, say_broken, watch_flags
from .records import RunRecords, observe_final_record
from .resume import UltralyticsResume, earlier_profile
from .runs import process_rank
from .seam import has_seam, is_plugin_callback, say_missing
from .trackers import publish

__all__ = ["UltralyticsPlugin", "is_plugin_callback"]

# ``batch_invariant`` acts on the predictor and validator this plugin hands over: an extension of every session.
register_extension(BatchInvariance)
# The final record goes to the experiment trackers Ultralytics' own integrations run (MLflow, TensorBoard).
observe_final_record(publish)


def _callback(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn._yolo_det_callback = True  # type: ignore[attr-defined]
    return fn


def _phase_event(what: str, *, start: bool, doc: str) -> Callable[..., Any]:
    """The callback ``on_<what>_start``/``_end`` that only enters or leaves the phase of ``what`` (``val``: the val
    phase; ``predict``, ``export``: deploy) for the object it is given."""
    phase = "val" if what == "val" else "deploy"

    def event(self: Any, obj: Any) -> None:
        (self._phase_start if start else self._phase_end)(phase, obj)

    event.__name__ = f"on_{what}_{'start' if start else 'end'}"  # a bound callback pickles by its name
    event.__qualname__, event.__doc__ = f"UltralyticsPlugin.{event.__name__}", doc
    return _callback(event)


class UltralyticsPlugin(RunRecords):
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

    # -- registration ---------------------------------------------------------------------------------
    @property
    def callbacks(self) -> dict[str, list[Callable[[Any], None]]]:
        """``{event: [callback]}`` for Ultralytics' callback dicts."""
        return {event: [getattr(self, event)] for event in _EVENTS}

    def register(self, callbacks: dict[str, list[Callable[[Any], None]]]) -> dict[str, list[Callable[[Any], None]]]:
        """Add this plugin's callbacks to an Ultralytics callbacks dict, replacing any yolo-det callbacks
        already there (so registering twice, or after unpickling, never runs a phase twice)."""
        for event, fns in self.callbacks.items():
            existing = [f for f in callbacks.get(event, []) if not is_plugin_callback(f)]
            callbacks[event] = existing + fns
        return callbacks

    @contextmanager
    def guard(self, phase: str | None = None, baseline: Any = None) -> Iterator[DeterminismSession]:
        """Begin a run (and enter ``phase``) for the block; restore the baseline (or ``baseline``, see
        :meth:`begin_run`) afterwards, on error too.

        Nested guards (``model.val()`` called from inside a guarded call) leave the outer run alone.
        """
        outer = self.session is not None and self.session.active
        session = self.begin_run("guard", baseline)
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

    # -- training -------------------------------------------------------------------------------------
    def _ensure_train(self, trainer: Any) -> DeterminismSession:
        session = self.begin_run(owner="trainer")
        if "train" not in session.phases:
            save_dir = contact(trainer, "save_dir", "the run folder and its record")
            resumed = contact(trainer, "resume", "bitwise resume")
            check_resume_folder(trainer)  # refused here: nothing recorded or touched
            if process_rank() == -1:  # under DDP the launching process holds it
                self._locks.append(runlock.acquire(save_dir))  # refused here: nothing recorded or touched
            session.run_dir = str(save_dir)
            self._weights_before = weights_stats(Path(save_dir) / "weights")
            if resumed:  # read before this run's record replaces it
                self._previous = previous_record(str(trainer.args.resume or trainer.args.model))
            session.seed = int(contact(trainer.args, "seed", "the run's seed") or 0)
            rank, world_size = rank_info()
            session.rank = rank
            session.world_size = max(trainer_world_size(trainer), world_size, 1)
            self._trainer = trainer
            if process_rank() >= 0 and self._rank_signals is None:  # a DDP rank: the launcher stops it with SIGTERM
                self._rank_signals = ExitStack()
                self._rank_signals.enter_context(stop_signals())
            session.enter("train")
            state_of(trainer).build_loader = self._build_train_loader  # the seam's get_dataloader calls it
            self._release_stops = defer_stops()
            self._write_running(trainer)  # from the first second: never the record of another run next to ours
        return session

    def _build_train_loader(self, trainer: Any, loader: Any) -> Any:
        """The training loader the train phase asks for, built like Ultralytics' ``loader`` (the seam's
        ``get_dataloader``): keyed with ``data_invariance``, cut into this rank's shards with ``shards``, else
        ``loader`` itself."""
        session, settings = self.session, self.profile.train
        shards = settings.extra.get("shards")
        if session is None or not (shards or settings.extra.get("data_invariance", False)):
            return loader
        seed, epoch = int(session.seeds()["seed"]), _stream.start_epoch(trainer)
        if shards:
            layout = _shards.check(trainer, int(shards), session.rank, session.world_size)
            return sharded_loader(loader, seed, layout, epoch=epoch)
        return _data.keyed_loader(loader, seed, rank=max(int(session.rank), 0), epoch=epoch)

    def _warn_profile_change(self) -> None:
        """One line when a resumed run trains under another profile than the part before it."""
        before = earlier_profile(self._previous, self.profile)
        if self.resume is not None and self.resume.info is not None and before is not None:
            print(
                f"yolo-det: resuming under the profile '{self.profile.name}', the run so far trained under "
                f"'{before}': it continues, but not bit for bit as either would have (recorded)",
                file=sys.stderr,
                flush=True,
            )

    def _refuse_late_registration(self, trainer: Any) -> None:
        """Refuse a plugin registered on a trainer that already exists: Ultralytics ran ``on_pretrain_routine_start``
        (where the train phase seeds the run) in the trainer's constructor, without it, and has built the model
        since, so its initial weights would differ from every other route's for the same seed."""
        session = self.session
        if process_rank() not in {-1, 0} or (session is not None and "train" in session.phases):
            return
        raise YoloDetError(
            "the yolo-det plugin was registered on a trainer that already existed, so the run would start from "
            "other initial weights than yolo-det's routes give for the same seed; use yolo_det.attach(model), "
            "model.train(trainer=yolo_det.trainer_class(...)), or pass the callbacks when building the trainer: "
            "Trainer(overrides=..., _callbacks=UltralyticsPlugin(...).register(callbacks.get_default_callbacks()))"
        )

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
        if self.record and process_rank() in {-1, 0}:
            identity = run_identity(trainer, asked=self.asked)  # data, start model, arguments (before any swap)
            state_of(trainer).identity = identity
            self.adjusted = dict(identity.get("adjusted_args") or {})
        if process_rank() in {-1, 0}:
            say_missing(trainer, self.record, bool(settings.extra.get("data_invariance", False)))  # one line
        seam = has_seam(trainer)
        shards = settings.extra.get("shards")
        layout = _shards.check(trainer, int(shards), session.rank, session.world_size) if shards else None
        session.hand_over("loader", contact(trainer, "train_loader", "data_invariance and the data order"))
        if layout is not None:
            _shards.install(trainer, layout, int(session.seeds()["seed"]))
        if self.record and seam:
            _stream.tap(trainer)  # the fingerprint of the first batches, for the record
            watch_flags(trainer)  # the flags at every optimizer step, checked at the end
        model = contact(trainer, "model", "the layer swaps")
        model = getattr(model, "module", model)  # DistributedDataParallel, the shard step
        if settings.swaps != "none" and isinstance(model, torch.nn.Module) and not state_of(trainer).swapped:
            imgsz = contact(trainer.args, "imgsz", "the swap audit")
            session.prepare_model(model, imgsz=int(max(imgsz) if isinstance(imgsz, (list, tuple)) else imgsz))
            state_of(trainer).swapped = True
        session.wrap_scaler(trainer)  # backward: disable -> a ToggleScaler until the train phase ends
        self._stamp_checkpoint_yaml(trainer)
        self.resume = UltralyticsResume(
            int(session.seeds()["seed"]),
            rank=session.rank,
            gather=getattr(trainer, "yolo_det_launch", None) is not None,  # ranks > 0 write nothing in the run folder
        )
        self.resume.prepare(trainer)
        if seam:
            self.resume.hook_save(trainer, self._after_checkpoint, self._before_checkpoint_record)
        self._warn_profile_change()
        self._write_running(trainer)  # now with the data and model fingerprints
        safe_point("train-setup")

    def _stamp_checkpoint_yaml(self, trainer: Any) -> None:
        """The YAML the checkpoints store: the names of the classes yolo-det's layers stand for where the model
        names yolo-det's layers, and the constructor's arguments for a declared single-input block that keeps its
        channels (plain Ultralytics rebuilds it); yolo-det's names and arguments and the run's ``--import`` modules
        under a key Ultralytics ignores. One line says when plain Ultralytics cannot rebuild the model, and why."""
        from ...analysis.blocks import CHECKPOINT_KEY, declared_call, plain_needs, portable_config
        from ...analysis.names import active_imports

        imports = active_imports()
        model = unwrap_model(trainer.model)
        call_args: dict[int, list[Any]] = {}
        declared: dict[int, tuple[Any, int]] = {}
        for i, layer in enumerate(getattr(model, "model", None) or []):
            call = declared_call(layer)
            if call is None:
                continue
            c_in, c_out, args = call
            if isinstance(c_in, int) and c_in == c_out:
                call_args[i] = args  # plain Ultralytics passes these as they are and keeps the channels
            else:
                declared[i] = (c_in, c_out)
        for net in (model, getattr(trainer.ema, "ema", None)):
            cfg = getattr(net, "yaml", None)
            if isinstance(net, torch.nn.Module) and isinstance(cfg, dict):
                portable = portable_config(cfg, imports, call_args)
                net.__dict__["yaml"] = portable  # a new dict: the user's model keeps its own
                self._portable = dict(portable[CHECKPOINT_KEY])
                self._plain = plain_needs(portable, declared)
        reasons = self._plain.get("yolo_det") if self._plain else None
        if reasons and process_rank() in {-1, 0}:
            print(
                "yolo-det: the checkpoints of this run fine-tune only with yolo-det: "
                + "; ".join(reasons)
                + " (plain Ultralytics loads, validates, predicts and exports them with the blocks' modules "
                "importable)",
                file=sys.stderr,
                flush=True,
            )

    @_callback
    def on_train_start(self, trainer: Any) -> None:
        """Record the flags in force as the first batch starts, on every rank (a collective under DDP)."""
        self._observed = snapshot().to_dict()
        if self.session is not None:
            self._ranks = gather_states(self.session, str(trainer.device))
        safe_point("train-start")

    @_callback
    def on_train_end(self, trainer: Any) -> None:
        """Write ``determinism.json`` with the weights digest and remove the resume state, nothing being left to
        resume (rank 0).

        A record that cannot be written (read-only folder, ``determinism.json`` a directory) does not
        fail the finished training: the weights digest is kept, and :attr:`record_error` says why.
        """
        if process_rank() not in {-1, 0}:
            return
        self.record_error = None
        say_broken(guarantees_section(trainer, self.profile, self._observed))  # asked, and not in force: one line
        try:
            self._write(trainer, None)
        except Exception as e:  # the training itself succeeded
            self.record_error = (
                f"could not write {RECORD_NAME} in '{trainer.save_dir}': {type(e).__name__}: {one_line(e)}"
            )
            state_of(trainer).record_written = True  # the failure is this run's answer; never rewrite it as failed
            if self.warn_record_error:
                warnings.warn(f"yolo-det: {self.record_error}", UserWarning, stacklevel=2)
        if self.resume is not None:  # completed: nothing is left to resume, the states would only take space
            try:
                self.resume.discard_states(trainer)
            except Exception as e:
                warnings.warn(f"yolo-det: could not remove the resume state: {one_line(e)}", UserWarning, stacklevel=2)

    @_callback
    def on_train_epoch_start(self, trainer: Any) -> None:
        """Make sure training continues under the train phase; seed the epoch's data order (and restore
        the saved state on the first epoch of a resumed run).

        A keyed loader is told the epoch first: a stream of its batches started from here on (the new iterator
        the resume bookkeeping and Ultralytics' mosaic closing make) starts at this epoch."""
        self._back_to_train()
        if isinstance(trainer.train_loader, _data.KeyedLoader):
            trainer.train_loader.keys.set_epoch(int(contact(trainer, "epoch", "the epoch of the keyed training data")))
        if self.resume is not None:
            self.resume.on_train_epoch_start(trainer)
        safe_point("epoch-start")

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
        """Mark the epoch trained (its resume state is written with its checkpoint; a job's ranks gather theirs)."""
        safe_point("epoch-end")
        if self.resume is not None:
            self.resume.on_train_epoch_end(trainer)

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
                state_of(trainer).observers.clear()  # no batch observer outlives the run (their evidence stays)
                _shards.uninstall(trainer)  # and its own model
        except BaseException as e:
            if error is None:
                self.end_run()
                raise
            note_restore_failure(error, e)
        self.end_run(error)

    # -- validation, prediction, export -----------------------------------------------------------------
    @_callback
    def on_val_start(self, validator: Any) -> None:
        """Enter the val phase (on top of train inside training) and hand the validator over (its loader)."""
        self._phase_start("val", validator)
        if self.session is not None:
            self.session.hand_over("validator", validator, phase="val")

    on_val_end = _phase_event("val", start=False, doc="Leave the val phase.")
    on_predict_start = _phase_event("predict", start=True, doc="Enter the deploy phase for prediction.")

    @_callback
    def on_predict_batch_start(self, predictor: Any) -> None:
        """Hand the predictor over before its batch is preprocessed (again after a streaming pause)."""
        session = self.session
        if session is not None and session.phase == "deploy":
            session.hand_over("predictor", predictor, phase="deploy")

    on_predict_end = _phase_event("predict", start=False, doc="Leave the deploy phase.")
    on_export_start = _phase_event("export", start=True, doc="Enter the deploy phase for export.")
    on_export_end = _phase_event("export", start=False, doc="Leave the deploy phase.")
