"""A resumed YOLOv5 run's opt.yaml and run folder pass the one gate before train() reads or writes anything.

The stand-in for YOLOv5's train() does what the real one does first with its options: YOLOv5's own
``check_dataset(opt.data)`` (which runs a data YAML's Python ``download:`` when a split is missing), then a
write into ``opt.save_dir``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from yolo_det.core import state as _state
from yolo_det.core.errors import ConfigError
from yolo_det.integrations import yolov5 as ydet

SEEN: dict[str, Any] = {}


@ydet.training
def train(hyp: dict[str, Any], opt: argparse.Namespace, device: str, callbacks: Any) -> str:
    from yolov5.utils.general import check_dataset

    SEEN["data"] = check_dataset(opt.data)
    Path(opt.save_dir, "opt.yaml").write_text(yaml.safe_dump(vars(opt)))
    return "done"


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.chdir(tmp_path)  # YOLOv5's check_dataset names a datasets folder here
    saved = _state.snapshot()
    SEEN.clear()
    try:
        yield
    finally:
        _state.restore(saved)


def _run(tmp_path: Path, **stored: Any) -> tuple[argparse.Namespace, Path]:
    """A received YOLOv5 run folder, and the options YOLOv5's resume makes of its opt.yaml."""
    run = tmp_path / "received" / "exp"
    (run / "weights").mkdir(parents=True)
    torch.save({"epoch": 0, "opt": {"epochs": 3}}, run / "weights" / "last.pt")
    options = {"seed": 0, "epochs": 3, "save_dir": str(run), "det_profile": "repro", **stored}
    (run / "opt.yaml").write_text(yaml.safe_dump(options))
    opt = argparse.Namespace(**yaml.safe_load((run / "opt.yaml").read_text()))
    opt.cfg, opt.weights, opt.resume = "", str(run / "weights" / "last.pt"), True  # what YOLOv5's resume does
    return opt, run


def _hostile_data(folder: Path, canary: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.yaml"
    data.write_text(
        yaml.safe_dump(
            {
                "path": str(folder),
                "train": "images/train",
                "val": "images/val",
                "names": {0: "a"},
                "download": f"open({str(canary)!r}, 'w').write('ran')",
            }
        )
    )
    return data


@pytest.mark.parametrize("profile", ["repro", None])
def test_a_download_named_by_opt_yaml_never_runs(tmp_path: Path, profile: str | None) -> None:
    canary = tmp_path / "CANARY"
    data = _hostile_data(tmp_path / "elsewhere", canary)
    opt, run = _run(tmp_path, data=str(data), det_profile=profile)
    with pytest.raises(ConfigError, match="has a 'download:'") as err:
        train({}, opt, "cpu", None)
    assert f"(named in '{run / 'opt.yaml'}')" in str(err.value)
    assert "\n" not in str(err.value)
    assert SEEN == {}
    assert not canary.exists()
    # control: without the gate, YOLOv5's own check_dataset runs the snippet
    train.__wrapped__({}, opt, "cpu", None)
    assert canary.read_text() == "ran"


def test_a_download_named_by_the_checkpoints_opt_never_runs(tmp_path: Path) -> None:
    """Without an opt.yaml YOLOv5 takes the options from the checkpoint's ``opt``: gated the same way."""
    canary = tmp_path / "CANARY"
    data = _hostile_data(tmp_path / "elsewhere", canary)
    opt, run = _run(tmp_path)
    torch.save({"epoch": 0, "opt": {"epochs": 3, "data": str(data)}}, run / "weights" / "last.pt")
    (run / "opt.yaml").unlink()
    with pytest.raises(ConfigError, match="has a 'download:'.*train_args stored in checkpoint"):
        train({}, opt, "cpu", None)
    assert not canary.exists()


def test_a_received_yolov5_run_folder_with_a_link_is_refused_before_writes(tmp_path: Path) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / "images" / split).mkdir(parents=True)
    (data / "data.yaml").write_text(
        yaml.safe_dump({"path": str(data), "train": "images/train", "val": "images/val", "names": {0: "a"}})
    )
    opt, run = _run(tmp_path, data=str(data / "data.yaml"))
    (run / "weights" / "best.pt").symlink_to(mine)
    before = (run / "opt.yaml").read_text()
    with pytest.raises(ConfigError, match=r"symbolic link 'weights/best.pt'"):
        train({}, opt, "cpu", None)
    assert SEEN == {}
    assert mine.read_text() == "mine"
    assert (run / "opt.yaml").read_text() == before
    (run / "weights" / "best.pt").unlink()  # control: the same folder without the link trains
    assert train({}, opt, "cpu", None) == "done"


def test_opt_yaml_cannot_send_the_writes_elsewhere(tmp_path: Path) -> None:
    elsewhere = tmp_path / "yours"
    elsewhere.mkdir()
    opt, run = _run(tmp_path, save_dir=str(elsewhere))
    with pytest.raises(ConfigError, match="writes only into the folder of its checkpoint"):
        train({}, opt, "cpu", None)
    assert list(elsewhere.iterdir()) == []


def test_a_new_run_from_the_command_line_is_yolov5s_own(tmp_path: Path) -> None:
    """Options typed for a new run are the user's: no gate, YOLOv5's behaviour (its downloads too)."""
    canary = tmp_path / "CANARY"
    data = _hostile_data(tmp_path / "mine", canary)
    opt = argparse.Namespace(seed=0, save_dir=str(tmp_path / "new"), det_profile=None, data=str(data), resume=False)
    (tmp_path / "new").mkdir()
    assert train({}, opt, "cpu", None) == "done"
    assert canary.exists()


def _local_data(folder: Path) -> Path:
    for split in ("train", "val"):
        (folder / "images" / split).mkdir(parents=True)
    (folder / "data.yaml").write_text(
        yaml.safe_dump({"path": str(folder), "train": "images/train", "val": "images/val", "names": {0: "a"}})
    )
    return folder


def test_a_stored_disk_cache_never_writes_into_the_dataset(tmp_path: Path) -> None:
    data = _local_data(tmp_path / "data")
    opt, run = _run(tmp_path, data=str(data / "data.yaml"), cache="disk")
    with pytest.raises(ConfigError, match=r"opt\.yaml' stores cache=disk.*folder you did not name.*--cache disk"):
        train({}, opt, "cpu", None)
    assert SEEN == {}
    for cache in (None, "ram"):  # control: a cache in memory, or none, writes nothing into the dataset
        opt, run = _run(tmp_path / str(cache), data=str(data / "data.yaml"), cache=cache)
        assert train({}, opt, "cpu", None) == "done"


SCRIPT = """
import argparse, sys, yaml
from pathlib import Path
from yolo_det.integrations import yolov5 as ydet

@ydet.training
def train(hyp, opt, device, callbacks):
    Path(opt.save_dir, "trained").write_text("yes")
    return "done"

if __name__ == "__main__":
    run = Path(sys.argv[1])
    opt = argparse.Namespace(**yaml.safe_load((run / "opt.yaml").read_text()))
    opt.cfg, opt.weights, opt.resume = "", str(run / "weights" / "last.pt"), True
    train({}, opt, "cpu", None)
"""


def test_yolov5s_script_refuses_in_one_line_with_exit_2(tmp_path: Path) -> None:
    """``python train.py --resume`` over a hostile opt.yaml: one line and exit 2, never a traceback."""
    import subprocess
    import sys

    from helpers import subprocess_env

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    data = _local_data(tmp_path / "data")
    _, run = _run(tmp_path / "bad", data=str(data / "data.yaml"), cache="disk", det_profile=None)
    done = subprocess.run(
        [sys.executable, str(script), str(run)], capture_output=True, text=True, env=subprocess_env(), timeout=600
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("yolo-det: error: ")
    assert "cache=disk" in lines[0]
    assert not (run / "trained").exists()
    _, run = _run(tmp_path / "good", data=str(data / "data.yaml"), cache="ram", det_profile=None)  # control
    done = subprocess.run(
        [sys.executable, str(script), str(run)], capture_output=True, text=True, env=subprocess_env(), timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert (run / "trained").read_text() == "yes"
