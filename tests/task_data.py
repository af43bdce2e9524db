"""Tiny synthetic datasets for every Ultralytics task (detect, segment, pose, obb, classify), made in a test.

Each image is a 64x64 noisy background with one filled rectangle; the labels describe that rectangle in the
format of the task. A pure function of the seed, so two calls give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

SIZE = 64
NAMES = {0: "a", 1: "b"}
#: task -> a model YAML Ultralytics ships for it
TASK_MODELS = {
    "detect": "yolov8n.yaml",
    "segment": "yolov8n-seg.yaml",
    "pose": "yolov8n-pose.yaml",
    "obb": "yolov8n-obb.yaml",
    "classify": "yolov8n-cls.yaml",
}


def _image(rng: np.random.Generator) -> tuple[np.ndarray, int, tuple[int, int, int, int]]:
    img = rng.integers(0, 40, size=(SIZE, SIZE, 3)).astype(np.uint8)
    cls = int(rng.integers(0, 2))
    w, h = (int(v) for v in rng.integers(16, 32, size=2))
    x0, y0 = int(rng.integers(2, SIZE - w - 2)), int(rng.integers(2, SIZE - h - 2))
    colour = (200, 60, 60) if cls == 0 else (60, 200, 60)
    cv2.rectangle(img, (x0, y0), (x0 + w, y0 + h), colour, thickness=-1)
    return img, cls, (x0, y0, x0 + w, y0 + h)


def _label(task: str, cls: int, box: tuple[int, int, int, int]) -> str:
    x0, y0, x1, y1 = (v / SIZE for v in box)
    xc, yc, w, h = (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0
    corners = [x0, y0, x1, y0, x1, y1, x0, y1]
    if task == "detect":
        values = [xc, yc, w, h]
    elif task in ("segment", "obb"):
        values = corners
    elif task == "pose":
        values = [xc, yc, w, h] + [v for i in range(4) for v in (corners[2 * i], corners[2 * i + 1], 2.0)]
    else:  # pragma: no cover - classify has no label files
        raise ValueError(task)
    return f"{cls} " + " ".join(f"{v:.6f}" for v in values) + "\n"


def make_dataset(root: Path, task: str, n: int = 8, seed: int = 0) -> str:
    """Write an ``n``-image dataset for ``task`` under ``root``; return what ``data=`` takes (YAML or folder)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    if task == "classify":
        for split in ("train", "val"):
            for i in range(n):
                img, cls, _ = _image(rng)
                folder = root / split / NAMES[cls]
                folder.mkdir(parents=True, exist_ok=True)
                cv2.imwrite(str(folder / f"{i:03d}.png"), img)
            for name in NAMES.values():  # every class needs a folder in every split
                (root / split / name).mkdir(parents=True, exist_ok=True)
                if not any((root / split / name).iterdir()):
                    img, _, _ = _image(rng)
                    cv2.imwrite(str(root / split / name / "extra.png"), img)
        return str(root)
    (root / "images").mkdir(exist_ok=True)
    (root / "labels").mkdir(exist_ok=True)
    for i in range(n):
        img, cls, box = _image(rng)
        cv2.imwrite(str(root / "images" / f"{i:03d}.png"), img)
        (root / "labels" / f"{i:03d}.txt").write_text(_label(task, cls, box))
    extra = "kpt_shape: [4, 3]\nflip_idx: [1, 0, 3, 2]\n" if task == "pose" else ""
    yaml_path = root / "data.yaml"
    yaml_path.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n  0: a\n  1: b\n{extra}")
    return str(yaml_path)
