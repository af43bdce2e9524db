"""One reader for every checkpoint: a file yolo-det wrote itself loads through the same allow-list as any other.

No digest unlocks a wider reader: a crafted checkpoint whose SHA-256 is planted where an older yolo-det kept the
digests of the files it wrote (``written/`` in the cache folder) runs nothing, through ``digest``, ``train
resume=`` and the model loader. What a user's model holds beyond the allow-list's classes is learnt as data: a
block keeping a ``torch.Generator`` loads (the generator rebuilt from its state bytes), whoever wrote the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from yolo_det.analysis.gate import check_arguments
from yolo_det.cli import main
from yolo_det.core.errors import ModelError
from yolo_det.core.untrusted.allow import allowed_user_modules
from yolo_det.core.untrusted.safeload import checkpoint_state_dict, guarded_torch_load, load_checkpoint


class Held(nn.Module):
    """A user's block that keeps its own random generator."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.gen = torch.Generator().manual_seed(7)


class Payload:
    """What an attacker pickles: ``posix.system`` called with a shell command."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


@pytest.fixture
def user_block() -> Iterator[None]:
    with allowed_user_modules([__name__]):  # Held is the user's block (--import): only the generator is beyond it
        yield


def _save(obj: object, path: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_a_checkpoint_holding_a_generator_loads_whoever_wrote_it(user_block: None, tmp_path: Path) -> None:
    held = Held()
    held.gen.manual_seed(11)
    drawn = torch.rand(3, generator=held.gen)  # a generator whose state moved on from its seed
    foreign = tmp_path / "foreign.pt"  # the same classes, written by anything
    _save({"epoch": 1, "ema": held, "train_args": {}}, foreign)
    check_arguments({"model": str(foreign)})  # the gate lets it through
    ckpt = load_checkpoint(foreign)
    assert isinstance(ckpt["ema"], Held)
    assert isinstance(ckpt["ema"].gen, torch.Generator)
    assert torch.equal(ckpt["ema"].gen.get_state(), held.gen.get_state())
    assert not torch.equal(held.gen.get_state(), torch.Generator().manual_seed(11).get_state())
    assert ckpt["ema"].gen.initial_seed() == 11
    assert not torch.equal(torch.rand(3, generator=ckpt["ema"].gen), drawn)  # it continues, not restarts
    assert set(checkpoint_state_dict(foreign)) == {"conv.weight", "conv.bias"}  # inspection reads it too
    own = tmp_path / "runs" / "r" / "weights" / "last.pt"
    own.parent.mkdir(parents=True)
    with guarded_torch_load():  # what a run writes and Ultralytics' own torch.load reads back
        torch.save({"epoch": 1, "ema": Held(), "train_args": {}}, own)
        assert isinstance(torch.load(own, map_location="cpu")["ema"].gen, torch.Generator)


def test_a_generator_is_data_only(user_block: None, tmp_path: Path) -> None:
    """Its state is checked to be bytes: anything else in its place is refused in one line."""

    class Bad(torch.Generator):
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (torch.Generator, (torch.device("cpu"),), (0, None, "not bytes"))

    held = Held()
    held.gen = Bad()
    bad = tmp_path / "bad.pt"
    _save({"ema": held}, bad)
    with pytest.raises(ModelError, match="malformed torch.Generator state"):
        load_checkpoint(bad)


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A crafted checkpoint running ``touch CANARY``, its digest planted in the folder where an older yolo-det
    noted the checkpoints it wrote (``written/`` in ``$YOLO_DET_CACHE``)."""
    canary = tmp_path / "canary"
    evil = tmp_path / "received" / "weights" / "last.pt"
    data = _save({"epoch": 1, "model": Payload(f"touch {canary}"), "train_args": {}}, evil)
    store = tmp_path / "cache" / "written"
    store.mkdir(parents=True)
    (store / hashlib.sha256(data).hexdigest()).write_bytes(b"")
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    return evil, canary


@pytest.mark.parametrize("command", ["digest", "resume", "audit", "load"])
def test_a_planted_digest_unlocks_nothing(command: str, planted: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    evil, canary = planted
    if command == "load":
        with pytest.raises(ModelError) as refused:
            load_checkpoint(evil)
        code, err = 2, str(refused.value)
    else:
        argv = {
            "digest": ["digest", str(evil)],
            "resume": ["train", f"resume={evil}"],
            "audit": ["audit", str(evil)],
        }[command]
        code, err = main(argv), capsys.readouterr().err.strip()
    assert not canary.exists()  # nothing ran
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert "posix.system, which is not on yolo-det's allow-list" in err, err
    assert sorted(p.name for p in evil.parent.parent.rglob("*")) == ["last.pt", "weights"]  # nothing written


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_run_with_a_generator_block_reads_its_own_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy_gate_i38.py").write_text(BLOCK, encoding="utf-8")
    (tmp_path / "m.yaml").write_text(MODEL, encoding="utf-8")
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
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
        # read without the user's module (a file received elsewhere): the digest, which never makes the block,
        # still answers; loading it is refused by name; nothing is imported
        sys.modules.pop("noisy_gate_i38", None)
        assert main(["digest", str(last)]) == 0
        assert record["weights"]["sha256"] in capsys.readouterr().out
        with pytest.raises(ModelError, match=r"refers to noisy_gate_i38\.NoisyGate, .* pass --import noisy_gate_i38;"):
            load_checkpoint(last)
        assert "noisy_gate_i38" not in sys.modules
        assert not (tmp_path / "cache" / "written").exists()  # no store of digests
    finally:
        sys.modules.pop("noisy_gate_i38", None)


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
