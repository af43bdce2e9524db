"""The demo dataset: a run that works without internet or data of one's own.

The demo dataset is tiny on purpose: 48 training and 16 validation images of 96x96 pixels with
coloured circles, squares and triangles on noisy backgrounds (three classes), so a YOLO model trains
on it on a CPU in seconds. The images are a pure function of the seed; a source checkout ships them
in ``data/demo`` (regenerate with ``python -m yolo_det.tools.demo``), and an installed package generates
them once into the user cache (``~/.cache/yolo-det/demo``, or ``$YOLO_DET_CACHE``), never into
``site-packages``. Files are created with the usual modes (``0o666`` less the umask).

The local font that keeps Ultralytics and YOLOv5 from downloading one is in
:mod:`yolo_det.integrations.fonts`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path

import cv2
import numpy as np

from ..core.fileio import atomic_write_bytes

__all__ = [
    "CLASSES",
    "cache_dir",
    "default_demo_folder",
    "demo_data_yaml",
    "generate",
    "iter_samples",
    "main",
    "make_image",
]

CLASSES = ("circle", "square", "triangle")
IMGSZ = 96
N_TRAIN = 48
N_VAL = 16
_REPO_DATA = Path(__file__).resolve().parents[2] / "data"
_YAML = """# yolo-det demo dataset: {n_train} train / {n_val} val images of {imgsz}x{imgsz} synthetic shapes.
# Regenerate with `python -m yolo_det.tools.demo`. Paths are relative to this file's folder.
train: {folder}/images/train
val: {folder}/images/val
names:
  0: circle
  1: square
  2: triangle
"""


def _draw_shape(img: np.ndarray, rng: np.random.Generator, cls: int) -> tuple[float, float, float, float]:
    """Draw one shape of class ``cls`` and return its YOLO box (xc, yc, w, h), normalised."""
    h, w = img.shape[:2]
    size = int(rng.integers(16, 36))
    x0 = int(rng.integers(2, w - size - 2))
    y0 = int(rng.integers(2, h - size - 2))
    colour = tuple(int(c) for c in rng.integers(40, 255, size=3))
    if cls == 0:
        r = size // 2
        cv2.circle(img, (x0 + r, y0 + r), r, colour, thickness=-1, lineType=cv2.LINE_8)
        x1, y1 = x0 + 2 * r, y0 + 2 * r
    elif cls == 1:
        cv2.rectangle(img, (x0, y0), (x0 + size, y0 + size), colour, thickness=-1)
        x1, y1 = x0 + size, y0 + size
    else:
        pts = np.array([[x0 + size // 2, y0], [x0, y0 + size], [x0 + size, y0 + size]], dtype=np.int32)
        cv2.fillPoly(img, [pts], colour, lineType=cv2.LINE_8)
        x1, y1 = x0 + size, y0 + size
    return ((x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h)


def make_image(rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    """Return one BGR image and its YOLO label lines."""
    base = rng.integers(0, 60, size=3)
    img = (rng.integers(0, 30, size=(IMGSZ, IMGSZ, 3)) + base).clip(0, 255).astype(np.uint8)
    lines = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, len(CLASSES)))
        xc, yc, bw, bh = _draw_shape(img, rng, cls)
        lines.append(f"{cls} {xc:.6f} {yc:.6f} {bw:.6f} {bh:.6f}")
    return img, lines


def iter_samples(
    *, n_train: int = N_TRAIN, n_val: int = N_VAL, seed: int = 0
) -> Iterable[tuple[str, str, np.ndarray, list[str]]]:
    """Yield ``(split, stem, image, label_lines)`` for every sample of the dataset."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            img, lines = make_image(rng)
            yield split, f"{split}_{i:03d}", img, lines


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)


def _source_checkout() -> bool:
    """Whether this package runs from a source checkout (``data/`` beside the package is the project's own)."""
    root = _REPO_DATA.parent
    return (root / "pyproject.toml").is_file() and (root / "yolo_det").is_dir() and _REPO_DATA.is_dir()


def cache_dir() -> Path:
    """Where an installed package keeps generated files: ``$YOLO_DET_CACHE``, else ``~/.cache/yolo-det``
    (``$XDG_CACHE_HOME/yolo-det`` when that is set)."""
    explicit = os.environ.get("YOLO_DET_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "yolo-det"


def default_demo_folder() -> Path:
    """The demo dataset folder: ``data/demo`` in a source checkout, else ``demo`` in :func:`cache_dir`."""
    return _REPO_DATA / "demo" if _source_checkout() else cache_dir() / "demo"


def generate(out: str | os.PathLike[str], *, n_train: int = N_TRAIN, n_val: int = N_VAL, seed: int = 0) -> Path:
    """Write the dataset under ``out`` (``images/{train,val}``, ``labels/{train,val}``) and its data YAML
    beside it (``<out>.yaml``); return the YAML's path."""
    out = Path(out)
    for split, stem, img, lines in iter_samples(n_train=n_train, n_val=n_val, seed=seed):
        ok, png = cv2.imencode(".png", img)
        if not ok:
            raise RuntimeError("OpenCV could not encode a PNG image")
        _write_bytes(out / "images" / split / f"{stem}.png", png.tobytes())
        _write_bytes(out / "labels" / split / f"{stem}.txt", ("\n".join(lines) + "\n").encode())
    yaml_path = out.parent / f"{out.name}.yaml"
    text = _YAML.format(n_train=n_train, n_val=n_val, imgsz=IMGSZ, folder=out.name)
    _write_bytes(yaml_path, text.encode())
    return yaml_path


def demo_data_yaml() -> Path:
    """Path of the demo data YAML: the source checkout's ``data/demo.yaml``, else a copy generated once into
    :func:`cache_dir` (never into the installed package)."""
    repo_yaml = _REPO_DATA / "demo.yaml"
    if _source_checkout() and repo_yaml.is_file() and (_REPO_DATA / "demo" / "images" / "train").is_dir():
        return repo_yaml
    cache = cache_dir()
    yaml_path = cache / "demo.yaml"
    marker = cache / "demo" / ".complete"
    if not (yaml_path.is_file() and marker.is_file()):
        cache.mkdir(parents=True, exist_ok=True)
        generate(cache / "demo")
        _write_bytes(marker, b"")
    return yaml_path


def main(argv: list[str] | None = None) -> int:
    """``python -m yolo_det.tools.demo [--out DIR]``: write the demo dataset."""
    parser = argparse.ArgumentParser(
        prog="python -m yolo_det.tools.demo", description="Write the yolo-det demo dataset."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="dataset folder (default: data/demo in a source checkout, else ~/.cache/yolo-det/demo)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else default_demo_folder()
    yaml_path = generate(out, seed=args.seed)
    print(f"wrote {out} and {yaml_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
