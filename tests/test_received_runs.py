"""A received run folder is checked before the run starts: every checkpoint Ultralytics will read in it
(``best.pt`` at the final evaluation included), and every stored argument that would write outside it
(``cache: disk``); the user's own resume, with ``cache=`` named, still caches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from helpers import DEMO, train_stopped_after
from tests.helpers import resumable_checkpoint
from tests.hostile.make_corpus import build
from yolo_det.analysis.gate import check_arguments
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError, ModelError


def _dataset(root: Path, count: int = 8) -> Path:
    """A small detection dataset of the demo images, with its data YAML; returns the YAML."""
    for split, n in (("train", count), ("val", count // 2)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for image in sorted((DEMO / "images" / split).iterdir())[:n]:
            shutil.copy(image, root / "images" / split / image.name)
            label = DEMO / "labels" / split / (image.stem + ".txt")
            shutil.copy(label, root / "labels" / split / label.name)
    names = yaml.safe_load((DEMO.parent / "demo.yaml").read_text())["names"]
    data = root.parent / f"{root.name}.yaml"
    data.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": names}))
    return data


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
def test_a_received_best_pt_is_refused_before_the_run_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "MARKER"
    hostile = build(tmp_path / "corpus", marker)["os-system"]
    run = tmp_path / "received"
    last = resumable_checkpoint(run / "weights" / "last.pt", {"save_dir": str(run)})
    check_arguments({"resume": str(last)})  # control: the run folder without best.pt passes
    resumable_checkpoint(run / "weights" / "best.pt", {})
    check_arguments({"resume": str(last)})  # control: a clean best.pt passes
    shutil.copy(hostile, run / "weights" / "best.pt")
    for args in ({"resume": str(last)}, {"resume": True, "model": str(last)}, {"resume": "True", "model": str(last)}):
        with pytest.raises(ModelError, match=r"best\.pt.*os\.system"):
            check_arguments(args)
    check_arguments({"model": str(last)})  # a fine-tune of last.pt reads no other file of its folder
    before = _tree(run)
    assert main(["train", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "best.pt" in err
    assert "os.system" in err
    assert _tree(run) == before  # nothing trained, nothing written
    assert not marker.exists()


@pytest.mark.slow
def test_a_stored_disk_cache_is_refused_unless_the_user_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _dataset(tmp_path / "mine")
    run = tmp_path / "received"
    last = resumable_checkpoint(run / "weights" / "last.pt", {"save_dir": str(run), "data": str(data), "cache": "disk"})
    for args in ({"resume": str(last)}, {"resume": True, "model": str(last)}, {"resume": str(last), "data": str(data)}):
        with pytest.raises(ConfigError, match=r"stores cache=disk.*folder you did not name.*cache=disk"):
            check_arguments(args)
    for cache in ("disk", False, "ram"):  # the user names it: the user's choice
        check_arguments({"resume": str(last), "cache": cache})
    check_arguments({"model": str(last)})  # a new run from it takes the user's arguments, not the stored ones
    for stored in (False, None, True, "ram"):  # stored values that write nothing outside the run folder
        resumable_checkpoint(last, {"save_dir": str(run), "data": str(data), "cache": stored})
        check_arguments({"resume": str(last)})
    resumable_checkpoint(last, {"save_dir": str(run), "data": str(data), "cache": ["disk"]})
    with pytest.raises(ConfigError, match=r"stores cache=\['disk'\]"):
        check_arguments({"resume": str(last)})
    resumable_checkpoint(last, {"save_dir": str(run), "data": str(data), "cache": "disk"})
    dataset = _tree(tmp_path / "mine")
    assert main(["train", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "cache=disk" in err
    assert _tree(tmp_path / "mine") == dataset


@pytest.mark.slow
def test_a_resume_into_your_own_dataset_with_cache_named_still_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _dataset(tmp_path / "mine")
    images = tmp_path / "mine" / "images"
    common = [f"data={data}", "epochs=2", "imgsz=64", "batch=4", f"project={tmp_path}", "name=run"]
    common += ["plots=false", "workers=0", "device=cpu", "cache=disk"]
    last = train_stopped_after(common, 1)
    cached = sorted(images.rglob("*.npy"))
    assert cached, "the first run caches its images on disk (cache=disk named)"
    for f in cached:
        f.unlink()
    assert main(["train", "--profile", "repro", f"resume={last}"]) == 2  # the stored cache=disk alone: refused
    assert "cache=disk" in capsys.readouterr().err
    assert not list(images.rglob("*.npy"))
    assert main(["train", "--profile", "repro", f"resume={last}", "cache=disk"]) == 0
    assert sorted(images.rglob("*.npy")) == cached
