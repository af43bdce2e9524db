"""Dataset fingerprints: one digest of the data a training read, cheap enough to take on every run.

A fingerprint covers, per split (``train`` and the validation split):

- **the image list**: the image files exactly as the dataset resolved them (for Ultralytics, after
  ``fraction=`` and after images with broken labels were dropped), as POSIX paths relative to the dataset
  root (the data YAML's ``path``) when every file lies inside it, else relative to the files' common
  parent folder, so the same dataset in two places gives the same fingerprint. The list is sorted: the
  order a training reads the images in is a matter of seeds, not of data;
- **the image contents**: SHA-256 of each image file's bytes;
- **the labels**: for detection, segmentation and pose data the YOLO label file of each image
  (``.../images/x.jpg`` -> ``.../labels/x.txt``, Ultralytics' rule): its relative path, size and the
  SHA-256 of its bytes, or "missing"; for classification data the class index of each image (its folder);

and, for the whole dataset, the class names. Each split also has ``content_sha256``: its images' bytes paired
with their labels, without any name, so that the same files listed another way (a ``.txt`` image list beside
another folder, another ``path:``) are known as the same data. It does not cover the data YAML's text (its paths differ
between machines), label caches (``*.cache``), or files the list does not name.

Beside the digests, a bounded **file table** says which file differs when two fingerprints do: every file read
(images and label files of all splits), sorted by its name relative to the root, with its SHA-256, one entry per
file up to :data:`FILE_TABLE_MAX` files and one per group of files beyond (its first and last name and one
digest), so a record stays small for a large dataset. It is evidence, not part of ``sha256``.

Image files are hashed once: their digests are kept in a cache keyed by absolute path, size and
modification time (nanoseconds), one JSON file per dataset root under the user's cache folder
(``$YOLO_DET_CACHE`` when set, else ``~/.cache/yolo-det`` or the platform's equivalent), written
atomically; a file whose size or time changed is hashed again. Label files are small and always read.
When the cache cannot be read or written the digests are simply computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any

from .fileio import atomic_write_text, file_sha256

__all__ = [
    "FINGERPRINT_VERSION",
    "DigestCache",
    "cache_dir",
    "dataset_fingerprint",
    "file_sha256",
    "first_file_difference",
    "is_inside",
    "split_fingerprint",
]

FINGERPRINT_VERSION = 1
CACHE_VERSION = 1
#: Up to this many files the file table holds one entry per file; beyond, one per group of files.
FILE_TABLE_MAX = 256


def cache_dir() -> Path:
    """The folder yolo-det caches into: ``$YOLO_DET_CACHE``, else the platform's user cache folder + ``yolo-det``."""
    override = os.environ.get("YOLO_DET_CACHE")
    if override:
        return Path(override).expanduser()
    home = Path.home()
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA")
        return (Path(base) if base else home / "AppData" / "Local") / "yolo-det" / "Cache"
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "yolo-det"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else home / ".cache") / "yolo-det"


class DigestCache:
    """Content digests of files, kept by ``(absolute path, size, mtime_ns)`` in one JSON file.

    Args:
        path: The cache file; None keeps nothing between calls.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.hits = 0
        self.misses = 0
        self._dirty = False
        if path is not None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if (
                    isinstance(data, dict)
                    and data.get("version") == CACHE_VERSION
                    and isinstance(data.get("entries"), dict)
                ):
                    self.entries = data["entries"]
            except (OSError, ValueError):
                self.entries = {}

    def digest(self, path: str) -> str:
        """The SHA-256 of ``path``'s bytes, from the cache when the file's size and time are unchanged."""
        st = os.stat(path)
        key = os.path.abspath(path)
        entry = self.entries.get(key)
        if isinstance(entry, list) and len(entry) == 3 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            self.hits += 1
            return str(entry[2])
        digest = file_sha256(path)
        self.misses += 1
        self.entries[key] = [st.st_size, st.st_mtime_ns, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        """Write the cache back (atomically) if anything was added; failures are ignored."""
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(
                self.path, json.dumps({"version": CACHE_VERSION, "entries": self.entries}, separators=(",", ":"))
            )
            self._dirty = False
        except OSError:
            pass


def _cache_for(root: Path | None, use_cache: bool) -> DigestCache:
    if not use_cache:
        return DigestCache(None)
    key = hashlib.sha256(str(root.resolve() if root is not None else "").encode()).hexdigest()[:16]
    return DigestCache(cache_dir() / "datafp" / f"{key}.json")


def _relative_names(files: Sequence[str], root: Path | None) -> list[str]:
    """POSIX names of ``files`` relative to ``root`` when all lie inside it, else to their common parent."""
    absolute = [os.path.abspath(f) for f in files]
    if not absolute:
        return []
    base: str | None = None
    if root is not None:
        r = os.path.abspath(root)
        if all(is_inside(f, r) for f in absolute):
            base = r
    if base is None:
        try:
            base = os.path.commonpath([os.path.dirname(f) for f in absolute])
        except ValueError:  # Windows: files on different drives have no common folder
            return [Path(f).as_posix() for f in absolute]
    return [Path(os.path.relpath(f, base)).as_posix() for f in absolute]


def is_inside(path: str, folder: str) -> bool:
    """Whether the absolute ``path`` lies inside the absolute ``folder`` (False across Windows drives)."""
    try:
        return os.path.commonpath([folder, path]) == folder
    except ValueError:  # different drives
        return False


def _yolo_label_path(image: str) -> str:
    """Ultralytics' rule: the last ``/images/`` folder becomes ``/labels/``, the suffix ``.txt``."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    head, sep, tail = image.rpartition(sa)
    swapped = f"{head}{sb}{tail}" if sep else image
    return os.path.splitext(swapped)[0] + ".txt"


def _hash_lines(lines: Iterable[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8", "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()


def split_fingerprint(
    images: Sequence[str | os.PathLike[str]],
    *,
    root: str | os.PathLike[str] | None = None,
    labels: Sequence[str | os.PathLike[str] | None] | None = None,
    classes: Sequence[int] | None = None,
    cache: DigestCache | None = None,
    read: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Fingerprint one split.

    Args:
        images: The split's image files.
        root: The dataset root the names are taken relative to.
        labels: The label file of each image (None: YOLO label files found by Ultralytics' rule).
        classes: For classification data, each image's class index (then no label files are read).
        cache: Where image digests are kept between runs.
        read: Gets ``(path, sha256)`` of every file read appended (the file table's evidence).

    Returns:
        ``{"images", "labels", "missing_labels", "list_sha256", "images_sha256", "labels_sha256",
        "content_sha256", "sha256"}`` (``sha256`` covers the first three digests; ``content_sha256``, the
        images' bytes with their labels, names left out, is not part of it).
    """
    cache = cache if cache is not None else DigestCache(None)
    read = read if read is not None else []
    files = [os.fspath(f) for f in images]
    names = _relative_names(files, Path(root) if root is not None else None)
    order = sorted(range(len(files)), key=lambda i: names[i])
    list_lines, image_lines, label_lines, content_lines = [], [], [], []
    missing = 0
    if classes is None:
        label_files = [
            os.fspath(x) if x is not None else _yolo_label_path(f)
            for f, x in zip(files, labels if labels is not None else [None] * len(files))
        ]
        label_names = _relative_names(label_files, Path(root) if root is not None else None)
    for i in order:
        list_lines.append(names[i])
        image = cache.digest(files[i])
        read.append((files[i], image))
        image_lines.append(f"{names[i]}\0{image}")
        if classes is not None:
            label = f"class {int(classes[i])}"
            label_lines.append(f"{names[i]}\0{label}")
        else:
            try:
                data = Path(label_files[i]).read_bytes()
            except FileNotFoundError:
                missing += 1
                label = "missing"
            else:
                digest = hashlib.sha256(data).hexdigest()
                label = f"{len(data)}\0{digest}"
                read.append((label_files[i], digest))
            label_lines.append(f"{label_names[i]}\0{label}")
        content_lines.append(f"{image}\0{label}")
    out: dict[str, Any] = {
        "images": len(files),
        "labels": len(files) - missing if classes is None else len(files),
        "missing_labels": missing,
        "list_sha256": _hash_lines(list_lines),
        "images_sha256": _hash_lines(image_lines),
        "labels_sha256": _hash_lines(label_lines),
        "content_sha256": _hash_lines(sorted(content_lines)),
    }
    out["sha256"] = _hash_lines([out["list_sha256"], out["images_sha256"], out["labels_sha256"]])
    return out


def dataset_fingerprint(
    splits: Mapping[str, Sequence[str | os.PathLike[str]] | Mapping[str, Any]],
    *,
    root: str | os.PathLike[str] | None = None,
    names: Any = None,
    use_cache: bool = True,
    files_group: int | None = None,
) -> dict[str, Any]:
    """Fingerprint a dataset (see the module docstring for what it covers).

    Args:
        splits: ``{split: image files}``, or ``{split: {"images": [...], "labels": [...] | None,
            "classes": [...] | None}}`` to give label files or classification class indices.
        root: The dataset root (names are relative to it).
        names: The class names (``{index: name}`` or a list), hashed as canonical JSON.
        use_cache: Keep image digests in the user's cache folder between runs.
        files_group: Files per entry of the file table (None: one per file up to :data:`FILE_TABLE_MAX` files).

    Returns:
        ``{"version", "covers", "root", "names_sha256", "splits": {split: ...}, "sha256", "files",
        "files_group", "seconds", "hashed", "cached"}``; ``sha256`` covers the splits and the names, not the
        file table (evidence of which file differs: :func:`first_file_difference`).
    """
    started = time.perf_counter()
    root_path = Path(root) if root is not None else None
    cache = _cache_for(root_path, use_cache)
    result: dict[str, Any] = {}
    read: list[tuple[str, str]] = []
    for split, spec in splits.items():
        if isinstance(spec, Mapping):
            result[split] = split_fingerprint(
                spec["images"],
                root=root_path,
                labels=spec.get("labels"),
                classes=spec.get("classes"),
                cache=cache,
                read=read,
            )
        else:
            result[split] = split_fingerprint(spec, root=root_path, cache=cache, read=read)
    cache.save()
    if isinstance(names, Mapping):
        names = {str(k): str(v) for k, v in names.items()}
    names_sha = hashlib.sha256(json.dumps(names, sort_keys=True).encode()).hexdigest()
    total = _hash_lines([f"{k}\0{v['sha256']}" for k, v in sorted(result.items())] + [f"names\0{names_sha}"])
    return {
        "version": FINGERPRINT_VERSION,
        "covers": "image list, image bytes and label files (or class folders) per split, and the class names",
        "root": str(root_path) if root_path is not None else None,
        "names_sha256": names_sha,
        "splits": result,
        "sha256": total,
        **_file_table(read, root_path, files_group),
        "seconds": round(time.perf_counter() - started, 6),
        "hashed": cache.misses,
        "cached": cache.hits,
    }


def _file_table(read: Sequence[tuple[str, str]], root: Path | None, group: int | None) -> dict[str, Any]:
    """``{"files": [...], "files_group": G}``: every file read, sorted by its name relative to the dataset root, ``G``
    files per entry (one entry per file up to :data:`FILE_TABLE_MAX` files, so the record stays small): ``[name,
    sha256]`` (16 hex digits) per file, or ``[first, last, digest]`` per group, a digest of their names and contents."""
    pairs = sorted(set(zip(_relative_names([p for p, _ in read], root), (d for _, d in read))))
    group = group or max(1, -(-len(pairs) // FILE_TABLE_MAX))
    chunks = [pairs[i : i + group] for i in range(0, len(pairs), group)]
    table = [
        [c[0][0], c[0][1][:16]] if group == 1 else [c[0][0], c[-1][0], _hash_lines(f"{n}\0{d}" for n, d in c)[:16]]
        for c in chunks
    ]
    return {"files": table, "files_group": group}


def first_file_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first file (in name order, relative to the dataset root) two dataset fingerprints' file tables disagree
    on, as ``(name, in a, in b)``: each side its digest, ``absent`` or ``present``; where an entry holds a group of
    files that starts with the same file on both sides, the name says which files. None when the tables agree, a
    fingerprint holds none (an older record) or a malformed one, they group files differently
    (:func:`dataset_fingerprint` with the other's ``files_group`` makes them comparable) or share no name (the same
    data under another root, or other data: the names tell nothing)."""
    ta, tb, group = _table(a), _table(b), a.get("files_group")
    if ta is None or tb is None or group != b.get("files_group") or not {e[0] for e in ta} & {e[0] for e in tb}:
        return None
    for ea, eb in zip_longest(ta, tb):
        if ea == eb:
            continue
        if ea is not None and (eb is None or ea[0] < eb[0]):  # every earlier file agrees: this one is A's only
            return ea[0], ea[1] if group == 1 else "present", "absent"
        if eb is not None and (ea is None or eb[0] < ea[0]):
            return eb[0], "absent", eb[1] if group == 1 else "present"
        if ea is not None and eb is not None:  # the same first file
            return ea[0] if group == 1 else f"one of the {group} files {ea[0]} to {ea[1]}", ea[-1], eb[-1]
    return None


def _table(fingerprint: Mapping[str, Any]) -> list[list[str]] | None:
    """A fingerprint's file table when it is one (a record is read as data: any other shape is None)."""
    table, group = fingerprint.get("files"), fingerprint.get("files_group")
    if not isinstance(group, int) or isinstance(group, bool) or group < 1 or not isinstance(table, list):
        return None
    size = 2 if group == 1 else 3
    ok = all(isinstance(e, list) and len(e) == size and all(isinstance(x, str) for x in e) for e in table)
    return table if ok else None
