"""Distributed training: every rank gets the profile, its own seed, and a place in the run record.

Under ``torch.distributed`` each rank is its own process, so each must apply the profile, seed its RNGs
with its rank seed (:func:`yolo_det.core.seeding.rank_seed`), give its ``DistributedSampler`` the shared
data seed, and run backward through the toggle when the profile asks. The integrations do this on
every rank; :func:`rank_session` does it for a hand-written loop::

    session = yolo_det.session.distributed.rank_session("repro", seed=0)     # after init_process_group
    with session.run(), session.phase_scope("train"):
        yolo_det.seed_dataloader(loader, session.seed, rank=session.rank)
        ...
        ranks = yolo_det.session.distributed.gather_states(session)        # a collective: call on all ranks

:func:`gather_states` collects, on every rank, what each rank observed (flags, seeds, world size), so
rank 0 can write one record covering all ranks and check that no rank ran without the profile.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..core.constants import global_rank, world_size
from ..core.profiles import Profile
from ..core.state import snapshot
from .session import DeterminismSession

__all__ = ["gather_states", "rank_info", "rank_session", "ranks_consistent"]


def rank_info() -> tuple[int, int]:
    """``(rank, world_size)`` from an initialized process group, else from ``RANK``/``WORLD_SIZE``, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return max(global_rank(0), 0), world_size()


def rank_session(profile: Profile | str, *, seed: int = 0) -> DeterminismSession:
    """A :class:`~yolo_det.session.session.DeterminismSession` for this rank (rank and world size filled in)."""
    rank, world_size = rank_info()
    return DeterminismSession(profile, seed=seed, rank=rank, world_size=world_size)


def local_state(session: DeterminismSession) -> dict[str, Any]:
    """What this rank observes now: rank, phases in force, flags and seeds."""
    return {
        "rank": session.rank,
        "world_size": session.world_size,
        "profile": session.profile.name,
        "phases": list(session.phases),
        "state": snapshot().to_dict(),
        "seeds": session.seeds(),
    }


def gather_states(session: DeterminismSession) -> list[dict[str, Any]]:
    """Every rank's :func:`local_state`, in rank order (a collective call when a process group is up)."""
    mine = local_state(session)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def ranks_consistent(states: list[dict[str, Any]]) -> list[str]:
    """Problems with a gathered list: ranks under another profile or flags, or ranks sharing an RNG seed.

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
        if s["state"] != ref["state"]:
            diff = sorted(k for k in s["state"] if s["state"][k] != ref["state"][k])
            problems.append(f"rank {s['rank']} differs from rank 0 in {', '.join(diff)}")
        if s["seeds"]["sampler_seed"] != ref["seeds"]["sampler_seed"]:
            problems.append(f"rank {s['rank']} shuffles with seed {s['seeds']['sampler_seed']}, rank 0 with "
                            f"{ref['seeds']['sampler_seed']}")
    rng = [s["seeds"]["rng_seed"] for s in states]
    if len(set(rng)) != len(rng):
        problems.append(f"ranks share RNG seeds: {rng}")
    return problems
