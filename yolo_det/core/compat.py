"""Every Ultralytics internal yolo-det touches, in one place.

Length: one door: each internal, and the one function per difference between releases, is here and nowhere else.

Ultralytics' public API is ``from ultralytics import YOLO`` (and the model's methods). Everything else
yolo-det relies on, the callback events, the trainers of each task, ``ultralytics.nn.tasks`` (where model
YAMLs resolve layer names), the configuration helpers, is named here and nowhere else, so an Ultralytics
release that moves or renames one breaks this module and its contract tests (``tests/test_compat.py``),
not a layer of its own. ``tests/test_architecture.py`` fails when another module imports an Ultralytics
internal.

Ultralytics releases in the supported range differ in a few internals yolo-det depends on; one function
here handles each (:func:`run_folder`, :func:`loss_components`, :func:`optimizer_state`, :func:`label_verdict`),
so the rest of yolo-det sees one behaviour:

======================================  ===============================  ===================================
internal                                8.3 (8.3.253)                    8.4 (8.4.190)
======================================  ===============================  ===================================
``InfiniteDataLoader.iterator``         made in ``__init__`` (workers    made at the first batch
                                        start with the loader)
``InfiniteDataLoader.reset()``          makes the next iterator at once  closes it; the next batch makes one
                                        (a keyed sampler's stream starts
                                        at its epoch either way)
``cfg.get_save_dir``                    creates the folder it names      creates nothing
``non_max_suppression``                 ``utils.ops`` (8.3.0)            ``utils.nms``
``BaseTrainer.loss_items``              one tensor, a value per part     a tuple of parts, or a name mapping
``verify_image_label``                  ``single_cls`` from 8.3.92 on;   takes ``single_cls``; reads a BOM,
                                        its rules differ by release      keeps a pose box in a box task
optimizer ``lr``/``momentum`` (warmup)  NumPy scalars                    Python floats
======================================  ===============================  ===================================

The names resolve lazily (``from yolo_det.core.compat import tasks`` imports ``ultralytics.nn.tasks`` when
that line runs), so importing this module imports nothing. It lives in the bottom layer because layers
from ``layers`` up to ``tools`` use Ultralytics internals; of yolo-det it imports only ``core.errors``. A name
the installed release lacks is one line naming it and the release (:class:`MissingContact`), never a fallback.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import YoloDetError

__all__ = [
    "MissingContact",
    "EARLIER",
    "EVENTS",
    "INTERNALS",
    "LABEL_SINGLE_CLS_FROM",
    "NUMPY_WITHOUT_TRAPZ",
    "TASK_TRAINERS",
    "TRAPZ_FIXED_IN",
    "contact",
    "cpu_ddp_wrapping",
    "internal",
    "label_verdict",
    "loaded_internal",
    "loss_components",
    "mosaic_on",
    "numpy_pair_problem",
    "optimizer_state",
    "require_methods",
    "world_size",
    "run_folder",
    "validator_on_cpu",
    "sees_through",
    "ultralytics_version",
]

#: ``name -> (module, attribute)`` (attribute None: the module itself) of each Ultralytics internal.
INTERNALS: dict[str, tuple[str, str | None]] = {
    # model YAMLs: the namespace layer names resolve in, and the task a model YAML is for
    "tasks": ("ultralytics.nn.tasks", None),
    "guess_model_task": ("ultralytics.nn.tasks", "guess_model_task"),
    # configuration: defaults, checks, the run folder a configuration gives
    "DEFAULT_CFG": ("ultralytics.utils", "DEFAULT_CFG"),
    "DEFAULT_CFG_DICT": ("ultralytics.cfg", "DEFAULT_CFG_DICT"),
    # the typed arguments (numbers, switches, names): the gate derives the path-valued ones from the rest
    "CFG_FLOAT_KEYS": ("ultralytics.cfg", "CFG_FLOAT_KEYS"),
    "CFG_FRACTION_KEYS": ("ultralytics.cfg", "CFG_FRACTION_KEYS"),
    "CFG_INT_KEYS": ("ultralytics.cfg", "CFG_INT_KEYS"),
    "CFG_BOOL_KEYS": ("ultralytics.cfg", "CFG_BOOL_KEYS"),
    "get_cfg": ("ultralytics.cfg", "get_cfg"),
    "check_cfg": ("ultralytics.cfg", "check_cfg"),
    "get_save_dir": ("ultralytics.cfg", "get_save_dir"),
    "check_yaml": ("ultralytics.utils.checks", "check_yaml"),
    "DATASETS_DIR": ("ultralytics.utils", "DATASETS_DIR"),
    # datasets: the image suffixes a split lists and where each image's label file is (the label pre-check)
    "IMG_FORMATS": ("ultralytics.data.utils", "IMG_FORMATS"),
    "img2label_paths": ("ultralytics.data.utils", "img2label_paths"),
    "verify_image_label": ("ultralytics.data.utils", "verify_image_label"),
    "USER_CONFIG_DIR": ("ultralytics.utils", "USER_CONFIG_DIR"),
    "LOGGER": ("ultralytics.utils", "LOGGER"),
    # the global rank Ultralytics read from RANK at import (-1 outside a distributed run)
    "ULTRALYTICS_RANK": ("ultralytics.utils", "RANK"),
    # engine: the model base class, the trainer base class, the default callbacks
    "Model": ("ultralytics.engine.model", "Model"),
    "BaseTrainer": ("ultralytics.engine.trainer", "BaseTrainer"),
    "callbacks": ("ultralytics.utils.callbacks", None),
    # mixed precision as Ultralytics' trainer uses it
    "autocast": ("ultralytics.utils.torch_utils", "autocast"),
    # the namespace checkpoints store their arguments in (allowed by the checkpoint unpickler)
    "IterableSimpleNamespace": ("ultralytics.utils", "IterableSimpleNamespace"),
    # the newest run folder (resume=True without a path)
    "get_latest_run": ("ultralytics.utils.files", "get_latest_run"),
    # preprocessing and postprocessing as predict() does them (batch invariance, export parity)
    "LetterBox": ("ultralytics.data.augment", "LetterBox"),
    # the mosaic of a detection dataset's transforms (whether a run trains with mosaic: resume)
    "Mosaic": ("ultralytics.data.augment", "Mosaic"),
    "non_max_suppression": ("ultralytics.utils.nms", "non_max_suppression"),
    "ops": ("ultralytics.utils.ops", None),
    "ASSETS": ("ultralytics.utils", "ASSETS"),
    # running an exported model (ONNX, TorchScript, ...) as predict() runs it
    "AutoBackend": ("ultralytics.nn.autobackend", "AutoBackend"),
    # the experiment trackers Ultralytics' own integrations log to (their ``mlflow``, ``wb``, ``WRITER``, ``comet_ml``,
    # ``Task``, ``live``): the record is attached to the run they opened (integrations/ultralytics/trackers); read only
    # once Ultralytics imported them
    "mlflow_integration": ("ultralytics.utils.callbacks.mlflow", None),
    "wandb_integration": ("ultralytics.utils.callbacks.wb", None),
    "tensorboard_integration": ("ultralytics.utils.callbacks.tensorboard", None),
    "comet_integration": ("ultralytics.utils.callbacks.comet", None),
    "clearml_integration": ("ultralytics.utils.callbacks.clearml", None),
    "dvc_integration": ("ultralytics.utils.callbacks.dvc", None),
}

#: Where an older Ultralytics release in the range has an internal of :data:`INTERNALS` instead.
EARLIER: dict[str, tuple[str, str | None]] = {
    "non_max_suppression": ("ultralytics.utils.ops", "non_max_suppression"),  # 8.3.0: no ultralytics.utils.nms
}

#: The Ultralytics callback events the plugin registers (each in Ultralytics' default callbacks).
EVENTS: tuple[str, ...] = (
    "on_pretrain_routine_start",
    "on_pretrain_routine_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_fit_epoch_end",
    "on_val_start",
    "on_val_end",
    "on_train_end",
    "teardown",
    "on_predict_start",
    "on_predict_batch_start",
    "on_predict_end",
    "on_export_start",
    "on_export_end",
)

#: Ultralytics task -> (module, trainer class) of the trainer Ultralytics itself uses for it.
TASK_TRAINERS: dict[str, tuple[str, str]] = {
    "detect": ("ultralytics.models.yolo.detect", "DetectionTrainer"),
    "segment": ("ultralytics.models.yolo.segment", "SegmentationTrainer"),
    "pose": ("ultralytics.models.yolo.pose", "PoseTrainer"),
    "obb": ("ultralytics.models.yolo.obb", "OBBTrainer"),
    "classify": ("ultralytics.models.yolo.classify", "ClassificationTrainer"),
}


class MissingContact(YoloDetError, AttributeError):
    """An Ultralytics internal yolo-det relies on is missing from the installed release (one line naming it and the
    release: never a guarantee silently off)."""


def contact(obj: Any, name: str, why: str) -> Any:
    """``obj.name``, an attribute of an Ultralytics object a guarantee rests on (``why``): never a default in its
    place, but :class:`MissingContact` in one line naming it and the installed release."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise MissingContact(
            f"{type(obj).__name__} of Ultralytics {ultralytics_version()} has no attribute {name}, which yolo-det "
            f"reads for {why}; install an Ultralytics release yolo-det supports (pyproject.toml names the range)"
        ) from None


def world_size(trainer: Any) -> int:
    """The trainer's number of ranks: ``BaseTrainer.world_size``, which Ultralytics 8.3.0 keeps local to ``train``
    (its DDP workers find it in ``WORLD_SIZE``, checked before anything starts; one process has 1)."""
    if hasattr(trainer, "world_size"):
        return max(int(trainer.world_size or 1), 1)
    return max(int(os.environ.get("WORLD_SIZE") or 1), 1)


def require_methods(cls: type, names: tuple[str, ...], who: str) -> None:
    """Refuse, in one line naming the method and the installed Ultralytics, a trainer class that lacks one of the
    methods ``who`` extends (:class:`MissingContact`)."""
    for name in names:
        if not callable(getattr(cls, name, None)):
            raise MissingContact(
                f"{cls.__name__} of Ultralytics {ultralytics_version()} has no method {name}, which {who} extends; "
                "install an Ultralytics release yolo-det supports (pyproject.toml names the range)"
            )


def _resolve(module: str, attribute: str | None) -> Any:
    mod = importlib.import_module(module)
    return mod if attribute is None else getattr(mod, attribute)


def internal(name: str) -> Any:
    """The Ultralytics internal called ``name`` in :data:`INTERNALS` (imported now).

    Raises:
        AttributeError: ``name`` is not one of them.
        MissingContact: the installed Ultralytics lacks it (where :data:`INTERNALS` and :data:`EARLIER` say).
    """
    try:
        module, attribute = INTERNALS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    for place in ((module, attribute), EARLIER[name]) if name in EARLIER else ((module, attribute),):
        try:
            return _resolve(*place)
        except (ImportError, AttributeError):
            continue
    where = f"{module}.{attribute}" if attribute else module
    raise MissingContact(
        f"Ultralytics {ultralytics_version()} has no {where}, which yolo-det relies on; install an Ultralytics "
        "release yolo-det supports (pyproject.toml names the range)"
    )


def loaded_internal(name: str) -> Any:
    """The Ultralytics module ``name`` of :data:`INTERNALS` if Ultralytics imported it already, else None (nothing
    is imported: an integration module Ultralytics did not load is not in use)."""
    module, attribute = INTERNALS.get(name, ("", ""))
    if not module or attribute is not None:
        raise AttributeError(f"{name!r} is not an Ultralytics module of {__name__}.INTERNALS")
    return sys.modules.get(module)


def task_trainer(task: str) -> type:
    """The trainer class Ultralytics uses for ``task`` (KeyError for a task not in :data:`TASK_TRAINERS`)."""
    module, name = TASK_TRAINERS[task]
    trainer: type = getattr(importlib.import_module(module), name)
    return trainer


def ultralytics_version() -> str:
    """The installed Ultralytics' version (``ultralytics.__version__``)."""
    return str(importlib.import_module("ultralytics").__version__)


#: Ultralytics releases before this one call ``np.trapz`` in validation (``utils.metrics.compute_ap``), and NumPy
#: from this one on no longer has it (deprecated in 2.0, removed in 2.4): such a pair fails at its first validation.
TRAPZ_FIXED_IN, NUMPY_WITHOUT_TRAPZ = (8, 3, 108), (2, 4)


def _release(version: str) -> tuple[int, ...]:
    import re

    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(g) for g in m.groups("0")) if m else (0,)


def numpy_pair_problem(ultralytics: str | None = None, numpy: str | None = None) -> str | None:
    """Why the installed Ultralytics cannot validate with the installed NumPy (one line), or None.

    Versions are read from the installed distributions' metadata (nothing is imported) unless given.
    """
    from importlib import metadata

    try:
        ultralytics = ultralytics or metadata.version("ultralytics")
        numpy = numpy or metadata.version("numpy")
    except metadata.PackageNotFoundError:
        return None
    if _release(ultralytics) >= TRAPZ_FIXED_IN or _release(numpy)[:2] < NUMPY_WITHOUT_TRAPZ:
        return None
    fixed = ".".join(map(str, TRAPZ_FIXED_IN))
    below = ".".join(map(str, NUMPY_WITHOUT_TRAPZ))
    return (
        f"Ultralytics {ultralytics} calls np.trapz in validation, which NumPy {numpy} no longer has (removed in "
        f"{below}): its first validation would fail; pip install 'numpy<{below}', or Ultralytics >= {fixed}"
    )


#: The first Ultralytics release whose ``verify_image_label`` takes ``single_cls`` (earlier: classes as written).
LABEL_SINGLE_CLS_FROM = (8, 3, 92)


@functools.cache
def _label_check() -> tuple[Any, bytes, bool]:
    """Ultralytics' ``verify_image_label``, a blank 10x10 PNG, and whether the release takes ``single_cls``."""
    from PIL import Image

    Image.new("L", (10, 10)).save(buffer := io.BytesIO(), "PNG")
    return internal("verify_image_label"), buffer.getvalue(), _release(ultralytics_version()) >= LABEL_SINGLE_CLS_FROM


def label_verdict(
    label: str, *, classes: float, keypoint: bool, nkpt: int, ndim: int, single_cls: bool
) -> tuple[bool, str | None]:
    """``(found, fault)`` of the label file ``label`` by the installed Ultralytics' ``verify_image_label``: whether the
    file is there, and why Ultralytics drops it with its image as corrupt (its message, one line), or None when it
    keeps it (a missing or empty label file is a background image).

    The image paired with the label is a blank 10x10 PNG in memory: the verdict is the label file's alone and no image
    is opened (Ultralytics' image check rewrites a JPEG it finds truncated, which a check made before anything is
    written must not do). ``single_cls`` is passed from :data:`LABEL_SINGLE_CLS_FROM` on.
    """
    verify, image, takes_single_cls = _label_check()
    args: tuple[Any, ...] = (io.BytesIO(image), label, "", keypoint, classes, nkpt, ndim)
    *_, found, _, corrupt, message = verify((*args, single_cls) if takes_single_cls else args)
    fault = " ".join(str(message).split("corrupt image/label:", 1)[-1].split())[:300] if corrupt else None
    return bool(found), fault


def mosaic_on(dataset: Any) -> bool | None:
    """Whether ``dataset``'s transforms draw mosaics: an Ultralytics ``Mosaic`` with ``p > 0`` among them (None for
    a dataset without transforms).

    Ultralytics builds ``Mosaic(p=hyp.mosaic)`` into a detection dataset's transforms and rebuilds them with
    ``mosaic=0`` when it closes mosaic (``BaseTrainer._close_dataloader_mosaic`` calls the dataset's
    ``close_mosaic``): what the transforms hold is what the next batches are made with.
    """
    transforms = getattr(dataset, "transforms", None)
    if transforms is None:
        return None
    mosaic = internal("Mosaic")
    stack, seen, found = [transforms], set(), []
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mosaic):
            found.append(obj)
        inner = getattr(obj, "transforms", None)  # Compose
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
        stack.append(getattr(obj, "pre_transform", None))  # a mix transform's
    return any(float(m.p) > 0 for m in found)


def run_folder(args: Any) -> Path:
    """The run folder Ultralytics' ``get_save_dir`` gives for the namespace ``args``, creating nothing.

    Ultralytics 8.3's ``get_save_dir`` creates the folder it names (it calls ``increment_path(...,
    mkdir=True)``): a folder computed before training would exist when training starts, and Ultralytics would
    number the run's folder past it. For the call, ``ultralytics.utils.files.increment_path`` is replaced by
    one that never creates (restored afterwards, on error too); 8.4 creates nothing either way.
    """
    files: Any = importlib.import_module("ultralytics.utils.files")
    original = files.increment_path

    def increment_path(path: Any, *args: Any, **kwargs: Any) -> Any:  # (path, exist_ok, sep, mkdir)
        kwargs["mkdir"] = False
        return original(path, *args[:2], **kwargs)

    files.increment_path = increment_path
    try:
        return Path(internal("get_save_dir")(args))
    finally:
        files.increment_path = original


def loss_components(items: Any) -> tuple[list[str] | None, list[Any]]:
    """The parts of a trainer's ``loss_items`` as ``(names or None, values)``.

    Ultralytics 8.3 keeps one tensor with a value per part (box, cls, dfl); 8.4 a tuple or list of parts,
    or a mapping from part name to value. Values are returned as they are (tensors or numbers).
    """
    if isinstance(items, Mapping):
        return [str(k) for k in items], list(items.values())
    if isinstance(items, (list, tuple)):
        return None, list(items)
    if getattr(items, "ndim", 0):  # a tensor (or array) with a value per part
        return None, list(items.reshape(-1))
    return None, [items]


def optimizer_state(optimizer: Any) -> dict[str, Any]:
    """``optimizer.state_dict()`` with the NumPy scalars of its parameter groups as Python numbers.

    Ultralytics 8.3's warmup sets ``lr`` and ``momentum`` to NumPy scalars (``np.interp``'s result), 8.4 to
    Python floats; a state with NumPy scalars does not load with ``torch.load(weights_only=True)``. The
    conversion is exact (a NumPy float64 is a Python float).
    """
    state: dict[str, Any] = optimizer.state_dict()
    for group in state.get("param_groups", ()):
        for key, value in group.items():
            if type(value).__module__ == "numpy" and callable(getattr(value, "item", None)):
                group[key] = value.item()
    return state


@contextmanager
def cpu_ddp_wrapping() -> Iterator[None]:
    """While the block runs, ``torch.nn.parallel.DistributedDataParallel`` drops ``device_ids`` for a CPU module.

    ``BaseTrainer._setup_train`` (8.3 and 8.4) wraps the model with ``device_ids=[self.device.index]``, which
    is ``[None]`` on the CPU, and DDP refuses device ids for a CPU module. The class is put back after the
    block, also when it raises; the wrapper is a subclass, so ``isinstance`` checks still hold.
    """
    import torch.nn.parallel as parallel

    original = parallel.DistributedDataParallel

    class CpuDistributedDataParallel(original):  # type: ignore[misc, valid-type]
        """DDP whose ``device_ids`` are dropped for a module on the CPU."""

        def __init__(self, module: Any, *args: Any, device_ids: Any = None, **kwargs: Any) -> None:
            on_cpu = all(p.device.type == "cpu" for p in module.parameters())
            super().__init__(module, *args, device_ids=None if on_cpu else device_ids, **kwargs)

    parallel.DistributedDataParallel = CpuDistributedDataParallel  # type: ignore[misc]
    try:
        yield
    finally:
        parallel.DistributedDataParallel = original  # type: ignore[misc]


def sees_through(wrapper: Any, inner: Any) -> bool:
    """Whether the installed Ultralytics finds ``inner`` in ``wrapper`` (an ``nn.Module`` holding it as ``.module``)
    where it unwraps a trainer's model (``unwrap_model`` in 8.4; 8.3's ``de_parallel`` knows only DP/DDP)."""
    module: Any = importlib.import_module("ultralytics.utils.torch_utils")
    unwrap = getattr(module, "unwrap_model", None) or getattr(module, "de_parallel", None)
    return callable(unwrap) and unwrap(wrapper) is inner


class _NoCudaDevice:
    """What the validator asks ``get_torch_device_backend("cuda")`` on a CPU rank: an index, CUDA untouched."""

    @staticmethod
    def current_device() -> int:
        return 0


@contextmanager
def validator_on_cpu() -> Iterator[None]:
    """While the block runs, a validator built outside a trainer on a CPU DDP rank runs on the CPU.

    ``BaseValidator.__call__`` (8.4) gives a DDP rank ``torch.device("cuda", current_device())`` for the model of
    the final validation, whatever its device; a CPU rank has no CUDA. Inside the block the validator module's
    ``get_torch_device_backend`` answers an index without initializing CUDA and its ``AutoBackend`` is built on
    the CPU; every rank still takes part in the validator's collectives. Both are put back after the block, also
    when it raises.
    """
    module: Any = importlib.import_module("ultralytics.engine.validator")
    backend, autobackend = module.get_torch_device_backend, module.AutoBackend

    def get_torch_device_backend(device: Any) -> Any:
        return _NoCudaDevice() if str(device).split(":")[0] == "cuda" else backend(device)

    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        return autobackend(*args, **{**kwargs, "device": importlib.import_module("torch").device("cpu")})

    module.get_torch_device_backend, module.AutoBackend = get_torch_device_backend, on_cpu
    try:
        yield
    finally:
        module.get_torch_device_backend, module.AutoBackend = backend, autobackend


def __getattr__(name: str) -> Any:  # ``from yolo_det.core.compat import tasks``
    return internal(name)
