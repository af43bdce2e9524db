"""diff and lineage: a resumed run against its uninterrupted twin, a part under another profile, flags with no
effect on the device that ran them, a run that stopped early."""

from __future__ import annotations

import copy
from typing import Any

from yolo_det.tools.diff import diff_records

PROFILE = {
    "name": "repro",
    "train": {"deterministic_algorithms": "strict", "cudnn_benchmark": False, "allow_tf32": False},
    "val": {},
    "deploy": {},
}
FAST = {
    "name": "fast",
    "train": {"deterministic_algorithms": "off", "cudnn_benchmark": True, "allow_tf32": True},
    "val": {},
    "deploy": {},
}
ENV = {"torch": "2.4.0", "cuda_available": False, "env": {"PYTHONHASHSEED": "0"}, "gpus": [], "cpu_model": "x"}
ARGS = {
    "model": "yolov8n.yaml",
    "data": "d.yaml",
    "epochs": 3,
    "imgsz": 32,
    "batch": 8,
    "device": "cpu",
    "resume": False,
    "save_dir": "runs/s",
}
MODEL = {
    "kind": "yaml",
    "architecture_sha256": "a" * 64,
    "yaml_sha256": "b" * 64,
    "start_weights_sha256": "c" * 64,
    "source": "yolov8n.yaml",
}


def twin(**extra: Any) -> dict[str, Any]:
    return {
        "schema": 2,
        "status": "completed",
        "framework": "ultralytics",
        "profile": PROFILE,
        "seeds": {"seed": 0},
        "environment": ENV,
        "ultralytics_args": dict(ARGS),
        "model": MODEL,
        "epochs_completed": 3,
        "weights": {"sha256": "d" * 64},
        "segments": [],
        "resume": None,
        **extra,
    }


def resumed(first_profile: dict[str, Any] = PROFILE, **last: Any) -> dict[str, Any]:
    first = twin(status="interrupted", profile=first_profile, epochs_completed=1, weights={})
    args = {**ARGS, "resume": "runs/r/weights/last.pt", "model": "runs/r/weights/last.pt", "save_dir": "runs/r"}
    record = twin(
        ultralytics_args=args,
        model={**MODEL, "kind": "checkpoint", "start_weights_sha256": "e" * 64},
        segments=[first],
        resume={"resumed": True, "epoch": 1, "state_found": True, "bitwise_expected": True, "reasons": []},
    )
    record.update(last)
    return record


def test_a_resumed_run_and_its_uninterrupted_twin_are_equivalent() -> None:
    report = diff_records(twin(), resumed())
    assert report.exit_code == 0, [d.name for d in report.causes]
    assert report.verdict == "equivalent: run B resumed after epoch 1, and the weights are bitwise identical"
    assert "run B: resumed after epoch 1" in report.summary()


def test_a_part_under_another_profile_is_named() -> None:
    report = diff_records(resumed(first_profile=FAST), twin())
    assert report.exit_code == 1
    names = [d.name for d in report.causes]
    assert "part 1 of A (epochs 1-1): trained under the profile" in names
    cause = next(d for d in report.causes if d.name.startswith("part 1"))
    assert (cause.a, cause.b) == ("fast", "repro")
    assert "part 2" not in " ".join(names)  # the second part trained under repro, as the twin


def test_a_resume_that_changed_an_argument_is_named_with_its_reason() -> None:
    last = resumed(
        resume={
            "resumed": True,
            "epoch": 1,
            "state_found": True,
            "bitwise_expected": False,
            "reasons": ["imgsz=64 differs from the checkpoint's imgsz=32"],
        }
    )
    last["ultralytics_args"]["imgsz"] = 64
    report = diff_records(twin(), last)
    names = [d.name for d in report.causes]
    assert "part 2 of B (epochs 2-3): imgsz=" in names
    assert "resume of B: not expected bit for bit" in names
    assert report.exit_code == 1


def test_cuda_only_flags_have_no_effect_on_a_cpu_run() -> None:
    a = twin(profile=copy.deepcopy(PROFILE))
    b = twin(profile={**copy.deepcopy(PROFILE), "name": "other"})
    b["profile"]["train"]["cudnn_benchmark"] = True
    b["environment"] = {**ENV, "env": {"PYTHONHASHSEED": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}}
    report = diff_records(a, b)
    assert report.exit_code == 0
    assert not report.causes
    flags = {d.name: d.note for d in report.differences}
    on_cpu = "no effect: both runs trained on the CPU"
    assert flags["train.cudnn_benchmark"] == flags["CUBLAS_WORKSPACE_CONFIG"] == on_cpu
    b["ultralytics_args"]["device"] = "0"
    b["environment"]["cuda_available"] = True
    assert "train.cudnn_benchmark" in [d.name for d in diff_records(a, b).causes]


def test_a_stopped_run_compares_on_configuration_and_says_how_far_it_got() -> None:
    stopped = twin(status="terminated", epochs_completed=2, weights={}, signal="SIGTERM")
    report = diff_records(twin(), stopped)
    assert report.exit_code == 3  # nothing compared: B left no final weights
    assert report.verdict.startswith("nothing compared: no final weights digest for run B")
    assert not report.causes
    assert "run B (terminated after 2 of 3 epoch(s) checkpointed)" in report.verdict
    killed = twin(status="running", epochs_completed=1, weights={})
    assert "running, or killed (its record still says running) after 1 of 3" in diff_records(twin(), killed).verdict
