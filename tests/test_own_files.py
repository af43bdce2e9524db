"""A run can read what it wrote: a checkpoint yolo-det serialized on this machine loads through the same gate
whatever classes the user's model holds (a ``torch.Generator``); the same bytes received on a machine whose
store never saw them, a changed file, or a record that lists their digest are refused as files from others."""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from yolo_det.analysis.gate import check_arguments
from yolo_det.cli import main
from yolo_det.core.errors import ModelError
from yolo_det.core.untrusted import written
from yolo_det.core.untrusted.allow import allowed_user_modules
from yolo_det.core.untrusted.safeload import checkpoint_state_dict, guarded_torch_load, load_checkpoint

REFUSED = "refers to torch._C.Generator, which is not on yolo-det's allow-list"


class Held(nn.Module):
    """A user's block that keeps its own random generator."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.gen = torch.Generator().manual_seed(7)


def _serialized(scale: float = 1.0) -> bytes:
    model = Held()
    with torch.no_grad():
        model.conv.weight.fill_(scale)
    buffer = io.BytesIO()
    torch.save({"epoch": 1, "ema": model, "train_args": {}}, buffer)
    return buffer.getvalue()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    with allowed_user_modules([__name__]):  # Held is the user's block (--import): only the generator is off the list
        yield tmp_path / "cache" / "written"


def _own(path: Path) -> bytes:
    """Write a checkpoint as a yolo-det run does (``torch.save`` to a buffer, then the bytes to the file)."""
    with guarded_torch_load():
        buffer = io.BytesIO()
        torch.save({"epoch": 1, "ema": Held(), "train_args": {}}, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_a_file_yolo_det_wrote_loads_through_the_gate(store: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(_serialized())  # the same classes, not written by yolo-det
    with pytest.raises(ModelError, match=REFUSED):  # control: the allow-list still refuses it
        load_checkpoint(foreign)
    with pytest.raises(ModelError, match=REFUSED):
        check_arguments({"model": str(foreign)})
    own = tmp_path / "runs" / "r" / "weights" / "last.pt"
    data = _own(own)
    assert (store / written.digest(data)).is_file()  # the store, outside the run folder
    check_arguments({"model": str(own)})  # the gate lets it through
    ckpt = load_checkpoint(own)
    assert isinstance(ckpt["ema"], Held)
    assert isinstance(ckpt["ema"].gen, torch.Generator)
    assert torch.equal(ckpt["ema"].gen.get_state(), torch.Generator().manual_seed(7).get_state())
    assert set(checkpoint_state_dict(own)) == {"conv.weight", "conv.bias"}  # inspection reads it too
    with guarded_torch_load():  # what Ultralytics' own torch.load gets
        assert isinstance(torch.load(own, map_location="cpu")["ema"], Held)


def test_the_same_bytes_received_elsewhere_or_changed_are_refused(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "runs" / "r" / "weights" / "last.pt"
    data = _own(own)
    # a changed file (the same classes, another weight): not the bytes yolo-det wrote
    tampered = tmp_path / "tampered.pt"
    tampered.write_bytes(_serialized(scale=2.0))
    assert tampered.read_bytes() != data
    with pytest.raises(ModelError, match=REFUSED):
        load_checkpoint(tampered)
    # the run folder received on a machine whose store never saw it: its record lists the digest, in vain
    received = tmp_path / "received" / "r"
    shutil.copytree(own.parent.parent, received)
    listed = {"file": str(received / "weights" / "last.pt"), "sha256": written.digest(data)}
    (received / "determinism.json").write_text(json.dumps({"weights": {"files": [listed]}}))
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "other-cache"))
    with pytest.raises(ModelError, match=REFUSED):
        load_checkpoint(received / "weights" / "last.pt")
    with pytest.raises(ModelError, match=REFUSED):
        check_arguments({"resume": str(received / "weights" / "last.pt")})
    assert not (tmp_path / "other-cache").exists()  # reading wrote nothing
    # back on the machine that wrote it, the copy is the same bytes: it loads
    monkeypatch.setenv("YOLO_DET_CACHE", str(store.parent))
    assert isinstance(load_checkpoint(received / "weights" / "last.pt")["ema"], Held)


def test_own_files_import_nothing(store: Path, tmp_path: Path) -> None:
    """A file of ours that names a module not imported now is refused in one line, not imported."""
    own = tmp_path / "own.pt"
    _own(own)
    saved = sys.modules.pop(__name__)
    try:
        with pytest.raises(ModelError, match="not imported here"):
            load_checkpoint(own)
    finally:
        sys.modules[__name__] = saved


BLOCK = '''
import torch
from torch import nn


class NoisyGate(nn.Module):
    """A gate that keeps its own random generator."""

    def __init__(self, c1):
        super().__init__()
        self.conv = nn.Conv2d(c1, c1, 1)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        return x * torch.sigmoid(self.conv(x))
'''
MODEL = """\
nc: 3
backbone:
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, NoisyGate, [32]]
head:
  - [[2], 1, Detect, [nc]]
"""


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_run_with_a_generator_block_reads_its_own_checkpoints(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy_gate_i38.py").write_text(BLOCK, encoding="utf-8")
    (tmp_path / "m.yaml").write_text(MODEL, encoding="utf-8")
    small = ["imgsz=64", "batch=8", "nbs=8", "fraction=0.25", "plots=false", "workers=0", "device=cpu"]
    try:
        run = [f"project={tmp_path / 'runs'}", "name=r"]
        code = main(["train", "--import", "noisy_gate_i38.py", "model=m.yaml", "epochs=1", *small, *run])
        assert code == 0, capsys.readouterr().err
        last = tmp_path / "runs" / "r" / "weights" / "last.pt"
        record = json.loads((tmp_path / "runs" / "r" / "determinism.json").read_text())
        assert record["weights"]["sha256"], record["weights"]  # the record could read its own file back
        capsys.readouterr()
        assert main(["digest", str(last)]) == 0, capsys.readouterr().err
        assert record["weights"]["sha256"] in capsys.readouterr().out
        # the same file received by a machine that never wrote it: refused, exit 2
        monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "fresh"))
        assert main(["digest", str(last)]) == 2
        assert "torch._C.Generator" in capsys.readouterr().err
    finally:
        sys.modules.pop("noisy_gate_i38", None)
