"""Tests of yolo_det.integrations.patch_yolov5 and `yolo-det patch-yolov5` on a copy of the installed yolov5 package,
and of the diffs in patches/ against the edits the command makes."""

from __future__ import annotations

import hashlib
import re
import stat
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT
from yolo_det.cli import main
from yolo_det.integrations.yolov5 import patch as pv
from yolo_det.integrations.yolov5 import writer as pw
from yolov5_helpers import copy_yolov5

PATCHES = ROOT / "patches"
PATCHED_CALLS = {  # what a patched training script calls, one line each
    "ydet.add_argument(parser)",
    "@ydet.training",
    "ydet.init_seeds(init_seeds, opt.seed + 1 + RANK, deterministic=True)",
    "model = ydet.prepare_model(model)",
    "ydet.backward(scaler.scale(loss))",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A pristine copy of the installed yolov5 package."""
    dst = tmp_path / "yolov5"
    copy_yolov5(dst)
    return dst


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["patch-yolov5", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------------------------------------
# the command on the PyPI package


def test_check_reports_an_unpatched_tree_and_writes_nothing(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _digest(tree)
    rc, out, _ = _cli(capsys, tree, "--check")
    assert rc == 1
    for rel in pv.FILES:
        assert f"{rel}: would patch" in out
    assert "ydet.backward(scaler.scale(loss))" in out
    assert _digest(tree) == before


def test_patch_is_idempotent_and_backs_up(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    originals = {rel: (tree / rel).read_bytes() for rel in pv.FILES}
    rc, out, _ = _cli(capsys, tree)
    assert rc == 0
    assert f"{len(pv.FILES)} file(s) patched" in out
    for rel, old in originals.items():
        assert (tree / (rel + pv.BACKUP_SUFFIX)).read_bytes() == old
        assert (tree / rel).read_bytes() != old
    after_first = _digest(tree)

    rc, out, _ = _cli(capsys, tree)
    assert rc == 0
    assert "0 file(s) patched" in out
    assert _digest(tree) == after_first  # second run changes nothing, backups included

    rc, out, _ = _cli(capsys, tree, "--check")
    assert rc == 0
    assert "would" not in out


def test_patched_training_scripts_call_yolo_det_and_compile(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(capsys, tree)[0] == 0
    for rel in ("train.py", "segment/train.py", "classify/train.py"):
        old = (tree / (rel + pv.BACKUP_SUFFIX)).read_text(encoding="utf-8").splitlines()
        new = (tree / rel).read_text(encoding="utf-8").splitlines()
        added = [line for line in new if line.endswith(pv.MARKER)]
        calls = {line.strip()[: -len(pv.MARKER)].strip() for line in added}
        assert PATCHED_CALLS <= calls, rel
        resumable = rel != "classify/train.py"  # detect and segment: their training loader, last_opt_step
        assert len(added) == 6 + 2 * resumable  # the import and one line per call
        removed = [line.strip() for line in old if line not in new]
        loader = "train_loader, dataset = create_dataloader(" + ("train_path," if rel == "train.py" else "")
        assert removed == [
            "init_seeds(opt.seed + 1 + RANK, deterministic=True)",
            *([loader, "last_opt_step = -1"] if resumable else []),
            "scaler.scale(loss).backward()",
        ]
        if resumable:
            assert "    last_opt_step = ydet.last_opt_step(-1)  # yolo-det" in new
            assert any(" = ydet.train_loader(create_dataloader)(" in line for line in added)
        assert "ydet.init_seeds(init_seeds, opt.seed + 1 + RANK, deterministic=True)  # yolo-det" in "\n".join(new)
    for rel in pv.FILES:
        compile((tree / rel).read_text(encoding="utf-8"), rel, "exec")
    val = (tree / "val.py").read_text(encoding="utf-8")
    assert re.search(r"^@ydet\.validation  # yolo-det\ndef run\(", val, re.M)
    detect = (tree / "detect.py").read_text(encoding="utf-8")
    assert re.search(r"^@ydet\.deployment  # yolo-det\ndef run\(", detect, re.M)
    assert re.search(r"parser = argparse\.ArgumentParser\(\)\n    ydet\.add_argument\(parser\)  # yolo-det\n", detect)


def test_reverse_restores_the_exact_text(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pristine = {rel: (tree / rel).read_bytes() for rel in pv.FILES}
    assert _cli(capsys, tree)[0] == 0
    rc, out, _ = _cli(capsys, tree, "--check", "--reverse")
    assert rc == 1
    assert "train.py: would unpatch" in out
    rc, out, _ = _cli(capsys, tree, "--reverse")
    assert rc == 0
    assert f"{len(pv.FILES)} file(s) unpatched" in out
    assert {rel: (tree / rel).read_bytes() for rel in pv.FILES} == pristine
    assert _cli(capsys, tree, "--check")[0] == 1
    assert _cli(capsys, tree, "--reverse")[1].startswith("train.py: unchanged")


def test_default_profile_option_and_switching_it(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pristine = (tree / "train.py").read_bytes()
    assert _cli(capsys, tree, "--profile", "repro")[0] == 0
    text = (tree / "train.py").read_text(encoding="utf-8")
    assert "ydet.add_argument(parser, default='repro')  # yolo-det" in text
    assert _cli(capsys, tree, "--check", "--profile", "repro")[0] == 0
    rc, out, _ = _cli(capsys, tree, "--check", "--profile", "balanced")
    assert rc == 1
    assert "default='balanced'" in out
    assert _cli(capsys, tree, "--profile", "balanced")[0] == 0
    new = (tree / "train.py").read_text(encoding="utf-8")
    assert [a for a, b in zip(text.splitlines(), new.splitlines()) if a != b] == [
        "    ydet.add_argument(parser, default='repro')  # yolo-det"
    ]
    assert _cli(capsys, tree, "--reverse")[0] == 0
    assert (tree / "train.py").read_bytes() == pristine


def test_diff_writes_nothing_and_applies(tree: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    before = _digest(tree)
    rc, out, _ = _cli(capsys, tree, "--diff")
    assert rc == 0
    assert out.startswith("diff --git a/train.py b/train.py\n")
    assert _digest(tree) == before
    applied = _apply_diff(tree, out)
    assert _cli(capsys, tree, "--no-backup")[0] == 0
    assert applied == {rel: (tree / rel).read_text(encoding="utf-8") for rel in applied}


# ---------------------------------------------------------------------------------------------------------
# line drift, other layouts, unrecognised files


def _repo_layout(text: str) -> str:
    """The same script as the repository has it: 'from utils...' imports instead of 'from yolov5.utils...'."""
    return re.sub(r"^(\s*)(from|import) yolov5\.", r"\1\2 ", text, flags=re.M)


def test_anchors_tolerate_line_drift_layout_and_crlf(tree: Path) -> None:
    original = (tree / "train.py").read_text(encoding="utf-8")
    edits = pv.FILES["train.py"]
    drifted = "# a user's header\n" * 17 + _repo_layout(original).replace(
        "    init_seeds(", "    # a comment pushing lines down\n    init_seeds("
    )
    crlf = drifted.replace("\n", "\r\n")
    for text in (original, drifted, crlf):
        patched = pv.patch_text(text, edits)
        assert patched.count(pv.MARKER) == len(edits)
        assert pv.patch_text(patched, edits) == patched
        assert pv.revert_text(patched, edits) == text
    patched_crlf = pv.patch_text(crlf, edits)
    assert "\n" not in patched_crlf.replace("\r\n", "")  # every line, inserted ones too, keeps CRLF
    assert "from utils.general import" in pv.patch_text(drifted, edits)


def test_unrecognised_file_refuses_the_whole_tree(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One file not recognised: nothing is changed (a tree is never left half patched)."""
    seg = tree / "segment" / "train.py"
    seg.write_text(
        seg.read_text(encoding="utf-8").replace("scaler.scale(loss).backward()", "loss.backward()"), encoding="utf-8"
    )
    before = _digest(tree)
    rc, out, err = _cli(capsys, tree)
    assert rc == 2
    assert err.count("\n") == 1
    assert str(seg) in err
    assert "`scaler.scale(loss).backward()`" in err
    assert "found none" in err
    assert "nothing was changed" in err
    assert _digest(tree) == before  # train.py, val.py, ... untouched too
    assert _cli(capsys, tree, "--check")[0] == 1


def test_an_unknown_marked_line_anywhere_refuses_the_whole_tree(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    det = tree / "detect.py"
    det.write_text(det.read_text(encoding="utf-8") + "print('hi')  # yolo-det\n", encoding="utf-8")
    before = _digest(tree)
    rc, _, err = _cli(capsys, tree)
    assert rc == 2
    assert err.count("\n") == 1
    assert "is marked '# yolo-det'" in err
    assert "detect.py" in err
    assert _digest(tree) == before


def test_ambiguous_anchor_and_unknown_marked_line(tree: Path) -> None:
    text = (tree / "train.py").read_text(encoding="utf-8")
    doubled = text.replace(
        "    init_seeds(opt.seed + 1 + RANK, deterministic=True)\n",
        "    init_seeds(opt.seed + 1 + RANK, deterministic=True)\n" * 2,
    )
    with pytest.raises(pv.NotRecognised, match=r"found 2 \(lines \d+, \d+\)"):
        pv.patch_text(doubled, pv.FILES["train.py"], path="train.py")
    patched = pv.patch_text(text, pv.FILES["train.py"])
    edited = patched.replace("ydet.backward(scaler.scale(loss))  # yolo-det", "ydet.backward(loss * 2)  # yolo-det")
    with pytest.raises(pv.NotRecognised, match=r"line \d+ is marked '# yolo-det'"):
        pv.revert_text(edited, pv.FILES["train.py"], path="train.py")


# ---------------------------------------------------------------------------------------------------------
# bad input: one line, exit 2, nothing changed


def test_not_a_yolov5_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("print('hello')\n")
    for target in (tmp_path, tmp_path / "missing"):
        before = _digest(tmp_path)
        rc, out, err = _cli(capsys, target)
        assert rc == 2
        assert out == ""
        assert err.count("\n") == 1
        assert "YOLOv5" in err
        assert _digest(tmp_path) == before


def test_unknown_profile(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _digest(tree)
    rc, _, err = _cli(capsys, tree, "--profile", "repo")
    assert rc == 2
    assert err.count("\n") == 1
    assert "unknown profile 'repo'" in err
    assert "Did you mean 'repro'?" in err
    assert _digest(tree) == before


def test_read_only_files(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _digest(tree)
    target = tree / "detect.py"
    target.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    try:
        rc, _, err = _cli(capsys, tree)
    finally:
        target.chmod(0o644)
    assert rc == 2
    assert err.count("\n") == 1
    assert "detect.py is read-only" in err
    assert _digest(tree) == before


def test_read_only_folder(tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder where no file can be created (a read-only mount; root ignores chmod, so it is simulated)."""
    before = _digest(tree)
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        folder = Path(str(kwargs.get("dir") or "")).resolve()
        if folder == (tree / "segment").resolve():
            raise PermissionError(13, "Read-only file system")
        return real_mkstemp(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    rc, _, err = _cli(capsys, tree)
    assert rc == 2
    assert err.count("\n") == 1
    assert "cannot write in" in err
    assert "segment" in err
    assert _digest(tree) == before


# ---------------------------------------------------------------------------------------------------------
# the diffs in patches/ cannot drift from the command


def _hunks(diff: str) -> dict[str, list[list[str]]]:
    """``{path: [hunk lines (' ', '-', '+' prefixed), ...]}`` of a git-style unified diff."""
    files: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("+++ b/"):
            current = files.setdefault(line[6:].rstrip("\n"), [])
        elif line.startswith("@@") and current is not None:
            current.append([])
        elif current is not None and current and line[:1] in {" ", "-", "+"} and not line.startswith("--- a/"):
            current[-1].append(line)
    return files


def _apply_diff(root: Path, diff: str) -> dict[str, str]:
    """Apply a unified diff to the files under ``root`` in memory (strict: context must match); return new texts."""
    out = {}
    for rel, hunks in _hunks(diff).items():
        lines = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        pos, new = 0, []
        for hunk in hunks:
            old_side = [h[1:] for h in hunk if h[0] in " -"]
            for start in range(pos, len(lines) - len(old_side) + 1):
                if lines[start : start + len(old_side)] == old_side:
                    break
            else:
                raise AssertionError(f"{rel}: a hunk of the diff does not apply")
            new += lines[pos:start] + [h[1:] for h in hunk if h[0] in " +"]
            pos = start + len(old_side)
        out[rel] = "".join(new + lines[pos:])
    return out


def test_pypi_diff_matches_the_command(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diff = (PATCHES / "yolov5-pypi-7.0.14.diff").read_text(encoding="utf-8")
    applied = _apply_diff(tree, diff)
    assert sorted(applied) == sorted(pv.FILES)
    assert _cli(capsys, tree, "--no-backup")[0] == 0
    assert applied == {rel: (tree / rel).read_text(encoding="utf-8") for rel in pv.FILES}


@pytest.mark.parametrize("name", ["yolov5-v7.0.diff", "yolov5-master.diff", "yolov5-pypi-7.0.14.diff"])
def test_tag_diffs_are_the_commands_edits(name: str) -> None:
    """Each diff's old side, file by file, is patched by the command into exactly the diff's new side.

    The tags' full files are not available to the tests, but every edit's anchor lies inside its hunk,
    so the hunks of one file, put together, are a (shorter) file the command must patch the same way.
    """
    files = _hunks((PATCHES / name).read_text(encoding="utf-8"))
    assert sorted(files) == sorted(pv.FILES)
    for rel, hunks in files.items():
        old = "".join(h[1:] for hunk in hunks for h in hunk if h[0] in " -")
        new = "".join(h[1:] for hunk in hunks for h in hunk if h[0] in " +")
        assert pv.patch_text(old, pv.FILES[rel], path=rel) == new, f"{name}: {rel}"
        assert pv.revert_text(new, pv.FILES[rel], path=rel) == old, f"{name}: {rel}"


def test_patches_readme_names_every_diff() -> None:
    readme = (PATCHES / "README.md").read_text(encoding="utf-8")
    for diff in PATCHES.glob("*.diff"):
        assert diff.name in readme
    assert "git apply" in readme


# ---------------------------------------------------------------------------------------------------------
# links and interruptions: nothing written outside the tree, all or nothing


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): a link as its target, a file as its digest."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_symlinked_folder_outside_the_tree_is_refused(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "elsewhere"
    (tree / "segment").rename(outside)
    (tree / "segment").symlink_to(outside, target_is_directory=True)
    before, before_outside = _snapshot(tree), _snapshot(outside)
    rc, out, err = _cli(capsys, tree)
    assert rc == 2, err
    assert err.count("\n") == 1, err
    assert "outside the tree" in err, err
    assert "segment" in err, err
    assert _snapshot(tree) == before
    assert _snapshot(outside) == before_outside
    rc, _, err = _cli(capsys, tree, "--check")
    assert rc == 2
    assert "outside the tree" in err


def test_symlinked_file_outside_the_tree_is_refused(
    tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "detect-elsewhere.py"
    (tree / "detect.py").rename(outside)
    (tree / "detect.py").symlink_to(outside)
    text = outside.read_bytes()
    before = _snapshot(tree)
    rc, _, err = _cli(capsys, tree)
    assert rc == 2
    assert err.count("\n") == 1
    assert "detect.py is a symbolic link" in err
    assert "outside the tree" in err
    assert _snapshot(tree) == before
    assert outside.read_bytes() == text


def test_symlinked_file_inside_the_tree_stays_a_link(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "detect.py").rename(tree / "detect_impl.py")
    (tree / "detect.py").symlink_to("detect_impl.py")
    original = (tree / "detect_impl.py").read_bytes()
    rc, _, err = _cli(capsys, tree)
    assert rc == 0, err
    assert (tree / "detect.py").is_symlink()
    assert str((tree / "detect.py").readlink()) == "detect_impl.py"
    assert "ydet" in (tree / "detect_impl.py").read_text()
    assert (tree / ("detect.py" + pv.BACKUP_SUFFIX)).read_bytes() == original
    rc, _, _ = _cli(capsys, tree, "--reverse")
    assert rc == 0
    assert (tree / "detect.py").is_symlink()
    assert (tree / "detect_impl.py").read_bytes() == original


def test_two_links_to_one_file_are_refused(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "segment" / "val.py").unlink()
    (tree / "segment" / "val.py").symlink_to("../val.py")
    before = _snapshot(tree)
    rc, _, err = _cli(capsys, tree)
    assert rc == 2
    assert "are the same file" in err
    assert _snapshot(tree) == before


@pytest.mark.parametrize("stage", ["_write_temp", "_replace"])
@pytest.mark.parametrize("nth", [1, 4, 9])
@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError, RuntimeError])
def test_interruption_between_files_leaves_the_tree_as_it_was(
    tree: Path, monkeypatch: pytest.MonkeyPatch, stage: str, nth: int, error: type
) -> None:
    """Ctrl-C (or any failure) while staging or while renaming the Nth file: the tree is exactly as before."""
    result = pv.plan(tree)
    assert len(result.changes) >= 5  # 2 writes (backup + file) per changed file: nth=9 is the 5th file's backup
    before = _snapshot(tree)
    real = getattr(pw, stage)
    calls = []

    def failing(*args: object) -> object:
        calls.append(args)
        if len(calls) == nth:
            raise error(5, "injected") if error is OSError else error("injected")
        return real(*args)

    monkeypatch.setattr(pw, stage, failing)
    with pytest.raises((KeyboardInterrupt, pv.PatchError, RuntimeError)):
        pw.apply_plan(result)
    assert len(calls) == nth
    assert _snapshot(tree) == before  # no file changed, no backup or temporary file left


def test_interruption_in_reverse_leaves_the_patch_in_place(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pw.apply_plan(pv.plan(tree))
    patched = _snapshot(tree)
    real = pw._replace
    calls = []

    def failing(tmp: Path, target: Path) -> None:
        calls.append(target)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(tmp, target)

    monkeypatch.setattr(pw, "_replace", failing)
    with pytest.raises(KeyboardInterrupt):
        pw.apply_plan(pv.plan(tree, reverse=True), backup=False)
    assert _snapshot(tree) == patched
