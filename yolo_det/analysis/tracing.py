"""Dispatch-mode machinery shared by the audit's traces and the CUDA alert emulator.

Both watch a model run from inside torch: a ``TorchFunctionMode`` sees each call of the Python layer
(``F.interpolate``, ``F.pad``, ...) and a ``TorchDispatchMode`` sees every aten op, forward and the backward
that autograd runs in this thread. This module owns the parts they share:

- :class:`FunctionHook` and :class:`DispatchHook`: modes that hand each call to a handler
  ``handler(func, args, kwargs)``, which runs it (or a stand-in) and returns the result;
- the deterministic flag as one word (:func:`deterministic_mode`) and a block that sets it and puts the
  caller's flag back afterwards, on error too (:func:`deterministic_flag`);
- autograd-node metadata, the channel from a forward call to the backward ops of its nodes
  (:func:`node_metadata`, :func:`current_node`, :func:`output_node`);
- tensors inside nested outputs (:func:`tensors`) and whether a call computes nothing, on fake tensors
  (:func:`any_fake`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "DispatchHook",
    "FunctionHook",
    "Handler",
    "any_fake",
    "current_node",
    "deterministic_flag",
    "deterministic_mode",
    "node_metadata",
    "output_node",
    "tensors",
]

#: ``handler(func, args, kwargs) -> result``: runs the call (``func(*args, **kwargs)``) or stands in for it.
Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]

_MODES = ("off", "warn", "strict")


class FunctionHook(TorchFunctionMode):
    """A ``TorchFunctionMode`` that hands every torch function call to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return self.handler(func, args, kwargs or {})


class DispatchHook(TorchDispatchMode):
    """A ``TorchDispatchMode`` that hands every aten op (forward and autograd's backward) to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # otherwise torch wraps the handler in ``torch._dynamo.disable``, which imports torch._dynamo (seconds)
        # on the first op; the hooks never run inside compiled code
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return self.handler(func, args, kwargs or {})


def deterministic_mode() -> str:
    """The deterministic flag in force: ``off``, ``warn`` (warn_only) or ``strict``."""
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn" if torch.is_deterministic_algorithms_warn_only_enabled() else "strict"


def _set_mode(mode: str) -> None:
    enabled, warn_only = mode != "off", mode == "warn"
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    else:
        # torch's setter first imports inductor's configuration (and with it torch._dynamo: seconds) to copy
        # the flag there; nothing in this process has compiled with inductor, so the switch itself is enough
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)


@contextlib.contextmanager
def deterministic_flag(mode: str | None) -> Iterator[None]:
    """Set ``torch.use_deterministic_algorithms`` to ``mode`` for the block, then restore the caller's flag.

    Args:
        mode: ``off``, ``warn`` or ``strict``; None leaves the flag as it is (the block may change it: it is
            restored all the same).

    Raises:
        ValueError: ``mode`` is not one of the three.
    """
    if mode is not None and mode not in _MODES:
        raise ValueError(f"deterministic mode must be one of {', '.join(_MODES)}, got {mode!r}")
    before = deterministic_mode()
    try:
        if mode is not None:
            _set_mode(mode)
        yield
    finally:
        _set_mode(before)


def current_node() -> Any:
    """The autograd node whose backward is running in this thread, or None (forward, or no autograd)."""
    return torch._C._current_autograd_node()


def node_metadata(node: Any) -> dict[str, Any]:
    """The metadata dict of an autograd node (torch's stubs type the attribute as a method; it is a dict)."""
    return cast("dict[str, Any]", node.metadata)


def output_node(out: Any) -> Any:
    """The autograd node that produced ``out`` (None for a tensor without history or a non-tensor)."""
    return getattr(out, "grad_fn", None)


def tensors(obj: Any, *, max_depth: int = 6) -> list[torch.Tensor]:
    """The tensors inside ``obj`` (a tensor, or lists, tuples and mappings of them, ``max_depth`` deep)."""
    out: list[torch.Tensor] = []
    _collect(obj, out, 0, max_depth)
    return out


def any_fake(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call computes nothing (an audit's trace): torch's fake-tensor mode is active in this thread
    (it turns real inputs, such as a constant the model keeps, into fake ones before any kernel runs) or one
    of its tensors is fake."""
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        return True
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    return any(isinstance(leaf, FakeTensor) for leaf in tree_leaves((args, dict(kwargs))))


def _collect(obj: Any, out: list[torch.Tensor], depth: int, max_depth: int) -> None:
    if depth > max_depth:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _collect(o, out, depth + 1, max_depth)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            _collect(o, out, depth + 1, max_depth)
