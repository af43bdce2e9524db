"""The process group of a job an outside launcher started: join it, share one value from rank 0, leave it.

A process started by torchrun (or SLURM, see :mod:`yolo_det.core.launcher`) joins the group the launcher's
environment describes (``init_method="env://"``): gloo on the CPU, NCCL on CUDA devices. The rendezvous waits
at most :func:`rendezvous_timeout` (10 minutes by default); the collectives after it wait :data:`TIMEOUT`. A
group that already exists (a user script that called ``init_process_group`` itself) is used as it is and never
destroyed here.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..core.constants import env_int
from ..core.errors import ConfigError
from ..core.launcher import Launch
from ..core.text import printable

__all__ = [
    "RENDEZVOUS_TIMEOUT",
    "TIMEOUT",
    "broadcast_from_rank0",
    "join_process_group",
    "leave_process_group",
    "rendezvous_timeout",
]

#: How long a collective waits for the other ranks (Ultralytics' own launcher waits 3 hours).
TIMEOUT = timedelta(hours=3)
#: How long joining the job waits for its rendezvous (``MASTER_ADDR:MASTER_PORT`` reached, every rank there) by
#: default; ``YOLO_DET_RENDEZVOUS_TIMEOUT`` (seconds) changes it. An address that cannot be reached, or a world
#: size no job has, then fails in one line within that time, not after :data:`TIMEOUT`.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)


def rendezvous_timeout() -> timedelta:
    """How long joining the job waits for its rendezvous (:data:`RENDEZVOUS_TIMEOUT`, or the environment's)."""
    seconds = env_int("YOLO_DET_RENDEZVOUS_TIMEOUT", 0)
    return timedelta(seconds=seconds) if seconds > 0 else RENDEZVOUS_TIMEOUT


def _rendezvous(launch: Launch, restart: int) -> Any:
    """The job's store, reached within :func:`rendezvous_timeout` (every rank there), then given :data:`TIMEOUT`.

    The first start meets as ``init_method="env://"`` does; workers torchrun started again meet under a prefix of
    their own (the store can still hold the dead workers' addresses under the default group's keys).

    Raises:
        ConfigError: The rendezvous was not reached in time (one line naming the address and the time).
    """
    wait = rendezvous_timeout()
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    try:
        if restart <= 0:
            store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.world_size, timeout=wait))
        else:
            agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            store = dist.PrefixStore(
                f"/yolo-det/start_{restart}",
                dist.TCPStore(
                    host_name=addr,
                    port=int(port),
                    world_size=launch.world_size,
                    is_master=launch.rank == 0 and not agent_store,
                    timeout=wait,
                    multi_tenant=not agent_store,
                ),
            )
    except (RuntimeError, ValueError, OSError) as e:  # torch's DistNetworkError, DistStoreError, a refused port
        raise ConfigError(
            f"rank {launch.rank} of {launch.world_size} could not join the job at "
            f"{printable(addr, newlines=False)[:80]}:{port} within {int(wait.total_seconds())} s "
            f"({type(e).__name__}); check MASTER_ADDR, MASTER_PORT and WORLD_SIZE, and that every rank starts "
            "(YOLO_DET_RENDEZVOUS_TIMEOUT sets the wait in seconds)"
        ) from None
    store.set_timeout(TIMEOUT)
    return store


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
    store = _rendezvous(launch, env_int("TORCHELASTIC_RESTART_COUNT", 0))
    dist.init_process_group(
        backend=backend, store=store, rank=launch.rank, world_size=launch.world_size, timeout=TIMEOUT
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
