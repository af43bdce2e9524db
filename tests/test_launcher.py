"""Where a process sits in an outside launcher's job, from the launcher's environment (torchrun's, SLURM's)."""

from __future__ import annotations

import pytest

from yolo_det.core.errors import ConfigError
from yolo_det.core.launcher import Launch, export_slurm_env, launch_from_env


def test_a_process_started_alone_is_no_rank() -> None:
    assert launch_from_env({}) is None
    assert launch_from_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) is None
    assert launch_from_env({"WORLD_SIZE": "4", "RANK": "1"}) is None  # no LOCAL_RANK: not started by a launcher


def test_torchrun_variables_give_rank_node_and_local_rank() -> None:
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert launch_from_env(env) == Launch(3, 4, 1, 2, 1, "torchrun")
    del env["GROUP_RANK"]
    assert launch_from_env(env) == Launch(3, 4, 1, 2, 1, "torchrun")  # node from rank // local world size


def test_contradicting_variables_are_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="RANK"):
        launch_from_env({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
    with pytest.raises(ConfigError, match="not an integer"):
        launch_from_env({"WORLD_SIZE": "two", "RANK": "0", "LOCAL_RANK": "0"})


def test_slurm_tasks_are_copied_under_torchruns_names() -> None:
    env = {
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "2(x2)",
        "MASTER_ADDR": "node-a",
        "MASTER_PORT": "29500",
    }
    assert export_slurm_env(env)
    assert launch_from_env(env) == Launch(2, 4, 0, 2, 1, "slurm")
    assert not export_slurm_env(env)  # RANK set now: copied once, and torchrun's own variables win


def test_slurm_without_a_rendezvous_address_is_refused_and_one_task_ignored() -> None:
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}
    with pytest.raises(ConfigError, match="MASTER_ADDR and MASTER_PORT"):
        export_slurm_env(env)
    assert "RANK" not in env
    single = {"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}
    assert not export_slurm_env(single)
    assert single == {"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}
    batch_script = {"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}  # the job script itself, not an srun step
    assert not export_slurm_env(batch_script)
    assert "RANK" not in batch_script
