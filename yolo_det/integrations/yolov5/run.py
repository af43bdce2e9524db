"""YOLOv5 integration: what a YOLOv5 tree patched by ``yolo-det patch-yolov5`` calls at run time.

Length: one concern, the run-time side of the patch: :class:`YOLOv5Run` and one function per patched line.

Classic YOLOv5 (the ultralytics/yolov5 repository, its many clones, and the ``yolov5`` PyPI package) has no
hook at the two places that decide determinism: ``train.py`` hard-codes
``init_seeds(opt.seed + 1 + RANK, deterministic=True)`` (strict deterministic algorithms) and runs
``scaler.scale(loss).backward()`` where no callback can reach it. The patch changes a few lines so that
they call this module; each patched line calls one function and ends with ``# yolo-det``:

=============================  ===========================================================================
patched line                   effect with ``--det-profile NAME`` (without it: YOLOv5's behaviour, unchanged)
=============================  ===========================================================================
``ydet.add_argument(parser)``  adds the ``--det-profile NAME|FILE`` option (validated when parsed)
``@ydet.training``             ``train()`` runs as one yolo-det run: the user's process state is
                               snapshotted, the profile's ``train`` phase applied, a local font provided,
                               ``determinism.json`` written into ``opt.save_dir`` and the state restored
                               when ``train()`` returns or raises
``ydet.init_seeds(...)``       seeds python/numpy/torch with the run's per-rank seed instead of calling
                               YOLOv5's ``init_seeds`` (which would switch strict determinism on)
``ydet.prepare_model(model)``  hands the freshly built model (on its device) to the run
``ydet.train_loader(...)``     builds the loader ``train()`` trains with from ``create_dataloader``'s
                               (keyed under ``data_invariance``: :mod:`yolo_det.integrations.yolov5.data`)
``ydet.backward(...)``         runs backward; with ``backward: disable`` deterministic algorithms are off
                               exactly while autograd runs
``@ydet.validation``           ``val.run`` runs in the ``val`` phase (nested in ``train`` during training)
``@ydet.deployment``           ``detect.py``/``export.py``/``predict.py`` ``run`` in the ``deploy`` phase
=============================  ===========================================================================

The run in progress is held in a context variable (:func:`current_run`), so the patched functions need no
extra arguments; a call outside a run falls back to YOLOv5. YOLOv5's own callbacks read ``train()``'s state for
the resume state and the data fingerprint (:mod:`yolo_det.integrations.yolov5.resume`).
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch

from ...core.constants import global_rank, world_size
from ...core.endings import describe_ending, one_line, weights_files, weights_stats
from ...core.errors import ConfigError, ProfileError, YoloDetError
from ...core.plain import plain_value
from ...core.profiles import BUILTIN_PROFILES, Profile, load_profile
from ...core.record import RECORD_NAME, build_record, write_record
from ...core.resume.lineage import previous_record
from ...core.signals import defer_stops, safe_point, stop_signals
from ...core.state import snapshot
from ...session.session import DeterminismSession, note_restore_failure
from .data import YOLOv5Data
from .resume import YOLOv5Resume

__all__ = [
    "OPTION",
    "YOLOv5Run",
    "add_argument",
    "backward",
    "current_run",
    "deployment",
    "init_seeds",
    "last_opt_step",
    "prepare_model",
    "train_loader",
    "training",
    "validation",
]

#: The command-line option the patch adds to YOLOv5's scripts.
OPTION = "--det-profile"
_DEST = "det_profile"
_F = TypeVar("_F", bound=Callable[..., Any])
_M = TypeVar("_M")

_CURRENT: contextvars.ContextVar[YOLOv5Run | None] = contextvars.ContextVar("yolo_det_yolov5_run", default=None)

# YOLOv5 train options worth keeping in the record (detection, segmentation and classification scripts).
_RUN_ARGS = (
    "weights",
    "cfg",
    "model",
    "data",
    "hyp",
    "epochs",
    "batch_size",
    "imgsz",
    "img_size",
    "device",
    "seed",
    "workers",
    "optimizer",
    "rect",
    "multi_scale",
    "image_weights",
    "single_cls",
    "cos_lr",
    "label_smoothing",
    "noval",
    "nosave",
    "evolve",
    "resume",
    "cache",
    "quad",
    "sync_bn",
    "freeze",
    "pretrained",
    "det_profile",
    "name",
    "project",
)


def current_run() -> YOLOv5Run | None:
    """The YOLOv5 training run in progress in this context, or None."""
    return _CURRENT.get()


# ---------------------------------------------------------------------------------------------------------
# the run object


class YOLOv5Run:
    """One YOLOv5 training run under a profile: the session, the model and what was observed.

    Created by :func:`training` when ``opt.det_profile`` is set; :func:`current_run` returns it while
    ``train()`` runs.

    Args:
        profile: A :class:`~yolo_det.core.profiles.Profile`, a built-in name or a profile file path.
        opt: YOLOv5's options namespace (``seed``, ``save_dir``, ...).

    Raises:
        ProfileError: The profile is unknown or invalid.
        ConfigError: ``opt.seed`` is not a non-negative integer.
        script: The decorated ``train`` function (its module locates YOLOv5's settings folder).
        record: Write ``determinism.json`` into ``opt.save_dir``.

    Attributes:
        session: The :class:`~yolo_det.session.session.DeterminismSession` driving the phases.
        model: The model handed over by :func:`prepare_model` (None before).
        record_path: Path of ``determinism.json`` once written.
        backward_calls: Backward passes run through :func:`backward`.
        backward_modes: Deterministic-algorithms modes (``off``/``warn``/``strict``) seen by autograd while
            the backward passes ran (observed by a hook on the loss, inside the backward pass).
        state_at_train_start: The process state when the first backward pass was requested (the state the
            forward pass ran under).
        state_during_backward: The process state inside the first backward pass.
    """

    def __init__(
        self, profile: Profile | str, opt: Any, *, script: Callable[..., Any] | None = None, record: bool = True
    ) -> None:
        self.profile = load_profile(profile)
        if self.profile.train.extra.get("shards"):
            raise ConfigError(
                f"the profile '{self.profile.name}' sets shards, which yolo-det applies to Ultralytics training only; "
                f"remove shards from the profile to train YOLOv5 with {OPTION}"
            )
        self.opt = opt
        self.script = script
        self.record = record
        self.rank = global_rank(-1)
        seed = getattr(opt, "seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"--seed must be a non-negative integer under {OPTION}, got {seed!r}")
        self.session = DeterminismSession(
            self.profile,
            seed=seed,
            rank=max(self.rank, 0),
            world_size=world_size(),
        )
        self.model: Any = None
        self.record_path: Path | None = None
        self.fonts: list[Path] = []
        self.backward_calls = 0
        self.backward_modes: list[str] = []
        self.state_at_train_start: dict[str, Any] | None = None
        self.state_during_backward: dict[str, Any] | None = None
        self._weights_before: dict[str, Any] | None = None
        self.resume = YOLOv5Resume(getattr(script, "__code__", None), seed, rank=max(self.rank, 0))
        self.data = YOLOv5Data(self.session, seed, rank=max(self.rank, 0))
        self.resume.observe_batch = self.data.observe  # each batch train() takes, for the fingerprint
        self.previous: dict[str, Any] | None = None
        if getattr(opt, "resume", False) and getattr(opt, "weights", None):
            self.previous = previous_record(str(opt.weights))

    # -- lifecycle ------------------------------------------------------------------------------------
    @contextmanager
    def training(self) -> Iterator[YOLOv5Run]:
        """Begin the run, enter ``train``; on exit write the record and restore the baseline, on error too."""
        with stop_signals():  # SIGINT, SIGTERM, SIGHUP stop the run at the next batch: recorded
            self.session.begin()
            release_stops = defer_stops()
            try:
                self.fonts = _provide_font(self.script)
                self.session.enter("train")
                self._weights_before = weights_stats(self._weights_dir())
                yield self
            except BaseException as error:
                release_stops()
                try:
                    if self.record and self.rank in {-1, 0}:
                        self._write_record(error)
                except BaseException as e:
                    note_restore_failure(error, e)
                self.session.end_after(error)
                raise
            release_stops()
            try:
                if self.record and self.rank in {-1, 0}:
                    self._write_record(None)
            finally:
                self.session.end()

    def _weights_dir(self) -> Path:
        return Path(getattr(self.opt, "save_dir", ".")) / "weights"

    def seed(self) -> int:
        """Seed python, numpy and torch with this rank's seed (what ``init_seeds`` does under a profile)."""
        seed = self.session.reseed()
        return int(self.session.seeds()["rng_seed"] if seed is None else seed)

    def prepare_model(self, model: _M) -> _M:
        """Take the model right after YOLOv5 built it and moved it to its device; return the model to train.

        This is the one place where the model is handed to yolo-det before the optimizer, EMA and DDP
        wrappers see it: the train phase's ``swaps`` policy is applied here (in place; the layers keep their
        parameters, and checkpoints pickle them as PyTorch's classes, so they load without yolo-det).
        """
        self.model = model
        imgsz = getattr(self.opt, "imgsz", None) or getattr(self.opt, "img_size", None) or 64
        if isinstance(imgsz, (list, tuple)):
            imgsz = max(imgsz)
        self.session.prepare_model(model, imgsz=int(imgsz))
        return model

    def backward(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``tensor.backward(*args, **kwargs)`` under the phase in force (see :func:`backward`)."""
        safe_point("batch-start")  # a noted stop ends the run here, between batches
        if self.state_at_train_start is None:
            self.state_at_train_start = snapshot().to_dict()
        if tensor.requires_grad:
            tensor.register_hook(self._observe_backward)
        with self.session.backward_scope():
            if self.state_during_backward is None:
                self.state_during_backward = snapshot().to_dict()
            tensor.backward(*args, **kwargs)
        self.backward_calls += 1

    def _observe_backward(self, grad: torch.Tensor) -> None:
        mode = snapshot().mode
        if mode not in self.backward_modes:
            self.backward_modes.append(mode)

    # -- record ---------------------------------------------------------------------------------------
    def _write_record(self, error: BaseException | None) -> None:
        save_dir = getattr(self.opt, "save_dir", None)
        if save_dir is None:
            return
        try:
            self.record_path = write_record(save_dir, self.to_record(error))
        except Exception as e:  # never fail a finished training, nor mask the error ending one
            warnings.warn(
                f"yolo-det: could not write {RECORD_NAME} in '{save_dir}': {type(e).__name__}: {one_line(e)}",
                UserWarning,
                stacklevel=3,
            )

    def to_record(self, error: BaseException | None = None) -> dict[str, Any]:
        """The content of ``determinism.json`` (the fields the Ultralytics integration writes, and more)."""
        session = self.session
        save_dir = Path(getattr(self.opt, "save_dir", ".")).resolve()
        files = weights_files(save_dir / "weights", self._weights_before)
        weights: dict[str, Any] = {"files": files}
        last = save_dir / "weights" / "last.pt"
        entry = next((f for f in files if Path(f["file"]) == last and f.get("sha256")), None)
        if error is None and entry is not None:
            weights["file"] = entry["file"]
            weights["sha256"] = entry["sha256"]
        run: dict[str, Any] = {k: plain_value(getattr(self.opt, k)) for k in _RUN_ARGS if hasattr(self.opt, k)}
        run["save_dir"] = str(save_dir)
        if self.script is not None:
            run["script"] = getattr(getattr(self.script, "__code__", None), "co_filename", None)
        seeds = session.seeds()
        seeds["data_order"] = "yolo-det: the loader generator is seeded per epoch from --seed (seeding.epoch_data_seed)"
        ending = describe_ending(error)
        record = build_record(
            session,
            framework="yolov5",
            status=ending.pop("status"),
            state_at_train_start=self.state_at_train_start,
            weights=weights,
            run=run,
            seeds=seeds,
            state_during_backward=self.state_during_backward,
            backward={
                "calls": self.backward_calls,
                "modes_seen": list(self.backward_modes),
                "disabled": self.profile.train.backward == "disable",
            },
            model=_describe_model(self.model),
            fonts=[str(f) for f in self.fonts],
            **ending,
        )
        resume = self.resume
        segments: list[Any] = []
        if resume.info is not None and self.previous is not None:
            segments = [*self.previous.get("segments", []), {k: v for k, v in self.previous.items() if k != "segments"}]
        train = self.profile.train
        record["resume"] = (
            None
            if resume.info is None
            else {
                **resume.info,
                "bitwise_expected": bool(
                    resume.info["state_found"] and train.deterministic and train.backward == "keep"
                ),
            }
        )
        record["segments"] = segments
        record["resume_states_written"] = resume.states_written
        record["resume_state_seconds"] = round(resume.seconds_saving, 4)
        record["data_stream"] = self.data.section(self.opt)
        return record


def _describe_model(model: Any) -> dict[str, Any] | None:
    if not isinstance(model, torch.nn.Module):
        return None
    params = list(model.parameters())
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "parameters": sum(p.numel() for p in params),
        "device": str(params[0].device) if params else None,
    }


def _provide_font(script: Callable[..., Any] | None) -> list[Path]:
    """Put a local ``Arial.ttf`` where YOLOv5's ``check_font`` looks, so no run downloads it."""
    from ..fonts import ensure_local_font

    folders: list[Path] = []
    # YOLOv5's settings folder is utils.general.CONFIG_DIR of the tree being run (repository or PyPI layout);
    # every train script imports init_seeds from that module.
    general_fn = getattr(script, "__globals__", {}).get("init_seeds") if script is not None else None
    config_dir = getattr(general_fn, "__globals__", {}).get("CONFIG_DIR") if general_fn is not None else None
    if config_dir is not None:
        folders.append(Path(config_dir))
    try:
        return ensure_local_font(folders or None)
    except OSError as e:  # a font is a convenience: never fail a run for it
        warnings.warn(f"yolo-det could not provide a local font: {e}", stacklevel=3)
        return []


# ---------------------------------------------------------------------------------------------------------
# what the patched lines call


def _check_profile(value: str) -> str:
    try:
        load_profile(value)
    except ProfileError as e:
        raise argparse.ArgumentTypeError(" ".join(str(e).split())) from None
    return value


def add_argument(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """Add ``--det-profile NAME|FILE`` to a YOLOv5 script's parser (validated when parsed).

    Args:
        parser: The script's ``argparse`` parser.
        default: Profile used when the option is not given; None keeps YOLOv5's own behaviour.

    Raises:
        ProfileError: ``default`` is not a valid profile.
    """
    if default is not None:
        load_profile(default)
    parser.add_argument(
        OPTION,
        dest=_DEST,
        type=_check_profile,
        default=default,
        metavar="NAME|FILE",
        help=f"yolo-det determinism profile ({', '.join(BUILTIN_PROFILES)} or a profile YAML); "
        "default: YOLOv5's own seeding and determinism",
    )


def _find_opt(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if "opt" in kwargs:
        return kwargs["opt"]
    for value in args:
        if isinstance(value, argparse.Namespace) or hasattr(value, _DEST):
            return value
    return None


def _find_callbacks(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    if "callbacks" in kwargs:
        return kwargs["callbacks"]
    return next((v for v in args if callable(getattr(v, "register_action", None))), None)


def training(fn: _F) -> _F:
    """Decorate YOLOv5's ``train()``: with ``opt.det_profile`` set, it runs as one yolo-det run.

    First the options pass the gate (:func:`yolo_det.integrations.yolov5.gate.check_options`: a resumed run's,
    with or without a profile, which come from its ``opt.yaml``; the run folder's links under a profile).
    The run snapshots the process state, provides a local font, enters the profile's ``train`` phase, and
    when ``train()`` returns or raises writes ``determinism.json`` into ``opt.save_dir`` (rank 0) and
    restores the state it found. Without a profile (or inside a run already), ``train()`` runs unchanged.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        opt = _find_opt(args, kwargs)
        profile = getattr(opt, _DEST, None) if opt is not None else None
        try:
            if opt is not None and _CURRENT.get() is None and (profile is not None or getattr(opt, "resume", False)):
                from .gate import check_options

                check_options(opt)  # what a resumed run's opt.yaml names, and the run folder: before any read or write
            if profile is None or _CURRENT.get() is not None:
                run = None
            else:
                run = YOLOv5Run(profile, opt, script=fn)
        except YoloDetError as e:
            _refuse(fn, e)
        if run is None:
            return fn(*args, **kwargs)
        token = _CURRENT.set(run)
        run.resume.attach(_find_callbacks(args, kwargs))
        try:
            with run.training():
                return fn(*args, **kwargs)
        finally:
            run.resume.detach()
            _CURRENT.reset(token)

    return wrapper  # type: ignore[return-value]


def _refuse(fn: Callable[..., Any], error: YoloDetError) -> NoReturn:
    """A refusal before ``train()`` starts: raised to a Python caller; in YOLOv5's own script run from the command
    line (``python train.py``: ``train`` is defined in ``__main__``), one line on stderr and the error's exit code
    (2), as the ``yolo-det`` command line gives it, never a traceback."""
    if getattr(fn, "__module__", None) != "__main__":
        raise error
    from ...core.text import printable

    print(f"yolo-det: error: {printable(one_line(error), newlines=False)}", file=sys.stderr)
    raise SystemExit(error.exit_code) from None


def init_seeds(yolov5_init_seeds: Callable[..., Any], seed: int = 0, deterministic: bool = False) -> None:
    """Seed as YOLOv5 does, unless a profile is in force.

    Args:
        yolov5_init_seeds: YOLOv5's own ``utils.general.init_seeds``, called as is outside a run.
        seed: The seed YOLOv5 passes (``opt.seed + 1 + RANK``).
        deterministic: YOLOv5's ``deterministic`` argument.

    Under a profile the train phase has set the determinism switches already; this seeds python, numpy and
    torch with the run's per-rank seed (:func:`yolo_det.core.seeding.rank_seed` of ``opt.seed``) and leaves the
    switches alone.
    """
    run = _CURRENT.get()
    if run is None:
        yolov5_init_seeds(seed, deterministic=deterministic)
        return
    run.seed()


def last_opt_step(default: int = -1) -> int:
    """``last_opt_step = ydet.last_opt_step(-1)``: YOLOv5's value, or on a resumed run under a profile the
    uninterrupted run's last optimizer step (read from the resume state, which is restored with it).

    Outside a run ``default`` is returned.
    """
    run = _CURRENT.get()
    if run is None:
        return default
    return run.resume.last_opt_step(sys._getframe(1).f_locals, default)


def train_loader(create: _F) -> _F:
    """``train_loader, dataset = ydet.train_loader(create_dataloader)(...)``: outside a run ``create`` as is; under a
    run, ``create`` whose loader is replaced by :meth:`YOLOv5Data.build
    <yolo_det.integrations.yolov5.data.YOLOv5Data.build>`'s (its first pass: ``train()``'s ``start_epoch``).

    Raises:
        ConfigError: The calling ``train()`` has no integer ``start_epoch``.
    """
    run = _CURRENT.get()
    if run is None:
        return create
    epoch = sys._getframe(1).f_locals.get("start_epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise ConfigError(f"the patched train() has no integer start_epoch (got {epoch!r}); unpatch this YOLOv5 tree")

    @functools.wraps(create)
    def build(*args: Any, **kwargs: Any) -> Any:
        loader, dataset = create(*args, **kwargs)
        return run.data.build(loader, epoch), dataset

    return build  # type: ignore[return-value]


def prepare_model(model: _M) -> _M:
    """Hand the model, right after it is built and moved to its device, to the run; return the model to use.

    Outside a run the model is returned unchanged (see :meth:`YOLOv5Run.prepare_model`).
    """
    run = _CURRENT.get()
    return model if run is None else run.prepare_model(model)


def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``tensor.backward(*args, **kwargs)``; under a profile whose phase says ``backward: disable``,
    deterministic algorithms are off exactly while autograd runs (and put back afterwards, on error too)."""
    run = _CURRENT.get()
    if run is None:
        tensor.backward(*args, **kwargs)
        return
    run.backward(tensor, *args, **kwargs)


@contextmanager
def _phase(phase: str, profile: Any) -> Iterator[None]:
    run = _CURRENT.get()
    if run is not None and run.session.active:
        with run.session.phase_scope(phase):
            yield
    elif profile is not None:
        session = DeterminismSession(profile)
        with session.run(), session.phase_scope(phase):
            yield
    else:
        yield


def _phase_decorator(phase: str, fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        profile = kwargs.pop(_DEST, None)
        if profile is not None:
            try:
                load_profile(profile)
            except ProfileError as e:
                raise YoloDetError(f"{OPTION}: {e}") from None
        with _phase(phase, profile):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def validation(fn: _F) -> _F:
    """Decorate YOLOv5's ``val.run``: inside a training run it runs in the ``val`` phase (then ``train``
    resumes); called with ``det_profile=NAME`` it runs alone under that profile's ``val`` phase."""
    return _phase_decorator("val", fn)


def deployment(fn: _F) -> _F:
    """Decorate ``run`` of ``detect.py``, ``export.py`` and ``predict.py``: called with ``det_profile=NAME``
    (the ``--det-profile`` option) it runs under that profile's ``deploy`` phase and restores the process
    state afterwards; without it, unchanged."""
    return _phase_decorator("deploy", fn)
