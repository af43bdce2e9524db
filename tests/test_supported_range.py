"""The declared range (pyproject.toml) and the documented one (README, docs/usage.md) agree, and the one pair of
the range that cannot train (an Ultralytics that calls np.trapz with a NumPy without it) is refused before a
run, with what to install."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

from helpers import ROOT
from yolo_det.cli import main
from yolo_det.core.compat import NUMPY_WITHOUT_TRAPZ, TRAPZ_FIXED_IN, numpy_pair_problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    tomllib = pytest.importorskip("tomli")


def _floors() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    found = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([\d.]+)", dep)
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


def test_the_declared_range_is_the_documented_one() -> None:
    floors = _floors()
    assert {"torch", "torchvision", "ultralytics"} <= set(floors)
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = usage.split("### Supported versions", 1)[1].split("\n## ", 1)[0]
    assert f"torch >= {floors['torch']}" in section
    assert f"torchvision >= {floors['torchvision']}" in section
    assert f"Ultralytics >= {floors['ultralytics']}" in section
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"torch (>= {floors['torch']}) and Ultralytics (>= {floors['ultralytics']})" in readme
    # the pair that cannot train, as the code knows it, is in the section and beside the declaration
    last_bad = f"{TRAPZ_FIXED_IN[0]}.{TRAPZ_FIXED_IN[1]}.{TRAPZ_FIXED_IN[2] - 1}"
    fixed = ".".join(map(str, TRAPZ_FIXED_IN))
    numpy = ".".join(map(str, NUMPY_WITHOUT_TRAPZ))
    assert f"Ultralytics {floors['ultralytics']} to {last_bad} with NumPy {numpy} or newer" in section
    assert f"pip install 'numpy<{numpy}'" in section
    assert f"Ultralytics >= {fixed}" in section
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f"Ultralytics {floors['ultralytics']}-{last_bad}" in pyproject
    assert f"NumPy {numpy} removed" in pyproject


def test_the_np_trapz_pair_is_named_with_both_ways_to_train() -> None:
    problem = numpy_pair_problem("8.3.100", "2.4.6")
    assert problem is not None
    assert "Ultralytics 8.3.100 calls np.trapz" in problem
    assert "pip install 'numpy<2.4', or Ultralytics >= 8.3.108" in problem
    assert numpy_pair_problem("8.3.107", "2.4.0") is not None
    # controls: a release that calls np.trapezoid, an older NumPy, and the installed pair train
    assert numpy_pair_problem("8.3.108", "2.4.6") is None
    assert numpy_pair_problem("8.4.190", "2.5.0") is None
    assert numpy_pair_problem("8.3.100", "2.3.5") is None
    assert numpy_pair_problem("8.3.0", "1.26.4") is None
    assert numpy_pair_problem() is None


def test_train_refuses_the_pair_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "8.3.100" if name == "ultralytics" else real(name))
    numpy = real("numpy")
    if tuple(int(x) for x in numpy.split(".")[:2]) < NUMPY_WITHOUT_TRAPZ:
        pytest.skip(f"NumPy {numpy} here still has np.trapz")
    runs = tmp_path / "runs"
    assert main(["train", "epochs=1", f"project={runs}", "name=old"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "Ultralytics 8.3.100 calls np.trapz" in err[0]
    assert not runs.exists()
