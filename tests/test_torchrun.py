"""torchrun as the launcher: one data-parallel job over every rank of every node, on the CPU with gloo.

Two torchrun agents on localhost (``--nnodes 2 --node_rank 0/1``, one rank each) stand in for two machines; one
agent with two ranks is one machine with two devices. Both train the same job, so the weights are bitwise equal; the
job's weights one epoch before its end, from its record of each epoch's checkpoint, differ (the control). The
one-node job runs a user script calling ``yolo_det.trainer_class`` and ``model.train()``, the two-node job
``python -m yolo_det train``: both routes join the launcher's process group. A job whose rank 1 is SIGKILLed after
epoch 1's checkpoint and restarted by torchrun (``--max-restarts 1``) resumes by itself and ends on the uninterrupted
weights, and so does a two-node job (c10d rendezvous) whose rank 1 is SIGKILLed while rank 0 gathers the ranks'
resume states of the last epoch. Jobs are shared by the tests that need them (module-scoped fixtures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torchrun_jobs import digest, job, one_epoch_fewer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("torchrun")


@pytest.fixture(scope="module")
def one_node(tmp: Path) -> dict[str, Any]:
    """1 node x 2 ranks, a user script with the trainer class."""
    return job(tmp, "one-node", nnodes=1, nproc=2, script=True)


@pytest.fixture(scope="module")
def two_nodes(tmp: Path) -> dict[str, Any]:
    """2 nodes x 1 rank, the command line."""
    return job(tmp, "two-nodes", nnodes=2, nproc=1)


@pytest.fixture(scope="module")
def restarted(tmp: Path) -> dict[str, Any]:
    """1 node x 2 ranks, the command line; rank 1 SIGKILLed at its first start once epoch 1 is checkpointed, and
    torchrun (--max-restarts 1) starts both workers again with the same command line."""
    return job(
        tmp,
        "restarted",
        nnodes=1,
        nproc=2,
        torchrun_args=("--max-restarts", "1"),
        env={"YOLO_DET_TEST_SIGNAL_AT": "fit-epoch-end:SIGKILL", "YOLO_DET_TEST_SIGNAL_RANK": "1"},
    )


@pytest.fixture(scope="module")
def killed_while_gathering(tmp: Path) -> dict[str, Any]:
    """2 nodes x 1 rank through the c10d rendezvous, the command line; rank 1 SIGKILLed at its first start when it
    reaches the gather of epoch index 1 (rank 0 waits in it, epoch 0 is checkpointed), and torchrun
    (--max-restarts 1) starts the workers again."""
    return job(
        tmp,
        "killed-gathering",
        nnodes=2,
        nproc=1,
        c10d=True,
        torchrun_args=("--max-restarts", "1"),
        env={"YOLO_DET_TEST_SIGNAL_AT": "states-gathering@2:SIGKILL", "YOLO_DET_TEST_SIGNAL_RANK": "1"},
    )


def test_two_nodes_of_one_rank_equal_one_node_of_two_ranks(one_node: dict[str, Any], two_nodes: dict[str, Any]) -> None:
    assert one_node["codes"] == [0], one_node["output"][-4000:]
    assert two_nodes["codes"] == [0, 0], two_nodes["output"][-4000:]
    assert digest(one_node) == digest(two_nodes)
    for result in (one_node, two_nodes):
        record = result["record"]
        assert [r["rank"] for r in record["ranks"]] == [0, 1]  # one job of two ranks, not two jobs of one
        assert {r["world_size"] for r in record["ranks"]} == {2}
        assert record["rank_problems"] == []


def test_rank_zero_records_every_rank_and_where_it_ran(one_node: dict[str, Any], two_nodes: dict[str, Any]) -> None:
    import socket

    for result, nodes, local in ((one_node, [0, 0], [0, 1]), (two_nodes, [0, 1], [0, 0])):
        places = [r["place"] for r in result["record"]["ranks"]]
        assert [p["node"] for p in places] == nodes
        assert [p["local_rank"] for p in places] == local
        assert {p["host"] for p in places} == {socket.gethostname()}
        assert {p["device"] for p in places} == {"cpu"}
        assert {p["launcher"] for p in places} == {"torchrun"}
        launch = result["record"]["launch"]  # the job as the launcher describes it, rank 0's view
        assert (launch["world_size"], launch["rank"], launch["restart_count"]) == (2, 0, 0)
        assert all(p["versions"]["torch"] and p["machine"]["cpu_capability"] for p in places)


def test_one_epoch_fewer_gives_other_weights(one_node: dict[str, Any], two_nodes: dict[str, Any]) -> None:
    """The weights after epoch 1 (one epoch fewer of the job) are not the final ones, and are one in both jobs."""
    assert one_epoch_fewer(two_nodes) == one_epoch_fewer(one_node)


def test_only_rank_zero_writes_the_run_folder(two_nodes: dict[str, Any]) -> None:
    save_dir = two_nodes["save_dir"]
    assert list(save_dir.rglob("determinism.json")) == [save_dir / "determinism.json"]
    assert not [p for p in save_dir.parent.iterdir() if p.name.startswith("two-nodes") and p != save_dir]
    assert "Default process group has not been initialized" not in two_nodes["output"]


def test_a_worker_killed_after_a_checkpoint_is_restarted_and_ends_on_the_uninterrupted_weights(
    one_node: dict[str, Any], restarted: dict[str, Any]
) -> None:
    assert restarted["codes"] == [0], restarted["output"][-4000:]
    assert "resuming from" in restarted["output"]
    record = restarted["record"]
    assert record["resume"]["state_found"], record["resume"]
    assert record["resume"]["bitwise_expected"], record["resume"]
    assert digest(restarted) == digest(one_node)
    assert record["launch"]["restart_count"] == 1
    (before,) = record["segments"]  # the first start, up to the kill
    assert before["launch"]["restart_count"] == 0
    assert before["status"] in {"terminated", "killed", "failed"}
    assert before["epochs_completed"] == 1


def test_a_worker_killed_while_rank_zero_gathers_the_states_ends_on_the_uninterrupted_weights(
    two_nodes: dict[str, Any], killed_while_gathering: dict[str, Any]
) -> None:
    result = killed_while_gathering
    assert result["codes"] == [0, 0], result["output"][-4000:]
    assert "resuming from" in result["output"]
    record = result["record"]
    assert record["resume"]["state_found"], record["resume"]
    assert record["resume"]["bitwise_expected"], record["resume"]
    assert record["resume"]["epoch"] == 1  # resumed from epoch 0's checkpoint: epoch 1 was never checkpointed
    assert digest(result) == digest(two_nodes)
    # control: the epoch it trained again changed the weights it resumed from
    assert result["record"]["weights"]["sha256"] != one_epoch_fewer(two_nodes)
    (before,) = record["segments"]
    assert before["epochs_completed"] == 1
    assert "no resume state" not in result["output"]


def test_a_resume_by_hand_without_one_ranks_state_is_recorded_as_not_bitwise(tmp: Path) -> None:
    """Every rank looks up its own state; rank 0's record says bitwise only when all found theirs, and says which
    did not (one line at the start, from rank 0)."""
    stopped = job(tmp, "by-hand", nnodes=2, nproc=1, env={"YOLO_DET_TEST_SIGNAL_AT": "fit-epoch-end:SIGINT"})
    assert stopped["codes"] != [0, 0], stopped["output"][-4000:]  # both ranks stopped after epoch 0's checkpoint
    weights = stopped["save_dir"] / "weights"
    assert (weights / "yolo-det-resume.last.rank1.pt").is_file(), sorted(p.name for p in weights.iterdir())
    (weights / "yolo-det-resume.last.rank1.pt").unlink()  # rank 1's state lost (or never written)
    resumed = job(tmp, "by-hand", nnodes=2, nproc=1, args=[f"resume={weights / 'last.pt'}"])
    assert resumed["codes"] == [0, 0], resumed["output"][-4000:]
    resume = resumed["record"]["resume"]
    assert resume["bitwise_expected"] is False
    assert resume["state_found"] is False
    assert resume["problem"].startswith("rank 1: ")
    assert any(r.startswith("no matching resume state (rank 1: ") for r in resume["reasons"]), resume["reasons"]
    assert resumed["output"].count("no resume state for") == 1  # rank 0's line, naming rank 1
