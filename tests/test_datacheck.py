"""Data mistakes before anything is written: labels Ultralytics would drop, a split without label files.

Each label file is judged by Ultralytics' own ``verify_image_label`` paired with a stand-in image: its verdicts are
compared with the same call on the real image, and the real image is never touched; the refusals are checked end to
end (``yolo-det train``, ``attach()``, ``trainer_class``): one line, exit 2, no run folder.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import pytest

from helpers import DEMO, small_train, small_train_tokens
from yolo_det.analysis.datacheck import check_training_data
from yolo_det.cli import main
from yolo_det.core.compat import label_verdict
from yolo_det.core.errors import ConfigError

# (label text, classes, keypoint, nkpt, ndim, single_cls): kept or dropped as Ultralytics has it
LABELS = [
    ("0 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),
    ("", 3, False, 0, 0, False),  # a background image
    ("  \n\n", 3, False, 0, 0, False),
    ("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # a duplicate row: removed, kept
    ("0 0.5 0.5 0.2 0.2 0.9\n", 3, False, 0, 0, False),  # 6 columns (a confidence)
    ("0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2 0.9\n", 3, False, 0, 0, False),  # ragged
    ("0 0.5 0.5 0.2\n", 3, False, 0, 0, False),  # 4 columns
    ("cat 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),
    ("0 0.5 0.5 0.2 0.2x\n", 3, False, 0, 0, False),
    ("0 50 50 20 20\n", 3, False, 0, 0, False),  # pixels, not normalized
    ("0 1.005 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # inside Ultralytics' 1% tolerance
    ("0 0.5 0.5 -0.2 0.2\n", 3, False, 0, 0, False),
    ("0 -0.005 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # a centre just outside: tolerated
    ("0 -0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),
    ("0 nan 0.5 0.2 0.2\n", 3, False, 0, 0, False),
    ("1.5 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # a class id that is not whole
    ("3 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # a class id at nc
    ("2 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),
    ("7 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, True),  # single_cls reads every class as 0
    ("0 0.1 0.1 0.4 0.1 0.4 0.4\n1 0.5 0.5 0.9 0.5 0.9 0.9 0.5 0.9\n", 3, False, 0, 0, False),  # polygons
    ("0 0.1 0.1 0.4 0.1 0.4 0.4 0.3\n", 3, False, 0, 0, False),  # a polygon with an odd coordinate count
    ("0 0.1 0.1 0.4 0.1 0.4 0.4\n0 0.5 0.5 0.2 0.2\n", 3, False, 0, 0, False),  # polygon and box rows
    ("0 0.1 0.1 0.4 0.1 1.4 0.4\n", 3, False, 0, 0, False),  # a polygon beyond the image
    ("5 0.1 0.1 0.4 0.1 0.4 0.4\n", 3, False, 0, 0, False),  # a polygon of a class at or above nc
    ("0 0.1 0.1 0.4 0.1 0.4 0.4 0.2 0.3 0.1\n", 3, False, 0, 0, False),  # OBB: 4 corners
    ("0 0.5 0.5 0.2 0.2 0.4 0.4 2 0.6 0.6 2\n", 1, True, 2, 3, False),  # pose
    ("0 0.5 0.5 0.2 0.2 0.4 0.4 2\n", 1, True, 2, 3, False),  # pose with too few keypoints
    ("0 0.5 0.5 0.2 0.2 0.4 4.0 2 0.6 0.6 2\n", 1, True, 2, 3, False),  # a keypoint beyond the image
    ("0 0.5 0.5 0.2 0.2 0.4 0.4 2 0.6 0.6 2\n", 1, False, 2, 3, False),  # pose labels, box task: the box kept
]


def _verdict(label: Path, classes: float, keypoint: bool, nkpt: int, ndim: int, single_cls: bool) -> str | None:
    return label_verdict(str(label), classes=classes, keypoint=keypoint, nkpt=nkpt, ndim=ndim, single_cls=single_cls)[1]


@pytest.mark.parametrize(("text", "classes", "keypoint", "nkpt", "ndim", "single_cls"), LABELS)
def test_a_label_file_is_refused_exactly_when_ultralytics_drops_it_with_the_real_image(
    text: str, classes: int, keypoint: bool, nkpt: int, ndim: int, single_cls: bool, tmp_path: Path
) -> None:
    from ultralytics.data.utils import verify_image_label

    image = tmp_path / "images" / "a.png"
    image.parent.mkdir()
    shutil.copy(next((DEMO / "images" / "train").glob("*.png")), image)
    label = tmp_path / "labels" / "a.txt"
    label.parent.mkdir()
    label.write_text(text)
    *_, corrupt, message = verify_image_label((str(image), str(label), "", keypoint, classes, nkpt, ndim, single_cls))
    fault = _verdict(label, classes, keypoint, nkpt, ndim, single_cls)
    assert (fault is not None) == bool(corrupt), (fault, message)
    if fault is not None:
        assert fault in " ".join(message.split()), (fault, message)  # Ultralytics' reason, on one line
        by_class = _verdict(label, math.inf, keypoint, nkpt, ndim, single_cls) is None
        assert by_class == ("exceeds dataset class count" in message), (fault, message)


def test_the_table_covers_both_verdicts_and_both_kinds(tmp_path: Path) -> None:
    kinds = set()
    for i, (text, classes, keypoint, nkpt, ndim, single_cls) in enumerate(LABELS):
        label = tmp_path / f"{i}.txt"
        label.write_text(text)
        if _verdict(label, classes, keypoint, nkpt, ndim, single_cls) is None:
            kinds.add(None)
        else:
            kinds.add("class" if _verdict(label, math.inf, keypoint, nkpt, ndim, single_cls) is None else "format")
    assert kinds == {None, "class", "format"}


# -- the datasets --------------------------------------------------------------------------------------------


def _dataset(tmp_path: Path, *, names: int = 3) -> Path:
    """A copy of the bundled demo data (48 train / 16 val images) with its own YAML naming ``names`` classes."""
    root = tmp_path / "data"
    shutil.copytree(DEMO, root)
    for cache in root.rglob("*.cache"):
        cache.unlink()
    yaml_path = tmp_path / "data.yaml"
    listed = "".join(f"  {i}: c{i}\n" for i in range(names))
    yaml_path.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{listed}")
    return yaml_path


def _labels(yaml_path: Path, split: str = "train") -> list[Path]:
    return sorted((yaml_path.parent / "data" / "labels" / split).glob("*.txt"))


def _uses_class(label: Path, cls: int) -> bool:
    return any(line.split()[0] == str(cls) for line in label.read_text().splitlines() if line.strip())


def _too_few_classes(tmp_path: Path) -> tuple[Path, str]:
    yaml_path = _dataset(tmp_path, names=2)  # the labels use classes 0, 1 and 2
    using = [p for p in _labels(yaml_path) if _uses_class(p, 2)]
    assert 0 < len(using) < 48
    return yaml_path, f"{len(using)} of 48 train label files use a class id at or above nc=2"


def _no_labels(tmp_path: Path) -> tuple[Path, str]:
    yaml_path = _dataset(tmp_path)
    shutil.rmtree(yaml_path.parent / "data" / "labels" / "train")
    return yaml_path, "none of the 48 train images has a label file"


def _malformed(tmp_path: Path) -> tuple[Path, str]:
    yaml_path = _dataset(tmp_path)
    labels = _labels(yaml_path, "val")
    for label in labels[3:8]:  # a confidence column, as a detector's output has
        label.write_text("".join(f"{line} 0.9\n" for line in label.read_text().splitlines() if line.strip()))
    return yaml_path, "5 of 16 val label files are ones Ultralytics drops with their images as corrupt"


MISTAKES = {"class-at-or-above-nc": _too_few_classes, "no-label-files": _no_labels, "malformed": _malformed}
FIRST = {"class-at-or-above-nc": None, "no-label-files": "train_000.txt", "malformed": "val_003.txt"}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_cli_refuses_a_data_mistake_in_one_line_before_anything_is_written(
    mistake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    yaml_path, fragment = MISTAKES[mistake](tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("YOLO_DET_DEBUG", raising=False)
    runs = tmp_path / "runs"
    code = main(["train", f"data={yaml_path}", *small_train_tokens(), f"project={runs}", "name=bad"])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("yolo-det: error: "), err
    assert err.count("\n") == 1, err
    assert fragment in err, err
    first = FIRST[mistake] or next(p.name for p in _labels(yaml_path) if _uses_class(p, 2))
    assert f"{first}'" in err, err  # the first offending file (or the first missing one), by name
    assert "Traceback" not in out + err
    assert not runs.exists()  # no run folder, no args.yaml, no determinism.json
    assert not list(tmp_path.rglob("determinism.json"))
    assert not list(tmp_path.rglob("args.yaml"))


def test_attach_and_trainer_class_refuse_it_before_the_run_folder_exists(tmp_path: Path) -> None:
    from ultralytics import YOLO

    import yolo_det

    yaml_path, fragment = _too_few_classes(tmp_path)
    runs = tmp_path / "runs"
    model = YOLO("yolov8n.yaml")
    yolo_det.attach(model, "repro")
    with pytest.raises(ConfigError, match=fragment):
        model.train(data=str(yaml_path), **small_train(project=str(runs), name="attached"))
    with pytest.raises(ConfigError, match=fragment):
        YOLO("yolov8n.yaml").train(
            data=str(yaml_path), trainer=yolo_det.trainer_class("repro"), **small_train(project=str(runs), name="tc")
        )
    assert not runs.exists()


@pytest.mark.slow
def test_backgrounds_and_single_cls_pass_and_a_correct_dataset_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    yaml_path, _ = _too_few_classes(tmp_path)
    check_training_data({"data": str(yaml_path), "single_cls": True})  # every class read as 0: nothing dropped
    check_training_data({"data": str(yaml_path), "resume": True})  # a resumed run's data was checked when it began
    fixed = _dataset(tmp_path / "fixed")
    labels = _labels(fixed)
    for label in labels[:5]:
        label.write_text("")  # background images
    labels[5].unlink()  # and an image without a label file
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    code = main(["train", f"data={fixed}", *small_train_tokens(), f"project={runs}", "name=good"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    record = json.loads((runs / "good" / "determinism.json").read_text())
    train = record["data"]["splits"]["train"]
    assert (train["images"], train["labels"], train["missing_labels"]) == (48, 47, 1)
    boxes = sum(len([x for x in p.read_text().splitlines() if x.strip()]) for p in _labels(fixed))
    assert train["instances"] == boxes > 0  # the label rows the training used
    assert train["backgrounds"] == 6


@pytest.mark.parametrize("task", ["detect", "segment", "pose", "obb", "classify"])
def test_the_datasets_of_every_task_pass_and_a_bad_row_in_one_is_refused(task: str, tmp_path: Path) -> None:
    from task_data import make_dataset

    data = make_dataset(tmp_path / task, task)
    check_training_data({"data": data}, task=task)
    if task == "classify":
        return  # folders: no label files to read
    label = tmp_path / task / "labels" / "003.txt"
    label.write_text(label.read_text().strip() + " 0.5\n")  # one column too many
    with pytest.raises(ConfigError, match=r"1 of 8 train label files are ones Ultralytics drops .* '.*003\.txt'"):
        check_training_data({"data": data}, task=task)


def test_only_the_images_fraction_selects_are_read(tmp_path: Path) -> None:
    yaml_path = _dataset(tmp_path)
    _labels(yaml_path)[40].write_text("0 0.5 0.5 0.2\n")  # train_040: beyond the first half
    check_training_data({"data": str(yaml_path), "fraction": 0.5})  # train_000 ... train_023
    with pytest.raises(ConfigError, match=r"1 of 48 train label files .* '.*train_040\.txt' \(.*4 columns"):
        check_training_data({"data": str(yaml_path)})


def test_the_check_never_rewrites_an_image_ultralytics_would_rewrite(tmp_path: Path) -> None:
    from PIL import Image
    from ultralytics.data.utils import verify_image_label

    yaml_path = _dataset(tmp_path)
    images = tmp_path / "data" / "images" / "train"
    jpeg = images / "train_000.jpg"  # a JPEG with bytes after its end marker, which Ultralytics rewrites in place
    Image.open(images / "train_000.png").convert("RGB").save(jpeg)
    jpeg.write_bytes(jpeg.read_bytes() + b"\0\0")
    (images / "train_000.png").unlink()
    before = hashlib.sha256(jpeg.read_bytes()).hexdigest()
    _labels(yaml_path)[1].write_text("0 0.5 0.5 0.2\n")
    with pytest.raises(ConfigError, match=r"1 of 48 train label files .* '.*train_001\.txt' \(.*4 columns"):
        check_training_data({"data": str(yaml_path)})
    assert hashlib.sha256(jpeg.read_bytes()).hexdigest() == before
    label = str(_labels(yaml_path)[0])
    assert "restored" in verify_image_label((str(jpeg), label, "", False, 3, 0, 0, False))[-1]  # control
    assert hashlib.sha256(jpeg.read_bytes()).hexdigest() != before
