"""A received run folder is checked before the run starts: every checkpoint Ultralytics will read in it
(``best.pt`` at the final evaluation included), and every stored argument that would write outside it
(``cache: disk``, a stored dataset without its label caches) or run code there (a label cache is a pickle);
the user's own resume, with ``cache=`` named, still caches, and one into a dataset whose caches it wrote trains."""

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
    for cache in ("disk", False, "ram"):  # the user names it (and the dataset, which has no label cache yet)
        check_arguments({"resume": str(last), "cache": cache, "data": str(data)})
    check_arguments({"model": str(last)})  # a new run from it takes the user's arguments, not the stored ones
    for stored in (False, None, True, "ram"):  # stored values that write nothing outside the run folder
        resumable_checkpoint(last, {"save_dir": str(run), "data": str(data), "cache": stored})
        check_arguments({"resume": str(last), "data": str(data)})
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


class _Payload:
    """Loading its pickle runs a command (os.system), as a sender's label cache could."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (self.command,))


@pytest.mark.slow
def test_a_stored_dataset_is_read_only_through_label_caches_that_exist_and_run_no_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume takes ``data`` from its checkpoint unless the user names ``data=`` (Ultralytics' ``check_resume``):
    that dataset must already hold the label caches Ultralytics reads (a missing one it writes there), each one
    loading without running code (Ultralytics unpickles it with ``allow_pickle``)."""
    import os

    import numpy as np

    data = _dataset(tmp_path / "mine")
    common = [f"data={data}", "epochs=2", "imgsz=64", "batch=4", f"project={tmp_path}", "name=run"]
    last = train_stopped_after([*common, "plots=false", "workers=0", "device=cpu"], 1)
    caches = sorted((tmp_path / "mine" / "labels").glob("*.cache"))
    assert [c.name for c in caches] == ["train.cache", "val.cache"]  # Ultralytics wrote them in the first run
    check_arguments({"resume": str(last)})  # they exist and hold label data only: the resume reads them as is
    mine = {c: c.read_bytes() for c in caches}

    for c in caches:
        c.unlink()
    dataset, folder = _tree(tmp_path / "mine"), _tree(last.parent.parent)
    for args in ({"resume": str(last)}, {"resume": True, "model": str(last)}):
        with pytest.raises(ConfigError, match=r"stores data=.*no label cache .*train\.cache.*folder you did not name"):
            check_arguments(args)
    check_arguments({"resume": str(last), "data": str(data)})  # the user names the dataset: the user's choice
    assert main(["train", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert f"data={data}" in err
    assert str(tmp_path / "mine" / "labels") in err
    assert _tree(tmp_path / "mine") == dataset  # refused before anything was written
    assert _tree(last.parent.parent) == folder

    marker = tmp_path / "MARKER"
    for c in caches:  # a sender's label caches: pickles that run a command when loaded
        payload = {"version": "1", "hash": "", "labels": [_Payload(f"touch {marker}")]}
        np.save(str(c), np.array(payload, dtype=object), allow_pickle=True)
        os.replace(str(c) + ".npy", c)  # np.save adds the suffix, as Ultralytics' own writer renames it
    with pytest.raises(ConfigError, match=r"label cache .*train\.cache.*unpickle.*system.*delete that file"):
        check_arguments({"resume": str(last)})
    assert main(["train", f"resume={last}"]) == 2
    assert "delete that file" in capsys.readouterr().err
    assert not marker.exists()

    for c, raw in mine.items():  # the harmless twin: the caches Ultralytics wrote for this dataset
        c.write_bytes(raw)
    dataset = _tree(tmp_path / "mine")
    assert main(["train", "--profile", "repro", f"resume={last}"]) == 0
    assert _tree(tmp_path / "mine") == dataset  # read, nothing written into it
    assert not marker.exists()
