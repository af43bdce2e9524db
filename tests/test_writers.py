"""Every file yolo-det writes is replaced, never written through: a link at the target is replaced by the new
file and what it pointed to is left as it was (``core/fileio``, ``bisect --replay-trace`` included)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from yolo_det.cli import main
from yolo_det.core.fileio import atomic_write_text, copy_file
from yolo_det.tools.trace.tracefile import read_trace, write_trace


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside" / "yours.txt"
    outside.parent.mkdir()
    outside.write_text("yours")
    os.chmod(outside, 0o600)
    return outside


def test_the_writers_replace_a_link_and_never_follow_it(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("new")
    for name, write in (("copied", lambda p: copy_file(src, p)), ("written", lambda p: atomic_write_text(p, "new"))):
        target = tmp_path / name
        target.symlink_to(outside)
        write(target)
        assert not target.is_symlink()
        assert target.read_text() == "new"
        assert outside.read_text() == "yours"
        assert outside.stat().st_mode & 0o777 == 0o600
        write(target)  # control: a plain file there is replaced the same way
        assert target.read_text() == "new"


def _trace(path: Path) -> Path:
    header = {"rank": 0, "world_size": 1, "device_type": "cpu", "steps": "first:1", "settings": {}, "modules": {}}
    return write_trace(path, header, [])


def test_bisect_replay_trace_replaces_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The replay's training is stood in for by a trace it would write; the copy to ``--replay-trace`` is real."""
    import yolo_det.commands.bisect as bisect

    outside = _outside(tmp_path)
    a = _trace(tmp_path / "a.jsonl")
    ckpt = tmp_path / "last.pt"
    ckpt.write_bytes(b"unused")
    monkeypatch.setattr(bisect, "_replay", lambda checkpoint, folder, args: _trace(folder / "replay.jsonl"))
    kept = tmp_path / "kept.jsonl"
    kept.symlink_to(outside)
    main(["bisect", str(a), "--replay", str(ckpt), "--replay-trace", str(kept), "--json"])
    capsys.readouterr()
    assert outside.read_text() == "yours"
    assert not kept.is_symlink()
    assert read_trace(kept).steps_spec == "first:1"
