"""The one unpickler for every checkpoint (yolo-det's own too): an allow-list, restricted instructions, bounded work.

Length: the one unpickler for files from others, with the value constructors it may call and the
opcodes it changes: kept whole so that what stands between a file and running code reads in one place.

:class:`SafeUnpickler` reads a checkpoint's ``data.pkl`` (from a :class:`~.container.CheckpointArchive`)
with Python's own pickle machine, changed where the pickle could run code:

- ``GLOBAL``/``STACK_GLOBAL`` resolve a name through :mod:`.allow` only: a value function or type yolo-det
  knows (:data:`VALUES`), or a model class. Anything else is refused with its name (:class:`RefusedGlobal`);
- ``REDUCE`` (a call) calls only value functions; a model class is never called, only created with
  ``cls.__new__`` (``NEWOBJ``, ``copyreg._reconstructor``) and given its pickled state (``BUILD``);
- ``INST``/``OBJ`` (calls) and the extension registry (``EXT1/2/4``) are refused;
- a ``torch.Generator`` (a user's block may keep one) is made fresh on the CPU by yolo-det and given the seed,
  offset and state bytes its pickle carries, checked to be just those;
- ``BUILD``, ``APPEND(S)``, ``SETITEM(S)`` and ``ADDITEMS`` act only on objects the pickle made of allowed
  types, never on a class or function;
- storages come from the archive's records, checked to hold the bytes the pickle claims (a truncated
  file is named so), and tensors are views checked to lie inside their storage. The bytes all tensors
  span together (a stride-0 tensor spans ``numel`` elements of one) are capped by
  :data:`MAX_TENSOR_EXPANSION` times the file's size plus :data:`TENSOR_SLACK_BYTES`.

``live=False`` (inspection: digests, resume states, the stored YAML of a model) imports no module a pickle
names (an allowed class is looked up after :data:`.allow.SAFE_IMPORTS` only, to check the state given to its
placeholder): model classes become :class:`Inert` placeholders that keep the state the pickle gave them, and a
class name nobody knows is accepted as long as the pickle only creates it (it is never called). ``live=True``
(handing the object to Ultralytics) makes real objects of allowed classes only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import io
import math
import pathlib
import pickle
import sys
import types
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ModelError
from .allow import ALIASES, model_class
from .container import CheckpointArchive, trust_checkpoints, trust_hint
from .objstate import check_made

__all__ = [
    "MAX_TENSOR_EXPANSION",
    "TENSOR_SLACK_BYTES",
    "VALUES",
    "Inert",
    "RefusedGlobal",
    "SafeUnpickler",
    "is_tensor",
    "module_dict",
    "module_state_dict",
]

#: The bytes all tensors of a checkpoint span may be at most this many times the file's size ...
MAX_TENSOR_EXPANSION = 4
#: ... plus this many bytes.
TENSOR_SLACK_BYTES = 2**20


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor an unpickling made."""
    return isinstance(value, torch.Tensor)


class RefusedGlobal(ModelError):
    """A checkpoint names (or calls) something outside the allow-list; the message names it."""

    def __init__(self, path: Any, what: str, called: bool = False) -> None:
        self.name = what
        verb = "calls" if called else "refers to"
        module = what.rpartition(".")[0]
        # a class of a module not imported here: the --import that would allow it, if it is the user's block
        named = not called and 0 < len(module) <= 100 and module not in sys.modules
        named = named and all(p.isidentifier() for p in module.split("."))
        super().__init__(
            f"checkpoint '{path}' {verb} {what[:160]}, which is not on yolo-det's allow-list of what "
            f"checkpoints hold, so it was not loaded (if it is your own block, pass --import "
            f"{module if named else 'MODULE'}; {trust_hint()})"
        )


class Inert:
    """An object a checkpoint named but which was not imported: it keeps what the pickle gave it, nothing more."""

    _inert_module = "?"
    _inert_name = "?"
    _inert_class: type | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:
        obj = object.__new__(cls)
        obj.__dict__.update(inert_args=args, inert_kwargs=kwargs, inert_state=None, inert_items=[], inert_map={})
        return obj

    def __setstate__(self, state: Any) -> None:
        self.__dict__["inert_state"] = state

    def append(self, item: Any) -> None:
        self.__dict__["inert_items"].append(item)

    def extend(self, items: Any) -> None:
        self.__dict__["inert_items"].extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__["inert_map"][key] = value

    def __reduce__(self) -> Any:
        raise TypeError("a placeholder of an unread checkpoint object cannot be pickled")

    def __repr__(self) -> str:
        return f"<{self._inert_module}.{self._inert_name} (not loaded)>"

    @property
    def state(self) -> Any:
        """The state the pickle set (``__dict__`` of the original object, or ``(dict, slots)``)."""
        return self.__dict__["inert_state"]


_PLACEHOLDERS: dict[tuple[str, str], type] = {}


def _placeholder(module: str, name: str) -> type:
    key = (module[:200], name[:200])
    cls = _PLACEHOLDERS.get(key)
    if cls is None:
        cls = type(f"Inert[{key[1]}]", (Inert,), {"_inert_module": key[0], "_inert_name": key[1]})
        _PLACEHOLDERS[key] = cls
    return cls


class _StorageType:
    """What a pickle's storage class (``torch.FloatStorage``, ``torch.UntypedStorage``) says: a dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _Storage:
    """A storage read from the archive: its bytes (a uint8 tensor)."""

    def __init__(self, data: torch.Tensor, dtype: torch.dtype) -> None:
        self.data = data
        self.dtype = dtype
        self.nbytes = int(data.numel())


_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "UntypedStorage": torch.uint8,
    "ByteStorage": torch.uint8,
    "CharStorage": torch.int8,
    "ShortStorage": torch.int16,
    "IntStorage": torch.int32,
    "LongStorage": torch.int64,
    "HalfStorage": torch.float16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > 64 or not all(type(v) is int for v in value):
        raise ModelError(f"malformed tensor in checkpoint: {what} is not a tuple of integers")
    return tuple(value)


def _bytes(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in {"latin1", "latin-1"} or len(text) > 2**26:
        raise ModelError("malformed bytes value in checkpoint")
    return text.encode("latin-1")


def _bytearray(value: Any = b"", *rest: Any) -> bytearray:
    if isinstance(value, str):
        return bytearray(_bytes(value, *rest))
    if not isinstance(value, (bytes, bytearray)) or rest:
        raise ModelError("malformed bytearray value in checkpoint")
    return bytearray(value)


def _complex(real: Any = 0.0, imag: Any = 0.0) -> complex:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (real, imag)):
        raise ModelError("malformed complex value in checkpoint")
    return complex(real, imag)


def _collection(kind: type) -> Any:
    def make(items: Any = ()) -> Any:
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise ModelError(f"malformed {kind.__name__} in checkpoint")
        return kind(items)

    make.__name__ = kind.__name__
    return make


def _slice(*args: Any) -> slice:
    if len(args) > 3 or not all(a is None or type(a) is int for a in args):
        raise ModelError("malformed slice in checkpoint")
    return slice(*args)


def _numpy_values(objects: bool = False) -> dict[tuple[str, str], Any]:
    """The NumPy constructors a pickle may call; ``objects``: arrays of Python objects too (their items are made
    by the same unpickler, under the same allow-list: an Ultralytics label cache is one such array)."""
    import numpy as np

    def scalar(dtype: Any, data: Any = None) -> Any:
        if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes) or len(data) > 64:
            raise ModelError("malformed NumPy scalar in checkpoint")
        return np.frombuffer(data, dtype=dtype, count=1)[0] if data else dtype.type(0)

    def dtype(name: Any, align: Any = False, copy: Any = False) -> Any:
        if not isinstance(name, str) or len(name) > 16:
            raise ModelError("malformed NumPy dtype in checkpoint")
        d = np.dtype(name)
        if d.hasobject and not (objects and d == np.dtype(object)):
            raise ModelError("a NumPy object dtype in checkpoint")
        return d

    def reconstruct(cls: Any, shape: Any, code: Any) -> Any:
        if cls is not np.ndarray or shape != (0,) or not isinstance(code, bytes):
            raise ModelError("malformed NumPy array in checkpoint")
        return np.ndarray.__new__(np.ndarray, (0,), np.uint8)

    out: dict[tuple[str, str], Any] = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[(mod, "scalar")] = scalar
        out[(mod, "_reconstruct")] = reconstruct
    out[("numpy", "dtype")] = dtype
    out[("numpy", "ndarray")] = np.ndarray
    return out


def _path(*parts: Any) -> pathlib.PurePath:
    if not all(isinstance(p, str) and len(p) <= 4096 for p in parts) or len(parts) > 256:
        raise ModelError("malformed path in checkpoint")
    return pathlib.Path(*parts)


def _interpolation_mode(value: Any) -> Any:
    """torchvision's ``InterpolationMode`` member named by ``value`` (a classifier's resize transform)."""
    from torchvision.transforms import InterpolationMode

    if not isinstance(value, str) or value not in {m.value for m in InterpolationMode}:
        raise ModelError(f"malformed interpolation mode in checkpoint: {str(value)[:40]!r}")
    return InterpolationMode(value)


def _generator(device: Any = None) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` (what a pickled generator is created as; its state comes as bytes, given by
    :func:`_generator_state`)."""
    if device is not None and not (isinstance(device, torch.device) and device.type == "cpu"):
        raise ModelError(
            f"a torch.Generator of device {str(device)[:20]} in checkpoint: yolo-det loads checkpoints on the CPU"
        )
    return torch.Generator(device="cpu")


def _generator_state(gen: Any, state: Any) -> None:
    """Give ``gen`` the state a pickled generator carries: its seed, offset and state bytes, nothing else."""
    ok = isinstance(state, tuple) and len(state) == 3
    if ok:
        seed, offset, data = state
        ok = (
            type(seed) is int
            and (offset is None or type(offset) is int)
            and type(data) is torch.Tensor
            and data.dtype == torch.uint8
            and data.dim() == 1
        )
    if not ok:
        raise ModelError("malformed torch.Generator state in checkpoint")
    gen.__setstate__((seed, offset, data.contiguous()))


#: The functions and types a checkpoint's pickle may call (everything else is refused).
VALUES: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): _collection(set),
    ("builtins", "frozenset"): _collection(frozenset),
    ("builtins", "slice"): _slice,
    ("builtins", "complex"): _complex,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "object"): object,  # the base copyreg._reconstructor names (protocol 0/1 objects)
    ("_codecs", "encode"): _bytes,
    ("types", "SimpleNamespace"): types.SimpleNamespace,
    ("argparse", "Namespace"): argparse.Namespace,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "timedelta"): datetime.timedelta,
    **{
        (m, c): _path
        for m in ("pathlib", "pathlib._local")
        for c in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")
    },
}
#: What torch itself makes: ``torch.Size``, ``torch.device``, and a user's block's random generator (created
#: here, its state given as bytes by :func:`_generator_state`).
_TORCH_VALUES = {
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch._C", "Generator"): _generator,
    ("torch", "Generator"): _generator,
}
_VALUE_TYPES = (
    torch.Size,
    torch.device,
    collections.OrderedDict,
    types.SimpleNamespace,
    argparse.Namespace,
    datetime.datetime,
    datetime.date,
    datetime.timedelta,
)


class SafeUnpickler(pickle._Unpickler):
    """Unpickle a checkpoint's ``data.pkl`` under the allow-list (see the module docstring)."""

    dispatch = dict(pickle._Unpickler.dispatch)
    stack: list[Any]
    metastack: list[list[Any]]
    append: Any

    def __init__(self, archive: CheckpointArchive, *, live: bool, objects: bool = False) -> None:
        super().__init__(io.BytesIO(archive.pickle), encoding="latin1")
        self._objects = objects  # NumPy arrays of objects (a label cache), see _numpy_values
        self._archive = archive
        self._live = live
        self._storages: dict[str, _Storage] = {}
        self._callables: dict[int, str] = {}  # id -> name of what REDUCE may call
        self._classes: dict[int, str] = {}  # id -> name of what NEWOBJ may create
        self._value_types: set[type] = set(_VALUE_TYPES)
        self._types: set[type] = {collections.OrderedDict, *self._value_types}
        self._budget = MAX_TENSOR_EXPANSION * archive.size + TENSOR_SLACK_BYTES
        self._keep: list[Any] = []  # what the id keys above refer to stays alive while loading
        self._made: list[Any] = []  # the objects of model and plain classes made: their state is checked at the end
        self.names: list[str] = []  # every module.name the pickle referred to, in first-seen order

    def load(self) -> Any:
        """The unpickled object, once every object it made is known to hold only data (:mod:`.objstate`)."""
        out = super().load()
        if self._live or not trust_checkpoints():
            check_made(self._archive.path, self._made, live=self._live)
        return out

    # -- names -------------------------------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise RefusedGlobal(self._archive.path, "a name that is not a string")
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
        full = f"{module[:120]}.{name[:120]}"
        if full not in self.names:
            self.names.append(full)
        found = self._value(module, name)
        if found is not None:
            self._callables[id(found)] = full
            if isinstance(found, type):
                self._classes[id(found)] = full
            self._keep.append(found)
            return found
        cls = self._class(module, name)
        if cls is None and not self._live and trust_checkpoints():
            cls = _placeholder(module, name)
        if cls is None:
            raise RefusedGlobal(self._archive.path, full)
        self._classes[id(cls)] = full
        self._types.add(cls)
        self._keep.append(cls)
        return cls

    def _value(self, module: str, name: str) -> Any:
        value = VALUES.get((module, name))
        if value is not None:
            return value
        rebuild = _REBUILDERS.get((module, name))
        if rebuild is not None:
            return lambda *a: rebuild(self, *a)
        if (module, name) == ("copyreg", "_reconstructor"):
            return self._reconstructor
        if (module, name) == ("builtins", "getattr"):
            return self._getattr
        if module.split(".")[0] == "torch":
            return self._torch_value(module, name)
        if module.startswith("numpy"):
            return _numpy_values(self._objects).get((module, name))
        if (module, name) == ("torchvision.transforms.functional", "InterpolationMode"):
            return _interpolation_mode
        if (module, name) in {
            ("ultralytics.utils", "IterableSimpleNamespace"),
            ("ultralytics.yolo.utils", "IterableSimpleNamespace"),
        }:
            from ..compat import IterableSimpleNamespace

            self._types.add(IterableSimpleNamespace)
            return IterableSimpleNamespace
        return None

    def _torch_value(self, module: str, name: str) -> Any:
        """A value of torch's a pickle names: a storage type, a dtype, a size, a device, a generator; else None."""
        if module in {"torch", "torch.storage"} and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if (module, name) in _TORCH_VALUES:
            return _TORCH_VALUES[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        return None

    def _class(self, module: str, name: str) -> type | None:
        cls = model_class(module, name)
        if self._live:
            return cls
        module, name = ALIASES.get((module, name), (module, name))
        if cls is None and not (name.isidentifier() and all(p.isidentifier() for p in module.split("."))):
            return None
        made = _placeholder(module, name)  # inspection: created, never called, nothing imported
        made._inert_class = cls  # type: ignore[attr-defined]  # what its state is checked against, when imported
        return made

    # -- calls -------------------------------------------------------------------------------------------
    def _reconstructor(self, cls: Any, base: Any, state: Any = None) -> Any:
        if id(cls) not in self._classes or base is not object or state is not None:
            raise RefusedGlobal(self._archive.path, f"copyreg._reconstructor of {self._name(cls)}", called=True)
        return self._made_object(cls, cls.__new__(cls))

    def _getattr(self, obj: Any, name: Any) -> Any:
        # Ultralytics' heads keep `Detect.forward` as an attribute: a method of an allowed class, nothing more.
        if id(obj) not in self._classes or name not in {"forward", "forward_fuse"}:
            raise RefusedGlobal(
                self._archive.path, f"builtins.getattr({self._name(obj)}, {str(name)[:40]!r})", called=True
            )
        if isinstance(obj, type) and issubclass(obj, Inert):
            return _placeholder(obj._inert_module, f"{obj._inert_name}.{name}")
        return getattr(obj, name)

    def _name(self, obj: Any) -> str:
        return self._classes.get(id(obj)) or self._callables.get(id(obj)) or type(obj).__name__

    def _load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        if id(func) not in self._callables or not isinstance(args, tuple):
            if not self._live and trust_checkpoints() and isinstance(args, tuple):
                stack[-1] = _placeholder("?", f"call of {self._name(func)[:80]}")(*args)  # trusted: kept, not run
                return
            raise RefusedGlobal(self._archive.path, self._name(func), called=True)
        stack[-1] = func(*args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))

    def _new(self, cls: Any, args: Any, kwargs: Any) -> Any:  # cls: Any, whatever find_class gave
        if id(cls) not in self._classes or not isinstance(cls, type):
            raise RefusedGlobal(self._archive.path, f"{self._name(cls)}.__new__", called=True)
        new: Any = cls.__new__
        if cls in self._value_types:
            return new(cls, *args, **kwargs)
        if issubclass(cls, torch.nn.Module) or (args == () and not kwargs):
            return self._made_object(cls, new(cls))
        raise RefusedGlobal(self._archive.path, f"{self._name(cls)}.__new__ with arguments", called=True)

    def _made_object(self, cls: type, obj: Any) -> Any:
        if id(cls) not in self._callables:  # a model or plain class, not a value type
            self._made.append(obj)
        return obj

    def _refuse_op(self) -> None:
        raise ModelError(
            f"checkpoint '{self._archive.path}' uses a pickle instruction that calls code "
            f"(INST, OBJ or the extension registry), so it was not loaded; {trust_hint()}"
        )

    def _target(self, obj: Any, what: str) -> None:
        if type(obj) in {list, dict, set} or (type(obj) in self._types and not isinstance(obj, type)):
            return
        if (is_tensor(obj) or isinstance(obj, Inert)) and not isinstance(obj, type):
            return
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, (np.ndarray, np.dtype)):
            return
        raise ModelError(
            f"checkpoint '{self._archive.path}' applies {what} to a {type(obj).__name__[:40]}, which "
            f"no checkpoint does, so it was not loaded; {trust_hint()}"
        )

    def _load_build(self) -> None:
        state = self.stack[-1]
        if type(self.stack[-2]) is torch.Generator:  # only _generator makes one
            self.stack.pop()
            _generator_state(self.stack[-1], state)
            return
        self._target(self.stack[-2], "a state")
        if is_tensor(self.stack[-2]):  # torch never does: it would set the tensor's hooks
            raise ModelError(f"checkpoint '{self._archive.path}' gives a tensor a state, so it was not loaded")
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            if not all(isinstance(k, str) for k in state[1]):
                raise ModelError(f"checkpoint '{self._archive.path}' sets an attribute that is not a name")
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    def _load_append(self) -> None:
        self._target(self.stack[-2], "APPEND")
        pickle._Unpickler.load_append(self)  # type: ignore[attr-defined]

    def _load_appends(self) -> None:
        self._target(self._marked(), "APPENDS")
        pickle._Unpickler.load_appends(self)  # type: ignore[attr-defined]

    def _load_setitem(self) -> None:
        self._target(self.stack[-3], "SETITEM")
        pickle._Unpickler.load_setitem(self)  # type: ignore[attr-defined]

    def _load_setitems(self) -> None:
        self._target(self._marked(), "SETITEMS")
        pickle._Unpickler.load_setitems(self)  # type: ignore[attr-defined]

    def _load_additems(self) -> None:
        self._target(self._marked(), "ADDITEMS")
        pickle._Unpickler.load_additems(self)  # type: ignore[attr-defined]

    def _marked(self) -> Any:
        below = self.metastack[-1] if self.metastack else []
        return below[-1] if below else None

    # -- storages and tensors ------------------------------------------------------------------------------
    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ModelError("malformed checkpoint: unknown persistent id")
        _, storage_type, key, _location, numel = pid
        if not isinstance(key, str) or len(key) > 64 or type(numel) is not int or numel < 0:
            raise ModelError("malformed checkpoint: bad storage record")
        if not isinstance(storage_type, _StorageType):
            raise ModelError("malformed checkpoint: a storage of unknown type")
        dtype = storage_type.dtype
        cached = self._storages.get(key)
        if cached is not None:
            return cached
        itemsize = self._itemsize(dtype)
        if self._archive.byteorder != "little" and itemsize > 1:
            raise ModelError(
                f"'{self._archive.path}' was saved on a big-endian machine; load and save it again on this one"
            )
        nbytes = numel * itemsize
        if nbytes > self._archive.size:
            raise ModelError(
                f"'{self._archive.path}' is truncated or malformed: a storage of {nbytes} bytes in a "
                f"file of {self._archive.size}"
            )
        raw = self._archive.read_record(key, nbytes)
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        storage = _Storage(data, dtype)
        self._storages[key] = storage
        return storage

    def _itemsize(self, dtype: Any) -> int:
        return int(torch.empty(0, dtype=dtype).element_size())

    def tensor(self, storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None) -> Any:
        """A tensor viewing ``storage``, checked to lie inside it and within the expansion budget."""
        if not isinstance(storage, _Storage):
            raise ModelError("malformed tensor in checkpoint: its storage is not one of the archive's")
        if type(offset) is not int or offset < 0:
            raise ModelError("malformed tensor in checkpoint: bad storage offset")
        size_t, stride_t = _ints(size, "size"), _ints(stride, "stride")
        if len(size_t) != len(stride_t) or any(v < 0 for v in (*size_t, *stride_t)):
            raise ModelError("malformed tensor in checkpoint: size and stride do not match")
        dtype = dtype or storage.dtype
        itemsize = self._itemsize(dtype)
        extent = offset + (sum((s - 1) * st for s, st in zip(size_t, stride_t)) + 1 if all(size_t) else 0)
        if extent * itemsize > storage.nbytes:
            raise ModelError(f"'{self._archive.path}' is truncated or malformed: a tensor reaches past its storage")
        self._budget -= math.prod(size_t) * itemsize
        if self._budget < 0:
            raise ModelError(
                f"'{self._archive.path}': its tensors span more than {MAX_TENSOR_EXPANSION}x the file's "
                "size (expanded, stride-0 tensors), so it was not loaded"
            )
        t = torch.empty(0, dtype=dtype)
        t.set_(storage.data.untyped_storage(), offset, size_t, stride_t)
        return t

    def make_parameter(self, data: Any, requires_grad: Any) -> Any:
        if not is_tensor(data):
            raise ModelError("malformed parameter in checkpoint")
        return torch.nn.Parameter(data, requires_grad=bool(requires_grad)) if self._live else data


def _rebuild_v2(
    u: SafeUnpickler,
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    hooks: Any = None,
    metadata: Any = None,
) -> Any:
    t = u.tensor(storage, offset, size, stride)
    if requires_grad is True and t.is_floating_point():
        t.requires_grad_(True)
    return t


def _rebuild_v3(
    u: SafeUnpickler,
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    metadata: Any = None,
) -> Any:
    if not isinstance(dtype, torch.dtype):
        raise ModelError("malformed tensor in checkpoint: bad dtype")
    return u.tensor(storage, offset, size, stride, dtype)


def _rebuild_parameter(u: SafeUnpickler, data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> Any:
    return u.make_parameter(data, requires_grad)


def _rebuild_from_type_v2(u: SafeUnpickler, func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if id(func) not in u._callables or not isinstance(args, tuple):
        raise RefusedGlobal(u._archive.path, "torch._tensor._rebuild_from_type_v2 of an unknown function", called=True)
    value = func(*args)
    if new_type is not torch.Tensor and new_type is not torch.nn.Parameter:
        raise RefusedGlobal(u._archive.path, "a tensor subclass", called=True)
    return value


_REBUILDERS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
}

_OPS = {
    pickle.REDUCE: "_load_reduce",
    pickle.NEWOBJ: "_load_newobj",
    pickle.NEWOBJ_EX: "_load_newobj_ex",
    pickle.INST: "_refuse_op",
    pickle.OBJ: "_refuse_op",
    pickle.EXT1: "_refuse_op",
    pickle.EXT2: "_refuse_op",
    pickle.EXT4: "_refuse_op",
    pickle.BUILD: "_load_build",
    pickle.APPEND: "_load_append",
    pickle.APPENDS: "_load_appends",
    pickle.SETITEM: "_load_setitem",
    pickle.SETITEMS: "_load_setitems",
    pickle.ADDITEMS: "_load_additems",
}
for _op, _method in _OPS.items():
    SafeUnpickler.dispatch[_op[0]] = getattr(SafeUnpickler, _method)


def module_dict(obj: Any) -> dict[str, Any] | None:
    """The pickled state of a module placeholder (``_parameters``, ``_buffers``, ``_modules`` ...), else None."""
    if not isinstance(obj, Inert):
        return None
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        state = state[0]
    if isinstance(state, dict) and ("_parameters" in state or "_modules" in state):
        return state
    return None


def module_state_dict(obj: Any, *, max_depth: int = 200, max_modules: int = 100_000) -> dict[str, Any]:
    """The state dict of a pickled ``nn.Module`` placeholder, keyed as ``nn.Module.state_dict`` keys it.

    Raises:
        ModelError: ``obj`` is not a pickled module, or its modules nest deeper than ``max_depth`` or
            number more than ``max_modules`` (a module shared by many parents counts once per parent,
            as ``state_dict`` lists it).
    """
    out: dict[str, Any] = {}
    visits = [0]

    def walk(node: Any, prefix: str, depth: int) -> None:
        state = module_dict(node)
        if state is None:
            return
        if depth > max_depth:
            raise ModelError(f"the checkpoint's modules nest more than {max_depth} deep")
        visits[0] += 1
        if visits[0] > max_modules:
            raise ModelError(f"the checkpoint's model lists more than {max_modules} modules")
        params = state.get("_parameters")
        if isinstance(params, Mapping):
            for name, value in params.items():
                if is_tensor(value):
                    out[f"{prefix}{name}"] = value
        buffers = state.get("_buffers")
        skip = state.get("_non_persistent_buffers_set")
        skip = skip if isinstance(skip, (set, frozenset)) else set()
        if isinstance(buffers, Mapping):
            for name, value in buffers.items():
                if is_tensor(value) and name not in skip:
                    out[f"{prefix}{name}"] = value
        children = state.get("_modules")
        if isinstance(children, Mapping):
            for name, child in children.items():
                walk(child, f"{prefix}{name}.", depth + 1)

    if module_dict(obj) is None:
        raise ModelError("the checkpoint object is not a model")
    walk(obj, "", 0)
    return out
