#!/usr/bin/env python
"""Multi-GPU proofs with NCCL: the proofs of tests/test_ddp_launcher.py on real GPUs.

usage: python bench/gpu_ddp.py [--out PATH] [--gpus N] [--epochs 2] [--nccl-algo Ring] [--nccl-proto Simple]

On a machine with 2+ CUDA devices it launches Ultralytics' own multi-GPU path (``device=0,1,...``:
``generate_ddp_file`` + ``torch.distributed.run`` + NCCL) through ``bench/ddp_cpu.py``, which changes
nothing when CUDA is present (its callbacks only observe), under a profile based on ``repro`` whose
training sets ``NCCL_ALGO``/``NCCL_PROTO``. The same variables are exported for the launch, since NCCL reads
them when a rank's communicator is created, which can be before the profile's train phase begins on ranks
other than 0. Then it checks:

1. the plugin (profile, swaps, interception) is in force on every rank, with backend ``nccl``;
2. every rank's ``DistributedSampler`` and RNGs follow the user's seed;
3. two launches give bitwise-equal weights (every epoch, every rank); a different seed gives others;
4. rank 0's record lists every rank, has no rank problem, and every rank ran with the profile's NCCL settings;
5. SIGTERM to the launching process leaves a ``terminated`` record and no rank alive;
6. a run stopped after epoch 1 and resumed with as many GPUs ends bitwise equal to the uninterrupted one.

With fewer than 2 GPUs it runs nothing and says what it skipped (exit 0). The result goes to one JSON file
(default bench/results/gpu_ddp.json); exit 1 when a proof failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "gpu_ddp.json"
PROOFS = (
    "plugin in force on every rank (nccl)",
    "samplers and RNGs seeded from the user's seed",
    "two launches bitwise equal; another seed differs",
    "one record with every rank, no rank problem, the profile's NCCL settings on every rank",
    "SIGTERM to the launching process: a terminated record, no rank left",
    "interrupted and resumed with as many GPUs: bitwise equal",
)
PROFILE = """name: ddp-nccl
description: repro with every swap and interception in training, and NCCL's algorithm and protocol fixed
defaults:
  deterministic_algorithms: strict
  cudnn_benchmark: false
  cudnn_deterministic: true
  allow_tf32: false
  fill_uninitialized_memory: false
  backward: keep
  swaps: none
  intercept: false
  env:
    CUBLAS_WORKSPACE_CONFIG: ":4096:8"
train:
  swaps: all
  intercept: true
  env:
    CUBLAS_WORKSPACE_CONFIG: ":4096:8"
    NCCL_ALGO: {algo}
    NCCL_PROTO: {proto}
"""


def plan(gpus: int) -> tuple[bool, list[str]]:
    """Whether the proofs can run with ``gpus`` CUDA devices, and what is skipped (one line each) if not."""
    if gpus >= 2:
        return True, []
    return False, [f"{proof}: skipped, it needs 2+ CUDA devices and this machine has {gpus}" for proof in PROOFS]


def _launch(work: Path, out: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "ddp_cpu.py"), "--out", str(work / out), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"no result (exit {proc.returncode}): {proc.stderr[-2000:]}", "ranks": {}}
    result = json.loads(lines[-1])
    record = Path(result.get("save_dir") or work, "determinism.json")
    result["record_json"] = json.loads(record.read_text()) if result.get("save_dir") and record.exists() else None
    result["stderr_tail"] = proc.stderr[-2000:]
    return result


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_proofs(gpus: int, epochs: int, algo: str, proto: str, work: Path) -> dict[str, Any]:
    """Launch the runs and check the proofs; ``{"proofs": {name: [problems]}, "runs": {...}}``."""
    sys.path.insert(0, str(HERE))
    from ddp_cpu import plugin_problems, seed_problems

    (work / "profile.yaml").write_text(PROFILE.format(algo=algo, proto=proto))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "YOLO_OFFLINE": "1",
        "NCCL_ALGO": algo,
        "NCCL_PROTO": proto,
    }
    devices = ",".join(str(i) for i in range(gpus))
    seed = 5
    base = ["--profile", str(work / "profile.yaml"), "--devices", devices, "--epochs", str(epochs)]
    runs = {
        "a": _launch(work, "a", env, *base, "--seed", str(seed), "--name", "a"),
        "b": _launch(work, "b", env, *base, "--seed", str(seed), "--name", "b"),
        "other": _launch(work, "other", env, *base, "--seed", str(seed + 1), "--name", "other"),
        "stopped": _launch(work, "stopped", env, *base, "--seed", str(seed), "--name", "stopped", "--at", "stop@1"),
        "terminated": _launch(
            work, "terminated", env, *base, "--seed", str(seed), "--name", "terminated", "--at", "sigterm@1"
        ),
    }
    stopped_last = Path(runs["stopped"].get("save_dir") or work, "weights", "last.pt")
    runs["resumed"] = _launch(
        work, "resumed", env, "--resume", str(stopped_last), "--profile", str(work / "profile.yaml")
    )
    a, b, other = runs["a"], runs["b"], runs["other"]
    proofs: dict[str, list[str]] = {name: [] for name in PROOFS}
    p1, p2, p3, p4, p5, p6 = PROOFS
    proofs[p1] = plugin_problems(a, "ddp-nccl", world_size=gpus, backend="nccl") + ([a["error"]] if a["error"] else [])
    proofs[p2] = seed_problems(a, seed) + seed_problems(other, seed + 1)
    for r in a["ranks"]:
        if a["ranks"][r]["epochs"] != b["ranks"].get(r, {}).get("epochs"):
            proofs[p3].append(f"rank {r}: the two launches differ")
        if a["ranks"][r]["epochs"].get("1") == other["ranks"].get(r, {}).get("epochs", {}).get("1"):
            proofs[p3].append(f"rank {r}: another seed gave the same weights")
    record = a.get("record_json") or {}
    if [s.get("rank") for s in record.get("ranks", [])] != list(range(gpus)) or record.get("rank_problems"):
        proofs[p4].append(f"ranks {record.get('ranks')}, problems {record.get('rank_problems')}")
    for r, seen in a["ranks"].items():
        env_seen = seen["start"]["state"]["env"]
        if (env_seen.get("NCCL_ALGO"), env_seen.get("NCCL_PROTO")) != (algo, proto):
            proofs[p4].append(
                f"rank {r} ran with NCCL_ALGO={env_seen.get('NCCL_ALGO')} NCCL_PROTO={env_seen.get('NCCL_PROTO')}"
            )
    term = runs["terminated"]
    if (term.get("record_json") or {}).get("status") != "terminated":
        proofs[p5].append(f"record status {(term.get('record_json') or {}).get('status')}")
    alive = [seen["start"]["pid"] for seen in term["ranks"].values() if _alive(seen["start"]["pid"])]
    if alive:
        proofs[p5].append(f"ranks still running: {alive}")
    resumed = runs["resumed"]
    for r in a["ranks"]:
        final = str(epochs)
        if resumed["ranks"].get(r, {}).get("epochs", {}).get(final) != a["ranks"][r]["epochs"].get(final):
            proofs[p6].append(f"rank {r}: the resumed run differs after epoch {final}")
    return {
        "proofs": proofs,
        "runs": {
            k: {
                "error": v.get("error"),
                "save_dir": v.get("save_dir"),
                "record_status": (v.get("record_json") or {}).get("status"),
            }
            for k, v in runs.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--nccl-algo", default="Ring")
    parser.add_argument("--nccl-proto", default="Simple")
    a = parser.parse_args(argv)
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = found if a.gpus is None else min(a.gpus, found)
    runnable, skipped = plan(gpus)
    doc: dict[str, Any] = {
        "schema": "yolo-det/gpu-ddp/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(),
        "gpus": gpus,
        "torch": torch.__version__,
        "skipped": skipped,
    }
    if runnable:
        if a.epochs < 2:
            parser.error("--epochs must be 2 or more (the resume proof stops after epoch 1)")
        with tempfile.TemporaryDirectory(prefix="yolo-det-gpu-ddp-") as work:
            doc.update(run_proofs(gpus, a.epochs, a.nccl_algo, a.nccl_proto, Path(work)))
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
