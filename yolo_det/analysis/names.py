"""The names a model YAML can use while a yolo-det command (or a ``with`` block) builds models.

Three sources, in order of precedence:

1. What the process already binds in ``ultralytics.nn.tasks``: Ultralytics' own modules and anything the
   user registered (their own ``CBAMMax``). These are never replaced.
2. The user's modules (``--import MODULE`` on the command line, ``modules=`` or :func:`custom_modules` in
   Python): each module is imported first (anything it registers itself stays registered, as any import's
   side effects do), then every ``nn.Module`` subclass it *defines* (not one it imports) becomes nameable
   under its attribute name, unless that name is already bound (1).
3. yolo-det's own names: its deterministic layers (``DetUpsample``, ``DetAdaptiveMaxPool2d``, ...) and the
   example blocks of :mod:`yolo_det.zoo`, unless the name is already bound (1, 2).

On leaving the block exactly the names it added are removed (a name rebound meanwhile keeps its new object),
and ``sys.path`` is restored. A module is ``package.module`` (importable from the current folder or
``sys.path``) or the path of a ``.py`` file; one that cannot be imported is a one-line
:class:`~yolo_det.errors.ConfigError`.

Profile files cannot name modules to import: a profile is data that is shared and shown
(``yolo-det profiles show``), and reading one must never run code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Union, cast

from ..core.errors import ConfigError
from ..core.fileio import file_sha256

__all__ = [
    "ModuleSpec",
    "active_imports",
    "checkpoint_imports",
    "custom_modules",
    "import_user_module",
    "module_classes",
    "module_origin",
    "recorded_imports",
]

#: What :func:`custom_modules` accepts for one module.
ModuleSpec = Union[str, os.PathLike[str], ModuleType, Mapping[str, Any]]


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@contextmanager
def _sys_path(*folders: str) -> Iterator[None]:
    before = list(sys.path)
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = before


def _import_file(path: Path) -> ModuleType:
    name = path.stem
    if not name.isidentifier():
        raise ConfigError(f"cannot import '{path}': '{name}' is not a Python module name; rename the file")
    loaded = sys.modules.get(name)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
        if origin and Path(origin).resolve() == path:
            return loaded
        raise ConfigError(
            f"cannot import '{path}' as '{name}': a different module of that name is already imported; rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import '{path}': not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes pickle by module name (checkpoints)
    try:
        with _sys_path(str(path.parent)):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_user_module(spec: str | os.PathLike[str]) -> ModuleType:
    """Import ``spec``: a dotted module name (from the current folder or ``sys.path``) or a ``.py`` file path.

    Raises:
        ConfigError: The module cannot be found, or importing it raises (one line: the module and the error).
    """
    text = os.fspath(spec)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"--import needs a module name or a .py file, got {spec!r}")
    path = Path(text).expanduser()
    try:
        if text.endswith(".py") or os.sep in text or (os.altsep and os.altsep in text):
            if not path.is_file():
                raise ConfigError(f"cannot import '{text}': no such file")
            return _import_file(path.resolve())
        if not all(part.isidentifier() for part in text.split(".")):
            raise ConfigError(f"cannot import '{text}': give a dotted module name (mypkg.blocks) or a .py file path")
        with _sys_path(os.getcwd()):
            return importlib.import_module(text)
    except ConfigError:
        raise
    except ImportError as e:
        raise ConfigError(
            f"cannot import '{text}': {_one_line(e)} (is it in the current folder or on PYTHONPATH?)"
        ) from None
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) while importing: an interruption, exit 130/143
        raise
    except SystemExit as e:  # the module called sys.exit(): nothing was trained, never a success
        raise ConfigError(
            f"cannot import '{text}': it called sys.exit({_one_line(e) if e.code is not None else ''}) "
            "while being imported; a module for --import defines blocks and must not exit"
        ) from None
    except BaseException as e:  # Exception, GeneratorExit and any BaseException subclass the module raises
        raise ConfigError(f"cannot import '{text}': it raised {type(e).__name__}: {_one_line(e)}") from None


def module_classes(module: ModuleType) -> dict[str, type]:
    """The ``nn.Module`` subclasses ``module`` defines (not those it imports), by attribute name."""
    from torch import nn

    out: dict[str, type] = {}
    for name, obj in vars(module).items():
        if (
            not name.startswith("_")
            and isinstance(obj, type)
            and issubclass(obj, nn.Module)
            and obj.__module__ == module.__name__
        ):
            out[name] = obj
    return out


#: The user's modules imported by the :func:`custom_modules` blocks now open (``name``, ``path``, ``sha256``).
_active: list[dict[str, str]] = []


def module_origin(module: ModuleType) -> dict[str, str] | None:
    """``{name, path, sha256}`` of a module imported from a source file (None for one without a file)."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file:
        return None
    path = Path(file).resolve()
    try:
        digest = file_sha256(path)
    except OSError:
        return None
    return {"name": module.__name__, "path": str(path), "sha256": digest}


def active_imports() -> list[dict[str, str]]:
    """The user's modules (``--import``, ``modules=``) imported by the :func:`custom_modules` blocks now open,
    each ``{"name", "path", "sha256"}``, in import order: what a run records so that resuming it can name the
    ``--import`` to pass (:func:`recorded_imports`)."""
    seen: dict[str, dict[str, str]] = {}
    for entry in _active:
        seen.setdefault(entry["name"], dict(entry))
    return list(seen.values())


def _recorded_names(recorded: Any) -> list[str]:
    if not isinstance(recorded, list):
        return []
    names = [e.get("name") for e in recorded if isinstance(e, dict)]
    return [n for n in names if isinstance(n, str) and n]


def _module_name(text: str) -> str | None:
    return text if len(text) <= 100 and all(p.isidentifier() for p in text.split(".")) else None


def recorded_imports(recorded: Any, what: str, *, given: Iterable[ModuleSpec] = ()) -> None:
    """Refuse a checkpoint or record whose run imported a module (:func:`active_imports` of that run) that the user
    does not import now (``given``, or a module of the :func:`custom_modules` blocks now open).

    Nothing is imported here, ever: a module is imported because the user names it (``--import``,
    ``modules=``), never because a checkpoint, a record or a file's digest says so. The recorded entry only
    names the ``--import`` to add.

    Args:
        recorded: The ``imports`` a checkpoint or record stores (anything: checked here).
        what: The checkpoint, for the message.
        given: The modules the user passes.

    Raises:
        ConfigError: A recorded module is not imported by the user (one line naming the ``--import`` to add).
    """
    from ..core.text import printable

    have = {m["name"] for m in _active}
    for spec in given:
        if isinstance(spec, ModuleType):
            have.add(spec.__name__)
        elif isinstance(spec, (str, os.PathLike)):
            text = os.fspath(spec)
            have.add(Path(text).stem if text.endswith(".py") else text)
    for name in _recorded_names(recorded):
        if name in have:
            continue
        module = _module_name(name)
        hint = f"--import {module}" if module else "--import with the module it was trained with"
        raise ConfigError(
            f"{what} was trained with the block module {printable(name[:100], newlines=False)!r}, which yolo-det "
            f"imports only on your word: add {hint} (or modules=[...] in Python)"
        )


def checkpoint_imports(path: Any, *, given: Iterable[ModuleSpec] = ()) -> None:
    """:func:`recorded_imports` of the run that wrote checkpoint ``path`` (read without unpickling it); nothing to
    check for anything that is not a checkpoint storing them."""
    from ..core.errors import YoloDetError
    from ..core.untrusted.safeload import checkpoint_model_yaml
    from .blocks import CHECKPOINT_KEY

    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).endswith((".pt", ".pth")):
        return
    try:
        found = checkpoint_model_yaml(path)
    except YoloDetError:
        return
    extra = found[0].get(CHECKPOINT_KEY) if found is not None else None
    recorded = extra.get("imports") if isinstance(extra, dict) else None
    recorded_imports(recorded, f"checkpoint '{os.fspath(path)}'", given=given)


def _yolo_det_names() -> dict[str, Any]:
    from ..layers.table import SWAPS
    from .zoo import ZOO_MODULES

    return {**{target.__name__: target for target in SWAPS.values()}, **ZOO_MODULES}


@contextmanager
def custom_modules(*modules: ModuleSpec | Iterable[ModuleSpec] | None) -> Iterator[dict[str, Any]]:
    """Make the user's modules and yolo-det's names resolvable in model YAMLs for the block.

    Args:
        *modules: Each a dotted module name or a ``.py`` path (imported), a module object, or a mapping
            ``{YAML name: class}``; lists of these are accepted too. None is ignored.

    Yields:
        ``{name: class}`` of the names this block added (the user's first, then yolo-det's).

    Raises:
        ConfigError: A module cannot be imported, or a mapping is not ``{identifier: class}``.

    Example::

        import yolo_det
        from ultralytics import YOLO

        with yolo_det.custom_modules("mypkg.blocks"):
            model = YOLO("my-model.yaml")  # uses MyAttention from mypkg/blocks.py
            yolo_det.attach(model, "repro")
            model.train(data="data.yaml", epochs=10)
    """
    from ..layers.registry import registered
    from .blocks import declared_channels

    flat: list[ModuleSpec] = []
    for item in modules:
        if item is None:
            continue
        if isinstance(item, (str, os.PathLike, ModuleType, Mapping)):
            flat.append(item)
        else:
            flat.extend(x for x in cast(Iterable[ModuleSpec], item) if x is not None)
    added: dict[str, Any] = {}
    with ExitStack() as stack:
        stack.enter_context(_sys_path(os.getcwd()))  # a user module may import its siblings later
        stack.enter_context(declared_channels())  # blocks that declare their channels build in parse_model
        for item in flat:
            if isinstance(item, Mapping):
                mapping = dict(item)
            else:
                module = item if isinstance(item, ModuleType) else import_user_module(item)
                mapping = module_classes(module)
                origin = module_origin(module)
                if origin is not None:
                    _active.append(origin)
                    stack.callback(_active.remove, origin)
            kept = stack.enter_context(registered(mapping))
            added.update({k: v for k, v in mapping.items() if k not in kept and k not in added})
        ours = _yolo_det_names()
        kept = stack.enter_context(registered(ours))
        added.update({k: v for k, v in ours.items() if k not in kept and k not in added})
        yield added
