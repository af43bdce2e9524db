"""Checkpoints from others run no code: the pickle scan, the inert reader, and the commands that read checkpoints."""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import small_train, subprocess_env
from yolo_det.cli import main
from yolo_det.core.errors import ModelError
from yolo_det.core.record import checkpoint_digest, state_dict_digest
from yolo_det.core.untrusted import safeload
from yolo_det.core.untrusted.safeload import TRUST_FLAG, check_checkpoint, load_checkpoint, trusted_checkpoints
from yolo_det.layers.registry import registered

SMALL = small_train(val=False)


class Marker:
    """Unpickling this object runs code that creates the file ``path`` (what a hostile checkpoint does)."""

    def __init__(self, path: Path, via: str = "exec") -> None:
        self.path, self.via = str(path), via

    def __reduce__(self):
        if self.via == "exec":
            return (builtins.exec, (f"open({self.path!r}, 'w').write('ran')",))
        if self.via == "system":
            return (os.system, (f"touch {self.path}",))
        return (subprocess.call, (["touch", self.path],))


class UserBlock(nn.Module):
    """A block of the user's own, unknown to Ultralytics: a 1x1 conv, batch norm and SiLU keeping channels."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.register_buffer("scale", torch.ones(1, c, 1, 1))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.bn(self.conv(x))) * self.scale


CUSTOM_YAML = textwrap.dedent("""\
    nc: 2
    backbone:
      - [-1, 1, Conv, [8, 3, 2]]
      - [-1, 1, UserBlock, [8]]
      - [-1, 1, Conv, [16, 3, 2]]
      - [-1, 1, Conv, [16, 3, 2]]
    head:
      - [[2, 3], 1, Detect, [nc]]
    """)


def _reference_digest(path: Path) -> str:
    """The digest as yolo-det computed it before: torch's full unpickler, then the module's own state_dict."""
    return state_dict_digest(_reference_model(path).state_dict())


def _reference_model(path: Path) -> nn.Module:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    return ckpt["ema"] if ckpt.get("ema") is not None else ckpt["model"]


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------------------
# the allow-list


def test_allow_list_names() -> None:
    from yolo_det.core.untrusted.allow import model_class

    for module, name in [
        ("torch.nn.modules.conv", "Conv2d"),
        ("ultralytics.nn.tasks", "DetectionModel"),
        ("ultralytics.nn.modules.block", "C2f"),
        ("yolo_det.layers.upsample", "DetUpsample"),
        ("ultralytics.utils.loss", "v8DetectionLoss"),
    ]:
        assert model_class(module, name) is not None, (module, name)
    for module, name in [
        ("os", "system"),
        ("builtins", "exec"),
        ("ultralytics.nn.tasks", "torch_load"),
        ("ultralytics.nn.tasks", "parse_model"),
        ("torch", "load"),
        ("torch.nn.functional", "relu"),
        ("torch.serialization", "os.system"),
        ("my_project.blocks", "CBAM"),
        ("__main__", "X"),
        ("ultralytics.utils.downloads", "attempt_download_asset"),
    ]:
        assert model_class(module, name) is None, (module, name)


@pytest.mark.parametrize("via", ["exec", "system", "subprocess"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_check_refuses_a_hostile_checkpoint_without_running_it(tmp_path: Path, via: str, protocol: int) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pt"
    torch.save({"model": nn.Linear(2, 2), "extra": Marker(marker, via)}, path, pickle_protocol=protocol)
    with pytest.raises(ModelError) as e:
        check_checkpoint(path)
    assert TRUST_FLAG in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError):  # the inspection reader refuses the call too
        safeload.checkpoint_state_dict(path)
    with trusted_checkpoints():  # ... and under the opt-in keeps it as a placeholder, still running nothing
        assert set(safeload.checkpoint_state_dict(path)) == {"weight", "bias"}
    assert not marker.exists()


def test_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "text.pt").write_text("hello")
    (tmp_path / "pickle.pt").write_bytes(pickle.dumps({"a": 1}))
    for name in ("text.pt", "pickle.pt", "missing.pt"):
        with pytest.raises(ModelError) as e:
            load_checkpoint(tmp_path / name)
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------------------
# the commands on a hostile checkpoint


@pytest.fixture
def evil(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pt"
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False).half()
    torch.save({"epoch": 1, "model": None, "ema": model, "hook": Marker(marker)}, path)
    return path, marker


def test_the_hostile_checkpoint_is_real(evil: tuple[Path, Path]) -> None:
    """Negative control: torch's full unpickler does run the file's code (so the tests below can fail)."""
    path, marker = evil
    torch.load(path, map_location="cpu", weights_only=False)
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("safe_load_env", [None, "1"])
@pytest.mark.parametrize(
    "argv",
    [["digest"], ["audit", "--imgsz", "64"], ["train", "model="], ["verify", "model="], ["bench", "model="]],
    ids=["digest", "audit", "train", "verify", "bench"],
)
def test_commands_refuse_a_hostile_checkpoint(
    evil: tuple[Path, Path],
    argv: list[str],
    safe_load_env: str | None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    path, marker = evil
    if safe_load_env is not None:
        monkeypatch.setenv("ULTRALYTICS_SAFE_LOAD", safe_load_env)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [*argv[:-1], argv[-1] + str(path)] if argv[-1] == "model=" else [*argv, str(path)]
    code, out, err = _cli(capsys, *args)
    assert code == 2, (out, err)
    assert err.count("\n") == 1
    assert err.startswith("yolo-det: error: ")
    assert TRUST_FLAG in err
    assert "exec" in err
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_train_with_ultralytics_safe_load_in_a_fresh_process(evil: tuple[Path, Path], tmp_path: Path) -> None:
    """ULTRALYTICS_SAFE_LOAD=1 is read when Ultralytics is imported: a fresh process, as a user runs it."""
    path, marker = evil
    env = subprocess_env({"ULTRALYTICS_SAFE_LOAD": "1"})
    proc = subprocess.run(
        [sys.executable, "-m", "yolo_det", "train", f"model={path}", f"project={tmp_path}/runs"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1
    assert TRUST_FLAG in proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()


def test_train_precheck_never_unpickles_with_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-check of model=FILE.pt reads the file with yolo-det's allow-list unpickler only: neither torch's
    loader nor Python's full unpickler runs."""
    from yolo_det.tools.prepare import prepare

    path = tmp_path / "clean.pt"
    torch.save({"model": None, "ema": nn.Sequential(nn.Conv2d(3, 4, 1))}, path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickled during the pre-check")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    _, args = prepare("repro", [f"model={path}"])
    assert args["model"] == str(path)


def test_trust_flag_hands_the_file_over(evil: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """digest --trust-checkpoint digests a refused file, still without running it."""
    path, marker = evil
    code, out, err = _cli(capsys, "digest", TRUST_FLAG, str(path))
    assert code == 0, err
    with pytest.raises(ModelError, match="builtins.exec"):
        checkpoint_digest(path)
    with trusted_checkpoints():
        assert out.split()[0] == checkpoint_digest(path)
        assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------
# real checkpoints: same digest as before, audit rebuilds from the stored YAML


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny trainings: yolov8n, and a model with UserBlock (defined in this file) in its backbone."""
    from ultralytics import YOLO

    from yolo_det.tools.demo import demo_data_yaml

    root = tmp_path_factory.mktemp("trained")
    data = str(demo_data_yaml())
    out = {}
    YOLO("yolov8n.yaml").train(data=data, project=str(root), name="plain", **SMALL)
    out["plain"] = root / "plain" / "weights" / "last.pt"
    (root / "custom.yaml").write_text(CUSTOM_YAML)
    with registered({"UserBlock": UserBlock}):
        YOLO(str(root / "custom.yaml")).train(data=data, project=str(root), name="custom", **SMALL)
    out["custom"] = root / "custom" / "weights" / "last.pt"
    return out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["plain", "custom"])
def test_real_checkpoints_digest_as_before(trained: dict[str, Path], which: str) -> None:
    path = trained[which]
    assert checkpoint_digest(path) == _reference_digest(path)
    sd = safeload.checkpoint_state_dict(path)
    ref = _reference_model(path).state_dict()
    assert list(sd) == list(ref)
    assert all(torch.equal(sd[k], ref[k]) for k in ref)
    if which == "custom":
        with pytest.raises(ModelError, match="UserBlock"):  # a class of the user's: only with --import
            check_checkpoint(path)
        from yolo_det.analysis.models import model_names

        with model_names([UserBlock.__module__]):
            check_checkpoint(path)
        assert "model.1.scale" in sd
        assert "model.1.scratch" not in sd
    else:
        check_checkpoint(path)


@pytest.mark.slow
def test_digest_command_and_the_record_agree(trained: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "digest", str(trained["plain"]), str(trained["custom"]))
    assert code == 1  # different weights
    assert out.split()[0] == _reference_digest(trained["plain"])
    assert out.split()[2] == _reference_digest(trained["custom"])


@pytest.mark.slow
def test_audit_rebuilds_a_checkpoint_from_its_stored_yaml(
    trained: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = trained["plain"]
    code, out, err = _cli(capsys, "audit", str(path), "--imgsz", "64", "--json")
    assert code in (0, 1), err
    safe = json.loads(out)
    code2, out2, err2 = _cli(capsys, "audit", str(path), "--imgsz", "64", "--json", TRUST_FLAG)
    assert code2 == code, err2
    trusted = json.loads(out2)
    assert safe["findings"] == trusted["findings"]


@pytest.mark.slow
def test_audit_of_a_checkpoint_with_the_users_block_asks_for_the_flag(
    trained: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "audit", str(trained["custom"]), "--imgsz", "64")
    assert code == 2
    assert err.count("\n") == 1
    assert "UserBlock" in err
    assert TRUST_FLAG in err
    code, out, err = _cli(capsys, "audit", str(trained["custom"]), "--imgsz", "64", TRUST_FLAG)
    assert code in (0, 1), err


@pytest.mark.slow
def test_train_accepts_a_real_checkpoint_with_the_users_block(trained: dict[str, Path]) -> None:
    from yolo_det.analysis.models import model_names
    from yolo_det.tools.prepare import prepare

    with pytest.raises(ModelError, match="UserBlock.*--import"):
        prepare("repro", [f"model={trained['custom']}"])
    with model_names([UserBlock.__module__]):  # --import MODULE
        _, args = prepare("repro", [f"model={trained['custom']}"])
    assert args["model"] == str(trained["custom"])


def test_inert_reader_rejects_malformed_tensors(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    import zipfile

    with zipfile.ZipFile(path) as zf:
        names = {n: zf.read(n) for n in zf.namelist()}
    storage = next(n for n in names if "/data/" in n and not n.endswith("serialization_id"))
    names[storage] = names[storage][:4]  # truncated storage
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for n, b in names.items():
            zf.writestr(n, b)
    path.write_bytes(buf.getvalue())
    with pytest.raises(ModelError) as e:
        safeload.checkpoint_state_dict(path)
    assert "truncated" in str(e.value)


def test_shared_modules_and_yaml_cannot_explode(tmp_path: Path) -> None:
    """A pickle shares objects by reference: 40 levels of a module listed twice by its parent would be 2**40
    state-dict entries, a stored YAML of rows shared the same way 2**40 rows. Both are refused quickly."""
    import time

    leaf = nn.Linear(1, 1)
    node: nn.Module = leaf
    for _ in range(40):
        parent = nn.Module()
        parent.add_module("a", node)
        parent.add_module("b", node)
        node = parent
    row: list = [-1, 1, "Conv", [8]]
    for _ in range(40):
        row = [row, row]
    node.yaml = {"backbone": row, "head": []}
    path = tmp_path / "shared.pt"
    torch.save({"model": node}, path)
    start = time.process_time()
    with pytest.raises(ModelError, match="more than 100000 modules"):
        safeload.checkpoint_state_dict(path)
    assert safeload.checkpoint_model_yaml(path) is None  # not plain data within bounds: no YAML to rebuild from
    node.yaml = {"backbone": [[-1, 1, "Conv", [8]]], "head": []}
    torch.save({"model": node}, path)
    with pytest.raises(ModelError, match="more than 100000 modules"):
        safeload.checkpoint_model_yaml(path)
    assert time.process_time() - start < 5
