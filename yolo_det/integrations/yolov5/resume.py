"""Bitwise resume for a patched YOLOv5 ``train.py`` (``--det-profile``).

YOLOv5 keeps the objects a resume needs (model, EMA, scaler, loader, ``last_opt_step``) in local variables
of ``train()``. yolo-det reads them, never writes them, from ``train()``'s frame while one of YOLOv5's own
callbacks runs (the frame is found by its code object, the decorated function's), and puts state back in
place (``load_state_dict``, in-place copies). The one local that cannot be changed in place,
``last_opt_step``, is set through the patched line ``last_opt_step = ydet.last_opt_step(-1)``.

- ``on_train_epoch_start`` (every rank): on the first epoch of a resumed run, the saved state is restored here.
  Ranks > 0 write the state of the epoch that just ended here (YOLOv5 runs no callback on them after an epoch).
- ``on_train_batch_start``: ``train()``'s locals to :attr:`YOLOv5Resume.observe_batch` (the data fingerprint).
- ``on_fit_epoch_end`` (rank 0, after validation, right before the checkpoint is written): rank 0 writes
  its state. The state names the epoch and the EMA update count, so a state without its checkpoint (or the
  other way round) is recognised and not used.

What is saved beyond YOLOv5's checkpoint: the RNGs, the model and EMA in float32 (the checkpoint has them in
float16, and resuming builds the model from them), the AMP scaler (not in YOLOv5's checkpoint),
``last_opt_step`` and the per-class mAPs that ``--image-weights`` samples with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from ...core.modules import unwrap_model
from ...core.resume import find_state, get_rng_state, save_state, set_rng_state, state_path
from ...core.resume.lineage import warn_no_state

__all__ = ["YOLOv5Resume"]

_HOOKS = ("on_train_epoch_start", "on_train_batch_start", "on_fit_epoch_end")


def _state(module: Any) -> dict[str, torch.Tensor] | None:
    if not isinstance(module, torch.nn.Module):
        return None
    return {
        k: v.detach().float() if v.is_floating_point() else v.detach()
        for k, v in module.state_dict().items()
        if isinstance(v, torch.Tensor)
    }


class YOLOv5Resume:
    """Resume bookkeeping for one YOLOv5 training run.

    Args:
        code: The code object of YOLOv5's (undecorated) ``train`` function.
        seed: The user's ``--seed``.
        rank: This process's rank (0 for a single process).

    Attributes:
        info: What the record says about resuming (None for a fresh run).
        states_written: Number of state files written.
        seconds_saving: Time spent capturing and writing them.
    """

    def __init__(self, code: Any, seed: int, rank: int = 0) -> None:
        self.code = code
        self.seed = seed
        self.rank = max(rank, 0)
        self.info: dict[str, Any] | None = None
        self.states_written = 0
        self.seconds_saving = 0.0
        self._pending: dict[str, Any] | None = None
        self._callbacks: Any = None
        self._registered: list[tuple[str, Any]] = []
        self._last_epoch_seen: int | None = None
        #: Called with ``train()``'s locals at the start of every batch (the run points it at the data fingerprint).
        self.observe_batch: Callable[[dict[str, Any]], bool] | None = None

    # -- wiring ---------------------------------------------------------------------------------------
    def attach(self, callbacks: Any) -> None:
        """Register on YOLOv5's ``Callbacks`` object (undone by :meth:`detach`)."""
        register = getattr(callbacks, "register_action", None)
        if not callable(register):
            return
        self._callbacks = callbacks
        for hook in _HOOKS:
            fn = getattr(self, hook)
            register(hook, name="yolo-det-resume", callback=fn)
            self._registered.append((hook, fn))

    def detach(self) -> None:
        """Remove the callbacks :meth:`attach` registered."""
        table = getattr(self._callbacks, "_callbacks", None)
        if isinstance(table, dict):
            for hook, fn in self._registered:
                table[hook] = [a for a in table.get(hook, []) if a.get("callback") is not fn]
        self._registered.clear()
        self._callbacks = None

    def _frame(self) -> FrameType | None:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code is not self.code:
            frame = frame.f_back
        return frame

    # -- resume ---------------------------------------------------------------------------------------
    def last_opt_step(self, scope: dict[str, Any], default: int) -> int:
        """Called by the patched ``last_opt_step = ydet.last_opt_step(-1)`` line, with ``train()``'s locals."""
        opt = scope.get("opt")
        if not getattr(opt, "resume", False):
            return default
        ckpt = Path(str(getattr(opt, "weights", "")))
        ema = scope.get("ema")
        info, state, why = find_state(
            ckpt,
            rank=self.rank,
            start_epoch=int(scope.get("start_epoch", 0)),
            ema=getattr(ema, "ema", None),
            updates=getattr(ema, "updates", None) if ema is not None else None,
        )
        self.info = info
        if state is None:
            warn_no_state(ckpt, why)
            return default
        self._pending = state
        return int(state.get("last_opt_step", default))

    def _restore(self, scope: dict[str, Any], state: dict[str, Any]) -> None:
        model = unwrap_model(scope.get("model"))
        if isinstance(model, torch.nn.Module) and state.get("model") is not None:
            model.load_state_dict(state["model"])
        ema = scope.get("ema")
        if ema is not None and state.get("ema") is not None:
            ema.ema.load_state_dict(state["ema"])
            ema.updates = state["updates"]
        scaler = scope.get("scaler")
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        maps = scope.get("maps")
        if isinstance(maps, np.ndarray) and state.get("maps") is not None and maps.shape == tuple(state["maps"].shape):
            maps[:] = state["maps"].numpy()
        set_rng_state(state["rng"])

    # -- callbacks ------------------------------------------------------------------------------------
    def on_train_epoch_start(self, *args: Any, **kwargs: Any) -> None:
        """Ranks > 0 save the state of the epoch that ended; the first epoch of a resumed run restores the state."""
        frame = self._frame()
        if frame is None:
            return
        scope = frame.f_locals
        epoch = int(scope.get("epoch", 0))
        if self.rank > 0 and self._last_epoch_seen is not None:
            self._save(scope, self._last_epoch_seen)
        self._last_epoch_seen = epoch
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._restore(scope, state)

    def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
        """Show :attr:`observe_batch` ``train()``'s locals as it takes a batch, until it returns False."""
        observe = self.observe_batch
        frame = self._frame() if observe is not None else None
        if observe is not None and frame is not None and not observe(frame.f_locals):
            self.observe_batch = None

    def on_fit_epoch_end(self, *args: Any, **kwargs: Any) -> None:
        """Rank 0: save the state of this epoch (its checkpoint is written right after)."""
        frame = self._frame()
        if frame is None or self.rank > 0:
            return
        scope = frame.f_locals
        self._save(scope, int(scope.get("epoch", 0)))

    def _save(self, scope: dict[str, Any], epoch: int) -> None:
        opt = scope.get("opt")
        epochs = int(scope.get("epochs", 0))
        if epoch + 1 >= epochs or getattr(opt, "nosave", False) or getattr(opt, "evolve", False):
            return  # the final epoch, or no checkpoint: nothing to resume
        t0 = time.perf_counter()
        w = Path(str(getattr(opt, "save_dir", "."))) / "weights"
        ema = scope.get("ema")
        scaler = scope.get("scaler")
        maps = scope.get("maps")
        loader = scope.get("train_loader")
        generator = getattr(loader, "generator", None)
        state = {
            "epoch": epoch,
            "updates": getattr(ema, "updates", None),
            "rank": self.rank,
            "seed": self.seed,
            "rng": get_rng_state(),
            "model": _state(unwrap_model(scope.get("model"))),
            "ema": _state(getattr(ema, "ema", None)),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "last_opt_step": int(scope.get("last_opt_step", -1)),
            "maps": torch.from_numpy(np.asarray(maps, dtype=np.float64).copy()) if maps is not None else None,
            "data": {"generator": generator.get_state() if isinstance(generator, torch.Generator) else None},
        }
        w.mkdir(parents=True, exist_ok=True)
        save_state(state_path(w / "last.pt", self.rank), state)
        self.states_written += 1
        self.seconds_saving += time.perf_counter() - t0
