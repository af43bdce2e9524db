"""Bad input, end to end: every command answers with one line, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from helpers import MODELS
from yolo_det.cli import main

# (id, argv with {d} for the scratch folder, a fragment the one-line error must contain)
CASES = [
    # train
    ("train-unknown-profile", ["train", "--profile", "repo"], "Did you mean 'repro'?"),
    ("train-malformed-profile", ["train", "--profile", "{d}/broken-profile.yaml"], "malformed YAML"),
    ("train-profile-unknown-key", ["train", "--profile", "{d}/typo-profile.yaml"], "unknown setting 'cudnn_benchmrk'"),
    ("train-profile-wrong-type", ["train", "--profile", "{d}/type-profile.yaml"], "must be true or false"),
    ("train-not-key-value", ["train", "epochs"], "expected key=value"),
    ("train-empty-value", ["train", "epochs="], "has no value"),
    ("train-unknown-key", ["train", "epoch=3"], "Did you mean 'epochs'?"),
    ("train-wrong-type", ["train", "epochs=three"], "invalid type"),
    ("train-bad-imgsz", ["train", "imgsz=[1,2,3]"], "is not an image size"),
    ("train-missing-data", ["train", "data={d}/nope.yaml"], "does not exist"),
    ("train-missing-model", ["train", "model={d}/nope.yaml"], "not found"),
    ("train-download-weights", ["train", "model=yolov8n.pt"], "does not download weights"),
    ("train-not-a-checkpoint", ["train", "model={d}/text.pt"], "is not a PyTorch checkpoint"),
    ("train-reserved", ["train", "deterministic=false"], "the profile decides determinism"),
    # profiles, digest
    ("profiles-show-nothing", ["profiles", "show"], "needs a profile name"),
    ("profiles-show-unknown", ["profiles", "show", "fsat"], "Did you mean 'fast'?"),
    ("profiles-extra-argument", ["profiles", "list", "repro"], "profiles show repro"),
    ("profiles-bad-action", ["profiles", "repro"], "invalid choice: 'repro'"),
    ("digest-missing", ["digest", "{d}/missing.pt"], "does not exist"),
    ("digest-not-a-checkpoint", ["digest", "{d}/text.pt"], "is not a PyTorch checkpoint"),
    ("digest-no-weights", ["digest", "{d}/empty.pt"], "holds no model weights"),
    # audit
    ("audit-missing", ["audit", "{d}/missing.yaml"], "not found"),
    ("audit-malformed", ["audit", "{d}/broken.yaml"], "YAML"),
    ("audit-unknown-module", ["audit", "{d}/unknown.yaml"], "C2ff"),
    ("audit-bad-imgsz", ["audit", "yolov8n.yaml", "--imgsz", "33"], "not a multiple of the model's stride"),
    ("audit-zero-imgsz", ["audit", "yolov8n.yaml", "--imgsz", "0"], "positive integer"),
    ("audit-not-a-checkpoint", ["audit", "{d}/text.pt"], "cannot load checkpoint"),
    ("audit-bad-factory", ["audit", "nosuch.module:build"], "cannot import 'nosuch.module'"),
    ("audit-bad-device", ["audit", "yolov8n.yaml", "--device", "tpu"], "--device must be fake or cuda"),
    ("audit-bad-version", ["audit", "yolov8n.yaml", "--torch-version", "two"], "is not a torch version"),
    ("audit-fix-no-output", ["audit", "{d}/model.yaml", "--fix"], "--fix needs -o"),
    # rewrite
    ("rewrite-missing", ["rewrite", "{d}/missing.yaml", "-o", "{d}/out.yaml"], "does not exist"),
    ("rewrite-no-output", ["rewrite", "{d}/model.yaml"], "no output"),
    ("rewrite-output-exists", ["rewrite", "{d}/model.yaml", "-o", "{d}/keep.txt.yaml"], "exists"),
    ("rewrite-output-folder-missing", ["rewrite", "{d}/model.yaml", "-o", "{d}/no/such/out.yaml"], "does not exist"),
    ("rewrite-output-under-a-file", ["rewrite", "{d}/model.yaml", "-o", "{d}/text.pt/out.yaml"], "does not exist"),
    ("rewrite-unknown-module", ["rewrite", "{d}/unknown.yaml", "-o", "{d}/out.yaml"], "unknown module"),
    ("rewrite-not-a-model", ["rewrite", "{d}/notmodel.yaml", "-o", "{d}/out.yaml"], "not an Ultralytics model YAML"),
    # verify, bench
    ("verify-one-run", ["verify", "--runs", "1"], "--runs must be an integer >= 2"),
    ("verify-unknown-profile", ["verify", "--profile", "repo"], "Did you mean 'repro'?"),
    ("verify-resume", ["verify", "resume=true"], "cannot be passed to verify"),
    ("verify-bad-value", ["verify", "epochs=x"], "invalid type"),
    ("bench-unknown-profile", ["bench", "--profiles", "repro,nope"], "unknown profile 'nope'"),
    ("bench-zero-steps", ["bench", "--steps", "0"], "--steps must be an integer >= 1"),
    ("bench-bad-imgsz", ["bench", "imgsz=abc"], "is not an image size"),
    # patch-yolov5
    ("patch-missing-folder", ["patch-yolov5", "{d}/nowhere"], "is not a folder"),
    ("patch-not-yolov5", ["patch-yolov5", "{d}/empty-tree"], "is not a YOLOv5 tree"),
    ("patch-unknown-profile", ["patch-yolov5", "{d}/fake-yolov5", "--profile", "repo"], "Did you mean 'repro'?"),
    # the command line itself
    ("unknown-command", ["trian"], "invalid choice: 'trian'"),
    ("unknown-option", ["train", "--profil", "repro"], "unrecognized arguments"),
]


def scratch(d: Path) -> None:
    """The inputs the table refers to."""
    (d / "broken-profile.yaml").write_text("train:\n  seed: [1\n")
    (d / "typo-profile.yaml").write_text("train:\n  cudnn_benchmrk: true\n")
    (d / "type-profile.yaml").write_text("val:\n  allow_tf32: maybe\n")
    (d / "text.pt").write_text("not a checkpoint\n")
    torch.save({"epoch": 3}, d / "empty.pt")
    model = (MODELS / "bicubic-up.yaml").read_text()
    (d / "model.yaml").write_text(model)
    (d / "unknown.yaml").write_text(model.replace("C2f, [96]]", "C2ff, [96]]", 1))
    (d / "broken.yaml").write_text("backbone: [[-1, 1, Conv\n")
    (d / "notmodel.yaml").write_text("names: [a, b]\n")
    (d / "keep.txt.yaml").write_text("keep me\n")
    (d / "empty-tree").mkdir()
    fake = d / "fake-yolov5"
    for rel in ("train.py", "val.py", "utils/general.py", "models/yolo.py"):
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text("# a file\n")


def state_of(d: Path) -> dict[str, tuple[str, float]]:
    return {str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
            for p in sorted(d.rglob("*")) if p.is_file()} | {str(p.relative_to(d)) + "/": ("dir", 0.0)
                                                           for p in d.rglob("*") if p.is_dir()}


def test_the_table_is_broad():
    assert len(CASES) >= 30
    assert {argv[0] for _, argv, _ in CASES} >= {"train", "profiles", "digest", "audit", "rewrite", "verify",
                                                  "bench", "patch-yolov5"}


@pytest.mark.parametrize(("name", "argv", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, argv, fragment, tmp_path, capsys, monkeypatch):
    d = tmp_path / "work"
    d.mkdir()
    scratch(d)
    monkeypatch.chdir(d)
    monkeypatch.delenv("YOLO_DET_DEBUG", raising=False)
    before = state_of(d)
    code = main([a.replace("{d}", str(d)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("yolo-det: error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert "Traceback" not in err + out
    assert state_of(d) == before  # nothing created, nothing changed
