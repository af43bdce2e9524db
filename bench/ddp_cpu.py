"""Ultralytics' own multi-GPU path (``generate_ddp_file`` + ``torch.distributed.run``) on CPU ranks with gloo.

``model.train(device="0,1")`` makes Ultralytics pickle the trainer class, its arguments, the model and the
callbacks with cloudpickle, write a temporary script, and start ``python -m torch.distributed.run
--nproc_per_node 2`` on it; each rank rebuilds the trainer, joins the process group (NCCL) and trains under
``DistributedDataParallel``. This harness runs exactly that on a machine without GPUs, changing only what a
CPU cannot do (where the rank's device is chosen, and the backend), and only inside the processes it starts
(no installed file is edited, nothing in yolo-det):

1. **Device selection.** ``ultralytics.engine.trainer.select_device`` answers a multi-GPU request
   (``"0,1"``) with ``torch.device("cuda", 0)``, what it answers on a 2-GPU machine, instead of raising
   because there is no CUDA. Nothing is allocated on that device before step 2: the trainer only reads its
   type (to count ``world_size`` from ``device=``) in the launching process and before ``_setup_ddp``.
2. **Backend and rank device.** ``BaseTrainer._setup_ddp`` puts the rank on the CPU (instead of
   ``cuda:LOCAL_RANK``) and joins the process group with ``gloo`` (instead of NCCL), with Ultralytics'
   rank, world size and timeout.
3. **DDP's device_ids.** ``torch.nn.parallel.DistributedDataParallel`` is given ``device_ids=None`` for a
   CPU module (a CPU module takes none; Ultralytics passes ``[device.index]``).
4. **The validator's rank device.** A validator run by rank 0 outside the training loop (the final
   validation of ``best.pt``) asks CUDA for the rank's current device; in the ranks,
   ``ultralytics.engine.validator`` gets the CPU instead (its ``get_torch_device_backend("cuda")`` answers
   the rank's index without initializing CUDA, and its ``AutoBackend`` gets ``cpu`` for that device).

Everything else is Ultralytics' real path: the cloudpickle hand-off of the plugin's callbacks, the
generated script, ``torch.distributed.run``, ``init_seeds(seed + 1 + RANK)``, the ``DistributedSampler``,
the DDP gradient all-reduce, rank 0 saving checkpoints and ``stop`` broadcasts.

How the ranks get the changes: the launching process registers this module's callbacks (:data:`EVENTS`).
cloudpickle pickles them by reference (this module is importable: the generated script restores the launching
process's ``sys.path``), so unpickling the trainer state in a rank imports this module, and importing it
with ``YOLO_DET_DDP_CPU`` set in a rank (``LOCAL_RANK`` set) installs changes 2-4 (and 1) before the trainer
is built. The callbacks also write what each rank observes (``rank<r>.json`` in ``YOLO_DET_DDP_CPU``) and
can stop the run at a named point (``YOLO_DET_DDP_CPU_AT``): ``stop@<epoch>`` ends every rank cleanly
after that epoch's checkpoint (the interruption ``yolo-det verify --resume-at`` uses), ``sigterm@<epoch>``
sends SIGTERM to the launching process once rank 0 has saved that epoch.

Run it::

    python bench/ddp_cpu.py --out /tmp/ddp --epochs 2 --seed 0             # 2 CPU ranks, profile repro
    python bench/ddp_cpu.py --out /tmp/ddp --no-plugin                     # the same without yolo-det

It prints one JSON line: the run folder, the record's status, the weights digest and every rank's view.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

#: The folder each rank writes its observations into; its presence turns the harness on in the ranks.
ENV_OUT = "YOLO_DET_DDP_CPU"
#: A named point at which the run is stopped: ``stop@<epoch>`` or ``sigterm@<epoch>`` (1-based epochs).
ENV_AT = "YOLO_DET_DDP_CPU_AT"
#: The pid of the launching process (the target of ``sigterm@``).
ENV_PARENT = "YOLO_DET_DDP_CPU_PARENT"
#: ``<rank>:cudnn_benchmark`` turns cuDNN autotuning on in that rank after the profile is applied (a rank
#: problem; it changes no number on a CPU).
ENV_SKEW = "YOLO_DET_DDP_CPU_SKEW"

_originals: dict[str, Any] = {}


class Stopped(Exception):
    """A run stopped at the harness's named point (after the epoch's checkpoint)."""


# -- the changes ----------------------------------------------------------------------------------------
def _select_device(device: Any = "", newline: bool = False, verbose: bool = True) -> Any:
    """Ultralytics' ``select_device``, except that a multi-GPU request on a machine without CUDA gives what
    it gives on a multi-GPU machine (the first GPU) instead of raising."""
    import torch
    from ultralytics.utils.torch_utils import parse_device

    request = parse_device(device)
    indices = request.split(",")
    if len(indices) > 1 and all(i.isdigit() for i in indices) and not torch.cuda.is_available():
        return torch.device("cuda", int(indices[0]))
    return _originals["select_device"](device, newline=newline, verbose=verbose)


def _setup_ddp(self: Any) -> None:
    """``BaseTrainer._setup_ddp`` on a CPU: the rank stays on the CPU and joins the group with gloo."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from ultralytics.utils import RANK

    self.device = torch.device("cpu")
    self.accelerator = None  # what the trainer keeps for a CPU device
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=10800), rank=RANK, world_size=self.world_size)


def _ddp_class() -> type:
    import torch

    base = _originals["DistributedDataParallel"]

    class CpuDistributedDataParallel(base):  # type: ignore[misc, valid-type]
        """DDP for a CPU module: ``device_ids`` dropped (a CPU module takes none)."""

        def __init__(self, module: torch.nn.Module, *args: Any, device_ids: Any = None, **kwargs: Any) -> None:
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            super().__init__(module, *args, device_ids=None if on_cpu else device_ids, **kwargs)

    return CpuDistributedDataParallel


class _RankDevices:
    """What ``torch.cuda`` answers about the rank's device, on a CPU: its index is ``LOCAL_RANK``."""

    @staticmethod
    def current_device() -> int:
        return max(int(os.environ.get("LOCAL_RANK", 0)), 0)


def _validator_backend(device: Any) -> Any:
    import torch

    if getattr(device, "type", str(device).split(":")[0]) == "cuda" and not torch.cuda.is_available():
        return _RankDevices
    return _originals["get_torch_device_backend"](device)


def _validator_autobackend(*args: Any, device: Any = None, **kwargs: Any) -> Any:
    import torch

    if isinstance(device, torch.device) and device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")
    return _originals["AutoBackend"](*args, device=device, **kwargs)


@contextmanager
def cpu_launch() -> Any:
    """In the launching process: Ultralytics' device selection accepts ``device="0,1"`` without CUDA (with
    CUDA it answers as Ultralytics does). Restores Ultralytics' own function afterwards.
    """
    import ultralytics.engine.trainer as trainer_module

    _originals.setdefault("select_device", trainer_module.select_device)
    trainer_module.select_device = _select_device
    try:
        yield
    finally:
        trainer_module.select_device = _originals["select_device"]


def install_in_rank() -> bool:
    """Install the changes in this process if it is a rank launched by the harness on a machine without CUDA
    (idempotent). With CUDA nothing is changed: the callbacks only observe (``bench/gpu_ddp.py``)."""
    if not os.environ.get(ENV_OUT) or os.environ.get("LOCAL_RANK") is None or "installed" in _originals:
        return False
    import torch

    if torch.cuda.is_available():
        return False
    import ultralytics.engine.trainer as trainer_module
    import ultralytics.engine.validator as validator_module

    _originals["select_device"] = trainer_module.select_device
    _originals["DistributedDataParallel"] = torch.nn.parallel.DistributedDataParallel
    _originals["get_torch_device_backend"] = validator_module.get_torch_device_backend
    _originals["AutoBackend"] = validator_module.AutoBackend
    trainer_module.select_device = _select_device
    validator_module.get_torch_device_backend = _validator_backend
    validator_module.AutoBackend = _validator_autobackend
    trainer_module.BaseTrainer._setup_ddp = _setup_ddp  # type: ignore[method-assign]
    torch.nn.parallel.DistributedDataParallel = _ddp_class()  # type: ignore[misc]
    _originals["installed"] = True
    return True


# -- what each rank observes ----------------------------------------------------------------------------
def _plugin(trainer: Any) -> Any:
    for fn in trainer.callbacks.get("on_train_start", []):
        owner = getattr(fn, "__self__", None)
        if type(owner).__name__ == "UltralyticsPlugin":
            return owner
    return None


def _rng_digest() -> str:
    import hashlib
    import random

    import numpy as np
    import torch

    h = hashlib.sha256()
    h.update(repr(random.getstate()).encode())
    h.update(np.random.get_state()[1].tobytes())
    h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()


def observe(trainer: Any) -> dict[str, Any]:
    """What this rank runs under as training starts: plugin, flags, seeds, swaps, sampler."""
    import torch
    import torch.distributed as dist

    from yolo_det.core.backward import ToggleScaler
    from yolo_det.core.state import snapshot
    from yolo_det.fixes.intercept import is_active

    plugin = _plugin(trainer)
    session = getattr(plugin, "session", None)
    model = getattr(trainer.model, "module", trainer.model)
    sampler = getattr(trainer.train_loader, "sampler", None)
    dist_sampler = isinstance(sampler, torch.utils.data.distributed.DistributedSampler)
    return {
        "rank": dist.get_rank() if dist.is_initialized() else -1,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "ddp": type(trainer.model).__name__,
        "plugin": plugin is not None,
        "profile": session.profile.name if session is not None else None,
        "phases": list(session.phases) if session is not None else [],
        "seeds": session.seeds() if session is not None else None,
        "state": snapshot().to_dict(),
        "swapped": sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith("yolo_det.")}),
        "intercepting": is_active(),
        "toggle_scaler": isinstance(getattr(trainer, "scaler", None), ToggleScaler),
        "torch_initial_seed": torch.initial_seed(),
        "rng_digest": _rng_digest(),
        "sampler": type(sampler).__name__,
        "sampler_seed": getattr(sampler, "seed", None) if dist_sampler else None,
        "sampler_order": list(iter(sampler))[:16] if dist_sampler else None,
        "user_seed": int(trainer.args.seed),
        "pid": os.getpid(),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }


def _write(rank: int, data: dict[str, Any]) -> None:
    out = Path(os.environ[ENV_OUT])
    path = out / f"rank{rank}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(data)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(old, default=str))
    tmp.replace(path)


def _skew() -> None:
    """Turn cuDNN autotuning on in one rank (``<rank>:cudnn_benchmark``): what a rank problem looks like."""
    import torch

    spec = os.environ.get(ENV_SKEW, "")
    if not spec:
        return
    rank, _, setting = spec.partition(":")
    if setting != "cudnn_benchmark":
        raise ValueError(f"{ENV_SKEW}={spec!r}: expected <rank>:cudnn_benchmark")
    if rank == os.environ.get("RANK"):
        torch.backends.cudnn.benchmark = True


def on_pretrain_routine_end(trainer: Any) -> None:
    """After the plugin's own callback: skew a flag on one rank if asked."""
    if int(os.environ.get("RANK", -1)) >= 0 and os.environ.get(ENV_OUT):
        _skew()


def on_train_start(trainer: Any) -> None:
    """Write this rank's view as training starts (after the plugin gathered every rank's state)."""
    rank = int(os.environ.get("RANK", -1))
    if rank >= 0 and os.environ.get(ENV_OUT):
        _write(rank, {"start": observe(trainer), "epochs": {}})


def on_fit_epoch_end(trainer: Any) -> None:
    """After the epoch's checkpoint: note its weights digest; stop at the named point."""
    rank = int(os.environ.get("RANK", -1))
    if rank < 0 or not os.environ.get(ENV_OUT):
        return
    from yolo_det.core.record import state_dict_digest
    from yolo_det.integrations.trainer_state import state_of

    epoch = int(trainer.epoch) + 1
    if epoch > int(trainer.epochs):  # the final validation's call (Ultralytics logs it as one epoch more)
        return
    model = getattr(trainer.model, "module", trainer.model)
    path = Path(os.environ[ENV_OUT]) / f"rank{rank}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    epochs = old.get("epochs", {})
    plugin = _plugin(trainer)
    session = getattr(plugin, "session", None)
    epochs[str(epoch)] = {
        "params": state_dict_digest(dict(model.named_parameters())),  # the same on every rank under DDP
        "state": state_dict_digest(model),  # with this rank's BatchNorm statistics
        "backward_toggles": session.backward_toggles() if session is not None else 0,
        "routed_calls": sum(session.routed_calls().values()) if session is not None else 0,
    }
    _write(rank, {"epochs": epochs})
    action, _, at = os.environ.get(ENV_AT, "").partition("@")
    if not at or int(at) != epoch:
        return
    if action == "stop":
        state_of(trainer).stopped_on_purpose = True  # a clean stop after a saved epoch (the run is resumable)
        _stop_in_order(rank)
        raise Stopped(f"stopped after epoch {epoch}")
    if action == "sigterm" and rank == 0:
        os.kill(int(os.environ[ENV_PARENT]), signal.SIGTERM)


def _stop_in_order(rank: int) -> None:
    """Let rank 0 end first, after every rank has written this epoch.

    The launcher stops the whole group as soon as one rank fails, so a rank that raised first would have
    the others terminated mid-epoch (rank 0 then records "terminated", a slower rank never writes its epoch).
    Every rank meets at a barrier once its epoch is written; rank 0 then raises, and the other ranks wait in
    a second barrier that ends only when rank 0's process is gone (its record written), by an error of the
    closed connection or the launcher's stop.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    if rank != 0:
        with suppress(Exception):  # rank 0 ended: its connection closed, as expected
            dist.barrier()


#: The harness's callbacks, by Ultralytics event.
EVENTS = {
    "on_pretrain_routine_end": on_pretrain_routine_end,
    "on_train_start": on_train_start,
    "on_fit_epoch_end": on_fit_epoch_end,
}


install_in_rank()


# -- checks of what the ranks observed (shared by the tests and bench/gpu_ddp.py) --------------------------
def plugin_problems(
    run: dict[str, Any], profile: str, *, world_size: int = 2, backend: str = "gloo", toggle: bool = False
) -> list[str]:
    """Where a rank of ``run`` (a :func:`launch` result) did not train under the plugin; empty: every rank did."""
    problems = []
    ranks = run.get("ranks") or {}
    if sorted(ranks, key=int) != [str(r) for r in range(world_size)]:
        problems.append(f"ranks reported: {sorted(ranks)}")
    for r, seen in sorted(ranks.items()):
        start = seen["start"]
        ddp = "DistributedDataParallel" in start["ddp"]
        if (start["world_size"], start["backend"]) != (world_size, backend) or not ddp:
            problems.append(f"rank {r} is not a DDP rank: {start['world_size']}, {start['backend']}, {start['ddp']}")
        if not start["plugin"] or start["profile"] != profile or start["phases"] != ["train"]:
            problems.append(f"rank {r}: plugin {start['plugin']}, profile {start['profile']}, phases {start['phases']}")
        if start["state"]["deterministic_algorithms"] != "strict" or start["state"]["cudnn_deterministic"] is not True:
            problems.append(f"rank {r} flags: {start['state']}")
        if "DetUpsample" not in start["swapped"]:
            problems.append(f"rank {r} swapped {start['swapped']}")
        if not start["intercepting"]:
            problems.append(f"rank {r} does not intercept")
        toggled = all(e["backward_toggles"] > 0 for e in seen["epochs"].values())
        if toggle and not (start["toggle_scaler"] and toggled):
            problems.append(f"rank {r} runs backward without the toggle")
    return problems


def seed_problems(run: dict[str, Any], seed: int) -> list[str]:
    """Where a rank's sampler or RNGs do not follow the user's seed; empty: every rank's do."""
    problems = []
    orders = []
    for r, seen in sorted((run.get("ranks") or {}).items()):
        start = seen["start"]
        if start["sampler"] != "DistributedSampler" or start["sampler_seed"] != seed:
            problems.append(
                f"rank {r}: {start['sampler']} seeded with {start['sampler_seed']}, the user's seed is {seed}"
            )
        if start["torch_initial_seed"] != seed + 1 + int(r):
            problems.append(f"rank {r}: torch seed {start['torch_initial_seed']}, expected {seed + 1 + int(r)}")
        orders.append(set(start["sampler_order"] or []))
    if len(orders) > 1 and set.intersection(*orders):
        problems.append("the ranks' samplers share images")
    return problems


# -- the launching process ------------------------------------------------------------------------------
def launch(
    out: Path,
    *,
    model: str = "yolov8n.yaml",
    data: str | None = None,
    epochs: int = 2,
    seed: int = 0,
    profile: str | None = "repro",
    devices: str | None = None,
    resume: str | None = None,
    at: str | None = None,
    skew: str | None = None,
    project: Path | None = None,
    name: str = "ddp",
    **train_args: Any,
) -> dict[str, Any]:
    """Train through Ultralytics' DDP launcher on CPU ranks, in this process (the launching process).

    Args:
        out: Folder for the ranks' observations (``rank<r>.json``); the run folder is ``out/<name>``
            unless ``project`` is given.
        model: Model YAML or checkpoint.
        data: Data YAML (default: yolo-det's demo data).
        epochs, seed: Ultralytics' arguments.
        profile: A yolo-det profile (name or file), or None to train without yolo-det (a control).
        devices: Ultralytics' ``device=`` (one index per rank; ``"0,1"`` for a new run, the checkpoint's for a
            resumed one).
        resume: A ``last.pt`` to resume from (``model`` and the other arguments then come from it).
        at: A named point to stop at (``stop@<epoch>``, ``sigterm@<epoch>``).
        skew: ``<rank>:cudnn_benchmark`` changes that flag on that rank after the profile is applied.
        project, name: The run folder.
        **train_args: More Ultralytics arguments.

    Returns:
        ``{"save_dir", "error", "ranks": {rank: observations}}``.
    """
    import ddp_cpu as harness  # this module by its importable name (cloudpickle pickles it by reference)
    import ultralytics

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in (ENV_OUT, ENV_AT, ENV_PARENT, ENV_SKEW)}
    os.environ.update({ENV_OUT: str(out), ENV_PARENT: str(os.getpid())})
    for key, value in ((ENV_AT, at), (ENV_SKEW, skew)):
        if value:
            os.environ[key] = value
        else:
            os.environ.pop(key, None)
    result: dict[str, Any] = {"error": None}
    try:
        if resume:
            yolo = ultralytics.YOLO(resume)
            args: dict[str, Any] = {"resume": True, **({"device": devices} if devices else {}), **train_args}
        else:
            if data is None:
                from yolo_det.tools.demo import demo_data_yaml

                data = str(demo_data_yaml())
            yolo = ultralytics.YOLO(model)
            args = {
                "data": data,
                "epochs": epochs,
                "seed": seed,
                "device": devices or "0,1",
                "imgsz": 64,
                "batch": 4,
                "nbs": 4,
                "workers": 0,
                "plots": False,
                "val": False,
                "amp": False,
                "exist_ok": True,
                "project": str(project or out),
                "name": name,
                "verbose": False,
                **train_args,
            }
        if profile is not None:
            import yolo_det

            yolo_det.attach(yolo, profile)
        for event, fn in harness.EVENTS.items():
            yolo.add_callback(event, fn)
        with harness.cpu_launch():
            try:
                yolo.train(**args)
            except BaseException as e:  # reported in the result (a stopped or terminated run ends with one)
                result["error"] = f"{type(e).__name__}: {e}"
        trainer = getattr(yolo, "trainer", None)
        result["save_dir"] = str(getattr(trainer, "save_dir", "")) if trainer is not None else None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    result["ranks"] = {p.stem[4:]: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the run and the ranks' observations")
    parser.add_argument("--model", default="yolov8n.yaml")
    parser.add_argument("--data", default=None, help="data YAML (default: yolo-det's demo data)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="repro")
    parser.add_argument("--no-plugin", action="store_true", help="train without yolo-det (a control)")
    parser.add_argument("--devices", default=None, help="Ultralytics' device= (one index per rank; default 0,1)")
    parser.add_argument("--resume", default=None, help="a last.pt to resume from")
    parser.add_argument("--at", default=None, help="stop@<epoch> or sigterm@<epoch>")
    parser.add_argument("--skew", default=None, help="<rank>:cudnn_benchmark (a rank that differs)")
    parser.add_argument("--name", default="ddp")
    parser.add_argument("--fraction", type=float, default=1.0, help="part of the training images to use")
    a = parser.parse_args(argv)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ddp_cpu as harness

    result = harness.launch(
        a.out,
        model=a.model,
        data=a.data,
        epochs=a.epochs,
        seed=a.seed,
        profile=None if a.no_plugin else a.profile,
        devices=a.devices,
        resume=a.resume,
        at=a.at,
        skew=a.skew,
        name=a.name,
        **({"fraction": a.fraction} if a.fraction != 1.0 and not a.resume else {}),
    )
    record = Path(result["save_dir"] or "", "determinism.json") if result.get("save_dir") else None
    if record is not None and record.exists():
        rec = json.loads(record.read_text())
        result["record"] = {
            "path": str(record),
            "status": rec.get("status"),
            "rank_problems": rec.get("rank_problems"),
            "sha256": (rec.get("weights") or {}).get("sha256"),
        }
    print(json.dumps(result, default=str))
    return 0 if result["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
