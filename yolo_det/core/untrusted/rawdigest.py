"""The weights digest of a checkpoint read from the archive's bytes, without importing torch.

:func:`raw_checkpoint_digest` gives the digest :func:`yolo_det.core.record.checkpoint_digest` gives (same
definition: sorted keys, each as key, dtype class and shape, then its values; float16, bfloat16 and float32
as little-endian float32), for the checkpoints it can read whole: an Ultralytics or YOLOv5 checkpoint or a
plain state dict whose pickle names only containers, tensors of the common dtypes, and classes it never
creates other than as placeholders. It is what makes ``yolo-det digest`` answer in well under a second.

It is stricter than :class:`~.unpickle.SafeUnpickler`, never more lenient: anything else in the file (a
value function, a NumPy scalar, an unusual tensor, a malformed record, a refused name) makes it answer
None, and the caller reads the file with the full reader, which gives the same digest or the one-line
refusal it always gave. What it calls is its own small set of functions; no name the pickle gives is
imported or called, no instruction that calls code (``INST``, ``OBJ``, the extension registry) is run, and
the bounds on storages and tensors are those of the full reader.
"""

from __future__ import annotations

import array
import hashlib
import io
import math
import os
import pickle
import struct
import sys
from collections.abc import Mapping
from typing import Any

from .container import MAX_EXPANSION, SLACK_BYTES, open_checkpoint

__all__ = ["raw_checkpoint_digest"]


class _NotHere(Exception):
    """The file holds something only the full reader reads (or refuses)."""


#: dtype name -> (item size, NumPy type code, digest kind); the kind is what ``state_dict_digest`` writes.
_DTYPES: dict[str, tuple[int, str, str]] = {
    "float16": (2, "<f2", "float"),
    "bfloat16": (2, "<u2", "float"),
    "float32": (4, "<f4", "float"),
    "float64": (8, "<f8", "torch.float64"),
    "complex64": (8, "<c8", "torch.complex64"),
    "complex128": (16, "<c16", "torch.complex128"),
    "bool": (1, "|u1", "bool"),
    "uint8": (1, "|u1", "torch.uint8"),
    "int8": (1, "|i1", "torch.int8"),
    "int16": (2, "<i2", "torch.int16"),
    "int32": (4, "<i4", "torch.int32"),
    "int64": (8, "<i8", "torch.int64"),
}

_STORAGES: dict[str, str] = {
    "UntypedStorage": "uint8",
    "ByteStorage": "uint8",
    "CharStorage": "int8",
    "ShortStorage": "int16",
    "IntStorage": "int32",
    "LongStorage": "int64",
    "HalfStorage": "float16",
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "BFloat16Storage": "bfloat16",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}


class _Dtype:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Storage:
    __slots__ = ("data", "dtype")

    def __init__(self, data: bytes, dtype: str) -> None:
        self.data = data
        self.dtype = dtype


class _Tensor:
    __slots__ = ("dtype", "offset", "size", "storage", "stride")

    def __init__(self, storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], dtype: str):
        self.storage, self.offset, self.size, self.stride, self.dtype = storage, offset, size, stride, dtype


class _Placeholder:
    """An object of a class the pickle named: created empty, given its pickled state, nothing more."""

    def __init__(self) -> None:
        self.state: Any = None


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > 64 or not all(type(v) is int and v >= 0 for v in value):
        raise _NotHere
    return tuple(value)


class _RawUnpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)
    stack: list[Any]
    metastack: list[list[Any]]
    append: Any

    def __init__(self, data: bytes, archive: Any) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        self._archive = archive
        self._storages: dict[str, _Storage] = {}
        self._budget = MAX_EXPANSION * archive.size + SLACK_BYTES
        self._classes: set[int] = set()
        self._ordered: set[int] = set()  # the OrderedDicts it made (a state dict's BUILD gives their _metadata)
        self._keep: list[Any] = []
        self._functions: dict[tuple[str, str], Any] = {
            ("collections", "OrderedDict"): self._odict,
            ("builtins", "set"): self._set,
            ("torch", "Size"): self._size,
            ("torch._utils", "_rebuild_tensor_v2"): self._rebuild_v2,
            ("torch._utils", "_rebuild_tensor_v3"): self._rebuild_v3,
            ("torch._utils", "_rebuild_parameter"): self._parameter,
            ("torch._utils", "_rebuild_parameter_with_state"): self._parameter,
            ("builtins", "getattr"): self._getattr,
        }
        self._callable = {id(f) for f in self._functions.values()}
        self._keep.extend(self._functions.values())

    # -- names -----------------------------------------------------------------------------------------------
    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise _NotHere
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
        found = self._functions.get((module, name))
        if found is not None:
            return found
        if module in {"torch", "torch.storage"} and name in _STORAGES:
            return _Dtype(_STORAGES[name])
        if module == "torch" and name in _DTYPES:
            return _Dtype(name)
        if module in {"builtins", "copyreg", "torch", "torch._utils", "torch._tensor"} or module.startswith("numpy"):
            raise _NotHere  # a value the full reader knows (or refuses)
        if not (name.isidentifier() and all(p.isidentifier() for p in module.split("."))):
            raise _NotHere
        return self._class()

    def _class(self) -> type:
        cls = type("Placeholder", (_Placeholder,), {})
        self._classes.add(id(cls))
        self._keep.append(cls)
        return cls

    # -- the functions it calls ------------------------------------------------------------------------------
    def _odict(self, items: Any = ()) -> dict[Any, Any]:
        if items != ():
            raise _NotHere
        made: dict[Any, Any] = {}
        self._ordered.add(id(made))
        self._keep.append(made)
        return made

    @staticmethod
    def _set(items: Any = ()) -> set[Any]:
        if not isinstance(items, (list, tuple)):
            raise _NotHere
        return set(items)

    @staticmethod
    def _size(items: Any = ()) -> tuple[int, ...]:
        return _ints(items)

    def _getattr(self, obj: Any, name: Any) -> Any:
        if id(obj) not in self._classes or name not in {"forward", "forward_fuse"}:
            raise _NotHere
        return self._class()

    def _rebuild_v2(self, storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Tensor:
        if len(rest) > 3 or not isinstance(storage, _Storage):
            raise _NotHere
        return self._tensor(storage, offset, size, stride, storage.dtype)

    def _rebuild_v3(
        self, storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *rest: Any
    ) -> _Tensor:
        if len(rest) > 1 or not isinstance(storage, _Storage) or not isinstance(dtype, _Dtype):
            raise _NotHere
        return self._tensor(storage, offset, size, stride, dtype.name)

    @staticmethod
    def _parameter(data: Any, *rest: Any) -> _Tensor:
        if not isinstance(data, _Tensor) or len(rest) > 3:
            raise _NotHere
        return data

    def _tensor(self, storage: _Storage, offset: Any, size: Any, stride: Any, dtype: str) -> _Tensor:
        if type(offset) is not int or offset < 0:
            raise _NotHere
        size_t, stride_t = _ints(size), _ints(stride)
        if len(size_t) != len(stride_t):
            raise _NotHere
        itemsize = _DTYPES[dtype][0]
        extent = offset + (sum((s - 1) * st for s, st in zip(size_t, stride_t)) + 1 if all(size_t) else 0)
        if extent * itemsize > len(storage.data):
            raise _NotHere
        self._budget -= math.prod(size_t) * itemsize
        if self._budget < 0:
            raise _NotHere
        return _Tensor(storage, offset, size_t, stride_t, dtype)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotHere
        _, storage_type, key, _location, numel = pid
        if not isinstance(key, str) or len(key) > 64 or type(numel) is not int or numel < 0:
            raise _NotHere
        if not isinstance(storage_type, _Dtype):
            raise _NotHere
        cached = self._storages.get(key)
        if cached is not None:
            return cached
        itemsize = _DTYPES[storage_type.name][0]
        if self._archive.byteorder != "little" and itemsize > 1:
            raise _NotHere
        nbytes = numel * itemsize
        if nbytes > self._archive.size:
            raise _NotHere
        storage = _Storage(self._archive.read_record(key, nbytes), storage_type.name)
        self._storages[key] = storage
        return storage

    # -- the instructions that call or change objects --------------------------------------------------------
    def _load_reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if id(func) not in self._callable or not isinstance(args, tuple):
            raise _NotHere
        self.stack[-1] = func(*args)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if id(cls) not in self._classes or args != ():
            raise _NotHere
        self.append(cls())

    def _refuse(self) -> None:
        raise _NotHere

    def _load_build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if id(target) in self._ordered and isinstance(state, dict) and all(isinstance(k, str) for k in state):
            return  # attributes of an OrderedDict (a state dict's _metadata): not part of the weights
        if not isinstance(target, _Placeholder):
            raise _NotHere
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            if not all(isinstance(k, str) for k in state[1]):
                raise _NotHere
        target.state = state

    def _check(self, target: Any) -> None:
        if type(target) not in {list, dict, set}:
            raise _NotHere

    def _load_append(self) -> None:
        self._check(self.stack[-2])
        pickle._Unpickler.load_append(self)  # type: ignore[attr-defined]

    def _load_appends(self) -> None:
        self._check(self._marked())
        pickle._Unpickler.load_appends(self)  # type: ignore[attr-defined]

    def _load_setitem(self) -> None:
        self._check(self.stack[-3])
        pickle._Unpickler.load_setitem(self)  # type: ignore[attr-defined]

    def _load_setitems(self) -> None:
        self._check(self._marked())
        pickle._Unpickler.load_setitems(self)  # type: ignore[attr-defined]

    def _load_additems(self) -> None:
        self._check(self._marked())
        pickle._Unpickler.load_additems(self)  # type: ignore[attr-defined]

    def _marked(self) -> Any:
        below = self.metastack[-1] if self.metastack else []
        return below[-1] if below else None


_OPS = {
    pickle.REDUCE: "_load_reduce",
    pickle.NEWOBJ: "_load_newobj",
    pickle.NEWOBJ_EX: "_refuse",
    pickle.INST: "_refuse",
    pickle.OBJ: "_refuse",
    pickle.EXT1: "_refuse",
    pickle.EXT2: "_refuse",
    pickle.EXT4: "_refuse",
    pickle.BUILD: "_load_build",
    pickle.APPEND: "_load_append",
    pickle.APPENDS: "_load_appends",
    pickle.SETITEM: "_load_setitem",
    pickle.SETITEMS: "_load_setitems",
    pickle.ADDITEMS: "_load_additems",
}
for _op, _method in _OPS.items():
    _RawUnpickler.dispatch[_op[0]] = getattr(_RawUnpickler, _method)


def _module_state(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, _Placeholder):
        return None
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        state = state[0]
    if isinstance(state, dict) and ("_parameters" in state or "_modules" in state):
        return state
    return None


def _state_dict(model: Any) -> dict[str, _Tensor]:
    """The tensors ``nn.Module.state_dict`` lists, walked as :func:`.safeload.module_state_dict` walks them."""
    out: dict[str, _Tensor] = {}
    visits = [0]

    def walk(node: Any, prefix: str, depth: int) -> None:
        state = _module_state(node)
        if state is None:
            return
        visits[0] += 1
        if depth > 200 or visits[0] > 100_000:
            raise _NotHere
        params = state.get("_parameters")
        if isinstance(params, Mapping):
            for name, value in params.items():
                if isinstance(value, _Tensor):
                    out[f"{prefix}{name}"] = value
        buffers = state.get("_buffers")
        skip = state.get("_non_persistent_buffers_set")
        skip = skip if isinstance(skip, (set, frozenset)) else set()
        if isinstance(buffers, Mapping):
            for name, value in buffers.items():
                if isinstance(value, _Tensor) and name not in skip:
                    out[f"{prefix}{name}"] = value
        children = state.get("_modules")
        if isinstance(children, Mapping):
            for name, child in children.items():
                walk(child, f"{prefix}{name}.", depth + 1)

    walk(model, "", 0)
    return out


def _weights(obj: Any) -> dict[str, _Tensor]:
    if isinstance(obj, dict):
        for key in ("ema", "model"):
            if _module_state(obj.get(key)) is not None:
                return _state_dict(obj[key])
    if _module_state(obj) is not None:
        return _state_dict(obj)
    if isinstance(obj, dict):
        if isinstance(obj.get("state_dict"), Mapping):
            obj = obj["state_dict"]
        if obj and all(isinstance(v, _Tensor) for v in obj.values()):
            return dict(obj)
    raise _NotHere


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for n, st in zip(reversed(size), reversed(stride)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def _values(t: _Tensor) -> bytes:
    """The bytes the digest hashes for ``t``: float16 and bfloat16 widened to float32, the rest as stored."""
    itemsize = _DTYPES[t.dtype][0]
    count = math.prod(t.size)
    if count == 0:
        return b""
    if not _contiguous(t.size, t.stride):
        return _strided_values(t)
    raw = t.storage.data[t.offset * itemsize : (t.offset + count) * itemsize]
    if t.dtype == "float16":
        values = struct.unpack(f"<{count}e", raw)
        if not math.isfinite(sum(values)):  # NaN or infinity: leave their conversion to the full reader
            raise _NotHere
        return array.array("f", values).tobytes() if sys.byteorder == "little" else _strided_values(t)
    if t.dtype == "bfloat16":  # the upper half of a float32
        out = bytearray(4 * count)
        out[2::4], out[3::4] = raw[0::2], raw[1::2]
        return bytes(out)
    if t.dtype == "bool" and raw.translate(None, b"\x00\x01"):
        raise _NotHere
    return raw


def _strided_values(t: _Tensor) -> bytes:
    import numpy as np

    itemsize, code, _kind = _DTYPES[t.dtype]
    base = np.frombuffer(t.storage.data, dtype=np.dtype(code), count=len(t.storage.data) // itemsize)
    if math.prod(t.size) == 0:
        arr = np.zeros(t.size, dtype=base.dtype)
    else:
        view = base[t.offset :]
        arr = np.ascontiguousarray(
            np.lib.stride_tricks.as_strided(view, shape=t.size, strides=tuple(s * itemsize for s in t.stride))
        )
    if t.dtype == "float16":
        if np.isnan(arr).any():  # NaN payloads: leave their conversion to torch
            raise _NotHere
        return arr.astype("<f4").tobytes()
    if t.dtype == "bfloat16":
        return (arr.astype("<u4") << 16).astype("<u4").tobytes()
    if t.dtype == "bool" and (arr > 1).any():
        raise _NotHere
    return arr.tobytes()


def raw_checkpoint_digest(path: str | os.PathLike[str]) -> str | None:
    """The weights digest of the checkpoint at ``path``, read without torch; None when the full reader must read it.

    Raises:
        ModelError: The file is missing or is not a ``torch.save`` archive (the container's one-line refusal).
    """
    with open_checkpoint(path) as archive:
        try:
            obj = _RawUnpickler(archive.pickle, archive).load()
            state = _weights(obj)
            h = hashlib.sha256()
            for key in sorted(state):
                t = state[key]
                h.update(f"{key}\0{_DTYPES[t.dtype][2]}\0{t.size}\0".encode())
                h.update(_values(t))
        except Exception:  # _NotHere, or a pickle this reader cannot follow: the full reader decides
            return None
    return h.hexdigest()
