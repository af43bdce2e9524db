"""``yolo-det check-deploy``: predictions alone vs in batches vs next to other sizes; val at several batch= values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import pytest
import torch

from helpers import DEMO
from yolo_det.cli import main
from yolo_det.core.detections import compare_detections


def test_compare_detections_verdicts() -> None:
    ref = torch.tensor([[0.0, 0.0, 10.0, 10.0, 0.9, 1.0], [5.0, 5.0, 20.0, 20.0, 0.5, 0.0]])
    assert compare_detections(ref, ref.clone(), atol=0)["verdict"] == "bitwise"
    near = ref.clone()
    near[1, 2] += 1e-5
    got = compare_detections(ref, near, atol=1e-4)
    assert got["verdict"] == "within tolerance"
    assert got["changed"] == [1]
    far = ref.clone()
    far[1, 2] += 1e-2  # far beyond float32 rounding at 20 px
    assert compare_detections(ref, far, atol=0, ref_candidates=ref, got_candidates=far)["verdict"] == "differs"
    fewer = compare_detections(ref, ref[:1], atol=1.0)
    assert fewer["verdict"] == "differs"
    assert fewer["count"] == [2, 1]
    assert fewer["changed"] == [1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from ultralytics import YOLO

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "fresh.pt"
    YOLO("yolov8n.yaml").save(str(path))
    return path


def _images(folder: Path, n: int = 5) -> Path:
    folder.mkdir(parents=True)
    for i, p in enumerate(sorted((DEMO / "images" / "val").glob("*.*"))[:n]):
        size = [None, (96, 200), (220, 96)][i % 3]
        im = cv2.imread(str(p))
        cv2.imwrite(str(folder / f"im{i}.png"), im if size is None else cv2.resize(im, size))
    return folder


@pytest.mark.slow
def test_check_deploy_finds_the_letterbox_difference_and_the_setting_removes_it(tmp_path, checkpoint, capsys) -> None:
    images = _images(tmp_path / "images")
    common = [str(checkpoint), str(images), "--imgsz", "128", "--conf", "0", "--batches", "2,4,8"]
    plain_json, plain_png = tmp_path / "plain.json", tmp_path / "plain.png"
    assert (
        main(["check-deploy", *common, "--profile", "balanced", "--json", str(plain_json), "--plot", str(plain_png)])
        == 1
    )
    out = capsys.readouterr().out
    assert "\nverdict: differs (" in out
    assert "preprocessing (the batch's letterbox shape): differs" in out  # the letterbox, not the kernels
    assert "batch=8 skipped" in out
    plain = json.loads(plain_json.read_text())
    assert plain_png.read_bytes().startswith(b"\x89PNG")
    changed = [c for c in plain["comparisons"] if c["verdict"] == "differs"]
    assert changed
    assert {c["image"] for c in changed} >= {"im1.png", "im2.png"}
    assert all(c["cause"].startswith("letterbox") and c["changed"] for c in changed)
    assert plain["largest"]["box"]["value"] > 1.0
    # the square images keep their input shape in any batch: only numerics, held to the stated tolerance
    square = [c for c in plain["comparisons"] if c["image"] in {"im0.png", "im3.png"}]
    assert all(c["part"] == "numerics" and c["verdict"] != "differs" for c in square)
    assert plain["parts"]["preprocessing"] == "differs"
    assert plain["tolerances"]["atol"] == 1e-4

    fixed_json = tmp_path / "fixed.json"
    assert main(["check-deploy", *common, "--profile", "repro", "--json", str(fixed_json)]) == 0
    fixed = json.loads(fixed_json.read_text())
    assert fixed["verdict"] == "bitwise"
    assert fixed["deploy_settings"]["batch_invariant"] is True
    assert all(c["raw_bitwise"] for c in fixed["comparisons"])
    assert len(fixed["comparisons"]) == len(plain["comparisons"])
    assert all(im["detections"] > 0 for im in fixed["images"])


@pytest.mark.slow
def test_check_deploy_compares_val_at_several_batch_sizes(tmp_path, checkpoint, capsys) -> None:
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    shutil.copytree(DEMO / "labels" / "val", root / "labels" / "val")
    _images(root / "images" / "val", n=16)
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {{0: a, 1: b, 2: c}}\n")
    report = tmp_path / "val.json"
    code = main(
        [
            "check-deploy",
            str(checkpoint),
            str(root / "images" / "val"),
            "--imgsz",
            "96",
            "--conf",
            "0",
            "--batches",
            "2",
            "--no-mixed",
            "--max-images",
            "2",
            "--profile",
            str(_val_profile(tmp_path)),
            "--data",
            str(data),
            "--val-batches",
            "1,4,16",
            "--json",
            str(report),
        ]
    )
    val = json.loads(report.read_text())["val"]
    # an untrained model on labels it cannot find: every metric is 0, so equal metrics prove nothing
    assert val["verdict"] == "bitwise"
    assert val["all_zero"] is True
    assert code == 3
    assert set(val["metrics"]) == {"1", "4", "16"}
    out = capsys.readouterr().out
    assert "val batch=1,4,16: bitwise" in out
    assert "every val metric is 0" in out
    assert "\nverdict: nothing compared\n" in out


def _val_profile(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("extends: repro\nval:\n  batch_invariant: true\n")
    return path


@pytest.mark.slow
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, checkpoint, capsys) -> None:
    report = tmp_path / "r.json"
    assert main(["check-deploy", str(checkpoint), str(tmp_path / "nope"), "--json", str(report)]) == 2
    assert "image folder" in capsys.readouterr().err
    assert not report.exists()
    assert main(["check-deploy", str(tmp_path / "no.pt"), str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["check-deploy", "--compare", str(checkpoint), str(checkpoint)]) == 2
    assert "not an export record" in capsys.readouterr().err


def test_the_chart_has_a_cell_per_image_and_scenario_and_a_val_panel(tmp_path) -> None:
    from yolo_det.tools.deploy.plot import deploy_figure, save_deploy_plot

    row = {"verdict": "differs", "max_box_diff": 12.5, "count": [3, 4]}
    report = {
        "weights": "w.pt",
        "profile": "balanced",
        "verdict": "differs",
        "images": [{"image": "a.png"}, {"image": "b.png"}],
        "comparisons": [
            {"image": "a.png", "scenario": "batch=2", **row},
            {"image": "b.png", "scenario": "batch=2", **row, "verdict": "bitwise", "count": [3, 3]},
            {"image": "a.png", "scenario": "mixed sizes", **row},
        ],
        "val": {
            "batches": [1, 4],
            "verdict": "differs",
            "metrics": {"1": {"metrics/mAP50(B)": 0.5}, "4": {"metrics/mAP50(B)": 0.25}},
        },
    }
    fig = deploy_figure(report)
    grid, val = fig.axes
    assert [t.get_text() for t in grid.get_xticklabels()] == ["batch=2", "mixed sizes"]
    assert sorted(t.get_text() for t in grid.texts) == ["12.5\n3→4", "12.5\n3→4", "="]
    assert [p.get_height() for p in val.patches] == [0.25]
    assert save_deploy_plot(report, tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def _report(comparisons: list, val: dict | None = None):
    from yolo_det.tools.deploy.check import DeployReport

    return DeployReport(
        weights="w.pt",
        profile="repro",
        deploy_settings={},
        val_settings={},
        imgsz=64,
        atol=1e-4,
        conf=0.25,
        images=[{"image": "a.png", "detections": 0}],
        comparisons=comparisons,
        val=val,
    )


def _row(verdict: str, count: list, **raw) -> dict:
    return {"image": "a.png", "scenario": "batch=2", "verdict": verdict, "count": count, **raw}


def test_no_detection_anywhere_is_nothing_compared_not_bitwise() -> None:
    empty = _report([_row("bitwise", [0, 0], raw_bitwise=True, raw_elements=840)])
    assert empty.verdict == "nothing compared"
    assert empty.exit_code == 3
    assert "lower --conf" in empty.summary()
    assert "0 detections, 840 raw output elements" in empty.summary()
    # control: the same report with detections is an equality verdict, and a real difference still differs
    found = _report([_row("bitwise", [2, 2], raw_bitwise=True, raw_elements=840)])
    assert (found.verdict, found.exit_code) == ("bitwise", 0)
    assert found.evidence["detections"] == 4
    differs = _report([_row("differs", [0, 1], raw_bitwise=False, raw_elements=840)])
    assert (differs.verdict, differs.exit_code) == ("differs", 1)


def test_all_zero_val_metrics_are_nothing_compared() -> None:
    rows = [_row("bitwise", [1, 1])]
    zero = _report(
        rows, val={"verdict": "bitwise", "all_zero": True, "batches": [1, 4], "max_diff": 0.0, "max_key": None}
    )
    assert (zero.verdict, zero.exit_code) == ("nothing compared", 3)
    assert "every val metric is 0" in zero.summary()
    assert _report(rows, val={"verdict": "bitwise", "all_zero": False}).verdict == "bitwise"


def test_raw_outputs_decide_as_well_as_detections() -> None:
    from yolo_det.core.detections import compare_raw
    from yolo_det.tools.deploy.check import _fold_raw

    a = torch.zeros(7, 252)
    other_shape = {"verdict": "bitwise", **compare_raw(a, torch.zeros(7, 336), 1e-4)}
    _fold_raw(other_shape)
    assert other_shape["verdict"] == "differs"
    close = {"verdict": "bitwise", **compare_raw(a, a + 1e-6, 1e-4)}
    _fold_raw(close)
    assert close["verdict"] == "within tolerance"
    far = {"verdict": "bitwise", **compare_raw(a, a + 1.0, 1e-4)}
    _fold_raw(far)
    assert far["verdict"] == "differs"
    same = {"verdict": "bitwise", **compare_raw(a, a.clone(), 1e-4)}
    _fold_raw(same)
    assert same["verdict"] == "bitwise"
    assert same["raw_elements"] == 7 * 252


def test_raw_outputs_are_held_to_the_box_rule_not_a_flat_atol() -> None:
    """A box corner at 60 px that moves 2e-5 px (a few float32 roundings there) is within tolerance at --atol
    1e-5, as its detection is; the same move at 0.5 (a score) is not."""
    from yolo_det.core.detections import BOX_RTOL, compare_raw, tolerances
    from yolo_det.tools.deploy.check import _fold_raw

    boxes = torch.full((4, 100), 60.0)
    moved = {"verdict": "within tolerance", **compare_raw(boxes, boxes + 2e-5, 1e-5)}
    _fold_raw(moved)
    assert moved["verdict"] == "within tolerance"
    assert moved["raw_max_diff"] > 1e-5  # control: beyond the flat atol
    scores = torch.full((4, 100), 0.5)
    far = {"verdict": "within tolerance", **compare_raw(scores, scores + 2e-5, 1e-5)}
    _fold_raw(far)
    assert far["verdict"] == "differs"
    stated = tolerances(1e-5)
    assert stated["rtol"] == BOX_RTOL
    assert stated["raw_output"].startswith("1e-05 + 7.6e-06 x |value|")


def test_a_class_flip_is_named_as_a_class_flip_not_a_box_distance() -> None:
    ref = torch.tensor([[10.0, 10.0, 50.0, 50.0, 0.9, 0.0], [60.0, 60.0, 90.0, 90.0, 0.8, 2.0]])
    got = ref.clone()
    got[1, 5] = 5.0  # the second box kept with another class
    out = compare_detections(ref, got, atol=1e-4)
    assert out["verdict"] == "differs"
    assert out["class_flips"] == [[1, 2, 5]]
    report = _report([{**out, "image": "a.jpg", "scenario": "batch=2", "raw_max_diff": None, "part": "numerics"}])
    text = report.summary()
    assert "class flip: row 1 class 2 -> 5 (same box)" in text
    assert " px, score" not in text.split("largest:")[1].split("\n")[0]
    assert "tolerance: boxes 0.0001 + 7.6e-06 x |coordinate| px" in text
    assert "verdict: differs (numerics (same input): differs)" in text
    assert compare_detections(ref, ref.clone(), atol=1e-4)["class_flips"] == []  # control
