"""``--profile portable`` re-executes the command before torch starts; the new process starts as the console script
does: the current folder (a received run folder, say) is never on ``sys.path``, so a module there never runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import subprocess_env
from yolo_det.core.machine_settings import ISA_ENV, cannot_match

#: How the installed ``yolo-det`` console script starts: its own folder, never the current one, on ``sys.path``.
CONSOLE = "import sys; del sys.path[0]; from yolo_det.cli import run_cli; run_cli()"
#: A module of the user's own (on their ``PYTHONPATH``) that notes each process start and its ISA variable.
NOTE = (
    "import os, pathlib\n"
    "with open(os.environ['NOTE_FILE'], 'a') as f:\n"
    "    f.write(os.environ.get('ATEN_CPU_CAPABILITY', '-') + '\\n')\n"
)


@pytest.mark.skipif(bool(cannot_match("avx2")), reason="this machine cannot run the portable profile's branch")
@pytest.mark.parametrize("command", ["train", "verify"])
def test_the_reexec_never_imports_from_the_current_folder(command: str, tmp_path: Path) -> None:
    received = tmp_path / "received"
    received.mkdir()
    for name in ("argparse", "yaml"):  # imported by the command line and by the profile's reading
        canary = f"import pathlib\npathlib.Path({str(tmp_path / name)!r}).write_text('ran')\n"
        (received / f"{name}.py").write_text(canary)
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text(NOTE)
    env = subprocess_env({"NOTE_FILE": str(tmp_path / "starts")}, path=[own])
    for name in ISA_ENV["avx2"]:
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", CONSOLE, command, "--profile", "portable", "--help"],
        cwd=received,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: yolo-det {command}" in done.stdout
    # the control: it did re-execute (a second start, with the profile's variables), the user's PYTHONPATH kept
    assert (tmp_path / "starts").read_text().split() == ["-", "avx2"]
    assert not (tmp_path / "argparse").exists()
    assert not (tmp_path / "yaml").exists()
