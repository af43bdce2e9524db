"""Make extra module classes nameable in Ultralytics model YAMLs.

Ultralytics' ``parse_model`` resolves a layer's module name as ``nn.X`` (``torch.nn``),
``torchvision.ops.X``, or a name in the globals of ``ultralytics.nn.tasks``. To let a YAML say
``[-1, 1, CBAMMax, [256]]``, that name has to exist in that namespace.
:func:`register_ultralytics_modules` adds names there (idempotent: registering the same object again
does nothing); :func:`registered` does it for a block and then restores the namespace exactly, names
that existed before included::

    from yolo_det.layers.registry import registered
    from yolo_det.analysis.zoo import ZOO_MODULES

    with registered(ZOO_MODULES):
        model = YOLO("data/models/cbam-max.yaml")

Ultralytics passes the YAML arguments of a class it does not know verbatim and assumes the layer keeps
its input channel count, so a registered module should take its channels explicitly and preserve them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ..core.errors import ConfigError

__all__ = [
    "register_layers",
    "register_ultralytics_modules",
    "registered",
    "registered_layers",
    "registered_names",
    "unregister_ultralytics_modules",
]

_lock = threading.RLock()
_MISSING = object()
#: Names this module added to the Ultralytics namespace (name -> object), for unregistering.
_added: dict[str, Any] = {}


def _namespace() -> dict[str, Any]:
    try:
        from ultralytics.nn import tasks
    except ImportError as e:  # pragma: no cover - ultralytics is a dependency
        raise ConfigError(f"registering model-YAML modules needs ultralytics ({e}); pip install ultralytics") from None
    return vars(tasks)


def _check(mapping: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"modules to register must be a mapping of name to class, got {type(mapping).__name__}")
    out: dict[str, Any] = {}
    for name, obj in mapping.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("nn."):
            raise ConfigError(f"cannot register {name!r}: a model-YAML module name must be a Python identifier")
        if isinstance(obj, ModuleType) or not callable(obj):
            raise ConfigError(f"cannot register '{name}': {obj!r} is not a class or factory")
        out[name] = obj
    return out


def register_ultralytics_modules(mapping: Mapping[str, Any]) -> None:
    """Make each ``name -> class`` of ``mapping`` resolvable by Ultralytics' ``parse_model``.

    Registering a name already bound to the same object is a no-op, so calling this twice is safe.

    Args:
        mapping: Module names as written in model YAMLs, and the classes (or factories) they build.

    Raises:
        ConfigError: A name is not an identifier, or is already bound in ``ultralytics.nn.tasks`` to a
            different object (an Ultralytics class or another registration); nothing is registered then.
    """
    items = _check(mapping)
    with _lock:
        ns = _namespace()
        for name, obj in items.items():
            current = ns.get(name, _MISSING)
            if current is not _MISSING and current is not obj:
                raise ConfigError(
                    f"cannot register '{name}': ultralytics.nn.tasks already defines it as {current!r}; "
                    "choose another name for the module"
                )
        for name, obj in items.items():
            if name not in ns:
                ns[name] = obj
                _added[name] = obj


def unregister_ultralytics_modules(names: Mapping[str, Any] | list[str] | tuple[str, ...]) -> None:
    """Remove names that :func:`register_ultralytics_modules` added (others are left alone)."""
    with _lock:
        ns = _namespace()
        for name in list(names):
            obj = _added.pop(name, _MISSING)
            if obj is not _MISSING and ns.get(name, _MISSING) is obj:
                del ns[name]


def registered_names() -> dict[str, Any]:
    """The names registered (and not unregistered) in this process, with their objects."""
    with _lock:
        return dict(_added)


@contextmanager
def registered(mapping: Mapping[str, Any]) -> Iterator[None]:
    """Register ``mapping`` for the block; afterwards the Ultralytics namespace is exactly as before.

    Names already registered with the same object stay registered; names that were absent are removed,
    also when the block raises.

    Raises:
        ConfigError: As :func:`register_ultralytics_modules`.
    """
    items = _check(mapping)
    with _lock:
        ns = _namespace()
        before = {name: ns.get(name, _MISSING) for name in items}
        added_before = {name: _added.get(name, _MISSING) for name in items}
        register_ultralytics_modules(items)
    try:
        yield
    finally:
        with _lock:
            for name, value in before.items():
                if value is _MISSING:
                    ns.pop(name, None)
                else:
                    ns[name] = value
                if added_before[name] is _MISSING:
                    _added.pop(name, None)
                else:
                    _added[name] = added_before[name]


def _layer_names() -> dict[str, Any]:
    from .table import SWAPS

    return {target.__name__: target for target in SWAPS.values()}


def register_layers() -> None:
    """Make yolo-det's layer names (``DetAdaptiveMaxPool2d``, ``DetUpsample``, ...) resolvable in model YAMLs.

    Idempotent. The names stay registered for the life of the process (a model YAML may be built at any
    time); :func:`registered_layers` registers them for a block only.
    """
    register_ultralytics_modules(_layer_names())


@contextmanager
def registered_layers() -> Iterator[None]:
    """Register yolo-det's layer names for the block and restore Ultralytics' namespace afterwards."""
    with registered(_layer_names()):
        yield
