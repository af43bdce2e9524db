"""The container of a checkpoint: a ``torch.save`` zip archive, read one way only, with bounded sizes.

A file is accepted only when it can be read in exactly one way: it starts with a zip local header
(``PK\\x03\\x04``: no legacy pickle in front of it), its entries have distinct names even ignoring case,
there is exactly one ``<folder>/data.pkl`` record and every entry lies in that folder. Sizes are bounded
by the file's own size: an archive whose entries declare more than :data:`MAX_EXPANSION` times the file's
size (plus :data:`SLACK_BYTES`) is refused before anything is decompressed (a zip bomb), and ``data.pkl``
may hold at most :data:`MAX_PICKLE_BYTES`.

The archive is read from bytes held in memory (:func:`read_bytes`), so what is checked is what is
loaded, even when the file changes on disk meanwhile.

The user's opt-in to unpickle a checkpoint as it is (``--trust-checkpoint``) is a context variable here,
:func:`trusted_checkpoints`, so every reader of checkpoints asks the same place.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError

__all__ = [
    "MAX_EXPANSION",
    "MAX_FILE_BYTES",
    "MAX_PICKLE_BYTES",
    "SLACK_BYTES",
    "TRUST_FLAG",
    "CheckpointArchive",
    "no_checkpoint",
    "open_checkpoint",
    "read_bytes",
    "trust_checkpoints",
    "trust_hint",
    "trusted_checkpoints",
]

#: The command-line flag that lets a checkpoint be unpickled as it is (only for files the user trusts).
TRUST_FLAG = "--trust-checkpoint"
#: Largest ``data.pkl`` read (an Ultralytics model pickles to well under 10 MiB).
MAX_PICKLE_BYTES = 256 * 2**20
#: Largest checkpoint file read (bigger than any YOLO checkpoint by far).
MAX_FILE_BYTES = 8 * 2**30
#: The entries of an archive may declare at most this many times the file's size (``torch.save`` stores
#: its entries uncompressed: a real checkpoint declares about 1x) ...
MAX_EXPANSION = 4
#: ... plus this many bytes.
SLACK_BYTES = 2**20

_TRUST: contextvars.ContextVar[bool] = contextvars.ContextVar("yolo_det_trust_checkpoints", default=False)
_ZIP_MAGIC = b"PK\x03\x04"


@contextlib.contextmanager
def trusted_checkpoints(trust: bool = True) -> Iterator[None]:
    """While active, checkpoints are unpickled as they are, unchecked (the user's opt-in, ``--trust-checkpoint``)."""
    token = _TRUST.set(bool(trust))
    try:
        yield
    finally:
        _TRUST.reset(token)


def trust_checkpoints() -> bool:
    """Whether the user opted in to unpickling checkpoints as they are (``--trust-checkpoint``)."""
    return _TRUST.get()


def trust_hint() -> str:
    """The sentence that names the opt-in flag."""
    return f"if you trust this file, pass {TRUST_FLAG} (loading it then runs whatever it names)"


@dataclass
class CheckpointArchive:
    """The parts of a ``torch.save`` zip archive: its ``data.pkl`` bytes and where its storages are.

    Attributes:
        path: The file (for messages).
        prefix: The archive's folder name (``archive/``, ``last/``, ...).
        pickle: The bytes of ``data.pkl``.
        size: The file's size in bytes (the base of every bound).
        byteorder: ``little`` or ``big`` (from the archive's ``byteorder`` record; little when absent).
    """

    path: Path
    prefix: str
    pickle: bytes
    size: int
    byteorder: str = "little"
    zf: zipfile.ZipFile | None = field(default=None, repr=False)

    def read_record(self, name: str, size: int) -> bytes:
        """The first ``size`` bytes of the storage record ``name`` (``data/<key>``).

        Raises:
            ModelError: The record is missing or shorter than ``size`` (a truncated file).
        """
        if self.zf is None:
            raise ModelError(f"'{self.path}' is closed")
        entry = f"{self.prefix}data/{name}"
        try:
            info = self.zf.getinfo(entry)
        except KeyError:
            raise ModelError(f"'{self.path}' is truncated or incomplete: storage {name!s:.40} is missing") from None
        if info.file_size < size:
            raise ModelError(
                f"'{self.path}' is truncated: storage {name!s:.40} holds {info.file_size} of its {size} bytes"
            )
        try:
            with self.zf.open(info) as f:
                data = f.read(size)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise ModelError(f"'{self.path}' is truncated or damaged: {' '.join(str(e).split())[:120]}") from None
        if len(data) != size:
            raise ModelError(f"'{self.path}' is truncated: storage {name!s:.40} ends early")
        return data

    def close(self) -> None:
        """Close the archive."""
        if self.zf is not None:
            self.zf.close()
            self.zf = None

    def __enter__(self) -> CheckpointArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse(path: Path, why: str) -> ModelError:
    return ModelError(
        f"'{path}' is not a PyTorch checkpoint yolo-det reads ({why}); yolo-det reads the zip "
        "checkpoints torch.save writes (torch >= 1.6)"
    )


def no_checkpoint(path: str | os.PathLike[str]) -> ModelError:
    """The error for a checkpoint path that is not a file: a folder is named as one, with the ``last.pt`` to pass
    (a run folder's ``weights/last.pt``, or the folder's own), else the path does not exist."""
    p = Path(path)
    if not p.is_dir():
        return ModelError(f"checkpoint '{p}' does not exist")
    found = next((c for c in (p / "weights" / "last.pt", p / "last.pt") if c.is_file()), None)
    if found is not None:
        return ModelError(f"'{p}' is a folder, not a checkpoint; pass its checkpoint file: {found}")
    return ModelError(
        f"'{p}' is a folder, not a checkpoint, and holds no weights/last.pt; pass a checkpoint file "
        "(RUN/weights/last.pt)"
    )


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a checkpoint file, at most :data:`MAX_FILE_BYTES`.

    Raises:
        ModelError: The file is missing, unreadable or too big.
    """
    p = Path(path)
    if not p.is_file():
        raise no_checkpoint(p)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ModelError(f"cannot read checkpoint '{p}': {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _refuse(p, f"bigger than {MAX_FILE_BYTES} bytes")
    return data


def open_checkpoint(path: str | os.PathLike[str], data: bytes | None = None) -> CheckpointArchive:
    """Open the ``torch.save`` archive at ``path`` (or its bytes ``data``) when it reads one way only.

    Raises:
        ModelError: The file is missing, is not a zip archive starting at its first byte, has duplicate or
            case-colliding entries, entries outside the record's folder, not exactly one ``data.pkl``, or
            declares more bytes than its bounds allow.
    """
    p = Path(path)
    raw = read_bytes(p) if data is None else data
    if not raw.startswith(_ZIP_MAGIC):
        why = "empty" if not raw else ("a legacy-format pickle" if raw[:1] == b"\x80" else "not a zip archive")
        raise _refuse(p, why)
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        why = "not a complete zip archive: truncated?" if isinstance(e, zipfile.BadZipFile) else str(e)
        raise _refuse(p, why) from None
    try:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        folded = {n.casefold() for n in names}
        if len(folded) != len(names):
            raise _refuse(p, "two entries share a name (ignoring case)")
        records = [n for n in names if n.casefold().endswith("/data.pkl") and n.count("/") == 1]
        if len(records) != 1:
            raise _refuse(p, "not exactly one data.pkl record")
        prefix = records[0][: -len("data.pkl")]
        if any(not n.startswith(prefix) for n in names):
            raise _refuse(p, "entries outside the record's folder")
        if any(i.flag_bits & 0x1 for i in infos):
            raise _refuse(p, "an encrypted entry")
        declared = sum(i.file_size for i in infos)
        bound = MAX_EXPANSION * len(raw) + SLACK_BYTES
        if declared > bound:
            raise _refuse(p, f"its entries declare {declared} bytes, more than {MAX_EXPANSION}x its size")
        info = zf.getinfo(records[0])
        if info.file_size > MAX_PICKLE_BYTES:
            raise _refuse(p, f"data.pkl is {info.file_size} bytes")
        pickle_bytes = zf.read(records[0])
        byteorder = "little"
        if f"{prefix}byteorder" in names:
            byteorder = zf.read(f"{prefix}byteorder")[:16].decode("ascii", "replace").strip()
        if byteorder not in {"little", "big"}:
            raise _refuse(p, "unknown byte order")
    except ModelError:
        zf.close()
        raise
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError, EOFError) as e:  # RuntimeError: encrypted member
        zf.close()
        raise _refuse(p, " ".join(str(e).split())[:120] or "truncated") from None
    return CheckpointArchive(path=p, prefix=prefix, pickle=pickle_bytes, size=len(raw), byteorder=byteorder, zf=zf)
