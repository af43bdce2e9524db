"""Two runs' curves in one PNG (tools/curves, ``yolo-det diff --png``): drawn from each run's results.csv, read as
data within limits, the first parting epoch marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.tools import curves
from yolo_det.tools.runtime import PNG_SIGNATURE

# Ultralytics' header (older releases pad the names with spaces) and three epochs.
HEADER = "epoch,  time,  train/box_loss,  train/cls_loss,  metrics/mAP50(B),  val/box_loss,  lr/pg0"
ROWS_A = ["1,1.0,1.5,1.6,0.1,0.30,0.001", "2,2.0,1.4,1.5,0.2,0.25,0.002", "3,3.0,1.3,1.4,0.3,0.20,0.003"]
ROWS_B = ["1,1.1,1.5,1.6,0.1,0.30,0.001", "2,2.1,1.4,1.5,0.2,0.25,0.002", "3,3.1,1.31,1.4,0.3,0.21,0.003"]


def run_folder(path: Path, rows: list[str], header: str = HEADER) -> Path:
    path.mkdir(parents=True)
    (path / "results.csv").write_text("\n".join([header, *rows]) + "\n")
    return path


def test_the_series_are_the_csv_columns_per_epoch(tmp_path: Path) -> None:
    a = curves.read_curves(run_folder(tmp_path / "a", ROWS_A))
    assert a.epochs == (1, 2, 3)
    assert a.series["train/box_loss"] == (1.5, 1.4, 1.3)
    assert a.series["val/box_loss"] == (0.30, 0.25, 0.20)
    assert list(a.series) == ["time", "train/box_loss", "train/cls_loss", "metrics/mAP50(B)", "val/box_loss", "lr/pg0"]
    # a run's determinism.json or the CSV itself name the same file
    assert curves.read_curves(tmp_path / "a" / "determinism.json").series == a.series
    assert curves.curve_names(a) == ["train/box_loss", "train/cls_loss", "metrics/mAP50(B)", "val/box_loss"]


def test_the_first_parting_epoch_is_the_first_whose_logged_losses_or_metrics_differ(tmp_path: Path) -> None:
    a = curves.read_curves(run_folder(tmp_path / "a", ROWS_A))
    b = curves.read_curves(run_folder(tmp_path / "b", ROWS_B))
    assert curves.first_parting_epoch(a, b) == 3  # time differs from epoch 1: not a loss or metric
    assert curves.first_parting_epoch(a, a) is None
    c = curves.read_curves(run_folder(tmp_path / "c", [ROWS_A[0], ROWS_B[2]]))  # epoch 2 not logged
    assert curves.first_parting_epoch(a, c) == 3


def test_the_png_draws_the_csv_values_and_marks_the_parting_epoch(tmp_path: Path) -> None:
    a, b = run_folder(tmp_path / "a", ROWS_A), run_folder(tmp_path / "b", ROWS_B)
    before = dict(matplotlib.rcParams)
    backend = matplotlib.get_backend()
    out = tmp_path / "curves.png"
    assert curves.write_curves_png(a, b, out, parted_epoch=3) == []
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    assert out.stat().st_size > 10_000
    assert dict(matplotlib.rcParams) == before
    assert matplotlib.get_backend() == backend
    fig = curves.curves_figure([("A", curves.read_curves(a)), ("B", curves.read_curves(b))], 3)
    box = next(ax for ax in fig.axes if ax.get_title() == "train/box_loss")
    line_a, line_b, mark = box.lines
    assert list(line_a.get_xdata()) == [1, 2, 3]
    assert list(line_a.get_ydata()) == [1.5, 1.4, 1.3]
    assert list(line_b.get_ydata()) == [1.5, 1.4, 1.31]
    assert list(mark.get_xdata()) == [3, 3]
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_visible()) == [
        "metrics/mAP50(B)",
        "train/box_loss",
        "train/cls_loss",
        "val/box_loss",
    ]


def test_a_missing_results_csv_is_one_line_and_the_other_run_is_drawn(tmp_path: Path) -> None:
    a = run_folder(tmp_path / "a", ROWS_A)
    (tmp_path / "b").mkdir()
    notes = curves.write_curves_png(a, tmp_path / "b", tmp_path / "one.png")
    assert len(notes) == 1
    assert notes[0].startswith(f"run B: no results.csv at '{tmp_path / 'b' / 'results.csv'}'")
    assert (tmp_path / "one.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(ConfigError, match="neither run has loss or metric curves") as e:
        curves.write_curves_png(tmp_path / "b", tmp_path / "b", tmp_path / "none.png")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "none.png").exists()


@pytest.mark.parametrize(
    ("header", "rows", "message"),
    [
        ("time,loss", ["1,2"], "with an epoch column"),
        (",".join(["epoch", *(f"c{i}" for i in range(200))]), [], "at most 100 columns"),
        (HEADER, ["1,1.0,__import__('os'),1.6,0.1,0.3,0.001"], "line 2 of .* is not a number"),
        (HEADER, ["1,1.0,1.5"], "line 2 of .* has 3 values for 7 columns"),
        (HEADER, ["1.5,1.0,1.5,1.6,0.1,0.3,0.001"], "the epoch is not a whole number"),
    ],
)
def test_a_results_csv_that_is_not_data_is_refused_in_one_line(
    tmp_path: Path, header: str, rows: list[str], message: str
) -> None:
    folder = run_folder(tmp_path / "a", rows, header)
    before = (folder / "results.csv").read_bytes()
    with pytest.raises(ConfigError, match=message) as e:
        curves.read_curves(folder)
    assert "\n" not in str(e.value)
    assert (folder / "results.csv").read_bytes() == before  # an input is never changed


def test_a_results_csv_beyond_the_limits_is_refused_before_it_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = run_folder(tmp_path / "a", ROWS_A * 3)
    monkeypatch.setattr(curves, "MAX_ROWS", 5)
    with pytest.raises(ConfigError, match="more than 5 epochs"):
        curves.read_curves(folder)
    monkeypatch.setattr(curves, "MAX_BYTES", 100)
    with pytest.raises(ConfigError, match="bigger than 100 bytes"):
        curves.read_curves(folder)


def test_a_column_name_is_drawn_as_plain_text(tmp_path: Path) -> None:
    folder = run_folder(tmp_path / "a", ["1,0.5"], "epoch,$\\frac{a}{b}$ loss")
    fig = curves.curves_figure([("A", curves.read_curves(folder))])
    assert fig.axes[0].get_title() == "??frac?a??b?? loss"  # matplotlib would read $...$ as mathematics


def test_diff_png_writes_the_picture_and_refuses_a_wrong_suffix_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["diff", str(tmp_path / "nope"), str(tmp_path / "nope"), "--png", str(tmp_path / "c.jpg")])
    assert code == 2
    assert "--png" in capsys.readouterr().err
