"""From an empty folder, as a user: a model with a two-input weighted add and a single-input attention block whose
width follows a rule goes through audit, rewrite, train and resume (the run remembers its --import); a wrongly
declared block is one line naming its layer; a checkpoint of a rewritten YAML fine-tunes in plain Ultralytics."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import small_train_tokens, train_stopped_after
from yolo_det.cli import main
from yolo_det.core.record import RECORD_NAME

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

SMALL = small_train_tokens(epochs=None, batch=8, nbs=8, fraction=0.25, exist_ok=None)
NAME = "held_blocks_i26"

BLOCKS = '''
import torch
from torch import nn


class WeightedAdd2(nn.Module):
    """BiFPN fast normalised fusion of two maps of equal channels."""

    yolo_det_channels = staticmethod(lambda c_in: (c_in[0], [c_in[0]]))

    def __init__(self, c1):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.conv = nn.Conv2d(c1, c1, 1)

    def forward(self, xs):
        w = torch.relu(self.w)
        w = w / (w.sum() + 1e-4)
        return self.conv(w[0] * xs[0] + w[1] * xs[1])


class GateAttention(nn.Module):
    """Squeeze-excite gate; its hidden width follows the channels: c // r, at least 8."""

    yolo_det_channels = staticmethod(lambda c, r=4: (c, [c, max(c // r, 8)]))

    def __init__(self, c1, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c1, hidden, 1), nn.Conv2d(hidden, c1, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))


class Doubler(nn.Module):
    """Wrongly declared: the rule hands it twice the channels it receives."""

    yolo_det_channels = staticmethod(lambda c: (c, [2 * c]))

    def __init__(self, c1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c1, 1)

    def forward(self, x):
        return self.conv(x)
'''

MODEL = """\
nc: 3
backbone:
  - [-1, 1, Conv, [16, 3, 2]] # 0
  - [-1, 1, Conv, [32, 3, 2]] # 1
  - [-1, 1, Conv, [32, 3, 2]] # 2
  - [-1, 1, {attention}, []] # 3
  - [-1, 1, Conv, [32, 3, 2]] # 4
head:
  - [-1, 1, nn.Upsample, [None, 2, "bicubic"]] # 5
  - [[-1, 3], 1, WeightedAdd2, []] # 6
  - [-1, 1, Conv, [32, 3, 2]] # 7
  - [[-1, 4], 1, WeightedAdd2, []] # 8
  - [[6, 8], 1, Detect, [nc]] # 9
"""


def _train_until(tokens: list[str], module: str, after: int) -> Path:
    """``yolo-det train --import MODULE TOKENS``, stopped cleanly (an interrupted job) once epoch ``after`` is saved."""
    return train_stopped_after(tokens, after, modules=[module])


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{NAME}.py").write_text(BLOCKS, encoding="utf-8")
    (tmp_path / "m.yaml").write_text(MODEL.format(attention="GateAttention"), encoding="utf-8")
    (tmp_path / "wrong.yaml").write_text(MODEL.format(attention="Doubler"), encoding="utf-8")
    yield tmp_path
    sys.modules.pop(NAME, None)


def test_blocks_through_audit_rewrite_train_and_resume(project, capsys):
    mod = f"{NAME}.py"
    # a wrongly declared block: one line naming it, its layer and its line; nothing written
    assert main(["train", "--import", mod, "model=wrong.yaml", "epochs=1", *SMALL, "project=runs", "name=w"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "wrong.yaml:6: layer 3 (Doubler, from -1)" in err, err
    assert not (project / "runs").exists()
    # rewrite, and the audit of its output reports yolo-det's layer as fixed
    assert main(["rewrite", "--import", mod, "m.yaml", "-o", "det.yaml"]) == 0
    assert "DetUpsample" in (project / "det.yaml").read_text()
    capsys.readouterr()
    assert main(["audit", "--import", mod, "det.yaml"]) == 0
    assert "fixed: layer 5 (line 9) model.5 DetUpsample" in capsys.readouterr().out
    # train, interrupted after epoch 1 of 2: the record and the checkpoint name the module
    last = _train_until(["model=det.yaml", "epochs=2", *SMALL, f"project={project / 'runs'}", "name=r"], mod, 1)
    # the two-input blocks: one line says only yolo-det fine-tunes its checkpoints
    assert "fine-tune only with yolo-det: layer 6 (WeightedAdd2) takes 2 inputs" in capsys.readouterr().err
    run = last.parent.parent
    record = json.loads((run / RECORD_NAME).read_text())
    digest = hashlib.sha256((project / mod).read_bytes()).hexdigest()
    assert record["imports"] == [{"name": NAME, "path": str(project / mod), "sha256": digest}]
    assert record["checkpoint_yaml_layers"] == {"5": "DetUpsample"}
    cfg = torch.load(last, map_location="cpu", weights_only=False)["ema"].yaml
    assert cfg["head"][0][2] == "nn.Upsample"
    assert cfg["yolo_det"]["imports"] == record["imports"]
    # resuming without --import is one line naming the --import to add, nothing imported (the file beside it is
    # unchanged) and nothing written into the run
    sys.modules.pop(NAME, None)
    before = _files(run)
    assert main(["train", f"resume={last}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"add --import {NAME}" in err, err
    assert NAME not in sys.modules
    assert _files(run) == before
    assert main(["audit", str(last)]) == 2  # the audit of the checkpoint too
    assert f"add --import {NAME}" in capsys.readouterr().err
    assert NAME not in sys.modules
    # on the user's word: the audit rebuilds yolo-det's layer, and the resume finishes the run
    assert main(["audit", "--import", mod, str(last)]) == 0
    assert "fixed: layer 5" in capsys.readouterr().out
    assert main(["train", "--import", mod, f"resume={last}"]) == 0
    record = json.loads((run / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["imports"][0]["sha256"] == digest


PLAIN = """
import sys
from ultralytics import YOLO

ckpt, data, out, image = sys.argv[1:5]
model = YOLO(ckpt)
model.train(data=data, epochs=1, imgsz=64, batch=8, nbs=8, fraction=0.25, workers=0, plots=False, device="cpu",
            project=out, name="ft", exist_ok=True)
tuned = YOLO(out + "/ft/weights/last.pt")
types = [m.type for m in tuned.model.model]
assert types[10] == types[13] == "torch.nn.modules.upsampling.Upsample", types
tuned.val(data=data, imgsz=64, batch=8, workers=0, plots=False, device="cpu", project=out, name="val")
tuned.predict(image, imgsz=64, save=False, device="cpu")
tuned.export(format="torchscript", imgsz=64)
print("imported:", sorted(k for k in sys.modules if k.split(".")[0] == "yolo_det"))
"""


def test_a_rewritten_checkpoint_fine_tunes_in_plain_ultralytics(tmp_path, monkeypatch, capsys):
    from yolo_det.analysis.models import EXAMPLES
    from yolo_det.tools.demo import demo_data_yaml

    monkeypatch.chdir(tmp_path)
    assert main(["rewrite", str(EXAMPLES / "bicubic-up.yaml"), "-o", "det.yaml"]) == 0
    assert main(["train", "model=det.yaml", "epochs=1", *SMALL, f"project={tmp_path / 'runs'}", "name=a"]) == 0
    best = tmp_path / "runs" / "a" / "weights" / "best.pt"
    image = next((Path(demo_data_yaml()).parent / "demo" / "images" / "val").glob("*"))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "YOLO_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(best), str(demo_data_yaml()), str(tmp_path / "plain"), str(image)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported: []" in done.stdout  # the process never imported yolo_det
    assert list((tmp_path / "plain" / "ft" / "weights").glob("last.torchscript"))
