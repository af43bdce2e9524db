"""The machine a run trained on, and the one rule that says whether two machines give the same bits.

:func:`machine_fingerprint` is what decides a run's bits beyond the software versions: torch's intra-op and
inter-op threads actually in use, the ATen CPU capability in force, the oneDNN/MKL instruction-set
environment, whether oneDNN (mkldnn) is on, the versions of MKL and oneDNN, the CPU's architecture, vendor,
model and instruction-set flags, the core count, and on CUDA the GPU fingerprint (model, SM count,
capability, driver, CUDA, cuDNN, TF32 and ``fp32_precision``). It is ``environment.host`` in the record.

:func:`machine_causes` compares two fingerprints (or the ``environment`` of an older record, which holds only
the threads and the capability) and names every difference between them, each with the setting that fixes
it, in two kinds: a difference known to change the bits (threads, an instruction-set branch, the MKL code path,
the GPU model or SM count, TF32), and a version difference nobody has measured (torch, Ultralytics, oneDNN,
MKL, CUDA, cuDNN, the driver), under which agreement is not promised (nor a difference). ``yolo-det diff``,
``verify --against`` and ``check-machine`` all use it, so they cannot disagree.
Only the fingerprint needs torch (imported when it is taken): a comparison of records does not.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .machine_settings import PRESTART_ENV, cpu_info

__all__ = ["MachineCause", "machine_causes", "machine_fingerprint", "machine_view"]

#: Environment variables of the fingerprint: the instruction-set branches and the thread variables.
MACHINE_ENV = (*PRESTART_ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_ONEDNN_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def _config_version(pattern: str) -> str | None:
    import torch

    try:
        m = re.search(pattern, torch.__config__.show())
    except Exception:  # an optional detail of the build
        return None
    return m.group(1) if m else None


def _gpu() -> dict[str, Any] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        driver = torch._C._cuda_getDriverVersion()  # type: ignore[attr-defined]
    except Exception:  # a private detail; absent on some builds
        driver = None
    matmul = torch.backends.cuda.matmul

    def read(getter: Any) -> Any:
        try:
            return getter()
        except (AttributeError, RuntimeError):
            return None

    return {
        "name": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "driver": driver,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "count": torch.cuda.device_count(),
        "matmul_allow_tf32": read(lambda: matmul.allow_tf32),
        "cudnn_allow_tf32": read(lambda: torch.backends.cudnn.allow_tf32),
        "matmul_fp32_precision": read(lambda: matmul.fp32_precision),
    }


def machine_fingerprint() -> dict[str, Any]:
    """What of this process and machine decides a run's bits (see the module docstring), as plain data."""
    import torch

    info = cpu_info()
    flags = info.get("flags", "").split()
    return {
        "arch": platform.machine() or None,
        "cpu_vendor": info.get("vendor_id") or None,
        "cpu_model": info.get("model name") or info.get("Hardware") or None,
        "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "fma", "sse4", "amx"))),
        "cpu_count": os.cpu_count(),
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled) and torch.backends.mkldnn.is_available(),
        "mkl": _config_version(r"Math Kernel Library Version ([\w.]+)"),
        "onednn": _config_version(r"MKL-DNN v([\w.]+)"),
        "torch": torch.__version__,
        "ultralytics": _installed_version("ultralytics"),
        "env": {k: os.environ.get(k) for k in MACHINE_ENV},
        "gpu": _gpu(),
    }


def _installed_version(name: str) -> str | None:
    """The version of the installed distribution ``name`` (None when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_view(environment: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of a record's ``environment``: ``environment.host``, or what an older record has."""
    host = environment.get("host")
    if isinstance(host, Mapping):
        return dict(host)
    found = environment.get("env")
    env: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    return {
        "arch": environment.get("machine"),
        "cpu_model": environment.get("cpu_model"),
        "cpu_count": environment.get("cpu_count"),
        "intra_op_threads": environment.get("torch_threads"),
        "cpu_capability": environment.get("cpu_capability"),
        "torch": environment.get("torch"),
        "ultralytics": environment.get("ultralytics"),
        "env": {k: env.get(k) for k in MACHINE_ENV if k in env},
        "gpu": None,
    }


@dataclass(frozen=True)
class MachineCause:
    """One difference between two machines: what, both values, the fix, and whether it is known to change the bits.

    Attributes:
        measured: True when this difference changes the bits (the runs will differ); False for a version
            difference whose effect nobody has measured (agreement is not promised, nor is a difference).
    """

    name: str
    a: Any
    b: Any
    fix: str
    measured: bool = True

    @property
    def reason(self) -> str:
        """The fix, with the words that say how sure the cause is."""
        if self.measured:
            return f"fix: {self.fix}"
        return f"not measured, may or may not change the bits; to be sure: {self.fix}"


def _onednn_isa(m: Mapping[str, Any]) -> str | None:
    """The oneDNN instruction set in force: the cap of the environment, or the best the CPU has."""
    env = m.get("env") or {}
    cap = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA")
    flags = m.get("cpu_flags")
    best = None
    if isinstance(flags, list):
        best = "AVX512_CORE" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE41"
    if cap is None:
        return best
    cap = str(cap).upper()
    if best is not None and cap in _ONEDNN_ORDER and _ONEDNN_ORDER.index(cap) > _ONEDNN_ORDER.index(best):
        return best
    return cap


_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]{0,40}$")


def _install(package: str, version: Any) -> str:
    """The fix for another version of ``package``: the recorded version when it reads as one, never other text
    of the record (a fix is something to type)."""
    if isinstance(version, str) and _VERSION.match(version):
        return f"install {package}=={version}"
    return f"install the {package} version the record names"


def _threads_fix(threads: Any) -> str:
    if isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= 4096:
        return f"intra_op_threads: {threads} in the profile (portable pins the threads)"
    return "the record's thread count is not one a machine runs with: no setting reproduces it"


def _lacks_avx2(m: Mapping[str, Any]) -> bool:
    flags = m.get("cpu_flags")
    return isinstance(flags, list) and bool(flags) and "avx2" not in flags


def _isa_fix(a: Mapping[str, Any], b: Mapping[str, Any], va: Any, vb: Any) -> str:
    """The branch both runs must pin to agree: the plainer of the two, which both CPUs can run."""
    plain = "DEFAULT" in (va, vb) or "SSE41" in (va, vb) or _lacks_avx2(a) or _lacks_avx2(b)
    if not plain:
        return (
            "cpu_isa: avx2 in the profile of both runs (portable has it), "
            "or ATEN_CPU_CAPABILITY=avx2 before torch starts"
        )
    lacking = " (a CPU without AVX2 cannot run the AVX2 branch: no setting reproduces an AVX2 run on it)"
    return (
        "cpu_isa: default in a profile of your own for both runs (portable pins avx2), or ATEN_CPU_CAPABILITY=default "
        f"ONEDNN_MAX_CPU_ISA=SSE41 before torch starts{lacking if _lacks_avx2(a) or _lacks_avx2(b) else ''}"
    )


def machine_causes(a: Mapping[str, Any], b: Mapping[str, Any], *, cuda: bool) -> tuple[list[MachineCause], list[str]]:
    """Every machine difference between fingerprints ``a`` and ``b`` that changes the bits, and notes.

    Args:
        a, b: Fingerprints (:func:`machine_fingerprint`, or :func:`machine_view` of a record's environment).
        cuda: Whether the run trains on CUDA (then the GPU decides; else the CPU does).

    Returns:
        The causes, each with the setting that fixes it and whether it is known to change the bits
        (:attr:`MachineCause.measured`), and one note per value a fingerprint does not hold.
    """
    causes: list[MachineCause] = []
    notes: list[str] = []

    def check(name: str, va: Any, vb: Any, fix: str, *, measured: bool = True) -> None:
        if va is None or vb is None:
            if va != vb:
                notes.append(f"{name}: not recorded on one side, not compared")
            return
        if va != vb:
            causes.append(MachineCause(name, va, vb, fix, measured))

    def version(name: str, va: Any, vb: Any, fix: str) -> None:  # a release nobody has measured against the other
        check(name, va, vb, fix, measured=False)

    version("torch", a.get("torch"), b.get("torch"), _install("torch", a.get("torch")))
    if a.get("ultralytics") or b.get("ultralytics"):  # a YOLOv5 run has none on either side
        ua, ub = a.get("ultralytics"), b.get("ultralytics")
        version("Ultralytics", ua, ub, _install("ultralytics", ua))
    if cuda:
        ga, gb = a.get("gpu") or {}, b.get("gpu") or {}
        if not ga or not gb:
            notes.append("GPU: not recorded on one side, not compared")
        for key, fix, measured in (
            ("name", "train on the same GPU model", True),
            ("sm_count", "train on a GPU with the same SM count (cuBLAS and CUDA RNG depend on it)", True),
            ("cuda", "install the torch build with the same CUDA", False),
            ("cudnn", "install the same cuDNN", False),
            ("driver", "install the same driver", False),
            ("matmul_fp32_precision", "allow_tf32 as in the record", True),
            ("matmul_allow_tf32", "allow_tf32 as in the record", True),
            ("cudnn_allow_tf32", "allow_tf32 as in the record", True),
        ):
            if ga and gb:
                check(f"GPU {key}", ga.get(key), gb.get(key), fix, measured=measured)
        return causes, notes
    check("CPU architecture", a.get("arch"), b.get("arch"), "none: train on the same architecture")
    check(
        "intra-op threads",
        a.get("intra_op_threads"),
        b.get("intra_op_threads"),
        _threads_fix(a.get("intra_op_threads")),
    )
    ca, cb = a.get("cpu_capability"), b.get("cpu_capability")
    check("ATen CPU capability", ca, cb, _isa_fix(a, b, ca, cb))
    mkldnn = a.get("mkldnn_enabled") is not False and b.get("mkldnn_enabled") is not False
    check("mkldnn enabled", a.get("mkldnn_enabled"), b.get("mkldnn_enabled"), "torch.backends.mkldnn as in the record")
    if mkldnn and "env" in a and "env" in b and ("cpu_flags" in a or "cpu_flags" in b):
        ia, ib = _onednn_isa(a), _onednn_isa(b)
        check("oneDNN instruction set", ia, ib, _isa_fix(a, b, ia, ib))
        version("oneDNN version", a.get("onednn"), b.get("onednn"), f"{_install('torch', a.get('torch'))} (its oneDNN)")
    ea, eb = a.get("env") or {}, b.get("env") or {}
    if "cpu_flags" in a and "cpu_flags" in b:
        wa, wb = ea.get("MKL_CBWR"), eb.get("MKL_CBWR")
        if wa != wb:
            causes.append(MachineCause("MKL_CBWR", wa, wb, "MKL_CBWR=COMPATIBLE before torch starts (portable)"))
        elif wa is None and (a.get("cpu_vendor"), a.get("cpu_flags")) != (b.get("cpu_vendor"), b.get("cpu_flags")):
            causes.append(
                MachineCause(
                    "MKL code path (CPU vendor and instruction set, MKL_CBWR unset)",
                    f"{a.get('cpu_vendor')} {_onednn_isa(a)}",
                    f"{b.get('cpu_vendor')} {_onednn_isa(b)}",
                    "MKL_CBWR=COMPATIBLE before torch starts (portable)",
                )
            )
        version("MKL version", a.get("mkl"), b.get("mkl"), f"{_install('torch', a.get('torch'))} (its MKL)")
    return causes, notes
