"""``batch_invariant``: an image's detections do not depend on its batch, in predict and in val."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from helpers import DEMO
from yolo_det import attach
from yolo_det.core.detections import BOX_RTOL, compare_detections
from yolo_det.core.errors import ProfileError
from yolo_det.core.profiles import load_profile
from yolo_det.integrations.ultralytics.batch_invariance import BatchInvariance, concat_outputs, per_image
from yolo_det.session.extensions import PhaseContext, default_extensions


def _profile(tmp_path: Path, on: bool, phase: str = "deploy") -> Path:
    path = tmp_path / f"bi-{phase}-{on}.yaml"
    path.write_text(f"name: bi\nextends: balanced\n{phase}:\n  batch_invariant: {str(on).lower()}\n", encoding="utf-8")
    return path


def test_the_setting_is_in_the_schema_and_on_in_repro_deploy(tmp_path) -> None:
    repro = load_profile("repro")
    assert repro.deploy.extra["batch_invariant"] is True
    assert repro.val.extra["batch_invariant"] is False
    assert repro.train.extra["batch_invariant"] is False
    assert load_profile(_profile(tmp_path, True, "val")).val.to_dict()["batch_invariant"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("deploy:\n  batch_invariant: 1\n", encoding="utf-8")
    with pytest.raises(ProfileError, match=r"bad\.yaml:2: .*'batch_invariant' must be true or false, got 1"):
        load_profile(bad)


def test_per_image_gives_each_image_the_result_of_a_batch_of_one() -> None:
    def mixing(x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:  # depends on the whole batch
        return x - x.mean(0, keepdim=True) + 10 * x.shape[0], [x * 2]

    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    plain, wrapped = mixing(x), per_image(mixing)(x)
    alone = [mixing(x[i : i + 1]) for i in range(4)]
    assert not torch.equal(plain[0][1:2], alone[1][0])  # the batch changes the plain result
    for i in range(4):
        assert torch.equal(wrapped[0][i : i + 1], alone[i][0])
        assert torch.equal(wrapped[1][0][i : i + 1], alone[i][1][0])
    assert concat_outputs([{"a": torch.ones(1, 2), "n": None}] * 3)["a"].shape == (3, 2)


class _Predictor:
    def inference(self, im):
        return im

    def pre_transform(self, im):
        return im


def test_the_ultralytics_plugin_registers_the_extension_in_every_session() -> None:
    # the session knows no framework: the extension is the integration's, added through the extension point
    import yolo_det.integrations.ultralytics  # noqa: F401

    assert [e.name for e in default_extensions()][-1:] == ["batch_invariant"]
    assert isinstance(default_extensions()[-1], BatchInvariance)


def test_hand_over_and_undo_leave_the_users_attributes(tmp_path) -> None:
    ext = BatchInvariance()
    on = load_profile(_profile(tmp_path, True))
    predictor = _Predictor()
    own = lambda im: im  # noqa: E731 - the user's own instance attribute
    predictor.pre_transform = own
    ctx = PhaseContext(None, "deploy", on.deploy)
    token = ext.hand_over(ctx, "predictor", predictor)
    assert predictor.pre_transform is not own
    assert predictor.inference.__wrapped__.__func__ is _Predictor.inference
    assert ext.hand_over(ctx, "predictor", predictor) is None  # already in force
    ext.undo(token)
    assert predictor.__dict__ == {"pre_transform": own}
    off = PhaseContext(None, "deploy", load_profile(_profile(tmp_path, False)).deploy)
    assert ext.hand_over(off, "predictor", predictor) is None
    assert ext.hand_over(ctx, "model", predictor) is None


# -------------------------------------------------------------------------------------------------------
# Ultralytics, end to end


def _images(folder: Path) -> dict[str, Path]:
    """Demo images of three shapes: square 96x96, tall 96x200 (w x h), wide 220x96."""
    folder.mkdir(parents=True, exist_ok=True)
    src = sorted((DEMO / "images" / "val").glob("*.*"))
    out = {}
    for i, p in enumerate(src[:8]):
        im = cv2.imread(str(p))
        size = [None, (96, 200), (220, 96)][i % 3]
        out[f"{i}"] = folder / f"im{i}.png"
        cv2.imwrite(str(out[f"{i}"]), im if size is None else cv2.resize(im, size))
    return out


def _detections(result) -> torch.Tensor:
    b = result.boxes
    return torch.cat([b.xyxy, b.conf[:, None], b.cls[:, None]], 1)


def _predict(model, paths: list[Path], batch: int) -> list[torch.Tensor]:
    results = model.predict([str(p) for p in paths], imgsz=160, conf=0.0, batch=batch, device="cpu", verbose=False)
    return [_detections(r) for r in results]


@pytest.fixture(scope="module")
def fresh_model():
    from ultralytics import YOLO

    torch.manual_seed(0)
    return YOLO("yolov8n.yaml")


@pytest.fixture
def two_threads(monkeypatch):
    """Predict with 2 intra-op threads on any machine (Ultralytics sets ``min(8, cpus - 1)``: 1 on a 2-core one)."""
    import ultralytics.utils.torch_utils as tu

    before = torch.get_num_threads()
    monkeypatch.setattr(tu, "NUM_THREADS", 2)
    try:
        yield 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # more than 2 s
def test_predictions_do_not_depend_on_the_batch_under_the_setting(tmp_path, fresh_model, two_threads) -> None:
    ims = _images(tmp_path / "images")
    tall, wide, square = ims["1"], ims["2"], ims["0"]
    others = [ims[k] for k in ("3", "4", "5", "6", "7")]

    attach(fresh_model, _profile(tmp_path, False))
    alone_off = _predict(fresh_model, [tall], 1)[0]
    mixed_off = _predict(fresh_model, [tall, square, wide], 3)[0]
    assert alone_off.shape[0] > 0
    assert alone_off.shape != mixed_off.shape or not torch.equal(alone_off, mixed_off), (
        "negative control: with the setting off, an image next to other sizes gets other detections"
    )
    assert torch.get_num_threads() == two_threads  # the predictor ran with more than one thread
    # Same-size neighbours give the same input; with more than one thread oneDNN's convolutions may split the
    # work by the batch, so the plain path agrees within float32 roundings only (bit-identical at 1 thread).
    # Boxes are decoded as differences of coordinates up to the image's size (x1 = cx - w/2 may be near 0):
    # a few float32 roundings of that size, in pixels; scores a few roundings of the largest score.
    box_atol = BOX_RTOL * max(cv2.imread(str(tall)).shape[:2])
    same_off = _predict(fresh_model, [tall, ims["4"], ims["7"]], 3)[0]
    plain = compare_detections(alone_off, same_off, atol=box_atol, conf=0.0)
    assert plain["verdict"] != "differs", plain
    assert plain["max_score_diff"] <= BOX_RTOL * float(alone_off[:, 4].max()), plain

    attach(fresh_model, _profile(tmp_path, True))
    alone = _predict(fresh_model, [tall], 1)[0]
    alone_wide = _predict(fresh_model, [wide], 1)[0]
    assert alone.shape[0] > 0
    assert not torch.equal(alone, alone_off)
    for n in (2, 4, 8):
        batch = [tall, wide, *others][:n]
        got = _predict(fresh_model, batch, n)
        assert torch.equal(got[0], alone), n
        assert torch.equal(got[1], alone_wide), n
    same = _predict(fresh_model, [tall, ims["4"], ims["7"]], 3)  # same-size neighbours: bit for bit as well
    assert torch.equal(same[0], alone)
    mixed = _predict(fresh_model, [square, wide, tall], 2)  # batches of 2 of another order
    assert torch.equal(mixed[2], alone)
    assert torch.equal(mixed[1], alone_wide)
    assert "inference" not in fresh_model.predictor.__dict__  # taken away when the prediction ended


def test_the_setting_hides_kernels_that_depend_on_the_batch(tmp_path, fresh_model) -> None:
    """A first layer whose numbers change with the batch size, as cuDNN's (or multithreaded oneDNN's) kernel choice
    does: the plain path passes it on to same-size neighbours; under the setting each image sees a batch of one."""
    ims = _images(tmp_path / "images")
    batch = [ims["1"], ims["4"], ims["7"]]  # same size: one letterbox on both paths
    # The predictor runs a copy of the model made when it is built: build it after the hook, and drop the hooked
    # copy afterwards (an earlier test's predictor would run without the hook: the control would hold at one thread).
    fresh_model.predictor = None
    by_batch = fresh_model.model.model[0].register_forward_hook(lambda m, i, out: out + 1e-2 * (out.shape[0] - 1))
    try:
        attach(fresh_model, _profile(tmp_path, False))
        alone_off, same_off = _predict(fresh_model, batch[:1], 1)[0], _predict(fresh_model, batch, 3)[0]
        assert alone_off.shape != same_off.shape or not torch.equal(alone_off, same_off), "negative control"
        attach(fresh_model, _profile(tmp_path, True))
        alone, same = _predict(fresh_model, batch[:1], 1)[0], _predict(fresh_model, batch, 3)
    finally:
        by_batch.remove()
        fresh_model.predictor = None
    assert alone.shape[0] > 0
    assert torch.equal(same[0], alone)


def _val_set(root: Path) -> Path:
    """The demo val split with a third of its images tall and a third wide (labels are relative: unchanged)."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    shutil.copytree(DEMO / "labels" / "val", labels)
    for i, p in enumerate(sorted((DEMO / "images" / "val").glob("*.*"))):
        size = [None, (96, 200), (220, 96)][i % 3]
        im = cv2.imread(str(p))
        cv2.imwrite(str(images / p.name), im if size is None else cv2.resize(im, size))
    data = root / "data.yaml"
    data.write_text(
        f"path: {root}\ntrain: images/val\nval: images/val\nnames: {{0: circle, 1: square, 2: triangle}}\n",
        encoding="utf-8",
    )
    return data


def _val(model, data: Path, batch: int, out: Path) -> tuple[dict, dict]:
    """Metrics and every prediction's score, class and true-positive row, image by image (as ``val`` gathered them)."""
    seen: dict = {}

    def grab(validator) -> None:  # after each batch: everything gathered so far
        seen.update({k: np.concatenate(v) if v else np.zeros(0) for k, v in validator.metrics.stats.items()})

    model.add_callback("on_val_batch_end", grab)
    try:
        metrics = model.val(
            data=str(data),
            imgsz=96,
            batch=batch,
            conf=0.0,
            device="cpu",
            workers=0,
            plots=False,
            verbose=False,
            project=str(out),
            name=f"b{batch}",
            exist_ok=True,
        )
    finally:
        model.callbacks["on_val_batch_end"].remove(grab)
    return dict(metrics.results_dict), seen


def _same(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.slow
def test_val_metrics_do_not_depend_on_batch_under_the_setting(tmp_path, fresh_model) -> None:
    data = _val_set(tmp_path / "mixed")
    attach(fresh_model, _profile(tmp_path, False, "val"))
    off1, off16 = _val(fresh_model, data, 1, tmp_path / "off"), _val(fresh_model, data, 16, tmp_path / "off")
    assert len(off1[1]["conf"]) > 0
    assert not _same(off1, off16), "negative control: rectangular val batches change the predictions"
    attach(fresh_model, _profile(tmp_path, True, "val"))
    on = {b: _val(fresh_model, data, b, tmp_path / "on") for b in (1, 4, 16)}
    assert len(on[1][1]["conf"]) > 0
    assert _same(on[1], on[4])
    assert _same(on[1], on[16])
    assert not _same(on[1], off1)  # per-image square letterbox, not the rectangle of batch 1
