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


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WORLD_SIZE": "2", "RANK": "abc", "LOCAL_RANK": "0"}, "RANK='abc'"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "/etc/passwd"}, "LOCAL_RANK='/etc/passwd'"),
        ({"WORLD_SIZE": "9" * 5000, "RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE='9999"),
        ({"WORLD_SIZE": "1e9", "RANK": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE='1e9'"),
        ({"WORLD_SIZE": "2", "RANK": "-3", "LOCAL_RANK": "0"}, "RANK='-3'"),
        ({"RANK": "0\x1b[2J"}, "RANK='0\\x1b[2J'"),
        ({"MASTER_PORT": "abc"}, "MASTER_PORT=abc is not a port"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a port"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0", "MASTER_PORT": "29500"}, "MASTER_ADDR is not set"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0"}, "MASTER_ADDR and MASTER_PORT is not set"),
    ],
)
def test_bad_launcher_variables_are_one_line_before_anything_starts(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from yolo_det.cli import main
    from yolo_det.core.launcher import check_launcher_env

    with pytest.raises(ConfigError) as err:
        check_launcher_env(env)
    message = str(err.value)
    assert "\n" not in message
    assert len(message) < 400
    assert named.replace("'", "") in message.replace("'", "")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "epochs=1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("yolo-det: error: the launcher's") or "is not set" in lines[0]


def test_good_launcher_variables_pass() -> None:
    from yolo_det.core.launcher import check_launcher_env

    check_launcher_env({})
    check_launcher_env({"RANK": "-1", "LOCAL_RANK": "-1", "WORLD_SIZE": "1"})  # what some scripts export alone
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    check_launcher_env(env)
    check_launcher_env({**env, "SLURM_NTASKS_PER_NODE": "2(x2)"})


def test_slurm_variables_are_checked_before_they_are_copied() -> None:
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "x", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError, match="SLURM_PROCID='?x'? is not an integer"):
        export_slurm_env(env)
    assert "RANK" not in env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("addr", "launch"),
    [
        ("no-such-host.invalid", Launch(1, 2, 0, 1, 0, "torchrun")),  # an address that cannot be reached
        ("127.0.0.1", Launch(0, 1_000_000_000, 0, 1, 0, "torchrun")),  # ranks that never all come
    ],
)
def test_a_rendezvous_that_cannot_be_reached_fails_within_its_timeout(
    addr: str, launch: Launch, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    from yolo_det.session.launcher import join_process_group, leave_process_group

    monkeypatch.setenv("YOLO_DET_RENDEZVOUS_TIMEOUT", "1")
    monkeypatch.setenv("MASTER_ADDR", addr)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    with pytest.raises(ConfigError, match=r"could not join the job at .* within 1 s") as err:
        join_process_group(launch, "cpu")
    assert "\n" not in str(err.value)
    assert not dist.is_initialized()
    # control: a job whose ranks are all there joins, and leaves
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert join_process_group(Launch(0, 1, 0, 1, 0, "torchrun"), "cpu")
    assert dist.get_world_size() == 1
    leave_process_group(True)
    assert not dist.is_initialized()


#: One worker of a torchrun job: joins the job's group, prints whether the ranks agree this start is a restart.
_WORKER = """
from yolo_det.core.launcher import launch_from_env
from yolo_det.integrations.ultralytics.launcher import _restart_agreed
from yolo_det.session.launcher import join_process_group, leave_process_group

created = join_process_group(launch_from_env(), "cpu")
print("restart:", _restart_agreed(False), flush=True)
leave_process_group(created)
"""


def _start(port: int, counts: tuple[int, int]) -> list[tuple[int, str]]:
    """Start both workers of a two-node job on torchrun's agent store at ``port``, each node's restart count from
    ``counts``, as torchrun starts them; their exit codes and outputs."""
    import subprocess
    import sys

    from helpers import subprocess_env

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            env=subprocess_env(
                {
                    "WORLD_SIZE": "2",
                    "RANK": str(rank),
                    "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1",
                    "GROUP_RANK": str(rank),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "TORCHELASTIC_RUN_ID": "job",
                    "TORCHELASTIC_RESTART_COUNT": str(count),
                    "YOLO_DET_RENDEZVOUS_TIMEOUT": "60",
                    "OMP_NUM_THREADS": "1",
                }
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, count in enumerate(counts)
    ]
    try:
        return [(p.wait(timeout=180), p.communicate()[0]) for p in procs]
    finally:
        for p in procs:  # a worker that hangs is the failure; none outlives the test
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_workers_restarted_with_other_counts_on_each_node_meet_and_agree_it_is_a_restart() -> None:
    """torchrun's agent store outlives the starts of a job, and a node whose workers were restarted for another
    node's failure keeps its restart count (0): the workers meet under a prefix they agree on, not under their
    node's count, and every rank calls the start a restart."""
    from datetime import timedelta

    import torch.distributed as dist

    port = _free_port()
    store = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    first = _start(port, (0, 0))  # the first start leaves its keys (addresses, tokens) in the store
    assert [code for code, _ in first] == [0, 0], first
    assert all("restart: False" in out for _, out in first), first
    again = _start(port, (0, 1))  # rank 1's node failed, rank 0's was restarted for it
    assert [code for code, _ in again] == [0, 0], again
    assert all("restart: True" in out for _, out in again), again
    del store
