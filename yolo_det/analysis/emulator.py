"""Make the CPU raise (or warn) exactly where CUDA would under deterministic mode.

On CUDA, ``adaptive_max_pool2d_backward`` under ``torch.use_deterministic_algorithms(True)`` raises
``RuntimeError: adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, ...``;
on a CPU the same model trains without a word. :func:`emulate_cuda_alerts` closes that gap for tests
and CI: while it is active, every aten op that the knowledge table (:mod:`yolo_det.analysis.optable`) says alerts
on CUDA raises (strict) or warns (warn_only) with CUDA's exact message, according to the deterministic
flag **at the moment the op runs** (forward ops when the forward runs, backward ops when autograd runs
them)::

    from yolo_det.analysis.emulator import emulate_cuda_alerts

    torch.use_deterministic_algorithms(True)
    with emulate_cuda_alerts() as log:
        loss = model(x).sum()
        loss.backward()  # RuntimeError: adaptive_max_pool2d_backward_cuda does not have ...

It follows CUDA's code paths where they differ from the CPU's: since torch 2.1, ``F.interpolate``
(bilinear) and ``F.pad`` (replicate) take a deterministic decomposition on CUDA when the flag is on at
forward time, so the emulated backward alerts only when that forward ran with the flag off (or called the
aten op directly). ``AdaptiveAvgPool2d(1)`` never alerts (it is a mean on every device). Turning the flag
off around ``backward()`` (``yolo_det.backward_scope``, profile ``balanced``) silences it, as on CUDA.

The emulator is a ``TorchDispatchMode`` (it sees every aten op, including those autograd runs in the
backward pass of this thread) plus a ``TorchFunctionMode`` that notes which calls went through the
Python layer of ``F.interpolate``/``F.pad``. Both are removed when the block exits, on error too;
nested use is a no-op that shares the outer log.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..core.constants import ALERT
from .optable import OpEntry, OpTable, decomposable_op, function_name, load_table, op_arguments, parse_version
from .optable import torch_version as _running_torch
from .tracing import (
    DispatchHook,
    FunctionHook,
    Handler,
    any_fake,
    current_node,
    deterministic_flag,
    deterministic_mode,
    node_metadata,
    output_node,
)

__all__ = ["AlertLog", "EmulatedAlert", "alert_message", "emulate_cuda_alerts"]

_META = "yolo_det.analysis.emulator"
_CALIBRATION_KERNEL = "max_unpooling2d_forward_out"  # alerts on CPU too, so its text is the binary's own
_state = threading.local()
_templates: dict[str, str] = {}
_templates_lock = threading.Lock()


@dataclass(frozen=True)
class EmulatedAlert:
    """One op that CUDA would have flagged.

    Attributes:
        entry: The table entry id.
        kernel: The CUDA kernel name.
        pass_: ``forward`` or ``backward``.
        op: The aten op that ran on the CPU.
        mode: The deterministic mode when the op ran: ``strict``, ``warn`` or ``off``.
        action: ``raised``, ``warned``, ``recorded`` (record-only emulation) or ``silent`` (flag off: CUDA would
            run the non-deterministic kernel without a message).
    """

    entry: str
    kernel: str
    pass_: str
    op: str
    mode: str
    action: str


@dataclass
class AlertLog:
    """What the emulator saw while it was active."""

    events: list[EmulatedAlert] = field(default_factory=list)

    @property
    def kernels(self) -> list[str]:
        """Kernel names in order of occurrence (duplicates kept)."""
        return [e.kernel for e in self.events]

    def by_action(self, action: str) -> list[EmulatedAlert]:
        """Events with ``action`` (``raised``, ``warned``, ``recorded`` or ``silent``)."""
        return [e for e in self.events if e.action == action]


def _calibrate(table: OpTable) -> dict[str, str]:
    """The strict and warn_only texts of the installed torch, taken from a real CPU alert."""
    with _templates_lock:
        if _templates:
            return dict(_templates)
        found: dict[str, str] = {}
        try:
            with _disable_current_modes(), torch._C.DisableTorchFunction():
                x = torch.arange(16.0).view(1, 1, 4, 4)
                y, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
                with deterministic_flag("strict"):
                    try:
                        torch.nn.functional.max_unpool2d(y, idx, (2, 2))
                    except RuntimeError as e:
                        found["strict"] = str(e)
                with deterministic_flag("warn"), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.nn.functional.max_unpool2d(y, idx, (2, 2))
                for w in caught:
                    if _CALIBRATION_KERNEL in str(w.message):
                        found["warn"] = str(w.message)
                        break
        except Exception:  # calibration is best effort; the table's templates are the fallback
            found = {}
        for mode in ("strict", "warn"):
            text = found.get(mode, "")
            if text.startswith(_CALIBRATION_KERNEL + ALERT):
                _templates[mode] = "{kernel}" + text[len(_CALIBRATION_KERNEL) :]
            else:
                _templates[mode] = table.messages.get(mode, "{kernel}" + ALERT)
        return dict(_templates)


def alert_message(kernel: str, *, warn_only: bool = False, table: OpTable | None = None) -> str:
    """The exact text the installed torch prints when ``kernel`` alerts (strict, or warn_only).

    Taken from a real CPU alert of the installed torch (``max_unpool2d`` alerts on every device), so it
    matches the binary, the warning's ``(Triggered internally at ...)`` suffix included; the table's
    templates are the fallback.
    """
    templates = _calibrate(table or load_table())
    return templates["warn" if warn_only else "strict"].replace("{kernel}", kernel)


class _Emulator:
    def __init__(self, table: OpTable, version: str, record_only: bool) -> None:
        self.table = table
        self.version = parse_version(version)
        self.record_only = record_only
        self.log = AlertLog()
        self.rules: dict[str, list[tuple[OpEntry, str]]] = {}
        for entry, when in table.active(version):
            if entry.cpu_alerts or entry.effect not in ("alert", "silent"):
                continue
            for op in entry.ops:
                self.rules.setdefault(op, []).append((entry, when))
        self.names = frozenset(op.split(".", 1)[0] for op in self.rules)
        self.ids = frozenset(e.id for e in table)
        self.templates = _calibrate(table)
        self.expected: str | None = None
        self.in_function = False

    def entries_for(self, func: Any) -> list[tuple[OpEntry, str]]:
        name = func._schema.name
        if name not in self.names:
            return []
        return self.rules.get(name, []) + self.rules.get(f"{name}.{func._overloadname}", [])

    def check(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        rules = self.entries_for(func)
        if not rules or any_fake(args, kwargs):  # fake tensors (an audit's trace) compute nothing
            return
        name = func._schema.name
        node = current_node()
        bound: dict[str, Any] | None = None
        for entry, when in rules:
            if entry.args:
                if bound is None:
                    bound = op_arguments(func, args, kwargs)
                if not entry.args_hold(bound):
                    continue
            if entry.pass_ == "backward" and node is not None:
                meta = node_metadata(node).get(_META) or {}
                instead = meta.get("instead")
                if instead is not None:  # CUDA runs another kernel here (cuDNN's grid sampler)
                    if instead in self.ids:
                        self.fire(self.table.entry(instead), name)
                    continue
                via = meta.get("native") is not None and meta.get("native") in entry.forward_ops
                det = meta.get("det")
            else:
                via = self.expected is not None and self.expected == name
                det = torch.are_deterministic_algorithms_enabled()
            if not OpEntry.reaches(when, via_functional=via, forward_deterministic=det):
                continue
            self.fire(entry, name)

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Dispatch handler: check the op against the table, then run it."""
        self.check(func, args, kwargs)
        return func(*args, **kwargs)

    def fire(self, entry: OpEntry, op: str) -> None:
        mode = deterministic_mode()
        if entry.effect == "silent" or mode == "off":
            self.log.events.append(EmulatedAlert(entry.id, entry.kernel, entry.pass_, op, mode, "silent"))
            return
        if self.record_only:
            self.log.events.append(EmulatedAlert(entry.id, entry.kernel, entry.pass_, op, mode, "recorded"))
            return
        if mode == "warn":
            self.log.events.append(EmulatedAlert(entry.id, entry.kernel, entry.pass_, op, mode, "warned"))
            warnings.warn(self.templates["warn"].replace("{kernel}", entry.kernel), UserWarning, stacklevel=3)
            return
        self.log.events.append(EmulatedAlert(entry.id, entry.kernel, entry.pass_, op, mode, "raised"))
        raise RuntimeError(self.templates["strict"].replace("{kernel}", entry.kernel))


_CUDNN_DTYPES = (torch.float32, torch.float16, torch.float64)


def _cuda_takes_cudnn_grid_sampler(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether ``F.grid_sample(*args, **kwargs)`` would run cuDNN's sampler on CUDA (ATen's ``grid_sampler``).

    cuDNN is used for 4-D float/half/double input and grid, bilinear mode, zeros padding, ``align_corners=True``,
    at most 1024 channels, with cuDNN enabled. Its backward has no alert: CUDA stays silent there.
    """
    names = ("input", "grid", "mode", "padding_mode", "align_corners")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    x, grid = bound.get("input"), bound.get("grid")
    if not isinstance(x, torch.Tensor) or not isinstance(grid, torch.Tensor):
        return False
    return (
        x.dim() == 4
        and bound.get("mode", "bilinear") == "bilinear"
        and bound.get("padding_mode", "zeros") == "zeros"
        and bool(bound.get("align_corners"))
        and x.dtype in _CUDNN_DTYPES
        and grid.dtype in _CUDNN_DTYPES
        and x.shape[1] <= 1024
        and torch.backends.cudnn.enabled
    )


def _mark_function(emulator: _Emulator) -> Handler:
    """Torch-function handler that marks the autograd nodes of F.* calls whose CUDA path differs from the CPU's.

    ``F.interpolate``/``F.pad`` calls that CUDA would route through a decomposition (their native op and the flag at
    forward time), and ``F.grid_sample`` calls that CUDA would send to cuDNN.
    """

    def handle(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if emulator.in_function:
            return func(*args, **kwargs)
        name = function_name(func)
        if name == "torch.nn.functional.grid_sample" and _cuda_takes_cudnn_grid_sampler(args, kwargs):
            out = func(*args, **kwargs)
            node = output_node(out)
            if node is not None:
                node_metadata(node)[_META] = {"instead": "cudnn_grid_sampler"}
            return out
        expected = decomposable_op(name, args, kwargs)
        if expected is None:
            return func(*args, **kwargs)
        det = torch.are_deterministic_algorithms_enabled()
        emulator.in_function, emulator.expected = True, expected
        try:
            out = func(*args, **kwargs)
        finally:
            emulator.in_function, emulator.expected = False, None
        node = output_node(out)
        if node is not None:
            node_metadata(node)[_META] = {"native": expected, "det": det}
        return out

    return handle


@contextmanager
def emulate_cuda_alerts(
    *,
    table: str | Path | OpTable | None = None,
    torch_version: str | None = None,
    record_only: bool = False,
) -> Iterator[AlertLog]:
    """Raise or warn, on any device, wherever CUDA would under the deterministic flag in force.

    Args:
        table: The table of non-deterministic kernels (default: the built-in one).
        torch_version: Emulate the CUDA behaviour of this torch version (default: the running one).
        record_only: Log what CUDA would do without raising or warning (``action == "recorded"``).

    Yields:
        The :class:`AlertLog` of every emulated alert (also the ones silenced because the flag was off).

    The emulation covers the thread that enters the block and the autograd work it starts. Ops whose CPU
    kernel alerts by itself (``max_unpool2d``) are left to torch. Nested blocks share the outer one.
    """
    active = getattr(_state, "emulator", None)
    if active is not None:
        yield active.log
        return
    tbl = load_table(table)
    emulator = _Emulator(tbl, torch_version or _running_torch(), record_only)
    _state.emulator = emulator
    try:
        with DispatchHook(emulator.dispatch), FunctionHook(_mark_function(emulator)):
            yield emulator.log
    finally:
        _state.emulator = None
