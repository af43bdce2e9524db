"""The record in the user's experiment tracker: the run Ultralytics' own MLflow, W&B or TensorBoard integration opened.

When the record of a run's ending is final (an observer of :mod:`.records`' one writer), :func:`publish` hands it
to each tracker whose Ultralytics integration is in use for this trainer, with the tracker's own API on the run
that integration opened, and logs its key fields (:func:`key_fields`: the profile, the weights digest, whether
the same bits are promised and why not, the machine class):

- **MLflow**: ``determinism.json`` as an artifact of the active run, the key fields as tags ``yolo_det.<field>``
  (tags, not parameters: Ultralytics logs the run's arguments as parameters, and MLflow refuses a parameter
  logged twice with another value).
- **Weights & Biases**: ``determinism.json`` in the run's files (``wandb.save`` with policy ``now``: uploaded
  as the run syncs, offline runs by ``wandb sync``), the key fields in the run's summary as ``yolo_det.<field>``
  (the summary, not the config: Ultralytics puts the run's arguments in the config).
- **TensorBoard**: the key fields as a text summary ``yolo_det/determinism`` (a table) through Ultralytics'
  ``SummaryWriter``; ``determinism.json`` already lies in the log folder (the run folder).

A tracker is in use when Ultralytics' integration module for it is imported and its callback registered on this
trainer (Ultralytics registers those the user's ``yolo settings`` turn on), and its run is open:
``mlflow.active_run()``, ``wandb.run``, or the ``WRITER`` global. Ultralytics closes them in its own
``on_train_end`` and ``teardown``, which run after yolo-det's (the plugin's callbacks are in the dict the trainer
is built with, ``BaseTrainer.__init__`` appends the integrations'; W&B's ``finish`` is appended later still, at
``on_pretrain_routine_end``). Nothing is imported that Ultralytics did not import, nothing
goes anywhere the user did not configure; an integration's global missing is one line naming it and the release,
and a tracker that fails is one line: the run and its record stand.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...core.compat import contact, loaded_internal, ultralytics_version
from ...core.endings import one_line
from ...core.machine import machine_view

__all__ = ["READS", "bitwise_promise", "key_fields", "machine_class", "publish"]

#: ``integration (a name of core.compat.INTERNALS) -> ((global, what yolo-det reads it for), ...)``.
READS: dict[str, tuple[tuple[str, str], ...]] = {
    "mlflow_integration": (
        ("on_train_end", "whether Ultralytics' MLflow integration is registered on the trainer"),
        ("mlflow", "the mlflow package Ultralytics logs with (its active run)"),
    ),
    "wandb_integration": (
        ("on_train_end", "whether Ultralytics' W&B integration is registered on the trainer"),
        ("wb", "the wandb package Ultralytics logs with (its open run)"),
    ),
    "tensorboard_integration": (
        ("on_pretrain_routine_start", "whether Ultralytics' TensorBoard integration is registered on the trainer"),
        ("WRITER", "the SummaryWriter Ultralytics writes the run's TensorBoard log with"),
    ),
}

#: The longest value of a key field (MLflow keeps a tag value up to 8,000 characters).
_MAX_VALUE = 1000


def _get(record: Mapping[str, Any], *keys: str) -> Any:
    value: Any = record
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def bitwise_promise(record: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether yolo-det promises the record's weights bit for bit to the same command on the same machine class,
    and why not (one reason per line): a run that did not complete, the train phase without deterministic
    algorithms or with its backward pass let off, a guarantee that did not hold, a non-determinism warning, a
    resume that cannot be bitwise, ranks that disagree."""
    reasons: list[str] = []
    status = record.get("status")
    if status != "completed":
        reasons.append(f"the run did not complete (status {status})")
    train = _get(record, "profile", "train") or {}
    if train.get("deterministic_algorithms") == "off":
        reasons.append("the train phase runs without deterministic algorithms (deterministic_algorithms: off)")
    if train.get("backward") == "disable":
        reasons.append("the backward pass runs without deterministic algorithms (backward: disable)")
    for name, section in sorted((record.get("guarantees") or {}).items()):
        if isinstance(section, Mapping) and section.get("in_force") is False:
            reasons.append(f"the guarantee '{name}' did not hold")
    warned = record.get("nondeterminism_warnings") or []
    if warned:
        reasons.append(f"{len(warned)} non-determinism warning(s) during the run")
    resume = record.get("resume")
    if isinstance(resume, Mapping) and resume.get("bitwise_expected") is False:
        reasons.extend(f"resume: {r}" for r in resume.get("reasons") or ["not bitwise"])
    if record.get("rank_problems"):
        reasons.append("the ranks disagree (rank_problems)")
    return not reasons, reasons


def machine_class(record: Mapping[str, Any]) -> str:
    """The class of machine whose bits the record's weights are: the GPU model, its SM count and CUDA for a run on
    CUDA; else the CPU architecture, vendor, ATen capability and intra-op threads; torch's version in both."""
    host = machine_view(record.get("environment") or {})
    device = str(_get(record, "run", "device") or "").strip().lower()
    gpu = host.get("gpu")
    if isinstance(gpu, Mapping) and gpu and device not in {"cpu", "mps"}:
        where = f"{gpu.get('name')}, {gpu.get('sm_count')} SMs, CUDA {gpu.get('cuda')}"
    else:
        where = (
            f"{host.get('arch')} {host.get('cpu_vendor') or ''} {host.get('cpu_capability')}".replace("  ", " ")
            + f", {host.get('intra_op_threads')} threads"
        )
    return f"{where}, torch {host.get('torch')}"


def key_fields(record: Mapping[str, Any]) -> dict[str, str]:
    """The record's fields a tracker shows beside the run, as strings: ``profile``, ``weights_sha256``,
    ``bitwise_expected`` (``true``/``false``), ``bitwise_why_not`` (empty when promised), ``machine_class`` and
    ``status``."""
    promised, reasons = bitwise_promise(record)
    fields = {
        "profile": str(_get(record, "profile", "name")),
        "weights_sha256": str(_get(record, "weights", "sha256") or "none"),
        "bitwise_expected": "true" if promised else "false",
        "bitwise_why_not": "; ".join(reasons),
        "machine_class": machine_class(record),
        "status": str(record.get("status")),
    }
    return {k: v if len(v) <= _MAX_VALUE else v[: _MAX_VALUE - 3] + "..." for k, v in fields.items()}


def _say(line: str) -> None:
    print(f"yolo-det: {line}", file=sys.stderr, flush=True)


def _global(module: Any, name: str, tracker: str) -> Any:
    """``module.name``, a global of an Ultralytics integration that yolo-det reads (:data:`READS`)."""
    why = dict(READS[tracker])[name]
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(
            f"{module.__name__} of Ultralytics {ultralytics_version()} has no {name}, which yolo-det reads for {why}"
        ) from None


def _registered(trainer: Any, module: Any, tracker: str, event: str) -> bool:
    """Whether the integration ``module`` is registered on ``trainer`` (its ``event`` callback is)."""
    callbacks = contact(trainer, "callbacks", "the integrations registered on the trainer")
    return _global(module, event, tracker) in callbacks.get(event, [])


def _mlflow(trainer: Any, path: Path, fields: Mapping[str, str]) -> bool:
    module = loaded_internal("mlflow_integration")
    if module is None or not _registered(trainer, module, "mlflow_integration", "on_train_end"):
        return False
    mlflow = _global(module, "mlflow", "mlflow_integration")
    if mlflow is None or mlflow.active_run() is None:
        return False  # installed but no run open (Ultralytics could not start one, or it is off under a test)
    mlflow.log_artifact(str(path))
    mlflow.set_tags({f"yolo_det.{k}": v for k, v in fields.items()})
    return True


def _wandb(trainer: Any, path: Path, fields: Mapping[str, str]) -> bool:
    module = loaded_internal("wandb_integration")
    if module is None or not _registered(trainer, module, "wandb_integration", "on_train_end"):
        return False
    wb = _global(module, "wb", "wandb_integration")
    if wb is None or wb.run is None:
        return False  # installed but no run open (it is off under a test, or the run ended)
    # escaped: a folder named with [ ] * ? is the literal folder, never a pattern
    if not wb.save(glob.escape(str(path)), base_path=glob.escape(str(path.parent)), policy="now"):
        raise RuntimeError(f"wandb.save found no file at {path}")
    wb.run.summary.update({f"yolo_det.{k}": v for k, v in fields.items()})
    return True


def _tensorboard(trainer: Any, path: Path, fields: Mapping[str, str], step: int) -> bool:
    module = loaded_internal("tensorboard_integration")
    if module is None or not _registered(trainer, module, "tensorboard_integration", "on_pretrain_routine_start"):
        return False
    writer = _global(module, "WRITER", "tensorboard_integration")
    if writer is None:
        return False
    rows = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in fields.items())
    writer.add_text("yolo_det/determinism", f"| field | value |\n|---|---|\n{rows}\n\nrecord: `{path}`", step)
    writer.flush()
    return True


#: ``tracker -> writer``: each takes ``(trainer, record path, key fields, step)`` and says whether it wrote.
TRACKERS: dict[str, Callable[[Any, Path, Mapping[str, str], int], bool]] = {
    "MLflow": lambda trainer, path, fields, step: _mlflow(trainer, path, fields),
    "Weights & Biases": lambda trainer, path, fields, step: _wandb(trainer, path, fields),
    "TensorBoard": _tensorboard,
}


def publish(trainer: Any, path: Path, record: Mapping[str, Any]) -> list[str]:
    """Attach the final record at ``path`` to every tracker Ultralytics' integrations run for ``trainer`` (see the
    module docstring) and return their names; a tracker that fails is one line, never raised."""
    fields = key_fields(record)
    step = int(record.get("epochs_completed") or 0)
    done = []
    for name, write in TRACKERS.items():
        try:
            if write(trainer, Path(path), fields, step):
                done.append(name)
        except Exception as e:  # the run and its record stand; the tracker misses them, and the user is told
            _say(f"could not add {Path(path).name} to {name}: {one_line(e)}")
    return done
