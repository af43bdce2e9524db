"""Make extra module classes nameable in Ultralytics model YAMLs.

Ultralytics' ``parse_model`` resolves a layer's module name as ``nn.X`` (``torch.nn``),
``torchvision.ops.X``, or a name in the globals of ``ultralytics.nn.tasks``. To let a YAML say
``[-1, 1, CBAMMax, [256]]``, that name has to exist in that namespace.
:func:`register_ultralytics_modules` adds names there (idempotent: registering the same object again
does nothing); :func:`registered` does it for a block and afterwards removes exactly the names it added.

The user's names win: :func:`registered` never replaces or refuses a name the process already binds in
``ultralytics.nn.tasks`` (the user's own ``CBAMMax``, an Ultralytics class): that name keeps its object, and
a model YAML that uses it builds the user's class. :func:`register_ultralytics_modules` is the explicit,
process-long registration: by default it refuses a name bound to another object (``existing="error"``),
with ``existing="keep"`` it leaves such names alone. For example::

    from yolo_det.layers.registry import registered
    from yolo_det.analysis.zoo import ZOO_MODULES

    with registered(ZOO_MODULES):  # CBAMMax, CoordAtt, ... unless the process already binds them
        model = YOLO("cbam-max.yaml")

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
        from ..core.compat import tasks
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


def register_ultralytics_modules(mapping: Mapping[str, Any], *, existing: str = "error") -> list[str]:
    """Make each ``name -> class`` of ``mapping`` resolvable by Ultralytics' ``parse_model``.

    Registering a name already bound to the same object is a no-op, so calling this twice is safe.

    Args:
        mapping: Module names as written in model YAMLs, and the classes (or factories) they build.
        existing: What to do with a name already bound to a different object (an Ultralytics class, the
            user's own class, another registration): ``"error"`` (raise, register nothing) or ``"keep"``
            (leave that name as it is and register the others).

    Returns:
        The names left alone because they were bound to another object (``existing="keep"``).

    Raises:
        ConfigError: A name is not an identifier, or (``existing="error"``) is already bound in
            ``ultralytics.nn.tasks`` to a different object; nothing is registered then.
    """
    if existing not in ("error", "keep"):
        raise ConfigError(f"existing must be 'error' or 'keep', got {existing!r}")
    items = _check(mapping)
    with _lock:
        ns = _namespace()
        taken = [name for name, obj in items.items() if ns.get(name, obj) is not obj]
        if taken and existing == "error":
            name = taken[0]
            raise ConfigError(
                f"cannot register '{name}': ultralytics.nn.tasks already defines it as {ns[name]!r}; "
                "choose another name for the module"
            )
        for name, obj in items.items():
            if name not in ns:
                ns[name] = obj
                _added[name] = obj
        return taken


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
def registered(mapping: Mapping[str, Any]) -> Iterator[list[str]]:
    """Register ``mapping`` for the block; afterwards exactly the names it added are removed.

    A name already bound (to the same object or to another: the user's class, an Ultralytics class) is
    left as it is, so the user's definition is the one a model YAML builds. At the end of the block, also
    when it raises, each name the block added is removed if it is still bound to the object added (a name
    the user rebound inside the block keeps the user's object).

    Yields:
        The names of ``mapping`` left alone because they were bound to another object.

    Raises:
        ConfigError: A name is not an identifier, or an object is not a class or factory.
    """
    items = _check(mapping)
    with _lock:
        ns = _namespace()
        added = {name: obj for name, obj in items.items() if name not in ns}
        kept = [name for name, obj in items.items() if name in ns and ns[name] is not obj]
        for name, obj in added.items():
            ns[name] = obj
            _added[name] = obj
    try:
        yield kept
    finally:
        with _lock:
            for name, obj in added.items():
                if ns.get(name, _MISSING) is obj:
                    del ns[name]
                if _added.get(name, _MISSING) is obj:
                    del _added[name]


def _layer_names() -> dict[str, Any]:
    from .table import SWAPS

    return {target.__name__: target for target in SWAPS.values()}


def register_layers() -> None:
    """Make yolo-det's layer names (``DetAdaptiveMaxPool2d``, ``DetUpsample``, ...) resolvable in model YAMLs.

    Idempotent. A name the process already binds to something else (the user's own class) is left alone.
    The names stay registered for the life of the process (a model YAML may be built at any time);
    :func:`registered_layers` registers them for a block only.
    """
    register_ultralytics_modules(_layer_names(), existing="keep")


@contextmanager
def registered_layers() -> Iterator[list[str]]:
    """Register yolo-det's layer names for the block; afterwards remove exactly the names it added (a name the
    process already binds is left alone)."""
    with registered(_layer_names()) as kept:
        yield kept
