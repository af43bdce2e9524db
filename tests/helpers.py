"""What the tests share, in one place: the repository's root, its example model YAMLs, a subprocess's environment."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The repository root (the folder holding pyproject.toml).
ROOT = Path(__file__).resolve().parent.parent
#: The example model YAMLs of data/models.
MODELS = ROOT / "data" / "models"
#: The bundled demo dataset.
DEMO = ROOT / "data" / "demo"


#: The small training every test that trains starts from (one epoch of the demo data at 64 px on the CPU).
SMALL_TRAIN: dict[str, Any] = {
    "epochs": 1,
    "imgsz": 64,
    "batch": 16,
    "device": "cpu",
    "workers": 0,
    "plots": False,
    "exist_ok": True,
}


def small_train(**changes: Any) -> dict[str, Any]:
    """:data:`SMALL_TRAIN` with ``changes`` (keyword arguments of ``model.train``); a change to None drops it."""
    return {k: v for k, v in {**SMALL_TRAIN, **changes}.items() if v is not None}


def small_train_tokens(**changes: Any) -> list[str]:
    """:func:`small_train` as ``key=value`` command-line tokens (``yolo-det train``, ``verify``)."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in small_train(**changes).items()]


def subprocess_env(extra: Mapping[str, str] | None = None, *, path: Sequence[str | Path] = ()) -> dict[str, str]:
    """The environment for a ``python`` subprocess of a test: this one's, with the repository (and ``path``)
    first on ``PYTHONPATH``, Ultralytics offline, and no yolo-det debugging or testing hooks, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["YOLO_OFFLINE"] = "1"
    for name in (
        "YOLO_DET_DEBUG",
        "YOLO_DET_TEST_SIGNAL_AT",
        "YOLO_DET_TEST_SIGNAL_RANK",
        "YOLO_DET_TEST_SIGNAL_AGENT",
    ):
        env.pop(name, None)
    env.update(extra or {})
    return env


def train_stopped_after(tokens: list[str], after: int, *, modules: Sequence[str] = (), profile: str = "repro") -> Path:
    """Train as ``yolo-det train --profile PROFILE [--import M ...] TOKENS`` does, stopped cleanly (as an
    interrupted job leaves it) once epoch ``after`` is checkpointed; return the run's ``last.pt``."""
    import pytest
    from ultralytics import YOLO

    from yolo_det.analysis.models import model_names
    from yolo_det.integrations.trainer_state import state_of
    from yolo_det.integrations.ultralytics import attach
    from yolo_det.tools.prepare import prepare

    class Stop(Exception):
        pass

    def stop(trainer: Any) -> None:
        if trainer.epoch + 1 == after:
            state_of(trainer).stopped_on_purpose = True
            raise Stop

    with model_names(list(modules)):
        resolved, args = prepare(profile, tokens)
        args = dict(args)
        model = YOLO(args.pop("model"))
        attach(model, resolved)
        model.add_callback("on_fit_epoch_end", stop)
        with pytest.raises(Stop):
            model.train(**args)
    return Path(args["project"]) / args["name"] / "weights" / "last.pt"


# Python's own dispositions of the signals that stop a run
STOP_SIGNAL_DEFAULTS = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
}


def default_stop_signals() -> None:
    """``preexec_fn`` for a child that must see SIGINT, SIGTERM and SIGHUP as a terminal would send them.

    A child inherits its parent's dispositions: under ``nohup`` SIGHUP is ignored, and a shell's background
    job ignores SIGINT; yolo-det leaves an ignored signal ignored, so a test of its endings starts from the
    defaults instead.
    """
    for sig in STOP_SIGNAL_DEFAULTS:
        signal.signal(sig, signal.SIG_DFL)


def resumable_checkpoint(path: Path, train_args: dict[str, object]) -> Path:
    """A training checkpoint Ultralytics would resume (an optimizer, epoch 0), storing ``train_args``."""
    import torch
    from ultralytics.nn.tasks import DetectionModel

    path.parent.mkdir(parents=True, exist_ok=True)
    model = DetectionModel("yolov8n.yaml", nc=2, verbose=False)
    torch.save(
        {
            "epoch": 0,
            "best_fitness": None,
            "model": None,
            "ema": model.half(),
            "updates": 1,
            "optimizer": {"state": {}, "param_groups": []},
            "train_args": {
                "epochs": 3,
                "model": "yolov8n.yaml",
                "imgsz": 64,
                "batch": 2,
                "device": "cpu",
                **train_args,
            },
            "date": "2026-01-01",
            "version": "8",
        },
        path,
    )
    return path
