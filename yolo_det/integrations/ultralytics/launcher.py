"""Ranks started by an outside launcher (torchrun, SLURM, a PyTorchJob): one data-parallel job, not one per rank.

Ultralytics' trainer counts its ranks from ``device=`` (``len(device.split(","))``, 0 on the CPU) and starts its own
launcher when that count is above 1. Under ``torchrun --nnodes N --nproc_per_node G`` that count is wrong (each
rank sees its node's devices, or none on the CPU), so the trainer seam extends the trainer's methods
(:class:`LauncherTrainer`): before Ultralytics' constructor the rank joins the job's process group (``env://``;
gloo on the CPU, NCCL on CUDA) and rank 0 picks the run folder for every rank; after it, the trainer's world size is
the launcher's ``WORLD_SIZE`` and it starts no launcher of its own; ``_setup_ddp`` puts the rank on its local device
(``cuda:LOCAL_RANK``, or the ``LOCAL_RANK``-th device ``device=`` lists, or the CPU) without a second
``init_process_group``; a CPU model is wrapped in DDP without device ids. The global batch is split as Ultralytics
splits it on one node (``batch // WORLD_SIZE`` per rank).

The ranks of Ultralytics' own launcher (``device=0,1``: the rank's arguments carry the run folder and as many
devices as ranks) are left to Ultralytics, which joins its group itself.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ...core.compat import cpu_ddp_wrapping, validator_on_cpu
from ...core.errors import ConfigError
from ...core.launcher import Launch, launch_from_env, launch_identity
from ...core.record import RECORD_NAME
from ...session.launcher import broadcast_from_rank0, join_process_group, leave_process_group, max_over_ranks

__all__ = [
    "LAUNCHER_METHODS",
    "LauncherTrainer",
    "default_base",
    "device_type",
    "launched_externally",
    "restarted_alone",
]

#: The methods of Ultralytics' trainer :class:`LauncherTrainer` overrides (each calls the base's own).
LAUNCHER_METHODS = ("_setup_ddp", "_setup_train", "final_eval", "train")


def _device_request(cfg: Any, overrides: dict[str, Any] | None) -> str:
    over = overrides or {}
    if "device" in over:
        return "" if over["device"] is None else str(over["device"])
    value = cfg.get("device") if isinstance(cfg, dict) else getattr(cfg, "device", None)
    return "" if value is None else str(value)


def _devices(request: str) -> list[str]:
    text = request.lower().replace("cuda:", "").replace(" ", "")
    return [d for d in text.split(",") if d]


def device_type(request: str) -> str:
    """``cpu`` or ``cuda`` for a ``device=`` request (empty: CUDA when there is one, as Ultralytics picks)."""
    text = request.lower().strip()
    if text in {"cpu", "mps"} or text.startswith("mps"):
        return "cpu"
    if text in {"", "-1", "none"}:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda"


def _ultralytics_rank(launch: Launch, request: str, overrides: dict[str, Any] | None) -> bool:
    """A rank of Ultralytics' own launcher: its arguments name the run folder and one device per rank."""
    devices = _devices(request)
    return (
        bool((overrides or {}).get("save_dir")) and device_type(request) == "cuda" and len(devices) == launch.world_size
    )


def launched_externally(cfg: Any = None, overrides: dict[str, Any] | None = None) -> Launch | None:
    """The outside launcher's :class:`~yolo_det.core.launcher.Launch` when this process is one of its ranks and
    yolo-det must join its job (not a rank of Ultralytics' own launcher); None otherwise."""
    launch = launch_from_env()
    if launch is None or _ultralytics_rank(launch, _device_request(cfg, overrides), overrides):
        return None
    return launch


def _local_device(launch: Launch, request: str) -> Any:
    import torch

    if device_type(request) == "cpu":
        return torch.device("cpu")
    devices = _devices(request)
    index = int(devices[launch.local_rank]) if len(devices) > launch.local_rank else launch.local_rank
    return torch.device("cuda", index)


def _earlier_start(folder: Path, me: dict[str, Any]) -> bool:
    """Whether ``folder`` holds the run of an earlier start of this very job (its record names the same
    rendezvous and run id, and the run did not complete). Only a start the ranks agreed is a restart asks, and it
    asks before it writes a record of its own."""
    try:
        record = json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    launch = record.get("launch") if isinstance(record, dict) else None
    if not isinstance(launch, dict) or record.get("status") == "completed":
        return False
    profile = record.get("profile")
    sharded = isinstance(profile, dict) and isinstance(profile.get("train"), dict) and profile["train"].get("shards")
    # under shards an elastic restart may come back with another number of ranks: the weights do not depend on it
    keys = (
        ("master_addr", "master_port", "run_id") if sharded else ("master_addr", "master_port", "run_id", "world_size")
    )
    return all(launch.get(k) == me.get(k) for k in keys)


def _restarted_run(args: Any, planned: Path, restarted: bool) -> Path | None:
    """The ``last.pt`` an earlier start of this job left, when torchrun restarted the workers (rank 0 only).

    ``restarted``: the ranks agreed this start is a restart (:func:`_restart_agreed`). The folder is the planned one
    when its name is fixed (``exist_ok=True`` or ``save_dir=``), else the newest numbered sibling (``name``,
    ``name2``, ...) whose record is an earlier start of this job."""
    me = launch_identity()
    if me is None or not restarted or getattr(args, "resume", False):
        return None
    if getattr(args, "exist_ok", False) or getattr(args, "save_dir", None):
        candidates = [planned]
    else:
        stem = re.sub(r"\d+$", "", planned.name) if not planned.exists() else planned.name
        pattern = re.compile(re.escape(stem) + r"\d*$")
        siblings = [p for p in planned.parent.glob(f"{stem}*") if pattern.fullmatch(p.name) and p.is_dir()]
        candidates = sorted(siblings, key=lambda p: p.stat().st_mtime, reverse=True)
    for folder in candidates:
        last = folder / "weights" / "last.pt"
        if last.is_file() and _earlier_start(folder, me):
            return last
    return None


def _resumed_checkpoint(over: dict[str, Any]) -> Path | None:
    """The checkpoint ``resume=`` names (a path, or ``True`` with a ``.pt`` model), else None."""
    resume, model = over.get("resume"), over.get("model")
    if isinstance(resume, (str, Path)) and str(resume).lower() not in {"", "true", "false"}:
        return Path(resume).resolve()
    if resume in {True, "True", "true"} and isinstance(model, (str, Path)) and str(model).endswith(".pt"):
        return Path(model).resolve()
    return None


def _restart_agreed(alone: bool) -> bool:
    """Whether this start of the job is a restart, as every rank agrees (a collective unless ``alone``).

    torchrun's ``TORCHELASTIC_RESTART_COUNT`` counts the restarts of one node's workers: a node whose workers
    were restarted because another node's failed keeps its count (0 after the first failure). The first start
    of a job has 0 on every node, any start after a failure more than 0 on the node that failed: the largest
    count over the ranks tells a restart on every rank alike.
    """
    me = launch_identity()
    count = int(me["restart_count"]) if me is not None else 0
    return (count if alone else max_over_ranks(count)) > 0


def _shared_folder(cfg: Any, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``overrides`` with ``save_dir`` set to the run folder rank 0 picks (a collective: every rank calls it).

    After torchrun restarted the workers (``--max-restarts``), rank 0 finds the run an earlier start of the job
    left and every rank resumes from its ``last.pt`` (and the resume states next to it), with no new command line.
    """
    from ...session.distributed import rank_info

    over = dict(overrides or {})
    alone = launched_externally(cfg, overrides) is None  # the one worker left after a restart: no collective
    restarted = _restart_agreed(alone)
    choice = _folder_choice(cfg, over, restarted) if alone or rank_info()[0] == 0 else None
    choice = choice if alone else broadcast_from_rank0(choice)
    if choice:
        if "resume" in choice and (alone or rank_info()[0] == 0):
            print(f"yolo-det: torchrun restarted the workers; resuming from {choice['resume']}", file=sys.stderr)
        over.update(choice)
    return over


def _folder_choice(cfg: Any, over: dict[str, Any], restarted: bool) -> dict[str, str] | None:
    """The run folder (and the checkpoint to resume from, after a restart) rank 0 picks for the job."""
    from ...core.compat import DEFAULT_CFG, DEFAULT_CFG_DICT, get_cfg, get_save_dir

    resumed = _resumed_checkpoint(over)
    if resumed is not None:  # a resumed run writes into its checkpoint's folder
        return {"save_dir": str(resumed.parent.parent)}
    known = {k: v for k, v in over.items() if k in DEFAULT_CFG_DICT}
    try:
        args = get_cfg(DEFAULT_CFG if cfg is None else cfg, known)
        planned = Path(get_save_dir(args))
        last = _restarted_run(args, planned, restarted)
    except Exception:  # Ultralytics reports bad arguments its own way, on every rank
        return None
    return {"save_dir": str(planned)} if last is None else {"save_dir": str(last.parent.parent), "resume": str(last)}


def restarted_alone(cfg: Any = None, overrides: dict[str, Any] | None = None) -> bool:
    """Whether this process is the one worker torchrun started again for a job that may have had more (a machine
    lost under ``--nnodes 1:N``): Ultralytics sees no job (``WORLD_SIZE=1``), but the run the job left is found."""
    return launched_externally(cfg, overrides) is None and launch_identity() is not None


class LauncherTrainer:
    """The trainer's methods for one rank of an outside launcher's job (see the module docstring), a mixin of the
    trainer seam (:class:`~yolo_det.integrations.ultralytics.seam.SeamTrainer`). Outside such a job (no
    ``WORLD_SIZE``/``LOCAL_RANK``) and in the ranks of Ultralytics' own launcher each one is the base's own.
    """

    yolo_det_launch: Launch | None = None
    _yolo_det_group = False

    def __init__(
        self, cfg: Any = None, overrides: dict[str, Any] | None = None, _callbacks: dict[str, list[Any]] | None = None
    ) -> None:
        from ...core.compat import DEFAULT_CFG

        cfg = DEFAULT_CFG if cfg is None else cfg
        launch = launched_externally(cfg, overrides)
        self.yolo_det_launch = launch
        request = _device_request(cfg, overrides)
        if launch is not None:
            _check_ultralytics_rank(launch)
            device = _local_device(launch, request)
            if device.type == "cuda":
                import torch

                torch.cuda.set_device(device)
            self._yolo_det_group = join_process_group(launch, device.type)
        parent: Any = super()
        try:
            if launch is not None or restarted_alone(cfg, overrides):
                overrides = _shared_folder(cfg, overrides)
            parent.__init__(cfg, overrides, _callbacks)
        except BaseException:
            leave_process_group(self._yolo_det_group)
            raise
        if launch is not None:
            self.world_size = launch.world_size  # Ultralytics counted the devices of this node (0 on the CPU)
            self.ddp = False  # the outside launcher started the ranks: no second one
            self.yolo_det_device = _local_device(launch, request)

    # Ultralytics 8.3.0 passes _setup_ddp and _setup_train the world size; later releases pass nothing
    def _setup_ddp(self, *args: Any) -> None:
        parent: Any = super()
        if self.yolo_det_launch is None:
            parent._setup_ddp(*args)
            return
        self.device = self.yolo_det_device
        if self.device.type == "cpu":
            self.accelerator = None  # what Ultralytics keeps for a CPU device
        else:
            import torch

            torch.cuda.set_device(self.device)

    def _setup_train(self, *args: Any) -> None:
        parent: Any = super()
        with cpu_ddp_wrapping() if self.yolo_det_launch is not None and self.device.type == "cpu" else nullcontext():
            parent._setup_train(*args)

    def final_eval(self) -> None:
        parent: Any = super()
        with validator_on_cpu() if self.yolo_det_launch is not None and self.device.type == "cpu" else nullcontext():
            parent.final_eval()

    def train(self) -> Any:
        parent: Any = super()
        try:
            return parent.train()
        finally:
            leave_process_group(self._yolo_det_group)


def _check_ultralytics_rank(launch: Launch) -> None:
    """Refuse a rank whose Ultralytics read another rank at import (SLURM's variables copied too late)."""
    from ...core.compat import ULTRALYTICS_RANK

    if int(ULTRALYTICS_RANK) != launch.rank:
        raise ConfigError(
            f"Ultralytics was imported before this rank's variables were set (it reads RANK={ULTRALYTICS_RANK}, "
            f"the launcher says {launch.rank}); call yolo_det.export_slurm_env() before importing ultralytics, "
            "or start the ranks with torchrun"
        )


def default_base(model: Any) -> type:
    """The trainer ``model.train()`` would build for ``model`` (its task's)."""
    from ...core.compat import task_trainer

    task = str(model.task or "detect")
    try:
        return task_trainer(task)
    except KeyError:  # a task of a newer Ultralytics
        trainer: type = model.task_map[task]["trainer"]
        return trainer
