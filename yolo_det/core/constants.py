"""Constants shared across the package, each with one home: environment variables, the process rank, the alert text."""

from __future__ import annotations

import os

__all__ = [
    "ALERT",
    "DEFAULT_BENCH_PROFILES",
    "DEFAULT_KEEP_MIB",
    "RECORDED_ENV",
    "TRACKED_ENV",
    "env_int",
    "global_rank",
    "world_size",
]

#: ``verify --keep-mib``: memory for the gradient values of run 1's first steps (here, so --help starts light).
DEFAULT_KEEP_MIB = 64
#: ``bench --profiles``: the profiles compared when none are named.
DEFAULT_BENCH_PROFILES: tuple[str, ...] = ("repro", "balanced", "fast")

#: Environment variables that decide determinism; always part of a state snapshot.
TRACKED_ENV: tuple[str, ...] = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "NCCL_ALGO",
    "NCCL_PROTO",
)

#: Environment variables written into ``determinism.json`` (the tracked ones and what else shapes a run).
RECORDED_ENV: tuple[str, ...] = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TORCH_DETERMINISTIC",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
)

#: What PyTorch says when strict determinism meets a kernel without a deterministic implementation
#: (``"<kernel>" + ALERT + ", but you set ..."``).
ALERT = " does not have a deterministic implementation"


def env_int(name: str, default: int) -> int:
    """The integer environment variable ``name``, or ``default`` when unset, empty or not an integer."""
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def global_rank(default: int = -1) -> int:
    """This process's global rank (``RANK``, set by torchrun and the frameworks' DDP launchers), or ``default``."""
    return env_int("RANK", default)


def world_size() -> int:
    """The number of processes in the run (``WORLD_SIZE``, at least 1)."""
    return max(env_int("WORLD_SIZE", 1), 1)
