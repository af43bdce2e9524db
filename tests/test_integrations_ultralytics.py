"""Ultralytics integration: phases in force at the right moments, state restored, seeds, run record."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers import small_train
from yolo_det import attach, detach, trainer_class
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.state import snapshot
from yolo_det.integrations.ultralytics import UltralyticsPlugin

pytestmark = pytest.mark.slow

SMALL = small_train()

PROBE_PROFILE = """\
name: probe
extends: repro
defaults:
  swaps: none
  intercept: false
train:
  deterministic_algorithms: strict
  cudnn_benchmark: false
  fill_uninitialized_memory: true
val:
  deterministic_algorithms: warn
  fill_uninitialized_memory: false
deploy:
  deterministic_algorithms: "off"
  cudnn_benchmark: true
"""


def flags() -> tuple[str, bool, bool | None]:
    s = snapshot()
    return s.mode, s.cudnn_benchmark, s.fill_uninitialized_memory


class FlagProbe(torch.autograd.Function):
    """Identity recording the deterministic flag in forward (training only) and backward."""

    log: list[tuple[str, bool]] = []

    @staticmethod
    def forward(ctx, x):
        if x.requires_grad:  # training forward (validation runs without grad)
            FlagProbe.log.append(("forward", torch.are_deterministic_algorithms_enabled()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        FlagProbe.log.append(("backward", torch.are_deterministic_algorithms_enabled()))
        return grad


def _probe_hook(module, inputs, output):
    return FlagProbe.apply(output)


def probe_trainer_base():
    from ultralytics.models.yolo.detect import DetectionTrainer

    class ProbeTrainer(DetectionTrainer):
        first_batches: list[list[str]] = []

        def get_model(self, cfg=None, weights=None, verbose=True):
            model = super().get_model(cfg=cfg, weights=weights, verbose=verbose)
            model.model[0].register_forward_hook(_probe_hook)
            return model

        def preprocess_batch(self, batch):
            if not getattr(self, "_seen_first", False):
                self._seen_first = True
                ProbeTrainer.first_batches.append([Path(f).name for f in batch["im_file"]])
            return super().preprocess_batch(batch)

    return ProbeTrainer


@pytest.fixture
def probe_profile(tmp_path) -> Path:
    path = tmp_path / "probe.yaml"
    path.write_text(PROBE_PROFILE)
    return path


def test_phases_are_in_force_during_each_call_and_state_is_restored(tmp_path, demo_data, probe_profile):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    plugin = attach(model, probe_profile)
    assert attach(model, probe_profile) is plugin  # idempotent
    assert sum(1 for fns in model.callbacks.values() for f in fns if getattr(f, "__self__", None) is plugin) == len(
        plugin.callbacks
    )
    seen: dict[str, set] = {"train": set(), "val": set(), "deploy": set()}
    model.add_callback("on_train_batch_start", lambda t: seen["train"].add(flags()))
    model.add_callback("on_val_batch_start", lambda v: seen["val"].add(flags()))
    model.add_callback("on_predict_batch_start", lambda p: seen["deploy"].add(flags()))
    model.add_callback("on_export_start", lambda e: seen["deploy"].add(flags()))

    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own state, to be given back
    base = snapshot()
    model.train(data=demo_data, project=str(tmp_path), name="run", seed=0, **SMALL)
    assert snapshot() == base
    assert seen["train"] == {("strict", False, True)}
    assert seen["val"] == {("warn", False, False)}  # inside training and the final validation

    from ultralytics.utils import NUM_THREADS as ULTRALYTICS_THREADS  # what its select_device sets on a CPU

    seen["val"].clear()
    torch.set_num_threads(2 if ULTRALYTICS_THREADS != 2 else 3)  # the user's count, unlike Ultralytics' own
    base = snapshot()
    model.val(data=demo_data, imgsz=64, batch=8, device="cpu", plots=False, project=str(tmp_path), name="val")
    assert seen["val"] == {("warn", False, False)}
    # A validator or predictor Ultralytics builds sets its thread count before any callback (select_device, as
    # plain Ultralytics does); yolo-det leaves that count and gives back every flag it turned.
    assert torch.get_num_threads() == ULTRALYTICS_THREADS
    base = replace(base, intra_op_threads=ULTRALYTICS_THREADS)
    assert snapshot() == base

    image = next((Path(demo_data).parent / "demo" / "images" / "val").glob("*.png"))
    model.predict(str(image), imgsz=64, device="cpu", verbose=False)
    assert seen["deploy"] == {("off", True, False)}
    assert snapshot() == base
    list(model.predict(str(image), imgsz=64, device="cpu", verbose=False, stream=True))
    assert snapshot() == base

    seen["deploy"].clear()
    model.export(format="torchscript", imgsz=64, device="cpu")
    assert seen["deploy"] == {("off", True, False)}
    assert snapshot() == base

    record = json.loads((tmp_path / "run" / RECORD_NAME).read_text())
    assert record["status"] == "completed"
    assert record["profile"]["name"] == "probe"
    assert record["state_at_train_start"]["deterministic_algorithms"] == "strict"
    assert record["state_before"]["deterministic_algorithms"] == "warn"
    assert record["seeds"]["seed"] == 0
    assert record["seeds"]["rng_seed"] == 1
    assert record["weights"]["sha256"] == checkpoint_digest(tmp_path / "run" / "weights" / "last.pt")
    assert plugin.weights_digest == record["weights"]["sha256"]
    assert record["environment"]["torch"] == torch.__version__
    assert {e["phase"] for e in record["phase_events"]} == {"train", "val"}

    detach(model)
    assert not any(getattr(f, "__self__", None) is plugin for fns in model.callbacks.values() for f in fns)
    assert "train" not in model.__dict__


def test_exception_mid_training_restores_state_and_records_failure(tmp_path, demo_data):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    attach(model, "balanced")

    def explode(trainer):
        assert torch.are_deterministic_algorithms_enabled()  # the train phase is in force
        raise RuntimeError("injected failure")

    model.add_callback("on_train_batch_end", explode)
    base = snapshot()
    with pytest.raises(RuntimeError, match="injected failure"):
        model.train(data=demo_data, project=str(tmp_path), name="fail", **SMALL)
    assert snapshot() == base
    record = json.loads((tmp_path / "fail" / RECORD_NAME).read_text())
    assert record["status"] == "failed"
    assert "sha256" not in record["weights"]


def test_trainer_class_backward_flag_and_data_order(tmp_path, demo_data):
    """balanced: flag on in forward, off in backward, on again after; repro: on in both. Seeds drive data order."""
    from ultralytics import YOLO

    orders = {}
    for profile, seed, backward_flag in (("balanced", 0, False), ("repro", 0, True), ("repro", 1, True)):
        base_cls = probe_trainer_base()
        FlagProbe.log.clear()
        after_step: list[bool] = []
        model = YOLO("yolov8n.yaml")
        model.add_callback(
            "on_train_batch_end", lambda t, a=after_step: a.append(torch.are_deterministic_algorithms_enabled())
        )
        base = snapshot()
        model.train(
            trainer=trainer_class(profile, base=base_cls),
            data=demo_data,
            project=str(tmp_path),
            name=f"{profile}{seed}",
            seed=seed,
            **SMALL,
        )
        assert snapshot() == base
        forward = {flag for kind, flag in FlagProbe.log if kind == "forward"}
        backward = {flag for kind, flag in FlagProbe.log if kind == "backward"}
        assert forward == {True}, profile
        assert backward == {backward_flag}, profile
        assert set(after_step) == {True}, profile
        record = json.loads((tmp_path / f"{profile}{seed}" / RECORD_NAME).read_text())
        assert record["backward_toggles"] == (0 if backward_flag else len(after_step))
        assert len(base_cls.first_batches) == 1
        orders[(profile, seed)] = base_cls.first_batches[0]
    assert orders[("balanced", 0)] == orders[("repro", 0)]  # the same seed gives the same first batch
    assert orders[("repro", 1)] != orders[("repro", 0)]  # another seed, another order


def test_cli_train_twice_gives_the_same_weights_digest(trained_runs):
    digests = {}
    for run in (trained_runs.base(), trained_runs.twin(), trained_runs.other_seed()):
        out = trained_runs.output[run.name]
        line = next(li for li in out.splitlines() if li.startswith("weights digest: "))
        digests[run.name] = line.split()[2]
        assert len(digests[run.name]) == 64
        assert f"determinism record: {run / RECORD_NAME}" in out
        assert digests[run.name] == checkpoint_digest(run / "weights" / "last.pt")
    assert digests["seed0"] == digests["seed0-again"]
    assert digests["seed1"] != digests["seed0"]  # control: the weights the digest covers did change


def test_plugin_pickles_without_its_run_state():
    import pickle

    plugin = UltralyticsPlugin("balanced")
    plugin.begin_run()
    try:
        clone = pickle.loads(pickle.dumps(plugin))
    finally:
        plugin.end_run()
    assert clone.session is None
    assert clone.profile == plugin.profile
