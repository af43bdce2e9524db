"""Every figure README.md states comes from a committed bench result: the README says what the JSON says."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
RESULTS = ROOT / "bench" / "results"


def _json(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _data_cost_percent(dataset: str, cache: str | None) -> float:
    """The Ultralytics loader cost at 2 workers (bench/bench_data.py) on one of its datasets, in percent."""
    found = [
        r["cost"]
        for r in _json("data.json")["results"]
        if r["workers"] == 2 and r["dataset"] == dataset and r["cache"] == cache
    ]
    assert len(found) == 1
    return 100 * found[0]


def _accuracy(arm: str, field: str = "mean") -> float:
    """An arm's mAP50 over seeds (bench/bench_accuracy.py), or its ratio to plain's with its interval."""
    row = _json("accuracy.json")["summary"][arm]
    assert row["map50"]["n"] >= 5
    if field == "mean":
        return row["map50"]["mean"]
    ratio = row["ratio_to_plain"]
    return ratio["mean"] if field == "ratio" else ratio["ci95"][0 if field == "lo" else 1]


#: Each figure in the README: the text around it (with ``{}`` where the figure stands), how the figure is
#: written from the value, and the value read from the bench result.
FIGURES: list[tuple[str, Callable[[float], str], Callable[[], float]]] = [
    ("{}% less CPU throughput", lambda v: f"{v:.0f}", lambda: _data_cost_percent("large", None)),
    ("({}% with `cache=ram`", lambda v: f"{v:.0f}", lambda: _data_cost_percent("large", "ram")),
    ("{}% where the images fit the buffer", lambda v: f"{v:.0f}", lambda: _data_cost_percent("demo", None)),
    ("YOLOv5: a {}% gain", lambda v: f"{v:.0f}", lambda: -100 * _json("data_yolov5.json")["cost"]),
    (
        "{}% slower per image for square images",
        lambda v: f"{v:.0f}",
        lambda: _json("deploy.json")["shapes"]["square"]["cost_percent"],
    ),
    ("{}% for 3:4 ones", lambda v: f"{v:.0f}", lambda: _json("deploy.json")["shapes"]["3:4"]["cost_percent"]),
    ("`repro` reached {} of plain Ultralytics' mean mAP50", lambda v: f"{v:.2f}", lambda: _accuracy("repro", "ratio")),
    ("mean mAP50 ({} against", lambda v: f"{v:.3f}", lambda: _accuracy("repro")),
    ("against {}; 95%", lambda v: f"{v:.3f}", lambda: _accuracy("plain")),
    ("95% bootstrap interval {}-", lambda v: f"{v:.2f}", lambda: _accuracy("repro", "lo")),
    ("-{}, five seeds each", lambda v: f"{v:.2f}", lambda: _accuracy("repro", "hi")),
]


@pytest.mark.parametrize(("text", "fmt", "value"), FIGURES, ids=[t for t, _, _ in FIGURES])
def test_each_readme_figure_is_the_bench_result(text, fmt, value) -> None:
    figure = fmt(value())
    assert text.format(figure) in " ".join(README.split()), f"README should say {text.format(figure)!r}"


def test_every_percentage_in_the_readme_is_traced() -> None:
    """A new figure in the README fails here until it has its row in FIGURES."""
    flat = " ".join(README.split())
    found = {m.start() for m in re.finditer(r"[+-]?\d+(?:\.\d+)?%", flat)}
    traced = set()
    for text, fmt, value in FIGURES:
        at = flat.find(text.format(fmt(value())))
        if at >= 0:
            traced |= {i for i in found if at <= i < at + len(text) + 8}
    assert found, "the README states no percentage any more: drop this test or FIGURES"
    assert found == traced, [flat[i : i + 40] for i in sorted(found - traced)]
