"""Deciding which modules of a model to swap for their deterministic equivalents (the ``swaps`` policy).

The decision is separate from the swap: :func:`decide_swaps` reads the model (for ``auto``, by the
fake-CUDA audit) and returns the module paths to swap with the reason for each;
:func:`yolo_det.fixes.swaps.swap_modules` then swaps exactly those. Callers that run under functional
interception trace the model as it is by deciding inside :func:`yolo_det.fixes.intercept.suspended`
(the session does).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from ..core.errors import ConfigError, YoloDetError
from ..layers.table import SWAPS

__all__ = ["POLICIES", "check_policy", "decide_swaps"]

#: The values of a phase's ``swaps`` setting.
POLICIES = ("none", "auto", "all")


def check_policy(policy: str) -> None:
    """Raise ConfigError unless ``policy`` is one of :data:`POLICIES`."""
    if policy not in POLICIES:
        raise ConfigError(f"swap policy must be none, auto or all, got {policy!r}")


def decide_swaps(
    model: nn.Module, policy: str = "auto", *, imgsz: int = 64, torch_version: str | None = None
) -> dict[str, str]:
    """Module path -> reason, for the modules of ``model`` that ``policy`` swaps.

    Args:
        model: Any ``nn.Module``.
        policy: ``auto`` (what the audit finds reaching a non-deterministic CUDA kernel), ``all`` (every
            module with a registered equivalent) or ``none``.
        imgsz: Input size of the audit trace that decides ``auto`` (rounded to a multiple of the stride).
        torch_version: Decide ``auto`` for this torch version instead of the running one.

    Returns:
        The decided set, in module order; only modules whose class has a registered equivalent. A model
        the trace cannot run gets ``all``, with a warning.
    """
    check_policy(policy)
    if policy == "none":
        return {}
    if not isinstance(model, nn.Module):
        raise YoloDetError(f"swap_modules() needs an nn.Module, got {type(model).__name__}")
    wanted: dict[str, str] | None = None
    fallback = "policy all"
    if policy == "auto":
        try:
            wanted = _auto_targets(model, imgsz=imgsz, torch_version=torch_version)
        except YoloDetError as e:  # a model the trace cannot run: every layer with an equivalent is swapped
            warnings.warn(
                f"yolo-det could not trace the model to choose swaps ({e}); swapping every layer that "
                "has a deterministic equivalent",
                stacklevel=3,
            )
            fallback = "policy all (the trace failed)"
    decided: dict[str, str] = {}
    for path, module in model.named_modules():
        if type(module) not in SWAPS:
            continue
        if wanted is None:
            decided[path] = fallback
        elif path in wanted:
            decided[path] = wanted[path]
    return decided


def _auto_targets(model: nn.Module, *, imgsz: int, torch_version: str | None) -> dict[str, str]:
    """Module path -> kernel, for the modules the audit finds reaching a non-deterministic kernel."""
    from .audit import audit

    stride = 32
    try:
        strides: Any = getattr(model, "stride", None)
        stride = int(max(strides)) if strides is not None else 32
    except (TypeError, ValueError):
        pass
    size = max(stride, (int(imgsz) // stride) * stride)
    report = audit(model, imgsz=size, batch=2, torch_version=torch_version)
    return {f.module: f.kernel for f in report.findings if f.breaks_determinism}
