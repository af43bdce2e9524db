"""``yolo-det bisect`` reads the runs' records: it never says "equal" while the final weights differ, and it names
the setting that differs (an augmentation argument, the optimizer's hyper-parameters; the threads a replayed
checkpoint was made with: tests/test_bisect.py, beside the replay it shares a run with) where the traces alone would
give a generic cause."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from yolo_det.cli import main
from yolo_det.tools.trace.bisect import _hyper


def _common(tmp: Path, epochs: int) -> list[str]:
    return [
        "imgsz=64",
        "batch=8",
        "nbs=8",
        "workers=0",
        "plots=False",
        "val=False",
        "fraction=0.5",  # 24 images: 3 steps an epoch
        f"epochs={epochs}",
        f"project={tmp}",
    ]


def _digest(run: Path) -> str:
    return str(json.loads((run / "determinism.json").read_text())["weights"]["sha256"])


def _bisect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = main(["bisect", *argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert main(["bisect", *argv]) == code
    return code, out, capsys.readouterr().out


def test_optimizer_hyper_parameters_are_named_not_printed_as_tuples() -> None:
    a = ((("lr", 0.01), ("momentum", 0.9), ("weight_decay", 0.0)), (("lr", 0.01), ("momentum", 0.9)))
    b = ((("lr", 0.02), ("momentum", 0.9), ("weight_decay", 0.0)), (("lr", 0.01), ("momentum", 0.937)))
    assert _hyper(a, b) == "group 0: lr 0.01 | 0.02; group 1: momentum 0.9 | 0.937"
    assert _hyper(a, a[:1]) == "2 parameter groups in A, 1 in B"


@pytest.mark.slow
def test_close_mosaic_after_the_traced_window_is_a_later_parting_named_by_its_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _common(tmp_path, 2)  # 3 steps an epoch; close_mosaic=1 closes mosaic for epoch 2 (step 4 on)
    for name, close, steps in (("m0", 0, "first:1"), ("m1", 1, "first:1"), ("late0", 0, "3-4"), ("late1", 1, "3-4")):
        assert main(["train", "--trace-ops", steps, *common, f"close_mosaic={close}", f"name={name}"]) == 0
    # control: the setting changes the weights, and the same setting repeats them
    assert _digest(tmp_path / "m0") != _digest(tmp_path / "m1")
    assert _digest(tmp_path / "m0") == _digest(tmp_path / "late0")
    code, out, text = _bisect(capsys, str(tmp_path / "m0"), str(tmp_path / "m1"))
    assert code == 1
    assert out["equal"] is False
    assert out["parted_later"] is True
    assert out["parting"] is None
    assert "the traced window agrees" in out["verdict"]
    assert "runs part later" in out["verdict"]
    assert "close_mosaic=" in out["verdict"]
    assert "equal:" not in text
    # traced over the switch: the first batch of epoch 2 differs, and close_mosaic is named, not "randomness"
    code, out, text = _bisect(capsys, str(tmp_path / "late0"), str(tmp_path / "late1"))
    assert code == 1
    p = out["parting"]
    assert (p["phase"], p["step"]) == ("data", 4)
    assert "close_mosaic=" in p["detail"]
    assert "augmentation randomness" not in p["detail"]
    # the same setting on both sides: equal, exit 0
    code, out, _ = _bisect(capsys, str(tmp_path / "m0"), str(tmp_path / "m0"))
    assert code == 0
    assert out["equal"] is True
