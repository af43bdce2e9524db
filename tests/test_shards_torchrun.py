"""``shards: 4``: one Ultralytics job gives one digest on 1 process (no launcher), 2 and 4 torchrun ranks (gloo,
device=cpu), and a run interrupted on 1 process resumes on 2 ranks bitwise.

The tiny run is tests/torchrun_jobs.py's (batch 4 = nbs: every optimizer step changes the weights); the control is
the job's weights one epoch before its end (its record's checkpoint after each epoch), which differ. Jobs are shared
by the tests that need them (module-scoped fixtures). A batch the shards do not divide is refused before anything is
built (tests/test_shards.py, through the same command line in process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torchrun_jobs import TINY, digest, job, one_epoch_fewer

from helpers import default_stop_signals, subprocess_env

pytestmark = pytest.mark.slow

PROFILE = "name: repro-shards4\nextends: repro\ntrain:\n  shards: 4\n"


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shards")
    (path / "shards4.yaml").write_text(PROFILE)
    return path


def _alone(tmp: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The job in one process, no launcher: ``python -m yolo_det train`` (``extra`` replaces the tiny run's keys)."""
    project = tmp / "runs"
    keys = {a.split("=", 1)[0] for a in extra}
    tiny = [a for a in TINY if a.split("=", 1)[0] not in keys]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "yolo_det",
            "train",
            "--profile",
            str(tmp / "shards4.yaml"),
            *tiny,
            f"project={project}",
            f"name={name}",
            "exist_ok=True",
            *extra,
        ],
        cwd=tmp,
        env=subprocess_env({"OMP_NUM_THREADS": "1", **(env or {})}),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=default_stop_signals,  # the stop signal of YOLO_DET_TEST_SIGNAL_AT, also from a background job
    )
    record_path = project / name / "determinism.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    return {
        "codes": [proc.returncode],
        "output": proc.stdout + proc.stderr,
        "save_dir": project / name,
        "record": record,
    }


@pytest.fixture(scope="module")
def one(tmp: Path) -> dict[str, Any]:
    return _alone(tmp, "one", "epochs=2")


@pytest.fixture(scope="module")
def two(tmp: Path) -> dict[str, Any]:
    return job(tmp, "two", nproc=2, profile=str(tmp / "shards4.yaml"))


@pytest.fixture(scope="module")
def four(tmp: Path) -> dict[str, Any]:
    return job(tmp, "four", nproc=4, profile=str(tmp / "shards4.yaml"))


def test_one_process_two_ranks_and_four_ranks_give_one_digest(
    one: dict[str, Any], two: dict[str, Any], four: dict[str, Any]
) -> None:
    for result in (one, two, four):
        assert result["codes"] == [0], result["output"][-4000:]
    assert digest(one) == digest(two) == digest(four)
    assert [r["rank"] for r in four["record"]["ranks"]] == [0, 1, 2, 3]
    assert four["record"]["rank_problems"] == []
    assert four["record"]["profile"]["train"]["shards"] == 4


def test_one_epoch_fewer_gives_other_weights(one: dict[str, Any], two: dict[str, Any], four: dict[str, Any]) -> None:
    """The weights after epoch 1 (one epoch fewer of the job) are not the final ones, and they too are one for 1, 2
    and 4 ranks."""
    assert one_epoch_fewer(one) == one_epoch_fewer(two) == one_epoch_fewer(four)


def test_a_run_stopped_on_one_process_resumes_on_two_ranks_bitwise(tmp: Path, one: dict[str, Any]) -> None:
    stopped = _alone(tmp, "resumed", "epochs=2", env={"YOLO_DET_TEST_SIGNAL_AT": "fit-epoch-end"})
    assert stopped["record"]["status"] == "interrupted", stopped["output"][-4000:]
    last = stopped["save_dir"] / "weights" / "last.pt"
    resumed = job(tmp, "resumed", nproc=2, profile=str(tmp / "shards4.yaml"), args=[f"resume={last}"])
    assert resumed["codes"] == [0], resumed["output"][-4000:]
    record = resumed["record"]
    assert record["resume"]["state_found"], record["resume"]
    assert record["resume"]["bitwise_expected"], record["resume"]
    assert record["launch"]["world_size"] == 2
    assert digest(resumed) == digest(one)


def test_a_machine_lost_mid_run_leaves_one_worker_that_resumes_and_ends_on_the_same_weights(
    tmp: Path, one: dict[str, Any]
) -> None:
    """Two torchrun agents (``--nnodes 1:2``, c10d rendezvous hosted by the first) as two machines; the second
    machine's worker kills its agent and itself once epoch 1 is checkpointed. torchrun starts the first machine's
    worker again, alone: it finds the run, resumes it and ends on the digest of the uninterrupted run."""
    from torchrun_jobs import free_port

    port, project = free_port(), tmp / "runs"
    run_args = [*TINY, "epochs=2", f"project={project}", "name=lost", "exist_ok=True"]

    def agent(node: int, env: dict[str, str]) -> subprocess.Popen[str]:
        host = "true" if node == 0 else "false"
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1:2",
                "--nproc_per_node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "lost-machine",
                "--max-restarts",
                "1",
                "--rdzv-conf",
                f"last_call_timeout=2,join_timeout=120,is_host={host}",
                "-m",
                "yolo_det",
                "train",
                "--profile",
                str(tmp / "shards4.yaml"),
                *run_args,
            ],
            cwd=tmp,
            env=subprocess_env({"OMP_NUM_THREADS": "1", **env}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = agent(0, {})
    second = agent(
        1,
        {
            # whichever rank the rendezvous gives this machine's worker (the order the agents join in decides):
            # only this agent's worker has the hook, and the machine never starts again
            "YOLO_DET_TEST_SIGNAL_AT": "fit-epoch-end:SIGKILL",
            "YOLO_DET_TEST_SIGNAL_AGENT": "1",
        },
    )
    try:
        out_second, _ = second.communicate(timeout=600)
        out_first, _ = first.communicate(timeout=600)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.returncode == -9, out_second[-3000:]  # the machine is gone
    assert first.returncode == 0, out_first[-4000:]
    assert "resuming from" in out_first
    record = json.loads((project / "lost" / "determinism.json").read_text())
    assert record["resume"]["state_found"], record["resume"]
    assert record["resume"]["bitwise_expected"], record["resume"]
    assert (record["launch"]["world_size"], record["launch"]["restart_count"]) == (1, 1)
    (before,) = record["segments"]
    assert before["launch"]["world_size"] == 2
    assert before["epochs_completed"] == 1
    assert digest({"record": record, "output": out_first}) == digest(one)
