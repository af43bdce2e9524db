"""Bitwise resume for Ultralytics training: what the plugin does at each save and on resume.

Driven by :class:`~yolo_det.integrations.ultralytics.UltralyticsPlugin`'s callbacks:

- ``on_train_epoch_start``: the data order of every epoch is a function of (seed, rank, epoch): the
  loader's generator is reseeded and its persistent iterator restarted, so the shuffle order and the
  worker seeds of epoch ``e`` never depend on what ran before (as ``DistributedSampler`` does with its
  ``set_epoch``). On the first epoch of a resumed run, the saved state is put back here, after everything
  Ultralytics' setup did and before the first resumed batch.
- the seam's batch observer (this one): the last optimizer step (Ultralytics keeps it in a local that restarts at
  -1 on resume: until a resumed run's first step the accumulation target is set for the one comparison it feeds,
  so the optimizer steps where the uninterrupted run did); after a save, a batch waits for the state's copy of
  what it changes (without the seam the copy is made before training goes on).
- ``on_train_epoch_end``, in a job an outside launcher started (``gather``): the ranks > 0 send rank 0 their state
  (only the EMA buffers change before the next epoch there, and the next validation sets them from rank 0's).
- the checkpoint save (rank 0): the seam's ``save_model`` writes the epoch's resume states (the gathered ones,
  then its own; atomically, each previous one kept as ``...prev.pt``) before the checkpoint: the folder always
  holds a checkpoint and every rank's matching state, whatever interrupts the run or whichever rank dies.
  Ultralytics' own writes of ``last.pt`` and ``best.pt`` are made atomic (a full disk half way leaves the previous
  checkpoint, not a file cut short; fault point ``weights-file-writing``). Once the checkpoint is written the
  previous state is removed, and the record is updated (``epochs_completed``).
- ``on_train_end`` (rank 0): the run completed, nothing is left to resume: :meth:`UltralyticsResume.discard_states`
  removes every rank's state, so a finished run keeps none.
- ``on_fit_epoch_end``: outside such a job, ranks > 0 (Ultralytics' own launcher) write their state
  (:func:`yolo_det.core.resume.state_path`) after the epoch's checkpoint. Resuming a job, the record says bitwise
  only when every rank found its own state.

What is saved and how it is put back: :mod:`.resume_state`; what the run knows of its earlier parts:
:mod:`.lineage`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ...core.compat import world_size as trainer_world_size
from ...core.fileio import atomic_write_bytes
from ...core.resume import (
    StateWriter,
    find_state,
    previous_state_path,
    set_rng_state,
    state_bytes,
    state_files,
    state_path,
)
from ...core.resume.lineage import segments_of, warn_no_state
from ...core.seeding import epoch_data_seed
from ...core.signals import safe_point
from ...core.testpoints import reach
from ...session.launcher import gather_at_rank0
from ..trainer_state import state_of
from .atomic_weights import with_atomic_weights
from .lineage import changed_overrides, mosaic_changed
from .resume_state import capture_state, restore_state
from .seam import BatchObserver, has_seam, observe, unobserve

__all__ = ["UltralyticsResume", "earlier_profile"]


_EARLY = ("model_buffers", "grads")


def earlier_profile(previous: dict[str, Any] | None, profile: Any) -> str | None:
    """The name of the profile the earlier part (its record: ``previous``) trained under, when its train phase is not
    ``profile``'s; None otherwise."""
    before = previous.get("profile") if isinstance(previous, dict) else None
    if isinstance(before, dict) and before.get("train") != profile.to_dict().get("train"):
        return str(before.get("name"))
    return None


class UltralyticsResume(BatchObserver):
    """Resume bookkeeping for one Ultralytics training (see the module docstring); one of the trainer seam's
    observers.

    Args:
        seed: The run's seed (data order).
        rank: This process's rank (0 for a single process).

    Attributes:
        info: What the record says about resuming (None for a fresh run).
        states_written: Number of state files written.
        seconds_saving: Time the training thread spent capturing them.
        seconds_waiting: Time an optimizer step waited for a state's copy (the write runs on a thread).
    """

    def __init__(self, seed: int, rank: int = 0, *, gather: bool = False) -> None:
        self.seed = seed
        self.rank = max(rank, 0)
        self.gather = gather
        self._gathered: dict[int, tuple[int, bytes]] = {}  # rank 0: the other ranks' states for the next checkpoint
        self.info: dict[str, Any] | None = None
        self.states_written = 0
        self.seconds_saving = 0.0
        self._pending: dict[str, Any] | None = None
        self._nb = 0
        self._i = 0
        self._ni = -1
        self._last_step = -1  # the uninterrupted run's last optimizer step
        self._local_last = -1  # Ultralytics' own counter in this process
        self._align = False  # until a resumed run's first step: Ultralytics' counter differs from the run's
        self._acc_true: int | None = None
        self._trained = False
        self._writer: StateWriter | None = None
        self._observed: Any = None  # the trainer whose seam it observes
        self.seconds_waiting = 0.0
        self._wrapped: Any = None
        self._mosaic_note: str | None = None
        self._mosaic_state: dict[str, Any] | None = None  # a resumed run's state until its first batch
        self.checkpointed: int | None = None

    def before_batch(self, trainer: Any, batch: Any) -> None:
        """Before a batch's forward changes BatchNorm statistics (and its backward the gradients), they must be
        copied; until a resumed run's first step, set the accumulation target the step comparison reads."""
        if self._writer is not None and self._writer._early:
            t0 = time.perf_counter()
            self._writer.wait_early()
            self.seconds_waiting += time.perf_counter() - t0
        if self._align and self._acc_true is None:
            acc = int(trainer.accumulate)
            self._acc_true = acc
            step = self._ni - self._last_step >= acc
            # Ultralytics steps when ni - local_last >= accumulate: choose the value that gives `step`.
            trainer.accumulate = (self._ni - self._local_last) + (0 if step else 1)

    def after_step(self, trainer: Any) -> None:
        """An optimizer step at this iteration: from now on Ultralytics' counter is the run's."""
        self._last_step = self._local_last = self._ni
        self._align = False

    def before_step(self, trainer: Any) -> None:
        """Before the optimizer changes parameters and moments, the state referring to them must be copied."""
        if self._writer is not None and self._writer._copied:
            t0 = time.perf_counter()
            self._writer.wait_copied()
            self.seconds_waiting += time.perf_counter() - t0

    # -- resume ---------------------------------------------------------------------------------------
    def prepare(self, trainer: Any) -> None:
        """After Ultralytics' setup (``on_pretrain_routine_end``): find and check the state of a resumed run."""
        if has_seam(trainer):
            observe(trainer, self, "bitwise resume")
            self._observed = trainer
        if not trainer.resume:
            return
        ckpt = Path(str(trainer.args.resume or trainer.args.model))
        ema, layout = trainer.ema, state_of(trainer).shards
        shards = layout.shards if layout is not None else None
        info, state, why = find_state(
            ckpt,
            rank=0 if shards else self.rank,  # under shards every rank holds rank 0's state, whatever the ranks
            start_epoch=int(trainer.start_epoch),
            ema=getattr(ema, "ema", None),
            updates=getattr(ema, "updates", None),
            world_size=trainer_world_size(trainer),
            shards=shards,
        )
        if state is not None:
            self._pending = self._mosaic_state = state
        if self.gather:  # one job: bitwise only when every rank found its own state; rank 0 says which did not
            problems = gather_at_rank0(why if state is None else None) or []
            missing = "; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p is not None)
            if missing:
                info.update(state_found=False, problem=missing)
                warn_no_state(ckpt, missing)
        elif state is None:
            warn_no_state(ckpt, why)
        info["overrides"] = changed_overrides(ckpt, trainer)
        if info["overrides"]:
            changed = ", ".join(f"{k}={now} (checkpoint: {was})" for k, (was, now) in info["overrides"].items())
            print(
                f"yolo-det: resuming with {changed}: the run continues, but not bit for bit as the uninterrupted "
                "run would have",
                file=sys.stderr,
                flush=True,
            )
        self.info = info

    def _restore(self, trainer: Any, state: dict[str, Any]) -> None:
        restore_state(trainer, state)
        self._last_step = int(state.get("last_opt_step", -1))
        self._local_last = -1
        self._align = self._observed is not None and self._last_step != self._local_last
        set_rng_state(state["rng"])

    # -- per epoch and batch --------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any) -> None:
        """Seed the epoch's data order; on the first resumed epoch, put the saved state back."""
        loader = trainer.train_loader
        if isinstance(loader.generator, torch.Generator):
            loader.generator.manual_seed(epoch_data_seed(self.seed, self.rank, int(trainer.epoch)))
            reset = getattr(loader, "reset", None)  # Ultralytics' InfiniteDataLoader
            if getattr(loader, "iterator", None) is not None and callable(reset):
                reset()
        self._nb = len(loader)
        self._i = 0
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._restore(trainer, state)

    def on_train_batch_start(self, trainer: Any) -> None:
        """Count iterations as Ultralytics does (``ni = i + nb * epoch``); at a resumed run's first batch, one line
        when its mosaic differs from the uninterrupted run's."""
        self._ni = self._i + self._nb * int(trainer.epoch)
        self._i += 1
        if self._mosaic_state is not None:
            state, self._mosaic_state = self._mosaic_state, None
            self._mosaic_note = mosaic_changed(trainer, state)
            if self._mosaic_note:
                print(f"yolo-det: {self._mosaic_note}", file=sys.stderr, flush=True)

    def on_train_batch_end(self, trainer: Any) -> None:
        """Give the accumulation target its own value back after a batch it was adjusted for."""
        if self._acc_true is not None:
            trainer.accumulate = self._acc_true
            self._acc_true = None

    def on_train_epoch_end(self, trainer: Any) -> None:
        """Mark the epoch as trained (its state is written with its checkpoint); in a job, gather the ranks'
        states to rank 0 (a collective: every rank calls it)."""
        self._trained = True
        if self.gather:
            self._gather_states(trainer)

    # -- saving ---------------------------------------------------------------------------------------
    def hook_save(self, trainer: Any, after_checkpoint: Any, before_checkpoint: Any = None) -> None:
        """Hook the trainer seam's ``save_model`` (rank 0): ``before_checkpoint(trainer)`` and the resume state
        before the checkpoint, ``after_checkpoint(trainer)`` after it (see the module docstring). :meth:`close`
        takes the hook off."""
        if self.rank != 0:
            return

        def around_save(trainer: Any, save: Any) -> Any:
            self._trained = False  # this epoch's state is written here, not at on_fit_epoch_end
            if before_checkpoint is not None:
                before_checkpoint(trainer)
            self._before_checkpoint(trainer)
            saved = with_atomic_weights(trainer, save)
            if saved is not False:
                self.checkpointed = int(trainer.epoch) + 1
            reach("checkpoint-written")
            if saved is not False:
                self._drop_previous(trainer)
            after_checkpoint(trainer)
            return saved

        state_of(trainer).around_save = around_save
        self._wrapped = trainer

    def _resumable_epoch(self, trainer: Any) -> int | None:
        epoch = int(trainer.epoch)
        if epoch + 1 >= int(trainer.epochs) or trainer.stop or not trainer.args.save:
            return None  # training ends: Ultralytics strips last.pt, there is nothing to resume
        return epoch

    def _before_checkpoint(self, trainer: Any) -> None:
        """Write the state of the checkpoint about to be saved, keeping the previous one as ``...prev.pt``."""
        epoch = self._resumable_epoch(trainer)
        if epoch is None:
            return
        last = Path(trainer.last)
        gathered, self._gathered = self._gathered, {}
        for rank, (of, data) in sorted(gathered.items()):
            if of == epoch:
                if state_path(last, rank).is_file():
                    os.replace(state_path(last, rank), previous_state_path(last, rank))
                atomic_write_bytes(state_path(last, rank), data)
                self.states_written += 1
        reach("rank-states-written")
        path = state_path(last, self.rank)
        if path.is_file():  # it matches the checkpoint still on disk until the new one replaces it
            os.replace(path, previous_state_path(last, self.rank))
        self._submit(trainer, path, epoch)
        if self._writer is not None:
            self._writer.wait()  # on disk before the checkpoint is
        reach("resume-state-written")

    def _drop_previous(self, trainer: Any) -> None:
        """The new checkpoint is on disk: the state of the one before matches no file any more."""
        last = Path(trainer.last)
        for path in state_files(last):
            if path.name.endswith("prev.pt"):
                path.unlink(missing_ok=True)

    def discard_states(self, trainer: Any) -> list[Path]:
        """The run completed (its ``last.pt`` is final, Ultralytics refuses to resume it): remove every rank's
        resume state of ``last.pt``; return the files removed."""
        self.flush()
        last = Path(trainer.last)
        removed = []
        for path in state_files(last):
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
        return removed

    def _submit(self, trainer: Any, path: Path, epoch: int) -> None:
        t0 = time.perf_counter()
        if self._writer is None:
            self._writer = StateWriter()
        # BatchNorm buffers and pending gradients change in the next forward/backward, everything else in the
        # next optimizer step: the writer copies them first, and the two hooks wait for what they need.
        self._writer.submit(path, self.capture(trainer, epoch), early=_EARLY)
        if self._observed is None:  # no observer holds the training back until the copies are made
            self._writer.wait_copied()
        self.states_written += 1
        self.seconds_saving += time.perf_counter() - t0

    def on_fit_epoch_end(self, trainer: Any) -> None:
        """Ranks without a checkpoint (DDP ranks > 0 of Ultralytics' own launcher), or a trainer whose save is not
        wrapped: write this rank's resume state after the epoch's checkpoint (not after the final epoch). In a job
        the states went with the checkpoint."""
        trained, self._trained = self._trained, False
        if not trained or self.gather:
            return  # final_eval's extra on_fit_epoch_end, an epoch redone, written with the checkpoint, or sent
        epoch = self._resumable_epoch(trainer)
        if epoch is None:
            return
        last = Path(trainer.last)
        if self.rank == 0 and not last.is_file():
            return
        self._submit(trainer, state_path(last, self.rank), epoch)

    def _gather_states(self, trainer: Any) -> None:
        """Every rank > 0 sends its state of the epoch just trained to rank 0, which keeps them for the epoch's
        checkpoint (a collective: every rank calls it at every ``on_train_epoch_end``)."""
        mine: tuple[int, bytes] | None = None
        if self.rank > 0:
            epoch = self._resumable_epoch(trainer)
            if epoch is not None:
                mine = (epoch, state_bytes(self.capture(trainer, epoch)))
        safe_point("states-gathering")
        out = gather_at_rank0(mine)
        if out is None or self.rank != 0:
            return
        self._gathered = {
            rank: (int(item[0]), item[1])
            for rank, item in enumerate(out)
            if rank > 0 and isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes)
        }

    def capture(self, trainer: Any, epoch: int) -> dict[str, Any]:
        """The state the rest of the run depends on (:func:`~.resume_state.capture_state`)."""
        return capture_state(
            trainer, epoch, seed=self.seed, rank=self.rank, last_opt_step=self._last_step, batches_per_epoch=self._nb
        )

    def record_fields(
        self, trainer: Any, profile: Any, previous: dict[str, Any] | None, *, flush: bool = True
    ) -> dict[str, Any]:
        """What ``determinism.json`` says about resuming: ``resume`` (None for a fresh run), ``segments``
        (the records of the earlier parts, oldest first), ``resume_states_written`` and ``epochs_completed``
        (epochs checkpointed). ``flush``: wait for the state writes first (at the end of a run)."""
        error = None
        try:
            if flush:
                self.flush()
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            print(f"yolo-det: could not write the resume state: {error}", file=sys.stderr, flush=True)
        segments = segments_of(previous, self.info.get("epoch")) if self.info is not None else []
        reasons = [] if self.info is None else self._reasons(profile, previous)
        return {
            "resume": None
            if self.info is None
            else {
                **self.info,
                "bitwise_expected": not reasons,
                "reasons": reasons,
            },
            "segments": segments,
            "resume_states_written": self.states_written,
            "resume_state_seconds": round(self.seconds_saving, 4),
            "resume_state_write_seconds": round(self.seconds_writing, 4),
            "resume_state_wait_seconds": round(self.seconds_waiting, 4),
            "epochs_completed": self.epochs_checkpointed(trainer),
            **({"resume_state_error": error} if error else {}),
        }

    def _reasons(self, profile: Any, previous: dict[str, Any] | None) -> list[str]:
        """Why the resumed run is not expected to end bit for bit as the uninterrupted one (empty: it is)."""
        info = self.info or {}
        train = profile.train
        reasons = []
        if not info.get("state_found"):
            reasons.append(f"no matching resume state ({info.get('problem', 'not found')})")
        if not train.deterministic or train.backward != "keep":
            reasons.append(f"the profile '{profile.name}' is not deterministic in training")
        before = earlier_profile(previous, profile)
        if before is not None:
            reasons.append(f"the earlier part trained under the profile '{before}', this part under '{profile.name}'")
        for key, (was, now) in (info.get("overrides") or {}).items():
            reasons.append(f"{key}={now} differs from the checkpoint's {key}={was}")
        if self._mosaic_note:
            reasons.append(self._mosaic_note)
        return reasons

    def epochs_checkpointed(self, trainer: Any) -> int:
        """Epochs whose checkpoint is on disk: the epoch of ``last.pt`` + 1 (read from the trainer's count of
        saved epochs, :attr:`checkpointed`, when this part saved any; the resumed-from epoch otherwise)."""
        if self.checkpointed is not None:
            return self.checkpointed
        return int(trainer.start_epoch)

    @property
    def seconds_writing(self) -> float:
        """Time the background thread spent serialising and writing states."""
        return self._writer.seconds_writing if self._writer is not None else 0.0

    def flush(self) -> None:
        """Wait until every state is on disk."""
        if self._writer is not None:
            self._writer.wait()

    def close(self) -> None:
        """Wait for the state writes; take the observer and the save hook off the trainer."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as e:
                print(
                    f"yolo-det: could not write the resume state (rank {self.rank}): {type(e).__name__}: {e}",
                    file=sys.stderr,
                    flush=True,
                )
        self._pending = None
        self._align = False
        observed, self._observed = self._observed, None
        if observed is not None:
            unobserve(observed, self)
        wrapped, self._wrapped = self._wrapped, None
        if wrapped is not None:
            state_of(wrapped).around_save = None
