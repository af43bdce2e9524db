"""Export parity: does an exported model give the PyTorch model's outputs, and if not, why?

After ``export()`` under yolo-det, :func:`export_parity` runs the exported file and the PyTorch model
(both through Ultralytics' ``AutoBackend``, as ``predict`` runs them) and measures two things:

- **numerics**: both models on the *same* preprocessed inputs (each image letterboxed to the export's
  input shape): the largest and mean absolute differences of the raw outputs, whether every raw output is
  within the stated tolerance (``atol`` plus :data:`~yolo_det.core.detections.BOX_RTOL` of its size, the rule
  boxes are held to), and whether the detections after NMS match (bitwise, within tolerance, or not);
- **preprocessing**: each image letterboxed the way ``predict`` letterboxes it for each model (a ``.pt``
  model gets a rectangular letterbox, a static export the square shape it was exported with, a dynamic one
  a rectangle again) and the detections compared in the image's own pixels. When these differ and the
  numerics do not, the cause is the preprocessing, and the record says which mismatch (``imgsz``,
  rectangular vs square letterbox, ``dynamic``).

The top-level ``verdict`` is the numerics' (does the export compute what the PyTorch model computes?);
``preprocessing.verdict`` says whether ``predict`` feeds both the same input, and ``summary`` says both in one
line with the tolerances (``tolerances``). A default ``.pt`` predict letterboxes to a rectangle and a static
export to a square, so a correct export reads "numerics within tolerance; preprocessing differs", never a
bare "differs".

:func:`write_export_record` writes the result next to the export as ``<export>.determinism.json``
(atomically), with the export's digest, the source weights' digest, the profile and its deploy settings.
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.detections import candidates, compare_detections, compare_raw, tolerances, worst
from ..core.errors import ConfigError
from ..core.fileio import atomic_write_json
from ..core.profiles import Profile, load_profile
from ..core.record import state_dict_digest

__all__ = ["EXPORT_RECORD_SUFFIX", "export_digest", "export_parity", "export_record_path", "write_export_record"]

#: The export record's name: the exported file's name plus this suffix.
EXPORT_RECORD_SUFFIX = ".determinism.json"
#: The record's kind and version (``kind`` tells it apart from a training run's ``determinism.json``).
KIND, VERSION = "export", 1


#: The parity verdict when no image had a detection: "detections match" over none would prove nothing.
NOTHING = "nothing compared"


def export_record_path(export: str | os.PathLike[str]) -> Path:
    """Where the record of ``export`` goes: ``<export>.determinism.json`` beside it."""
    p = Path(export)
    return p.with_name(p.name + EXPORT_RECORD_SUFFIX)


def export_digest(export: str | os.PathLike[str]) -> str:
    """SHA-256 of an exported file, or of a folder export (every file's relative path and bytes, in order)."""
    p = Path(export)
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        if p.is_dir():
            h.update(str(f.relative_to(p)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _file_digest(path: Any) -> str | None:
    try:
        return export_digest(path) if path and Path(str(path)).is_file() else None
    except OSError:
        return None


def _raw(out: Any) -> torch.Tensor:
    """The first 3-d tensor of a model's output (the detection head's ``(batch, 4 + classes, anchors)``)."""
    if isinstance(out, np.ndarray):
        out = torch.from_numpy(out)
    if isinstance(out, torch.Tensor) and out.dim() == 3:
        return out.float().cpu()
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
    for item in items:
        try:
            return _raw(item)
        except ValueError:
            continue
    raise ValueError("the model's output holds no (batch, channels, anchors) tensor")


def _nms(raw: torch.Tensor, conf: float, iou: float, end2end: bool) -> torch.Tensor:
    from ..core.compat import non_max_suppression

    kwargs = {"end2end": True} if end2end else {}
    return non_max_suppression(raw, conf, iou, **kwargs)[0][:, :6].cpu()


def _candidates(raw: torch.Tensor, conf: float, end2end: bool) -> torch.Tensor | None:
    """What NMS starts from for the first image of ``raw`` (None for an end-to-end head, whose output is final)."""
    return None if end2end else candidates(raw[0], conf).float()


def _letterbox(image: np.ndarray, shape: Sequence[int], *, auto: bool, stride: int) -> torch.Tensor:
    """``image`` (BGR, HWC) letterboxed as Ultralytics' predictor does, as a (1, 3, h, w) float tensor."""
    from ..core.compat import LetterBox

    boxed: Any = LetterBox((int(shape[0]), int(shape[1])), auto=auto, stride=stride)(image=image)
    x = torch.from_numpy(np.ascontiguousarray(boxed[..., ::-1].transpose(2, 0, 1))).float() / 255
    return x.unsqueeze(0)


def _as_hw(imgsz: Any) -> tuple[int, int]:
    if isinstance(imgsz, (list, tuple)):
        return (int(imgsz[0]), int(imgsz[-1]))
    return (int(imgsz), int(imgsz))


def _read_images(images: Sequence[Any] | None) -> list[tuple[str, np.ndarray]]:
    import cv2

    if images is None:
        from ..core.compat import ASSETS

        images = sorted(Path(ASSETS).glob("*.jpg"))
    out: list[tuple[str, np.ndarray]] = []
    for item in images:
        if isinstance(item, np.ndarray):
            out.append((f"array{len(out)}", item))
            continue
        im = cv2.imread(str(item))
        if im is None:
            raise ConfigError(f"cannot read image '{item}' for the export parity check")
        out.append((Path(str(item)).name, im))
    if not out:
        raise ConfigError("the export parity check needs at least one image")
    return out


def export_parity(
    model: Any,
    export: str | os.PathLike[str],
    *,
    images: Sequence[Any] | None = None,
    pt_imgsz: Any = None,
    pt_rect: bool = True,
    conf: float = 0.001,
    iou: float = 0.7,
    atol: float = 1e-4,
) -> dict[str, Any]:
    """Compare an exported model with the PyTorch model it came from (see the module docstring).

    Args:
        model: The PyTorch model (an ``ultralytics.YOLO`` or its ``nn.Module``).
        export: The exported file (or folder) as ``export()`` returned it.
        images: Image files or BGR arrays to run (default: the images shipped with Ultralytics).
        pt_imgsz: ``imgsz`` the PyTorch model predicts at (default: the export's).
        pt_rect: Whether ``predict`` letterboxes the PyTorch model's input to a rectangle (Ultralytics' default
            for ``.pt`` models); False for a square letterbox.
        conf: Confidence threshold of the detections compared.
        iou: NMS IoU threshold.
        atol: What "within tolerance" allows: for scores, and for boxes and raw outputs on top of ``BOX_RTOL`` of
            their size (:func:`yolo_det.core.detections.tolerances`).

    Returns:
        ``numerics`` (with its ``verdict``), ``preprocessing`` (with its ``verdict``), ``verdict`` (the numerics'),
        ``summary`` (both in one line, with ``tolerances``), ``evidence`` (images, detections and raw output elements
        compared), ``nothing_compared`` (why there was no evidence) and ``cause`` (None when the detections
        match). With no detection on any image the verdict is "nothing compared" and ``detections_match`` None.
    """
    from ..core.compat import AutoBackend, ops

    net = getattr(model, "model", model)
    if not isinstance(net, torch.nn.Module):
        raise ConfigError(f"export parity needs a PyTorch model, got {type(model).__name__}")
    exported = AutoBackend(str(export), device=torch.device("cpu"), fuse=True, verbose=False)
    was_training = net.training
    meta = dict(getattr(exported, "metadata", None) or {})
    net_stride = getattr(net, "stride", None)
    net_stride = int(net_stride.max()) if isinstance(net_stride, torch.Tensor) else int(net_stride or 32)
    stride = max(int(getattr(exported, "stride", 32) or 32), net_stride)
    ex_shape = _as_hw(meta.get("imgsz", getattr(exported, "imgsz", 640)))
    dynamic = bool(meta.get("dynamic", False))
    end2end = bool(meta.get("end2end", False)) or bool(getattr(net, "end2end", False))
    pt_shape = _as_hw(pt_imgsz if pt_imgsz is not None else ex_shape)
    loaded = _read_images(images)
    numerics: list[dict[str, Any]] = []
    end_to_end: list[dict[str, Any]] = []
    max_raw, sum_raw, count_raw, raw_bitwise, raw_within = 0.0, 0.0, 0, True, True
    try:
        reference = AutoBackend(net, device=torch.device("cpu"), fuse=True, verbose=False).eval()  # as predict runs it
        exported.eval()
        with torch.inference_mode():
            for name, image in loaded:
                x = _letterbox(image, ex_shape, auto=False, stride=stride)  # what the export takes
                a = _raw(reference(x))
                b = _raw(exported(x))[: x.shape[0]]  # a static-batch export pads a short batch
                diff = (a.double() - b.double()).abs()
                max_raw = max(max_raw, float(diff.max()))
                sum_raw += float(diff.sum())
                count_raw += diff.numel()
                raw_bitwise = raw_bitwise and bool(torch.equal(a, b))
                raw = compare_raw(a, b, atol)
                raw_within = raw_within and bool(raw["raw_within"])
                numerics.append(
                    {
                        "image": name,
                        "input_shape": list(x.shape[2:]),
                        "raw_max_diff": float(diff.max()),
                        "raw_within": raw["raw_within"],
                        **compare_detections(
                            _nms(a, conf, iou, end2end),
                            _nms(b, conf, iou, end2end),
                            atol=atol,
                            conf=conf,
                            iou=iou,
                            ref_candidates=_candidates(a, conf, end2end),
                            got_candidates=_candidates(b, conf, end2end),
                        ),
                    }
                )
                # each model as predict would feed it, detections in the image's own pixels
                xp = _letterbox(image, pt_shape, auto=pt_rect, stride=stride)
                xe = _letterbox(image, ex_shape, auto=dynamic, stride=stride)
                rp, re_ = _raw(reference(xp)), _raw(exported(xe))[:1]
                dp, de = _nms(rp, conf, iou, end2end), _nms(re_, conf, iou, end2end)
                cp, ce = _candidates(rp, conf, end2end), _candidates(re_, conf, end2end)
                for dets, cands, inp in ((dp, cp, xp), (de, ce, xe)):
                    dets[:, :4] = _scaled(ops, inp, dets, image)
                    if cands is not None:
                        cands[:, :4] = _scaled(ops, inp, cands, image)
                end_to_end.append(
                    {
                        "image": name,
                        "shape": list(image.shape[:2]),
                        "pytorch_input": list(xp.shape[2:]),
                        "export_input": list(xe.shape[2:]),
                        **compare_detections(
                            dp, de, atol=atol, conf=conf, iou=iou, ref_candidates=cp, got_candidates=ce
                        ),
                    }
                )
    finally:
        net.train(was_training)
    mismatches = _mismatches(pt_shape, ex_shape, pt_rect, dynamic, end_to_end)
    detections_verdict = worst(n["verdict"] for n in numerics)
    raw_verdict = "bitwise" if raw_bitwise else "within tolerance" if raw_within else "differs"
    numeric_verdict = worst([detections_verdict, raw_verdict])
    e2e_verdict = worst(e["verdict"] for e in end_to_end)
    cause = None
    if numeric_verdict == "differs":
        cause = "numerics: the export computes other outputs from the same input"
        if detections_verdict != "differs":
            cause += f" (raw outputs beyond the tolerance: largest difference {max_raw:.3g})"
        if mismatches:
            cause += "; and preprocessing: " + "; ".join(mismatches)
    elif e2e_verdict == "differs":
        cause = ("preprocessing: " + "; ".join(mismatches)) if mismatches else "preprocessing"
    evidence = {
        "images": len(loaded),
        "detections": sum(int(r["count"][0]) + int(r["count"][1]) for r in numerics),
        "preprocessing_detections": sum(int(r["count"][0]) + int(r["count"][1]) for r in end_to_end),
        "raw_elements": count_raw,
    }
    verdict = numeric_verdict  # the export's own parity; the preprocessing has its verdict beside it
    nothing = []
    if verdict != "differs" and not evidence["detections"] and not evidence["preprocessing_detections"]:
        nothing.append(
            f"no detection on any of the {len(loaded)} images at conf {conf:g} (either model): lower conf "
            "(e.g. 0.001) or check a trained model"
        )
        verdict = NOTHING
    stated = tolerances(atol)
    summary = (
        f"numerics {verdict} (raw outputs {stated['raw_output']}, boxes {stated['box_px']} px, scores "
        f"{stated['score']}); preprocessing {'the same input' if e2e_verdict != 'differs' else 'differs'}"
        + (f": {'; '.join(mismatches)}" if e2e_verdict == "differs" and mismatches else "")
    )
    return {
        "numerics": {
            "verdict": numeric_verdict,
            "raw_max_abs_diff": max_raw,
            "raw_mean_abs_diff": sum_raw / max(count_raw, 1),
            "raw_bitwise": raw_bitwise,
            "raw_within": raw_within,
            "raw": raw_verdict,
            "detections": detections_verdict,
            "detections_match": None if nothing else detections_verdict != "differs",
            "images": numerics,
        },
        "preprocessing": {
            "pytorch": {"imgsz": list(pt_shape), "letterbox": "rectangular" if pt_rect else "square"},
            "export": {
                "imgsz": list(ex_shape),
                "dynamic": dynamic,
                "letterbox": "rectangular" if dynamic else "square",
                "batch": int(meta.get("batch", 1) or 1),
            },
            "mismatches": mismatches,
            "verdict": e2e_verdict,
            "detections": e2e_verdict,
            "images": end_to_end,
        },
        "verdict": verdict,
        "summary": summary,
        "tolerances": stated,
        "evidence": evidence,
        "nothing_compared": nothing,
        "cause": cause,
        "atol": atol,
        "conf": conf,
    }


def _scaled(ops: Any, x: torch.Tensor, dets: torch.Tensor, image: np.ndarray) -> Any:
    """``dets``' boxes from the letterboxed input ``x`` back to ``image``'s pixels."""
    return ops.scale_boxes((int(x.shape[2]), int(x.shape[3])), dets[:, :4].clone(), image.shape[:2])


def _mismatches(
    pt_shape: tuple[int, int], ex_shape: tuple[int, int], pt_rect: bool, dynamic: bool, end_to_end: list[dict[str, Any]]
) -> list[str]:
    out = []
    if pt_shape != ex_shape:
        out.append(
            f"imgsz: the PyTorch model predicts at {pt_shape[0]}x{pt_shape[1]}, the export takes "
            f"{ex_shape[0]}x{ex_shape[1]}"
        )
    if pt_rect and not dynamic:
        shaped = [
            e
            for e in end_to_end
            if e["pytorch_input"] != e["export_input"] and e["pytorch_input"][0] != e["pytorch_input"][1]
        ]
        if shaped:
            e = shaped[0]
            out.append(
                f"letterbox: rectangular {e['pytorch_input'][0]}x{e['pytorch_input'][1]} for the PyTorch model, "
                f"square {e['export_input'][0]}x{e['export_input'][1]} for the static export ({e['image']}); "
                "export with dynamic=True or predict the .pt with rect=False to match"
            )
    elif not pt_rect and dynamic:
        out.append("dynamic: the export letterboxes to a rectangle, the PyTorch model to a square")
    return out


def write_export_record(
    model: Any,
    export: str | os.PathLike[str],
    *,
    profile: Profile | str,
    images: Sequence[Any] | None = None,
    pt_imgsz: Any = None,
    pt_rect: bool = True,
    conf: float = 0.001,
    atol: float = 1e-4,
) -> Path:
    """Measure :func:`export_parity` and write the export record beside the export; return its path.

    The record: ``kind`` (``export``), ``version``, ``export`` (file, format, sha256), ``weights`` (file, sha256
    of the source checkpoint, ``state_sha256`` of the model's parameters and buffers), ``profile`` (name and
    settings per phase), ``deploy_settings`` (the deploy phase in force), ``parity`` (:func:`export_parity`)
    and ``environment`` (versions).
    """
    resolved = load_profile(profile)
    path = Path(export)
    net = getattr(model, "model", model)
    weights_file = getattr(model, "ckpt_path", None)
    try:
        parity = export_parity(model, path, images=images, pt_imgsz=pt_imgsz, pt_rect=pt_rect, conf=conf, atol=atol)
        error = None
    except Exception as e:  # the export stands; the record says why it could not be checked
        parity, error = None, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    record = {
        "kind": KIND,
        "version": VERSION,
        "export": {"file": path.name, "format": _format_of(path), "sha256": export_digest(path)},
        "weights": {
            "file": str(weights_file) if weights_file else None,
            "sha256": _file_digest(weights_file),
            "state_sha256": state_dict_digest(net) if isinstance(net, torch.nn.Module) else None,
        },
        "profile": resolved.to_dict(),
        "deploy_settings": resolved.deploy.to_dict(),
        "parity": parity,
        "error": error,
        "environment": _versions(),
    }
    return atomic_write_json(export_record_path(path), record)


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    return {
        "pt": "pytorch",
        "torchscript": "torchscript",
        "onnx": "onnx",
        "engine": "engine",
        "mlpackage": "coreml",
        "tflite": "tflite",
        "pb": "pb",
    }.get(suffix, "openvino" if path.name.endswith("openvino_model") else suffix or path.name)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    for name in ("ultralytics", "onnx", "onnxruntime"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # not installed
            out[name] = None
    return out
