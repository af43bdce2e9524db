"""What the state of an object a checkpoint made may hold: data only, never behaviour.

The unpickler (:mod:`.unpickle`) creates model objects with ``cls.__new__`` and gives them their pickled state.
A state can carry behaviour without naming a forbidden function: ``forward`` set to an allowed class, a hook
dict holding one, a ``_compiled_call_impl``. After the whole pickle is read (so that items added to a dict after
it was given to an object are seen too), :func:`check_made` checks every object the pickle made, by an
allow-list of keys and value kinds:

- an ``nn.Module`` (or a placeholder whose state is one's) holds ``training`` (a bool), ``_parameters`` and
  ``_buffers`` (names to tensors or None), ``_modules`` (names to modules or None),
  ``_non_persistent_buffers_set`` (names), ``_is_full_backward_hook`` (None or a bool), each hook dict
  (:data:`HOOK_DICTS`) only when empty, and any other attribute only as data;
- any other object (a loss, a transform) holds attributes as data only;
- data is None, a bool, number, string or bytes, a tensor, a dtype, device, random generator (made by the
  unpickler from its state bytes), size, path, date or slice, a NumPy array (no objects), scalar or dtype, a
  namespace or container of data, or another object the pickle made (checked on its own). A class, a function,
  a method or anything else is refused;
- nothing callable (a module included) may shadow a method of its class (``forward``), and no name is a dunder.
"""

from __future__ import annotations

import collections
import datetime
import enum
import pathlib
import sys
import types
from collections.abc import Iterable
from typing import Any

import torch

from ..errors import ModelError
from .container import trust_hint

__all__ = ["HOOK_DICTS", "MODULE_DATA", "check_made"]

#: The hook dicts of an ``nn.Module``: a checkpoint's module may hold them only empty.
HOOK_DICTS = frozenset(
    {
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)
#: The bookkeeping attributes of an ``nn.Module`` and what each may hold.
MODULE_DATA = {
    "training": "a bool",
    "_parameters": "names to tensors",
    "_buffers": "names to tensors",
    "_modules": "names to modules",
    "_non_persistent_buffers_set": "a set of names",
    "_is_full_backward_hook": "None or a bool",
}
_SCALARS = (type(None), bool, int, float, complex, str, bytes, bytearray)
_ATOMS = (torch.dtype, torch.device, torch.Generator, slice, pathlib.PurePath, datetime.date, datetime.timedelta)
_MAX_VALUES = 5_000_000
#: The namespaces the unpickler makes (``types.SimpleNamespace``, ``argparse.Namespace``, Ultralytics' own).
_NAMESPACES = frozenset(
    {("types", "SimpleNamespace"), ("argparse", "Namespace"), ("ultralytics.utils", "IterableSimpleNamespace")}
)


class _Refused(Exception):
    def __init__(self, what: str, key: str = "") -> None:
        self.what, self.key = what, key


def _kind(value: Any) -> str:
    if isinstance(value, type):
        module = getattr(value, "_inert_module", value.__module__)  # a placeholder: the name the pickle gave
        name = getattr(value, "_inert_name", value.__qualname__)
        return f"the class {str(module)[:80]}.{str(name)[:80]}"
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"the function {getattr(value, '__qualname__', '?')[:80]}"
    return f"a {type(value).__name__[:60]}"


class _Checker:
    def __init__(self, made: set[int]) -> None:
        self.made = made
        self.seen: set[int] = set()
        self.budget = _MAX_VALUES

    def data(self, value: Any) -> None:
        """Raise :class:`_Refused` unless ``value`` is data (see the module docstring)."""
        self.budget -= 1
        if self.budget < 0:
            raise _Refused("more values than a checkpoint holds")
        if type(value) in _SCALARS or isinstance(value, _ATOMS):
            return
        if type(value) in (torch.Tensor, torch.nn.Parameter):
            return
        if id(value) in self.made and not isinstance(value, type):
            return  # an object the pickle made: checked on its own
        if id(value) in self.seen:
            return
        self.seen.add(id(value))
        if type(value) in (list, tuple, set, frozenset, torch.Size):
            for item in value:
                self.data(item)
            return
        if type(value) in (dict, collections.OrderedDict):
            for key, item in value.items():
                self.data(key)
                self.data(item)
            return
        if _namespace(value):
            for item in vars(value).values():
                self.data(item)
            return
        if _numpy_data(value) or (isinstance(value, enum.Enum) and type(value).__module__.startswith("torchvision.")):
            return
        raise _Refused(_kind(value))

    def names_to(self, value: Any, what: str, ok: Any) -> None:
        if not isinstance(value, dict) or not all(isinstance(k, str) and ok(v) for k, v in value.items()):
            raise _Refused(f"something other than {what}")


def _namespace(value: Any) -> bool:
    return (type(value).__module__, type(value).__qualname__) in _NAMESPACES


def _numpy_data(value: Any) -> bool:
    np = sys.modules.get("numpy")
    if np is None:
        return False
    if isinstance(value, np.ndarray):
        return not value.dtype.hasobject
    return isinstance(value, (np.generic, np.dtype)) and not isinstance(value, np.object_)


def _module_like(obj: Any, state: dict[str, Any], cls: Any) -> bool:
    if isinstance(obj, torch.nn.Module) or (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return True
    return any(key in MODULE_DATA or key in HOOK_DICTS for key in state)


def _check_module_key(check: _Checker, key: str, value: Any) -> None:
    if key in HOOK_DICTS:
        if not isinstance(value, dict) or value:
            held = f"a hook dict of {len(value)} entries" if isinstance(value, dict) else _kind(value)
            raise _Refused(f"{held} (a hook dict may only be empty)")
    elif key == "training":
        if type(value) is not bool:
            raise _Refused(f"{_kind(value)}, not a bool")
    elif key in {"_parameters", "_buffers"}:
        check.names_to(value, MODULE_DATA[key], lambda v: v is None or type(v) in (torch.Tensor, torch.nn.Parameter))
    elif key == "_modules":
        check.names_to(value, "names to modules", lambda v: v is None or (id(v) in check.made and _is_obj(v)))
    elif key == "_non_persistent_buffers_set":
        if type(value) is not set or not all(isinstance(v, str) for v in value):
            raise _Refused("something other than a set of names")
    elif key == "_is_full_backward_hook":
        if value is not None and type(value) is not bool:
            raise _Refused(f"{_kind(value)}, not None or a bool")
    else:
        check.data(value)


def _is_obj(value: Any) -> bool:
    return not isinstance(value, type)


def _check_state(check: _Checker, obj: Any, state: Any, live: bool) -> None:
    if state is None:
        return
    if not isinstance(state, dict):
        raise _Refused(f"{_kind(state)} as its whole state (a state names attributes)", "")
    cls = type(obj) if live else obj._inert_class
    module = _module_like(obj, state, cls)
    for key, value in state.items():
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("__"):
            raise _Refused("a value under a name that is no attribute", str(key)[:40])
        cls_attr = getattr(cls, key, None)
        # data over a method (Ultralytics sets `type` to a string) calls nothing
        if callable(cls_attr) and (callable(value) or id(value) in check.made):
            raise _Refused(f"{_kind(value)}, over a method of its class", key)
        try:
            _check_module_key(check, key, value) if module else check.data(value)
        except _Refused as e:
            raise _Refused(e.what, key) from None


def check_made(path: Any, made: Iterable[Any], *, live: bool) -> None:
    """Refuse the checkpoint at ``path`` when an object it made holds anything but data (module docstring).

    Args:
        path: The checkpoint (named in the message).
        made: The objects of model and plain classes the pickle created (real ones when ``live``, else
            :class:`~.unpickle.Inert` placeholders, whose ``state`` is checked).
        live: Whether the objects are real (their ``__dict__`` is checked, and their class's methods known).

    Raises:
        ModelError: One line naming the object's class, the attribute and what it held.
    """
    objects = list(made)
    check = _Checker({id(o) for o in objects})
    for obj in objects:
        state = vars(obj) if live else obj.state
        try:
            _check_state(check, obj, state, live)
        except _Refused as e:
            name = type(obj).__qualname__ if live else obj._inert_name
            where = f"{name[:80]}.{e.key}" if e.key else f"a {name[:80]} object"
            raise ModelError(
                f"checkpoint '{path}' sets {where} to {e.what}: a loaded object may hold only "
                f"data (parameters, buffers, submodules, plain values), so it was not loaded; {trust_hint()}"
            ) from None
