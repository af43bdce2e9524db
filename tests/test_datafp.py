"""Dataset fingerprints: what they cover, that they move with the data and not with its location, and the cache."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers import DEMO
from yolo_det.core.datafp import DigestCache, cache_dir, dataset_fingerprint, split_fingerprint


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))


def copy_demo(dst: Path, n: int = 6) -> Path:
    """A small YOLO dataset: the first n demo train images and their labels."""
    for sub in ("images", "labels"):
        (dst / sub / "train").mkdir(parents=True)
    for img in sorted((DEMO / "images" / "train").glob("*.png"))[:n]:
        shutil.copy2(img, dst / "images" / "train" / img.name)
        shutil.copy2(DEMO / "labels" / "train" / f"{img.stem}.txt", dst / "labels" / "train" / f"{img.stem}.txt")
    return dst


def images(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "images" / "train").glob("*.png"))


def fp(root: Path) -> dict:
    return dataset_fingerprint({"train": images(root)}, root=root, names={0: "a", 1: "b", 2: "c"})


def test_same_data_elsewhere_gives_the_same_fingerprint(tmp_path):
    a, b = copy_demo(tmp_path / "a"), copy_demo(tmp_path / "b")
    fa, fb = fp(a), fp(b)
    assert fa["sha256"] == fb["sha256"]
    assert fa["splits"] == fb["splits"]
    assert fa["splits"]["train"]["images"] == 6
    assert fa["splits"]["train"]["missing_labels"] == 0


def test_one_changed_label_changes_only_the_labels(tmp_path):
    a, b = copy_demo(tmp_path / "a"), copy_demo(tmp_path / "b")
    label = sorted((b / "labels" / "train").glob("*.txt"))[2]
    lines = label.read_text().splitlines()
    lines[0] = ("1" if lines[0][0] != "1" else "2") + lines[0][1:]
    label.write_text("\n".join(lines) + "\n")
    sa, sb = fp(a)["splits"]["train"], fp(b)["splits"]["train"]
    assert sa["labels_sha256"] != sb["labels_sha256"]
    assert sa["list_sha256"] == sb["list_sha256"]
    assert sa["images_sha256"] == sb["images_sha256"]


def test_image_bytes_list_names_and_missing_labels_are_covered(tmp_path):
    a = copy_demo(tmp_path / "a")
    base = fp(a)
    img = Path(images(a)[0])
    data = bytearray(img.read_bytes())
    data[-1] ^= 1
    img.write_bytes(bytes(data))
    changed = fp(a)["splits"]["train"]
    assert changed["images_sha256"] != base["splits"]["train"]["images_sha256"]
    assert changed["list_sha256"] == base["splits"]["train"]["list_sha256"]
    moved = Path(images(a)[1])
    moved.rename(a / "images" / "train" / "renamed.png")
    (a / "labels" / "train" / f"{moved.stem}.txt").rename(a / "labels" / "train" / "renamed.txt")
    assert fp(a)["splits"]["train"]["list_sha256"] != changed["list_sha256"]
    (a / "labels" / "train" / Path(images(a)[2]).with_suffix(".txt").name).unlink()
    assert fp(a)["splits"]["train"]["missing_labels"] == 1
    other_names = dataset_fingerprint({"train": images(a)}, root=a, names={0: "x"})
    assert other_names["names_sha256"] != fp(a)["names_sha256"]


def test_image_digests_are_cached_by_size_and_mtime(tmp_path):
    a = copy_demo(tmp_path / "a")
    cold = fp(a)
    assert (cold["hashed"], cold["cached"]) == (6, 0)
    files = list((cache_dir() / "datafp").glob("*.json"))
    assert len(files) == 1
    assert cache_dir() == tmp_path / "cache"
    entries = json.loads(files[0].read_text())["entries"]
    assert len(entries) == 6
    warm = fp(a)
    assert (warm["hashed"], warm["cached"]) == (0, 6)
    assert warm["sha256"] == cold["sha256"]
    # same size, new time: hashed again; the cache never hides a change
    img = Path(images(a)[0])
    data = bytearray(img.read_bytes())
    data[-1] ^= 1
    img.write_bytes(bytes(data))
    st = img.stat()
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    again = fp(a)
    assert again["hashed"] == 1
    assert again["sha256"] != cold["sha256"]


def test_a_corrupt_or_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    a = copy_demo(tmp_path / "a")
    first = fp(a)
    for f in (cache_dir() / "datafp").glob("*.json"):
        f.write_text("{not json")
    assert fp(a)["sha256"] == first["sha256"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("YOLO_DET_CACHE", str(blocker / "sub"))  # a folder that cannot be made
    result = fp(a)
    assert result["sha256"] == first["sha256"]
    assert result["hashed"] == 6


def test_classification_splits_hash_the_class_of_each_image(tmp_path):
    a = copy_demo(tmp_path / "a")
    files = images(a)
    one = split_fingerprint(files, root=a, classes=[0, 1, 0, 1, 0, 1], cache=DigestCache(None))
    two = split_fingerprint(files, root=a, classes=[0, 1, 0, 1, 0, 0], cache=DigestCache(None))
    assert one["labels_sha256"] != two["labels_sha256"]
    assert one["images_sha256"] == two["images_sha256"]
    assert one["missing_labels"] == 0


def test_default_cache_dir_follows_the_platform_rules(monkeypatch, tmp_path):
    monkeypatch.delenv("YOLO_DET_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    expected = {
        "win32": tmp_path / "local" / "yolo-det" / "Cache",
        "darwin": Path.home() / "Library" / "Caches" / "yolo-det",
    }.get(sys.platform, tmp_path / "xdg" / "yolo-det")
    assert cache_dir() == expected
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def test_the_file_table_names_the_first_file_that_differs(tmp_path):
    import hashlib

    from yolo_det.core.datafp import first_file_difference

    a = copy_demo(tmp_path / "a")
    base = fp(a)
    assert base["files_group"] == 1
    assert len(base["files"]) == 12  # 6 images and their 6 labels, one entry per file
    assert first_file_difference(base, fp(a)) is None  # unchanged: nothing named
    label = sorted((a / "labels" / "train").glob("*.txt"))[3]
    label.write_text(label.read_text() + "0 0.5 0.5 0.9 0.9\n")
    name, was, now = first_file_difference(base, fp(a))
    assert name == f"labels/train/{label.name}"
    assert now == hashlib.sha256(label.read_bytes()).hexdigest()[:16]  # what sha256sum says of the file
    assert was != now
    changed = fp(a)
    shutil.copy2(images(a)[0], a / "images" / "train" / "added.png")  # a file added: named, only here
    assert first_file_difference(changed, fp(a))[:2] == ("images/train/added.png", "absent")
    label.unlink()  # a file removed: named, absent here
    assert first_file_difference(changed, fp(a)) == ("images/train/added.png", "absent", fp(a)["files"][0][1])
    (a / "images" / "train" / "added.png").unlink()
    assert first_file_difference(changed, fp(a)) == (f"labels/train/{label.name}", changed["files"][9][1], "absent")
    assert first_file_difference(changed, {k: v for k, v in changed.items() if k != "files"}) is None  # older record
    assert first_file_difference(changed, {**changed, "files": [["x"]]}) is None  # a malformed table names nothing


def test_beyond_the_bound_the_table_holds_groups_and_regroups_to_compare(tmp_path):
    from yolo_det.core.datafp import FILE_TABLE_MAX, first_file_difference

    root = tmp_path / "many"
    (root / "images").mkdir(parents=True)
    files = []
    for i in range(2 * FILE_TABLE_MAX):  # files without labels: the table holds the images only
        f = root / "images" / f"{i:04d}.jpg"
        f.write_bytes(str(i).encode())
        files.append(str(f))
    table = dataset_fingerprint({"train": files}, root=root)
    assert (table["files_group"], len(table["files"])) == (2, FILE_TABLE_MAX)
    assert table["files"][5][:2] == ["images/0010.jpg", "images/0011.jpg"]
    Path(files[11]).write_bytes(b"other")
    changed = dataset_fingerprint({"train": files}, root=root)
    assert first_file_difference(table, changed)[0] == "one of the 2 files images/0010.jpg to images/0011.jpg"
    extra = root / "images" / "0010a.jpg"  # one file more: another grouping, compared only when regrouped as A's
    extra.write_bytes(b"x")
    more = dataset_fingerprint({"train": [*files, str(extra)]}, root=root)
    assert more["files_group"] == 3
    assert first_file_difference(table, more) is None
    regrouped = dataset_fingerprint({"train": [*files, str(extra)]}, root=root, files_group=2)
    assert first_file_difference(table, regrouped)[0] == "one of the 2 files images/0010.jpg to images/0011.jpg"
