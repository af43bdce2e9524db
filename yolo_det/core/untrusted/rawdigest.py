"""The weights digest of a checkpoint read without torch: what makes ``yolo-det digest`` answer in well under a second.

:func:`raw_checkpoint_digest` reads the checkpoint with the one unpickler, :class:`~.unpickle.SafeUnpickler`, in
its torch-free ``raw`` reading (the same allow-list, instructions and bounds; tensors as views of the archive's
bytes), and gives the digest :func:`yolo_det.core.record.checkpoint_digest` gives (same definition: sorted keys,
each as key, dtype class and shape, then its values; float16, bfloat16 and float32 as little-endian float32).
What only torch can make or convert (a device, a generator, a float16 NaN, a dtype outside
:data:`~.unpickle.ITEMSIZE`) makes it answer None, and the caller reads the file with torch, which gives the
same digest. A refusal is the reader's own one line, whichever reading met it.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ModelError
from .container import open_checkpoint
from .unpickle import ITEMSIZE, NeedsTorch, RawTensor, RefusedGlobal, SafeUnpickler, module_dict, module_state_dict

__all__ = ["raw_checkpoint_digest"]

#: What ``state_dict_digest`` writes for a dtype: float16, bfloat16 and float32 alike as ``float``.
_KINDS = {
    **{name: f"torch.{name}" for name in ITEMSIZE},
    "float16": "float",
    "bfloat16": "float",
    "float32": "float",
    "bool": "bool",
}
#: The NumPy type code of each dtype's stored bytes.
_CODES = {
    "float16": "<f2",
    "bfloat16": "<u2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
    "bool": "|u1",
    "uint8": "|u1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
}


def _weights(obj: Any) -> dict[str, RawTensor]:
    """The model weights, found as :func:`.safeload.checkpoint_state_dict` finds them."""
    if isinstance(obj, dict):
        for key in ("ema", "model"):
            if module_dict(obj.get(key)) is not None:
                return module_state_dict(obj[key])
    if module_dict(obj) is not None:
        return module_state_dict(obj)
    if isinstance(obj, dict):
        if isinstance(obj.get("state_dict"), Mapping):
            obj = obj["state_dict"]
        if obj and all(isinstance(v, RawTensor) for v in obj.values()):
            return dict(obj)
    raise NeedsTorch("no model weights found")  # the full reader says what the file holds instead


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for n, st in zip(reversed(size), reversed(stride)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def _values(t: RawTensor) -> bytes:
    """The bytes the digest hashes for ``t``: float16 and bfloat16 widened to float32, the rest as stored."""
    itemsize = ITEMSIZE[t.dtype]
    count = math.prod(t.size)
    if count == 0:
        return b""
    if not _contiguous(t.size, t.stride):
        return _strided_values(t)
    raw = t.data[t.offset * itemsize : (t.offset + count) * itemsize]
    if t.dtype == "float16":  # widened by NumPy (exact), NaN payloads left to torch
        return _strided_values(t)
    if t.dtype == "bfloat16":  # the upper half of a float32
        out = bytearray(4 * count)
        out[2::4], out[3::4] = raw[0::2], raw[1::2]
        return bytes(out)
    if t.dtype == "bool" and raw.translate(None, b"\x00\x01"):
        raise NeedsTorch
    return raw


def _strided_values(t: RawTensor) -> bytes:
    import numpy as np

    itemsize, code = ITEMSIZE[t.dtype], _CODES[t.dtype]
    base = np.frombuffer(t.data, dtype=np.dtype(code), count=len(t.data) // itemsize)
    if math.prod(t.size) == 0:
        arr = np.zeros(t.size, dtype=base.dtype)
    else:
        view = base[t.offset :]
        arr = np.ascontiguousarray(
            np.lib.stride_tricks.as_strided(view, shape=t.size, strides=tuple(s * itemsize for s in t.stride))
        )
    if t.dtype == "float16":
        if np.isnan(arr).any():  # NaN payloads: leave their conversion to torch
            raise NeedsTorch
        return arr.astype("<f4").tobytes()
    if t.dtype == "bfloat16":
        return (arr.astype("<u4") << 16).astype("<u4").tobytes()
    if t.dtype == "bool" and (arr > 1).any():
        raise NeedsTorch
    return arr.tobytes()


def raw_checkpoint_digest(path: str | os.PathLike[str]) -> str | None:
    """The weights digest of the checkpoint at ``path``, read without torch; None when torch must read it.

    Raises:
        ModelError: The file is missing, is not a ``torch.save`` archive (the container's one-line refusal), or
            names or calls what the allow-list refuses (the reader's one line).
    """
    with open_checkpoint(path) as archive:
        try:
            obj = SafeUnpickler(archive, live=False, raw=True).load()
            state = _weights(obj)
            h = hashlib.sha256()
            for key in sorted(state):
                t = state[key]
                h.update(f"{key}\0{_KINDS[t.dtype]}\0{t.size}\0".encode())
                h.update(_values(t))
        except RefusedGlobal:  # the allow-list's answer, whichever reading met it
            raise
        except (NeedsTorch, ModelError):  # torch's own values, or a message the full reader words
            return None
        except Exception:  # a broken pickle raises anything: the full reader words it
            return None
    return h.hexdigest()
