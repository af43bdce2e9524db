"""Distributed training: every rank gets the profile, its own seed, and a place in the run record.

Under ``torch.distributed`` each rank is its own process, so each must apply the profile, seed its RNGs
with its rank seed (:func:`yolo_det.core.seeding.rank_seed`), give its ``DistributedSampler`` the shared
data seed, and run backward through the toggle when the profile asks. The integrations do this on
every rank; :func:`rank_session` does it for a hand-written loop::

    session = yolo_det.session.distributed.rank_session("repro", seed=0)  # after init_process_group
    with session.run(), session.phase_scope("train"):
        yolo_det.seed_dataloader(loader, session.seed, rank=session.rank)
        ...
        ranks = yolo_det.session.distributed.gather_states(session)  # a collective: call on all ranks

:func:`gather_states` collects, on every rank, what each rank observed (flags, seeds, world size), so
rank 0 can write one record covering all ranks and check that no rank ran without the profile.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import torch.distributed as dist

from ..core.constants import global_rank, world_size
from ..core.profiles import Profile
from ..core.signals import Terminated
from ..core.state import snapshot
from .session import DeterminismSession

__all__ = [
    "LAUNCHER_MODULES",
    "PER_RANK_ENV",
    "gather_states",
    "launcher_children",
    "rank_info",
    "rank_place",
    "rank_session",
    "ranks_consistent",
    "terminate_via_launcher",
]

#: Environment variables whose value differs between ranks by design, never a rank problem:
#: ``PYTHONHASHSEED`` is set to the rank's RNG seed (``seed + 1 + rank``, Ultralytics' and YOLOv5's
#: ``init_seeds``); it only reaches processes the rank starts later, not the rank itself.
PER_RANK_ENV: tuple[str, ...] = ("PYTHONHASHSEED",)


def rank_info() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialized process group, else from ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return max(global_rank(0), 0), world_size()


def rank_session(profile: Profile | str, *, seed: int = 0) -> DeterminismSession:
    """A :class:`~yolo_det.session.session.DeterminismSession` for this rank (rank and world size filled in)."""
    rank, world_size = rank_info()
    return DeterminismSession(profile, seed=seed, rank=rank, world_size=world_size)


def rank_place(device: str | None = None) -> dict[str, Any]:
    """Where this rank runs: node, host, local rank, device, the library versions and the machine fingerprint
    (:func:`yolo_det.core.machine.machine_fingerprint`: threads, ISA, CPU, GPU)."""
    import platform
    import socket

    import numpy
    import torch

    from ..core.launcher import launch_from_env
    from ..core.machine import machine_fingerprint
    from ..core.record import _version

    try:
        launch = launch_from_env()
    except Exception:  # contradicting variables are reported where the job is joined
        launch = None
    return {
        "node": launch.node_rank if launch else 0,
        "host": socket.gethostname(),
        "local_rank": launch.local_rank if launch else max(global_rank(0), 0),
        "local_world_size": launch.local_world_size if launch else None,
        "launcher": launch.source if launch else None,
        "device": device,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "ultralytics": _version("ultralytics"),
            "yolo_det": _version("yolo-det"),
        },
        "machine": machine_fingerprint(),
    }


def local_state(session: DeterminismSession, device: str | None = None) -> dict[str, Any]:
    """What this rank observes now: rank, phases in force, flags, seeds and where it runs (:func:`rank_place`)."""
    return {
        "rank": session.rank,
        "world_size": session.world_size,
        "profile": session.profile.name,
        "phases": list(session.phases),
        "state": snapshot().to_dict(),
        "seeds": session.seeds(),
        "place": rank_place(device),
    }


def gather_states(session: DeterminismSession, device: str | None = None) -> list[dict[str, Any]]:
    """Every rank's :func:`local_state`, in rank order (a collective call when a process group is up)."""
    mine = local_state(session, device)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def _state_differences(ref: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The settings in which two ranks' states differ where ranks must agree (env variables by name)."""
    diff = [k for k in sorted(set(ref) | set(other)) if k != "env" and ref.get(k) != other.get(k)]
    env_ref, env_other = ref.get("env") or {}, other.get("env") or {}
    diff += [
        f"env {k}"
        for k in sorted(set(env_ref) | set(env_other))
        if k not in PER_RANK_ENV and env_ref.get(k) != env_other.get(k)
    ]
    return diff


def _place_problems(ref: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Where two ranks' places differ in what must agree: library versions, and the machine settings that change
    the bits (:func:`yolo_det.core.machine.machine_causes`); host, node, local rank and device index may differ."""
    from ..core.machine import machine_causes

    a, b = ref.get("place"), other.get("place")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return []
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    diff = [f"{k} {vb.get(k)} (rank 0: {va.get(k)})" for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]
    cuda = str(a.get("device") or "").startswith("cuda")
    causes, _ = machine_causes(a.get("machine") or {}, b.get("machine") or {}, cuda=cuda)
    diff += [f"{c.name} {c.b} (rank 0: {c.a})" for c in causes if c.name != "torch"]
    if not diff:
        return []
    return [
        f"rank {other['rank']} on host {b.get('host')} (node {b.get('node')}) differs from rank 0 in {'; '.join(diff)}"
    ]


def ranks_consistent(states: list[dict[str, Any]]) -> list[str]:
    """Problems with a gathered list: ranks under another profile or flags, or ranks sharing an RNG seed.

    Ranks must agree on the profile, the phases, the torch flags, the environment variables (except
    :data:`PER_RANK_ENV`), the sampler seed, the library versions and the machine settings that change the bits
    (threads, instruction set, GPU model, ...); their RNG seeds must all differ. Host, node, local rank and device
    index differ by design.

    Returns:
        One line per problem; empty when every rank ran the same profile with the same flags and its own seed.
    """
    problems: list[str] = []
    if not states:
        return ["no rank reported"]
    ref = states[0]
    for s in states[1:]:
        if s["profile"] != ref["profile"]:
            problems.append(f"rank {s['rank']} runs profile '{s['profile']}', rank 0 runs '{ref['profile']}'")
        if s["phases"] != ref["phases"]:
            problems.append(f"rank {s['rank']} is in phases {s['phases']}, rank 0 in {ref['phases']}")
        diff = _state_differences(ref["state"], s["state"])
        if diff:
            problems.append(f"rank {s['rank']} differs from rank 0 in {', '.join(diff)}")
        if s["seeds"]["sampler_seed"] != ref["seeds"]["sampler_seed"]:
            problems.append(
                f"rank {s['rank']} shuffles with seed {s['seeds']['sampler_seed']}, rank 0 with "
                f"{ref['seeds']['sampler_seed']}"
            )
        problems += _place_problems(ref, s)
    rng = [s["seeds"]["rng_seed"] for s in states]
    if len(set(rng)) != len(rng):
        problems.append(f"ranks share RNG seeds: {rng}")
    return problems


#: Modules whose ``python -m`` process is a distributed launcher (it starts and supervises the ranks).
LAUNCHER_MODULES: tuple[str, ...] = ("torch.distributed.run", "torch.distributed.launch")


def launcher_children(pid: int | None = None) -> list[int]:
    """The live child processes of ``pid`` (this process by default) that run a distributed launcher.

    Read from ``/proc`` (Linux); elsewhere the list is empty.
    """
    parent = os.getpid() if pid is None else pid
    found: list[int] = []
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return found
    for entry in entries:
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) != parent or fields[0] == "Z":
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if any(arg.decode(errors="replace") in LAUNCHER_MODULES for arg in argv):
            found.append(int(entry.name))
    return found


@contextmanager
def terminate_via_launcher() -> Iterator[None]:
    """Pass SIGTERM on to the distributed launcher this process started, and end like a terminated run.

    A process that launched its ranks through ``torch.distributed.run`` (Ultralytics' multi-GPU path) only
    waits for the launcher. Stopping it at once would kill the launcher and leave its ranks running without
    a parent; instead, while the block runs, SIGTERM is forwarded to the launcher, which stops its ranks
    with SIGTERM (each rank then ends its run and rank 0 writes the record) and exits. When the launch then
    fails, :class:`~yolo_det.core.signals.Terminated` is raised from that failure. A SIGTERM that arrives
    while no launcher runs goes to the handler that was in place before the block (it is restored after).
    Only in the main thread; elsewhere the block does nothing.
    """
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler installed outside Python: left alone
        yield
        return
    forwarded: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        launchers = launcher_children()
        if launchers:
            for pid in launchers:
                try:
                    os.kill(pid, signum)
                except OSError:
                    continue
            forwarded.append(signum)
            return
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Exception as error:
        if forwarded:
            raise Terminated(forwarded[0]) from error
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
