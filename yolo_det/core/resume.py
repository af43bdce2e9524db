"""Resume state: what an interrupted training needs, beyond its checkpoint, to continue bit for bit.

A training checkpoint (Ultralytics' ``last.pt``, YOLOv5's ``last.pt``) holds the epoch, the EMA and the
optimizer, but rounded to float16, and no RNG or data-order state. A run resumed from it continues from
different numbers than the run that was interrupted. yolo-det writes, at every checkpoint save, a *resume
state* file next to the checkpoint (``weights/yolo-det-resume.last.pt``; ``...last.rank1.pt`` for rank 1
under DDP) holding:

- the RNG states: python ``random``, numpy's global RNG, torch CPU and every CUDA device;
- the live model and the EMA in full precision, the optimizer state in full precision, the gradients
  accumulated but not yet applied, and the step bookkeeping (last optimizer step, accumulation);
- the AMP scaler, the epoch, the data-loader state (the shuffle generator, the mosaic flag);
- the checkpoint it belongs to (``epoch`` and EMA ``updates``), so a stale file is never used.

The file holds tensors and plain Python values only: it loads with ``torch.load(weights_only=True)``.
The checkpoint itself is not changed, so it still loads in plain Ultralytics/YOLOv5 without yolo-det.

Reading a checkpoint's arguments (what resuming will train on) uses :func:`read_checkpoint`, which never
imports or runs code named in the file (it reads it with :func:`yolo_det.core.untrusted.safeload.read_checkpoint`:
every class the pickle names is an inert placeholder).
"""

from __future__ import annotations

import argparse
import os
import random
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ModelError
from .fileio import atomic_file, file_sha256
from .plain import plain_value
from .untrusted.safeload import Inert
from .untrusted.safeload import read_checkpoint as safe_read

__all__ = [
    "FORMAT",
    "CheckpointInfo",
    "file_sha256",
    "get_rng_state",
    "is_resume",
    "load_state",
    "read_checkpoint",
    "resume_arguments",
    "resume_folder",
    "resume_save_dir",
    "run_folder_of",
    "host_copy",
    "save_state",
    "StateWriter",
    "set_rng_state",
    "state_path",
    "previous_state_path",
]

#: Format tag stored in every resume-state file.
FORMAT = "yolo-det/resume/1"
_PREFIX = "yolo-det-resume"


# ---------------------------------------------------------------------------------------------------------
# reading a checkpoint without running its code


@dataclass
class CheckpointInfo:
    """What :func:`read_checkpoint` found in a training checkpoint.

    Attributes:
        path: The checkpoint file.
        epoch: The last completed epoch (0-based); -1 in a finished (stripped) checkpoint.
        updates: The EMA update count (Ultralytics) or None.
        train_args: The training arguments stored in it (``train_args`` of Ultralytics, ``opt`` of YOLOv5).
        has_optimizer: Whether the optimizer state is still in it.
        sha256: SHA-256 of the file's bytes.
    """

    path: Path
    epoch: int
    updates: int | None
    train_args: dict[str, Any] = field(default_factory=dict)
    has_optimizer: bool = False
    sha256: str = ""

    @property
    def resumable(self) -> bool:
        """Whether the framework would resume from it (an unfinished training: epoch >= 0 and an optimizer)."""
        return self.epoch >= 0 and self.has_optimizer


def _inert_text(value: Any) -> str:
    if isinstance(value, Inert):  # a pathlib.Path and the like: keep its text
        args = value.__dict__.get("inert_args", ())
        return "/".join(str(a) for a in args) if args and all(isinstance(a, str) for a in args) else repr(value)
    return str(value)


def _plain(value: Any) -> Any:
    return plain_value(value, _inert_text)


def read_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read the epoch, the arguments and the resumability of a training checkpoint, safely.

    Nothing named in the file is imported or run (see the module docstring).

    Raises:
        ModelError: The file is missing or is not a training checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"checkpoint '{path}' does not exist")
    obj = safe_read(path)  # imports and calls nothing the file names
    if not isinstance(obj, Mapping) or "epoch" not in obj:
        raise ModelError(f"'{path}' is not a training checkpoint (no 'epoch' in it); pass the last.pt of a run")
    args = obj.get("train_args")
    if args is None:
        args = obj.get("opt")  # YOLOv5
    if isinstance(args, Inert):
        state = args.state
        args = state if isinstance(state, Mapping) else {}
    elif isinstance(args, (argparse.Namespace, types.SimpleNamespace)):  # read as values by the allow-list
        args = vars(args)
    epoch = obj.get("epoch")
    updates = obj.get("updates")
    return CheckpointInfo(
        path=path,
        epoch=int(epoch) if isinstance(epoch, int) else -1,
        updates=int(updates) if isinstance(updates, int) else None,
        train_args=_plain(args) if isinstance(args, Mapping) else {},
        has_optimizer=obj.get("optimizer") is not None,
        sha256=file_sha256(path),
    )


# ---------------------------------------------------------------------------------------------------------
# RNG state


def get_rng_state() -> dict[str, Any]:
    """The state of python's ``random``, numpy's global RNG, torch's CPU RNG and every CUDA device's RNG."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": [version, list(internal), gauss],
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [s.clone() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`get_rng_state` returned (CUDA devices beyond those saved are left alone)."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            n["keys"].numpy().astype(np.uint32),
            int(n["pos"]),
            int(n["has_gauss"]),
            float(n["cached_gaussian"]),
        )
    )
    torch.set_rng_state(state["torch"])
    cuda = list(state.get("cuda") or [])
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


# ---------------------------------------------------------------------------------------------------------
# the state file


def is_state_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a resume state written by :func:`save_state` (not a weights checkpoint)."""
    return Path(path).name.startswith(f"{_PREFIX}.")


def state_path(checkpoint: str | os.PathLike[str], rank: int = 0) -> Path:
    """Where the resume state of ``checkpoint`` lives for ``rank`` (0 for a single process).

    The name never starts with ``last`` (Ultralytics' ``resume=True`` picks the newest ``last*.pt``).
    """
    checkpoint = Path(checkpoint)
    suffix = f".rank{rank}" if rank > 0 else ""
    return checkpoint.with_name(f"{_PREFIX}.{checkpoint.stem}{suffix}.pt")


def previous_state_path(checkpoint: str | os.PathLike[str], rank: int = 0) -> Path:
    """Where the resume state of the checkpoint before the current one is kept while a new pair is written."""
    path = state_path(checkpoint, rank)
    return path.with_name(f"{path.stem}.prev.pt")


def save_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write a resume state atomically (tensors and plain values only).

    It is serialised straight into a temporary file in the same folder, which then replaces ``path``: a
    reader sees the old file or the new one, never half of one. There is no fsync (Ultralytics does not sync
    its checkpoints either); a file torn by a power loss fails to load and is reported, never used.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, sync=False) as f:
        torch.save({"format": FORMAT, **state}, f)
    return path


def host_copy(obj: Any) -> Any:
    """``obj`` with every tensor in it (nested in dicts, lists, tuples) copied to the CPU, others as they are."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu" and t.dtype in NUMPY_COPY_DTYPES:
            return torch.from_numpy(t.numpy().copy())  # one memcpy, no intra-op thread pool
        return t.to("cpu", copy=True)
    if isinstance(obj, Mapping):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj) if isinstance(obj, list) else tuple(host_copy(v) for v in obj)
    return obj


#: The dtypes a CPU tensor is copied through NumPy for (one memcpy, no intra-op thread pool); also used by
#: the verify recorder.
NUMPY_COPY_DTYPES = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


class StateWriter:
    """Writes resume states on a background thread.

    :meth:`submit` hands over a state whose tensors may be live (the model's parameters, the optimizer's
    moments). The thread first copies them (one memcpy each), then serialises the copy and writes it
    atomically. The caller guarantees that nobody changes the live tensors until :meth:`wait_copied`
    returns (the integrations call it in an optimizer step pre-hook, before the first update after a save),
    so the training waits at most for the copy, which overlaps the first forward and backward passes.
    :meth:`wait` blocks until every state submitted is on disk and raises the first write error;
    :meth:`close` waits and stops the thread.
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yolo-det-resume")
        self._pending: list[Any] = []
        self._copied: list[Any] = []
        self._early: list[Any] = []
        self.seconds_writing = 0.0
        self.seconds_waited = 0.0

    @property
    def busy(self) -> bool:
        """Whether a submitted state is not written yet."""
        return any(not f.done() for f in self._pending)

    def submit(self, path: str | os.PathLike[str], state: Mapping[str, Any], *, early: tuple[str, ...] = ()) -> None:
        """Write ``state`` to ``path`` in the background (after any earlier state).

        The entries named in ``early`` are copied first; :meth:`wait_early` waits for them only.
        """
        import threading

        first, copied = threading.Event(), threading.Event()
        if self._pool is None:
            self._write(path, state, early, first, copied)
            return
        self._early.append(first)
        self._copied.append(copied)
        self._pending.append(self._pool.submit(self._write, path, state, early, first, copied))

    def _write(
        self, path: str | os.PathLike[str], state: Mapping[str, Any], early: tuple[str, ...], first: Any, copied: Any
    ) -> None:
        import time

        t0 = time.perf_counter()
        try:
            try:
                snapshot = {k: host_copy(state[k]) for k in early if k in state}
            finally:
                first.set()
            snapshot.update({k: host_copy(v) for k, v in state.items() if k not in snapshot})
        finally:
            copied.set()
        save_state(path, {k: snapshot[k] for k in state})
        self.seconds_writing += time.perf_counter() - t0

    def wait_early(self) -> None:
        """Block until the ``early`` entries of every submitted state have been copied."""
        events, self._early = self._early, []
        for event in events:
            event.wait()

    def wait_copied(self) -> None:
        """Block until every submitted state has been copied (the live tensors may change after that)."""
        import time

        events, self._copied = self._copied, []
        t0 = time.perf_counter()
        for event in events:
            event.wait()
        if events:
            self.seconds_waited += time.perf_counter() - t0

    def wait(self) -> None:
        """Block until every submitted state is written; raise the first error."""
        import time

        self.wait_copied()
        pending, self._pending = self._pending, []
        t0 = time.perf_counter()
        for future in pending:
            future.result()
        if pending:
            self.seconds_waited += time.perf_counter() - t0

    def close(self) -> None:
        """Wait for the writes, then stop the thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a resume state written by :func:`save_state` (``weights_only``: no code runs).

    Raises:
        ModelError: The file is not a yolo-det resume state.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(
            f"'{path}' is not a yolo-det resume state ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ModelError(f"'{path}' is not a yolo-det resume state of format {FORMAT}")
    return state


# ---------------------------------------------------------------------------------------------------------
# command-line resume

#: Arguments Ultralytics lets a resumed run change (``BaseTrainer.check_resume``, Ultralytics 8.4); it
#: takes every other argument from the checkpoint, except ``data`` when given.
RESUME_ALLOWED = frozenset(
    {
        "imgsz",
        "batch",
        "device",
        "close_mosaic",
        "augmentations",
        "save_period",
        "workers",
        "cache",
        "patience",
        "time",
        "freeze",
        "val",
        "plots",
        "channels_last",
        "distill_model",
        "save_dir",
    }
)
_RESUME_PASSED = frozenset({"model", "data", "mode", "resume", "pretrained"})


def is_resume(args: Mapping[str, Any]) -> bool:
    """Whether Ultralytics arguments ask to resume (``resume=True`` or ``resume=path``)."""
    value = args.get("resume")
    return value is True or (isinstance(value, str) and value.strip() not in {"", "False", "false"})


def resume_arguments(args: Mapping[str, Any]) -> tuple[dict[str, Any], CheckpointInfo, list[str]]:
    """The Ultralytics arguments of a resumed run, the checkpoint, and the overrides resuming ignores.

    No demo default is added: the checkpoint's own arguments are used, as Ultralytics does, with only the
    keys given by the user passed on. ``resume=path`` resumes ``path``; ``resume=True`` resumes ``model=``.

    Raises:
        ConfigError: No checkpoint named, or it cannot be resumed (a finished, stripped checkpoint).
        ModelError: The checkpoint is missing or not a training checkpoint.
    """
    from .errors import ConfigError

    out = dict(args)
    resume = out.get("resume")
    if isinstance(resume, str):
        ckpt = resume
    elif isinstance(out.get("model"), str):
        ckpt = out["model"]
    else:
        raise ConfigError(
            "resume=True needs the checkpoint: add model=path/to/weights/last.pt "
            "(or write resume=path/to/weights/last.pt)"
        )
    info = read_checkpoint(Path(ckpt).expanduser())
    if not info.resumable:
        raise ConfigError(
            f"'{ckpt}' cannot be resumed: its training finished (epoch {info.epoch}, optimizer "
            f"{'kept' if info.has_optimizer else 'stripped'}); start a new run with "
            f"model={ckpt} and your data="
        )
    out["model"] = str(info.path)
    if isinstance(resume, str):
        out["resume"] = str(info.path)
    ignored = [
        k
        for k, v in args.items()
        if k not in RESUME_ALLOWED and k not in _RESUME_PASSED and v != info.train_args.get(k)
    ]
    return out, info, ignored


def find_state(
    checkpoint: str | os.PathLike[str],
    *,
    rank: int,
    start_epoch: int,
    ema: Any,
    updates: Any,
    world_size: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """Look up and check the resume state of ``checkpoint`` for a run resuming at ``start_epoch``.

    Args:
        checkpoint: The checkpoint the run resumes from.
        rank: The process's rank (0 for a single process).
        start_epoch: The first epoch the resumed run trains.
        ema: The EMA module loaded from the checkpoint (for its weights digest), or ``None``.
        updates: The EMA update count loaded from the checkpoint (a state of another save is refused).
        world_size: The number of ranks of the resumed run (a state written by a run of another number of
            ranks is refused: the data order and the gradient sums differ). ``None``: not checked.

    Returns:
        ``(info, state, problem)``: the record's resume data, the state to restore (``None`` when it is
        missing or belongs to another save) and why it cannot be used.
    """
    ckpt = Path(checkpoint)
    info: dict[str, Any] = {
        "resumed": True,
        "checkpoint": str(ckpt),
        "epoch": start_epoch,
        "state_found": False,
        "state_file": None,
    }
    try:
        info["checkpoint_sha256"] = file_sha256(ckpt)
    except OSError:
        info["checkpoint_sha256"] = None
    if isinstance(ema, torch.nn.Module):
        from .record import state_dict_digest

        info["checkpoint_weights_sha256"] = state_dict_digest(ema)
    path = state_path(ckpt, rank)
    candidates = [p for p in (path, previous_state_path(ckpt, rank)) if p.is_file()]
    if not candidates:
        why = f"{path.name} not found next to it: a checkpoint from a run without yolo-det, or the file was removed"
        info["problem"] = why
        return info, None, why
    why = ""
    for path in candidates:  # the newest first; the previous one matches a checkpoint whose successor was not written
        try:
            state = load_state(path)
        except Exception as e:
            why = str(e)
            continue
        want = state.get("updates") if updates is None else updates
        if int(state.get("epoch", -2)) == start_epoch - 1 and state.get("updates") == want:
            break
        why = (
            f"{path.name} belongs to epoch {state.get('epoch')} (updates {state.get('updates')}), "
            f"the checkpoint to epoch {start_epoch - 1} (updates {want})"
        )
    else:
        info["problem"] = why
        return info, None, why
    saved_ranks = state.get("world_size")
    if world_size is not None and saved_ranks is not None and int(saved_ranks) != max(int(world_size), 1):
        why = (
            f"{path.name} was written by a run of {saved_ranks} rank(s), this run has {max(int(world_size), 1)}; "
            "resume with as many ranks to continue bit for bit"
        )
        info["problem"] = why
        return info, None, why
    info.update(state_found=True, state_file=str(path))
    return info, state, None


# ---------------------------------------------------------------------------------------------------------
# the folder a resumed run writes into


def run_folder_of(checkpoint: str | os.PathLike[str]) -> Path | None:
    """The run folder holding ``checkpoint`` (``RUN`` for ``RUN/weights/last.pt``); None when the file is not
    in a ``weights`` folder."""
    path = Path(checkpoint).expanduser().absolute()
    return path.parent.parent if path.parent.name == "weights" else None


def _same_folder(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def resume_folder(
    checkpoint: str | os.PathLike[str], *, stored: str | None = None, requested: str | os.PathLike[str] | None = None
) -> Path:
    """The folder a run resumed from ``checkpoint`` writes into: the run folder that holds the checkpoint.

    Ultralytics writes a resumed run into the ``save_dir`` stored in the checkpoint, which for a copied,
    moved or renamed run folder is another run's folder. yolo-det passes the folder returned here as
    ``save_dir`` instead, so a resumed run never writes outside the folder that holds its checkpoint.

    Args:
        checkpoint: The checkpoint being resumed.
        stored: The ``save_dir`` stored in the checkpoint (for the messages).
        requested: A ``save_dir`` the caller asked for; it must be that same folder.

    Raises:
        ConfigError: The checkpoint is not in a run's ``weights`` folder, ``requested`` names another folder,
            or the folder holds a completed run (whose files resuming would overwrite).
    """
    import json

    from .errors import ConfigError
    from .record import RECORD_NAME

    ckpt = Path(checkpoint).expanduser().absolute()
    folder = run_folder_of(ckpt)
    where = f"'{stored}'" if stored else "the folder stored in it"
    if folder is None:
        raise ConfigError(
            f"cannot resume '{ckpt}': it is not in a run's weights/ folder, and the run would write into "
            f"{where}; copy it to NEW_RUN/weights/last.pt and resume that"
        )
    if requested not in (None, "") and not _same_folder(requested, folder):
        raise ConfigError(
            f"cannot resume '{ckpt}' into '{requested}': a resumed run writes into the folder that holds "
            f"its checkpoint ('{folder}'); copy the run folder to '{requested}' and resume the copy"
        )
    try:
        record = json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("status") == "completed":
        raise ConfigError(
            f"cannot resume '{ckpt}': '{folder}' holds a completed run whose files resuming would "
            "overwrite; copy the checkpoint to NEW_RUN/weights/last.pt and resume that"
        )
    return folder


def resume_save_dir(checkpoint: str | os.PathLike[str], requested: str | os.PathLike[str] | None = None) -> str:
    """The ``save_dir`` to pass to a run resumed from ``checkpoint`` (see :func:`resume_folder`)."""
    stored = None
    try:
        stored = read_checkpoint(Path(checkpoint).expanduser()).train_args.get("save_dir")
    except Exception:  # the framework reports an unreadable checkpoint its own way
        stored = None
    return str(resume_folder(checkpoint, stored=stored if isinstance(stored, str) else None, requested=requested))
