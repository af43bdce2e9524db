"""A checkpoint is usable where yolo-det is not: every YAML in data/models and every layer yolo-det's rewrite writes
gives a checkpoint that plain Ultralytics loads, rebuilds from its YAML (fine-tuning), validates, predicts with and
exports, in a process that never imports yolo_det. The user's own blocks: a single-input block that keeps its
channels fine-tunes there with its module imported; a block plain Ultralytics cannot build (three inputs) is said
in one line when the run starts saving, and in the record."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import subprocess_env
from yolo_det.cli import main
from yolo_det.core.record import RECORD_NAME

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "data" / "models"
SMALL = ["imgsz=64", "batch=8", "nbs=8", "fraction=0.25", "plots=false", "workers=0", "device=cpu"]
NAME = "held_blocks_i38"


def _plain(script: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a python where yolo_det cannot be imported (the repository is not on its path)."""
    env = subprocess_env()
    env["PYTHONPATH"] = ""  # the repository is not on the path: ``import yolo_det`` would fail
    guard = (
        "import sys\n"
        "class NoYoloDet:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name == 'yolo_det' or name.startswith('yolo_det.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}: this process runs without yolo-det')\n"
        "sys.meta_path.insert(0, NoYoloDet)\n"
        f"sys.path.insert(0, {str(cwd / 'zoo_only')!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", guard + script, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "yolo_det modules: []" in done.stdout, done.stdout[-2000:]
    return done


def _zoo_only(folder: Path) -> None:
    """A folder holding the standalone example blocks (as an installed yolo-det puts them beside yolo_det)."""
    import shutil

    shutil.copytree(REPO / "yolo_det_zoo", folder / "zoo_only" / "yolo_det_zoo")


def _image() -> str:
    from yolo_det.tools.demo import demo_data_yaml

    return str(next((Path(demo_data_yaml()).parent / "demo" / "images" / "val").glob("*")))


def _data() -> str:
    from yolo_det.tools.demo import demo_data_yaml

    return str(demo_data_yaml())


LOAD_ALL = """
import copy
import torch
from ultralytics import YOLO
from ultralytics.nn.tasks import DetectionModel

image = sys.argv[1]
for ckpt in sys.argv[2:]:
    model = YOLO(ckpt)
    net = model.model.float().eval()
    # what fine-tuning builds
    rebuilt = DetectionModel(copy.deepcopy(net.yaml), ch=3, nc=net.yaml["nc"], verbose=False).eval()
    rebuilt.load_state_dict(net.state_dict())  # every tensor, same names and shapes
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = net(x)[0], rebuilt(x)[0]
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (ckpt, (a - b).abs().max())
    model.predict(image, imgsz=64, save=False, device="cpu", verbose=False)
    model.export(format="torchscript", imgsz=64)
    print("ok", ckpt)
assert "yolo_det" not in sys.modules
print("yolo_det modules:", sorted(k for k in sys.modules if k.split(".")[0] == "yolo_det"))
"""


def _checkpoint(yaml_path: Path, out: Path) -> Path:
    """A checkpoint as a yolo-det training stores it (the EMA in float16, the YAML made portable)."""
    from ultralytics import YOLO

    from yolo_det.analysis.blocks import portable_config
    from yolo_det.analysis.models import model_names

    with model_names():  # yolo-det's names resolve, as during a yolo-det training
        net = YOLO(str(yaml_path)).model
        net.yaml = portable_config(net.yaml, [])
    torch.save({"model": None, "ema": copy.deepcopy(net).half(), "train_args": {"task": "detect"}}, out)
    return out


def test_every_example_yaml_and_its_rewrite_loads_rebuilds_and_exports_without_yolo_det(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _zoo_only(tmp_path)
    files = []
    rewritten = set()
    for yaml_path in sorted(MODELS.glob("*.yaml")):
        files.append(_checkpoint(yaml_path, tmp_path / f"{yaml_path.stem}.pt"))
        det = tmp_path / f"det-{yaml_path.name}"
        assert main(["rewrite", str(yaml_path), "-o", str(det)]) == 0
        rewritten |= {w for w in det.read_text().split() if w.startswith("Det")}
        files.append(_checkpoint(det, tmp_path / f"det-{yaml_path.stem}.pt"))
    # the rewrite wrote each kind of yolo-det layer: torch's and the example blocks' variants
    assert {"DetCBAMMax,", "DetCoordAtt,", "DetGridSampleUpsample,", "DetUpsample,"} <= rewritten, rewritten
    done = _plain(LOAD_ALL, _image(), *map(str, files), cwd=tmp_path)
    assert done.stdout.count("ok ") == len(files) == 10


PLAIN = """
from ultralytics import YOLO

ckpt, data, out, image, types = sys.argv[1:6]
if len(sys.argv) > 6:  # the user's module, imported and bound as adding it to ultralytics.nn.tasks' imports does
    import importlib
    import ultralytics.nn.tasks as tasks
    module = importlib.import_module(sys.argv[6])
    for name in sys.argv[7:]:
        setattr(tasks, name, getattr(module, name))
model = YOLO(ckpt)
model.train(data=data, epochs=1, imgsz=64, batch=8, nbs=8, fraction=0.25, workers=0, plots=False, device="cpu",
            project=out, name="ft", exist_ok=True)
tuned = YOLO(out + "/ft/weights/last.pt")
seen = {i: m.type for i, m in enumerate(tuned.model.model)}
for item in types.split(","):
    i, kind = item.split("=")
    assert seen[int(i)] == kind, seen
tuned.val(data=data, imgsz=64, batch=8, workers=0, plots=False, device="cpu", project=out, name="val")
tuned.predict(image, imgsz=64, save=False, device="cpu")
tuned.export(format="torchscript", imgsz=64)
assert "yolo_det" not in sys.modules
print("yolo_det modules:", sorted(k for k in sys.modules if k.split(".")[0] == "yolo_det"))
"""


def test_a_rewritten_example_checkpoint_fine_tunes_in_plain_ultralytics(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _zoo_only(tmp_path)
    assert main(["audit", "--fix", str(MODELS / "attention-mix.yaml"), "-o", "det.yaml"]) in (0, 1)
    assert "DetCBAMMax" in (tmp_path / "det.yaml").read_text()
    assert main(["train", "model=det.yaml", "epochs=1", *SMALL, f"project={tmp_path / 'runs'}", "name=a"]) == 0
    assert "fine-tune only with yolo-det" not in capsys.readouterr().err
    record = json.loads((tmp_path / "runs" / "a" / RECORD_NAME).read_text())
    assert record["checkpoint_yaml_layers"] == {"10": "DetCBAMMax", "17": "DetCoordAtt"}
    assert record["checkpoint_needs"] == {"modules": {}, "yolo_det": []}
    best = tmp_path / "runs" / "a" / "weights" / "best.pt"
    types = "10=yolo_det_zoo.CBAMMax,17=yolo_det_zoo.CoordAtt"
    _plain(PLAIN, str(best), _data(), str(tmp_path / "plain"), _image(), types, cwd=tmp_path)
    assert list((tmp_path / "plain" / "ft" / "weights").glob("last.torchscript"))


BLOCKS = '''
import torch
from torch import nn


class Gate(nn.Module):
    """Squeeze-excite gate; its hidden width follows the channels (declared), it keeps its input channels."""

    yolo_det_channels = staticmethod(lambda c, r=4: (c, [c, max(c // r, 8)]))

    def __init__(self, c1, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c1, hidden, 1), nn.Conv2d(hidden, c1, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))


class Fuse3(nn.Module):
    """A weighted sum of three maps of equal channels."""

    yolo_det_channels = staticmethod(lambda c_in: (c_in[0], [c_in[0]]))

    def __init__(self, c1):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.conv = nn.Conv2d(c1, c1, 1)

    def forward(self, xs):
        w = torch.softmax(self.w, 0)
        return self.conv(w[0] * xs[0] + w[1] * xs[1] + w[2] * xs[2])
'''

GATED = """\
nc: 3
backbone:
  - [-1, 1, Conv, [16, 3, 2]] # 0
  - [-1, 1, Conv, [32, 3, 2]] # 1
  - [-1, 1, Conv, [32, 3, 2]] # 2
  - [-1, 1, Gate, []] # 3
  - [-1, 1, Conv, [32, 3, 2]] # 4
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]] # 5
  - [[-1, 3], 1, Concat, [1]] # 6
  - [-1, 1, Conv, [32, 3, 1]] # 7
  - [[7, 4], 1, Detect, [nc]] # 8
"""

FUSED = """\
nc: 3
backbone:
  - [-1, 1, Conv, [16, 3, 2]] # 0
  - [-1, 1, Conv, [32, 3, 2]] # 1
  - [-1, 1, Conv, [32, 3, 2]] # 2
  - [-1, 1, Conv, [32, 3, 1]] # 3
  - [-1, 1, Conv, [32, 3, 2]] # 4
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]] # 5
  - [[-1, 3, 2], 1, Fuse3, []] # 6
  - [[6, 4], 1, Detect, [nc]] # 7
"""

PREDICT_ONLY = """
import importlib
from ultralytics import YOLO

ckpt, image, module = sys.argv[1:4]
importlib.import_module(module)  # the module importable is what loading, predicting and exporting need
model = YOLO(ckpt)
model.predict(image, imgsz=64, save=False, device="cpu")
model.export(format="torchscript", imgsz=64)
assert "yolo_det" not in sys.modules
print("yolo_det modules:", sorted(k for k in sys.modules if k.split(".")[0] == "yolo_det"))
"""


@pytest.fixture
def blocks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{NAME}.py").write_text(BLOCKS, encoding="utf-8")
    (tmp_path / "gated.yaml").write_text(GATED, encoding="utf-8")
    (tmp_path / "fused.yaml").write_text(FUSED, encoding="utf-8")
    _zoo_only(tmp_path)
    yield tmp_path
    sys.modules.pop(NAME, None)


def test_the_users_blocks_plain_ultralytics_needs_their_module_or_is_told_it_needs_yolo_det(blocks, capsys):
    mod = f"{NAME}.py"
    # a declared single-input block that keeps its channels: its module imported and bound is enough
    assert (
        main(["train", "--import", mod, "model=gated.yaml", "epochs=1", *SMALL, f"project={blocks / 'runs'}", "name=g"])
        == 0
    )
    assert "fine-tune only with yolo-det" not in capsys.readouterr().err
    record = json.loads((blocks / "runs" / "g" / RECORD_NAME).read_text())
    assert record["checkpoint_needs"] == {"modules": {"Gate": NAME}, "yolo_det": []}
    best = blocks / "runs" / "g" / "weights" / "best.pt"
    cfg = torch.load(best, map_location="cpu", weights_only=False)["model"].yaml
    assert cfg["backbone"][3] == [-1, 1, "Gate", [32, 8]]  # what its constructor received, passed as it is
    assert cfg["yolo_det"]["args"] == {"3": []}  # the YAML's own arguments, for yolo-det
    _plain(PLAIN, str(best), _data(), str(blocks / "plain"), _image(), f"3={NAME}.Gate", NAME, "Gate", cwd=blocks)
    # fine-tuning it again in yolo-det rebuilds it from the YAML's own arguments, through the channel rule
    tuned = blocks / "plain" / "ft" / "weights" / "last.pt"
    assert (
        main(["train", "--import", mod, f"model={tuned}", "epochs=1", *SMALL, f"project={blocks / 'runs'}", "name=g2"])
        == 0
    )

    # a three-input block: one line when the run starts, and the record, say why only yolo-det fine-tunes it
    assert (
        main(["train", "--import", mod, "model=fused.yaml", "epochs=1", *SMALL, f"project={blocks / 'runs'}", "name=f"])
        == 0
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "fine-tune only with yolo-det" in ln]
    assert len(lines) == 1, lines
    assert "layer 6 (Fuse3) takes 3 inputs" in lines[0], lines[0]
    record = json.loads((blocks / "runs" / "f" / RECORD_NAME).read_text())
    said = lines[0].split("fine-tune only with yolo-det: ", 1)[1].split(" (plain Ultralytics")[0]
    assert record["checkpoint_needs"]["yolo_det"] == [said]
    # what plain Ultralytics can do with it, the module importable: load, predict, export
    _plain(PREDICT_ONLY, str(blocks / "runs" / "f" / "weights" / "best.pt"), _image(), NAME, cwd=blocks)
