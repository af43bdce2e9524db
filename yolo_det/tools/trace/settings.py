"""The process settings that can change the bits of an op, as an op trace records them (plain data)."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

__all__ = ["ENV_KEYS", "op_settings"]

#: Environment variables read by the kernels' libraries (instruction set, thread pools, cuBLAS).
ENV_KEYS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_NUM_THREADS",
    "OMP_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()[:200]
    except OSError:
        pass
    return platform.processor()[:200] or platform.machine()


def op_settings(device: torch.device | None = None) -> dict[str, Any]:
    """What decides which kernel runs and how it sums: versions, threads, instruction set, cuDNN and TF32 flags."""
    cuda = torch.cuda.is_available() and device is not None and device.type == "cuda"
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "device": str(device) if device is not None else "cpu",
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cuda": torch.version.cuda or "",
        "cudnn": str(torch.backends.cudnn.version() or "") if cuda else "",
        "gpu": torch.cuda.get_device_name(device) if cuda else "",
    }
    for key in ENV_KEYS:
        out[f"env:{key}"] = os.environ.get(key, "")
    return out
