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


class TrainedRuns:
    """Runs of ``yolo-det train --profile repro`` on a quarter of the demo data (one optimizer step at 64 px),
    trained once each under a name and shared by every test that asks for that name (the session fixture
    ``trained_runs``): tests comparing two runs of one configuration ask for the same names, and a test that
    needs another configuration names it (``seed=1``: the control that the compared thing changes)."""

    #: the configuration every run starts from
    TOKENS: tuple[str, ...] = tuple(small_train_tokens(batch=8, fraction=0.25, val=False, exist_ok=None))

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Path] = {}
        #: what the command printed on stdout, per run
        self.output: dict[str, str] = {}

    def train(self, name: str, *extra: str) -> Path:
        """The run folder of run ``name`` (``key=value`` tokens ``extra`` on top of :attr:`TOKENS`)."""
        import contextlib
        import io

        import pytest

        from yolo_det.cli import main

        if name not in self.done:
            out = io.StringIO()
            with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
                mp.setenv("YOLO_DET_CACHE", str(self.root / "cache"))
                code = main(
                    [
                        "train",
                        "--profile",
                        "repro",
                        *self.TOKENS,
                        f"project={self.root / 'runs'}",
                        f"name={name}",
                        "exist_ok=True",
                        *extra,
                    ]
                )
            assert code == 0, out.getvalue()
            self.done[name] = self.root / "runs" / name
            self.output[name] = out.getvalue()
        return self.done[name]

    def base(self) -> Path:
        """The run every comparison starts from (seed 0)."""
        return self.train("seed0")

    def twin(self) -> Path:
        """A second run of :meth:`base`'s configuration."""
        return self.train("seed0-again")

    def other_seed(self) -> Path:
        """:meth:`base` with seed 1."""
        return self.train("seed1", "seed=1")

    def edited_data(self) -> Path:
        """The demo data copied, with the class of one object in one training label changed."""
        import shutil

        folder = self.root / "data-edited"
        if not folder.exists():
            shutil.copytree(DEMO, folder / "demo")
            text = (ROOT / "data" / "demo.yaml").read_text()
            (folder / "demo.yaml").write_text(text)
            label = folder / "demo" / "labels" / "train" / "train_000.txt"  # within fraction=0.25 (sorted names)
            lines = label.read_text().splitlines()
            lines[0] = ("1" if lines[0][0] != "1" else "2") + lines[0][1:]
            label.write_text("\n".join(lines) + "\n")
        return folder / "demo.yaml"


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
