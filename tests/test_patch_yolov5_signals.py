"""`patch-yolov5` interrupted at every named point of the operation: by SIGINT, a second SIGINT during the
roll-back, SIGTERM, SIGHUP, and SIGKILL followed by the next run. The tree is always either fully patched or
byte-identical to the original, with no stray file."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from yolo_det.cli import main
from yolo_det.integrations.yolov5 import patch as pv
from yolo_det.integrations.yolov5 import writer as pw
from yolov5_helpers import installed_yolov5

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX signals"),
    pytest.mark.usefixtures("default_stop_handlers"),  # whatever dispositions the test runner inherited
]


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``, hidden ones included: a file as its digest and mode, a folder as such."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mode:o}" if p.is_file() else "folder"
    return out


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], dict[str, str], list[str]]:
    """A small YOLOv5 tree (two scripts to patch), its snapshot unpatched and patched, and the points of one
    patch operation in order."""
    src = installed_yolov5()
    root = tmp_path_factory.mktemp("template") / "yolov5"
    for rel in ("train.py", "val.py", "utils/general.py", "models/yolo.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((src / rel).read_bytes())
    original = _snapshot(root)
    work = tmp_path_factory.mktemp("patched") / "yolov5"
    _copy(root, work)
    points: list[str] = []
    with _hook(points.append):
        pw.apply_plan(pv.plan(work))
    patched = _snapshot(work)
    assert patched != original
    assert pw.JOURNAL not in patched
    assert points[0] == "journal"
    assert "commit" in points
    assert points[-1].startswith("cleanup:")
    return root, original, patched, points


def _copy(src: Path, dst: Path) -> None:
    for p in sorted(src.rglob("*")):
        target = dst / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(p.read_bytes())
            target.chmod(p.stat().st_mode & 0o777)


class _hook:
    def __init__(self, fn) -> None:
        self.fn = fn

    def __enter__(self) -> None:
        pw.fault_hook = self.fn

    def __exit__(self, *exc: object) -> None:
        pw.fault_hook = None


class _Hangup(KeyboardInterrupt):
    """What the test's SIGHUP handler raises (the process would otherwise end)."""


@pytest.fixture
def sighup_raises() -> Iterator[None]:
    def handler(signum, frame):
        raise _Hangup

    previous = signal.signal(signal.SIGHUP, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _expected(points: list[str], point: str, original: dict[str, str], patched: dict[str, str]) -> dict[str, str]:
    """Before the commit point the operation is undone; after it, it completes."""
    return original if points.index(point) <= points.index("commit") else patched


MODES = {  # mode -> (signals sent at the point, the signal sent at the first roll-back point, exit code)
    "SIGINT": ([signal.SIGINT], None, 130),
    "double-SIGINT": ([signal.SIGINT], signal.SIGINT, 130),
    "SIGTERM": ([signal.SIGTERM], None, 143),
    "SIGHUP": ([signal.SIGHUP], None, 130),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_signal_at_every_point(trees, tmp_path: Path, capsys, sighup_raises, mode: str) -> None:
    template, original, patched, points = trees
    sent, second, code = MODES[mode]
    for i, point in enumerate(points):
        root = tmp_path / f"t{i}"
        _copy(template, root)
        rolled_back = []

        def inject(name: str, point=point, rolled_back=rolled_back) -> None:
            if name == point:
                for signum in sent:
                    os.kill(os.getpid(), signum)
            elif name.startswith("rollback:") and not rolled_back:
                rolled_back.append(name)
                if second is not None:
                    os.kill(os.getpid(), second)  # Ctrl-C pressed again while the tree is put back

        with _hook(inject):
            rc = main(["patch-yolov5", str(root)])
        err = capsys.readouterr().err
        assert rc == code, (point, err)
        assert _snapshot(root) == _expected(points, point, original, patched), (mode, point)
        assert bool(rolled_back) == (points.index(point) <= points.index("commit")) or point == "journal", point


def _killed_at(root: Path, point: str) -> None:
    """Run the patch in a child process that SIGKILLs itself at ``point``."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no clean-up, killed outright
        try:
            pw.fault_hook = lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == point else None
            pw.apply_plan(pv.plan(root))
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), point
    assert os.WTERMSIG(status) == signal.SIGKILL, point


def test_sigkill_at_every_point_then_the_next_run(trees, tmp_path: Path, capsys) -> None:
    template, original, patched, points = trees
    for i, point in enumerate(points):
        root = tmp_path / f"k{i}"
        _copy(template, root)
        _killed_at(root, point)
        if point == "journal":  # killed before the first write
            assert pw.pending_journal(root) is None
            assert _snapshot(root) == original
        else:  # --check refuses to judge a half-changed tree
            assert pw.pending_journal(root) is not None, point
            assert main(["patch-yolov5", str(root), "--check"]) == 2
            assert "--repair" in capsys.readouterr().err
        # the next run finishes the interrupted one, then patches
        assert main(["patch-yolov5", str(root)]) == 0, point
        assert ("an interrupted patch-yolov5 was" in capsys.readouterr().err) == (point != "journal")
        assert _snapshot(root) == patched, point


def test_sigkill_then_repair_alone(trees, tmp_path: Path, capsys) -> None:
    template, original, patched, points = trees
    for i, point in enumerate(points):
        root = tmp_path / f"r{i}"
        _copy(template, root)
        _killed_at(root, point)
        assert main(["patch-yolov5", str(root), "--repair"]) == 0
        capsys.readouterr()
        assert _snapshot(root) == _expected(points, point, original, patched), point
        assert pw.pending_journal(root) is None


def test_signal_handlers_are_given_back(trees, tmp_path: Path) -> None:
    template, _, patched, _ = trees
    before = {s: signal.getsignal(s) for s in pw.DEFERRED_SIGNALS}
    root = tmp_path / "t"
    _copy(template, root)
    pw.apply_plan(pv.plan(root))
    assert {s: signal.getsignal(s) for s in pw.DEFERRED_SIGNALS} == before
    assert _snapshot(root) == patched


def test_a_journal_shipped_with_a_tree_cannot_remove_its_files(trees, tmp_path: Path, capsys) -> None:
    """The journal is read from the tree, which may come from others: it names only the files patching writes, and
    only a backup may be one to remove."""
    import json

    template, original, _, _ = trees
    for files in (
        [{"rel": "train.py", "path": "{root}/train.py", "existed": False}],
        [{"rel": "utils/general.py.yolo-det.bak", "path": "{root}/utils/general.py", "existed": False}],
        [{"rel": "train.py.yolo-det.bak", "path": "/etc/passwd", "existed": True}],
    ):
        root = tmp_path / f"j{len(list(tmp_path.iterdir()))}"
        _copy(template, root)
        text = json.dumps({"version": 1, "committed": False, "files": files}).replace("{root}", str(root))
        (root / pw.JOURNAL).write_text(text)
        assert main(["patch-yolov5", str(root), "--repair"]) == 2
        assert "is not a journal" in capsys.readouterr().err
        (root / pw.JOURNAL).unlink()
        assert _snapshot(root) == original
