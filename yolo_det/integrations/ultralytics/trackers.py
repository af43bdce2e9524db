"""The record in the user's experiment tracker: the run Ultralytics' own tracker integration opened.

When the record of a run's ending is final (an observer of :mod:`.records`' one writer), :func:`publish` hands it
to each tracker whose Ultralytics integration is in use for this trainer, with the tracker's own API on the run
that integration opened, and logs its key fields (:func:`key_fields`: the profile, the weights digest, whether
the same bits are promised and why not, the machine class). One entry of :data:`TRACKERS` per tracker:

- **MLflow** (``mlflow.active_run()``): ``determinism.json`` as an artifact, the key fields as tags
  ``yolo_det.<field>`` (tags, not parameters: Ultralytics logs the run's arguments as parameters, and MLflow
  refuses a parameter logged twice with another value).
- **Weights & Biases** (``wandb.run``): ``determinism.json`` in the run's files (policy ``now``: uploaded as the
  run syncs, offline runs by ``wandb sync``), the key fields in the run's summary (Ultralytics fills the config).
- **TensorBoard** (the ``WRITER`` global): the key fields as a text summary ``yolo_det/determinism`` (a table);
  ``determinism.json`` already lies in the log folder (the run folder).
- **Comet** (``comet_ml.get_running_experiment()``): ``determinism.json`` as an asset, the key fields as
  "others" ``yolo_det.<field>`` (Ultralytics logs the run's arguments as parameters).
- **ClearML** (``Task.current_task()``): ``determinism.json`` as an artifact (uploaded to the task's output
  destination before the training goes on), the key fields as user properties ``yolo_det.<field>`` (Ultralytics
  connects the arguments as ``General``).
- **DVC** (the dvclive ``live`` global): ``determinism.json`` copied into ``dvclive/artifacts`` (kept with the
  experiment in git, not in the DVC cache; dvclive logs artifacts only in a DVC repository), the key fields under
  ``yolo_det`` in the parameters.

A tracker is in use when Ultralytics' integration module for it is imported and its callback registered on this
trainer (Ultralytics registers those the user's ``yolo settings`` turn on), and its run is open. Ultralytics
closes the runs in its own ``on_train_end`` and ``teardown``, which run after yolo-det's (the plugin's callbacks
are in the dict the trainer is built with, ``BaseTrainer.__init__`` appends the integrations'; W&B's ``finish``
is appended later still, at ``on_pretrain_routine_end``). Nothing is imported that Ultralytics did not import,
nothing goes anywhere the user did not configure; an integration's global missing is one line naming it and the
release, and a tracker that fails is one line: the run and its record stand.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.compat import contact, loaded_internal, ultralytics_version
from ...core.endings import one_line
from ...core.machine import machine_view

__all__ = ["TRACKERS", "Tracker", "bitwise_promise", "key_fields", "machine_class", "publish"]

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


def _prefixed(fields: Mapping[str, str]) -> dict[str, str]:
    return {f"yolo_det.{k}": v for k, v in fields.items()}


def _mlflow(mlflow: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    mlflow.log_artifact(str(path))
    mlflow.set_tags(_prefixed(fields))


def _wandb(run: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    # escaped: a folder named with [ ] * ? is the literal folder, never a pattern
    if not run.save(glob.escape(str(path)), base_path=glob.escape(str(path.parent)), policy="now"):
        raise RuntimeError(f"wandb.save found no file at {path}")
    run.summary.update(_prefixed(fields))


def _tensorboard(writer: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    rows = "\n".join(f"| {k} | {v.replace('|', '/')} |" for k, v in fields.items())
    writer.add_text("yolo_det/determinism", f"| field | value |\n|---|---|\n{rows}\n\nrecord: `{path}`", step)
    writer.flush()


def _comet(experiment: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    experiment.log_asset(str(path))
    experiment.log_others(_prefixed(fields))


def _clearml(task: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    task.upload_artifact(path.name, artifact_object=path, wait_on_upload=True)  # in the task before it ends
    task.set_user_properties(**_prefixed(fields))


def _dvc(live: Any, path: Path, fields: Mapping[str, str], step: int) -> None:
    live.log_artifact(str(path), copy=True, cache=False)  # in git with the experiment, not in the DVC cache
    live.log_params({"yolo_det": dict(fields)})


@dataclass(frozen=True)
class Tracker:
    """How yolo-det finds the run one of Ultralytics' integrations opened, and adds the record to it."""

    #: The integration's module (a name of :data:`core.compat.INTERNALS`).
    integration: str
    #: Its callback whose presence on the trainer says it runs for this trainer.
    event: str
    #: Its global yolo-det finds the run through, and what that global is (the one line when it is missing).
    handle: str
    what: str
    #: ``handle -> the run open now`` (what :attr:`attach` writes to), or None.
    run: Callable[[Any], Any]
    #: ``(run, record path, key fields, step)``: adds the record and its key fields to the run.
    attach: Callable[[Any, Path, Mapping[str, str], int], None]


#: ``tracker -> how``, each through the run Ultralytics' integration opened, with the tracker's own API.
TRACKERS: dict[str, Tracker] = {
    "MLflow": Tracker(
        "mlflow_integration",
        "on_train_end",
        "mlflow",
        "the mlflow package Ultralytics logs with (its active run)",
        lambda mlflow: mlflow if mlflow is not None and mlflow.active_run() is not None else None,
        _mlflow,
    ),
    "Weights & Biases": Tracker(
        "wandb_integration",
        "on_train_end",
        "wb",
        "the wandb package Ultralytics logs with (its open run)",
        lambda wb: None if wb is None else wb.run,
        _wandb,
    ),
    "TensorBoard": Tracker(
        "tensorboard_integration",
        "on_pretrain_routine_start",
        "WRITER",
        "the SummaryWriter Ultralytics writes the run's TensorBoard log with",
        lambda writer: writer,
        _tensorboard,
    ),
    "Comet": Tracker(
        "comet_integration",
        "on_train_end",
        "comet_ml",
        "the comet_ml package Ultralytics logs with (its running experiment)",
        lambda comet_ml: None if comet_ml is None else comet_ml.get_running_experiment(),
        _comet,
    ),
    "ClearML": Tracker(
        "clearml_integration",
        "on_train_end",
        "Task",
        "ClearML's Task class Ultralytics logs with (its current task)",
        lambda task_class: task_class.current_task(),
        _clearml,
    ),
    "DVC": Tracker(
        "dvc_integration",
        "on_train_end",
        "live",
        "the dvclive Live Ultralytics logs with",
        lambda live: live,
        _dvc,
    ),
}


def _global(module: Any, name: str, what: str) -> Any:
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(
            f"{module.__name__} of Ultralytics {ultralytics_version()} has no {name}, which yolo-det reads for {what}"
        ) from None


def _open_run(trainer: Any, name: str, tracker: Tracker) -> Any:
    """The run the Ultralytics integration of ``tracker`` opened for ``trainer``, or None when it does not run for
    this trainer (Ultralytics did not import it, the user's settings did not register it) or has no run open."""
    module = loaded_internal(tracker.integration)
    if module is None:
        return None
    callbacks = contact(trainer, "callbacks", "the integrations registered on the trainer")
    registered = _global(module, tracker.event, f"whether Ultralytics' {name} integration is registered on the trainer")
    if registered not in callbacks.get(tracker.event, []):
        return None
    return tracker.run(_global(module, tracker.handle, tracker.what))


def publish(trainer: Any, path: Path, record: Mapping[str, Any]) -> list[str]:
    """Attach the final record at ``path`` to every tracker Ultralytics' integrations run for ``trainer`` (see the
    module docstring) and return their names; a tracker that fails is one line, never raised."""
    fields = key_fields(record)
    step = int(record.get("epochs_completed") or 0)
    done = []
    for name, tracker in TRACKERS.items():
        try:
            run = _open_run(trainer, name, tracker)
            if run is not None:
                tracker.attach(run, Path(path), fields, step)
                done.append(name)
        except Exception as e:  # the run and its record stand; the tracker misses them, and the user is told
            _say(f"could not add {Path(path).name} to {name}: {one_line(e)}")
    return done
