"""The yolo-det command line: dispatch, one-line errors with exit 2, nothing written on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import ROOT, subprocess_env
from yolo_det.cli import main


def _project_version() -> str:
    """The version a wheel is built with: pyproject.toml takes it from ``yolo_det.__version__``, which
    setuptools reads from the file's text (as here) without importing the package."""
    import ast
    import re

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert re.search(r'^version = \{ attr = "yolo_det.__version__" \}', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)  # one source only
    tree = ast.parse((ROOT / "yolo_det" / "__init__.py").read_text())
    found = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
    ]
    assert len(found) == 1
    return found[0]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert f"yolo-det {_project_version()}" in capsys.readouterr().out
    code, out, _ = run([], capsys)
    assert code == 2
    assert "train" in out
    assert "examples:" in out


def test_profiles_list_and_show(capsys, tmp_path):
    code, out, _ = run(["profiles"], capsys)
    assert code == 0
    assert all(n in out for n in ("repro", "balanced", "fast"))
    code, out, _ = run(["profiles", "show", "balanced"], capsys)
    assert code == 0
    assert "backward: disable" in out
    code, out, _ = run(["profiles", "show", "repro", "--json"], capsys)
    data = json.loads(out)
    assert code == 0
    assert data["train"]["deterministic_algorithms"] == "strict"
    user = tmp_path / "u.yaml"
    user.write_text("extends: fast\nval:\n  deterministic_algorithms: warn\n")
    code, out, _ = run(["profiles", "show", str(user), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["val"]["deterministic_algorithms"] == "warn"


def test_digest_compares_checkpoints(capsys, tmp_path):
    m = torch.nn.Linear(2, 2)
    torch.save({"model": m, "date": "a"}, tmp_path / "a.pt")
    torch.save({"model": m, "date": "b"}, tmp_path / "b.pt")
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "c.pt")
    code, out, _ = run(["digest", str(tmp_path / "a.pt"), str(tmp_path / "b.pt")], capsys)
    assert code == 0
    assert len({line.split()[0] for line in out.splitlines()}) == 1
    code, _, _ = run(["digest", str(tmp_path / "a.pt"), str(tmp_path / "c.pt")], capsys)
    assert code == 1


BAD_TRAIN = [
    (["--profile", "repo"], "Did you mean 'repro'?"),
    (
        ["--profile", "{bad}/p.yaml"],
        ":3: malformed YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 2)",
    ),
    (["--profile", "{bad}/unknown.yaml"], ":2: in 'train': unknown setting 'cudnn_benchmrk'"),
    (["--profile", "{bad}/types.yaml"], "'seed' must be null or an integer"),
    (["epochs"], "expected key=value, got 'epochs'"),
    (["=3"], "invalid key ''"),
    (["epochs="], "'epochs=' has no value"),
    (["epochs=1", "epochs=2"], "'epochs' is given twice"),
    (["epoch=3"], "unknown Ultralytics argument 'epoch'. Did you mean 'epochs'?"),
    (["epochs=abc"], "'epochs=abc' is of invalid type str"),
    (["imgsz=[64"], "cannot parse the value of 'imgsz'"),
    (["deterministic=false"], "the profile decides determinism"),
    (["data=missing.yaml"], "data 'missing.yaml' does not exist"),
    (["model=nope.yaml"], "model YAML 'nope.yaml' not found"),
    (["model=yolov8n.pt"], "does not download weights"),
    (["--profil", "repro"], "unrecognized arguments"),
]


@pytest.fixture
def bad_profiles(tmp_path) -> Path:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "p.yaml").write_text("train:\n  seed: [1\n")
    (folder / "unknown.yaml").write_text("train:\n  cudnn_benchmrk: true\n")
    (folder / "types.yaml").write_text("train:\n  seed: '3'\n")
    return folder


@pytest.mark.parametrize(("argv", "fragment"), BAD_TRAIN)
def test_train_bad_input_is_one_line_exit_2_and_writes_nothing(
    argv, fragment, capsys, tmp_path, bad_profiles, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    argv = [a.replace("{bad}", str(bad_profiles)) for a in argv]
    code, out, err = run(["train", *argv, f"project={tmp_path / 'runs'}"], capsys)
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("yolo-det: error: "), err
    assert fragment in err, err
    assert tree(tmp_path) == before


def test_debug_env_shows_traceback(capsys, monkeypatch):
    monkeypatch.setenv("YOLO_DET_DEBUG", "1")
    code, _, err = run(["profiles", "show", "repo"], capsys)
    assert code == 2
    assert "Traceback" in err
    assert "Did you mean 'repro'?" in err


def test_console_entry_runs_as_module():
    proc = subprocess.run(
        [sys.executable, "-m", "yolo_det", "profiles", "show", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "YOLO_DET_DEBUG": ""},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("yolo-det: error: unknown profile 'nope'")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_train_says_what_it_runs_under_and_what_the_demo_can_show(tmp_path, capsys):
    code, out, err = run(
        ["train", "--profile", "repro", "epochs=2", "imgsz=32", "batch=8", "fraction=0.25", "seed=3", "val=false"]
        + ["plots=false", f"project={tmp_path}", "name=demo"],
        capsys,
    )
    assert code == 0, err
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("yolo-det: training under")]
    assert len(starts) == 1, out
    assert (
        lines[starts[0]]
        == "yolo-det: training under profile 'repro' (built-in), seed 3, swaps: auto, no layer needed one"
    )
    record = next(i for i, line in enumerate(lines) if line.startswith("determinism record:"))
    assert starts[0] < record
    note = [line for line in lines if line.startswith("note: this was the demo")]
    assert len(note) == 1, out
    assert "2 epochs on 12 images of 32 px" in note[0]  # fraction=0.25 of the 48
    assert "mAP 0 in every row is expected" in note[0]
    assert "training loss went from" in note[0]
    assert "run it again and the weights digest is the same" in note[0]


def test_the_start_line_names_the_layers_swapped():
    from ultralytics.nn.tasks import DetectionModel

    from yolo_det.analysis.models import model_names
    from yolo_det.commands.train import start_line
    from yolo_det.core.profiles import load_profile
    from yolo_det.session.session import DeterminismSession

    with model_names():  # the example's blocks are nameable
        model = DetectionModel(str(ROOT / "yolo_det" / "data" / "models" / "cbam-max.yaml"), nc=2, verbose=False)
    session = DeterminismSession("repro", seed=5)
    with session.run():
        session.enter("train")
        session.prepare_model(model, imgsz=32)
        line = start_line(session)
        assert line.startswith("yolo-det: training under profile 'repro' (built-in), seed 5, swaps: auto, ")
        assert "AdaptiveMaxPool2d -> DetAdaptiveMaxPool2d" in line, line
    portable = DeterminismSession(load_profile("portable"), seed=0)  # its pinned threads are named
    with portable.run():
        assert start_line(portable).endswith("no layer needed one, 1 intra-op thread")


def test_the_console_entry_collects_the_garbage_then_leaves_the_rest_to_the_os():
    """At exit the garbage is finalised as before; what is still alive is not walked by Python's shutdown
    collections (gc.freeze), and atexit handlers still run."""
    code = textwrap.dedent(
        """
        import atexit, gc, sys
        import yolo_det.cli as cli

        class Cycle:
            def __del__(self):
                sys.stderr.write("garbage finalised\\n")

        def main():
            a, b = Cycle(), Cycle()
            a.other, b.other = b, a  # unreachable once main returns: only a collection finalises them
            return 3

        atexit.register(lambda: sys.stderr.write(f"frozen at exit: {gc.get_freeze_count() > 0}\\n"))
        cli.main = main
        cli.run_cli()
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=subprocess_env())
    assert proc.returncode == 3
    assert proc.stderr.count("garbage finalised") == 2
    assert "frozen at exit: True" in proc.stderr
