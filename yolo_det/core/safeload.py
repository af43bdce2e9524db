"""Read a checkpoint's weights without running anything the file names.

``torch.load(weights_only=False)`` imports and calls whatever a pickle names, and ``weights_only=True``
refuses every class that is not on torch's allow-list (which includes a model holding the user's own
block classes). yolo-det needs neither: the weights digest and the model YAML stored in an Ultralytics or
YOLOv5 checkpoint are plain data. :func:`read_checkpoint` unpickles ``data.pkl`` with an unpickler whose
``find_class`` imports nothing: every global becomes an inert placeholder class that only records the
arguments and state the pickle gives it, except the containers (``OrderedDict``, ``set``, ...) and
torch's tensor rebuilding, which this module implements itself on the archive's storages. A module's
state dict is then read from the recorded ``_parameters``/``_buffers``/``_modules`` of the placeholders,
exactly as ``nn.Module.state_dict`` lists them.

Where a command really needs the live model (``yolo-det audit model.pt`` when the checkpoint stores no
model YAML), the user opts in with ``--trust-checkpoint`` (see :func:`trusted_checkpoints`).
"""

from __future__ import annotations

import collections
import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch

from .errors import ModelError
from .pickle_scan import TRUST_FLAG, CheckpointArchive, open_checkpoint, trust_checkpoints, trusted_checkpoints

__all__ = [
    "Inert",
    "checkpoint_model_yaml",
    "checkpoint_state_dict",
    "is_module_like",
    "module_state_dict",
    "read_checkpoint",
    "trust_checkpoints",
    "trusted_checkpoints",
]

class Inert:
    """An object a checkpoint named but which was not imported: it keeps what the pickle gave it, nothing more."""

    _inert_module = "?"
    _inert_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Inert:
        obj = object.__new__(cls)
        obj.__dict__.update(inert_args=args, inert_kwargs=kwargs, inert_state=None, inert_items=[], inert_map={})
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

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


class _StorageType:
    """What a pickle's storage class (``torch.FloatStorage``, ``torch.UntypedStorage``) says: a dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _Storage:
    """A storage read from the archive: its bytes as a uint8 tensor."""

    def __init__(self, data: torch.Tensor, dtype: torch.dtype) -> None:
        self.data = data
        self.dtype = dtype


def _check_ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int for v in value) or len(value) > 64:
        raise ModelError(f"malformed tensor in checkpoint: {what} is not a tuple of integers")
    return tuple(value)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(storage, _Storage):
        raise ModelError("malformed tensor in checkpoint: its storage is not one of the archive's")
    if type(offset) is not int or offset < 0:
        raise ModelError("malformed tensor in checkpoint: bad storage offset")
    size_t, stride_t = _check_ints(size, "size"), _check_ints(stride, "stride")
    if len(size_t) != len(stride_t) or any(v < 0 for v in (*size_t, *stride_t)):
        raise ModelError("malformed tensor in checkpoint: size and stride do not match")
    dtype = dtype or storage.dtype
    itemsize = torch.empty(0, dtype=dtype).element_size()
    extent = offset + (sum((s - 1) * st for s, st in zip(size_t, stride_t)) + 1 if all(size_t) else 0)
    if extent * itemsize > storage.data.numel():
        raise ModelError("malformed tensor in checkpoint: it reaches past its storage")
    t = torch.empty(0, dtype=dtype)
    t.set_(storage.data.untyped_storage(), offset, size_t, stride_t)
    return t


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, metadata: Any = None) -> torch.Tensor:
    return _tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any,
                       dtype: Any, metadata: Any = None) -> torch.Tensor:
    if not isinstance(dtype, torch.dtype):
        raise ModelError("malformed tensor in checkpoint: bad dtype")
    return _tensor(storage, storage_offset, size, stride, dtype)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any, state: Any = None) -> Any:
    return data  # the tensor is what the digest reads; no Parameter is made


_REBUILDERS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func in _REBUILDERS.values() and isinstance(args, tuple):
        return func(*args)
    return _placeholder("torch._tensor", "_rebuild_from_type_v2")(func, new_type, args, state)


def _bytes(text: Any, encoding: Any = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in {"latin1", "latin-1"} or len(text) > 2**26:
        raise ModelError("malformed bytes value in checkpoint")
    return text.encode("latin-1")


_SAFE: dict[tuple[str, str], Any] = {
    **_REBUILDERS,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("builtins", "complex"): complex,
    ("_codecs", "encode"): _bytes,
}
_PLACEHOLDERS: dict[tuple[str, str], type] = {}


def _placeholder(module: str, name: str) -> type:
    key = (module[:200], name[:200])
    cls = _PLACEHOLDERS.get(key)
    if cls is None:
        cls = type(f"Inert[{key[1]}]", (Inert,), {"_inert_module": key[0], "_inert_name": key[1]})
        _PLACEHOLDERS[key] = cls
    return cls


_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "UntypedStorage": torch.uint8, "ByteStorage": torch.uint8, "CharStorage": torch.int8,
    "ShortStorage": torch.int16, "IntStorage": torch.int32, "LongStorage": torch.int64,
    "HalfStorage": torch.float16, "FloatStorage": torch.float32, "DoubleStorage": torch.float64,
    "BFloat16Storage": torch.bfloat16, "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128, "QUInt8Storage": torch.quint8, "QInt8Storage": torch.qint8,
    "QInt32Storage": torch.qint32,
}


def _storage_dtype(module: str, name: str) -> torch.dtype | None:
    if module not in {"torch", "torch.storage"}:
        return None
    return _STORAGE_DTYPES.get(name)


class _Unpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` importing nothing: placeholders for every class and function, storages from the zip."""

    def __init__(self, archive: CheckpointArchive) -> None:
        import io

        super().__init__(io.BytesIO(archive.pickle))
        self._archive = archive
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "__builtin__":  # protocol 2 pickles name Python 2's module
            module = "builtins"
        safe = _SAFE.get((module, name))
        if safe is not None:
            return safe
        dtype = _storage_dtype(module, name)
        if dtype is not None:
            return _StorageType(dtype)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # a dtype is a value, not code
        return _placeholder(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ModelError("malformed checkpoint: unknown persistent id")
        _, storage_type, key, _location, numel = pid
        if not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise ModelError("malformed checkpoint: bad storage record")
        dtype = storage_type.dtype if isinstance(storage_type, _StorageType) else None
        if dtype is None:
            raise ModelError("malformed checkpoint: a storage of unknown type")
        cached = self._storages.get(key)
        if cached is not None:
            return cached
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if self._archive.byteorder != "little" and itemsize > 1:
            raise ModelError(f"'{self._archive.path}' was saved on a big-endian machine; load and save it again "
                             "on this one")
        raw = self._archive.read_record(key, numel * itemsize)
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        storage = _Storage(data, dtype)
        self._storages[key] = storage
        return storage


def read_checkpoint(path: str | os.PathLike[str]) -> Any:
    """Unpickle a ``torch.save`` checkpoint without importing or calling anything the file names.

    Containers and tensors come back as they are; every other object is an :class:`Inert` placeholder
    holding the arguments and state the pickle gave it.

    Raises:
        ModelError: The file is missing, not a ``torch.save`` zip archive, or malformed.
    """
    with open_checkpoint(path) as archive:
        try:
            return _Unpickler(archive).load()
        except ModelError as e:
            raise ModelError(f"'{archive.path}': {e}") from None
        except RecursionError:
            raise ModelError(f"'{archive.path}' is not a PyTorch checkpoint: its pickle nests too deeply") from None
        except Exception as e:  # a broken pickle raises anything
            msg = " ".join(str(e).split())[:160]
            raise ModelError(f"'{archive.path}' is not a PyTorch checkpoint: {type(e).__name__}: {msg}") from None


def _module_dict(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, Inert):
        return None
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        state = state[0]
    if isinstance(state, dict) and ("_parameters" in state or "_modules" in state):
        return state
    return None


def is_module_like(obj: Any) -> bool:
    """Whether ``obj`` is the placeholder of a pickled ``nn.Module``."""
    return _module_dict(obj) is not None


def module_state_dict(obj: Any, *, max_depth: int = 200, max_modules: int = 100_000) -> dict[str, torch.Tensor]:
    """The state dict of a pickled ``nn.Module`` placeholder, keyed as ``nn.Module.state_dict`` keys it.

    Raises:
        ModelError: ``obj`` is not a pickled module, or its modules nest deeper than ``max_depth`` or
            number more than ``max_modules`` (a module shared by many parents counts once per parent,
            as ``state_dict`` lists it).
    """
    out: dict[str, torch.Tensor] = {}
    visits = [0]

    def walk(node: Any, prefix: str, depth: int) -> None:
        state = _module_dict(node)
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
                if isinstance(value, torch.Tensor):
                    out[f"{prefix}{name}"] = value
        buffers = state.get("_buffers")
        skip = state.get("_non_persistent_buffers_set")
        skip = skip if isinstance(skip, (set, frozenset)) else set()
        if isinstance(buffers, Mapping):
            for name, value in buffers.items():
                if isinstance(value, torch.Tensor) and name not in skip:
                    out[f"{prefix}{name}"] = value
        children = state.get("_modules")
        if isinstance(children, Mapping):
            for name, child in children.items():
                walk(child, f"{prefix}{name}.", depth + 1)

    if _module_dict(obj) is None:
        raise ModelError("the checkpoint object is not a model")
    walk(obj, "", 0)
    return out


def _model_object(obj: Any) -> Any:
    if isinstance(obj, dict):
        for key in ("ema", "model"):
            if is_module_like(obj.get(key)):
                return obj[key]
    return obj if is_module_like(obj) else None


def checkpoint_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint, read without running anything (see :func:`read_checkpoint`).

    Accepts an Ultralytics or YOLOv5 checkpoint (a dict whose ``ema`` or ``model`` is a module), a plain
    state dict (or ``{"state_dict": ...}``), or a pickled module.

    Raises:
        ModelError: The file is missing, not a checkpoint, or holds no model weights.
    """
    obj = read_checkpoint(path)
    model = _model_object(obj)
    if model is not None:
        return module_state_dict(model)
    if isinstance(obj, dict):
        if isinstance(obj.get("state_dict"), Mapping):
            obj = obj["state_dict"]
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return dict(obj)
    raise ModelError(f"'{path}' holds no model weights (expected a checkpoint with 'model' or 'ema', or a state dict)")


def _plain(value: Any, budget: list[int], depth: int = 0) -> bool:
    """Whether ``value`` is plain YAML data: at most 50 deep and ``budget[0]`` values (shared ones counted
    each time)."""
    budget[0] -= 1
    if depth > 50 or budget[0] < 0:
        return False
    if value is None or isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, str):
        return len(value) <= 10_000
    if isinstance(value, (list, tuple)):
        return all(_plain(v, budget, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, budget, depth + 1) for k, v in value.items())
    return False


def checkpoint_model_yaml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The model YAML (as a dict) that an Ultralytics or YOLOv5 checkpoint stores, and the model's weights.

    Returns None when the checkpoint holds no model, or its model stores no YAML made of plain data.

    Raises:
        ModelError: The file is missing or not a checkpoint.
    """
    obj = read_checkpoint(path)
    model = _model_object(obj)
    if model is None:
        return None
    cfg = (_module_dict(model) or {}).get("yaml")
    if not isinstance(cfg, dict) or not _plain(cfg, [100_000]):
        return None
    return dict(cfg), module_state_dict(model)


def trust_hint() -> str:
    """The sentence that names the opt-in flag."""
    return f"pass {TRUST_FLAG} to unpickle it with torch (this runs code the file names: only for files you trust)"
