"""The run record: environment fingerprint, weights digest and ``determinism.json``.

``determinism.json`` is written into the run directory. It holds what a reader needs to repeat or
audit the run: the profile and its resolved settings per phase, the seeds, the versions of python,
torch, CUDA, cuDNN, Ultralytics and yolo-det, the GPU, the CPU model and thread counts, the machine
fingerprint of :mod:`yolo_det.core.machine` (``host``), the environment
variables that matter, the git state of the user's project and the installed packages
(:mod:`yolo_det.core.project`), the flags observed when training started, every non-determinism warning seen,
and a SHA-256 digest of the final weights; the integrations add the dataset and model fingerprints and
every Ultralytics argument (see :mod:`yolo_det.integrations.identity`).

The weights digest is defined so that equal weights give equal digests whatever the file's metadata:
the state dict's entries are hashed in sorted key order, each as its key, dtype class and shape
followed by its values; float16, bfloat16 and float32 values are hashed as little-endian float32
(exact for all three), other dtypes as they are.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from .constants import RECORDED_ENV
from .fileio import atomic_write_json
from .machine import machine_fingerprint
from .machine_settings import replaced_env
from .project import run_sources
from .record_schema import RECORD_NAME, RECORD_SCHEMA, RecordError, check_record

if TYPE_CHECKING:
    from .profiles import Profile
    from .state import DeterminismState
    from .warnlog import WarningLog

__all__ = [
    "RECORD_NAME",
    "RECORD_SCHEMA",
    "RecordSource",
    "build_record",
    "checkpoint_digest",
    "checkpoint_weights_digest",
    "cpu_model",
    "environment",
    "recorded_env",
    "load_checkpoint_state",
    "state_dict_digest",
    "write_record",
]


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name: ``/proc/cpuinfo`` on Linux, else what ``platform`` knows (None when nothing)."""
    try:
        if sys.platform.startswith("linux"):
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in {"model name", "Hardware", "cpu model"} and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def recorded_env() -> dict[str, str | None]:
    """The environment variables that can change a run's bits (``RECORDED_ENV``), as they are now."""
    return {k: os.environ.get(k) for k in RECORDED_ENV}


def environment() -> dict[str, Any]:
    """A fingerprint of the software and hardware this process runs on."""
    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "torch_git_version": torch.version.git_version,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "cuda_available": cuda,
        "gpus": gpus,
        "numpy": np.__version__,
        "torchvision": _version("torchvision"),
        "ultralytics": _version("ultralytics"),
        "yolov5": _version("yolov5"),
        "yolo_det": _version("yolo-det"),
        "opencv": _version("opencv-python") or _version("opencv-python-headless"),
        "pillow": _version("pillow"),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "env": recorded_env(),
        "argv": list(sys.argv),
        "host": machine_fingerprint(),
        "replaced_env": replaced_env(),
    }


#: dtypes NumPy has (others, such as float8, complex32, bits8 and float4, are digested as their raw bytes).
_NUMPY_DTYPES = {
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
}


def _tensor_bytes(t: torch.Tensor) -> tuple[str, bytes]:
    t = t.detach().to("cpu")
    if t.dtype not in _NUMPY_DTYPES:  # little-endian raw bytes, as the checkpoint stores them
        return str(t.dtype), t.contiguous().view(torch.uint8).numpy().tobytes()
    if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return "float", t.float().contiguous().numpy().astype("<f4", copy=False).tobytes()
    if t.is_complex():
        return str(t.dtype), t.contiguous().numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
    if t.dtype == torch.bool:
        return "bool", t.contiguous().numpy().astype(np.uint8).tobytes()
    arr = t.contiguous().numpy()
    return str(t.dtype), arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def state_dict_digest(state: Mapping[str, Any] | torch.nn.Module) -> str:
    """SHA-256 hex digest of a state dict (or a module's), as defined in this module's docstring."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        if not isinstance(value, torch.Tensor):
            continue
        kind, data = _tensor_bytes(value)
        h.update(f"{key}\0{kind}\0{tuple(value.shape)}\0".encode())
        h.update(data)
    return h.hexdigest()


def checkpoint_weights_digest(state: Mapping[str, Any] | torch.nn.Module) -> str:
    """The weights digest of a model (or state dict) as an Ultralytics checkpoint stores it: its floating tensors
    rounded to float16, as the trainer saves its EMA. For a trainer's final EMA it equals :func:`checkpoint_digest`
    of the ``last.pt`` the run leaves (``weights digest`` of ``yolo-det train``, ``weights.sha256`` of the record)."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    return state_dict_digest(
        {k: v.detach().half() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in state.items()}
    )


def load_checkpoint_state(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Return the model state dict stored in a checkpoint file, read without running anything it names.

    Accepts an Ultralytics or YOLOv5 checkpoint (a dict with ``model``/``ema`` holding a module), a
    plain state dict, or a pickled module. The file is read by
    :func:`yolo_det.core.untrusted.safeload.checkpoint_state_dict`: no class or function the pickle names is
    imported or called, so a model made of the user's own block classes reads as well as an Ultralytics one.

    Raises:
        ModelError: The file is missing, is not a ``torch.save`` archive, or holds no model weights.
    """
    from .untrusted.safeload import checkpoint_state_dict

    return checkpoint_state_dict(path)


def checkpoint_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 digest of the weights in a checkpoint file (see :func:`state_dict_digest`)."""
    return state_dict_digest(load_checkpoint_state(path))


def write_record(directory: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Write ``record`` as ``determinism.json`` in ``directory`` (atomically) and return its path.

    Raises:
        RecordError: A field of the record has the wrong type for :mod:`yolo_det.core.record_schema`.
    """
    content = {**record, "schema": RECORD_SCHEMA}
    problem = check_record(content)
    if problem:
        raise RecordError(f"refusing to write a malformed {RECORD_NAME}: {problem}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(directory / RECORD_NAME, content)


@runtime_checkable
class RecordSource(Protocol):
    """What :func:`build_record` reads of a run's session (``DeterminismSession`` is one).

    Attributes:
        profile: The run's profile.
        baseline: The process state before the run began (None once restored or never taken).
        warnings: The non-determinism warnings seen.
        events: The phase events, in order (``{"event": "enter" | "exit", ...}`` and others).
        train_env: The recorded environment variables while it trained (None when it did not train).
        train_machine: The machine fingerprint while it trained (None when it did not train).
        train_sources: The user's project and packages as training started (None when it did not train).
    """

    @property
    def profile(self) -> Profile: ...
    @property
    def baseline(self) -> DeterminismState | None: ...
    @property
    def warnings(self) -> WarningLog: ...
    @property
    def events(self) -> list[dict[str, Any]]: ...
    @property
    def train_env(self) -> Mapping[str, str | None] | None: ...
    @property
    def train_machine(self) -> Mapping[str, Any] | None: ...
    @property
    def train_sources(self) -> Mapping[str, Any] | None: ...
    def seeds(self) -> dict[str, Any]:
        """The seeds of the run (``seed``, the per-rank seed, ...)."""
        ...

    def swaps(self) -> list[dict[str, str]]:
        """The layer swaps made."""
        ...

    def routed_calls(self) -> dict[str, int]:
        """How often each intercepted call was routed."""
        ...

    def backward_toggles(self) -> int:
        """How often deterministic algorithms were switched off for a backward pass."""
        ...


def build_record(
    session: RecordSource,
    *,
    framework: str,
    status: str,
    state_at_train_start: Mapping[str, Any] | None,
    weights: Mapping[str, Any],
    run: Mapping[str, Any],
    seeds: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The content of ``determinism.json``: one schema for every integration.

    Args:
        session: The run's session (a ``DeterminismSession``; what is read of it: :class:`RecordSource`).
        framework: ``ultralytics`` or ``yolov5``.
        status: ``completed``, ``failed``, ``interrupted`` or ``terminated`` (see
            :func:`~yolo_det.core.endings.describe_ending`, whose other keys go in ``extra``).
        state_at_train_start: The process state when training started (``DeterminismState.to_dict()``).
        weights: What is known of the weights (``file``, ``sha256``, ...).
        run: The framework's run arguments worth keeping.
        seeds: The seeds to record (default: ``session.seeds()``).
        **extra: Framework-specific keys, added after the shared ones.
    """
    record: dict[str, Any] = {
        "status": status,
        "framework": framework,
        "profile": session.profile.to_dict(),
        "seeds": dict(session.seeds() if seeds is None else seeds),
        "environment": _environment_of(session),
        "state_before": session.baseline.to_dict() if session.baseline else None,
        "state_at_train_start": state_at_train_start,
        "backward_toggles": session.backward_toggles(),
        "swaps": session.swaps(),
        "routed_calls": session.routed_calls(),
        "nondeterminism_warnings": session.warnings.entries(),
        "weights": dict(weights),
        "run": dict(run),
        "phase_events": [e for e in session.events if e["event"] in {"enter", "exit"}],
        **(session.train_sources or run_sources()),
    }
    record.update(extra)
    return record


def _environment_of(session: RecordSource) -> dict[str, Any]:
    """:func:`environment`, with the environment variables of the session's training when it trained."""
    env = environment()
    train_env = session.train_env
    if train_env is not None:
        env["env"] = dict(train_env)
    train_machine = session.train_machine
    if train_machine is not None:  # the threads and branches in force while it trained
        env["host"] = dict(train_machine)
    return env
