"""What the user changed: the record holds their project's git state and the installed packages, and
``yolo-det diff`` names a change of either as a cause."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import small_train_tokens
from yolo_det.cli import main
from yolo_det.core.project import installed_packages, project_state
from yolo_det.core.record import build_record, write_record
from yolo_det.session.session import DeterminismSession
from yolo_det.tools.diff import diff_records

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

SECRET = "a line of the user's code that must never reach the record"


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def make_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "user@example.com")
    git(path, "config", "user.name", "user")
    (path / "train.py").write_text("print('train')\n")
    git(path, "add", "train.py")
    git(path, "commit", "-q", "-m", "first")
    return path


def record_of_a_run_started_in(folder: Path, monkeypatch: pytest.MonkeyPatch, *, after_start: Any = None) -> dict:
    """The record of a run whose process was started in ``folder`` (``after_start``: done while it trains)."""
    monkeypatch.chdir(folder)
    session = DeterminismSession("repro", seed=0)
    with session.run(), session.phase_scope("train"):
        if after_start is not None:
            after_start()
        record = build_record(
            session, framework="test", status="completed", state_at_train_start=None, weights={"sha256": "w"}, run={}
        )
    json.dumps(record)
    return record


def test_a_run_started_in_a_git_work_tree_records_its_commit_branch_and_a_digest_of_its_changes(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "project")
    clean = record_of_a_run_started_in(repo, monkeypatch)
    assert clean["project"] == {
        "commit": git(repo, "rev-parse", "HEAD"),
        "branch": "main",
        "dirty": False,
        "changed_files": 0,
        "changes_sha256": None,
    }
    (repo / "train.py").write_text(f"print('train')\n# {SECRET}\n")
    dirty = record_of_a_run_started_in(repo / ".", monkeypatch)
    assert dirty["project"]["commit"] == clean["project"]["commit"]
    assert dirty["project"]["dirty"] is True
    assert dirty["project"]["changed_files"] == 1
    assert len(dirty["project"]["changes_sha256"]) == 64
    assert SECRET not in json.dumps(dirty)  # a digest of the change, never its text
    (repo / "train.py").write_text(f"print('train')\n# {SECRET}, edited\n")
    edited = record_of_a_run_started_in(repo, monkeypatch)
    assert edited["project"]["changes_sha256"] != dirty["project"]["changes_sha256"]
    # a subfolder of the work tree is the same project; a staged new file counts, an untracked one does not
    (repo / "sub").mkdir()
    (repo / "sub" / "untracked.txt").write_text("scratch")
    assert record_of_a_run_started_in(repo / "sub", monkeypatch)["project"] == edited["project"]
    git(repo, "add", "sub/untracked.txt")
    staged = record_of_a_run_started_in(repo, monkeypatch)["project"]
    assert staged["changed_files"] == 2
    assert staged["changes_sha256"] != edited["project"]["changes_sha256"]


def test_the_project_is_recorded_as_the_run_started(tmp_path, monkeypatch):
    """An edit made while the run trains does not change what the record says the run started from."""
    repo = make_repo(tmp_path / "project")
    record = record_of_a_run_started_in(
        repo, monkeypatch, after_start=lambda: (repo / "train.py").write_text("print('edited')\n")
    )
    assert record["project"]["dirty"] is False
    assert project_state(repo)["dirty"] is True  # control: the edit is there now


def test_outside_a_git_work_tree_or_without_git_there_is_no_project(tmp_path, monkeypatch):
    folder = tmp_path / "plain"
    folder.mkdir()
    record = record_of_a_run_started_in(folder, monkeypatch)
    assert record["project"] is None
    assert record["packages"]["torch"]  # the packages are recorded all the same
    repo = make_repo(tmp_path / "project")
    assert project_state(repo) is not None  # control: a work tree is seen
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
    assert project_state(repo) is None


def test_a_hostile_git_config_runs_nothing(tmp_path, monkeypatch):
    """A received folder's ``.git/config`` and ``.gitattributes`` name programs (fsmonitor, pager, external diff,
    textconv, clean/smudge filters, hooks): recording the project runs none of them."""
    repo = make_repo(tmp_path / "received")
    canary = tmp_path / "canary"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\necho ran >> {canary}\ncat\n")
    script.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "post-checkout", "reference-transaction"):
        (hooks / hook).write_text(script.read_text())
        (hooks / hook).chmod(0o755)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=evil\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "attributes")
    for key, value in {
        "core.fsmonitor": str(script),
        "core.pager": str(script),
        "core.hooksPath": str(hooks),
        "diff.external": str(script),
        "diff.evil.textconv": str(script),
        "filter.evil.clean": str(script),
        "filter.evil.smudge": str(script),
    }.items():
        git(repo, "config", key, value)
    (repo / "train.py").write_text(f"# {SECRET}\n")  # a change git would read through the filter
    subprocess.run(["git", "-C", str(repo), "status"], capture_output=True, check=False)
    assert canary.exists(), "control: plain git runs the config's programs in this folder"
    canary.unlink()
    record = record_of_a_run_started_in(repo, monkeypatch)
    assert not canary.exists()
    assert record["project"]["dirty"] is True
    assert record["project"]["changed_files"] == 1


def test_installed_packages_are_every_distribution_sorted_with_its_version():
    packages = installed_packages()
    assert list(packages) == sorted(packages)
    from importlib import metadata

    assert packages["torch"] == metadata.version("torch")
    assert packages["pyyaml"] == metadata.version("PyYAML")  # names normalized


def _diff_cli(capsys, tmp_path: Path, a: dict, b: dict) -> tuple[int, str]:
    pa, pb = write_record(tmp_path / "a", a), write_record(tmp_path / "b", b)
    capsys.readouterr()
    code = main(["diff", str(pa), str(pb)])
    return code, capsys.readouterr().out


def test_diff_names_a_changed_package_version_and_both_versions(tmp_path, monkeypatch, capsys):
    a = record_of_a_run_started_in(make_repo(tmp_path / "project"), monkeypatch)
    b = copy.deepcopy(a)
    b["packages"]["pyyaml"] = "0.0.1"
    b["packages"]["left-pad"] = "1.0"
    report = diff_records(a, b)
    assert [d.name for d in report.causes] == ["package left-pad", "package pyyaml"]
    yaml_line = report.causes[1]
    assert (yaml_line.a, yaml_line.b) == (a["packages"]["pyyaml"], "0.0.1")
    assert yaml_line.group == "versions"
    assert yaml_line.measured is False
    assert report.causes[0].a == "(not installed)"
    assert diff_records(a, copy.deepcopy(a)).causes == []  # control: the same packages name nothing
    code, out = _diff_cli(capsys, tmp_path, a, b)
    assert code == 1
    assert f"package pyyaml: A {a['packages']['pyyaml']} | B 0.0.1" in out
    # a version the environment compares already is named once, as before
    b = copy.deepcopy(a)
    b["packages"]["torch"] = b["environment"]["torch"] = "1.13.1"
    assert [d.name for d in diff_records(a, b).causes] == ["torch"]


def test_diff_names_a_changed_commit_and_changed_uncommitted_code(tmp_path, monkeypatch, capsys):
    repo = make_repo(tmp_path / "project")
    clean = record_of_a_run_started_in(repo, monkeypatch)
    (repo / "train.py").write_text(f"# {SECRET}\n")
    dirty = record_of_a_run_started_in(repo, monkeypatch)
    report = diff_records(clean, dirty)
    assert [d.name for d in report.causes] == ["project uncommitted changes"]
    assert report.causes[0].a == "none"
    assert report.causes[0].b == f"1 file(s), {dirty['project']['changes_sha256'][:12]}"
    git(repo, "commit", "-q", "-am", "second")
    committed = record_of_a_run_started_in(repo, monkeypatch)
    report = diff_records(clean, committed)
    assert [d.name for d in report.causes] == ["project commit"]
    assert (report.causes[0].a, report.causes[0].b) == (clean["project"]["commit"], committed["project"]["commit"])
    code, out = _diff_cli(capsys, tmp_path, clean, committed)
    assert code == 1
    assert "your project's code" in out
    assert "project commit: A " in out
    assert "verdict: configured differently (project commit (" in out
    # a record from an older yolo-det, without the section, says so and names no cause
    older = {k: v for k, v in clean.items() if k not in {"project", "packages"}}
    report = diff_records(older, committed)
    assert report.causes == []
    assert any("older yolo-det" in n for n in report.notes)


@pytest.mark.slow
def test_a_real_training_started_in_a_work_tree_records_it(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "project")
    (repo / "train.py").write_text(f"# {SECRET}\n")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    tokens = small_train_tokens(batch=8, fraction=0.25, val=False)
    assert main(["train", "--profile", "repro", *tokens, f"project={repo / 'runs'}", "name=run"]) == 0
    text = (repo / "runs" / "run" / "determinism.json").read_text()
    record = json.loads(text)
    assert record["project"]["commit"] == git(repo, "rev-parse", "HEAD")
    assert record["project"]["dirty"] is True
    assert record["project"]["changed_files"] == 1  # the run folder beside the code is untracked: not a change
    assert SECRET not in text
    assert record["packages"]["ultralytics"] == record["environment"]["ultralytics"]
