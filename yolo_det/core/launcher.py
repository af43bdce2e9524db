"""Where this process sits in a job started by an outside launcher (torchrun, SLURM's srun, a Kubernetes
PyTorchJob, Ray's TorchTrainer): read from the launcher's environment, nothing else.

torchrun and the launchers built on it export ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK`` (the node) and ``MASTER_ADDR``/``MASTER_PORT``. SLURM without torchrun exports
``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID`` and ``SLURM_NODEID``; :func:`export_slurm_env` copies them
under torchrun's names (before Ultralytics is imported: it reads ``RANK`` once, at import), so the rest of
yolo-det and Ultralytics see one convention.

:func:`check_launcher_env` checks every such variable before anything reads it (the command line calls it
first): each is a small integer in its range, ``MASTER_PORT`` a port, and a job of several processes names its
rendezvous (``MASTER_ADDR``, ``MASTER_PORT``); anything else is one line, exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import ConfigError
from .text import printable

__all__ = [
    "LAUNCHER_INTEGERS",
    "Launch",
    "check_launcher_env",
    "export_slurm_env",
    "launch_from_env",
    "launch_identity",
]

#: The launchers' integer variables yolo-det (or Ultralytics, at import) reads, with the least value each may
#: take (``-1``: Ultralytics' "no rank"). SLURM's ``2(x3)`` (2 tasks on each of 3 nodes) reads as 2.
LAUNCHER_INTEGERS: dict[str, int] = {
    "WORLD_SIZE": 1,
    "RANK": -1,
    "LOCAL_RANK": -1,
    "LOCAL_WORLD_SIZE": 1,
    "GROUP_RANK": 0,
    "TORCHELASTIC_RESTART_COUNT": 0,
    "SLURM_PROCID": 0,
    "SLURM_LOCALID": 0,
    "SLURM_NODEID": 0,
    "SLURM_STEP_NUM_TASKS": 1,
    "SLURM_NTASKS_PER_NODE": 1,
}
#: The most digits a launcher's integer may have (a job of a billion processes has 10).
_MAX_DIGITS = 10


@dataclass(frozen=True)
class Launch:
    """This process's place in a job of several processes.

    Attributes:
        rank: The global rank (0 .. world_size - 1).
        world_size: The number of processes in the job, all nodes together.
        local_rank: The rank on this node (which local device it takes).
        local_world_size: The number of processes on this node.
        node_rank: The node's index.
        source: ``torchrun`` (torchrun's variables) or ``slurm`` (copied from SLURM's).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for the record)."""
        return asdict(self)


def _shown(value: str) -> str:
    """A variable's value as an error shows it: escaped, cut to 40 characters."""
    text = printable(value, newlines=False)
    return text if len(text) <= 40 else text[:40] + "..."


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    text = value.strip().split("(")[0]  # SLURM writes "2(x3)" for 2 tasks on each of 3 nodes
    digits = text[1:] if text[:1] in "+-" else text
    least = LAUNCHER_INTEGERS.get(name, 0)
    if not (digits.isascii() and digits.isdigit()) or len(digits) > _MAX_DIGITS or int(text) < least:
        raise ConfigError(
            f"the launcher's {name}={_shown(value)} is not an integer >= {least} (at most {_MAX_DIGITS} digits); "
            "check how the job was started"
        )
    return int(text)


def check_launcher_env(environ: Mapping[str, str] | None = None) -> None:
    """Check the launchers' variables before anything reads them: each of :data:`LAUNCHER_INTEGERS` that is set is
    an integer in its range, ``MASTER_PORT`` a port, and a process of a job of several (``WORLD_SIZE`` > 1 with a
    ``LOCAL_RANK``, or SLURM's copied tasks) has its rendezvous address and port.

    Raises:
        ConfigError: One line naming the variable, what it holds (escaped, cut short) and what it must be.
    """
    env = os.environ if environ is None else environ
    for name in LAUNCHER_INTEGERS:
        _int(env, name)
    port = env.get("MASTER_PORT")
    if port is not None and port.strip() != "":
        text = port.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
            raise ConfigError(
                f"the launcher's MASTER_PORT={_shown(port)} is not a port (1 to 65535); "
                "export a free port, or launch with torchrun"
            )
    launch = launch_from_env(env) or _restarted_alone(env)
    if launch is None:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not (env.get(name) or "").strip()]
    if missing:
        raise ConfigError(
            f"this process is rank {launch.rank} of a job of {launch.world_size} "
            f"but {' and '.join(missing)} is not set; start the job with torchrun (or export MASTER_ADDR, the "
            "first node's host name, and MASTER_PORT, a free port)"
        )
    addr = env.get("MASTER_ADDR", "")
    if printable(addr, newlines=False) != addr or len(addr) > 253:
        raise ConfigError(
            f"the launcher's MASTER_ADDR={_shown(addr)} is not a host name; "
            "export the first node's host name or address"
        )


def launch_from_env(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The :class:`Launch` the environment describes, or None for a process started alone (``WORLD_SIZE`` unset
    or 1, no ``LOCAL_RANK``).

    Raises:
        ConfigError: The variables contradict each other (a rank outside the world size, a missing rank).
    """
    env = os.environ if environ is None else environ
    world = _int(env, "WORLD_SIZE")
    local = _int(env, "LOCAL_RANK")
    if world is None or world <= 1 or local is None:
        return None
    rank = _int(env, "RANK")
    if rank is None or not 0 <= rank < world or local < 0:
        raise ConfigError(
            f"the launcher set WORLD_SIZE={world} but RANK={env.get('RANK')!r}, LOCAL_RANK={local}; "
            "start every process through the launcher (torchrun, srun) so each gets its own rank"
        )
    local_world = _int(env, "LOCAL_WORLD_SIZE") or _int(env, "SLURM_NTASKS_PER_NODE") or 1
    node = _int(env, "GROUP_RANK")
    if node is None:
        node = _int(env, "SLURM_NODEID")
    if node is None:
        node = rank // max(local_world, 1)
    source = "slurm" if env.get("YOLO_DET_LAUNCHER") == "slurm" else "torchrun"
    return Launch(rank, world, local, max(local_world, local + 1), node, source)


def _restarted_alone(env: Mapping[str, str]) -> Launch | None:
    """The one worker torchrun started again (``TORCHELASTIC_RESTART_COUNT`` > 0) with ``WORLD_SIZE=1``: no job to
    Ultralytics, but a start of one whose earlier starts may have had more ranks (a machine lost)."""
    if (
        _int(env, "WORLD_SIZE") != 1
        or not env.get("TORCHELASTIC_RUN_ID")
        or not (_int(env, "TORCHELASTIC_RESTART_COUNT") or 0)
    ):
        return None
    local = _int(env, "LOCAL_RANK")
    return None if local is None else Launch(0, 1, local, 1, _int(env, "GROUP_RANK") or 0, "torchrun")


def launch_identity(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """What tells this job from another, and which start of it this is, for the record: the :class:`Launch`
    fields, the rendezvous (``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``) and the restart count
    (``TORCHELASTIC_RESTART_COUNT``: 0 at the first start, n after torchrun restarted the workers n times). A single
    worker torchrun started again has one too: the job's earlier starts may have had more ranks."""
    env = os.environ if environ is None else environ
    launch = launch_from_env(env) or _restarted_alone(env)
    if launch is None:
        return None
    return {
        **launch.to_dict(),
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": env.get("MASTER_PORT"),
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
        "restart_count": _int(env, "TORCHELASTIC_RESTART_COUNT") or 0,
    }


def export_slurm_env(environ: MutableMapping[str, str] | None = None) -> bool:
    """Copy SLURM's task variables under torchrun's names when ``srun`` started several tasks and no torchrun did.

    Only when the job step has more than one task (``SLURM_STEP_NUM_TASKS``, which ``srun`` sets; the batch
    script itself, one process, is no step of several tasks), ``SLURM_PROCID`` is set and ``RANK`` is not
    (torchrun inside a SLURM job keeps its own). ``MASTER_ADDR`` and ``MASTER_PORT`` must then be exported by
    the job script.

    Returns:
        True when the variables were copied.

    Raises:
        ConfigError: SLURM started several tasks but ``MASTER_ADDR`` or ``MASTER_PORT`` is not set.
    """
    env = os.environ if environ is None else environ
    tasks = _int(env, "SLURM_STEP_NUM_TASKS")
    if tasks is None or tasks <= 1 or "SLURM_PROCID" not in env or "RANK" in env:
        return False
    for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE"):
        _int(env, name)  # checked before they are copied under torchrun's names
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise ConfigError(
            f"srun started {tasks} tasks but {' and '.join(missing)} is not set; export MASTER_ADDR (the first "
            "node's host name) and MASTER_PORT (a free port) in the job script, or launch with torchrun"
        )
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = str(tasks)
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node:
        env["LOCAL_WORLD_SIZE"] = per_node.split("(")[0]
    if env.get("SLURM_NODEID") is not None:
        env["GROUP_RANK"] = env["SLURM_NODEID"]
    env["YOLO_DET_LAUNCHER"] = "slurm"
    return True
