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
