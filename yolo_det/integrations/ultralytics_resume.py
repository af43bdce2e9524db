"""Bitwise resume for Ultralytics training: what the plugin does at each save and on resume.

Driven by :class:`~yolo_det.integrations.ultralytics.UltralyticsPlugin`'s callbacks:

- ``on_train_epoch_start``: the data order of every epoch is a function of (seed, rank, epoch): the
  loader's generator is reseeded and its persistent iterator restarted, so the shuffle order and the
  worker seeds of epoch ``e`` never depend on what ran before (as ``DistributedSampler`` does with its
  ``set_epoch``). On the first epoch of a resumed run, the saved state is put back here, after everything
  Ultralytics' setup did and before the first resumed batch.
- ``on_train_batch_start``/``on_train_batch_end``: the iteration number and the last optimizer step
  (Ultralytics keeps that in a local variable that restarts at -1 on resume; while the resumed run's value
  differs, the accumulation target is adjusted for the one comparison it feeds, so the optimizer steps at
  the same iterations as in the uninterrupted run).
- ``on_fit_epoch_end``: after the checkpoint of the epoch is written, every rank writes its state
  (:func:`yolo_det.core.resume.state_path`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ..core.modules import unwrap_model
from ..core.resume import StateWriter, find_state, get_rng_state, set_rng_state, state_path
from ..core.seeding import epoch_data_seed

__all__ = ["NO_STATE_WARNING", "UltralyticsResume", "previous_record"]

_EARLY = ("model_buffers", "grads")

NO_STATE_WARNING = ("yolo-det: no resume state for {ckpt} ({why}); the run continues, but not bit for bit as "
                    "the uninterrupted run would have")



def previous_record(checkpoint: str | Path) -> dict[str, Any] | None:
    """The ``determinism.json`` of the run that wrote ``checkpoint`` (``<run>/weights/last.pt``), if any."""
    import json

    from ..core.record import RECORD_NAME

    path = Path(checkpoint).resolve().parent.parent / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _restore_buffer(dataset: Any, saved: list[int] | None) -> None:
    """Put back the dataset's mosaic buffer: the recently loaded images that mosaic draws its partners from.

    With ``workers=0`` it lives in the training process and carries over from epoch to epoch (with workers,
    each epoch's workers start from an empty one). The images are loaded again, in the saved order, which
    rebuilds the list exactly (``load_image`` appends what it loads).
    """
    buffer = getattr(dataset, "buffer", None)
    if saved is None or not isinstance(buffer, list) or not callable(getattr(dataset, "load_image", None)):
        return
    ims = getattr(dataset, "ims", None)
    if isinstance(ims, list) and getattr(dataset, "cache", None) != "ram":
        for i in buffer:
            ims[i] = None
            dataset.im_hw0[i] = dataset.im_hw[i] = None
    buffer.clear()
    for i in saved:
        dataset.load_image(i)


def _float_state(module: torch.nn.Module, *, buffers: bool | None = None) -> dict[str, torch.Tensor]:
    """The module's state dict (live tensors, the writer copies them); ``buffers`` True/False: only the
    buffers/only the parameters."""
    # keep_vars: the tensors themselves, no detach() here (under interception every torch call is dispatched
    # through a mode); the writer thread detaches and copies them.
    out = {}
    for k, v in module.state_dict(keep_vars=True).items():
        if buffers is not None:
            is_param = type(v) is torch.nn.Parameter or (
                type(v) is not torch.Tensor and isinstance(v, torch.nn.Parameter))
            if is_param == buffers:
                continue
        out[k] = v
    return out


class UltralyticsResume:
    """Resume bookkeeping for one Ultralytics training (see the module docstring).

    Args:
        seed: The run's seed (data order).
        rank: This process's rank (0 for a single process).

    Attributes:
        info: What the record says about resuming (None for a fresh run).
        states_written: Number of state files written.
        seconds_saving: Time the training thread spent capturing them.
        seconds_waiting: Time an optimizer step waited for a state's copy (the write runs on a thread).
    """

    def __init__(self, seed: int, rank: int = 0) -> None:
        self.seed = seed
        self.rank = max(rank, 0)
        self.info: dict[str, Any] | None = None
        self.states_written = 0
        self.seconds_saving = 0.0
        self._pending: dict[str, Any] | None = None
        self._nb = 0
        self._i = 0
        self._ni = -1
        self._last_step = -1  # the uninterrupted run's last optimizer step
        self._local_last = -1  # Ultralytics' own counter in this process
        self._gate: Any = None
        self._acc_true: int | None = None
        self._trained = False
        self._probe: torch.nn.Parameter | None = None
        self._writer: StateWriter | None = None
        self._barrier: Any = None
        self._forward_barrier: Any = None
        self.seconds_waiting = 0.0

    def _before_forward(self, *args: Any) -> None:
        """Before a forward changes BatchNorm statistics (and its backward the gradients), they must be copied."""
        if self._writer is not None and self._writer._early:
            import time

            t0 = time.perf_counter()
            self._writer.wait_early()
            self.seconds_waiting += time.perf_counter() - t0

    def _before_step(self, *args: Any) -> None:
        """Before the optimizer changes parameters and moments, the state referring to them must be written."""
        if self._writer is not None and self._writer._copied:
            import time

            t0 = time.perf_counter()
            self._writer.wait_copied()
            self.seconds_waiting += time.perf_counter() - t0

    # -- resume ---------------------------------------------------------------------------------------
    def prepare(self, trainer: Any) -> None:
        """After Ultralytics' setup (``on_pretrain_routine_end``): find and check the state of a resumed run."""
        model = unwrap_model(getattr(trainer, "model", None))
        if isinstance(model, torch.nn.Module):
            self._probe = next((p for p in model.parameters() if p.requires_grad), None)
            self._forward_barrier = model.register_forward_pre_hook(self._before_forward)
        optimizer = getattr(trainer, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "register_step_pre_hook"):
            self._barrier = optimizer.register_step_pre_hook(self._before_step)
        if not getattr(trainer, "resume", False):
            return
        ckpt = Path(str(trainer.args.resume or trainer.args.model))
        ema = getattr(trainer, "ema", None)
        info, state, why = find_state(ckpt, rank=self.rank, start_epoch=int(getattr(trainer, "start_epoch", 0)),
                                      ema=getattr(ema, "ema", None), updates=getattr(ema, "updates", None),
                                      world_size=max(int(getattr(trainer, "world_size", 1) or 1), 1))
        if state is not None:
            self._pending = state
        else:
            print(NO_STATE_WARNING.format(ckpt=ckpt, why=why), file=sys.stderr, flush=True)
        self.info = info

    def _restore(self, trainer: Any, state: dict[str, Any]) -> None:
        model = unwrap_model(trainer.model)
        model.load_state_dict({**state["model"], **(state.get("model_buffers") or {})})
        ema = getattr(trainer, "ema", None)
        if ema is not None and state.get("ema") is not None:
            ema.ema.load_state_dict(state["ema"])
            ema.updates = state["updates"]
        optimizer = getattr(trainer, "optimizer", None)
        if optimizer is not None and state.get("optimizer") is not None:
            saved = state["optimizer"]
            for group, current in zip(saved["param_groups"], optimizer.param_groups):
                if "fused" in current:
                    group["fused"] = current["fused"]  # the device in use picks the kernel, as Ultralytics does
            optimizer.load_state_dict(saved)
        grads = state.get("grads") or {}
        for name, p in model.named_parameters():
            if name in grads:
                p.grad = grads[name].to(device=p.device, dtype=p.dtype).clone()
        scaler = getattr(trainer, "scaler", None)
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        _restore_buffer(getattr(getattr(trainer, "train_loader", None), "dataset", None),
                        (state.get("data") or {}).get("buffer"))
        if state.get("accumulate") is not None:
            trainer.accumulate = int(state["accumulate"])
        self._last_step = int(state.get("last_opt_step", -1))
        self._local_last = -1
        if self._last_step != self._local_last:
            self._gate = model.register_forward_pre_hook(self._align_accumulate(trainer))
        set_rng_state(state["rng"])

    def _align_accumulate(self, trainer: Any) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if not module.training or self._acc_true is not None:
                return
            acc = int(trainer.accumulate)
            self._acc_true = acc
            step = self._ni - self._last_step >= acc
            # Ultralytics steps when ni - local_last >= accumulate: choose the value that gives `step`.
            trainer.accumulate = (self._ni - self._local_last) + (0 if step else 1)

        return hook

    # -- per epoch and batch --------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Any) -> None:
        """Seed the epoch's data order; on the first resumed epoch, put the saved state back."""
        loader = getattr(trainer, "train_loader", None)
        epoch = int(getattr(trainer, "epoch", 0))
        generator = getattr(loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(epoch_data_seed(self.seed, self.rank, epoch))
            reset = getattr(loader, "reset", None)
            if getattr(loader, "iterator", None) is not None and callable(reset):
                reset()
        self._nb = len(loader) if loader is not None else 0
        self._i = 0
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._restore(trainer, state)

    def on_train_batch_start(self, trainer: Any) -> None:
        """Count iterations as Ultralytics does (``ni = i + nb * epoch``)."""
        self._ni = self._i + self._nb * int(getattr(trainer, "epoch", 0))
        self._i += 1

    def on_train_batch_end(self, trainer: Any) -> None:
        """Note an optimizer step (Ultralytics zeroes the gradients right after each)."""
        stepped = self._probe is not None and self._probe.grad is None
        if self._acc_true is not None:
            trainer.accumulate = self._acc_true
            self._acc_true = None
        if stepped:
            self._last_step = self._local_last = self._ni
            if self._gate is not None:
                self._gate.remove()
                self._gate = None

    def on_train_epoch_end(self, trainer: Any) -> None:
        """Mark the epoch as trained (its state is written once its checkpoint is)."""
        self._trained = True

    # -- saving ---------------------------------------------------------------------------------------
    def on_fit_epoch_end(self, trainer: Any) -> None:
        """After the epoch's checkpoint: write this rank's resume state (not after the final epoch)."""
        if not self._trained:
            return  # final_eval's extra on_fit_epoch_end, or an epoch redone
        self._trained = False
        epoch = int(getattr(trainer, "epoch", 0))
        final = epoch + 1 >= int(getattr(trainer, "epochs", 0))
        if final or getattr(trainer, "stop", False) or not getattr(trainer.args, "save", True):
            return  # training ends: Ultralytics strips last.pt, there is nothing to resume
        last = Path(getattr(trainer, "last", Path(trainer.save_dir) / "weights" / "last.pt"))
        if self.rank == 0 and not last.is_file():
            return
        import time

        t0 = time.perf_counter()
        if self._writer is None:
            self._writer = StateWriter()
        # BatchNorm buffers and pending gradients change in the next forward/backward, everything else in the
        # next optimizer step: the writer copies them first, and the two hooks wait for what they need.
        self._writer.submit(state_path(last, self.rank), self.capture(trainer, epoch), early=_EARLY)
        self.states_written += 1
        self.seconds_saving += time.perf_counter() - t0

    def capture(self, trainer: Any, epoch: int) -> dict[str, Any]:
        """The state the rest of the run depends on (see :mod:`yolo_det.core.resume`)."""
        model = unwrap_model(trainer.model)
        ema = getattr(trainer, "ema", None)
        optimizer = getattr(trainer, "optimizer", None)
        scaler = getattr(trainer, "scaler", None)
        loader = getattr(trainer, "train_loader", None)
        dataset = getattr(loader, "dataset", None)
        generator = getattr(loader, "generator", None)
        return {
            "epoch": epoch,
            "updates": getattr(ema, "updates", None),
            "rank": self.rank,
            "world_size": max(int(getattr(trainer, "world_size", 1) or 1), 1),
            "seed": self.seed,
            "rng": get_rng_state(),
            "model": _float_state(model, buffers=False),
            "model_buffers": _float_state(model, buffers=True),
            "ema": _float_state(ema.ema) if ema is not None else None,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "grads": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
            "last_opt_step": self._last_step,
            "accumulate": getattr(trainer, "accumulate", None),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "data": {
                "generator": generator.get_state() if isinstance(generator, torch.Generator) else None,
                "mosaic": getattr(dataset, "mosaic", None),
                "buffer": [int(i) for i in buffer] if isinstance(buffer := getattr(dataset, "buffer", None), list)
                else None,
                "batches_per_epoch": self._nb,
            },
        }

    def record_fields(self, trainer: Any, profile: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
        """What ``determinism.json`` says about resuming: ``resume`` (None for a fresh run), ``segments``
        (the records of the earlier parts, oldest first), ``resume_states_written`` and ``epochs_completed``."""
        error = None
        try:
            self.flush()
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            print(f"yolo-det: could not write the resume state: {error}", file=sys.stderr, flush=True)
        segments: list[Any] = []
        if self.info is not None and previous is not None:
            segments = [*previous.get("segments", []), {k: v for k, v in previous.items() if k != "segments"}]
        train = profile.train
        return {
            "resume": None if self.info is None else {
                **self.info,
                "bitwise_expected": bool(self.info["state_found"] and train.deterministic and train.backward == "keep"),
            },
            "segments": segments,
            "resume_states_written": self.states_written,
            "resume_state_seconds": round(self.seconds_saving, 4),
            "resume_state_write_seconds": round(self.seconds_writing, 4),
            "resume_state_wait_seconds": round(self.seconds_waiting, 4),
            "epochs_completed": int(getattr(trainer, "epoch", -1)) + 1,
            **({"resume_state_error": error} if error else {}),
        }

    @property
    def seconds_writing(self) -> float:
        """Time the background thread spent serialising and writing states."""
        return self._writer.seconds_writing if self._writer is not None else 0.0

    def flush(self) -> None:
        """Wait until every state is on disk."""
        if self._writer is not None:
            self._writer.wait()

    def close(self) -> None:
        """Wait for the state writes; remove the hook left when a run ends during the first resumed epoch."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as e:
                print(f"yolo-det: could not write the resume state (rank {self.rank}): {type(e).__name__}: {e}",
                      file=sys.stderr, flush=True)
        if self._gate is not None:
            self._gate.remove()
            self._gate = None
        for handle in (self._barrier, self._forward_barrier):
            if handle is not None:
                handle.remove()
        self._barrier = self._forward_barrier = None
        self._pending = None
