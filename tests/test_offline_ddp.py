"""Offline multi-GPU: what Ultralytics' DDP launcher would install at run time is a declared dependency."""

from __future__ import annotations

import inspect
import re
import sys

import pytest

from helpers import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the test needs tomllib to read pyproject.toml
    tomllib = pytest.importorskip("tomllib")


def _declared(name: str) -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if re.match(rf"{name}\b", d)]


def test_cloudpickle_bound_is_the_one_ultralytics_checks_at_ddp_launch() -> None:
    from ultralytics.utils import dist

    checked = re.findall(r'check_requirements\("([^"]+)"\)', inspect.getsource(dist.generate_ddp_file))
    assert checked, "generate_ddp_file no longer checks a requirement: re-read it and update pyproject.toml"
    for requirement in checked:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)  # type: ignore[union-attr]
        assert _declared(name) == [requirement], f"declare '{requirement}' in [project] dependencies"


def test_installed_cloudpickle_satisfies_the_bound() -> None:
    import cloudpickle
    from ultralytics.utils.checks import check_version

    assert check_version(cloudpickle.__version__, ">=3.1.1")
