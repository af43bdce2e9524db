"""A module path a checkpoint or record stores is a hint: a file is imported again only from the top of the
user's own current folder, never from a received run folder or anywhere below the current folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from yolo_det.analysis.names import recorded_imports
from yolo_det.core.errors import ConfigError

CODE = "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('x')\n"


def _entry(path: Path, name: str) -> dict[str, str]:
    return {"name": name, "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_a_file_at_the_top_of_the_current_folder_is_imported_again(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "blocks.py").write_text(CODE)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "blocks.py").write_text(CODE)
    monkeypatch.chdir(tmp_path)
    got = recorded_imports([_entry(tmp_path / "blocks.py", "blocks")], "checkpoint 'x'")
    assert got == [str(tmp_path / "blocks.py")]
    assert recorded_imports([_entry(tmp_path / "pkg" / "blocks.py", "pkg.blocks")], "checkpoint 'x'") == ["pkg.blocks"]
    assert not (tmp_path / "ran").exists()  # deciding imports nothing


def test_a_file_received_with_a_run_folder_is_never_imported(tmp_path: Path, monkeypatch) -> None:
    received = tmp_path / "downloads" / "run"
    received.mkdir(parents=True)
    (received / "determinism.json").write_text("{}")
    (received / "blocks.py").write_text(CODE)
    entry = _entry(received / "blocks.py", "blocks")
    # from a folder above it (the user's home, a project holding the download): below the top, refused
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"not at the top of the current folder: pass --import blocks\.py"):
        recorded_imports([entry], "checkpoint 'x'")
    # from inside the run folder itself: a run folder's files are never imported
    monkeypatch.chdir(received)
    with pytest.raises(ConfigError, match="is a run folder"):
        recorded_imports([entry], "checkpoint 'x'")
    # the user's word still imports it
    assert recorded_imports([entry], "checkpoint 'x'", given=[str(received / "blocks.py")]) == []
    # a dotted name whose package sits below the top is refused too
    (tmp_path / "deep" / "pkg").mkdir(parents=True)
    (tmp_path / "deep" / "pkg" / "blocks.py").write_text(CODE)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="not at the top"):
        recorded_imports([_entry(tmp_path / "deep" / "pkg" / "blocks.py", "pkg.blocks")], "checkpoint 'x'")
    assert not (tmp_path / "downloads" / "run" / "ran").exists()
