"""Shared fixtures: every test starts from, and leaves, the same process-wide determinism state."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import warnings

import pytest
import torch

from helpers import ROOT, STOP_SIGNAL_DEFAULTS, TrainedRuns

os.environ.setdefault("YOLO_OFFLINE", "1")  # Ultralytics reads it at import: never probe the network in tests
# yolo-det's cache (data fingerprints, the digests of checkpoints it wrote) in a folder of this test session's own,
# never the user's: a test run neither reads nor leaves trust in ~/.cache/yolo-det
os.environ.setdefault("YOLO_DET_CACHE", tempfile.mkdtemp(prefix="yolo-det-test-cache-"))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Ultralytics' settings in a folder of this test session's own (the first process sets it, pytest-xdist's workers and
# every subprocess inherit it), every tracker integration off: no training a test starts logs to, or writes files
# for, a tracker the machine's settings turn on (installed, Ultralytics turns Comet, ClearML, DVC and MLflow on by
# default), and no test reads or changes the user's settings. tests/test_trackers.py turns trackers on in its own.
if "YOLO_CONFIG_DIR" not in os.environ:
    os.environ["YOLO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="yolo-det-test-ultralytics-")
    from ultralytics.utils import SETTINGS

    SETTINGS.update(
        {
            k: False
            for k in ("clearml", "comet", "dvc", "mlflow", "neptune", "raytune", "tensorboard", "wandb")
            if k in SETTINGS
        }
    )

from yolo_det.core import state as det_state

_ENV_KEYS = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "NCCL_ALGO", "NCCL_PROTO", "OMP_NUM_THREADS")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (``--dist loadscope --no-loadscope-reorder``, pyproject.toml), hand the workers the
    modules with the most slow tests first, then those with the most tests (xdist's own order), so that the last
    modules to start are short and the workers end together; within a module the order stays as collected. A run
    without workers keeps the collected order."""
    if not hasattr(config, "workerinput"):
        return
    weight: dict[str, tuple[int, int]] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        slow, count = weight.get(module, (0, 0))
        weight[module] = (slow + (item.get_closest_marker("slow") is not None), count + 1)
    order = {module: (-slow, -count, rank) for rank, (module, (slow, count)) in enumerate(weight.items())}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


@pytest.fixture(autouse=True)
def _isolate_global_state():
    """Snapshot the determinism state, warning filters and torch function modes; put them back after."""
    before = det_state.snapshot(_ENV_KEYS)
    filters = warnings.filters[:]
    showwarning = warnings.showwarning
    rng = torch.get_rng_state()
    yield
    det_state.restore(before)
    warnings.filters[:] = filters
    warnings._filters_mutated()
    warnings.showwarning = showwarning
    torch.set_rng_state(rng)


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> TrainedRuns:
    """The tiny CLI runs of :class:`helpers.TrainedRuns`, each trained once per session (per xdist worker: the
    tests asking for them form one xdist group, see ``pytest_collection_modifyitems``)."""
    return TrainedRuns(tmp_path_factory.mktemp("trained-runs"))


@pytest.fixture
def demo_data() -> str:
    """Path of the bundled demo data YAML."""
    from yolo_det.tools.demo import demo_data_yaml

    return str(demo_data_yaml())


@pytest.fixture(scope="session", autouse=True)
def _offline_font():
    """Ultralytics plots labels with Arial.ttf; make sure a local copy exists so no test downloads it."""
    from yolo_det.integrations.fonts import ensure_local_font

    ensure_local_font()
    return


@pytest.fixture
def default_stop_handlers():
    """SIGINT, SIGTERM and SIGHUP at Python's defaults for the test, whatever this process inherited.

    A test runner started in the background by a shell ignores SIGINT, and one under ``nohup`` ignores SIGHUP;
    yolo-det leaves an ignored signal ignored, so tests of its endings start from the defaults. The dispositions
    found are put back afterwards.
    """
    previous = {sig: signal.signal(sig, handler) for sig, handler in STOP_SIGNAL_DEFAULTS.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
