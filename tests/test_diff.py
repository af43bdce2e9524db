"""yolo-det diff: real runs that differ in one thing are told apart by that thing; identical runs say so."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, TrainedRuns
from yolo_det.cli import main
from yolo_det.tools.diff import GROUPS, diff_records, load_record


@pytest.fixture
def runs(trained_runs: TrainedRuns) -> TrainedRuns:
    """The shared tiny runs (tests/helpers.py): one optimizer step on 12 demo images at 64 px, enough to give
    every run its own weights digest."""
    return trained_runs


def diff(capsys, a: Any, b: Any, *flags: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what training printed
    code = main(["diff", str(a), str(b), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def record(path: Path) -> dict[str, Any]:
    return json.loads((path / "determinism.json").read_text())


def write(path: Path, rec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(rec))
    return path


# ---------------------------------------------------------------------------------------------------------
# real runs


@pytest.mark.slow
def test_two_identical_runs_exit_0(runs, capsys):
    a, b = runs.base(), runs.twin()
    rec = record(a)
    assert rec["data"]["splits"]["train"]["images"] == 12
    assert rec["model"]["kind"] == "yaml"
    assert rec["ultralytics_args"]["imgsz"] == 64
    assert rec["environment"]["cpu_model"]
    assert "torch_threads" in rec["environment"]
    code, out, err = diff(capsys, a, b)
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "verdict: these runs should be bitwise identical and are"
    assert "(equal)" in out


@pytest.mark.slow
def test_seed_0_vs_seed_1_names_the_seed(runs, capsys):
    code, out, _ = diff(capsys, runs.base(), runs.other_seed(), "--json")
    data = json.loads(out)
    assert code == 1
    assert data["exit_code"] == 1
    assert data["kind"] == "expected"
    causes = [d for d in data["differences"] if d["changes_bits"]]
    assert causes[0]["name"] == "seed"
    assert (causes[0]["a"], causes[0]["b"]) == (0, 1)
    assert data["verdict"].startswith("expected to differ because: seed (0 vs 1)")
    # consequences of the seed are shown, but not as causes
    init = next(d for d in data["differences"] if d["name"] == "model: initial weights")
    assert init["changes_bits"] is False
    assert "seed" in init["note"]


@pytest.mark.slow
def test_diff_png_draws_both_runs_curves_and_marks_where_they_parted(runs, capsys, tmp_path):
    from yolo_det.tools.curves import curves_figure, read_curves

    a, b = runs.base(), runs.train("seed1", "seed=1")
    code, _, err = diff(capsys, a, b, "--png", str(tmp_path / "parted.png"))
    assert code == 1
    assert (tmp_path / "parted.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "yolo-det: the logged values first differ at epoch 1 (marked)" in err.splitlines()
    loss = read_curves(a).series["train/box_loss"]  # what Ultralytics logged is what is drawn
    fig = curves_figure([("A", read_curves(a))])
    assert [tuple(ax.lines[0].get_ydata()) for ax in fig.axes if ax.get_title() == "train/box_loss"] == [loss]
    code, _, err = diff(capsys, a, a, "--png", str(tmp_path / "same.png"))
    assert code == 0
    assert "marked" not in err
    assert (tmp_path / "same.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_record_edited_to_another_torch_names_torch(runs, capsys, tmp_path):
    a = runs.base()
    rec = record(runs.twin())
    rec["environment"]["torch"] = "1.13.1"
    code, out, _ = diff(capsys, a, write(tmp_path / "other-torch.json", rec))
    assert code == 1
    assert "torch: A " in out
    assert "| B 1.13.1" in out
    assert "verdict: configured differently (torch (" in out  # and yet the (recorded) weights are equal


@pytest.mark.slow
def test_datasets_differing_in_one_label_name_the_data(runs, capsys):
    edited = runs.train("edited-label", f"data={runs.edited_data()}")
    code, out, _ = diff(capsys, runs.base(), edited, "--json")
    data = json.loads(out)
    assert code == 1
    assert data["kind"] == "expected"
    causes = [d["name"] for d in data["differences"] if d["changes_bits"]]
    first = "data: first file that differs: demo/labels/train/train_000.txt"  # the copy lives elsewhere: same names
    assert causes == [first, "data: train labels"]  # same list, same images
    assert data["verdict"].startswith(f"expected to differ because: {first}")
    path = next(d for d in data["differences"] if d["name"] == "data= (path)")
    assert path["changes_bits"] is False


@pytest.mark.slow
def test_checkpoint_starts_with_different_weights_name_the_model(runs, capsys):
    one = runs.base() / "weights" / "last.pt"
    two = runs.other_seed() / "weights" / "last.pt"
    a = runs.train("from-ckpt-1", f"model={one}")
    b = runs.train("from-ckpt-2", f"model={two}")
    assert record(a)["model"]["kind"] == "checkpoint"
    code, out, _ = diff(capsys, a, b, "--json")
    data = json.loads(out)
    causes = [d for d in data["differences"] if d["changes_bits"]]
    assert code == 1
    assert causes[0]["group"] == "model"
    assert causes[0]["name"] == "model: checkpoint weights"
    assert [d["group"] for d in causes] == ["model"]
    assert "model: checkpoint weights" in data["verdict"]


@pytest.mark.slow
def test_same_configuration_different_weights_blames_non_determinism(runs, capsys, tmp_path):
    rec = record(runs.base())
    rec["weights"]["sha256"] = "0" * 64
    code, out, _ = diff(capsys, runs.base(), write(tmp_path / "b.json", rec))
    assert code == 1
    assert (
        "verdict: these runs should be bitwise identical but their weights differ: non-determinism not covered "
        "by the profile (see warnings"
    ) in out


@pytest.mark.slow
def test_records_of_older_versions_diff_gracefully(runs, capsys, tmp_path):
    old = record(runs.base())
    for key in ("data", "model", "ultralytics_args"):
        del old[key]
    for key in ("cpu_model", "cpu_capability", "torch_interop_threads", "opencv", "pillow"):
        del old["environment"][key]
    code, out, _ = diff(capsys, write(tmp_path / "old.json", old), runs.twin())
    assert code == 0, out
    assert "record A has no data fingerprint (written by an older yolo-det" in out
    assert "cpu_model: A (not recorded)" in out
    old["seeds"]["seed"] = 5
    code, out, _ = diff(capsys, write(tmp_path / "old5.json", old), runs.base())
    assert code == 1
    assert "verdict: configured differently (seed (5 vs 0)), yet their weights are identical" in out


@pytest.mark.slow
def test_gpu_differences_do_not_count_for_cpu_runs_and_groups_are_ordered(runs):
    ra = record(runs.base())
    rb = copy.deepcopy(ra)
    rb["environment"]["gpus"] = ["NVIDIA H100"]
    rb["environment"]["host"]["intra_op_threads"] = 64
    rb["environment"]["numpy"] = "0.0"
    rb["seeds"]["seed"] = 3
    rb["profile"]["val"]["deterministic_algorithms"] = "off"
    report = diff_records(ra, rb)
    gpu = next(d for d in report.differences if d.name == "gpus")
    assert gpu.changes_bits is False
    assert "CPU" in gpu.note
    val = next(d for d in report.differences if d.name == "val.deterministic_algorithms")
    assert val.changes_bits is False
    order = list(GROUPS)
    positions = [order.index(d.group) for d in report.differences]
    assert positions == sorted(positions)
    assert [d.name for d in report.causes] == ["seed", "numpy", "intra-op threads"]


# ---------------------------------------------------------------------------------------------------------
# bad input


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    good = {"schema": 1, "profile": {}, "environment": {}}
    cases = {
        "missing": tmp_path / "nope",
        "folder": tmp_path,
        "not-json": tmp_path / "x.json",
        "not-a-record": tmp_path / "list.json",
        "future": tmp_path / "future.json",
    }
    cases["not-json"].write_text("{oops")
    cases["not-a-record"].write_text("[1, 2]")
    cases["future"].write_text(json.dumps({**good, "schema": 99}))
    ok = write(tmp_path / "ok.json", good)
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, path in cases.items():
        code, out, err = diff(capsys, ok, path)
        assert code == 2, name
        assert out == "", name
        assert len(err.strip().splitlines()) == 1, name
        assert err.startswith("yolo-det: error: "), name
    assert "newer than this yolo-det reads" in diff(capsys, cases["future"], ok)[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_verify_save_file_is_read_for_its_record(tmp_path):
    rec = {"schema": 1, "profile": {"name": "repro"}, "environment": {"torch": "2.0"}}
    saved = write(tmp_path / "s.json", {"schema": "yolo-det/verify-fingerprints", "version": 1, "record": rec})
    loaded, _ = load_record(saved)
    assert loaded == rec


def test_yolov5_records_without_fingerprints_compare_by_their_arguments():
    def rec(weights: str, digest: str) -> dict[str, Any]:
        return {
            "schema": 1,
            "framework": "yolov5",
            "status": "completed",
            "profile": {"name": "repro"},
            "seeds": {"seed": 0},
            "environment": {"torch": "2.4.0"},
            "weights": {"sha256": digest},
            "model": {"class": "models.yolo.Model", "parameters": 7000000, "device": "cuda:0"},
            "run": {"weights": weights, "cfg": "", "data": "coco128.yaml", "epochs": 3, "save_dir": "x"},
        }

    same = diff_records(rec("a.pt", "d"), rec("a.pt", "d"))
    assert same.exit_code == 0
    assert any("YOLOv5 integration" in n for n in same.notes)
    other = diff_records(rec("a.pt", "d"), rec("b.pt", "e"))
    assert [d.name for d in other.causes] == ["model (path; no fingerprint)"]
    assert other.causes[0].a == {"weights": "a.pt"}
    assert other.exit_code == 1


# ---------------------------------------------------------------------------------------------------------
# the same images listed another way


def _listed(files: list[str], root: Path) -> dict[str, Any]:
    """The record a run leaves whose data YAML lists ``files`` with ``root`` as its path (what identity writes)."""
    from yolo_det.core.datafp import dataset_fingerprint

    fp = dataset_fingerprint({"train": files}, root=root, names={0: "circle", 1: "square", 2: "triangle"})
    return {
        "schema": 1,
        "status": "completed",
        "profile": {"name": "repro"},
        "environment": {"torch": "2.4"},
        "weights": {"sha256": "d" * 64},
        "data": fp,
        "data_stream": {"mode": "keyed", "workers": 0, "seed": 0, "dataset": fp["sha256"], "fingerprint": "f"},
    }


def test_a_txt_image_list_elsewhere_is_the_same_data(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    demo = ROOT / "data" / "demo"
    files = sorted(str(p) for p in (demo / "images" / "train").glob("*.png"))[:8]
    folder = _listed(files, demo.parent)  # data.yaml beside the data: train: demo/images/train
    lists = tmp_path / "lists"  # data.yaml in another folder: train: lists/train.txt of absolute paths
    lists.mkdir()
    same = diff_records(folder, _listed(files, lists))
    assert same.exit_code == 0, same.summary()
    assert same.kind == "identical"
    renamed = next(d for d in same.differences if d.name == "data: train file names")
    assert renamed.changes_bits is False
    assert "data stream: dataset" not in [d.name for d in same.causes]
    # control: one image of the list replaced by another one is other data, named as such
    other = [*files[:7], str(sorted((demo / "images" / "val").glob("*.png"))[0])]
    changed = diff_records(folder, _listed(other, lists))
    assert changed.exit_code == 1
    assert "data: train image list" in [d.name for d in changed.causes]
    assert not any(d.name.endswith("file names") for d in changed.differences)


def test_records_without_weights_compare_nothing_and_say_what_was_compared(tmp_path, capsys):
    def rec(digest: str | None, seed: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": 1,
            "status": "interrupted",
            "profile": {"name": "repro", "train": {"deterministic_algorithms": "strict"}},
            "seeds": {"seed": seed},
            "environment": {"torch": "2.4", "python": "3.11"},
            "ultralytics_args": {"epochs": 3, "imgsz": 64},
        }
        if digest is not None:
            out["weights"] = {"sha256": digest}
        return out

    a, b = write(tmp_path / "a.json", rec(None)), write(tmp_path / "b.json", rec(None))
    code, out, _ = diff(capsys, a, b)
    assert code == 3
    assert out.splitlines()[-1].startswith("verdict: nothing compared: no final weights digest for run A")
    compared = out.splitlines()[-2]
    assert compared.startswith("compared: 7 setting(s) in 4 topic(s) (seeds, profile settings, Ultralytics")
    assert compared.endswith("and no weights (digests in 0 of 2 records)")
    code, out, _ = diff(capsys, a, b, "--json")
    assert json.loads(out)["kind"] == "nothing-compared"
    assert json.loads(out)["compared"]["settings"] == 7
    # controls: the same records with their weights compare (exit 0); a real difference still wins (exit 1)
    code, out, _ = diff(capsys, write(tmp_path / "c.json", rec("d" * 64)), write(tmp_path / "d.json", rec("d" * 64)))
    assert code == 0
    assert "and the final weights digests" in out
    code, out, _ = diff(capsys, a, write(tmp_path / "e.json", rec(None, seed=1)))
    assert code == 1
    assert "seed (0 vs 1)" in out.splitlines()[-1]
