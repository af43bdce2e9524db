"""Read checkpoints from others: the weights, the stored model YAML, or the whole object, running nothing.

Every read goes through :class:`~.unpickle.SafeUnpickler` (the allow-list) on an archive opened by
:func:`~.container.open_checkpoint` (one reading only, bounded sizes):

- :func:`read_checkpoint` (inspection: digests, resume states, stored YAMLs) imports nothing: model classes
  become :class:`Inert` placeholders keeping their pickled state; a module's state dict is then read from the
  recorded ``_parameters``/``_buffers``/``_modules``, exactly as ``nn.Module.state_dict`` lists them;
- :func:`load_checkpoint` makes the real objects, of allowed classes only: what yolo-det hands to Ultralytics;
- :func:`guarded_torch_load` makes every ``torch.load`` of a block (Ultralytics' own reads of ``model=``,
  ``pretrained=``, ``resume=`` ...) go through :func:`load_checkpoint` on bytes read once.

With ``--trust-checkpoint`` (:func:`trusted_checkpoints`) :func:`guarded_torch_load` leaves ``torch.load`` alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelError
from .container import (
    TRUST_FLAG,
    CheckpointArchive,
    open_checkpoint,
    read_bytes,
    trust_checkpoints,
    trust_hint,
    trusted_checkpoints,
)
from .unpickle import Inert, RefusedGlobal, SafeUnpickler, module_dict, module_state_dict

__all__ = [
    "TRUST_FLAG",
    "Inert",
    "check_checkpoint",
    "check_label_cache",
    "checkpoint_globals",
    "checkpoint_model_yaml",
    "checkpoint_state_dict",
    "guarded_torch_load",
    "is_module_like",
    "load_checkpoint",
    "module_state_dict",
    "read_checkpoint",
    "trust_checkpoints",
    "trust_hint",
    "trusted_checkpoints",
]


def _unpickle(path: str | os.PathLike[str], data: bytes | None, live: bool) -> Any:
    """The one reading of every checkpoint, whoever wrote it (yolo-det's own runs included): the allow-list."""
    raw = read_bytes(path) if data is None else data
    with open_checkpoint(path, raw) as archive:
        try:
            return SafeUnpickler(archive, live=live).load()
        except RefusedGlobal:  # names its file already
            raise
        except ModelError as e:
            msg = str(e)
            raise ModelError(msg if str(archive.path) in msg else f"'{archive.path}': {msg}") from None
        except RecursionError:
            raise ModelError(f"'{archive.path}' is not a PyTorch checkpoint: its pickle nests too deeply") from None
        except MemoryError:
            raise ModelError(
                f"'{archive.path}' asks for more memory than a checkpoint needs, so it was not loaded"
            ) from None
        except Exception as e:  # a broken pickle raises anything
            msg = " ".join(str(e).split())[:160]
            raise ModelError(
                f"'{archive.path}' is not a PyTorch checkpoint (truncated or damaged?): {type(e).__name__}: {msg}"
            ) from None


def check_label_cache(path: str | os.PathLike[str]) -> None:
    """Check that loading an Ultralytics label cache (``*.cache``: ``np.save`` of one dict, which Ultralytics
    reads back with ``np.load(allow_pickle=True)``) runs no code: a NumPy ``.npy`` header for one Python object,
    then a pickle that the allow-list reads (:class:`~.unpickle.SafeUnpickler`, NumPy object arrays allowed) and
    that names NumPy and plain Python values only, no class of a model.

    Raises:
        ModelError: The file is not such a cache, or its pickle names or calls anything else (one line).
    """
    import numpy as np

    raw = read_bytes(path)
    f = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"NumPy format {version}")
    except ValueError as e:
        why = " ".join(str(e).split())[:80]
        raise ModelError(f"'{path}' is not a label cache Ultralytics writes ({why})") from None
    if dtype != np.dtype(object) or shape != ():
        raise ModelError(f"'{path}' is not a label cache Ultralytics writes (an array of {dtype}, shape {shape})")
    archive = CheckpointArchive(path=Path(path), prefix="", pickle=raw[f.tell() :], size=len(raw))
    unpickler = SafeUnpickler(archive, live=False, objects=True)
    try:
        out = unpickler.load()
    except ModelError:
        raise
    except Exception as e:  # a broken pickle raises anything (RecursionError, MemoryError too)
        raise ModelError(f"'{path}' is not a label cache Ultralytics writes ({type(e).__name__})") from None
    foreign = [n for n in unpickler.names if n.split(".")[0] not in {"numpy", "builtins", "collections", "_codecs"}]
    if foreign or not (isinstance(out, np.ndarray) and isinstance(out.item(), dict)):
        what = f"names {foreign[0]}" if foreign else "does not hold one mapping"
        raise ModelError(f"'{path}' is not a label cache Ultralytics writes (its pickle {what})")


def read_checkpoint(path: str | os.PathLike[str]) -> Any:
    """Unpickle a ``torch.save`` checkpoint for inspection, importing nothing outside torch.

    Containers and tensors come back as they are; model objects are :class:`Inert` placeholders holding the
    state the pickle gave them.

    Raises:
        ModelError: The file is missing, not a ``torch.save`` zip archive, malformed, or calls something off
            the allow-list (one line naming it).
    """
    return _unpickle(path, None, live=False)


def load_checkpoint(path: str | os.PathLike[str], data: bytes | None = None) -> Any:
    """Unpickle a checkpoint into real objects of allowed classes only (see :mod:`.allow`).

    Args:
        path: The file (also named in messages).
        data: Its bytes, when already read.

    Raises:
        ModelError: The container is ambiguous or malformed, or the pickle names or calls something off the
            allow-list (one line naming it and the opt-in).
    """
    return _unpickle(path, data, live=True)


def checkpoint_globals(path: str | os.PathLike[str]) -> list[str]:
    """Every ``module.name`` a checkpoint's pickle refers to, in first-seen order, read as :func:`read_checkpoint`
    reads it (nothing outside torch imported).

    Raises:
        ModelError: See :func:`read_checkpoint`.
    """
    with open_checkpoint(path) as archive:
        unpickler = SafeUnpickler(archive, live=False)
        try:
            unpickler.load()
        except ModelError as e:
            raise ModelError(str(e) if str(archive.path) in str(e) else f"'{archive.path}': {e}") from None
        except Exception as e:  # a broken pickle raises anything
            raise ModelError(
                f"'{archive.path}' is not a PyTorch checkpoint (truncated or damaged?): {type(e).__name__}"
            ) from None
        return list(unpickler.names)


def check_checkpoint(path: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint :func:`load_checkpoint` would refuse (nothing is kept); no-op under ``--trust-checkpoint``.

    Raises:
        ModelError: See :func:`load_checkpoint`.
    """
    if not trust_checkpoints():
        load_checkpoint(path)


_LOAD_LOCK = threading.Lock()
_LOAD_DEPTH = [0]
_REAL_LOAD: list[Any] = []
_REAL_SAVE: list[Any] = []


def _from_plain_pickle() -> bool:
    """Whether ``torch.load`` was called by torch's ``storage._load_from_bytes``: a tensor inside a stream that plain
    ``pickle`` is unpickling (torch.distributed's object collectives between the ranks of one job do). Whoever
    unpickles that stream trusted it already; yolo-det's own unpickler never reaches that function."""
    import torch.storage

    code = getattr(getattr(torch.storage, "_load_from_bytes", None), "__code__", None)
    return code is not None and sys._getframe(2).f_code is code


def _guarded_load(f: Any, map_location: Any = None, pickle_module: Any = None, *args: Any, **kwargs: Any) -> Any:
    real = _REAL_LOAD[0]
    if trust_checkpoints() or pickle_module is not None or args or _from_plain_pickle():
        return real(f, map_location, pickle_module, *args, **kwargs)
    if isinstance(f, (str, os.PathLike)):
        name, data = str(f), read_bytes(f)
    else:
        name, data = str(getattr(f, "name", "<stream>")), f.read()
    if kwargs.get("weights_only") is True:  # torch's own restricted loader (ULTRALYTICS_SAFE_LOAD=1), after ours
        load_checkpoint(name, data)
        return real(io.BytesIO(data), map_location, **kwargs)
    obj = load_checkpoint(name, data)
    if map_location not in (None, "cpu") and not (
        isinstance(map_location, torch.device) and map_location.type == "cpu"
    ):
        raise ModelError(f"yolo-det loads checkpoints on the CPU only ('{name}' asked for {map_location!s:.40})")
    return obj


def _atomic_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.save``, to a path atomically (so that a kill leaves the file as it was)."""
    # a module that kept a reference to this function (Ultralytics' patches, imported under the guard) still saves
    real = _REAL_SAVE[0] if _REAL_SAVE else torch.serialization.save
    if not _REAL_SAVE or not isinstance(f, (str, os.PathLike)):
        return real(obj, f, *args, **kwargs)
    from ..fileio import atomic_file  # Ultralytics' final strip_optimizer rewrite: all or nothing
    from ..testpoints import reach

    with atomic_file(f, sync=False) as out_file:
        out = real(obj, out_file, *args, **kwargs)
        reach("weights-file-saving")
    return out


@contextlib.contextmanager
def guarded_torch_load() -> Iterator[None]:
    """While active, ``torch.load`` reads through :func:`load_checkpoint` (the allow-list), unless the user
    trusts checkpoints or the caller passes its own ``pickle_module``, and ``torch.save`` to a path writes
    atomically. A checkpoint the run wrote itself is read back through the same allow-list as any other.
    Restored on exit, on error too."""
    with _LOAD_LOCK:
        if _LOAD_DEPTH[0] == 0:
            _REAL_LOAD[:] = [torch.load]
            _REAL_SAVE[:] = [torch.save]
            torch.load = _guarded_load
            torch.save = _atomic_save
        _LOAD_DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOAD_LOCK:
            _LOAD_DEPTH[0] -= 1
            if _LOAD_DEPTH[0] == 0:
                torch.load = _REAL_LOAD.pop()
                torch.save = _REAL_SAVE.pop()


def is_module_like(obj: Any) -> bool:
    """Whether ``obj`` is the placeholder of a pickled ``nn.Module``."""
    return module_dict(obj) is not None


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
    cfg = (module_dict(model) or {}).get("yaml")
    if not isinstance(cfg, dict) or not _plain(cfg, [100_000]):
        return None
    return dict(cfg), module_state_dict(model)
