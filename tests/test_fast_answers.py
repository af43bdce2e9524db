"""Fast answers: --help, argument errors and diff start without torch; digest reads with the one reader.

The speed itself is measured in bench/bench_startup.py (never timed here); what makes it is structural: a process
that answers these never imports torch or Ultralytics, which these tests check in a fresh interpreter. ``digest``
reads every checkpoint through the one reader (:func:`yolo_det.core.record.checkpoint_digest`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import subprocess_env
from yolo_det.cli import COMMANDS
from yolo_det.core.errors import ModelError
from yolo_det.core.record import checkpoint_digest

# Runs the command line in a fresh interpreter and says, last on stderr, which heavy modules it imported.
_WRAPPER = (
    "import sys\n"
    "from yolo_det.cli import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "except SystemExit as e:\n"
    "    rc = e.code\n"
    "heavy = [m for m in ('torch', 'ultralytics', 'torchvision', 'cv2') if m in sys.modules]\n"
    "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _run(*argv: str, cwd: Path | None = None) -> tuple[int, str, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *argv],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=cwd,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert lines, proc.stderr
    assert lines[-1].startswith("HEAVY="), proc.stderr
    heavy = [m for m in lines[-1].removeprefix("HEAVY=").split(",") if m]
    return proc.returncode, proc.stdout, "\n".join(lines[:-1]), heavy


class Tiny(nn.Module):
    """Every kind of entry the digest covers: float16/bfloat16/float32/float64 parameters, integer, bool and
    0-dim buffers, a strided view, a shared storage, a non-persistent buffer, a child module."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.half_w = nn.Parameter(torch.randn(5, 3, generator=g).half())
        self.bf16_w = nn.Parameter(torch.randn(2, 7, generator=g).bfloat16())
        self.f64_w = nn.Parameter(torch.randn(3, generator=g).double())
        base = torch.randn(6, 8, generator=g)
        self.register_buffer("strided", base.t()[1:5, ::2])  # a non-contiguous view of a larger storage
        self.register_buffer("shared", base[2])  # the same storage again
        self.register_buffer("ints", torch.arange(7, dtype=torch.int32))
        self.register_buffer("flags", torch.tensor([True, False, True]))
        self.register_buffer("scalar", torch.tensor(3.5))
        self.register_buffer("empty", torch.zeros(0, 4))
        self.register_buffer("scratch", torch.ones(2), persistent=False)


def _ultralytics_like(model: nn.Module) -> dict[str, object]:
    return {"epoch": 3, "model": None, "ema": model, "updates": 7, "train_args": {"imgsz": 64}, "date": "x"}


def test_digest_reads_through_the_one_reader(tmp_path: Path) -> None:
    import numpy as np

    model = Tiny()
    a, meta, state, b = (tmp_path / f"{n}.pt" for n in ("a", "meta", "state", "b"))
    torch.save(_ultralytics_like(model), a)
    extra = {"best_fitness": np.float64(0.5), "rng": torch.Generator().manual_seed(3)}  # metadata: not weights
    torch.save({**_ultralytics_like(model), **extra}, meta)
    torch.save(model.state_dict(), state)  # a plain state dict
    with torch.no_grad():  # control: one value of one weight changed
        model.half_w[1, 2] += 1
    torch.save(_ultralytics_like(model), b)
    code, out, err, heavy = _run("digest", str(a), str(meta), str(state))
    assert code == 0, err  # equal weights, equal digests
    assert [line.split()[0] for line in out.splitlines()] == [checkpoint_digest(a)] * 3
    # torch.nn modules and the test's own blocks: torch alone (an Ultralytics checkpoint also imports the
    # allowed classes its objects are checked against, allow.SAFE_IMPORTS; never a module the file names)
    assert heavy == ["torch"]
    code, out, err, _ = _run("digest", str(a), str(b))
    assert code == 1, err  # they differ
    assert [line.split()[0] for line in out.splitlines()] == [checkpoint_digest(a), checkpoint_digest(b)]
    assert checkpoint_digest(a) != checkpoint_digest(b)


def test_a_hostile_checkpoint_is_refused_without_running_it(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("ran",))

    path = tmp_path / "evil.pt"
    torch.save({"model": Tiny(), "x": Evil()}, path)
    with pytest.raises(ModelError, match=r"calls builtins\.print, which is not on yolo-det's allow-list"):
        checkpoint_digest(path)
    code, out, err, heavy = _run("digest", str(path))
    assert code == 2
    assert "ran" not in out
    assert "builtins.print" in err
    assert "allow-list" in err
    assert "ultralytics" not in heavy


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_starts_without_torch(command: str) -> None:
    code, out, err, heavy = _run(command, "--help")
    assert code == 0, err
    assert out.count("usage:") == 1, out  # one usage block per help
    assert "usage: yolo-det" in out
    assert heavy == []


def test_the_help_lists_every_profile_and_the_two_runs_guide() -> None:
    from yolo_det.core.profiles import BUILTIN_PROFILES

    presets = Path(__file__).resolve().parents[1] / "yolo_det" / "core" / "presets"
    assert set(BUILTIN_PROFILES) == {p.stem for p in presets.glob("*.yaml")}
    assert "portable" in BUILTIN_PROFILES
    for command in ("train", "verify"):
        code, out, err, _ = _run(command, "--help")
        assert code == 0, err
        flat = " ".join(out.split())
        assert f"built-in profile ({', '.join(BUILTIN_PROFILES)})" in flat, out
    code, out, err, _ = _run("--help")
    assert code == 0, err
    assert out.count("usage:") == 1, out
    guide = out.split("two runs differ? which command:")[1]
    for command in ("yolo-det diff", "yolo-det check-machine", "yolo-det verify --against", "yolo-det bisect"):
        assert command in guide, guide


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["train", "epochs=1", "foo="], "'foo=' has no value"),
        (["train", "epoch=3"], "unknown Ultralytics argument 'epoch'. Did you mean 'epochs'?"),
        (["verify", "--steps", "2", "imgs=64"], "unknown Ultralytics argument 'imgs'. Did you mean 'imgsz'?"),
        (["bench", "lr=0.1"], "unknown Ultralytics argument 'lr'"),
        (["train", "epochs"], "expected key=value"),
        (["train", "--profile", "nope", "epochs=1"], "unknown profile 'nope'"),
        (["verify", "--profile", "nope"], "unknown profile 'nope'"),
        (["verify", "imgsz=[1,"], "cannot parse the value of 'imgsz'"),
        (["bench", "--profiles", "repro,nope"], "unknown profile 'nope'"),
        (["audit", "--imgsz", "0", "yolov8n.yaml"], "expected a positive integer"),
        (["nocommand"], "invalid choice: 'nocommand'"),
        (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_argument_errors_answer_without_torch(argv: list[str], says: str) -> None:
    code, out, err, heavy = _run(*argv)
    assert code == 2
    assert out == ""
    assert err.startswith("yolo-det: error: "), err
    assert len(err.splitlines()) == 1, err
    assert says in err
    assert heavy == []


def test_diff_answers_without_torch(tmp_path: Path) -> None:
    runs = []
    for name, digest in (("r1", "d" * 64), ("r2", "d" * 64)):
        folder = tmp_path / name
        folder.mkdir()
        rec = {"schema": 1, "profile": {"name": "repro"}, "environment": {"torch": "2.4"}, "status": "completed"}
        rec["weights"] = {"sha256": digest}
        (folder / "determinism.json").write_text(json.dumps(rec))
        runs.append(str(folder))
    code, out, err, heavy = _run("diff", *runs)
    assert code == 0, out + err
    assert "verdict: these runs should be bitwise identical and are" in out
    assert heavy == []
