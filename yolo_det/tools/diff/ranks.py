"""The ranks of two runs: how many trained, and how they sat on the machines (nodes x ranks per node)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .common import _Collector, _get, _sharded

__all__ = ["_ranks"]


def _layout(record: Mapping[str, Any]) -> str | None:
    """``"2 node(s): 1+1 rank(s)"`` from the record's ranks (None when they hold no places)."""
    ranks = record.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return None
    per_node: dict[Any, int] = {}
    for entry in ranks:
        place = entry.get("place") if isinstance(entry, Mapping) else None
        if not isinstance(place, Mapping):
            return None
        per_node[place.get("node")] = per_node.get(place.get("node"), 0) + 1
    counts = [per_node[n] for n in sorted(per_node, key=lambda n: (n is None, n if n is not None else 0))]
    return f"{len(counts)} node(s): {'+'.join(map(str, counts))} rank(s)"


def _world(record: Mapping[str, Any]) -> Any:
    ranks = record.get("ranks")
    if isinstance(ranks, list) and ranks:
        return len(ranks)
    return _get(record, "seeds", "world_size")


def _ranks(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    shards = _sharded(ra, rb)
    world_differs = c.add(
        "ranks",
        "world size",
        _world(ra),
        _world(rb),
        changes_bits=shards is None,
        note=f"no effect: both runs train shards: {shards} (each shard computed alone, summed in shard order)"
        if shards
        else "each rank takes batch / world size images and its own BatchNorm statistics; the gradients are summed "
        "over another number of ranks (shards: K in the profile gives the same weights on any divisor of K)",
    )
    la, lb = _layout(ra), _layout(rb)
    if la is None or lb is None or shards:
        return
    cuda = any(str(_get(r, "run", "device") or "").replace("cpu", "") for r in (ra, rb))
    c.add(
        "ranks",
        "node layout",
        la,
        lb,
        changes_bits=cuda and not world_differs,
        note=(
            "follows from the world size"
            if world_differs
            else "NCCL may pick another reduction order for another topology (pin NCCL_ALGO/NCCL_PROTO)"
            if cuda
            else "no effect with gloo on CPUs: the same ranks reduce in the same order"
        ),
    )
