"""Snapshot, apply and restore the process-wide state that decides determinism.

The state is: ``torch.use_deterministic_algorithms`` (and its ``warn_only``), cuDNN's ``benchmark``,
``deterministic`` and TF32 switches, the float32 matmul precision, ``fill_uninitialized_memory``, torch's
intra-op thread count (Ultralytics sets it for a CPU training; a profile may pin it) and the environment
variables a profile touches. :func:`apply` sets a phase's settings and returns the
state it replaced; :func:`restore` puts a snapshot back; :func:`phase_scope` does both around a block,
on error too.

TF32 has two torch APIs (the legacy ``allow_tf32`` flags and the newer ``fp32_precision`` strings) and
torch refuses to read a legacy flag once the two disagree, so both are snapshotted where readable and
restored in an order that leaves them as they were.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .constants import TRACKED_ENV
from .profiles import PhaseSettings

__all__ = ["TRACKED_ENV", "DeterminismState", "apply", "phase_scope", "preload", "restore", "snapshot"]


def _try(getter: Any) -> Any:
    try:
        return getter()
    except (RuntimeError, AttributeError):
        return None


def _matmul() -> Any:
    return torch.backends.cuda.matmul


def _cudnn_conv() -> Any:
    return getattr(torch.backends.cudnn, "conv", None)


@dataclass(frozen=True)
class DeterminismState:
    """The process-wide switches that decide determinism, as observed at one moment.

    A field is ``None`` when this torch build does not have that switch (or refuses to read it).
    """

    deterministic_algorithms: bool
    warn_only: bool
    cudnn_benchmark: bool
    cudnn_deterministic: bool
    cudnn_allow_tf32: bool | None
    matmul_precision: str | None
    matmul_fp32_precision: str | None
    cudnn_conv_fp32_precision: str | None
    fill_uninitialized_memory: bool | None
    env: Mapping[str, str | None] = field(default_factory=dict)
    #: ``torch.get_num_threads()``: put back by :func:`restore`; not part of :meth:`to_dict` (the record keeps the
    #: threads a run trained with in its machine fingerprint).
    intra_op_threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def __hash__(self) -> int:
        return hash(
            tuple(
                tuple(sorted(self.env.items())) if f == "env" else getattr(self, f) for f in self.__dataclass_fields__
            )
        )

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        data = {f: getattr(self, f) for f in self.__dataclass_fields__}
        data["env"] = dict(self.env)
        return (_state_from_dict, (data,))

    @property
    def mode(self) -> str:
        """``off``, ``warn`` or ``strict``."""
        if not self.deterministic_algorithms:
            return "off"
        return "warn" if self.warn_only else "strict"

    def to_dict(self) -> dict[str, Any]:
        """The state as plain data (for ``determinism.json``)."""
        return {
            "deterministic_algorithms": self.mode,
            "cudnn_benchmark": self.cudnn_benchmark,
            "cudnn_deterministic": self.cudnn_deterministic,
            "cudnn_allow_tf32": self.cudnn_allow_tf32,
            "matmul_precision": self.matmul_precision,
            "matmul_fp32_precision": self.matmul_fp32_precision,
            "cudnn_conv_fp32_precision": self.cudnn_conv_fp32_precision,
            "fill_uninitialized_memory": self.fill_uninitialized_memory,
            "env": dict(self.env),
        }


def _state_from_dict(data: dict[str, Any]) -> DeterminismState:
    """Unpickle helper (a mappingproxy field does not pickle)."""
    return DeterminismState(**data)


def snapshot(env_keys: Iterable[str] = ()) -> DeterminismState:
    """Read the current state; ``env_keys`` adds variables to :data:`TRACKED_ENV`."""
    keys = dict.fromkeys((*TRACKED_ENV, *env_keys))
    conv = _cudnn_conv()
    return DeterminismState(
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_allow_tf32=_try(lambda: bool(torch.backends.cudnn.allow_tf32)),
        matmul_precision=_try(torch.get_float32_matmul_precision),
        matmul_fp32_precision=_try(lambda: _matmul().fp32_precision),
        cudnn_conv_fp32_precision=_try(lambda: conv.fp32_precision) if conv is not None else None,
        fill_uninitialized_memory=_try(lambda: bool(_deterministic_utils().fill_uninitialized_memory)),
        env={k: os.environ.get(k) for k in keys},
        intra_op_threads=torch.get_num_threads(),
    )


def _set_env(env: Mapping[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _set_threads(count: int) -> None:
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def preload() -> None:
    """Import what ``torch.use_deterministic_algorithms`` imports lazily (``torch._inductor.config``, which
    pulls in ``torch._dynamo``), before any flag changes.

    An interrupt that lands inside that first, seconds-long import leaves the half-imported modules
    broken for every later call; doing it before a run begins means such an interrupt finds nothing to
    restore. Idempotent and cheap once done. If the import fails (broken by an earlier interrupt), the
    switch is set through torch's own setter instead (see :func:`_set_deterministic`).
    """
    try:
        import torch._inductor.config  # noqa: F401
    except Exception:  # an interrupt propagates; a broken import is worked around
        pass


def _set_deterministic(mode: str) -> None:
    enabled, warn_only = mode != "off", mode == "warn"
    try:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    except Exception:
        # torch's wrapper first imports inductor's config (broken for good if an interrupt cut that import
        # short); the switch itself is this call, which needs no import.
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)


def _set_tf32(allow: bool) -> None:
    """Allow or forbid TF32 for float32 matmuls and cuDNN convolutions through whichever API is in use."""
    current = snapshot()
    if current.matmul_precision is not None:  # legacy API readable: stay on it
        want = "high" if allow else "highest"
        if (current.matmul_precision != "highest") != allow:
            torch.set_float32_matmul_precision(want)
    elif current.matmul_fp32_precision is not None:
        _matmul().fp32_precision = "tf32" if allow else "ieee"
    if current.cudnn_allow_tf32 is not None:
        if current.cudnn_allow_tf32 != allow:
            torch.backends.cudnn.allow_tf32 = allow
    elif current.cudnn_conv_fp32_precision is not None:
        _cudnn_conv().fp32_precision = "tf32" if allow else "ieee"


def apply(settings: PhaseSettings) -> DeterminismState:
    """Apply ``settings`` to the process and return the state it replaced (pass it to :func:`restore`).

    The seed and layer swaps are not applied here (see :mod:`yolo_det.core.seeding` and the session); this sets
    the switches only. On error the previous state is restored before the error propagates.
    """
    preload()
    before = snapshot(settings.env.keys())
    try:
        _set_deterministic(settings.deterministic_algorithms)
        torch.backends.cudnn.benchmark = settings.cudnn_benchmark
        torch.backends.cudnn.deterministic = settings.cudnn_deterministic
        _set_tf32(settings.allow_tf32)
        if before.fill_uninitialized_memory is not None:
            _deterministic_utils().fill_uninitialized_memory = settings.fill_uninitialized_memory
        _set_env(settings.env)
    except BaseException as error:
        try:
            restore(before)
        except Exception as e:  # never replace the error that stopped the apply
            add_note(error, f"yolo-det: restoring the previous state also failed: {type(e).__name__}: {e}")
        raise
    return before


def restore(state: DeterminismState) -> None:
    """Put the process back into ``state`` (a value returned by :func:`snapshot` or :func:`apply`).

    Every switch is restored on its own: one that fails does not stop the others, and the first failure
    is raised once all were tried.
    """
    steps: list[Any] = [
        lambda: _set_deterministic(state.mode),
        lambda: setattr(torch.backends.cudnn, "benchmark", state.cudnn_benchmark),
        lambda: setattr(torch.backends.cudnn, "deterministic", state.cudnn_deterministic),
    ]
    # Legacy TF32 switches first, then the fp32_precision strings: setting a legacy switch rewrites the
    # string, and the string is what the legacy getter compares against.
    if state.matmul_precision is not None:
        steps.append(lambda: torch.set_float32_matmul_precision(state.matmul_precision))
    if state.matmul_fp32_precision is not None:
        steps.append(lambda: setattr(_matmul(), "fp32_precision", state.matmul_fp32_precision))
    if state.cudnn_allow_tf32 is not None:
        steps.append(lambda: setattr(torch.backends.cudnn, "allow_tf32", state.cudnn_allow_tf32))
    if state.cudnn_conv_fp32_precision is not None:
        steps.append(lambda: setattr(_cudnn_conv(), "fp32_precision", state.cudnn_conv_fp32_precision))
    if state.fill_uninitialized_memory is not None:
        steps.append(
            lambda: setattr(_deterministic_utils(), "fill_uninitialized_memory", state.fill_uninitialized_memory)
        )
    steps.append(lambda: _set_env(state.env))
    if state.intra_op_threads is not None:
        steps.append(lambda: _set_threads(state.intra_op_threads))
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as e:  # keep going; an interrupt included, so the state is whole again
            if first is None:
                first = e
    if first is not None:
        raise first


@contextmanager
def phase_scope(settings: PhaseSettings) -> Iterator[DeterminismState]:
    """Apply ``settings`` for the duration of the block and restore the previous state afterwards.

    Yields:
        The state that was in force before the block.
    """
    before = apply(settings)
    try:
        yield before
    finally:
        restore(before)


def _deterministic_utils() -> Any:
    """``torch.utils.deterministic``: ``fill_uninitialized_memory`` is a module property its stubs do not declare."""
    return torch.utils.deterministic


def add_note(error: BaseException, text: str) -> None:
    """Attach ``text`` to ``error`` as a note (Python 3.11+; earlier versions keep the error as it is)."""
    note = getattr(error, "add_note", None)
    if callable(note):
        note(text)
