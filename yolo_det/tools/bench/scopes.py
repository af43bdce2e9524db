"""The extension point for settings that change the model: scopes registered here take part as session extensions."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch

from ...core.profiles import PhaseSettings

__all__ = ["register_scope", "unregister_scope"]

ScopeFactory = Callable[[torch.nn.Module, PhaseSettings], "AbstractContextManager[Any] | None"]
_SCOPES: list[tuple[ScopeFactory, frozenset[str]]] = []


def register_scope(factory: ScopeFactory, *, handles: Iterable[str]) -> None:
    """Register ``factory(model, settings) -> context manager | None``, entered around every measured block.

    This is how layer swaps and functional interception take part in the bench: the context manager
    applies what ``settings`` asks for to ``model`` (the trainer's model, in training mode) and undoes it on
    exit. It must keep the parameter objects (the optimizer holds them). ``handles`` names the settings it
    implements (``"swaps"``, ``"intercept"``); their rows are measured only once some scope handles them.
    Registering the same factory again replaces its entry.
    """
    unregister_scope(factory)
    _SCOPES.append((factory, frozenset(handles)))


def unregister_scope(factory: ScopeFactory) -> None:
    """Remove a factory added with :func:`register_scope` (no-op if absent)."""
    _SCOPES[:] = [(f, h) for f, h in _SCOPES if f is not factory]


#: Settings the session applies itself (no registered scope needed to measure them).
_BUILT_IN = frozenset({"swaps", "intercept"})


def _scope_extension(
    factory: ScopeFactory, model: torch.nn.Module, phase: str, settings: PhaseSettings, session: Any
) -> AbstractContextManager[Any] | None:
    """A registered scope as a session extension."""
    return factory(model, settings)


def _handled() -> frozenset[str]:
    out: set[str] = set(_BUILT_IN)
    for _, handles in _SCOPES:
        out |= handles
    return frozenset(out)
