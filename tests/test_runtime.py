"""Helpers of verify and bench: Ultralytics logging put back, temporary run folders, output paths, PNG files."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from yolo_det.core.errors import ConfigError
from yolo_det.core.fileio import check_output_path
from yolo_det.tools.runtime import PNG_SIGNATURE, new_figure, quiet_ultralytics, run_folder, save_figure


def test_quiet_ultralytics_moves_logs_to_stderr_and_puts_everything_back(capsys):
    from ultralytics.utils import LOGGER

    handlers = [(h, getattr(h, "stream", None)) for h in LOGGER.handlers]
    level = LOGGER.level
    with pytest.raises(RuntimeError), quiet_ultralytics(verbose=False):
        assert LOGGER.getEffectiveLevel() >= logging.WARNING
        LOGGER.warning("routed")
        assert all(getattr(h, "stream", None) is not sys.stdout for h in LOGGER.handlers)
        raise RuntimeError("boom")
    assert LOGGER.level == level
    assert [(h, getattr(h, "stream", None)) for h in LOGGER.handlers] == handlers
    out, err = capsys.readouterr()
    assert "routed" not in out


def test_run_folder_is_temporary_unless_given(tmp_path):
    with run_folder(None) as folder:
        assert Path(folder).is_dir()
        (Path(folder) / "x").write_text("x")
    assert not Path(folder).exists()
    with run_folder(tmp_path) as folder:
        assert folder == str(tmp_path)
    assert tmp_path.is_dir()


def test_check_output_path(tmp_path):
    assert check_output_path(None, suffix=".png", what="--plot") is None
    assert check_output_path(tmp_path / "a.png", suffix=".png", what="--plot") == tmp_path / "a.png"
    for bad, needle in [(tmp_path / "a.jpg", ".png"), (tmp_path / "no" / "a.png", "does not exist")]:
        with pytest.raises(ConfigError, match=needle):
            check_output_path(bad, suffix=".png", what="--plot")
    (tmp_path / "d.png").mkdir()
    with pytest.raises(ConfigError, match="folder"):
        check_output_path(tmp_path / "d.png", suffix=".png", what="--plot")


def test_save_figure_writes_a_png_without_touching_pyplot(tmp_path):
    import matplotlib

    backend = matplotlib.get_backend()
    fig = new_figure(2, 2)
    fig.add_subplot(1, 1, 1).plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "f.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert matplotlib.get_backend() == backend
    assert [p.name for p in tmp_path.iterdir()] == ["f.png"]  # no temporary file left
