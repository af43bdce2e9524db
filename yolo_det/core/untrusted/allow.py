"""What a checkpoint's pickle may name: an allow-list, checked name by name.

Three kinds of names are allowed:

- **values**: the functions and types yolo-det itself implements or knows to build plain data only
  (torch's tensor and parameter rebuilders, storage types, dtypes, ``torch.Size``, ``torch.device``,
  ``OrderedDict``, ``set``/``frozenset``/``slice``/``complex``, ``SimpleNamespace``, Ultralytics'
  ``IterableSimpleNamespace``, ``argparse.Namespace``, paths, dates, NumPy scalars, dtypes and arrays, and
  ``torch.Generator``: made fresh on the CPU and given its state as bytes).
  Only these may be *called* by the pickle (``REDUCE``);
- **model classes**: ``nn.Module`` subclasses defined in ``torch.nn``, ``torchvision.ops``,
  ``torchvision.transforms``, Ultralytics' ``ultralytics.nn`` packages, yolo-det's layers and example blocks
  (``yolo_det_zoo``), and the modules
  the user named with ``--import`` (:func:`allowed_user_modules`), plus the plain classes Ultralytics keeps
  in a model (its loss and assigner classes, and a classifier's torchvision transforms such as ``Compose``).
  They are only *created* (``cls.__new__``) and given their pickled state, never called;
- nothing else: every other name is refused, with its name.

A name resolves only in a module already imported. When it is not, yolo-det imports the fixed entry points of
:data:`SAFE_IMPORTS` (installed modules known to do nothing at import but define classes) and looks again; the
module a pickle names is never imported to find out what it is (an unimported module of an allowed package,
such as one that installs packages when imported, stays unimported and its name is refused).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import keyword
import sys
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "CLASS_PACKAGES",
    "PLAIN_CLASS_MODULES",
    "SAFE_IMPORTS",
    "allowed_user_modules",
    "model_class",
    "user_modules",
]

#: Packages whose ``nn.Module`` subclasses a checkpoint may hold.
CLASS_PACKAGES = (
    "torch.nn",
    "torchvision.ops",
    "torchvision.transforms",
    "ultralytics.nn",
    "yolo_det.layers",
    "yolo_det_zoo",
)
#: Modules whose own plain classes (not only modules) Ultralytics keeps inside a model (loss, assigner).
PLAIN_CLASS_MODULES = frozenset(
    {
        "ultralytics.utils.loss",
        "ultralytics.utils.tal",
        "ultralytics.nn.distill_model",
        # a classifier keeps its preprocessing (Compose, ToTensor) in the checkpoint
        "torchvision.transforms.transforms",
    }
)
#: The modules imported, when a pickle names a class not imported yet, to find it: nothing else is imported.
SAFE_IMPORTS = (
    "torch.nn",
    "torchvision.ops",
    "torchvision.transforms",
    "ultralytics.nn.tasks",
    "ultralytics.nn.distill_model",
    "yolo_det.layers",
    "yolo_det_zoo",
)
#: Names older Ultralytics versions pickled, and what they are now.
ALIASES = {
    ("ultralytics.nn.modules.block", "Silence"): ("torch.nn.modules.linear", "Identity"),
    ("ultralytics.nn.tasks", "YOLOv10DetectionModel"): ("ultralytics.nn.tasks", "DetectionModel"),
    ("ultralytics.utils.loss", "v10DetectLoss"): ("ultralytics.utils.loss", "E2EDetectLoss"),
}

_USER: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("yolo_det_user_modules", default=frozenset())


@contextlib.contextmanager
def allowed_user_modules(names: Iterable[str]) -> Iterator[None]:
    """While active, the ``nn.Module`` subclasses of the modules ``names`` (imported by the user: ``--import``,
    ``yolo_det.custom_modules``) are allowed in checkpoints too."""
    token = _USER.set(_USER.get() | frozenset(n for n in names if isinstance(n, str)))
    try:
        yield
    finally:
        _USER.reset(token)


def user_modules() -> frozenset[str]:
    """The modules whose classes checkpoints may hold besides the installed packages (see
    :func:`allowed_user_modules`)."""
    return _USER.get()


def _identifier(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _import_safe() -> None:
    for entry in SAFE_IMPORTS:
        if entry not in sys.modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(entry)


def model_class(module: str, name: str) -> type | None:
    """The class ``module.name`` when a checkpoint may hold it (see the module docstring), else None.

    ``module`` must lie in one of :data:`CLASS_PACKAGES` or :data:`PLAIN_CLASS_MODULES` and be imported
    (after :data:`SAFE_IMPORTS`), or be a user module already imported; ``module`` itself is never imported.
    """
    module, name = ALIASES.get((module, name), (module, name))
    if not (_identifier(name) and all(_identifier(p) for p in module.split("."))) or name.startswith("_"):
        return None
    import torch

    if module in PLAIN_CLASS_MODULES or any(_in_package(module, p) for p in CLASS_PACKAGES):
        mod = sys.modules.get(module)
        if mod is None:
            _import_safe()
            mod = sys.modules.get(module)
        if mod is None:
            return None
    elif module in user_modules() and module in sys.modules:
        mod = sys.modules[module]
    else:
        return None
    obj: Any = getattr(mod, name, None)
    if not isinstance(obj, type):
        return None
    if issubclass(obj, torch.nn.Module):
        return obj
    if module in PLAIN_CLASS_MODULES and obj.__module__ == module and not issubclass(obj, BaseException):
        return obj
    return None
