"""Look inside a PyTorch checkpoint without unpickling it: which globals would loading it import and call?

A checkpoint written by ``torch.save`` is a zip archive whose ``data.pkl`` is a pickle; unpickling it may
import and call any function the file names (``os.system``, ``builtins.exec``, ...). This module reads the
pickle's opcodes with :func:`pickletools.genops` (nothing is imported or called), follows the stack and the
memo far enough to know the module and name of every ``GLOBAL``/``STACK_GLOBAL``/``INST`` reference, and
judges each one: a class or function from the user's own modules passes; what no checkpoint needs (code
execution, files, processes, the network, importing) is refused.

:func:`check_checkpoint` is the pre-check yolo-det runs before it, or Ultralytics, reads a checkpoint.
"""

from __future__ import annotations

import _compat_pickle
import contextlib
import contextvars
import io
import os
import pickletools
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ModelError

__all__ = [
    "TRUST_FLAG",
    "CheckpointArchive",
    "ScanResult",
    "check_checkpoint",
    "is_forbidden",
    "open_checkpoint",
    "pickle_globals",
    "scan_checkpoint",
    "trust_checkpoints",
    "trusted_checkpoints",
]

#: The command-line flag that skips the scan and lets torch unpickle the file as it is.
TRUST_FLAG = "--trust-checkpoint"

_TRUST: contextvars.ContextVar[bool] = contextvars.ContextVar("yolo_det_trust_checkpoints", default=False)


@contextlib.contextmanager
def trusted_checkpoints(trust: bool = True) -> Iterator[None]:
    """While active, commands may hand checkpoints over unscanned, or unpickle them (the user's opt-in,
    ``--trust-checkpoint``)."""
    token = _TRUST.set(bool(trust))
    try:
        yield
    finally:
        _TRUST.reset(token)


def trust_checkpoints() -> bool:
    """Whether the user opted in to unpickling checkpoints (``--trust-checkpoint``)."""
    return _TRUST.get()


#: Largest ``data.pkl`` read (an Ultralytics model pickles to well under 10 MiB).
MAX_PICKLE_BYTES = 256 * 2**20

# Modules no checkpoint needs a name from: running code, processes, files, the network, importing, pickling.
_FORBIDDEN_MODULES = frozenset({
    "os", "posix", "nt", "posixpath", "ntpath", "subprocess", "_posixsubprocess", "sys", "shutil", "socket",
    "_socket", "ssl", "importlib", "imp", "pkgutil", "runpy", "pty", "webbrowser", "code", "codeop", "ctypes",
    "_ctypes", "multiprocessing", "signal", "pickle", "_pickle", "pickletools", "dill", "cloudpickle", "joblib",
    "marshal", "shelve", "types", "operator", "_operator", "functools", "inspect", "io", "_io", "tempfile", "glob",
    "pathlib", "fileinput", "asyncio", "threading", "_thread", "http", "urllib", "urllib3", "requests",
    "ftplib", "smtplib", "telnetlib", "xmlrpc", "pdb", "bdb", "trace", "timeit", "profile", "cProfile",
    "sqlite3", "zipimport", "site", "sysconfig", "distutils", "setuptools", "pip", "gc", "atexit",
    "builtins.__loader__", "venv", "ensurepip", "zipfile", "tarfile", "yaml", "ruamel",
})
# The only builtins a checkpoint may name: containers and plain value types.
_ALLOWED_BUILTINS = frozenset({
    "set", "frozenset", "dict", "list", "tuple", "slice", "complex", "int", "float", "str", "bool", "object",
    "bytes", "bytearray", "range", "NoneType", "Ellipsis", "NotImplemented",
})
# Harmless names of otherwise forbidden modules (value types that Ultralytics and YOLOv5 checkpoints hold).
_ALLOWED_NAMES = {
    "types": frozenset({"SimpleNamespace"}),
    "pathlib": frozenset({"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"}),
}
# Functions of otherwise allowed packages that load further pickles or run code.
_FORBIDDEN_NAMES = frozenset({
    ("torch", "load"), ("torch.serialization", "load"), ("torch.storage", "_load_from_bytes"),
    ("torch.hub", "load"), ("torch.jit", "load"), ("numpy", "load"), ("numpy.lib.npyio", "load"),
    ("numpy", "loadtxt"), ("numpy.testing._private.utils", "runstring"), ("torch._inductor.codecache", "PyCodeCache"),
    ("copyreg", "_extension_registry"), ("torch.utils.cpp_extension", "load"),
    ("torch.utils.cpp_extension", "load_inline"),
})


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def is_forbidden(module: str, name: str) -> bool:
    """Whether loading a pickle that names ``module.name`` could run code no checkpoint needs."""
    if not _DOTTED.fullmatch(module) or not _DOTTED.fullmatch(name):
        return True  # not a name Python could import (or one computed at load time: "?")
    top = module.split(".", 1)[0]
    if top in {"builtins", "__builtin__", "__builtins__"}:
        return module not in {"builtins", "__builtin__"} or name not in _ALLOWED_BUILTINS
    if name in _ALLOWED_NAMES.get(module, ()):
        return False
    if top in _FORBIDDEN_MODULES or module in _FORBIDDEN_MODULES:
        return True
    if (module, name) in _FORBIDDEN_NAMES or name in {"eval", "exec", "compile", "__import__", "system", "popen"}:
        return True
    return any(part.startswith("__") and part.endswith("__") and part not in {"__main__"}
               for part in (*module.split("."), *name.split(".")))


@dataclass
class CheckpointArchive:
    """The parts of a ``torch.save`` zip archive: its ``data.pkl`` bytes and where its storages are.

    Attributes:
        path: The file.
        prefix: The archive's folder name (``archive/``, ``last/``, ...).
        pickle: The bytes of ``data.pkl``.
        byteorder: ``little`` or ``big`` (from the archive's ``byteorder`` record; little when absent).
    """

    path: Path
    prefix: str
    pickle: bytes
    byteorder: str = "little"
    zf: zipfile.ZipFile | None = field(default=None, repr=False)

    def read_record(self, name: str, size: int) -> bytes:
        """The bytes of the storage record ``name`` (``data/<key>``), checked to hold ``size`` bytes."""
        if self.zf is None:
            raise ModelError(f"'{self.path}' is closed")
        entry = f"{self.prefix}data/{name}"
        try:
            info = self.zf.getinfo(entry)
        except KeyError:
            raise ModelError(f"'{self.path}' is not a complete PyTorch checkpoint: storage {name!s:.40} "
                             "is missing") from None
        if info.file_size < size:
            raise ModelError(f"'{self.path}' is not a complete PyTorch checkpoint: storage {name!s:.40} is truncated")
        with self.zf.open(info) as f:
            return f.read(size)

    def close(self) -> None:
        """Close the archive."""
        if self.zf is not None:
            self.zf.close()
            self.zf = None

    def __enter__(self) -> CheckpointArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _not_a_checkpoint(path: Path, why: str) -> ModelError:
    return ModelError(f"'{path}' is not a PyTorch checkpoint ({why}); yolo-det reads the zip checkpoints "
                      "torch.save writes (torch >= 1.6)")


def open_checkpoint(path: str | os.PathLike[str]) -> CheckpointArchive:
    """Open the ``torch.save`` zip archive at ``path`` and read its ``data.pkl`` (nothing is unpickled).

    Raises:
        ModelError: The file is missing, not a zip archive, or has no ``data.pkl``.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"checkpoint '{path}' does not exist")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise _not_a_checkpoint(path, "not a zip archive" if isinstance(e, zipfile.BadZipFile) else str(e)) from None
    try:
        names = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(names) != 1:
            raise _not_a_checkpoint(path, "no data.pkl in the archive")
        prefix = names[0][: -len("data.pkl")]
        info = zf.getinfo(names[0])
        if info.file_size > MAX_PICKLE_BYTES:
            raise _not_a_checkpoint(path, f"data.pkl is {info.file_size} bytes")
        data = zf.read(names[0])
        byteorder = "little"
        if f"{prefix}byteorder" in zf.namelist():
            byteorder = zf.read(f"{prefix}byteorder")[:16].decode("ascii", "replace").strip()
        if byteorder not in {"little", "big"}:
            raise _not_a_checkpoint(path, "unknown byte order")
    except ModelError:
        zf.close()
        raise
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError) as e:  # RuntimeError: encrypted member
        zf.close()
        raise _not_a_checkpoint(path, " ".join(str(e).split())[:120]) from None
    return CheckpointArchive(path=path, prefix=prefix, pickle=data, byteorder=byteorder, zf=zf)


class _Mark:
    pass


_MARK = _Mark()
_UNKNOWN = object()
_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
               "BINUNICODE8"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """The ``(module, name)`` of every global a pickle names, in order, found without unpickling.

    A ``STACK_GLOBAL`` whose module or name is not a literal string (computed at load time) is reported
    as ``("?", "?")``; an extension-registry reference (``EXT1/2/4``) as ``("copyreg", "_extension_registry")``.

    Raises:
        ValueError: ``data`` is not a well-formed pickle.
    """
    stack: list[object] = []
    memo: dict[int, object] = {}
    found: list[tuple[str, str]] = []
    markobject = pickletools.markobject
    for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if name in _PUT_OPS:
            if not stack:
                raise ValueError("memo store on an empty stack")
            memo[int(arg)] = stack[-1]  # type: ignore[arg-type]
            continue
        if name == "MEMOIZE":
            if not stack:
                raise ValueError("memo store on an empty stack")
            memo[len(memo)] = stack[-1]
            continue
        if name in _GET_OPS:
            stack.append(memo.get(int(arg), _UNKNOWN))  # type: ignore[arg-type]
            continue
        if name == "DUP":
            stack.append(stack[-1] if stack else _UNKNOWN)
            continue
        if name == "STACK_GLOBAL":
            if len(stack) < 2:
                raise ValueError("STACK_GLOBAL on a short stack")
            qual, module = stack.pop(), stack.pop()
            if isinstance(module, str) and isinstance(qual, str):
                found.append((module, qual))
            else:
                found.append(("?", "?"))
            stack.append(_UNKNOWN)
            continue
        if name in {"GLOBAL", "INST"}:
            module, _, qual = str(arg).partition(" ")
            found.append((module, qual))
        elif name in {"EXT1", "EXT2", "EXT4"}:
            found.append(("copyreg", "_extension_registry"))
        before = op.stack_before
        if markobject in before:
            while stack and stack[-1] is not _MARK:
                stack.pop()
            if not stack:
                raise ValueError(f"{name} without a mark")
            stack.pop()
            for _ in before[: before.index(markobject)]:
                if not stack:
                    raise ValueError(f"{name} on a short stack")
                stack.pop()
        else:
            for _ in before:
                if not stack:
                    raise ValueError(f"{name} on a short stack")
                stack.pop()
        for item in op.stack_after:
            if item is markobject:
                stack.append(_MARK)
            elif name in _STRING_OPS:
                stack.append(arg.decode("latin-1") if isinstance(arg, bytes) else arg)
            else:
                stack.append(_UNKNOWN)
    return found


@dataclass
class ScanResult:
    """What a checkpoint's pickle names.

    Attributes:
        path: The file.
        globals: Every distinct ``module.name`` referenced, in first-seen order.
        forbidden: Those that no checkpoint needs (see :func:`is_forbidden`).
    """

    path: Path
    globals: list[str]
    forbidden: list[str]


def _python3_name(module: str, name: str) -> tuple[str, str]:
    """The name Python 3's unpickler imports for a (possibly Python 2) name, as ``fix_imports`` maps it."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _scan_pickle(path: Path, data: bytes) -> ScanResult:
    try:
        refs = pickle_globals(data)
    except Exception as e:  # genops raises ValueError, struct errors, ... for broken pickles
        raise _not_a_checkpoint(path, f"data.pkl is not a valid pickle: {' '.join(str(e).split())[:120]}") from None
    names: list[str] = []
    forbidden: list[str] = []
    for raw_module, raw_qual in refs:
        module, qual = _python3_name(raw_module, raw_qual)
        full = f"{module}.{qual}"
        if full in names:
            continue
        names.append(full)
        if module == "?" or is_forbidden(module, qual) or is_forbidden(raw_module, raw_qual):
            forbidden.append("a name computed at load time" if module == "?" else full)
    return ScanResult(path=path, globals=names, forbidden=forbidden)


def scan_checkpoint(path: str | os.PathLike[str]) -> ScanResult:
    """List the globals a checkpoint's pickle names and those it should not (nothing is unpickled).

    Raises:
        ModelError: The file is missing or is not a ``torch.save`` zip archive with a well-formed pickle.
    """
    with open_checkpoint(path) as archive:
        return _scan_pickle(archive.path, archive.pickle)


def _short(items: Iterable[str], n: int = 3) -> str:
    items = list(items)
    text = ", ".join(s[:80] for s in items[:n])
    return text + (f" and {len(items) - n} more" if len(items) > n else "")


def check_checkpoint(path: str | os.PathLike[str], *, flag: str = TRUST_FLAG) -> ScanResult:
    """Refuse a checkpoint whose pickle names what no checkpoint needs; return the scan otherwise.

    Args:
        path: The checkpoint.
        flag: The opt-in named in the error (the caller's command-line flag).

    Raises:
        ModelError: The file is not a checkpoint, or it references a forbidden global (one line naming them and
            ``flag``).
    """
    result = scan_checkpoint(path)
    if result.forbidden:
        raise ModelError(
            f"checkpoint '{result.path}' refers to {_short(result.forbidden)}, which no model checkpoint needs; "
            f"loading it could run code, so it was not loaded (if you trust this file, pass {flag})"
        )
    return result
