"""Rank problems only where ranks must agree; SIGTERM passed on to a distributed launcher (no training)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from yolo_det.core.signals import Terminated
from yolo_det.session.distributed import PER_RANK_ENV, launcher_children, ranks_consistent, terminate_via_launcher


def _state(rank: int, **env: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "profile": "repro",
        "phases": ["train"],
        "state": {
            "deterministic_algorithms": "strict",
            "cudnn_benchmark": False,
            "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": str(1 + rank), **env},
        },
        "seeds": {"sampler_seed": 0, "rng_seed": 1 + rank},
    }


def test_per_rank_hash_seed_is_not_a_rank_problem() -> None:
    assert "PYTHONHASHSEED" in PER_RANK_ENV
    assert ranks_consistent([_state(0), _state(1)]) == []


def test_a_rank_with_other_env_or_flags_is_named_once() -> None:
    other = _state(1, CUBLAS_WORKSPACE_CONFIG=None)
    assert ranks_consistent([_state(0), other]) == ["rank 1 differs from rank 0 in env CUBLAS_WORKSPACE_CONFIG"]
    flags = _state(1)
    flags["state"]["cudnn_benchmark"] = True
    assert ranks_consistent([_state(0), flags]) == ["rank 1 differs from rank 0 in cudnn_benchmark"]
    same_seed = _state(1)
    same_seed["seeds"]["rng_seed"] = 1
    assert ranks_consistent([_state(0), same_seed]) == ["ranks share RNG seeds: [1, 1]"]


_LAUNCHER = """
import signal, sys, time
def stop(signum, frame):
    print("stopped", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def _start_launcher() -> subprocess.Popen[str]:
    # argv names torch.distributed.run as a launcher's does ("python -m torch.distributed.run ...")
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, "torch.distributed.run"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigterm_goes_to_the_launcher_and_ends_as_terminated() -> None:
    before = signal.getsignal(signal.SIGTERM)
    proc = _start_launcher()
    try:
        assert launcher_children() == [proc.pid]
        with pytest.raises(Terminated) as info, terminate_via_launcher():
            os.kill(os.getpid(), signal.SIGTERM)  # handled here: passed on, the waiting goes on
            out, _ = proc.communicate(timeout=60)
            if proc.returncode:
                raise subprocess.CalledProcessError(proc.returncode, "launcher")
        assert out.strip() == "stopped"
        assert proc.returncode == 3
        assert isinstance(info.value.__cause__, subprocess.CalledProcessError)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_without_a_launcher_goes_to_the_previous_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with terminate_via_launcher():
            os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
        assert launcher_children() == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def _placed(rank: int, node: int, host: str, *, threads: int = 1, ultralytics: str = "8.4.190") -> dict[str, Any]:
    state = _state(rank)
    state["place"] = {
        "node": node,
        "host": host,
        "local_rank": 0,
        "device": "cpu",
        "versions": {"python": "3.11.7", "torch": "2.14.1", "ultralytics": ultralytics},
        "machine": {"arch": "x86_64", "intra_op_threads": threads, "cpu_capability": "AVX2", "torch": "2.14.1"},
    }
    return state


def test_ranks_on_other_hosts_agree_unless_a_version_or_a_bit_deciding_setting_differs() -> None:
    assert ranks_consistent([_placed(0, 0, "node-a"), _placed(1, 1, "node-b")]) == []  # host, node: by design
    threads = ranks_consistent([_placed(0, 0, "node-a"), _placed(1, 1, "node-b", threads=4)])
    assert threads == ["rank 1 on host node-b (node 1) differs from rank 0 in intra-op threads 4 (rank 0: 1)"]
    version = ranks_consistent([_placed(0, 0, "node-a"), _placed(1, 1, "node-b", ultralytics="8.4.100")])
    assert version == ["rank 1 on host node-b (node 1) differs from rank 0 in ultralytics 8.4.100 (rank 0: 8.4.190)"]


def test_diff_explains_another_world_size_and_another_node_layout() -> None:
    from yolo_det.tools.diff import diff_records

    def record(*nodes: int) -> dict[str, Any]:
        ranks = [_placed(r, n, f"node-{n}") for r, n in enumerate(nodes)]
        return {"ranks": ranks, "seeds": {"seed": 0, "world_size": len(nodes)}, "run": {"device": "cpu"}}

    same = diff_records(record(0, 1), record(0, 1))
    assert [d.name for d in same.differences] == []
    layout = diff_records(record(0, 1), record(0, 0))  # 2 nodes x 1 rank against 1 node x 2 ranks
    (d,) = [d for d in layout.differences if d.group == "ranks"]
    assert (d.name, d.a, d.b, d.changes_bits) == (
        "node layout",
        "2 node(s): 1+1 rank(s)",
        "1 node(s): 2 rank(s)",
        False,
    )
    world = diff_records(record(0, 1), record(0, 1, 1, 1))
    names = {d.name: d for d in world.differences if d.group == "ranks"}
    assert (names["world size"].a, names["world size"].b, names["world size"].changes_bits) == (2, 4, True)
    assert not names["node layout"].changes_bits


def test_diff_says_another_world_size_changes_nothing_when_both_runs_train_the_same_shards() -> None:
    from yolo_det.tools.diff import diff_records

    def record(shards: int | None, *nodes: int) -> dict[str, Any]:
        ranks = [_placed(r, n, f"node-{n}") for r, n in enumerate(nodes)]
        return {
            "ranks": ranks,
            "seeds": {"seed": 0, "world_size": len(nodes), "rank_rng_seeds": [1 + r for r in range(len(nodes))]},
            "run": {"device": "cpu"},
            "profile": {"name": "s", "train": {"shards": shards}},
            "environment": {"env": {"RANK": None if len(nodes) == 1 else "0", "PYTHONHASHSEED": str(len(nodes))}},
        }

    sharded = diff_records(record(4, 0), record(4, 0, 0, 1, 1))
    bits = [d for d in sharded.differences if d.changes_bits]
    assert bits == []  # the world size, the rank seeds, the launcher's variables: none changes the weights
    names = {d.name: d for d in sharded.differences}
    assert (names["world size"].a, names["world size"].b) == (1, 4)
    assert "shards: 4" in str(names["world size"].note)
    other = diff_records(record(4, 0), record(2, 0, 0, 1, 1))  # control: other shards, or none, change them
    assert {d.name for d in other.differences if d.changes_bits} >= {"world size", "train.shards"}
    plain = diff_records(record(None, 0), record(None, 0, 0, 1, 1))
    assert "world size" in {d.name for d in plain.differences if d.changes_bits}
