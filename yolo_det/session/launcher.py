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
    "gather_at_rank0",
    "join_process_group",
    "leave_process_group",
    "max_over_ranks",
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


def _meeting(store: Any, launch: Launch, deadline: float) -> str:
    """The key prefix this start of the job meets under in a store that outlives its starts (torchrun's agent store).

    Such a store can still hold the keys the workers of an earlier start left (their addresses under the default
    group's keys); a per-node counter such as ``TORCHELASTIC_RESTART_COUNT`` does not tell the starts apart (a node
    whose workers were restarted for another node's failure keeps its count). Rank 0 takes a new number from the
    store (``add``: never handed out twice); every other rank leaves a fresh random token and receives the number
    under it, then confirms it. Rank 0 answers each token it finds until every rank confirmed, so a token an earlier
    start left costs nothing. Every wait ends by ``deadline`` (``time.monotonic()``).
    """
    import secrets
    import time

    base = "/yolo-det/meeting"
    if launch.world_size <= 1:
        return f"{base}/start_{int(store.add(f'{base}/starts', 1))}/"
    if launch.rank != 0:
        token = secrets.token_hex(16)
        store.set(f"{base}/hello/{launch.rank}", token)
        store.wait([f"{base}/welcome/{token}"], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
        start = int(store.get(f"{base}/welcome/{token}"))
        store.set(f"{base}/confirmed/{start}/{launch.rank}", token)
        return f"{base}/start_{start}/"
    start = int(store.add(f"{base}/starts", 1))
    answered: dict[int, bytes] = {}
    waiting = set(range(1, launch.world_size))
    while waiting:
        for rank in sorted(waiting):
            if store.check([f"{base}/confirmed/{start}/{rank}"]):
                waiting.discard(rank)
            elif store.check([f"{base}/hello/{rank}"]):
                token = store.get(f"{base}/hello/{rank}")
                if answered.get(rank) != token:
                    store.set(f"{base}/welcome/{token.decode()}", str(start))
                    answered[rank] = token
        if not waiting:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"ranks {sorted(waiting)} did not confirm")
        try:  # wakes as soon as the first waiting rank confirms; re-reads the tokens at least every second
            store.wait([f"{base}/confirmed/{start}/{min(waiting)}"], timedelta(seconds=min(left, 1.0)))
        except RuntimeError:
            continue
    return f"{base}/start_{start}/"


def _rendezvous(launch: Launch) -> Any:
    """The job's store, reached within :func:`rendezvous_timeout` (every rank there), then given :data:`TIMEOUT`.

    A store the launcher created for this start (a new port each start, no ``TORCHELASTIC_USE_AGENT_STORE``) is
    met as ``init_method="env://"`` does. torchrun's agent store outlives the starts of a job: the ranks meet
    under a prefix all of them agree on (:func:`_meeting`), whatever each node's restart count says.

    Raises:
        ConfigError: The rendezvous was not reached in time (one line naming the address and the time).
    """
    import time

    wait = rendezvous_timeout()
    deadline = time.monotonic() + wait.total_seconds()
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    try:
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.world_size, timeout=wait))
        else:
            agent = dist.TCPStore(
                host_name=addr, port=int(port), world_size=launch.world_size, is_master=False, timeout=wait
            )
            store = dist.PrefixStore(_meeting(agent, launch, deadline), agent)
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
    store = _rendezvous(launch)
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


def max_over_ranks(value: int) -> int:
    """The largest of every rank's ``value`` (a collective: every rank calls it); ``value`` without a group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    box = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return int(box.item())


def gather_at_rank0(value: Any) -> list[Any] | None:
    """Every rank's ``value`` in rank order on rank 0, None on the others (a collective: every rank calls it);
    ``[value]`` without a group. Rank 0 unpickles what the ranks send: the ranks of a job trust each other
    (docs/security.md)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, out, dst=0)
    return out
