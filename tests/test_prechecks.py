"""Pre-checks of train arguments, judged as Ultralytics judges them, before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.tools import prechecks
from yolo_det.tools.prechecks.values import _cuda_indices
from yolo_det.tools.prepare import prepare


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1])
def test_seeds_numpy_takes(seed: int) -> None:
    prechecks.check_seed(seed)


@pytest.mark.parametrize("seed", [-1, 2**32, 1180591620717411303424, 1.5, True, "1"])
def test_seeds_out_of_range(seed: object) -> None:
    with pytest.raises(ConfigError, match="out of range"):
        prechecks.check_seed(seed)


def test_the_seed_limit_is_numpys() -> None:
    import numpy as np

    np.random.seed(prechecks.SEED_LIMIT - 1)
    with pytest.raises(ValueError):
        np.random.seed(prechecks.SEED_LIMIT)


@pytest.mark.parametrize(
    ("device", "asks"),
    [
        ("cpu", None),
        ("mps", None),
        (None, None),
        ("", None),
        ("-1", None),
        (0, [0]),
        ("0", [0]),
        ("0,1", [0, 1]),
        ("cuda", []),
        ("cuda:1", [1]),
        ([0, 1], [0, 1]),
        ("[0, 1]", [0, 1]),
        ("CUDA:0", [0]),
    ],
)
def test_which_devices_ask_for_cuda(device: object, asks: list[int] | None) -> None:
    assert _cuda_indices(device) == asks


def test_cuda_devices_are_judged_against_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("0", "cuda:0", 0, "cuda"):
        with pytest.raises(ConfigError, match="no CUDA device here.*use device=cpu"):
            prechecks.check_device(device)
    prechecks.check_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    prechecks.check_device("0,1")
    prechecks.check_device("cuda:1")
    with pytest.raises(ConfigError, match="names CUDA device 2 but this machine has 2"):
        prechecks.check_device("cuda:2")


def test_optimizers_are_ultralytics_own() -> None:
    names = prechecks.optimizer_names()
    assert {"SGD", "AdamW", "auto"} <= set(names)
    for name in ("SGD", "sgd", "adamw", "auto"):
        prechecks.check_optimizer(name)
    with pytest.raises(ConfigError, match="choose from .*SGD.*Did you mean 'SGD'"):
        prechecks.check_optimizer("SDG")


def test_an_optimizer_is_left_to_ultralytics_when_its_list_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from yolo_det.tools.prechecks import values

    monkeypatch.setattr(values.inspect, "getsource", lambda obj: "def build_optimizer(self):\n    pass\n")
    assert prechecks.optimizer_names() == ()
    prechecks.check_optimizer("NewOptimizer")  # a release's new name is never refused from an old list


def test_run_folder(tmp_path: Path) -> None:
    args = {"project": str(tmp_path / "new" / "runs"), "name": 7}
    prechecks.check_run_folder(args)
    assert args["name"] == "7"
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    for bad, match in [
        ({"project": str(tmp_path / "file")}, "is not a folder"),
        ({"project": str(tmp_path / "file" / "sub")}, "which is not a folder"),
        ({"name": [1, 2]}, "not a folder name"),
        ({"name": True}, "not a folder name"),
        ({"project": {"a": 1}}, "not a folder name"),
        ({"name": " "}, "non-empty"),
        ({"project": str(tmp_path), "name": "file"}, "exists and is not a folder"),
    ]:
        with pytest.raises(ConfigError, match=match):
            prechecks.check_run_folder(dict(bad))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_project(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="not writable"):
            prechecks.check_run_folder({"project": str(ro / "runs")})
    finally:
        ro.chmod(0o755)


def _data(tmp_path: Path, **cfg: object) -> Path:
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump({"names": ["a"], **cfg}))
    return path


def test_data_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ultralytics.utils

    monkeypatch.setattr(ultralytics.utils, "DATASETS_DIR", tmp_path / "datasets")
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "images" / "val").mkdir(parents=True)
    with pytest.raises(ConfigError, match="hold no image files"):  # Ultralytics would find no images
        prechecks.check_data(str(_data(tmp_path, path=str(tmp_path), train="images/train", val="images/val")))
    (tmp_path / "images" / "train" / "a.jpg").write_bytes(b"")
    (tmp_path / "images" / "val" / "sub").mkdir()
    (tmp_path / "images" / "val" / "sub" / "b.PNG").write_bytes(b"")  # searched recursively, any case
    prechecks.check_data(str(_data(tmp_path, path=str(tmp_path), train="images/train", val="images/val")))
    prechecks.check_data(str(_data(tmp_path, train="images/train", val=["images/val", "images/train"])))
    prechecks.check_data(str(_data(tmp_path, train="images/train", validation="images/val")))
    (tmp_path / "ds").mkdir()
    prechecks.check_data(str(_data(tmp_path, path=str(tmp_path / "ds"), train="../images/train", val="../images/val")))
    with pytest.raises(ConfigError, match="the val images .* do not exist"):
        prechecks.check_data(str(_data(tmp_path, train="images/train", val="images/nope")))
    with pytest.raises(ConfigError, match="does not download datasets"):
        prechecks.check_data(
            str(
                _data(
                    tmp_path,
                    path="coco",
                    train="images/train",
                    val="images/val",
                    download="import os; os.system('touch pwned')",
                )
            )
        )
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ConfigError, match="needs 'train:' and 'val:'"):
        prechecks.check_data(str(_data(tmp_path, train="images/train")))
    # a dataset name Ultralytics ships, not downloaded here
    with pytest.raises(ConfigError, match="dataset 'coco8.yaml' is not here"):
        prechecks.check_data("coco8.yaml")


def test_train_model_yaml_with_an_unknown_module(tmp_path: Path) -> None:
    from yolo_det.core.errors import ModelError

    text = (Path(__file__).resolve().parents[1] / "data" / "models" / "bicubic-up.yaml").read_text()
    (tmp_path / "ok.yaml").write_text(text)
    (tmp_path / "bad.yaml").write_text(text.replace("C2f, [96]]", "C2ff, [96]]", 1))
    prepare("repro", [f"model={tmp_path / 'ok.yaml'}"])  # yolo-det's own layer names resolve
    with pytest.raises(ModelError, match=r"bad.yaml:\d+: unknown module 'C2ff'.*Did you mean 'C2f'"):
        prepare("repro", [f"model={tmp_path / 'bad.yaml'}"])


@pytest.mark.slow
def test_scientific_notation_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lr0=1e-3 and weight_decay=5e-4 are numbers, as Ultralytics' own command line reads them, and train."""
    _, args = prepare("repro", ["lr0=1e-3", "weight_decay=5e-4"])
    assert args["lr0"] == 0.001
    assert args["weight_decay"] == 0.0005
    code = main(
        [
            "train",
            "lr0=1e-3",
            "weight_decay=5e-4",
            "optimizer=SGD",
            "epochs=1",
            "imgsz=64",
            f"project={tmp_path}",
            "name=sci",
            "plots=false",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    saved = yaml.safe_load((tmp_path / "sci" / "args.yaml").read_text())
    assert saved["lr0"] == 0.001
    assert saved["weight_decay"] == 0.0005
    assert "weights digest:" in out


def test_allow_download_opts_in_for_a_missing_split_and_the_refusal_names_it(tmp_path: Path) -> None:
    from yolo_det.analysis.gate import allow_downloads

    data = str(_data(tmp_path, path="coco", train="images/train", val="images/val", download="print(1)"))
    with pytest.raises(ConfigError, match=r"not here .* pass --allow-download if you trust this file"):
        prechecks.check_data(data)
    with allow_downloads():  # the user's opt-in: Ultralytics runs the download, the pre-check lets it
        assert prechecks.check_data(data)["download"] == "print(1)"
    with allow_downloads(), pytest.raises(ConfigError, match="do not exist"):  # control: no download: still refused
        prechecks.check_data(str(_data(tmp_path, path="coco", train="images/train", val="images/val")))


def test_a_classify_folder_whose_data_yaml_holds_only_download_is_accepted(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    folder = tmp_path / "flowers"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (folder / split / c).mkdir(parents=True)
            cv2.imwrite(str(folder / split / c / "x.png"), np.zeros((8, 8, 3), np.uint8))
    (folder / "data.yaml").write_text("download: https://example.invalid/flowers.zip\n")
    _, args = prepare("repro", ["model=yolov8n-cls.yaml", f"data={folder}"])
    assert Path(args["data"]) == folder
    assert (folder / "data.yaml").read_text() == "download: https://example.invalid/flowers.zip\n"  # unchanged
