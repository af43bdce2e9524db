"""Module swaps: replace layers whose CUDA kernel is non-deterministic by yolo-det's equivalents, and back.

The registry maps an exact PyTorch class to a yolo-det class that subclasses it and only overrides
``forward`` (same constructor, attributes, ``extra_repr`` and state dict). A swap therefore changes
the instance's class in place: device, dtype, parameters, buffers, training mode, hooks and
Ultralytics' ``.i .f .type .np`` all stay exactly as they were, and :func:`unswap_modules` is the
exact inverse. Weights load unchanged in either direction.

Which instances to swap is decided before, by :func:`yolo_det.analysis.swap_plan.decide_swaps`
(``swap_modules`` takes the decided set, or a policy name that it decides first):

- ``auto``: those the audit (:func:`yolo_det.analysis.audit.audit`, a fake-CUDA trace of the model) finds
  reaching a non-deterministic CUDA kernel on the running torch version; an ``AdaptiveAvgPool2d(1)``
  (a mean inside ATen) or a bilinear ``Upsample`` on a torch that decomposes it stays as it is. A model
  the trace cannot run (its forward does not take an image batch) gets ``all``, with a warning.
- ``all``: every instance of a registered class, whatever the torch version.
- ``none``: nothing.

A swapped module pickles as its PyTorch class, so a checkpoint saved from a swapped model loads where
yolo-det is not installed. ``copy.deepcopy`` keeps the swap.

:func:`yolo_det.layers.registry.register_layers` makes the yolo-det class names resolvable in Ultralytics
model YAMLs (see :mod:`yolo_det.fixes.yaml_rewrite`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..analysis.swap_plan import decide_swaps
from ..core.errors import ConfigError, YoloDetError
from ..layers._pickling import pickles_as
from ..layers.table import SWAPS

__all__ = [
    "SWAPS",
    "SwapRecord",
    "remedy",
    "restore",
    "register_swap",
    "swap_modules",
    "swapped",
    "unswap_modules",
]


def _inverse() -> dict[type[nn.Module], type[nn.Module]]:
    return {target: source for source, target in SWAPS.items()}


def register_swap(source: type[nn.Module], target: type[nn.Module]) -> None:
    """Add ``source -> target`` to the registry (``target`` must subclass ``source`` without new state).

    Raises:
        YoloDetError: ``target`` is not a subclass of ``source``, or defines its own ``__init__``.
    """
    if not (isinstance(source, type) and isinstance(target, type) and issubclass(target, source)):
        raise YoloDetError(
            f"a swap target must subclass its source: {getattr(target, '__name__', target)} does "
            f"not subclass {getattr(source, '__name__', source)}"
        )
    if "__init__" in vars(target):
        raise YoloDetError(f"{target.__name__} defines __init__; a swap target may only override forward")
    _mark(target, source)
    SWAPS[source] = target


@dataclass(frozen=True)
class SwapRecord:
    """One swapped (or unswapped) module.

    Attributes:
        path: The module path in the model (``model.10.max_pool``).
        source: The class before.
        target: The class after.
        reason: The kernel it reached (``auto``), ``policy all``, or ``inverse``.
    """

    path: str
    source: str
    target: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """Plain data (for ``determinism.json``)."""
        return {"path": self.path, "source": self.source, "target": self.target, "reason": self.reason}


def swap_modules(
    model: nn.Module,
    modules: Mapping[str, str] | Iterable[str] | str = "auto",
    *,
    imgsz: int = 64,
    torch_version: str | None = None,
    policy: str | None = None,
) -> list[SwapRecord]:
    """Swap the given modules of ``model`` for their deterministic equivalents, in place.

    Args:
        model: Any ``nn.Module`` (an Ultralytics ``DetectionModel``, a YOLOv5 ``Model``, ...).
        modules: The decided set: module paths (or path -> reason, as
            :func:`yolo_det.analysis.swap_plan.decide_swaps` returns). A policy name (``auto``, ``all``,
            ``none``; see the module docstring) is decided first, with the model traced as it is (outside
            any interception).
        imgsz: Input size of the audit trace when ``modules`` is ``auto``.
        torch_version: Decide ``auto`` for this torch version instead of the running one.
        policy: Deprecated (0.1.0's name for a policy): ``swap_modules(model, policy="all")`` is
            ``swap_modules(model, "all")``; it warns (``DeprecationWarning``) and will be removed.

    Returns:
        One record per swapped module (empty when nothing needed a swap).

    Raises:
        ConfigError: An unknown policy, or a path that is not a module with a registered equivalent.
    """
    if policy is not None:
        warnings.warn(
            "swap_modules(policy=...) is deprecated; pass the policy as the second argument: "
            f"swap_modules(model, {policy!r})",
            DeprecationWarning,
            stacklevel=2,
        )
        if modules != "auto":
            raise ConfigError("swap_modules() got both modules and policy=; pass one of them (policy= is deprecated)")
        modules = policy
    if isinstance(modules, str):
        from .intercept import suspended

        with suspended():  # trace the model as it is, not as interception would run it
            modules = decide_swaps(model, modules, imgsz=imgsz, torch_version=torch_version)
    elif not isinstance(model, nn.Module):
        raise YoloDetError(f"swap_modules() needs an nn.Module, got {type(model).__name__}")
    reasons = dict(modules) if isinstance(modules, Mapping) else dict.fromkeys(modules, "requested")
    if not reasons:
        return []
    named = dict(model.named_modules())
    todo: list[tuple[str, nn.Module, type[nn.Module], str]] = []
    for path, reason in reasons.items():
        module = named.get(path)
        target = SWAPS.get(type(module)) if module is not None else None
        if module is None or target is None:
            raise ConfigError(f"cannot swap '{path}': not a module of the model with a deterministic equivalent")
        todo.append((path, module, target, reason))
    records = []
    for path, module, target, reason in todo:  # collect first, then change: the walk never sees a half-swap
        records.append(SwapRecord(path, type(module).__name__, target.__name__, reason))
        module.__class__ = target
    return records


def restore(model: nn.Module, records: Iterable[SwapRecord]) -> None:
    """Undo the swaps (or unswaps) in ``records``: each recorded module gets its class from before back.

    Modules no longer there, or whose class changed since, are left alone.
    """
    modules = dict(model.named_modules())
    classes = {cls.__name__: cls for pair in SWAPS.items() for cls in pair}
    for r in reversed(list(records)):
        m = modules.get(r.path)
        before = classes.get(r.source)
        if m is not None and before is not None and type(m).__name__ == r.target:
            m.__class__ = before


def remedy(finding: Any) -> str | None:
    """How a profile with ``swaps: auto`` and ``intercept: true`` (``repro``) fixes an audit finding at training time.

    Returns:
        ``"swap"`` (the module's class has a registered equivalent), ``"intercept"`` (the finding comes from a
        ``torch.nn.functional`` call that interception routes), or None (no deterministic equivalent).
    """
    from .intercept import ROUTED

    if any(cls.__name__ == finding.module_class for cls in SWAPS):
        return "swap"
    call = (finding.call or "").rsplit(".", 1)[-1]
    if call in ROUTED and (finding.call or "").startswith("torch.nn.functional."):
        return "intercept"
    return None


def unswap_modules(model: nn.Module) -> list[SwapRecord]:
    """Turn every yolo-det layer in ``model`` back into its PyTorch class, in place (for export)."""
    inverse = _inverse()
    todo = [(path, m, inverse[type(m)]) for path, m in model.named_modules() if type(m) in inverse]
    records = []
    for path, module, source in todo:
        records.append(SwapRecord(path, type(module).__name__, source.__name__, "inverse"))
        module.__class__ = source
    return records


@contextmanager
def swapped(model: nn.Module, policy: str = "auto", **kwargs: Any) -> Iterator[list[SwapRecord]]:
    """Swap for the block and put the original classes back afterwards, on error too."""
    records = swap_modules(model, policy, **kwargs)
    try:
        yield records
    finally:
        restore(model, records)


# ---------------------------------------------------------------------------------------------------------
# pickling as the PyTorch class; names for model YAMLs


def _mark(target: type[nn.Module], source: type[nn.Module]) -> None:
    """Make ``target`` instances pickle as ``source`` and keep their class under deepcopy."""
    pickles_as(target, source)
