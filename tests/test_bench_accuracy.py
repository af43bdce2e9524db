"""bench/bench_accuracy.py: the generated data set, the statistics (bootstrap interval), the table and JSON shape."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT

spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "bench" / "bench_accuracy.py")
assert spec is not None
assert spec.loader is not None
acc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(acc)


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_data_set_repeats_from_its_seed_and_changes_with_it(tmp_path):
    a = _files(acc.make_dataset(tmp_path / "a", seed=3, train=6, val=2, imgsz=64).parent)
    b = _files(acc.make_dataset(tmp_path / "b", seed=3, train=6, val=2, imgsz=64).parent)
    c = _files(acc.make_dataset(tmp_path / "c", seed=4, train=6, val=2, imgsz=64).parent)
    images = [k for k in a if k.startswith("images/")]
    assert len(images) == 8
    assert {k: v for k, v in a.items() if k != "data.yaml"} == {k: v for k, v in b.items() if k != "data.yaml"}
    assert all(a[k] != c[k] for k in images)


def test_ultralytics_accepts_every_label_file(tmp_path):
    from ultralytics.data.utils import check_det_dataset, verify_image_label

    yaml_path = acc.make_dataset(tmp_path / "d", seed=0, train=12, val=4, imgsz=64)
    data = check_det_dataset(str(yaml_path))
    assert data["nc"] == 3
    classes = set()
    for split in ("train", "val"):
        for image in sorted((tmp_path / "d" / "images" / split).glob("*.png")):
            label = tmp_path / "d" / "labels" / split / f"{image.stem}.txt"
            im_file, lb, shape, _, _, nm, nf, ne, nc, msg = verify_image_label(
                (str(image), str(label), "", False, 3, 0, 0, False)
            )
            assert (nm, nf, ne, nc, msg) == (0, 1, 0, 0, ""), image
            assert shape == (64, 64)
            assert len(lb) >= 1
            assert ((lb[:, 1:] > 0) & (lb[:, 1:] <= 1)).all()
            classes.update(int(c) for c in lb[:, 0])
    assert classes <= {0, 1, 2}
    assert len(classes) >= 2


def test_a_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit, match="not empty"):
        acc.make_dataset(tmp_path, train=1, val=1, imgsz=64)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_the_bootstrap_interval_holds_the_ratio_and_repeats_from_its_seed():
    rng = np.random.default_rng(1)
    plain = 0.8 + 0.05 * rng.standard_normal(5)
    same = acc.bootstrap_ratio(plain, plain)
    lo, hi = same
    assert lo < 1 < hi
    low = acc.bootstrap_ratio(plain * 0.5, plain)
    assert low[1] < 1
    assert low[0] < 0.5 < low[1]
    assert acc.bootstrap_ratio(plain * 0.5, plain, seed=0) == low
    assert acc.bootstrap_ratio(plain * 0.5, plain, seed=1) != low
    # more spread in the arm: a wider interval
    wide = acc.bootstrap_ratio(plain + np.array([-0.2, 0.2, -0.2, 0.2, 0.0]), plain)
    assert wide[1] - wide[0] > hi - lo
    # without spread there is nothing to resample
    assert acc.bootstrap_ratio([0.4, 0.4], [0.8, 0.8]) == pytest.approx((0.5, 0.5))
    with pytest.raises(ValueError, match="reference mean"):
        acc.bootstrap_ratio([0.4], [0.0, 0.0])


def _arms(values):
    return {
        name: {"commit": "abc1234", "runs": [{"seed": i, "map50": v, "map50_95": v / 2} for i, v in enumerate(vs)]}
        for name, vs in values.items()
    }


def test_summary_and_table_on_given_numbers():
    arms = _arms({"plain": [0.8, 0.9, 0.85], "repro": [0.6, 0.7, 0.65], "portable": [0.86, 0.84, 0.85]})
    summary = acc.summarize(arms)
    assert list(summary) == ["plain", "repro", "portable"]
    assert summary["plain"]["map50"]["mean"] == pytest.approx(0.85)
    assert summary["plain"]["map50"]["sd"] == pytest.approx(np.std([0.8, 0.9, 0.85], ddof=1))
    assert summary["repro"]["map50"]["min"] == 0.6
    assert summary["repro"]["map50"]["max"] == 0.7
    assert summary["repro"]["map50_95"]["mean"] == pytest.approx(0.325)
    assert summary["plain"]["ratio_to_plain"]["mean"] == 1
    assert summary["repro"]["ratio_to_plain"]["mean"] == pytest.approx(0.65 / 0.85)
    lo, hi = summary["repro"]["ratio_to_plain"]["ci95"]
    assert lo <= 0.65 / 0.85 <= hi
    assert summary["repro"]["ratio_to_plain"]["meets_target"] is False
    assert summary["portable"]["ratio_to_plain"]["meets_target"] is True
    assert summary["plain"]["ratio_to_plain"]["meets_target"] is True
    json.dumps(summary)  # plain types only

    text = acc.table(summary, arms)
    lines = text.splitlines()
    assert len(lines) == 2 + 3
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| repro | 3 | 0.650 ± 0.050 | 0.600-0.700 |" in text
    assert f"{0.65 / 0.85:.3f} ({lo:.3f}-{hi:.3f})" in text

    without_plain = acc.summarize({k: v for k, v in arms.items() if k != "plain"})
    assert all("ratio_to_plain" not in row for row in without_plain.values())
    assert "| repro | 3 |" in acc.table(without_plain, arms)


def test_final_metrics_reads_the_last_epoch(tmp_path):
    csv_path = tmp_path / "results.csv"
    csv_path.write_text(
        "epoch,time,metrics/mAP50(B),metrics/mAP50-95(B)\n1,3.0,0.1,0.05\n2,6.0, 0.75, 0.5\n", encoding="utf-8"
    )
    assert acc.final_metrics(csv_path) == {"epochs": 2, "map50": 0.75, "map50_95": 0.5}
    csv_path.write_text("epoch,time,metrics/mAP50(B),metrics/mAP50-95(B)\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no epoch"):
        acc.final_metrics(csv_path)


def test_unknown_arm_and_bad_label_are_refused(capsys):
    with pytest.raises(SystemExit) as err:
        acc.main(["--arms", "plain,nope"])
    assert err.value.code == 2
    assert "unknown arm 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        acc.main(["--arms", "repro", "--label", "plain=x"])
    assert err.value.code == 2


def test_arms_of_another_call_are_kept_only_with_the_same_setup(tmp_path, monkeypatch, capsys):
    """The JSON gathers arms over calls (the bookkeeping; training itself is replaced by given numbers)."""
    values = {"plain": [0.5, 0.6], "repro": [0.55, 0.45], "portable": [0.4, 0.5]}

    def fake_run(arm, seed, kwargs, project):
        assert kwargs["seed"] == seed
        assert Path(kwargs["data"]).is_file()
        return {"seed": seed, "epochs": 3, "map50": values[arm][seed], "map50_95": values[arm][seed] / 2, "seconds": 1}

    monkeypatch.setattr(acc, "_run", fake_run)
    out = tmp_path / "acc.json"
    common = ["--seeds", "2", "--epochs", "3", "--out", str(out)]
    assert acc.main(["--arms", "plain,repro", "--label", "repro=repro-old", *common]) == 0
    first = json.loads(out.read_text())
    assert set(first["arms"]) == {"plain", "repro-old"}
    assert first["arms"]["repro-old"]["arm"] == "repro"
    assert [r["map50"] for r in first["arms"]["repro-old"]["runs"]] == [0.55, 0.45]

    assert acc.main(["--arms", "portable", *common]) == 0
    second = json.loads(out.read_text())
    assert set(second["arms"]) == {"plain", "repro-old", "portable"}
    assert second["arms"]["plain"] == first["arms"]["plain"]
    assert second["summary"]["portable"]["ratio_to_plain"]["mean"] == pytest.approx(0.45 / 0.55)
    assert "| portable | 2 |" in second["table"]
    assert "| portable | 2 |" in capsys.readouterr().out

    # other arguments: the earlier arms were measured otherwise and are not kept
    assert acc.main(["--arms", "portable", "--seeds", "2", "--epochs", "4", "--out", str(out)]) == 0
    assert list(json.loads(out.read_text())["arms"]) == ["portable"]
