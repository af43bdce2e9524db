"""Two ranks on the CPU (gloo): the profile, rank seeds and the backward toggle reach every rank.

Each rank trains a YOLOv8n detection model on the demo data for a few steps under DDP, with
Ultralytics' own dataset, DistributedSampler and loss, under the ``balanced`` profile (so backward runs
through the toggle). The data augmentation draws from python's and numpy's RNGs on every rank, so a
rank that is not seeded changes the weights; a rank without the profile shows up in the gathered
states. Negative controls prove the checks notice both.
"""

from __future__ import annotations

import json
import os
import random
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import ROOT, subprocess_env

pytestmark = pytest.mark.slow

WORLD = 2
STEPS = 3


def _worker(rank: int, init_file: str, out_dir: str, mode: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), YOLO_OFFLINE="1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    from yolo_det.core.fileio import atomic_write_text
    from yolo_det.core.record import state_dict_digest
    from yolo_det.core.state import snapshot
    from yolo_det.session.distributed import gather_states, rank_session

    baseline = snapshot()
    result: dict = {"rank": rank}
    session = rank_session("balanced", seed=5)
    try:
        if mode == "no-profile" and rank == 1:
            result.update(_train(rank, session, mode, use_profile=False))
        else:
            with session.run(), session.phase_scope("train"):
                result.update(_train(rank, session, mode, use_profile=True))
                result["states"] = gather_states(session)
        model = result.pop("model")
        result["digest"] = state_dict_digest(model)  # parameters and BatchNorm statistics of this rank
        result["param_digest"] = state_dict_digest(dict(model.named_parameters()))
    except Exception as e:  # reported to the test through the result file
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        result["restored"] = snapshot() == baseline
        # atomic: the launcher ends the other ranks by SIGTERM once one fails, possibly in the middle of this write
        atomic_write_text(Path(out_dir, f"rank{rank}.json"), json.dumps(result, default=str))
        if mode != "fail":
            dist.destroy_process_group()
    if "error" in result:
        raise RuntimeError(result["error"])


def _train(rank: int, session, mode: str, *, use_profile: bool) -> dict:
    import numpy as np
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    from yolo_det.core.backward import ToggleScaler
    from yolo_det.core.seeding import seed_dataloader
    from yolo_det.session.distributed import gather_states
    from yolo_det.tools.demo import demo_data_yaml

    if mode == "no-seed" and rank == 1:  # what a rank that skipped its seeding would do
        random.seed()
        np.random.seed()
    cfg = get_cfg(DEFAULT_CFG, {"imgsz": 64, "batch": 8, "workers": 0, "mosaic": 1.0, "fliplr": 0.5})
    data = check_det_dataset(str(demo_data_yaml()))
    if rank != 0:
        dist.barrier()  # rank 0 writes the label cache first
    dataset = build_yolo_dataset(cfg, data["train"], 4, data, mode="train", stride=32)
    if rank == 0:
        dist.barrier()
    loader = build_dataloader(dataset, batch=4, workers=0, shuffle=True, rank=rank)
    seed_dataloader(loader, session.seed, rank=rank)
    model = DetectionModel("yolov8n.yaml", nc=data["nc"], verbose=False)
    model.args = cfg
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    toggle = use_profile and session.profile.train.backward == "disable"
    scaler = ToggleScaler(torch.amp.GradScaler("cpu", enabled=False), enabled=toggle)
    seen_in_backward: list[bool] = []
    hook = model.model[0].conv.weight.register_hook(
        lambda g: seen_in_backward.append(torch.are_deterministic_algorithms_enabled())
    )
    for step, batch in enumerate(loader):
        if step == STEPS:
            break
        if mode == "fail" and rank == 1 and step == 1:
            raise RuntimeError("rank 1 lost its GPU")
        batch["img"] = batch["img"].float() / 255
        loss, _ = model.loss(batch, ddp(batch["img"]))
        scaler.scale(loss.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    hook.remove()
    out = {
        "model": model,
        "backward_flags": sorted(set(seen_in_backward)),
        "after_flag": torch.are_deterministic_algorithms_enabled(),
    }
    if not use_profile:
        out["states"] = gather_states(_plain_session(rank))
    return out


def _plain_session(rank: int):
    """A rank that never applied the profile still answers the gather (as 'none', with nothing in force)."""
    from yolo_det.session.session import DeterminismSession

    s = DeterminismSession("fast", seed=5, rank=rank, world_size=WORLD)
    s.profile = type(s.profile)(
        name="none", description="", train=s.profile.train, val=s.profile.val, deploy=s.profile.deploy
    )
    return s


def launch(tmp_path: Path, mode: str, tag: str) -> list[dict]:
    out_dir = tmp_path / tag
    out_dir.mkdir()
    init_file = tmp_path / f"{tag}.init"
    try:
        # spawn, not fork: a forked rank cannot run autograd once this process has started autograd's device
        # threads (which earlier tests in the same process may have done), so the ranks start fresh
        mp.start_processes(
            _worker, args=(str(init_file), str(out_dir), mode), nprocs=WORLD, join=True, start_method="spawn"
        )
        error = None
    except Exception as e:
        error = str(e)
    results = [
        json.loads((out_dir / f"rank{r}.json").read_text())
        for r in range(WORLD)
        if (out_dir / f"rank{r}.json").exists()
    ]
    return [dict(r, launch_error=error) for r in results]


def test_two_ranks_twice_give_identical_weights_and_every_rank_runs_the_profile(tmp_path):
    from yolo_det.session.distributed import ranks_consistent

    runs = [launch(tmp_path, "normal", f"run{i}") for i in range(2)]
    for ranks in runs:
        assert [r.get("error") for r in ranks] == [None, None]
        assert len({r["param_digest"] for r in ranks}) == 1  # DDP kept the ranks' weights in step
        assert all(r["restored"] for r in ranks)
        assert all(r["backward_flags"] == [False] and r["after_flag"] for r in ranks)  # the toggle, on each rank
        states = ranks[0]["states"]
        assert [s["rank"] for s in states] == [0, 1]
        assert not ranks_consistent(states)
        assert [s["seeds"]["rng_seed"] for s in states] == [6, 7]  # seed + 1 + rank
        assert all(s["state"]["deterministic_algorithms"] == "strict" for s in states)
    assert [r["digest"] for r in runs[0]] == [r["digest"] for r in runs[1]]  # every rank repeats exactly

    # Negative controls: the same checks notice a rank without its seeding or without the profile.
    unseeded = launch(tmp_path, "no-seed", "noseed")
    assert unseeded[1]["digest"] != runs[0][1]["digest"]
    unprofiled = launch(tmp_path, "no-profile", "noprofile")
    problems = ranks_consistent(unprofiled[0]["states"])
    assert any("rank 1 runs profile 'none'" in p for p in problems)
    assert any("rank 1 differs from rank 0 in" in p and "deterministic_algorithms" in p for p in problems)


def test_a_failing_rank_ends_the_run_with_a_clear_error_and_restores_state(tmp_path):
    ranks = launch(tmp_path, "fail", "fail")
    by_rank = {r["rank"]: r for r in ranks}
    assert by_rank[1]["error"] == "RuntimeError: rank 1 lost its GPU"
    assert "rank 1 lost its GPU" in (by_rank[1]["launch_error"] or "")
    assert all(r["restored"] for r in ranks)  # each rank put its process state back
    if 0 in by_rank:  # rank 0 fails in its next collective, and restores its state too
        assert by_rank[0]["error"] is not None


CHILD = r"""
import json, sys, types
import cloudpickle, torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
payload = cloudpickle.loads(open(sys.argv[1], "rb").read())
ds = TensorDataset(torch.arange(32))
sampler = DistributedSampler(ds, num_replicas=2, rank=1, seed=999)
trainer = types.SimpleNamespace(
    args=types.SimpleNamespace(seed=3), world_size=2, save_dir=__import__("pathlib").Path(sys.argv[1]).parent / "run",
    resume=False, epoch=0, start_epoch=0, epochs=1, batch_size=4, model=torch.nn.Linear(2, 2),
    train_loader=DataLoader(ds, batch_size=4, sampler=sampler, generator=torch.Generator()),
    scaler=torch.amp.GradScaler("cpu", enabled=False), ema=None, device=torch.device("cpu"))  # as BaseTrainer has them
for event in ("on_pretrain_routine_end", "on_train_start"):  # rank > 0 gets no on_pretrain_routine_start
    for callback in payload["callbacks"][event]:
        callback(trainer)
plugins = {getattr(f, "__self__", None) for fns in payload["callbacks"].values() for f in fns} - {None}
print(json.dumps({
    "plugins": len(plugins),
    "initial_seed": torch.initial_seed(),
    "sampler_seed": sampler.seed,
    "deterministic": torch.are_deterministic_algorithms_enabled(),
    "toggle": type(trainer.scaler).__name__,
    "trainer_profile": payload["trainer"].yolo_det_profile.name,
    "ranks": [s["rank"] for s in next(iter(plugins))._ranks],
}))
"""


def test_ultralytics_ddp_payload_applies_the_profile_on_a_worker_rank(tmp_path):
    """Ultralytics' DDP launcher cloudpickles the trainer class and callbacks; a rank-1 worker must apply them."""
    import subprocess
    import sys

    import cloudpickle
    from ultralytics import YOLO

    from yolo_det import attach, trainer_class

    model = YOLO("yolov8n.yaml")
    attach(model, "balanced")
    payload = tmp_path / "ddp.pkl"
    payload.write_bytes(cloudpickle.dumps({"trainer": trainer_class("balanced"), "callbacks": model.callbacks}))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = subprocess_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})  # this checkout's yolo_det
    proc = subprocess.run(
        [sys.executable, str(script), str(payload)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plugins"] == 1
    assert out["initial_seed"] == 3 + 1 + 1  # the rank seed
    assert out["sampler_seed"] == 3  # the same data seed on every rank
    assert out["deterministic"]
    assert out["toggle"] == "ToggleScaler"
    assert out["trainer_profile"] == "balanced"
    assert out["ranks"] == [1]
