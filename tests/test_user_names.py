"""The user's names win, and the user's own blocks come in with --import (or modules= / custom_modules)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from ultralytics.nn import tasks

from helpers import small_train_tokens, subprocess_env
from yolo_det.analysis.models import EXAMPLES
from yolo_det.analysis.names import custom_modules, module_classes
from yolo_det.analysis.zoo import ZOO_MODULES
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.layers.registry import registered

ROOT = Path(__file__).resolve().parent.parent
SMALL = small_train_tokens(batch=8, nbs=8, fraction=0.25, device=None, exist_ok=None)


class UserCBAM(nn.Module):
    """The user's own CBAMMax: a deterministic gate (no pooling), so a model built with it audits clean."""

    built = 0

    def __init__(self, c1: int, *args: object) -> None:
        super().__init__()
        type(self).built += 1
        self.gate = nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.gate(x))


class UserCoordAtt(UserCBAM):
    """The user's own CoordAtt."""

    built = 0


@pytest.fixture
def user_names(monkeypatch):
    """The user's process binds CBAMMax and CoordAtt to their own classes (as community forks of tasks.py do)."""
    monkeypatch.setitem(vars(tasks), "CBAMMax", UserCBAM)
    monkeypatch.setitem(vars(tasks), "CoordAtt", UserCoordAtt)
    UserCBAM.built = UserCoordAtt.built = 0
    before = dict(vars(tasks))
    yield
    assert vars(tasks) == before  # nothing left behind, nothing of the user's replaced


def test_registered_keeps_the_users_binding_and_removes_only_what_it_added(monkeypatch):
    class Mine(nn.Identity):
        pass

    class Later(nn.Identity):
        pass

    monkeypatch.setitem(vars(tasks), "CBAMMax", Mine)
    before = dict(vars(tasks))
    with registered(ZOO_MODULES) as kept:
        assert kept == ["CBAMMax"]
        assert vars(tasks)["CBAMMax"] is Mine
        assert vars(tasks)["CoordAtt"] is ZOO_MODULES["CoordAtt"]
        vars(tasks)["CoordAtt"] = Later  # the user rebinds a name the block added: theirs stays
    assert vars(tasks)["CoordAtt"] is Later
    assert vars(tasks)["CBAMMax"] is Mine
    del vars(tasks)["CoordAtt"]
    assert vars(tasks) == before


def test_custom_modules_registers_defined_classes_only_and_never_replaces(tmp_path, monkeypatch):
    blocks = tmp_path / "ydt_user_blocks.py"
    blocks.write_text(
        textwrap.dedent("""
        from torch import nn
        from ultralytics.nn.modules import C2f  # imported, not defined here

        class YdtGate(nn.Identity):
            pass

        class Conv(nn.Identity):  # a copy of Ultralytics' Conv in the user's file
            pass
    """)
    )
    monkeypatch.delitem(sys.modules, "ydt_user_blocks", raising=False)
    before = dict(vars(tasks))
    try:
        with custom_modules(str(blocks)) as added:
            assert vars(tasks)["YdtGate"].__module__ == "ydt_user_blocks"
            assert "YdtGate" in added
            assert vars(tasks)["Conv"] is before["Conv"]
            assert "Conv" not in added
            assert "C2f" not in added
            assert vars(tasks)["DetUpsample"].__name__ == "DetUpsample"
        assert set(module_classes(sys.modules["ydt_user_blocks"])) == {"YdtGate", "Conv"}
    finally:
        sys.modules.pop("ydt_user_blocks", None)
    assert vars(tasks) == before


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ydt_no_such_module", "cannot import 'ydt_no_such_module'"),
        ("raises.py", "it raised ZeroDivisionError"),
        ("missing.py", "no such file"),
    ],
)
def test_a_module_that_cannot_be_imported_is_one_line_exit_2(spec, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "raises.py").write_text("x = 1 / 0\n")
    out = tmp_path / "out.yaml"
    assert main(["rewrite", "--import", spec, str(EXAMPLES / "bicubic-up.yaml"), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    sys.modules.pop("raises", None)
    with pytest.raises(ConfigError, match="cannot import"), custom_modules(spec):
        pass


def test_yolo_det_names_resolve_where_the_user_binds_the_example_names(user_names, tmp_path, capsys):
    """rewrite and audit build the user's classes; the rewritten YAML audits as the user's."""
    src = EXAMPLES / "attention-mix.yaml"
    out = tmp_path / "mix.yaml"
    assert main(["rewrite", str(src), "-o", str(out), "--policy", "all", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert UserCBAM.built > 0
    assert UserCoordAtt.built > 0
    text = out.read_text()
    assert "DetCBAMMax" not in text
    assert "DetCoordAtt" not in text
    assert result["changed"]
    assert "DetUpsample" in text
    UserCBAM.built = 0
    assert main(["audit", str(out), "--imgsz", "64"]) == 0  # ...and resolve; the user's gates are deterministic
    assert UserCBAM.built > 0
    assert main(["audit", str(src), "--imgsz", "64"]) == 0  # with the zoo's CBAMMax this exits 1


@pytest.mark.slow
def test_train_and_verify_build_the_users_classes(user_names, tmp_path, capsys):
    assert main(["train", "model=attention-mix.yaml", *SMALL, f"project={tmp_path}", "name=run"]) == 0
    assert "weights digest:" in capsys.readouterr().out
    ckpt = torch.load(tmp_path / "run" / "weights" / "last.pt", map_location="cpu", weights_only=False)
    layers = ckpt["model"].model
    assert type(layers[10]) is UserCBAM
    assert type(layers[17]) is UserCoordAtt
    UserCBAM.built = 0
    assert main(["verify", "--steps", "1", "model=attention-mix.yaml", *SMALL]) == 0
    assert UserCBAM.built >= 2
    assert "bitwise identical" in capsys.readouterr().out


BLOCKS = '''
import torch
from torch import nn
from ultralytics.nn.modules import Conv  # imported: not one of this module's blocks


class MaxGate(nn.Module):
    """Channel attention from a max-pooled descriptor (AdaptiveMaxPool2d: no deterministic CUDA backward)."""

    def __init__(self, c1):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Conv2d(c1, c1, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc(self.pool(x)))
'''


def _user_project(tmp_path: Path) -> Path:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "blocks.py").write_text(BLOCKS)
    text = (EXAMPLES / "cbam-max.yaml").read_text().replace("CBAMMax, [128]", "MaxGate, [128]")
    assert "MaxGate" in text
    (tmp_path / "my.yaml").write_text(text)
    return tmp_path


def test_audit_import_names_the_users_layer(tmp_path, monkeypatch, capsys):
    project = _user_project(tmp_path)
    monkeypatch.chdir(project)
    try:
        assert main(["audit", "my.yaml", "--imgsz", "64"]) == 2
        err = capsys.readouterr().err
        assert "unknown module 'MaxGate'" in err
        assert "--import" in err
        assert main(["audit", "--import", "mypkg.blocks", "my.yaml", "--imgsz", "64", "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        (finding,) = report["findings"]
        assert finding["layer"] == 10
        assert finding["layer_class"] == "MaxGate"
        assert finding["module"] == "model.10.pool"
        from yolo_det import audit

        assert not audit("my.yaml", imgsz=64, modules=["mypkg.blocks"]).ok
        assert "MaxGate" not in vars(tasks)  # scoped to the call
    finally:
        for name in ("mypkg.blocks", "mypkg"):
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_train_import_in_a_fresh_process_twice_with_equal_digests(tmp_path):
    project = _user_project(tmp_path)
    env = subprocess_env()
    digests = []
    for name in ("a", "b"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "yolo_det",
                "train",
                "--import",
                "mypkg.blocks",
                "model=my.yaml",
                *SMALL,
                f"project={project / 'runs'}",
                f"name={name}",
            ],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [x for x in proc.stdout.splitlines() if x.startswith("weights digest: ")]
        assert len(line) == 1
        digests.append(line[0].split()[2])
        record = json.loads((project / "runs" / name / "determinism.json").read_text())
        assert any(s["path"] == "model.10.pool" for s in record["swaps"])  # the user's max pool was swapped
    assert digests[0] == digests[1]
