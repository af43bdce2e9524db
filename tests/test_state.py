"""Process-wide state: apply sets what a phase asks, restore puts back exactly what was there."""

from __future__ import annotations

import json
import os

import pytest
import torch

from yolo_det.core.profiles import BUILTIN_PROFILES, PHASES, PhaseSettings, load_profile
from yolo_det.core.state import apply, phase_scope, restore, snapshot


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_apply_sets_each_phase_and_restore_is_exact(name):
    profile = load_profile(name)
    base = snapshot()
    for phase in PHASES:
        settings = profile.phase(phase)
        before = apply(settings)
        assert before == base
        now = snapshot(settings.env)
        assert now.mode == settings.deterministic_algorithms
        assert now.cudnn_benchmark == settings.cudnn_benchmark
        assert now.cudnn_deterministic == settings.cudnn_deterministic
        assert now.cudnn_allow_tf32 == settings.allow_tf32
        assert (now.matmul_precision != "highest") == settings.allow_tf32
        assert now.fill_uninitialized_memory == settings.fill_uninitialized_memory
        for key, value in settings.env.items():
            assert os.environ.get(key) == value
        restore(before)
        assert snapshot() == base


def test_warn_only_and_env_unset_roundtrip(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    torch.use_deterministic_algorithms(True, warn_only=True)
    base = snapshot()
    settings = PhaseSettings(
        deterministic_algorithms="off", env={"NCCL_ALGO": None, "CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    )
    with phase_scope(settings):
        assert not torch.are_deterministic_algorithms_enabled()
        assert "NCCL_ALGO" not in os.environ
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    after = snapshot()
    assert after == base
    assert after.mode == "warn"
    assert os.environ["NCCL_ALGO"] == "Tree"


def test_phase_scope_restores_on_error():
    base = snapshot()
    with pytest.raises(ZeroDivisionError), phase_scope(load_profile("fast").train):
        assert torch.backends.cudnn.benchmark
        1 / 0  # noqa: B018
    assert snapshot() == base


def test_new_tf32_api_users_get_their_strings_back():
    # A user on torch's fp32_precision API: the legacy getters refuse to read once the two disagree.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    base = snapshot()
    assert base.matmul_precision is None  # unreadable through the legacy API
    for name in BUILTIN_PROFILES:
        before = apply(load_profile(name).train)
        restore(before)
        assert snapshot() == base
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


@pytest.mark.parametrize(
    ("flag", "warn_only", "mode"), [(False, False, "off"), (True, True, "warn"), (True, False, "strict")]
)
def test_snapshot_serialises_what_is_set(monkeypatch, flag, warn_only, mode):
    torch.use_deterministic_algorithms(flag, warn_only=warn_only)
    torch.backends.cudnn.benchmark = not flag
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    data = json.loads(json.dumps(snapshot().to_dict()))
    assert data["deterministic_algorithms"] == mode
    assert data["cudnn_benchmark"] is (not flag)
    assert data["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "PYTHONHASHSEED" in data["env"]
    assert data["env"]["PYTHONHASHSEED"] is None


# ---------------------------------------------------------------------------------------------------------
# a training gives the process back as it was: the environment and torch's thread count included

_DETERMINISM_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")


def _other_threads() -> int:
    """A thread count that is neither Ultralytics' choice for a CPU training nor the one in force."""
    from ultralytics.utils import NUM_THREADS

    return NUM_THREADS + 1


def _tiny(tmp_path, name: str) -> dict:
    from helpers import small_train
    from yolo_det.tools.demo import demo_data_yaml

    return small_train(
        data=str(demo_data_yaml()), imgsz=32, batch=8, fraction=0.25, val=False, project=str(tmp_path), name=name
    )


@pytest.fixture
def user_state(monkeypatch):
    """The user's own state before a run: threads Ultralytics would not pick, and their own variables."""
    threads = torch.get_num_threads()
    torch.set_num_threads(_other_threads())
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("way", ["attach", "trainer_class"])
def test_a_training_puts_back_the_users_variables_and_thread_count(way, tmp_path, monkeypatch, user_state):
    from ultralytics import YOLO

    import yolo_det

    model = YOLO("yolov8n.yaml")  # Ultralytics' constructor sets CUBLAS_WORKSPACE_CONFIG itself
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choices, made before the run
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    env, threads, flags = dict(os.environ), torch.get_num_threads(), snapshot()
    if way == "attach":
        yolo_det.attach(model, "repro")
        model.train(**_tiny(tmp_path, way))
    else:
        model.train(**_tiny(tmp_path, way), trainer=yolo_det.trainer_class("repro"))
    assert (tmp_path / way / "weights" / "last.pt").is_file()  # it trained
    assert {k: os.environ.get(k) for k in _DETERMINISM_ENV} == {k: env.get(k) for k in _DETERMINISM_ENV}
    assert torch.get_num_threads() == threads
    assert snapshot() == flags


@pytest.mark.slow
def test_a_cli_training_in_process_gives_the_environment_back_whole(tmp_path, monkeypatch, user_state):
    from helpers import small_train_tokens
    from yolo_det.cli import main

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # unset, as in a fresh process
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env, threads, flags = dict(os.environ), torch.get_num_threads(), snapshot()
    tokens = small_train_tokens(imgsz=32, batch=8, fraction=0.25, val=False)
    assert main(["train", "--profile", "repro", *tokens, f"project={tmp_path}", "name=cli"]) == 0
    assert (tmp_path / "cli" / "weights" / "last.pt").is_file()
    assert dict(os.environ) == env  # YOLO() set CUBLAS_WORKSPACE_CONFIG, the command set others: all put back
    assert torch.get_num_threads() == threads
    assert snapshot() == flags
