"""The record in the user's experiment tracker (integrations/ultralytics/trackers): real MLflow, W&B (offline),
TensorBoard, Comet (offline), ClearML (offline) and DVC (dvclive in a DVC repository).

Ultralytics turns its own integrations off under a test runner (``TESTS_RUNNING``: pytest imported, a
``PYTEST_CURRENT_TEST`` or GitHub Actions variable): the trainings run as a user's would, in a child process
without those, with Ultralytics' settings in a folder of the test's own (``YOLO_CONFIG_DIR``), never the user's.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import ROOT, small_train_tokens, subprocess_env
from yolo_det.core.compat import internal
from yolo_det.integrations.ultralytics import trackers

#: The variables by which Ultralytics knows a test runner and turns its integrations off.
_TEST_RUNNER_ENV = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "GITHUB_ACTIONS", "GITHUB_WORKFLOW", "RUNNER_OS")

#: MLflow 3's local file store (mlflow-skinny has no database backend) is allowed only when asked for.
_FILE_STORE = {"MLFLOW_ALLOW_FILE_STORE": "true"}

#: W&B offline (no network, no login), its own folders in the test's (the run itself goes in the run folder).
_WANDB = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
_WANDB_DIRS = ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")

#: Comet offline (``COMET_MODE`` for Ultralytics 8.3; its experiment archived as a zip in a folder of the test's),
#: ClearML offline (its session in a folder of the test's), DVC without its usage analytics; their homes
#: (~/.clearml, ~/.config) in the test's.
_OFFLINE = {"COMET_START_ONLINE": "0", "COMET_MODE": "offline", "CLEARML_OFFLINE_MODE": "1", "DVC_NO_ANALYTICS": "1"}

#: ClearML's configuration in the tests: the repository detected before Task.init returns (not in a thread that
#: rewrites an offline task.json), and the reports sent from the process itself (not from a daemon of its own that
#: outlives it holding the test's output pipe).
_CLEARML_CONF = "sdk.development.vcs_repo_detect_async: false\nsdk.development.report_use_subprocess: false\n"

#: The trackers of Ultralytics' settings the tests turn on or off.
_SETTINGS = ("mlflow", "wandb", "tensorboard", "comet", "clearml", "dvc")

#: A user's training, after turning Ultralytics' tracker settings on or off as ``yolo settings`` does.
_CHILD = """
import sys
from ultralytics.utils import SETTINGS
SETTINGS.update({settings})
from yolo_det.integrations.fonts import ensure_local_font
ensure_local_font()
from yolo_det.cli import main
sys.exit(main(["train", "--profile", "repro", *sys.argv[1:]]))
"""


#: ClearML's offline mode keeps no models, and Ultralytics' ClearML ``on_train_end`` stores the weights as one
#: (``update_output_model``: ClearML 2.1.12 fails offline), so no training ends under it: a user's process instead
#: opens a task as Ultralytics advises (before YOLO; Ultralytics then connects the trainer's arguments to it, in its
#: ``on_pretrain_routine_start``), builds the trainer with ClearML on in Ultralytics' settings and publishes a record;
#: ClearML closes the task as the process ends. Offline, ClearML's own threads rewrite task.json from the copy they
#: read, so a property written meanwhile is lost: the task is opened without its resource monitor, its repository
#: detected before Task.init returns (:data:`_CLEARML_CONF`); a training outlasts both.
_CLEARML_CHILD = """
import json, sys
from pathlib import Path
from clearml import Task
from ultralytics.utils import SETTINGS
SETTINGS.update({settings})
from yolo_det.core.compat import task_trainer
from yolo_det.integrations.ultralytics import trackers
record, data, project = map(Path, sys.argv[1:4])
Task.init(project_name="p", task_name="c", auto_resource_monitoring=False)
trainer = task_trainer("detect")(
    overrides={{"model": "yolov8n.yaml", "data": str(data), "project": str(project), "name": "c", "device": "cpu"}}
)
trainer.run_callbacks("on_pretrain_routine_start")  # 8.4 runs it in __init__ too, 8.3 only in train()
print("published", json.dumps(trackers.publish(trainer, record, json.loads(record.read_text()))))
"""


def _user_env(tmp: Path) -> dict[str, str]:
    """The environment of a user's process: every tracker local or offline, writing in ``tmp``; no test runner."""
    wandb_dirs = {name: str(tmp / "wandb-home" / name.lower()) for name in _WANDB_DIRS}
    env = subprocess_env(
        {
            "YOLO_CONFIG_DIR": str(tmp / "ultralytics-settings"),
            "MLFLOW_TRACKING_URI": (tmp / "mlruns").as_uri(),
            **_FILE_STORE,
            **_WANDB,
            **wandb_dirs,
            **_OFFLINE,
            "COMET_OFFLINE_DIRECTORY": str(tmp / "comet"),
            "CLEARML_CACHE_DIR": str(tmp / "clearml"),
            "HOME": str(tmp / "home"),
            "CLEARML_CONFIG_FILE": str(tmp / "clearml.conf"),
        }
    )
    (tmp / "clearml.conf").write_text(_CLEARML_CONF)
    for name in _TEST_RUNNER_ENV:
        env.pop(name, None)
    return env


def _user_training(tmp: Path, *on: str, cwd: Path | None = None) -> tuple[Path, Path, str]:
    """Train one small run as a user whose Ultralytics settings turn the trackers ``on`` (and the others off) would;
    return the run folder, the folder the command ran in, and the MLflow tracking URI it was given."""
    if cwd is None:
        cwd = tmp / "cwd"
        cwd.mkdir()
    env = _user_env(tmp)
    tokens = small_train_tokens(batch=8, nbs=8, val=False, project=str(tmp / "runs"), name="a")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(settings={k: k in on for k in _SETTINGS}), *tokens],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "runs" / "a", cwd, env["MLFLOW_TRACKING_URI"]


def _wandb_log(path: Path) -> list[Any]:
    """The records of a W&B run's transaction log (``run-<id>.wandb``, the log ``wandb sync`` uploads): a 7-byte
    header, then LevelDB log blocks of 32 KiB, each record in chunks behind a 7-byte header (CRC, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data, records, chunk, pos = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's zero padding
            pos += left
            continue
        chunk, pos = chunk + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            records.append(wandb_internal_pb2.Record.FromString(chunk))
            chunk = b""
    return records


@pytest.mark.slow
def test_an_mlflow_run_a_wandb_run_and_a_tensorboard_log_written_during_a_training_hold_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, uri = _user_training(tmp_path, "mlflow", "wandb", "tensorboard")
    for name, value in _FILE_STORE.items():
        monkeypatch.setenv(name, value)
    record = json.loads((run_dir / "determinism.json").read_text())
    assert record["status"] == "completed"
    assert len(record["weights"]["sha256"]) == 64

    # MLflow: the run Ultralytics opened (its parameters, ended by it) holds the record and the key fields
    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1
    (run,) = runs
    assert run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "1"
    assert run.data.params["imgsz"] == "64"
    tags = run.data.tags
    assert tags["yolo_det.profile"] == "repro"
    assert tags["yolo_det.weights_sha256"] == record["weights"]["sha256"]
    assert tags["yolo_det.bitwise_expected"] == "true"
    assert tags["yolo_det.bitwise_why_not"] == ""
    assert tags["yolo_det.status"] == "completed"
    assert tags["yolo_det.machine_class"] == trackers.machine_class(record)
    assert "threads, torch" in tags["yolo_det.machine_class"]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "determinism.json" in names
    assert "results.csv" in names
    copy = Path(client.download_artifacts(run.info.run_id, "determinism.json", str(tmp_path / "download")))
    assert json.loads(copy.read_text()) == record

    # W&B: the offline run Ultralytics opened in the run folder (its config, finished by it after yolo-det's
    # fields) holds the record in its files (to upload with the run, policy now) and the key fields in its summary
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    assert json.loads((wandb_run / "files" / "determinism.json").read_text()) == record
    (log_file,) = wandb_run.glob("run-*.wandb")
    log = _wandb_log(log_file)
    (opened,) = [r.run for r in log if r.WhichOneof("record_type") == "run"]
    config = {i.key: json.loads(i.value_json) for i in opened.config.update}
    assert config["imgsz"] == 64  # Ultralytics' own
    (saved,) = [f for r in log if r.WhichOneof("record_type") == "files" for f in r.files.files if "determ" in f.path]
    assert (saved.path, saved.policy) == ("determinism.json", saved.NOW)
    summary = [
        (n, i.key, json.loads(i.value_json))
        for n, r in enumerate(log)
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
        if i.key.startswith("yolo_det.")
    ]
    assert {k.removeprefix("yolo_det."): v for _, k, v in summary} == trackers.key_fields(record)
    assert dict((k, v) for _, k, v in summary)["yolo_det.weights_sha256"] == record["weights"]["sha256"]
    (ended,) = [n for n, r in enumerate(log) if r.WhichOneof("record_type") == "exit" and r.exit.exit_code == 0]
    assert max(n for n, _, _ in summary) < ended

    # TensorBoard: the log Ultralytics wrote in the run folder holds the key fields beside its scalars
    log = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
    log.Reload()
    tags_tb = log.Tags()
    assert any(t.startswith("train/") for t in tags_tb["scalars"]), tags_tb  # Ultralytics' own
    (event,) = log.Tensors("yolo_det/determinism/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert f"| weights_sha256 | {record['weights']['sha256']} |" in text
    assert "| profile | repro |" in text
    assert "| bitwise_expected | true |" in text


def _dvc_repo(cwd: Path) -> dict[str, str]:
    """Make ``cwd`` a git work tree with one commit and a DVC repository (dvclive saves its experiment there);
    return the environment git runs with."""
    env = subprocess_env(
        {"HOME": str(cwd.parent / "home"), "DVC_NO_ANALYTICS": "1", "GIT_CONFIG_NOSYSTEM": "1"}
        | {f"GIT_{who}_{what}": v for who in ("AUTHOR", "COMMITTER") for what, v in (("NAME", "u"), ("EMAIL", "u@x"))}
    )
    cwd.mkdir()
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True, timeout=300)
    subprocess.run(["git", "commit", "-qm", "dvc init"], cwd=cwd, env=env, check=True, capture_output=True)
    return env


@pytest.mark.slow
def test_a_comet_experiment_and_a_dvc_experiment_written_during_a_training_and_a_clearml_task_hold_the_record(
    tmp_path: Path, demo_data: str
) -> None:
    import zipfile

    import yaml

    for package in ("comet_ml", "clearml"):
        pytest.importorskip(package)
    # dvclive is not in the test extra (with it installed, Ultralytics' own DVC callback fails a plotted training
    # outside a DVC repository, the project's demo too): the DVC part runs where it is installed
    dvc = importlib.util.find_spec("dvclive") is not None
    git = _dvc_repo(tmp_path / "cwd") if dvc else {}
    if not dvc:
        (tmp_path / "cwd").mkdir()
    run_dir, cwd, _ = _user_training(tmp_path, "comet", *(["dvc"] if dvc else []), cwd=tmp_path / "cwd")
    record = json.loads((run_dir / "determinism.json").read_text())
    assert record["status"] == "completed"
    fields = trackers.key_fields(record)
    assert fields["weights_sha256"] == record["weights"]["sha256"]
    clearml = subprocess.run(
        [
            sys.executable,
            "-c",
            _CLEARML_CHILD.format(settings={k: k == "clearml" for k in _SETTINGS}),
            str(run_dir / "determinism.json"),
            demo_data,
            str(tmp_path / "runs"),
        ],
        cwd=cwd,
        env=_user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert clearml.returncode == 0, clearml.stderr[-3000:]
    (published,) = [line.split(maxsplit=1)[1] for line in clearml.stdout.splitlines() if line.startswith("published")]
    assert json.loads(published) == ["ClearML"]

    # Comet: the offline experiment Ultralytics started (its parameters; archived when it ended it) holds the
    # record as an asset and the key fields as "others"
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines()]
        params = {
            m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
            for m in messages
            if m["type"] == "parameter_msg" and "param" in m["payload"]
        }
        assert params["imgsz"] == 64  # Ultralytics' own
        (asset,) = [
            m["payload"]
            for m in messages
            if m["type"] == "file_upload" and m["payload"]["additional_params"]["fileName"] == "determinism.json"
        ]
        assert json.loads(z.read(asset["file_path"])) == record
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert {k.removeprefix("yolo_det."): v for k, v in others.items() if k.startswith("yolo_det.")} == fields

    # ClearML: the offline task Ultralytics created (the trainer's arguments under General) holds the record as an
    # artifact and the key fields as user properties
    (session,) = (tmp_path / "clearml" / "offline").glob("offline-*/task.json")
    task = json.loads(session.read_text())
    assert task["hyperparams"]["General"]["name"]["value"] == "c"  # Ultralytics' own (the trainer's arguments)
    properties = {k: v["value"] for k, v in task["hyperparams"]["properties"].items()}
    assert {k.removeprefix("yolo_det."): v for k, v in properties.items()} == fields
    (artifact,) = [a for a in task["execution"]["artifacts"] if a["key"] == "determinism.json"]
    assert json.loads(Path(artifact["uri"]).read_text()) == record

    # DVC: the experiment dvclive saved (its git ref, with Ultralytics' parameters) holds the record and the fields
    def saved(name: str) -> str:
        refs = subprocess.run(
            ["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
            cwd=cwd,
            env=git,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        (experiment,) = [r for r in refs if not r.startswith("refs/exps/exec/")]  # DVC's own EXEC_HEAD besides
        return subprocess.run(
            ["git", "show", f"{experiment}:{name}"], cwd=cwd, env=git, check=True, capture_output=True, text=True
        ).stdout

    if not dvc:
        return
    params = yaml.safe_load(saved("dvclive/params.yaml"))
    assert params["imgsz"] == 64  # Ultralytics' own
    assert params["yolo_det"] == fields
    assert json.loads(saved("dvclive/artifacts/determinism.json")) == record


@pytest.mark.slow
def test_with_no_tracker_on_nothing_is_written_anywhere_but_the_run_folder(tmp_path: Path) -> None:
    # every tracker's package installed here (the test extra) and pointed at a folder of the test's, none on
    run_dir, cwd, _ = _user_training(tmp_path)
    assert (run_dir / "determinism.json").is_file()
    # no mlruns, wandb, comet or clearml folder; in the home folder only matplotlib's caches, Ultralytics' font and
    # yolo-det's data fingerprints (no ~/.clearml, ~/.comet, ~/.config/dvc or ~/.config/iterative)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clearml.conf", "cwd", "home", "runs", "ultralytics-settings"]
    home = tmp_path / "home"
    places = {"/".join(p.relative_to(home).parts[:2]) for p in home.rglob("*")}
    known = {".cache/matplotlib", ".cache/yolo-det", ".config/Ultralytics", ".config/matplotlib"}
    assert places <= {".cache", ".config", *known}
    assert not (run_dir / "wandb").exists()
    assert list(cwd.iterdir()) == []
    assert [p for p in run_dir.rglob("*") if "tfevents" in p.name] == []


#: Prints the Ultralytics integrations a detection trainer registers under the settings of ``YOLO_CONFIG_DIR``,
#: with every tracker setting (a key naming a module of ``ultralytics.utils.callbacks``) turned on first if argv[3]
#: says so.
_REGISTERED = """
import json, sys
from pathlib import Path
import ultralytics.utils.callbacks as callbacks
from ultralytics.utils import SETTINGS
from yolo_det.core.compat import task_trainer

if sys.argv[3] == "on":
    modules = {p.stem for p in Path(callbacks.__file__).parent.glob("*.py")}
    SETTINGS.update({k: True for k in SETTINGS if ("wb" if k == "wandb" else k) in modules})
trainer = task_trainer("detect")(overrides={"model": "yolov8n.yaml", "data": sys.argv[1], "project": sys.argv[2]})
names = {c.__module__ for cs in trainer.callbacks.values() for c in cs}
names = sorted(n.rsplit(".", 1)[1] for n in names if n.startswith("ultralytics.utils.callbacks."))
print("registered", json.dumps(names))
"""


@pytest.mark.slow
def test_the_compatibility_cells_turn_every_tracker_integration_off(tmp_path: Path, demo_data: str) -> None:
    spec = importlib.util.spec_from_file_location("compat_matrix", ROOT / "bench" / "compat_matrix.py")
    assert spec is not None
    assert spec.loader is not None
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)

    def run(*argv: str) -> list[str]:
        # in the folder of the test (the trainer with every tracker on starts their runs: dvclive's in the cwd)
        done = subprocess.run(
            [sys.executable, "-c", *argv],
            cwd=tmp_path,
            env=_user_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return [line.removeprefix("registered ") for line in done.stdout.splitlines() if line.startswith("registered ")]

    trainer = (_REGISTERED, demo_data, str(tmp_path / "runs"))
    (before,) = map(json.loads, run(*trainer, "on"))
    # the control: with every tracker setting on, the installed trackers' integrations are registered
    installed = {"comet_ml": "comet", "clearml": "clearml", "dvclive": "dvc", "mlflow": "mlflow"}
    installed = {v for k, v in installed.items() if importlib.util.find_spec(k) is not None}
    assert {"mlflow", "tensorboard", "wb"} | installed <= set(before)
    # the cell's settings, as its own process sets them before the cell's runs: Ultralytics' base callbacks and its
    # own analytics, no tracker
    run(matrix.TRACKERS_OFF)
    (after,) = map(json.loads, run(*trainer, "as set"))
    assert set(after) <= {"base", "hub", "platform", "events"}, after


def _record(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "status": "completed",
        "profile": {"name": "repro", "train": {"deterministic_algorithms": "strict", "backward": "keep"}},
        "weights": {"sha256": "ab" * 32},
        "guarantees": {"flags": {"in_force": True}},
        "nondeterminism_warnings": [],
        "run": {"device": "cpu"},
        "environment": {
            "host": {
                "arch": "x86_64",
                "cpu_vendor": "AuthenticAMD",
                "cpu_capability": "AVX512",
                "intra_op_threads": 1,
                "torch": "2.14.1",
                "gpu": {"name": "H200", "sm_count": 132, "cuda": "13.0"},
            }
        },
    }
    record.update(changes)
    return record


def test_the_promise_of_the_same_bits_names_each_reason_it_does_not_hold() -> None:
    assert trackers.bitwise_promise(_record()) == (True, [])
    fast = {"name": "fast", "train": {"deterministic_algorithms": "off", "backward": "disable"}}
    promised, reasons = trackers.bitwise_promise(
        _record(
            status="failed",
            profile=fast,
            guarantees={"flags": {"in_force": False}},
            nondeterminism_warnings=[{"message": "x"}],
            resume={"bitwise_expected": False, "reasons": ["the profile changed"]},
        )
    )
    assert not promised
    assert reasons == [
        "the run did not complete (status failed)",
        "the train phase runs without deterministic algorithms (deterministic_algorithms: off)",
        "the backward pass runs without deterministic algorithms (backward: disable)",
        "the guarantee 'flags' did not hold",
        "1 non-determinism warning(s) during the run",
        "resume: the profile changed",
    ]
    fields = trackers.key_fields(_record(profile=fast))
    assert fields["bitwise_expected"] == "false"
    assert "deterministic_algorithms: off" in fields["bitwise_why_not"]


def test_the_machine_class_is_the_gpu_for_a_run_on_cuda_and_the_cpu_for_one_on_the_cpu() -> None:
    assert trackers.machine_class(_record()) == "x86_64 AuthenticAMD AVX512, 1 threads, torch 2.14.1"
    assert trackers.machine_class(_record(run={"device": "0"})) == "H200, 132 SMs, CUDA 13.0, torch 2.14.1"


def test_an_integration_global_missing_is_one_line_naming_it_and_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], demo_data: str
) -> None:
    from yolo_det.core.compat import task_trainer, ultralytics_version

    module = internal("mlflow_integration")  # imported, as Ultralytics does for a user whose settings turn it on
    trainer = task_trainer("detect")(
        overrides={"model": "yolov8n.yaml", "data": demo_data, "project": str(tmp_path), "device": "cpu"}
    )
    if module.on_train_end not in trainer.callbacks["on_train_end"]:  # the user's settings may have it off
        trainer.add_callback("on_train_end", module.on_train_end)
    path = tmp_path / "determinism.json"
    path.write_text("{}")
    assert trackers.publish(trainer, path, _record()) == []  # registered, no run open under a test: nothing
    capsys.readouterr()
    monkeypatch.delattr(module, "mlflow")
    assert trackers.publish(trainer, path, _record()) == []
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"yolo-det: could not add determinism.json to MLflow: ultralytics.utils.callbacks.mlflow of Ultralytics "
        f"{ultralytics_version()} has no mlflow, which yolo-det reads for the mlflow package Ultralytics logs with "
        "(its active run)"
    ]
