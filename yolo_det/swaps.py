"""Module swaps: replace layers whose CUDA kernel is non-deterministic by yolo-det's equivalents, and back.

The registry maps an exact PyTorch class to a yolo-det class that subclasses it and only overrides
``forward`` (same constructor, attributes, ``extra_repr`` and state dict). A swap therefore changes
the instance's class in place: device, dtype, parameters, buffers, training mode, hooks and
Ultralytics' ``.i .f .type .np`` all stay exactly as they were, and :func:`unswap_modules` is the
exact inverse. Weights load unchanged in either direction.

Which instances to swap (``policy``):

- ``auto``: those the audit (:func:`yolo_det.audit.audit`, a fake-CUDA trace of the model) finds
  reaching a non-deterministic CUDA kernel on the running torch version; an ``AdaptiveAvgPool2d(1)``
  (a mean inside ATen) or a bilinear ``Upsample`` on a torch that decomposes it stays as it is. A model
  the trace cannot run (its forward does not take an image batch) gets ``all``, with a warning.
- ``all``: every instance of a registered class, whatever the torch version.
- ``none``: nothing.

A swapped module pickles as its PyTorch class, so a checkpoint saved from a swapped model loads where
yolo-det is not installed. ``copy.deepcopy`` keeps the swap.

:func:`register_layers` makes the yolo-det class names resolvable in Ultralytics model YAMLs (see
:mod:`yolo_det.yaml_rewrite`).
"""

from __future__ import annotations

import copyreg
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from . import layers
from .errors import ConfigError, YoloDetError

__all__ = [
    "SWAPS",
    "SwapRecord",
    "register_layers",
    "remedy",
    "register_swap",
    "registered_layers",
    "swap_modules",
    "swapped",
    "unswap_modules",
]

#: PyTorch class -> yolo-det class (a subclass that only overrides ``forward``).
SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.AdaptiveAvgPool1d: layers.DetAdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d: layers.DetAdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d: layers.DetAdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d: layers.DetAdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d: layers.DetAdaptiveMaxPool2d,
    nn.Upsample: layers.DetUpsample,
    nn.UpsamplingBilinear2d: layers.DetUpsamplingBilinear2d,
    nn.ReflectionPad1d: layers.DetReflectionPad1d,
    nn.ReflectionPad2d: layers.DetReflectionPad2d,
    nn.ReflectionPad3d: layers.DetReflectionPad3d,
    nn.ReplicationPad1d: layers.DetReplicationPad1d,
    nn.ReplicationPad2d: layers.DetReplicationPad2d,
    nn.ReplicationPad3d: layers.DetReplicationPad3d,
    nn.CrossEntropyLoss: layers.DetCrossEntropyLoss,
    nn.NLLLoss: layers.DetNLLLoss,
}


def _inverse() -> dict[type[nn.Module], type[nn.Module]]:
    return {target: source for source, target in SWAPS.items()}


def register_swap(source: type[nn.Module], target: type[nn.Module]) -> None:
    """Add ``source -> target`` to the registry (``target`` must subclass ``source`` without new state).

    Raises:
        YoloDetError: ``target`` is not a subclass of ``source``, or defines its own ``__init__``.
    """
    if not (isinstance(source, type) and isinstance(target, type) and issubclass(target, source)):
        raise YoloDetError(f"a swap target must subclass its source: {getattr(target, '__name__', target)} does "
                           f"not subclass {getattr(source, '__name__', source)}")
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


def _check_policy(policy: str) -> None:
    if policy not in ("none", "auto", "all"):
        raise ConfigError(f"swap policy must be none, auto or all, got {policy!r}")


def _auto_targets(model: nn.Module, *, imgsz: int, torch_version: str | None) -> dict[str, str]:
    """Module path -> kernel, for the modules the audit finds reaching a non-deterministic kernel."""
    from .audit import audit
    from .intercept import suspended

    stride = 32
    try:
        stride = int(max(model.stride)) if hasattr(model, "stride") else 32
    except (TypeError, ValueError):
        pass
    size = max(stride, (int(imgsz) // stride) * stride)
    with suspended():  # trace the model as it is, not as interception would run it
        report = audit(model, imgsz=size, batch=2, torch_version=torch_version)
    return {f.module: f.kernel for f in report.findings if f.breaks_determinism}


def swap_modules(model: nn.Module, policy: str = "auto", *, imgsz: int = 64,
                 torch_version: str | None = None) -> list[SwapRecord]:
    """Swap ``model``'s non-deterministic layers for deterministic equivalents, in place.

    Args:
        model: Any ``nn.Module`` (an Ultralytics ``DetectionModel``, a YOLOv5 ``Model``, ...).
        policy: ``auto``, ``all`` or ``none`` (see the module docstring).
        imgsz: Input size of the audit trace that decides ``auto`` (a multiple of the model's stride).
        torch_version: Decide ``auto`` for this torch version instead of the running one.

    Returns:
        One record per swapped module (empty when nothing needed a swap).
    """
    _check_policy(policy)
    if policy == "none":
        return []
    if not isinstance(model, nn.Module):
        raise YoloDetError(f"swap_modules() needs an nn.Module, got {type(model).__name__}")
    wanted: dict[str, str] | None = None
    fallback = "policy all"
    if policy == "auto":
        try:
            wanted = _auto_targets(model, imgsz=imgsz, torch_version=torch_version)
        except YoloDetError as e:  # a model the trace cannot run: every layer with an equivalent is swapped
            warnings.warn(f"yolo-det could not trace the model to choose swaps ({e}); swapping every layer that "
                          "has a deterministic equivalent", stacklevel=2)
            fallback = "policy all (the trace failed)"
    todo: list[tuple[str, nn.Module, type[nn.Module], str]] = []
    for path, module in model.named_modules():
        target = SWAPS.get(type(module))
        if target is None:
            continue
        if wanted is None:
            todo.append((path, module, target, fallback))
        elif path in wanted:
            todo.append((path, module, target, wanted[path]))
    records = []
    for path, module, target, reason in todo:  # collect first, then change: the walk never sees a half-swap
        records.append(SwapRecord(path, type(module).__name__, target.__name__, reason))
        module.__class__ = target
    return records


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
        modules = dict(model.named_modules())
        inverse = _inverse()
        for r in records:
            m = modules.get(r.path)
            if m is not None and type(m) in inverse:
                m.__class__ = inverse[type(m)]


# ---------------------------------------------------------------------------------------------------------
# pickling as the PyTorch class; names for model YAMLs


def _mark(target: type[nn.Module], source: type[nn.Module]) -> None:
    """Make ``target`` instances pickle as ``source`` and keep their class under deepcopy."""

    def __reduce_ex__(self: nn.Module, protocol: Any) -> Any:  # noqa: N807
        rv = super(target, self).__reduce_ex__(protocol)
        state = rv[2] if isinstance(rv, tuple) and len(rv) > 2 else self.__getstate__()
        # copyreg._reconstructor is the standard library's: loading needs torch, not yolo-det
        return (copyreg._reconstructor, (source, object, None), state)

    def __deepcopy__(self: nn.Module, memo: dict[int, Any]) -> nn.Module:  # noqa: N807
        import copy

        new = target.__new__(target)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    target.__reduce_ex__ = __reduce_ex__  # type: ignore[method-assign]
    target.__deepcopy__ = __deepcopy__  # type: ignore[attr-defined]
    target._yolo_det_native = source  # type: ignore[attr-defined]


for _source, _target in SWAPS.items():
    _mark(_target, _source)


def _layer_names() -> dict[str, type[nn.Module]]:
    return {target.__name__: target for target in SWAPS.values()}


def register_layers() -> None:
    """Make yolo-det's layer names (``DetAdaptiveMaxPool2d``, ``DetUpsample``, ...) resolvable in model YAMLs.

    Idempotent. A name the process already binds to something else (the user's own class) is left alone.
    The names stay registered for the life of the process (a model YAML may be built at any time);
    :func:`registered_layers` registers them for a block only.
    """
    from .registry import register_ultralytics_modules

    register_ultralytics_modules(_layer_names(), existing="keep")


@contextmanager
def registered_layers() -> Iterator[None]:
    """Register yolo-det's layer names for the block and restore Ultralytics' namespace afterwards."""
    from .registry import registered

    with registered(_layer_names()):
        yield
