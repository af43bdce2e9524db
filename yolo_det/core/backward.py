"""Deterministic algorithms off exactly while the backward pass runs.

Some CUDA backward kernels (adaptive max pooling, grid_sample, bicubic upsampling, ...) have no
deterministic implementation: under strict ``torch.use_deterministic_algorithms(True)`` they raise.
A profile with ``backward: disable`` keeps the flag on for the forward pass and turns it off only while
autograd runs, then puts it back, on error too. No installed file is edited.

Two ways in:

- :func:`toggled_backward` / :func:`backward_scope` for hand-written loops::

      with yolo_det.backward_scope():
          scaler.scale(loss).backward()

- :class:`ToggleScaler`, a wrapper around a ``GradScaler`` (enabled or not) whose ``scale(loss)`` returns
  a tensor whose ``.backward()`` runs inside the scope. The Ultralytics and YOLOv5 integrations put it
  in place of the training loop's scaler, so ``scaler.scale(loss).backward()`` needs no change.

The flag is read when each backward kernel runs, so turning it off around the forward call is not
enough; this module turns it off around the autograd call itself. With the flag off, the
deterministic paths of ``index_put``/``scatter_add``/``gather`` backward are off as well: this buys
compatibility, not bitwise reproducibility of backward.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .nesting import NestedPatch

__all__ = ["ToggleScaler", "backward_scope", "toggle_count", "toggled_backward"]

_lock = threading.Lock()
_count = 0


def toggle_count() -> int:
    """How many backward passes ran with determinism switched off in this process."""
    return _count


@contextmanager
def backward_scope(enabled: bool = True) -> Iterator[None]:
    """Turn deterministic algorithms off for the block, then restore the exact previous mode.

    Nested scopes (and scopes entered from several threads) restore once, when the outermost exits.

    Args:
        enabled: When False the block runs unchanged (lets callers write one code path).
    """
    if not enabled:
        yield
        return
    with _off.scope():
        yield


def _switch_off() -> tuple[bool, bool]:
    global _count
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(False)
    _count += 1
    return saved


def _switch_back(saved: tuple[bool, bool]) -> None:
    on, warn_only = saved
    if on:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    else:
        torch.use_deterministic_algorithms(False)


_off = NestedPatch(_switch_off, _switch_back, lock=_lock)


def toggled_backward(tensor: torch.Tensor, *args: Any, disable_determinism: bool = True, **kwargs: Any) -> None:
    """``tensor.backward(*args, **kwargs)`` with deterministic algorithms off while autograd runs.

    Args:
        tensor: The (scaled) loss.
        *args: Passed to :meth:`torch.Tensor.backward` (``gradient``, ``retain_graph``, ...).
        disable_determinism: False runs a plain backward (so one call site serves every profile).
        **kwargs: Passed to :meth:`torch.Tensor.backward`.
    """
    with backward_scope(disable_determinism):
        torch.Tensor.backward(tensor, *args, **kwargs)


def _gated(tensor: torch.Tensor) -> torch.Tensor:
    """Return a tensor equal to ``tensor`` (same autograd graph) whose ``.backward()`` runs in the scope."""

    # A fresh alias, so the caller's tensor keeps its own .backward: an identity view adds one trivial node.
    tensor_out = tensor.view_as(tensor) if tensor.requires_grad else tensor

    def gated_backward(*args: Any, **kwargs: Any) -> None:
        try:
            toggled_backward(tensor_out, *args, **kwargs)
        finally:
            tensor_out.__dict__.pop("backward", None)  # break the tensor -> closure -> tensor cycle

    tensor_out.backward = gated_backward  # type: ignore[method-assign]
    return tensor_out


class ToggleScaler:
    """A ``GradScaler`` stand-in whose ``scale(loss).backward()`` runs with determinism off.

    Every attribute and method other than :meth:`scale` is the wrapped scaler's (``unscale_``, ``step``,
    ``update``, ``state_dict``, ``is_enabled``, ...), so training loops, checkpointing and NaN recovery work
    unchanged. ``ToggleScaler.unwrap(obj)`` returns the original scaler.

    Args:
        scaler: The training loop's scaler (enabled or disabled).
        enabled: Whether backward passes are toggled; False makes the wrapper transparent.
    """

    def __init__(self, scaler: Any, *, enabled: bool = True) -> None:
        object.__setattr__(self, "_scaler", scaler)
        object.__setattr__(self, "_enabled", enabled)

    @staticmethod
    def unwrap(obj: Any) -> Any:
        """Return the scaler inside any number of ToggleScaler wrappers."""
        while isinstance(obj, ToggleScaler):
            obj = object.__getattribute__(obj, "_scaler")
        return obj

    @property
    def toggling(self) -> bool:
        """Whether ``scale(loss).backward()`` switches determinism off."""
        return bool(object.__getattribute__(self, "_enabled"))

    def scale(self, outputs: Any) -> Any:
        """Scale like the wrapped scaler; a tensor result gets a ``.backward()`` that runs in the scope."""
        scaled = object.__getattribute__(self, "_scaler").scale(outputs)
        if self.toggling and isinstance(scaled, torch.Tensor):
            return _gated(scaled)
        return scaled

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_scaler"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_scaler"), name, value)

    def __repr__(self) -> str:
        return f"ToggleScaler({object.__getattribute__(self, '_scaler')!r}, enabled={self.toggling})"
