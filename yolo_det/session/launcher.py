"""The process group of a job an outside launcher started: join it, share one value from rank 0, leave it.

A process started by torchrun (or SLURM, see :mod:`yolo_det.core.launcher`) joins the group the launcher's
environment describes (``init_method="env://"``): gloo on the CPU, NCCL on CUDA devices. A group that already
exists (a user script that called ``init_process_group`` itself) is used as it is and never destroyed here.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..core.constants import env_int
from ..core.errors import ConfigError
from ..core.launcher import Launch

__all__ = ["broadcast_from_rank0", "join_process_group", "leave_process_group"]

#: How long a collective waits for the other ranks (Ultralytics' own launcher waits 3 hours).
TIMEOUT = timedelta(hours=3)


def join_process_group(launch: Launch, device_type: str) -> bool:
    """Join the job's process group (env://) unless one exists; True when this call created it.

    Raises:
        ConfigError: The group that exists has another world size or rank than the launcher's environment.
    """
    if dist.is_initialized():
        if dist.get_world_size() != launch.world_size or dist.get_rank() != launch.rank:
            raise ConfigError(
                f"the process group has rank {dist.get_rank()} of {dist.get_world_size()}, the launcher says rank "
                f"{launch.rank} of {launch.world_size}; initialize it with init_method='env://' or let yolo-det do it"
            )
        return False
    backend = "gloo" if device_type == "cpu" or not dist.is_nccl_available() else "nccl"
    restart = env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if restart <= 0:
        dist.init_process_group(
            backend=backend, init_method="env://", rank=launch.rank, world_size=launch.world_size, timeout=TIMEOUT
        )
        return True
    # Workers torchrun started again: the store can still hold the dead workers' addresses under the default
    # group's keys, so this start's group rendezvous under its own prefix.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=launch.world_size,
        is_master=launch.rank == 0 and not agent_store,
        timeout=TIMEOUT,
        multi_tenant=not agent_store,
    )
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"/yolo-det/start_{restart}", store),
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=TIMEOUT,
    )
    return True


def leave_process_group(created: bool) -> None:
    """Destroy the process group if :func:`join_process_group` created it (a user's own group stays)."""
    if created and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a collective: every rank calls it); ``value`` without a group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
