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
    # values Ultralytics would reject only after the run began
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
    (
        "train-override-alias-bomb",
        [
            "train",
            "epochs=" + "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
            "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
            "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]",
        ],
        "aliases expand to more than",
    ),
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
    (
        "rewrite-model-alias-bomb",
        ["rewrite", "{d}/bomb-model.yaml", "-o", "{d}/out.yaml"],
        "aliases expand to more than",
    ),
    ("rewrite-model-deep", ["rewrite", "{d}/deep-model.yaml", "-o", "{d}/out.yaml"], "nested more than"),
    ("patch-folder-links-outside", ["patch-yolov5", "{d}/linked-yolov5"], "outside the tree"),
    # the command line itself
    ("unknown-command", ["trian"], "invalid choice: 'trian'"),
    ("unknown-option", ["train", "--profil", "repro"], "unrecognized arguments"),
    ("unknown-option-after-overrides", ["train", "epochs=1", "--bogus"], "unrecognized arguments: --bogus"),
    # sizes and devices
    ("train-imgsz-2-31", ["train", "imgsz=2147483648"], "beyond 16384 pixels"),
    ("train-imgsz-list-huge", ["train", "imgsz=[640,2147483648]"], "beyond 16384 pixels"),
    ("train-imgsz-zero", ["train", "imgsz=0"], "is not an image size"),
    ("train-imgsz-negative", ["train", "imgsz=-5"], "is not an image size"),
    ("train-device-cpu-twice", ["train", "device=cpu,cpu"], "is not a device yolo-det trains on"),
    ("train-device-tpu", ["train", "device=tpu"], "is not a device yolo-det trains on"),
    ("train-device-same-gpu-twice", ["train", "device=0,0"], "names CUDA device 0 twice"),
    ("train-device-minus-two", ["train", "device=-2"], "is not a device"),
    ("train-device-float", ["train", "device=1.5"], "is not a device"),
    ("train-device-empty-list", ["train", "device=[]"], "is not a list of CUDA indices"),
    ("train-device-mps-absent", ["train", "device=mps"], "MPS"),
    # the run folder: name= is a folder name, project= a place that can be written
    ("train-project-proc", ["train", "project=/proc"], "cannot create the run folder in '/proc'"),
    ("train-project-sys", ["train", "project=/sys"], "cannot create the run folder in '/sys'"),
    ("train-project-5000", ["train", "project=" + "p" * 5000], "5000 characters long"),
    ("train-project-deep-5000", ["train", "project=" + "p/" * 2500], "characters long"),
    ("train-project-long-part", ["train", "project={d}/" + "q" * 300], "a folder name of 300 characters"),
    ("train-project-climbs-out", ["train", "project=../outside"], "climbs out of the runs folder"),
    ("train-project-escape-chars", ["train", "project={d}/a\x1b[2Kb"], r"a\x1b[2Kb"),  # shown escaped
    ("train-name-300", ["train", "name=" + "n" * 300], "300 characters long"),
    ("train-name-climbs-out", ["train", "name=../../x"], "is not a folder name (it holds a path)"),
    ("train-name-absolute", ["train", "name={d}/abs"], "is not a folder name (it holds a path)"),
    ("train-name-nested", ["train", "name=a/b"], "is not a folder name (it holds a path)"),
    ("train-name-dot-dot", ["train", "name=.."], "is not a folder name"),
    ("train-name-dot", ["train", "name=."], "is not a folder name"),
    ("train-name-escape-chars", ["train", 'name="a\\x07b"'], "control characters"),
    ("train-name-is-a-file", ["train", "project={d}", "name=text.pt"], "exists and is not a folder"),
    # split=, cfg=
    ("train-split-junk", ["train", "split=junk"], "is not a split"),
    ("train-split-number", ["train", "split=3"], "'split' must be a str"),
    ("train-split-test-missing", ["train", "data={d}/data-ok.yaml", "split=test"], "has no 'test:' images"),
    ("train-cfg-passwd", ["train", "cfg=/etc/passwd"], "is not a settings YAML"),
    ("train-cfg-data-file", ["train", "cfg={d}/data-ok.yaml"], "pass it as data="),
    ("train-cfg-missing", ["train", "cfg={d}/missing-cfg.yaml"], "cannot read cfg="),
    ("train-cfg-unknown-key", ["train", "cfg={d}/cfg-typo.yaml"], "Did you mean 'epochs'?"),
    ("train-cfg-bad-value", ["train", "cfg={d}/cfg-bad-value.yaml"], "invalid type"),
    ("train-cfg-malformed", ["train", "cfg={d}/broken.yaml"], "malformed YAML"),
    ("train-cfg-list", ["train", "cfg={d}/cfg-list.yaml"], "must be a mapping"),
    ("train-cfg-reserved-by-value", ["train", "cfg={d}/cfg-imgsz.yaml"], "beyond 16384 pixels"),
    # models Ultralytics cannot train from
    ("train-model-no-model", ["train", "model={d}/empty.pt"], "holds no model Ultralytics can train from"),
    ("train-model-state-dict", ["train", "model={d}/state-dict.pt"], "holds no model Ultralytics can train from"),
    ("train-model-onnx", ["train", "model={d}/model.onnx"], "neither a model YAML"),
    ("train-model-data-yaml", ["train", "model={d}/data-ok.yaml"], "backbone"),
    ("train-model-number", ["train", "model=5"], "must be a model YAML or a checkpoint path"),
    # data, and data of another task
    ("train-data-folder-detect", ["train", "data={d}/images"], "is a folder, which is classification data"),
    ("train-data-ndjson", ["train", "data={d}/x.ndjson"], "is not a dataset YAML"),
    ("train-data-path-etc", ["train", "data={d}/etc.yaml"], "hold no image files"),
    ("train-data-empty-images", ["train", "data={d}/empty-images.yaml"], "hold no image files"),
    ("train-data-not-a-mapping", ["train", "data={d}/notmodel-list.yaml"], "must be a mapping"),
    ("train-data-number", ["train", "data=5"], "data= must be a path"),
    (
        "train-classify-with-yaml",
        ["train", "model=yolov8n-cls.yaml", "data={d}/data-ok.yaml"],
        "is a dataset YAML but the model is a classify model",
    ),
    (
        "train-pose-without-kpt-shape",
        ["train", "model=yolov8n-pose.yaml", "data={d}/data-ok.yaml"],
        "has no 'kpt_shape:'",
    ),
    ("train-classify-folder-without-train", ["train", "model=yolov8n-cls.yaml", "data={d}/images"], "needs train/"),
    ("train-classify-demo", ["train", "model=yolov8n-cls.yaml"], "the bundled demo data is for detection"),
    # --import: whatever the module raises is one line, exit 2; nothing trained is never a success
    ("train-import-exit-0", ["train", "--import", "{d}/exit0.py"], "it called sys.exit(0)"),
    ("train-import-exit-3", ["train", "--import", "{d}/exit3.py"], "it called sys.exit(3)"),
    ("train-import-base-exception", ["train", "--import", "{d}/base_exc.py"], "it raised Boom"),
    ("train-import-generator-exit", ["train", "--import", "{d}/gen_exit.py"], "it raised GeneratorExit"),
    (
        "train-import-after-overrides",
        ["train", "epochs=1", "--import", "{d}/exit0.py", "model=yolov8n.yaml"],
        "it called sys.exit(0)",
    ),
    ("train-import-missing", ["train", "epochs=1", "--import", "nosuch_module_x", "imgsz=64"], "nosuch_module_x"),
    ("verify-import-exit-0", ["verify", "--import", "{d}/exit0.py"], "it called sys.exit(0)"),
    ("bench-device-tpu", ["bench", "device=tpu"], "is not a device yolo-det trains on"),
    ("verify-name-climbs-out", ["verify", "name=../x"], "is not a folder name"),
    # verify --against: the file is checked field by field before any training
    ("verify-against-weights-list", ["verify", "--against", "{d}/against-weights.json"], "'run.weights' must be"),
    ("verify-against-grads-short", ["verify", "--against", "{d}/against-grads.json"], "'run.steps[0].grads' must be"),
    ("verify-against-loss-text", ["verify", "--against", "{d}/against-loss.json"], ".loss' must be a list of numbers"),
    ("verify-against-device-type", ["verify", "--against", "{d}/against-device.json"], "'run.device_type' must be"),
    ("verify-against-step-number", ["verify", "--against", "{d}/against-step.json"], "'run.steps[0]' must be"),
    ("verify-against-args-list", ["verify", "--against", "{d}/against-args.json"], "'args' must be a mapping"),
    ("verify-against-record-list", ["verify", "--against", "{d}/against-record.json"], "'record' must be a mapping"),
    ("verify-against-steps-requested", ["verify", "--against", "{d}/against-steps.json"], "'steps_requested'"),
    ("verify-against-deep", ["verify", "--against", "{d}/against-deep.json"], "not JSON"),
    # patch-yolov5: a tree it cannot patch whole is not changed at all
    ("patch-not-recognised", ["patch-yolov5", "{d}/fake-yolov5"], "not recognised"),
    ("patch-unknown-marked-line", ["patch-yolov5", "{d}/marked-yolov5"], "is marked '# yolo-det'"),
    ("patch-journal-check", ["patch-yolov5", "{d}/journal-yolov5", "--check"], "--repair"),
    ("patch-journal-unreadable", ["patch-yolov5", "{d}/journal-yolov5", "--repair"], "is not a journal"),
]


# 10 ** 10 nodes from 400 bytes: every level is ten aliases of the one before
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefghi", "bcdefghij")
)


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
    torch.save(
        {"model": None, "ema": torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1)), "x": _Marker(marker)}, d / "evil.pt"
    )
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
    marked = d / "marked-yolov5"
    for rel in ("train.py", "val.py", "utils/general.py", "models/yolo.py"):
        (marked / rel).parent.mkdir(parents=True, exist_ok=True)
        (marked / rel).write_text("from utils.general import x\ndef run(\n    pass\n")
    (marked / "val.py").write_text("from utils.general import x\nprint(1)  # yolo-det\ndef run(\n    pass\n")
    journal = d / "journal-yolov5"
    for rel in ("train.py", "val.py", "utils/general.py", "models/yolo.py"):
        (journal / rel).parent.mkdir(parents=True, exist_ok=True)
        (journal / rel).write_text("# a file\n")
    (journal / ".yolo-det-patch.journal").write_text("{not json")
    (d / "images").mkdir()
    (d / "images" / "a.jpg").write_bytes(b"")
    (d / "empty-images").mkdir()
    (d / "data-ok.yaml").write_text(f"path: {d}\ntrain: images\nval: images\nnames: [a]\n")
    (d / "etc.yaml").write_text("path: /etc\ntrain: .\nval: .\nnames: [a]\n")
    (d / "empty-images.yaml").write_text(f"path: {d}\ntrain: empty-images\nval: images\nnames: [a]\n")
    (d / "notmodel-list.yaml").write_text("- a\n- b\n")
    (d / "x.ndjson").write_text("{}\n")
    (d / "model.onnx").write_bytes(b"onnx")
    (d / "cfg-typo.yaml").write_text("epoch: 3\n")
    (d / "cfg-bad-value.yaml").write_text("epochs: three\n")
    (d / "cfg-list.yaml").write_text("- epochs\n")
    (d / "cfg-imgsz.yaml").write_text("imgsz: 2147483648\n")
    (d / "exit0.py").write_text("import sys\nsys.exit(0)\n")
    (d / "exit3.py").write_text("raise SystemExit(3)\n")
    (d / "base_exc.py").write_text("class Boom(BaseException):\n    pass\nraise Boom('no')\n")
    (d / "gen_exit.py").write_text("raise GeneratorExit\n")
    import json

    def against(name: str, edit) -> None:
        batch = {"index": 0, "epoch": 0, "data": "d", "raw": "r", "files": ["images/a.jpg"], "loss": [0.5]}
        step = {"step": 1, "epoch": 0, "scale": 1.0, "weights": "w", "grads": ["g", "h"], "batches": [batch]}
        run = {
            "param_names": ["a", "b"],
            "loss_names": ["box"],
            "weights": {"model": "m"},
            "optimizer_steps": 1,
            "device_type": "cpu",
            "steps": [step],
        }
        data = {
            "schema": "yolo-det/verify-fingerprints",
            "version": 1,
            "digest": "fingerprint/1",
            "created": "now",
            "profile": "repro",
            "args": {},
            "steps_requested": None,
            "device": "cpu",
            "run": run,
            "record": {},
        }
        edit(data)
        (d / f"against-{name}.json").write_text(json.dumps(data))

    against("weights", lambda x: x["run"].update(weights=[1, 2]))
    against("grads", lambda x: x["run"]["steps"][0].update(grads=["g"]))
    against("loss", lambda x: x["run"]["steps"][0]["batches"][0].update(loss=["x"]))
    against("device", lambda x: x["run"].update(device_type=["cuda"]))
    against("step", lambda x: x["run"].update(steps=[5]))
    against("args", lambda x: x.update(args=[1]))
    against("record", lambda x: x.update(record=[1, 2]))
    against("steps", lambda x: x.update(steps_requested="x"))
    (d / "against-deep.json").write_text("[" * 100_000 + "]" * 100_000)


def state_of(d: Path) -> dict[str, tuple[str, float]]:
    return {
        str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(d)) + "/": ("dir", 0.0) for p in d.rglob("*") if p.is_dir()}


def test_the_table_is_broad():
    assert len(CASES) >= 100
    assert len({name for name, _, _ in CASES}) == len(CASES)
    assert {argv[0] for _, argv, _ in CASES} >= {
        "train",
        "profiles",
        "digest",
        "audit",
        "rewrite",
        "verify",
        "bench",
        "patch-yolov5",
    }


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
    from yolo_det.commands import train as train_command
    from yolo_det.tools import verify as verify_command  # the command imports these from here when it runs

    def no_training(*args, **kwargs):
        raise AssertionError(f"{name}: trained despite the bad input")

    for module, attr in ((train_command, "train"), (verify_command, "record_runs"), (verify_command, "verify")):
        monkeypatch.setattr(module, attr, no_training)
    before = state_of(d)
    code = main([a.replace("{d}", str(d)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("yolo-det: error: "), err
    assert err.count("\n") == 1, err
    assert fragment in err, err
    assert "Traceback" not in err + out
    assert "\x1b" not in err
    assert "\r" not in err
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
        assert code == 2, (name, elapsed)
        assert elapsed < 1.0, (name, elapsed)
