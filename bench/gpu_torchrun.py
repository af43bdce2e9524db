#!/usr/bin/env python
"""Several machines with NCCL: the proofs of tests/test_torchrun.py on real GPUs.

usage: python bench/gpu_torchrun.py [--out PATH] [--epochs 2] [--nccl-algo Ring] [--nccl-proto Simple]

On a machine with 2+ CUDA devices it trains one tiny job (yolov8n.yaml on the demo data, imgsz 64, batch 4 = nbs)
three times through ``python -m yolo_det train`` under torchrun, NCCL's algorithm and protocol exported:

1. one agent with two ranks (``--nproc_per_node 2``, ``device=0,1``) and two agents on localhost as two machines
   of one rank each (``--nnodes 2 --node_rank 0/1``, each agent sees one GPU through ``CUDA_VISIBLE_DEVICES``,
   ``device=0``) end on bitwise-equal weights; the two-machine job with one epoch fewer ends on other weights;
2. rank 0's record lists both ranks, each on a CUDA device, and has no rank problem.

With fewer than 2 GPUs it runs nothing and says what it skipped (exit 0). The result goes to one JSON file
(default bench/results/gpu_torchrun.json); exit 1 when a proof failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu_torchrun.json"
PROOFS = (
    "2 machines x 1 GPU == 1 machine x 2 GPUs bitwise; one epoch fewer differs (nccl)",
    "one record with every rank on its CUDA device, no rank problem",
)


def plan(gpus: int) -> tuple[bool, list[str]]:
    """Whether the proofs can run on ``gpus`` devices, and one line per proof skipped."""
    if gpus >= 2:
        return True, []
    return False, [f"{p}: skipped, needs 2+ CUDA devices and this machine has {gpus}" for p in PROOFS]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(work: Path, name: str, *, nnodes: int, epochs: int, env: dict[str, str]) -> dict[str, Any]:
    port = _port()
    args = [
        "model=yolov8n.yaml",
        f"data={ROOT / 'data' / 'demo.yaml'}",
        "imgsz=64",
        "batch=4",
        "nbs=4",
        "workers=0",
        "plots=False",
        "seed=3",
        f"epochs={epochs}",
        f"project={work / 'runs'}",
        f"name={name}",
        "exist_ok=True",
        "device=0" if nnodes == 2 else "device=0,1",
    ]
    procs = []
    for node in range(nnodes):
        node_env = {**env, "CUDA_VISIBLE_DEVICES": str(node)} if nnodes == 2 else dict(env)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node_rank", str(node)]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(port), "--nproc_per_node", str(3 - nnodes)]
        cmd += ["-m", "yolo_det", "train", "--profile", "repro", *args]
        procs.append(subprocess.Popen(cmd, cwd=work, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    codes = []
    for proc in procs:
        proc.communicate(timeout=1800)
        codes.append(proc.returncode)
    record_path = work / "runs" / name / "determinism.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    return {"codes": codes, "record": record}


def run_proofs(epochs: int, algo: str, proto: str, work: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "YOLO_OFFLINE": "1",
        "NCCL_ALGO": algo,
        "NCCL_PROTO": proto,
    }
    runs = {
        "one_machine": _job(work, "one-machine", nnodes=1, epochs=epochs, env=env),
        "two_machines": _job(work, "two-machines", nnodes=2, epochs=epochs, env=env),
        "one_epoch_fewer": _job(work, "one-epoch-fewer", nnodes=2, epochs=epochs - 1, env=env),
    }
    p1, p2 = PROOFS
    proofs: dict[str, list[str]] = {p1: [], p2: []}
    digests = {k: (v["record"].get("weights") or {}).get("ema_fp32_sha256") for k, v in runs.items()}
    for name, run in runs.items():
        if any(runs[name]["codes"]) or run["record"].get("status") != "completed":
            proofs[p1].append(f"{name}: exit codes {run['codes']}, status {run['record'].get('status')}")
    if digests["one_machine"] != digests["two_machines"] or not digests["one_machine"]:
        proofs[p1].append(f"digests differ: {digests}")
    if digests["one_epoch_fewer"] == digests["two_machines"]:
        proofs[p1].append("one epoch fewer gives the same weights: the comparison proves nothing")
    for name in ("one_machine", "two_machines"):
        record = runs[name]["record"]
        ranks = record.get("ranks") or []
        if [r.get("rank") for r in ranks] != [0, 1]:
            proofs[p2].append(f"{name}: ranks {[r.get('rank') for r in ranks]}")
        devices = [str((r.get("place") or {}).get("device")) for r in ranks]
        if not all(d.startswith("cuda") for d in devices):
            proofs[p2].append(f"{name}: devices {devices}")
        if record.get("rank_problems"):
            proofs[p2].append(f"{name}: {record['rank_problems']}")
    return {"proofs": proofs, "digests": digests, "codes": {k: v["codes"] for k, v in runs.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to count as present (default: all visible)")
    parser.add_argument("--nccl-algo", default="Ring")
    parser.add_argument("--nccl-proto", default="Simple")
    a = parser.parse_args(argv)
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = found if a.gpus is None else min(a.gpus, found)
    runnable, skipped = plan(gpus)
    doc: dict[str, Any] = {
        "schema": "yolo-det/gpu-torchrun/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(),
        "gpus": gpus,
        "torch": torch.__version__,
        "skipped": skipped,
    }
    if runnable:
        if a.epochs < 2:
            parser.error("--epochs must be 2 or more (the control trains one epoch fewer)")
        with tempfile.TemporaryDirectory(prefix="yolo-det-gpu-torchrun-") as work:
            doc.update(run_proofs(a.epochs, a.nccl_algo, a.nccl_proto, Path(work)))
            doc["nccl"] = {"NCCL_ALGO": a.nccl_algo, "NCCL_PROTO": a.nccl_proto}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_name(a.out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    tmp.replace(a.out)
    for line in skipped:
        print(line)
    failed = {name: problems for name, problems in doc.get("proofs", {}).items() if problems}
    for name in doc.get("proofs", {}):
        print(f"{'FAIL' if name in failed else 'ok  '} {name}" + (f": {failed[name]}" if name in failed else ""))
    print(f"written: {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
