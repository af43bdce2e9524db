"""Tests of yolo_det.integrations.yolov5: the functions a patched YOLOv5 tree calls.

The first part drives the functions from a stand-in for YOLOv5's train()/val.run()/detect.run() with the
same call sites as the patched scripts; the last part trains the real yolov5 package (a patched copy of
the installed one) for one epoch on the demo data, offline, on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers import ROOT
from yolo_det.cli import main
from yolo_det.core import state as _state
from yolo_det.core.errors import ConfigError, ProfileError, YoloDetError
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.seeding import rank_seed
from yolo_det.fixes.data_invariance import KeyedLoader
from yolo_det.integrations import yolov5 as ydet
from yolo_det.tools.demo import demo_data_yaml
from yolov5_helpers import copy_yolov5

# ---------------------------------------------------------------------------------------------------------
# a stand-in for a patched YOLOv5 module: the same names and call sites as train.py, val.py and detect.py

RANK = -1
CONFIG_DIR: Path | None = None  # YOLOv5's utils.general.CONFIG_DIR (where check_font looks for Arial.ttf)
YOLOV5_INIT_SEEDS_CALLS: list[tuple[int, bool]] = []
SEEN: dict[str, Any] = {}


def _mode() -> str:
    return _state.snapshot().mode


def init_seeds(seed: int = 0, deterministic: bool = False) -> None:
    """What YOLOv5's utils.general.init_seeds does that matters here."""
    YOLOV5_INIT_SEEDS_CALLS.append((seed, deterministic))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


@ydet.validation
def val_run(model: torch.nn.Module | None = None) -> float:
    SEEN.setdefault("val", []).append(_mode())
    return 0.0


@ydet.deployment
def detect_run(**kwargs: Any) -> dict[str, Any]:
    SEEN.setdefault("deploy", []).append(_mode())
    if kwargs.get("fail"):
        raise RuntimeError("deploy failed")
    return kwargs


@ydet.training
def train(hyp: dict[str, Any], opt: argparse.Namespace, device: str, callbacks: Any) -> str:
    ydet.init_seeds(init_seeds, opt.seed + 1 + RANK, deterministic=True)
    SEEN["run"] = ydet.current_run()
    SEEN["first_rand"] = torch.rand(4)
    model = torch.nn.Linear(4, 2)
    SEEN["built"] = model
    model = ydet.prepare_model(model)
    SEEN["model"] = model
    model.weight.register_hook(lambda g: SEEN.setdefault("backward", []).append(_mode()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(enabled=False)
    for _ in range(3):
        SEEN.setdefault("forward", []).append(_mode())
        loss = model(torch.randn(8, 4)).pow(2).mean()
        ydet.backward(scaler.scale(loss))
        SEEN.setdefault("after_backward", []).append(_mode())
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    if getattr(opt, "fail", False):
        raise RuntimeError("out of memory in epoch 0")
    val_run(model=model)
    weights = Path(opt.save_dir) / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model, "epoch": 0}, weights / "last.pt")
    return "done"


@ydet.training
def train_on_a_loader(hyp: dict[str, Any], opt: argparse.Namespace, device: str, callbacks: Any) -> Any:
    """train() around its training loader: the patched line (or, in a tree patched by an earlier yolo-det, YOLOv5's
    own call), YOLOv5's callbacks at each epoch and batch."""
    ydet.prepare_model(torch.nn.Linear(1, 1))
    data = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(8, 1))

    def create_dataloader(batch_size: int) -> tuple[Any, Any]:
        return torch.utils.data.DataLoader(data, batch_size, shuffle=True, generator=torch.Generator()), data

    if not opt.no_start_epoch:
        start_epoch = 0
    if opt.old_patch:
        train_loader, dataset = create_dataloader(4)
    else:
        train_loader, dataset = ydet.train_loader(create_dataloader)(4)
    for _epoch in range(start_epoch, 2):
        callbacks.run("on_train_epoch_start")
        for (imgs,) in train_loader:
            targets = imgs.sum(1)  # noqa: F841 - a local of train(), as YOLOv5's batch loop has it
            callbacks.run("on_train_batch_start")
    return train_loader


def test_the_training_loader_is_built_by_the_patched_line(tmp_path: Path) -> None:
    from yolov5.utils.callbacks import Callbacks

    def run(profile: str | None, **extra: Any) -> Any:
        opt = _opt(tmp_path, profile, **{"no_start_epoch": False, "old_patch": False, **extra})
        return train_on_a_loader({}, opt, "cpu", Callbacks())

    plain = run(None)
    assert type(plain) is torch.utils.data.DataLoader  # without a profile: YOLOv5's own loader
    loader = run("repro")
    assert isinstance(loader, KeyedLoader)  # built by the patched line under repro's data_invariance
    assert loader.keys.epoch == 2  # two passes, epochs 0 and 1
    stream = _record(tmp_path)["data_stream"]
    assert (stream["mode"], stream["fingerprint_batches"], stream["fingerprint_epoch"]) == ("keyed", 2, 0)
    assert re.fullmatch(r"[0-9a-f]{64}", stream["fingerprint"])
    with pytest.raises(ConfigError, match=r"^train\(\) trains on a loader yolo-det did not build .*patch-yolov5 DIR$"):
        run("repro", old_patch=True)
    assert _record(tmp_path)["status"] == "failed"
    with pytest.raises(ConfigError, match="no integer start_epoch"):
        run("repro", no_start_epoch=True)


def _opt(tmp_path: Path, profile: str | None, **extra: Any) -> argparse.Namespace:
    return argparse.Namespace(
        seed=3, save_dir=str(tmp_path / "run"), det_profile=profile, epochs=1, batch_size=8, weights="", **extra
    )


def _record(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / RECORD_NAME).read_text())


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Start each test from determinism off, and give the process state back afterwards."""
    saved = _state.snapshot()
    monkeypatch.setattr(sys.modules[__name__], "CONFIG_DIR", tmp_path / "yolov5-config")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    torch.use_deterministic_algorithms(False)
    YOLOV5_INIT_SEEDS_CALLS.clear()
    SEEN.clear()
    try:
        yield
        assert ydet.current_run() is None
    finally:
        _state.restore(saved)


# ---------------------------------------------------------------------------------------------------------
# training


def test_without_a_profile_yolov5_runs_as_before(tmp_path: Path) -> None:
    assert train({}, _opt(tmp_path, None), "cpu", None) == "done"
    assert YOLOV5_INIT_SEEDS_CALLS == [(3, True)]  # opt.seed + 1 + RANK, as YOLOv5 calls it
    torch.manual_seed(3)
    assert torch.equal(SEEN["first_rand"], torch.rand(4))
    assert SEEN["run"] is None
    assert SEEN["model"] is SEEN["built"]
    assert set(SEEN["backward"]) == {"strict"}  # YOLOv5's own init_seeds switched strict mode on ...
    assert _mode() == "strict"  # ... and, as plain YOLOv5, nothing gives the state back
    assert not (tmp_path / "run" / RECORD_NAME).exists()
    assert not (tmp_path / "yolov5-config").exists()


def test_repro_trains_strict_restores_and_records(tmp_path: Path) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own setting, to be given back
    before = _state.snapshot()
    assert train({}, _opt(tmp_path, "repro"), "cpu", None) == "done"
    assert _state.snapshot() == before
    assert YOLOV5_INIT_SEEDS_CALLS == []
    assert SEEN["forward"] == SEEN["backward"] == SEEN["after_backward"] == ["strict"] * 3
    assert SEEN["val"] == ["strict"]
    run = SEEN["run"]
    assert isinstance(run, ydet.YOLOv5Run)
    assert run.model is SEEN["built"]
    assert SEEN["model"] is SEEN["built"]
    torch.manual_seed(rank_seed(3, 0))
    assert torch.equal(SEEN["first_rand"], torch.rand(4))

    record = _record(tmp_path)
    assert run.record_path == tmp_path / "run" / RECORD_NAME
    assert record["status"] == "completed"
    assert record["framework"] == "yolov5"
    assert record["profile"]["name"] == "repro"
    assert record["state_before"]["deterministic_algorithms"] == "warn"
    assert record["state_at_train_start"]["deterministic_algorithms"] == "strict"
    assert record["state_at_train_start"]["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert record["state_during_backward"]["deterministic_algorithms"] == "strict"
    assert record["backward"] == {"calls": 3, "modes_seen": ["strict"], "disabled": False}
    assert record["backward_toggles"] == 0
    assert record["seeds"]["seed"] == 3
    assert record["seeds"]["rng_seed"] == rank_seed(3, 0)
    last = tmp_path / "run" / "weights" / "last.pt"
    assert record["weights"]["file"] == str(last)
    assert record["weights"]["sha256"] == checkpoint_digest(last)
    assert {f["file"]: f["sha256"] for f in record["weights"]["files"]}[str(last)] == checkpoint_digest(last)
    assert record["model"]["class"] == "torch.nn.modules.linear.Linear"
    assert record["model"]["parameters"] == 10
    assert record["run"]["det_profile"] == "repro"
    assert record["run"]["save_dir"] == str(tmp_path / "run")
    assert record["run"]["script"] == __file__
    assert [(e["event"], e["phase"]) for e in record["phase_events"]] == [
        ("enter", "train"),
        ("enter", "val"),
        ("exit", "val"),
    ]
    assert "torch" in record["environment"]


def test_balanced_turns_determinism_off_only_during_backward(tmp_path: Path) -> None:
    train({}, _opt(tmp_path, "balanced"), "cpu", None)
    assert SEEN["forward"] == ["strict"] * 3
    assert SEEN["backward"] == ["off"] * 3  # observed by autograd while the gradient is computed
    assert SEEN["after_backward"] == ["strict"] * 3
    assert SEEN["val"] == ["strict"]
    record = _record(tmp_path)
    assert record["backward"] == {"calls": 3, "modes_seen": ["off"], "disabled": True}
    assert record["backward_toggles"] == 3
    assert record["state_at_train_start"]["deterministic_algorithms"] == "strict"
    assert record["state_during_backward"]["deterministic_algorithms"] == "off"
    assert _mode() == "off"


def test_fast_trains_without_determinism_but_validates_strict(tmp_path: Path) -> None:
    train({}, _opt(tmp_path, "fast"), "cpu", None)
    assert set(SEEN["forward"]) == set(SEEN["backward"]) == {"off"}
    assert SEEN["val"] == ["strict"]  # YOLOv5's init_seeds did not switch strict mode on behind the profile
    assert _mode() == "off"


def test_a_failing_run_restores_the_state_and_records_the_failure(tmp_path: Path) -> None:
    before = _state.snapshot()
    with pytest.raises(RuntimeError, match="out of memory"):
        train({}, _opt(tmp_path, "repro", fail=True), "cpu", None)
    assert _state.snapshot() == before
    record = _record(tmp_path)
    assert record["status"] == "failed"
    assert record["error"] == {"type": "RuntimeError", "message": "out of memory in epoch 0"}
    assert record["weights"] == {"files": []}


def test_each_rank_seeds_itself_and_only_rank_0_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    train({}, _opt(tmp_path, "repro"), "cpu", None)
    torch.manual_seed(rank_seed(3, 1))
    assert torch.equal(SEEN["first_rand"], torch.rand(4))
    assert SEEN["run"].session.seeds()["rank_rng_seeds"] == [rank_seed(3, 0), rank_seed(3, 1)]
    assert not (tmp_path / "run" / RECORD_NAME).exists()


def test_the_run_provides_yolov5s_font(tmp_path: Path) -> None:
    train({}, _opt(tmp_path, "repro"), "cpu", None)
    font = tmp_path / "yolov5-config" / "Arial.ttf"
    assert font.is_file()
    assert font.stat().st_size > 10_000
    assert _record(tmp_path)["fonts"] == [str(font)]


def test_an_unknown_profile_fails_before_anything_runs(tmp_path: Path) -> None:
    before = _state.snapshot()
    with pytest.raises(ProfileError, match="Did you mean 'repro'"):
        train({}, _opt(tmp_path, "repo"), "cpu", None)
    assert _state.snapshot() == before
    assert SEEN == {}
    assert not (tmp_path / "run").exists()


def test_a_negative_seed_is_refused(tmp_path: Path) -> None:
    opt = _opt(tmp_path, "repro")
    opt.seed = -1
    with pytest.raises(ConfigError, match="--seed must be a non-negative integer"):
        train({}, opt, "cpu", None)
    assert SEEN == {}
    assert _mode() == "off"


# ---------------------------------------------------------------------------------------------------------
# the option, validation and deployment


def test_add_argument(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="train.py")
    ydet.add_argument(parser)
    assert parser.parse_args([]).det_profile is None
    assert parser.parse_args(["--det-profile", "balanced"]).det_profile == "balanced"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--det-profile", "repo"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("train.py: error: argument --det-profile: unknown profile 'repo'")
    assert err.endswith("Did you mean 'repro'?")
    with_default = argparse.ArgumentParser()
    ydet.add_argument(with_default, default="repro")
    assert with_default.parse_args([]).det_profile == "repro"
    with pytest.raises(ProfileError):
        ydet.add_argument(argparse.ArgumentParser(), default="nope")


def test_deployment_runs_under_the_deploy_phase_and_restores() -> None:
    assert detect_run(weights="a.pt") == {"weights": "a.pt"}
    assert detect_run(weights="a.pt", det_profile=None) == {"weights": "a.pt"}  # the option's default
    assert SEEN["deploy"] == ["off", "off"]
    assert detect_run(weights="a.pt", det_profile="fast") == {"weights": "a.pt"}  # not passed on to run()
    assert SEEN["deploy"][-1] == "strict"
    assert _mode() == "off"
    with pytest.raises(RuntimeError, match="deploy failed"):
        detect_run(fail=True, det_profile="repro")
    assert _mode() == "off"
    with pytest.raises(YoloDetError, match="--det-profile: unknown profile 'repo'"):
        detect_run(det_profile="repo")


def test_validation_alone_and_inside_a_run(tmp_path: Path) -> None:
    val_run(model=None)
    val_run(model=None, det_profile="repro")
    assert SEEN["val"] == ["off", "strict"]
    assert _mode() == "off"
    profile_file = tmp_path / "loose-val.yaml"
    profile_file.write_text("extends: repro\nval:\n  deterministic_algorithms: warn\n")
    train({}, _opt(tmp_path, str(profile_file)), "cpu", None)
    assert SEEN["val"][-1] == "warn"
    assert set(SEEN["forward"]) == {"strict"}


def test_backward_and_prepare_model_outside_a_run_are_plain() -> None:
    model = torch.nn.Linear(3, 1)
    assert ydet.prepare_model(model) is model
    x = torch.randn(5, 3)
    ydet.backward(model(x).sum())
    grad = model.weight.grad.clone()
    model.zero_grad()
    model(x).sum().backward()
    assert torch.equal(grad, model.weight.grad)


# ---------------------------------------------------------------------------------------------------------
# the real yolov5 package: patched copy, one epoch on the demo data, offline, CPU


_IMAGES = {"train": 16, "val": 8}
_BATCH = 8


@pytest.fixture(scope="module")
def yolov5_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a patched copy of the installed yolov5 package, the demo data and a tiny model."""
    root = tmp_path_factory.mktemp("yolov5-run")
    package = copy_yolov5(root / "yolov5", runnable=True)
    assert main(["patch-yolov5", str(package), "--no-backup"]) == 0

    demo_yaml = demo_data_yaml()
    demo = yaml.safe_load(demo_yaml.read_text())
    data = root / "demo"
    for split in ("train", "val"):
        images = (demo_yaml.parent / demo[split]).resolve()
        shutil.copytree(images, data / "images" / split)
        shutil.copytree(images.parent.parent / "labels" / split, data / "labels" / split)
    for split, count in _IMAGES.items():  # a list file with the first images keeps the epoch short
        files = sorted((data / "images" / split).iterdir())[:count]
        (data / f"{split}.txt").write_text("".join(f"{f}\n" for f in files))
    names = demo["names"]
    (root / "data.yaml").write_text(
        yaml.safe_dump(
            {
                "path": str(data),
                "train": "train.txt",
                "val": "val.txt",
                "nc": len(names),
                "names": [names[i] for i in sorted(names)],
            }
        )
    )
    model = (package / "models" / "yolov5n.yaml").read_text(encoding="utf-8")
    model = re.sub(r"^nc: \d+", f"nc: {len(names)}", model, flags=re.M)
    model = re.sub(r"^width_multiple: [\d.]+", "width_multiple: 0.125", model, flags=re.M)
    (root / "tiny.yaml").write_text(model)
    return root


def _offline_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]),  # the patched copy and this checkout's yolo_det
            "YOLOV5_CONFIG_DIR": str(root / "yolov5-config"),  # empty: the run must provide Arial.ttf itself
            "YOLO_CONFIG_DIR": str(root / "ultralytics-config"),
            "ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS": "1",  # yolov5's main() would check (and pip install) requirements
            "YOLOv5_AUTOINSTALL": "false",  # the same for a repository clone
            "HF_HUB_OFFLINE": "1",  # train() asks the Hugging Face hub about --weights
            "WANDB_MODE": "disabled",
            "MPLBACKEND": "Agg",
            "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",  # yolov5 7.0 unpickles its checkpoints with torch.load defaults
        }
    )
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


_DRIVER = """
import json, sys
import torch
from yolo_det.core.state import snapshot

torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own setting, to be given back
before = snapshot().to_dict()
from yolov5 import detect, train

opt = train.run(data="data.yaml", cfg="tiny.yaml", weights="", imgsz=64, batch_size=BATCH, epochs=1, device="cpu",
                workers=0, noplots=True, project="runs", name="repro", exist_ok=True, det_profile="repro")
after_train = snapshot().to_dict()
modes = []
hook = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: modes.append(
    (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())))
detect.run(weights=f"{opt.save_dir}/weights/last.pt", source="demo/images/val", imgsz=(64, 64), device="cpu",
           project="runs", name="detect", exist_ok=True, nosave=True, det_profile="repro")
hook.remove()
after_detect = snapshot().to_dict()

sys.argv = ["train.py", "--det-profile", "repo"]  # the patched command line rejects an unknown profile
try:
    train.parse_opt()
    code = 0
except SystemExit as e:
    code = e.code
print("RESULT " + json.dumps({"save_dir": str(opt.save_dir), "before": before, "after_train": after_train,
                              "after_detect": after_detect, "detect_modes": sorted(set(modes)), "bad_profile": code}))
"""


@pytest.mark.slow
def test_patched_yolov5_trains_one_epoch_under_repro_offline(yolov5_copy: Path) -> None:
    root = yolov5_copy
    (root / "driver.py").write_text(textwrap.dedent(_DRIVER).replace("BATCH", str(_BATCH)))
    proc = subprocess.run(
        [sys.executable, "driver.py"], cwd=root, env=_offline_env(root), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result["after_train"] == result["before"]  # plain YOLOv5 would leave strict mode on
    assert result["after_detect"] == result["before"]
    assert result["detect_modes"] == [[True, False]]  # every forward of detect.py ran under strict mode
    assert result["bad_profile"] == 2
    assert "argument --det-profile: unknown profile 'repo'" in proc.stderr
    assert "Did you mean 'repro'?" in proc.stderr

    save_dir = root / "runs" / "repro"
    assert (root / result["save_dir"]).resolve() == save_dir.resolve()
    record = json.loads((save_dir / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["framework"] == "yolov5"
    assert record["profile"]["name"] == "repro"
    assert record["state_before"]["deterministic_algorithms"] == "warn"
    assert record["state_at_train_start"]["deterministic_algorithms"] == "strict"
    assert record["state_at_train_start"]["cudnn_deterministic"] is True
    assert record["state_during_backward"]["deterministic_algorithms"] == "strict"
    calls = -(-_IMAGES["train"] // _BATCH)  # one backward pass per batch
    assert record["backward"] == {"calls": calls, "modes_seen": ["strict"], "disabled": False}
    assert record["seeds"]["rng_seed"] == rank_seed(0, 0)
    assert record["model"]["class"] == "yolov5.models.yolo.DetectionModel"
    phases = [(e["event"], e["phase"]) for e in record["phase_events"]]
    assert phases[0] == ("enter", "train")
    assert phases.count(("enter", "val")) == 2
    assert record["weights"]["file"] == str(save_dir / "weights" / "last.pt")
    assert re.fullmatch(r"[0-9a-f]{64}", record["weights"]["sha256"])
    assert record["environment"]["yolov5"] is not None
    font = root / "yolov5-config" / "Arial.ttf"
    assert record["fonts"] == [str(font)]
    assert font.is_file()
    assert record["run"]["det_profile"] == "repro"
    assert record["run"]["imgsz"] == 64
    stream = record["data_stream"]  # the patched train.py handed its loader over: keyed, fingerprinted
    assert (stream["mode"], stream["workers"], stream["seed"]) == ("keyed", 0, 0)
    assert re.fullmatch(r"[0-9a-f]{64}", stream["fingerprint"])
    assert stream["fingerprint_batches"] == 2
    assert re.fullmatch(r"[0-9a-f]{64}", stream["dataset"])
    assert stream["augment"]["mosaic"] == 1.0


_CBAM_DRIVER = """
import json, sys
import torch
import yolov5.models.yolo as yolo
from yolo_det.analysis.emulator import emulate_cuda_alerts
from yolo_det.analysis.zoo import CBAMMax

yolo.CBAMMax = CBAMMax  # how a YOLOv5 fork adds a block: a name its parse_model can eval
from yolov5 import train

kwargs = dict(data="data.yaml", cfg="cbam.yaml", weights="", imgsz=64, batch_size=BATCH, epochs=1, device="cpu",
              workers=0, noplots=True, noval=True, project="runs", name=sys.argv[1], exist_ok=True)
if sys.argv[1] != "plain":
    kwargs["det_profile"] = sys.argv[1]
else:  # unpatched YOLOv5 would download Arial.ttf: put one where it looks, as an offline user must
    import os
    from yolo_det.integrations.fonts import ensure_local_font
    ensure_local_font([os.environ["YOLOV5_CONFIG_DIR"]])
try:
    with emulate_cuda_alerts():
        opt = train.run(**kwargs)
    print("RESULT " + json.dumps({"ok": True, "save_dir": str(opt.save_dir)}))
except RuntimeError as e:
    print("RESULT " + json.dumps({"ok": False, "error": str(e)}))
"""


@pytest.fixture(scope="module")
def plain_yolov5_copy(yolov5_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unpatched copy of the installed package beside the patched one's data and model files."""
    root = tmp_path_factory.mktemp("yolov5-plain")
    copy_yolov5(root / "yolov5", runnable=True)
    for name in ("demo", "data.yaml"):
        src = yolov5_copy / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    return root


def _cbam_model(root: Path, tiny: str) -> None:
    """The tiny model with the backbone's last C3 (channel-preserving) replaced by a CBAM block with a max-pool
    branch, written to ``root/cbam.yaml``."""
    lines = tiny.splitlines()
    c3 = [i for i, line in enumerate(lines) if "C3, [1024]" in line]
    assert c3, "yolov5n.yaml changed: no C3 [1024] layer"
    lines[c3[0]] = lines[c3[0]].split("[")[0] + "[-1, 1, CBAMMax, [128]],  # 8 (1024 * width 0.125)"
    (root / "cbam.yaml").write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_cbam_max_under_the_cuda_emulator(yolov5_copy: Path, plain_yolov5_copy: Path) -> None:
    """Unpatched YOLOv5 crashes with CUDA's message; patched with repro trains (swapped); balanced trains with the
    flag off only during backward."""
    tiny = (yolov5_copy / "tiny.yaml").read_text()
    results = {}
    for root, mode in ((plain_yolov5_copy, "plain"), (yolov5_copy, "repro"), (yolov5_copy, "balanced")):
        _cbam_model(root, tiny)
        (root / "cbam_driver.py").write_text(textwrap.dedent(_CBAM_DRIVER).replace("BATCH", str(_BATCH)))
        proc = subprocess.run(
            [sys.executable, "cbam_driver.py", mode],
            cwd=root,
            env=_offline_env(root),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert "RESULT " in proc.stdout, proc.stderr[-3000:]
        results[mode] = json.loads(proc.stdout.split("RESULT ", 1)[1])

    assert not results["plain"]["ok"]
    assert results["plain"]["error"].startswith(
        "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, but you set "
        "'torch.use_deterministic_algorithms(True)'"
    )
    for mode in ("repro", "balanced"):
        assert results[mode]["ok"], results[mode]
    repro = json.loads((yolov5_copy / "runs" / "repro" / RECORD_NAME).read_text())
    assert [s["target"] for s in repro["swaps"]] == ["DetAdaptiveMaxPool2d"]
    assert repro["swaps"][0]["path"].endswith(".max_pool")
    assert repro["backward"]["modes_seen"] == ["strict"]
    balanced = json.loads((yolov5_copy / "runs" / "balanced" / RECORD_NAME).read_text())
    assert balanced["swaps"] == []
    assert balanced["state_at_train_start"]["deterministic_algorithms"] == "strict"
    assert balanced["backward"]["modes_seen"] == ["off"]
    assert balanced["backward"]["disabled"]
