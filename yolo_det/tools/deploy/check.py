"""``check-deploy``: does an image's prediction depend on what else is in its batch?

Length: one check: predicting, capturing the raw outputs, comparing them and the report that weighs the
evidence belong together; splitting them would spread one verdict over several files.

For every image of a folder, the detections (boxes, scores, classes after NMS) and the raw network outputs
predicted alone are the reference; they are compared with the same image predicted in batches of 2..N
(``batch=`` of ``predict``), next to images of other sizes, and, with a data YAML, the metrics of ``val``
at several ``batch=`` values are compared with each other. Each comparison gets a verdict: ``bitwise``
(every bit equal), ``within tolerance`` (same boxes and classes, differences at most ``atol``) or
``differs``; the report's verdict is the worst of them.

The model runs under a yolo-det profile (``repro`` by default, whose ``deploy`` phase is
``batch_invariant``), so the same command shows what the setting changes: run it with ``--profile
balanced`` to see the plain path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...core.detections import VERDICTS, compare_detections, compare_raw, tolerances
from ...core.detections import worst as _worst
from ...core.errors import ConfigError
from ...core.profiles import Profile, load_profile
from ..runtime import run_folder

__all__ = ["IMAGE_SUFFIXES", "VERDICTS", "DeployReport", "check_deploy", "compare_detections", "list_images"]

#: Files of an image folder that are predicted.
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")


def list_images(folder: str | os.PathLike[str], *, limit: int = 16) -> list[Path]:
    """The images of ``folder`` (by name, at most ``limit``).

    Raises:
        ConfigError: The folder does not exist or holds no image.
    """
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"image folder '{folder}' not found: give a folder of images")
    found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise ConfigError(f"no image in '{folder}' (looked for {', '.join(IMAGE_SUFFIXES)})")
    if limit < 1:
        raise ConfigError(f"--max-images must be at least 1, got {limit}")
    return found[:limit]


def _fold_raw(row: dict[str, Any]) -> None:
    """Let the raw outputs decide as well as the detections, under the one tolerance rule of
    :func:`yolo_det.core.detections.compare_raw`: other shapes or a value beyond it differ, a difference within it
    is at best "within tolerance"."""
    if row.get("raw_bitwise") is not False:
        return
    if not row.get("raw_within"):
        row["verdict"] = "differs"
    elif row["verdict"] == "bitwise":
        row["verdict"] = "within tolerance"


#: The verdict when the comparisons held nothing to compare (no detection anywhere, every val metric 0).
NOTHING = "nothing compared"


@dataclass
class DeployReport:
    """What ``check-deploy`` found (see :func:`check_deploy`)."""

    weights: str
    profile: str
    deploy_settings: dict[str, Any]
    val_settings: dict[str, Any]
    imgsz: int
    atol: float
    conf: float = 0.25
    images: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    val: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> dict[str, int]:
        """What the verdict rests on: images, comparisons, detections and raw output elements compared."""
        return {
            "images": len(self.images),
            "comparisons": len(self.comparisons),
            "detections": sum(int(c["count"][0]) + int(c["count"][1]) for c in self.comparisons),
            "raw_elements": sum(int(c.get("raw_elements") or 0) for c in self.comparisons),
        }

    @property
    def nothing_compared(self) -> list[str]:
        """Why an equality verdict would rest on nothing (empty when there is evidence), with what to do."""
        why = []
        if self.comparisons and not self.evidence["detections"]:
            why.append(
                f"no image has a detection at --conf {self.conf:g} (alone or in a batch): lower --conf "
                "(e.g. 0.001) or check a trained model"
            )
        if self.val is not None and self.val.get("all_zero"):
            why.append("every val metric is 0 at every batch=: check a trained model (or other --data)")
        return why

    @property
    def verdict(self) -> str:
        """The worst verdict of every comparison (predictions and val); "nothing compared" instead of an
        equality verdict that rests on no detection or on all-zero metrics."""
        verdicts = [c["verdict"] for c in self.comparisons]
        if self.val is not None:
            verdicts.append(self.val["verdict"])
        verdict = _worst(verdicts)
        if verdict != "differs" and self.nothing_compared:
            return NOTHING
        return verdict

    @property
    def parts(self) -> dict[str, str]:
        """The worst verdict of the comparisons whose input shape differed (``preprocessing``: the batch's
        letterbox) and of those on the same input (``numerics``: the kernels), each where there are any."""
        out: dict[str, list[str]] = {}
        for c in self.comparisons:
            out.setdefault(str(c.get("part", "numerics")), []).append(c["verdict"])
        return {part: _worst(v) for part, v in sorted(out.items(), key=lambda kv: kv[0] != "numerics")}

    @property
    def exit_code(self) -> int:
        """0 when bitwise or within tolerance, 1 when something differs, 3 when nothing was compared."""
        verdict = self.verdict
        return 1 if verdict == "differs" else 3 if verdict == NOTHING else 0

    def largest(self) -> dict[str, Any]:
        """The largest differences over every comparison (box, score, raw output)."""

        def top(key: str) -> dict[str, Any] | None:
            rows = [c for c in self.comparisons if c.get(key) is not None]
            if not rows:
                return None
            c = max(rows, key=lambda r: r[key])
            return {"value": c[key], "image": c["image"], "scenario": c["scenario"]}

        return {"box": top("max_box_diff"), "score": top("max_score_diff"), "raw": top("raw_max_diff")}

    def to_dict(self) -> dict[str, Any]:
        """The report as plain values (``--json``)."""
        return {
            "weights": self.weights,
            "profile": self.profile,
            "deploy_settings": self.deploy_settings,
            "val_settings": self.val_settings,
            "imgsz": self.imgsz,
            "atol": self.atol,
            "tolerances": tolerances(self.atol),
            "parts": self.parts,
            "images": self.images,
            "comparisons": self.comparisons,
            "val": self.val,
            "largest": self.largest(),
            "notes": self.notes,
            "conf": self.conf,
            "evidence": self.evidence,
            "nothing_compared": self.nothing_compared,
            "verdict": self.verdict,
        }

    def summary(self) -> str:
        """A few lines for a person: what changed where, and the verdict."""
        lines = [
            f"check-deploy: {len(self.images)} images, profile {self.profile} "
            f"(deploy batch_invariant={self.deploy_settings.get('batch_invariant')}), imgsz {self.imgsz}"
        ]
        by_scenario: dict[str, list[dict[str, Any]]] = {}
        for c in self.comparisons:
            by_scenario.setdefault(c["scenario"], []).append(c)
        for scenario, rows in by_scenario.items():
            bad = [r for r in rows if r["verdict"] != "bitwise"]
            worst = _worst([r["verdict"] for r in rows])
            text = f"  {scenario:<14} {worst:<16} {len(rows) - len(bad)}/{len(rows)} images bitwise"
            if bad:
                r = max(bad, key=lambda r: (r["max_box_diff"], r["max_score_diff"], abs(r["count"][0] - r["count"][1])))
                flips = r.get("class_flips") or []
                what = (
                    "class flip: " + ", ".join(f"row {i} class {a} -> {b} (same box)" for i, a, b in flips[:3])
                    if flips
                    else f"box {r['max_box_diff']:.4g} px, score {r['max_score_diff']:.3g}"
                )
                text += (
                    f"; largest: {r['image']} {what}, boxes {r['count'][0]}->{r['count'][1]}, "
                    f"changed rows {r['changed']} ({r.get('part', 'numerics')})"
                )
            lines.append(text)
        if self.val is not None:
            v = self.val
            largest = f" (largest metric difference {v['max_diff']:.4g} in {v['max_key']})" if v["max_key"] else ""
            lines.append(f"  val batch={','.join(str(b) for b in v['batches'])}: {v['verdict']}{largest}")
        lines.extend(f"  note: {n}" for n in self.notes)
        e = self.evidence
        lines.append(
            f"  compared: {e['images']} images, {e['comparisons']} comparisons, {e['detections']} detections, "
            f"{e['raw_elements']} raw output elements"
        )
        t = tolerances(self.atol)
        lines.append(
            f"  tolerance: boxes {t['box_px']} px, scores {t['score']}, raw outputs {t['raw_output']} (--atol)"
        )
        if self.verdict == NOTHING:
            lines.extend(f"  nothing compared: {why}" for why in self.nothing_compared)
        parts = self.parts
        split = ""
        if parts and self.verdict != NOTHING:
            word = {"preprocessing": "preprocessing (the batch's letterbox shape)", "numerics": "numerics (same input)"}
            split = " (" + "; ".join(f"{word.get(k, k)}: {v}" for k, v in parts.items()) + ")"
        lines.append(f"verdict: {self.verdict}{split}")
        return "\n".join(lines)


class _RawCapture:
    """Collects the network's raw output (the first 3-d tensor it returns) while a batch is predicted."""

    def __init__(self) -> None:
        self.armed = False
        self.rows: list[torch.Tensor] = []
        self.shapes: list[tuple[int, int]] = []
        self._handles: list[Any] = []
        self._hooked: set[int] = set()

    def hook(self, net: Any) -> None:
        """Watch ``net`` (the predictor's backend; once per object)."""
        if isinstance(net, torch.nn.Module) and id(net) not in self._hooked:
            self._hooked.add(id(net))
            self._handles += [net.register_forward_hook(self._hook), net.register_forward_pre_hook(self._pre)]

    @staticmethod
    def _first(out: Any) -> torch.Tensor | None:
        if isinstance(out, torch.Tensor):
            return out if out.dim() == 3 else None
        items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
        for item in items:
            found = _RawCapture._first(item)
            if found is not None:
                return found
        return None

    def _pre(self, module: Any, args: Any) -> None:
        if self.armed and args and isinstance(args[0], torch.Tensor):
            self.shapes.extend([tuple(args[0].shape[2:])] * args[0].shape[0])  # type: ignore[list-item]

    def _hook(self, module: Any, args: Any, out: Any) -> None:
        raw = self._first(out) if self.armed else None
        if raw is not None:
            self.rows.extend(raw.detach().cpu().clone().unbind(0))

    def take(self) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
        rows, shapes, self.rows, self.shapes = self.rows, self.shapes, [], []
        return rows, shapes

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _detections(result: Any) -> torch.Tensor:
    boxes = result.boxes
    if boxes is None:
        return torch.zeros(0, 6)
    return torch.cat([boxes.xyxy, boxes.conf[:, None], boxes.cls[:, None]], 1).detach().cpu()


def _load(weights: Any) -> Any:
    """An ``ultralytics.YOLO`` for ``weights`` (a YOLO object is used as it is; a checkpoint is scanned first)."""
    if hasattr(weights, "predict") and hasattr(weights, "callbacks"):
        return weights
    from ultralytics import YOLO

    from ...analysis.gate import check_arguments
    from ...core.errors import ModelError
    from ...core.untrusted.safeload import guarded_torch_load

    path = Path(str(weights)).expanduser()
    if not path.is_file():
        raise ConfigError(f"checkpoint '{weights}' not found: give a trained .pt file")
    check_arguments({"model": str(path)})  # the one gate: the allow-list and the paths the checkpoint stores
    try:
        with guarded_torch_load():  # what Ultralytics loads is what the allow-list made
            return YOLO(str(path))
    except Exception as e:  # Ultralytics raises anything for a file it cannot read
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(f"cannot load checkpoint '{weights}': {type(e).__name__}: {msg}") from None


def check_deploy(
    weights: Any,
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    profile: Profile | str = "repro",
    imgsz: int = 640,
    batches: Sequence[int] = (2, 4, 8),
    mixed: bool = True,
    data: str | None = None,
    val_batches: Sequence[int] = (1, 4, 16),
    conf: float = 0.25,
    atol: float = 1e-4,
    device: str = "cpu",
    max_images: int = 16,
) -> DeployReport:
    """Predict every image alone, in batches and next to other sizes, and compare (see the module docstring).

    Args:
        weights: A trained checkpoint (scanned before loading) or an ``ultralytics.YOLO``.
        images: A folder of images, or a list of image files.
        profile: The yolo-det profile the predictions run under.
        imgsz: ``imgsz`` of ``predict`` and ``val``.
        batches: The ``batch=`` values the images are predicted at (those above the image count are skipped).
        mixed: Also predict each image next to images of other sizes.
        data: A data YAML: compare ``val`` metrics at ``val_batches``.
        val_batches: The ``batch=`` values of ``val``.
        conf: Confidence threshold of the detections compared.
        atol: What "within tolerance" allows (pixels for boxes, absolute for scores).
        device: ``device`` of ``predict`` and ``val``.
        max_images: At most this many images of the folder.

    Raises:
        ConfigError: A bad argument (one line).
    """
    if not (hasattr(weights, "predict") or Path(str(weights)).expanduser().is_file()):
        raise ConfigError(f"checkpoint '{weights}' not found: give a trained .pt file")
    if isinstance(images, (str, os.PathLike)):
        files = list_images(images, limit=max_images)
    else:
        files = [Path(p) for p in images][:max_images]
        if not files:
            raise ConfigError("check-deploy needs at least one image")
    if any(int(b) < 1 for b in [*batches, *val_batches]):
        raise ConfigError("batch sizes must be at least 1")
    if not atol >= 0:
        raise ConfigError(f"--atol must be zero or more, got {atol}")
    resolved = load_profile(profile)
    model = _load(weights)
    import cv2

    from ...integrations.ultralytics import attach, detach

    shapes = []
    for f in files:
        im = cv2.imread(str(f))
        if im is None:
            raise ConfigError(f"cannot read image '{f}'")
        shapes.append(tuple(im.shape[:2]))
    report = DeployReport(
        weights=str(getattr(weights, "ckpt_path", None) or weights),
        profile=resolved.name,
        deploy_settings=resolved.deploy.to_dict(),
        val_settings=resolved.val.to_dict(),
        imgsz=int(imgsz),
        atol=float(atol),
        conf=float(conf),
    )
    capture = _RawCapture()
    was_attached = "_yolo_det_plugin" in model.__dict__
    attach(model, resolved, record=False)

    def arm(predictor: Any) -> None:
        capture.hook(getattr(predictor, "model", None))
        capture.armed = True

    def disarm(_: Any) -> None:
        capture.armed = False

    model.add_callback("on_predict_batch_start", arm)
    model.add_callback("on_predict_postprocess_end", disarm)
    try:
        with run_folder(None) as project:

            def predict(paths: list[Path], batch: int) -> tuple[list[torch.Tensor], list[Any], list[Any]]:
                results = model.predict(
                    [str(p) for p in paths],
                    imgsz=imgsz,
                    conf=conf,
                    batch=batch,
                    device=device,
                    verbose=False,
                    save=False,
                    project=project,
                )
                raw, inshape = capture.take()
                raw_list: list[Any] = list(raw) if len(raw) == len(paths) else [None] * len(paths)
                in_list: list[Any] = list(inshape) if len(inshape) == len(paths) else [None] * len(paths)
                return [_detections(r) for r in results], raw_list, in_list

            alone = [predict([f], 1) for f in files]
            for f, shape, (dets, _raw, ins) in zip(files, shapes, alone):
                report.images.append(
                    {
                        "image": f.name,
                        "shape": list(shape),
                        "input_shape": ins[0] and list(ins[0]),
                        "detections": len(dets[0]),
                    }
                )

            def compare(i: int, scenario: str, dets: torch.Tensor, raw: Any, ins: Any) -> None:
                row = {
                    "image": files[i].name,
                    "scenario": scenario,
                    **compare_detections(alone[i][0][0], dets, atol=atol, conf=conf),  # NMS at predict's iou (0.7)
                }
                row.update(compare_raw(alone[i][1][0], raw, atol))
                _fold_raw(row)
                row["input_shape"] = [list(alone[i][2][0] or ()), list(ins or ())]
                # another input shape is the preprocessing's doing; the same input computed otherwise, the numerics'
                row["part"] = "preprocessing" if row["input_shape"][0] != row["input_shape"][1] else "numerics"
                if row.get("raw_note") and row["verdict"] == "differs":
                    row.setdefault("cause", row["raw_note"])
                if row["input_shape"][0] != row["input_shape"][1] and row["verdict"] != "bitwise":
                    row["cause"] = (
                        f"letterbox: input {row['input_shape'][1]} here, {row['input_shape'][0]} alone "
                        "(the batch's shape, not the image's)"
                    )
                elif row["verdict"] != "bitwise":
                    row["cause"] = "kernels: the same input gives other numbers in this batch"
                report.comparisons.append(row)

            for n in batches:
                if n > len(files):
                    report.notes.append(f"batch={n} skipped: only {len(files)} images")
                    continue
                dets, raw, ins = predict(files, int(n))
                for i in range(len(files)):
                    compare(i, f"batch={n}", dets[i], raw[i], ins[i])
            if mixed:
                for i in range(len(files)):
                    others = [j for j in range(len(files)) if shapes[j] != shapes[i]][:2]
                    if not others:
                        continue
                    dets, raw, ins = predict([files[i], *(files[j] for j in others)], 1 + len(others))
                    compare(i, "mixed sizes", dets[0], raw[0], ins[0])
                if len(set(shapes)) == 1:
                    report.notes.append("mixed sizes skipped: every image has the same size")
            if data is not None:
                report.val = _val_at(
                    model, data, [int(b) for b in val_batches], imgsz=imgsz, device=device, project=project, atol=atol
                )
    finally:
        capture.close()
        for event, fn in (("on_predict_batch_start", arm), ("on_predict_postprocess_end", disarm)):
            if fn in model.callbacks.get(event, []):
                model.callbacks[event].remove(fn)
        if not was_attached:
            detach(model)
    return report


def _val_at(
    model: Any, data: str, batches: list[int], *, imgsz: int, device: str, project: str, atol: float
) -> dict[str, Any]:
    """``val`` metrics at each ``batch=``, compared with those at the first."""
    results: dict[int, dict[str, float]] = {}
    for b in batches:
        metrics = model.val(
            data=data,
            imgsz=imgsz,
            batch=b,
            device=device,
            workers=0,
            plots=False,
            verbose=False,
            project=project,
            name=f"val-b{b}",
            exist_ok=True,
        )
        results[b] = {k: float(v) for k, v in dict(metrics.results_dict).items()}
    ref = results[batches[0]]
    max_diff, max_key = 0.0, None
    for b in batches[1:]:
        for k, v in results[b].items():
            d = abs(v - ref.get(k, float("nan")))
            if not d <= max_diff:
                max_diff, max_key = d, f"{k} at batch={b}"
    equal = all(results[b] == ref for b in batches)
    verdict = "bitwise" if equal else "within tolerance" if max_diff <= atol else "differs"
    return {
        "batches": batches,
        "metrics": {str(b): results[b] for b in batches},
        "max_diff": max_diff,
        "max_key": max_key,
        "all_zero": all(v == 0 for b in batches for v in results[b].values()),
        "verdict": verdict,
    }
