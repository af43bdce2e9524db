"""Torchrun jobs on this machine's CPU (gloo): one agent with several ranks, or several agents as several nodes.

Every job trains the same tiny run (yolov8n.yaml on the demo data, imgsz 64, batch 4 = nbs, so each optimizer
step changes the weights) through ``python -m yolo_det train`` or a user script calling
``yolo_det.trainer_class``; two agents on localhost with ``--nnodes 2 --node_rank i`` stand in for two machines.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import ROOT, subprocess_env

#: The tiny run's arguments (a third of the demo images: 16 train images, 4 global batches an epoch).
TINY = [
    "model=yolov8n.yaml",
    f"data={ROOT / 'data' / 'demo.yaml'}",
    "imgsz=64",
    "batch=4",
    "nbs=4",
    "workers=0",
    "fraction=0.34",
    "device=cpu",
    "plots=False",
    "seed=3",
]

#: A user's script under torchrun: the trainer class and model.train(), nothing distributed in it.
USER_SCRIPT = """
import sys
import yaml
from ultralytics import YOLO
import yolo_det

args = {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
model = YOLO(args.pop("model"))
model.train(trainer=yolo_det.trainer_class("repro"), **args)
"""


def free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous of one job)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return subprocess_env({"OMP_NUM_THREADS": "1", **(extra or {})})


def _torchrun(nnodes: int, node_rank: int, nproc: int, port: int, extra: list[str], c10d: bool) -> list[str]:
    where = (
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job"]
        if c10d
        else ["--node_rank", str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(port)]
    )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        *where,
        "--nproc_per_node",
        str(nproc),
        *extra,
    ]


def job(
    tmp: Path,
    name: str,
    *,
    nnodes: int = 1,
    nproc: int = 2,
    epochs: int = 2,
    script: bool = False,
    profile: str = "repro",
    torchrun_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 600,
    args: list[str] | None = None,
    c10d: bool = False,
) -> dict[str, Any]:
    """Run one job to its end; its agents' exit codes, output, run folder and rank 0's record (``args``: the
    training arguments instead of the tiny run's, e.g. ``resume=...``; the run folder is still ``runs/name``;
    ``c10d``: the agents meet through torchrun's c10d rendezvous, which numbers the nodes itself, instead of the
    static one)."""
    port = free_port()
    project = tmp / "runs"
    run_args = args or [*TINY, f"epochs={epochs}", f"project={project}", f"name={name}", "exist_ok=True"]
    if script:
        path = tmp / "user_train.py"
        path.write_text(USER_SCRIPT)
        program = [str(path), *run_args]
    else:
        program = ["-m", "yolo_det", "train", "--profile", profile, *run_args]
    procs = [
        subprocess.Popen(
            [*_torchrun(nnodes, node, nproc, port, list(torchrun_args), c10d), *program],
            cwd=tmp,
            env=_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nnodes)
    ]
    outputs, codes = [], []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
            codes.append(proc.returncode)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    save_dir = project / name
    record_path = save_dir / "determinism.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    return {"codes": codes, "output": "\n".join(outputs), "save_dir": save_dir, "record": record}


def digest(result: dict[str, Any]) -> str:
    """The final weights' digest (the EMA's fp32 values) rank 0 recorded."""
    record = result["record"]
    assert record is not None, result["output"][-4000:]
    assert record["status"] == "completed", result["output"][-4000:]
    return str(record["weights"]["ema_fp32_sha256"])


def one_epoch_fewer(result: dict[str, Any]) -> str:
    """The digest of the job's weights one epoch before its end (the same job, one epoch fewer of training), from
    rank 0's record of the checkpoint after each epoch: the control that the compared weights changed in the last
    epoch; checked to differ from the final checkpoint's."""
    record = result["record"]
    assert record is not None, result["output"][-4000:]
    *_, before, last = [entry["sha256"] for entry in record["epoch_weights"]]
    assert last == record["weights"]["sha256"]  # the list ends on the weights the run ended on
    assert before != last, "the last epoch left the weights as they were: equal final weights would prove nothing"
    return str(before)
