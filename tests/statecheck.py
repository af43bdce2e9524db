"""What "the process state is exactly as before" means in tests: one comparable snapshot of it all."""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from yolo_det.core.state import snapshot

_FUNCTIONAL = (
    "grid_sample",
    "interpolate",
    "upsample",
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices",
    "adaptive_avg_pool1d",
    "adaptive_max_pool1d",
    "pad",
    "cross_entropy",
    "nll_loss",
)
_ENV = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "CUDA_LAUNCH_BLOCKING",
    "YOLO_DET_DEBUG",
)


def global_state() -> dict[str, Any]:
    """Flags, env vars, warnings machinery, torch function/dispatch modes and patched torch functions."""
    try:
        import ultralytics.nn.tasks as tasks

        names = frozenset(k for k in vars(tasks) if not k.startswith("__"))
    except ImportError:  # pragma: no cover
        names = frozenset()
    return {
        "determinism": snapshot(_ENV),
        "env": {k: os.environ.get(k) for k in _ENV},
        "warning_filters": list(warnings.filters),
        "showwarning": warnings.showwarning,
        "function_modes": torch._C._len_torch_function_stack(),
        "dispatch_modes": len(torch.utils._python_dispatch._get_current_dispatch_mode_stack()),
        "functional": {name: getattr(F, name, None) for name in _FUNCTIONAL},
        "ultralytics_names": names,
    }


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Assert two :func:`global_state` snapshots are equal, naming what differs."""
    diff = [k for k in before if before[k] != after[k]]
    assert not diff, {k: (before[k], after[k]) for k in diff}
