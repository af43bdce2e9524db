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
    ("audit-not-a-checkpoint", ["audit", "{d}/text.pt"], "is not a PyTorch checkpoint"),
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
    # values Ultralytics would reject only after the run began (issue 12)
    ("train-seed-out-of-range", ["train", "seed=1180591620717411303424"], "out of range"),
    ("train-device-cuda-0", ["train", "device=cuda:0"], "no CUDA device here"),
    ("train-device-0", ["train", "device=0"], "use device=cpu"),
    ("train-optimizer-junk", ["train", "optimizer=junk"], "choose from"),
    ("train-model-unknown-module", ["train", "model={d}/unknown.yaml"], "unknown module 'C2ff'"),
    ("train-data-images-missing", ["train", "data={d}/no-images.yaml"], "do not exist"),
    ("train-data-not-downloaded", ["train", "data=coco8.yaml"], "yolo-det does not download datasets"),
    ("train-name-list", ["train", "name=[1,2]"], "is not a folder name"),
    ("train-project-dev-null", ["train", "project=/dev/null"], "is not a folder"),
    ("train-project-under-a-file", ["train", "project={d}/text.pt/runs"], "which is not a folder"),
    ("train-profile-env-nul", ["train", "--profile", "{d}/nul-profile.yaml"], "NUL"),
    ("train-override-alias-bomb",
     ["train", "epochs=" + "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                                   "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                                   "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"],
     "aliases expand to more than"),
    ("train-override-deep", ["train", "imgsz=" + "[" * 3000 + "]" * 3000], "nested more than"),
    ("train-profile-alias-bomb", ["train", "--profile", "{d}/bomb-profile.yaml"], "aliases expand to more than"),
    ("train-profile-deep", ["train", "--profile", "{d}/deep-profile.yaml"], "nested more than"),
    ("train-profile-extends-cycle", ["train", "--profile", "{d}/p/up.yaml"], "forms a cycle"),
    ("train-hostile-checkpoint", ["train", "model={d}/evil.pt"], "--trust-checkpoint"),
    ("digest-hostile-checkpoint", ["digest", "{d}/evil.pt"], "--trust-checkpoint"),
    ("audit-hostile-checkpoint", ["audit", "{d}/evil.pt"], "--trust-checkpoint"),
    ("audit-state-dict-checkpoint", ["audit", "{d}/state-dict.pt"], "stores no model YAML"),
    ("audit-activation-code", ["audit", "{d}/act-code.yaml", "--imgsz", "64"], "'activation:"),
    ("rewrite-activation-code", ["rewrite", "{d}/act-code.yaml", "-o", "{d}/out.yaml"], "'activation:"),
    ("audit-model-alias-bomb", ["audit", "{d}/bomb-model.yaml"], "aliases expand to more than"),
    ("rewrite-model-alias-bomb", ["rewrite", "{d}/bomb-model.yaml", "-o", "{d}/out.yaml"],
     "aliases expand to more than"),
    ("rewrite-model-deep", ["rewrite", "{d}/deep-model.yaml", "-o", "{d}/out.yaml"], "nested more than"),
    ("patch-folder-links-outside", ["patch-yolov5", "{d}/linked-yolov5"], "outside the tree"),
    # the command line itself
    ("unknown-command", ["trian"], "invalid choice: 'trian'"),
    ("unknown-option", ["train", "--profil", "repro"], "unrecognized arguments"),
]


# 10 ** 10 nodes from 400 bytes: every level is ten aliases of the one before
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefghi", "bcdefghij"))


class _Marker:
    """Unpickling this runs code that creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        import builtins

        return (builtins.exec, (f"open({self.path!r}, 'w').close()",))


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
    (d / "no-images.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a]\n")
    (d / "nul-profile.yaml").write_text('extends: repro\ntrain:\n  env:\n    CUBLAS_WORKSPACE_CONFIG: ":4096\\0:8"\n')
    (d / "bomb-profile.yaml").write_text(BOMB + "train:\n  seed: *j\n")
    (d / "deep-profile.yaml").write_text("train: " + "[" * 2000 + "]" * 2000 + "\n")
    (d / "p").mkdir()
    (d / "p" / "up.yaml").write_text("extends: ../p/up.yaml\n")
    marker = d / "MARKER"  # created if anything unpickles evil.pt, or evaluates act-code.yaml's activation
    torch.save({"model": None, "ema": torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1)), "x": _Marker(marker)},
               d / "evil.pt")
    torch.save(torch.nn.Conv2d(3, 4, 1).state_dict(), d / "state-dict.pt")
    (d / "act-code.yaml").write_text(f"activation: open({str(marker)!r}, 'w').close() or nn.SiLU()\n" + model)
    (d / "bomb-model.yaml").write_text(BOMB + model)
    (d / "deep-model.yaml").write_text("extra: " + "[" * 2000 + "]" * 2000 + "\n" + model)
    linked = d / "linked-yolov5"
    for rel in ("train.py", "val.py", "utils/general.py", "models/yolo.py"):
        (linked / rel).parent.mkdir(parents=True, exist_ok=True)
        (linked / rel).write_text("# a file\n")
    (d / "outside" / "segment").mkdir(parents=True)
    (d / "outside" / "segment" / "train.py").write_text("# a file\n")
    (linked / "segment").symlink_to(d / "outside" / "segment", target_is_directory=True)
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
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the device cases are judged as on a CPU machine
    import ultralytics.utils

    monkeypatch.setattr(ultralytics.utils, "DATASETS_DIR", d / "datasets")  # coco8 is not there, on any machine
    before = state_of(d)
    code = main([a.replace("{d}", str(d)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("yolo-det: error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert "Traceback" not in err + out
    assert state_of(d) == before  # nothing created, nothing changed
    assert not (d / "MARKER").exists()  # nothing from the files ran


def test_every_case_answers_fast(tmp_path, capsys, monkeypatch):
    """The hostile inputs (bombs, deep nesting, cycles) answer within a second each."""
    import time

    d = tmp_path / "work"
    d.mkdir()
    scratch(d)
    monkeypatch.chdir(d)
    for warm in (["train", "epoch=1"], ["audit", str(d / "missing.yaml")], ["rewrite", str(d / "notmodel.yaml")]):
        main(warm)  # the imports happen once, before the clock starts
    capsys.readouterr()
    for name, argv, _ in CASES:
        if not any(k in name for k in ("bomb", "deep", "cycle")):
            continue
        start = time.process_time()
        code = main([a.replace("{d}", str(d)) for a in argv])
        elapsed = time.process_time() - start
        capsys.readouterr()
        assert code == 2 and elapsed < 1.0, (name, elapsed)
