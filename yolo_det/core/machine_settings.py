"""The machine settings of the profile schema: ``intra_op_threads`` and ``cpu_isa`` (registered with
:func:`~yolo_det.core.profiles.register_setting` when :mod:`yolo_det.core.profiles` is imported).

``intra_op_threads: N`` pins torch's intra-op threads to ``N`` while a phase runs (whatever the machine's core
count and whatever Ultralytics chose), so the CPU kernels split their reductions the same way everywhere.
``cpu_isa: avx2`` (or ``default``, the plain x86-64 branch) pins the instruction-set branches of ATen, oneDNN
and MKL with the environment variables of :data:`ISA_ENV`. Those are read when torch starts, so they must be
in place before torch is imported: ``yolo-det`` sets them itself before it imports torch (it re-executes
itself when it must); a Python program that imported torch without them is told in one line what to set.
This module imports nothing but the standard library, so the command line can read it before torch.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ISA_CAPABILITY",
    "ISA_ENV",
    "MACHINE_SETTINGS",
    "PRESTART_ENV",
    "REPLACED_VAR",
    "cannot_match",
    "cpu_flags",
    "missing_env",
    "replaced_env",
    "user_values",
]

#: The environment every choice of ``cpu_isa`` needs before torch starts (MKL's conditional numerical
#: reproducibility needs the fixed thread count too, which ``intra_op_threads`` gives).
ISA_ENV: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"},
}
#: What ``torch.backends.cpu.get_cpu_capability()`` says under each ``cpu_isa``.
ISA_CAPABILITY = {"avx2": "AVX2", "default": "DEFAULT"}
#: The CPU flag (``/proc/cpuinfo``) a machine needs for each ``cpu_isa``.
_ISA_FLAG = {"avx2": "avx2", "default": "sse2"}
#: Environment variables read when torch (or its libraries) start: setting them later changes nothing.
PRESTART_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")
#: How ``yolo-det`` hands the process it re-executes the user's own values a profile replaced (JSON object).
REPLACED_VAR = "YOLO_DET_REPLACED_ENV"
_CPUINFO_LIMIT = 4 * 1024 * 1024  # /proc/cpuinfo of a 512-core machine is about 1 MB


def _check_threads(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValueError(f"must be null or an integer from 1 to 1024, got {value!r:.40}")
    return value


def _check_isa(value: Any) -> str | None:
    if value is None:
        return None
    if value not in ISA_ENV:
        raise ValueError(f"must be null or one of {', '.join(ISA_ENV)}, got {value!r:.40}")
    return str(value)


#: The machine settings as ``(name, default, check, doc)``, for :class:`~yolo_det.core.profiles.Setting`.
MACHINE_SETTINGS: tuple[tuple[str, Any, Any, str], ...] = (
    (
        "intra_op_threads",
        None,
        _check_threads,
        "torch's intra-op threads while the phase runs (null: leave them); the same number on every machine",
    ),
    (
        "cpu_isa",
        None,
        _check_isa,
        "pin the instruction-set branch of ATen, oneDNN and MKL (avx2 or default) before torch starts",
    ),
)


def cpu_info() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none), read with a size limit."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read(_CPUINFO_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip()[:64], value.strip()[:65536])
    return out


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (``/proc/cpuinfo`` ``flags``; empty where unknown)."""
    return frozenset(cpu_info().get("flags", "").split())


def cannot_match(isa: str, *, machine: str | None = None, flags: frozenset[str] | None = None) -> str | None:
    """Why this machine cannot run the ``cpu_isa`` branch ``isa`` (one line), or None when it can."""
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine not in {"x86_64", "amd64"}:
        return f"cpu_isa: {isa} needs an x86-64 CPU, and this machine is {machine or 'unknown'}; no setting fixes it"
    flags = cpu_flags() if flags is None else flags
    if flags and _ISA_FLAG[isa] not in flags:
        return f"cpu_isa: {isa} needs a CPU with {_ISA_FLAG[isa].upper()}, and this one has none; no setting fixes it"
    return None


def missing_env(isa: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`ISA_ENV` ``[isa]`` that ``environ`` (default ``os.environ``) does not hold."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in ISA_ENV[isa].items() if environ.get(k) != v}


def user_values(isa: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's own values (set, and not what ``isa`` needs) that pinning ``isa`` replaces."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in missing_env(isa, environ) if k in environ}


def replaced_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's own values a profile replaced before torch started (:data:`REPLACED_VAR`), name -> value.

    Only the names of :data:`PRESTART_ENV` are read back; anything else in the variable is ignored.
    """
    raw = (os.environ if environ is None else environ).get(REPLACED_VAR)
    try:
        found = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v[:200] for k, v in found.items() if k in PRESTART_ENV and isinstance(v, str)}
