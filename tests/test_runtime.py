"""Helpers of verify and bench: Ultralytics logging put back, temporary run folders, output paths, PNG files."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from yolo_det.core.errors import ConfigError
from yolo_det.core.fileio import check_output_path
from yolo_det.core.quiet import quiet_ultralytics
from yolo_det.tools.runtime import PNG_SIGNATURE, new_figure, run_folder, save_figure


@contextlib.contextmanager
def _stdout_handler() -> Iterator[tuple[logging.Logger, logging.StreamHandler]]:
    """A handler on Ultralytics' logger that writes to the current sys.stdout (the test's captured one), as
    Ultralytics' own handler does when it is created: the tests do not depend on which stream Ultralytics'
    handler got when some earlier test first imported it."""
    from ultralytics.utils import LOGGER

    handler = logging.StreamHandler(sys.stdout)
    LOGGER.addHandler(handler)
    try:
        yield LOGGER, handler
    finally:
        LOGGER.removeHandler(handler)


def test_quiet_ultralytics_moves_logs_to_stderr_and_puts_everything_back(capsys):
    with _stdout_handler() as (logger, handler):
        _check_routed_and_restored(logger, handler)
    out, err = capsys.readouterr()
    assert "routed" in err
    assert "routed" not in out
    assert "dropped" not in err
    assert "dropped" not in out


def _check_routed_and_restored(logger: logging.Logger, handler: logging.StreamHandler) -> None:
    streams = {id(h): getattr(h, "stream", None) for h in logger.handlers}
    level = logger.level
    with pytest.raises(RuntimeError), quiet_ultralytics(verbose=False):
        assert logger.getEffectiveLevel() >= logging.WARNING
        assert handler.stream is sys.stderr
        logger.warning("routed")
        logger.info("dropped")
        raise RuntimeError("boom")
    assert logger.level == level
    assert {id(h): getattr(h, "stream", None) for h in logger.handlers} == streams
    assert handler.stream is sys.stdout


def test_quiet_ultralytics_verbose_keeps_info_and_can_drop_prints(capsys):
    with _stdout_handler() as (logger, _):
        with quiet_ultralytics(verbose=True, drop_stdout=True):
            logger.info("kept")
            print("printed")
        with quiet_ultralytics(level=logging.ERROR):
            logger.warning("hidden")
    out, err = capsys.readouterr()
    assert "kept" in err
    assert "kept" not in out
    assert "printed" not in out
    assert "printed" not in err
    assert "hidden" not in out + err


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
