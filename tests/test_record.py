"""Run record: weights digest definition, checkpoint loading, environment, atomic JSON."""

from __future__ import annotations

import json
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch

from yolo_det.core.errors import ModelError
from yolo_det.core.record import (
    RECORD_NAME,
    RECORD_SCHEMA,
    checkpoint_digest,
    environment,
    load_checkpoint_state,
    state_dict_digest,
    write_record,
)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))


def test_digest_ignores_insertion_order_but_not_values_names_or_shapes():
    sd = model().state_dict()
    digest = state_dict_digest(sd)
    assert digest == state_dict_digest(OrderedDict(reversed(list(sd.items()))))
    assert digest == state_dict_digest(model())
    assert digest != state_dict_digest(model(seed=1))
    changed = {k: v.clone() for k, v in sd.items()}
    changed["0.weight"].view(-1)[5] += 1e-6
    assert digest != state_dict_digest(changed)
    renamed = {("x" + k if k == "0.bias" else k): v for k, v in sd.items()}
    assert digest != state_dict_digest(renamed)
    reshaped = dict(sd, **{"0.bias": sd["0.bias"].reshape(2, 2)})
    assert digest != state_dict_digest(reshaped)


def test_digest_is_defined_on_values_not_storage_dtype():
    half = {k: (v.half() if v.is_floating_point() else v) for k, v in model().state_dict().items()}
    as_float = {k: (v.float() if v.is_floating_point() else v) for k, v in half.items()}
    as_bf16_exact = {"w": torch.tensor([1.0, 0.5, -2.0], dtype=torch.bfloat16)}
    assert state_dict_digest(half) == state_dict_digest(as_float)
    assert state_dict_digest(as_bf16_exact) == state_dict_digest({"w": torch.tensor([1.0, 0.5, -2.0])})
    strided = torch.arange(12.0).reshape(3, 4).t()
    assert state_dict_digest({"w": strided}) == state_dict_digest({"w": strided.contiguous()})
    assert state_dict_digest({"n": torch.tensor(3)}) != state_dict_digest({"n": torch.tensor(3.0)})


def test_checkpoint_digest_reads_ultralytics_style_and_plain_state_dicts(tmp_path):
    m = model()
    expected = state_dict_digest(m)
    torch.save({"epoch": 1, "model": None, "ema": m, "date": "x"}, tmp_path / "ema.pt")
    torch.save({"model": m, "date": "y"}, tmp_path / "model.pt")
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    torch.save({"state_dict": m.state_dict()}, tmp_path / "wrapped.pt")
    for name in ("ema.pt", "model.pt", "sd.pt", "wrapped.pt"):
        assert checkpoint_digest(tmp_path / name) == expected, name


def test_non_checkpoints_are_rejected_in_one_line(tmp_path):
    (tmp_path / "text.pt").write_text("not a checkpoint")
    torch.save({"epoch": 3}, tmp_path / "empty.pt")
    for name, fragment in (
        ("text.pt", "is not a PyTorch checkpoint"),
        ("empty.pt", "holds no model weights"),
        ("missing.pt", "does not exist"),
    ):
        with pytest.raises(ModelError) as e:
            load_checkpoint_state(tmp_path / name)
        assert fragment in str(e.value)
        assert "\n" not in str(e.value)


def test_environment_and_record_file(tmp_path):
    env = environment()
    for key in ("python", "torch", "cuda", "cudnn", "ultralytics", "numpy", "gpus", "env"):
        assert key in env
    assert env["torch"] == torch.__version__
    path = write_record(tmp_path / "run", {"status": "completed", "environment": env, "profile": {"name": "repro"}})
    assert path.name == RECORD_NAME
    data = json.loads(path.read_text())
    assert data["schema"] == RECORD_SCHEMA
    assert data["status"] == "completed"
    assert not [p for p in path.parent.iterdir() if p.name != RECORD_NAME]  # no temporary left behind


def test_one_record_builder_gives_the_shared_schema_and_framework_keys_after_it():
    from yolo_det.core.record import build_record
    from yolo_det.session.session import DeterminismSession

    session = DeterminismSession("repro", seed=5)
    with session.run(), session.phase_scope("train"):
        record = build_record(
            session,
            framework="test",
            status="completed",
            state_at_train_start=None,
            weights={"sha256": "x"},
            run={"epochs": 1},
            extra_key=[1],
        )
    shared = [
        "status",
        "framework",
        "profile",
        "seeds",
        "environment",
        "state_before",
        "state_at_train_start",
        "backward_toggles",
        "swaps",
        "routed_calls",
        "nondeterminism_warnings",
        "weights",
        "run",
        "phase_events",
        "project",
        "packages",
    ]
    assert list(record) == [*shared, "extra_key"]
    assert record["seeds"]["seed"] == 5
    assert record["profile"]["name"] == "repro"
    assert [e["event"] for e in record["phase_events"]] == ["enter"]
    json.dumps(record)  # plain data


def test_a_record_written_after_the_run_ended_names_the_training_environment(monkeypatch):
    """A run that ends early is recorded after its state is restored: the environment variables recorded
    are those the training ran with, not the user's restored ones."""
    from yolo_det.core.record import build_record
    from yolo_det.session.session import DeterminismSession

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    session = DeterminismSession("repro", seed=0)
    with session.run():
        with session.phase_scope("train"):
            during = environment()["env"]["CUBLAS_WORKSPACE_CONFIG"]
    record = build_record(session, framework="test", status="terminated", state_at_train_start=None, weights={}, run={})
    assert during is not None  # repro sets it for training
    assert environment()["env"]["CUBLAS_WORKSPACE_CONFIG"] is None  # restored afterwards
    assert record["environment"]["env"]["CUBLAS_WORKSPACE_CONFIG"] == during


def test_the_record_reads_a_session_through_a_protocol_defined_in_core() -> None:
    from yolo_det.core.record import RecordSource
    from yolo_det.session.session import DeterminismSession

    assert isinstance(DeterminismSession("fast"), RecordSource)
    assert not isinstance(object(), RecordSource)  # control: the check does look at the members


def test_adjusted_args_name_what_ultralytics_changed_and_nothing_else():
    from types import SimpleNamespace

    from yolo_det.integrations.identity import adjusted_args

    used = SimpleNamespace(workers=0, batch=8)
    out = adjusted_args({"workers": 3, "batch": 8}, used)
    assert list(out) == ["workers"]
    assert out["workers"]["asked"] == 3
    assert out["workers"]["used"] == 0
    assert "CPU" in out["workers"]["why"]
    assert adjusted_args({"workers": 0}, used) == {}  # control: kept as asked
    assert adjusted_args({}, used) == {}  # not asked: nothing to say


@pytest.mark.slow
def test_a_cpu_run_asked_for_workers_records_and_says_what_ran(tmp_path, capsys, monkeypatch):
    from yolo_det.cli import main

    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    tiny = ["epochs=1", "imgsz=64", "batch=8", "fraction=0.25", "device=cpu", "plots=False", "val=False"]
    code = main(["train", *tiny, "workers=2", f"project={tmp_path}", "name=w2"])
    out = capsys.readouterr().out
    assert code == 0
    record = json.loads((tmp_path / "w2" / "determinism.json").read_text())
    assert record["ultralytics_args"]["workers"] == 0
    change = record["adjusted_args"]["workers"]
    assert (change["asked"], change["used"]) == (2, 0)
    assert "CPU" in change["why"]
    notes = [line for line in out.splitlines() if line.startswith("note: workers=")]
    assert notes == [f"note: workers=2 ran as workers=0: {change['why']}"]
    # optimizer=auto (Ultralytics' default): the optimizer, lr0 and momentum it chose, read from the optimizer built
    auto = record["adjusted_args"]
    assert auto["optimizer"]["asked"] == "auto"
    assert auto["optimizer"]["used"] in {"AdamW", "MuSGD", "SGD"}
    assert auto["lr0"]["asked"] == 0.01
    assert auto["lr0"]["used"] != 0.01
    assert "optimizer=auto" in auto["lr0"]["why"]
    assert not [line for line in out.splitlines() if line.startswith("note: optimizer=")]  # Ultralytics logs it


def test_optimizer_auto_is_in_adjusted_args_and_diff_names_what_it_chose() -> None:
    import copy

    from yolo_det.integrations.identity import adjusted_args
    from yolo_det.tools.diff import diff_records

    weights = [torch.nn.Parameter(torch.zeros(2))]
    adamw = torch.optim.AdamW(weights, lr=0.001111, betas=(0.9, 0.999))
    out = adjusted_args({"epochs": 1}, SimpleNamespace(), adamw)
    assert out["optimizer"] == {"asked": "auto", "used": "AdamW", "why": out["optimizer"]["why"]}
    assert (out["lr0"]["asked"], out["lr0"]["used"]) == (0.01, 0.001111)
    assert (out["momentum"]["asked"], out["momentum"]["used"]) == (0.937, 0.9)
    # control: an optimizer asked by name is used as asked
    sgd = torch.optim.SGD(weights, lr=0.02, momentum=0.937)
    assert adjusted_args({"optimizer": "SGD", "lr0": 0.02}, SimpleNamespace(), sgd) == {}
    # two runs whose arguments read the same (Ultralytics 8.3 leaves optimizer=auto in them) but auto chose
    # different optimizers: diff names the optimizer used
    args = {"optimizer": "auto", "lr0": 0.01, "epochs": 1}
    a = {"schema": 3, "profile": {"name": "repro"}, "environment": {}, "ultralytics_args": dict(args)}
    b = copy.deepcopy(a)
    a["adjusted_args"] = out
    b["adjusted_args"] = adjusted_args({}, SimpleNamespace(), sgd)
    causes = {d.name: d for d in diff_records(a, b).causes}
    assert (causes["optimizer="].a, causes["optimizer="].b) == ("AdamW", "SGD")
    assert "adjusted_args" in (causes["optimizer="].note or "")
    assert "optimizer=" not in {d.name for d in diff_records(a, copy.deepcopy(a)).causes}
