"""Results for the user's CI: JUnit XML, GitHub annotations, the pre-commit hook and the drift recipe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema
from junitparser import JUnitXml

from helpers import ROOT, small_train_tokens
from yolo_det.cli import main
from yolo_det.commands.audit import split_model_yamls
from yolo_det.tools.ci_report import (
    CheckCase,
    CheckSuite,
    against_suite,
    github_annotations,
    junit_xml,
    verify_suite,
    write_junit,
)
from yolo_det.tools.verify import MicroBatch, RunRecord, StepRecord
from yolo_det.tools.verify.crossverify import _run_to_dict, compare_against, read_saved
from yolo_det.tools.verify.report import VerifyReport

SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "schemas" / "junit.xsd"))

# A user's project: a tiny detector, and the same detector with their own block that max-pools (no
# deterministic CUDA backward), declared in their own blocks.py.
TINY = """\
nc: 2
backbone:
  - [-1, 1, Conv, [8, 3, 2]] # 0
  - [-1, 1, Conv, [16, 3, 2]] # 1
  - [-1, 1, Conv, [16, 3, 2]] # 2
head:
  - [[-1], 1, Detect, [nc]] # 3
"""
GATED = """\
nc: 2
backbone:
  - [-1, 1, Conv, [8, 3, 2]] # 0
  - [-1, 1, Conv, [16, 3, 2]] # 1
  - [-1, 1, Conv, [16, 3, 2]] # 2
  - [-1, 1, MaxGate, [16]] # 3
head:
  - [[-1], 1, Detect, [nc]] # 4
"""
BLOCKS = """\
import torch
from torch import nn


class MaxGate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.fc = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc(self.pool(x)))
"""


def user_project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(TINY)
    (folder / "gated.yaml").write_text(GATED)
    (folder / "blocks.py").write_text(BLOCKS)
    return folder


# ---------------------------------------------------------------------------------------------------------
# the formats (fast)


def suites_of_every_kind() -> list[CheckSuite]:
    return [
        CheckSuite(
            "yolo-det audit",
            seconds=1.5,
            properties={"profile": "repro", "note": 'a "quoted" & <odd> value'},
            cases=[
                CheckCase("clean.yaml", "yolo-det.audit"),
                CheckCase(
                    "bad.yaml",
                    "yolo-det.audit",
                    "failed",
                    message="layer 3 breaks it",
                    details="line one\nline two",
                    file="models/bad.yaml",
                    line=6,
                ),
                CheckCase("odd\x1bname\x00.yaml", "yolo-det.audit", "error", message="could not read \x07 it"),
            ],
        ),
        CheckSuite("yolo-det verify", cases=[CheckCase("loss", "v", "skipped", message="not compared")]),
    ]


def test_junit_output_validates_against_the_junit_schema_and_counts_every_outcome(tmp_path):
    path = write_junit(tmp_path / "out.xml", suites_of_every_kind())
    SCHEMA.validate(str(path))
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert [s.name for s in suites] == ["yolo-det audit", "yolo-det verify"]
    audit = suites[0]
    assert (audit.tests, audit.failures, audit.errors, audit.skipped) == (3, 1, 1, 0)
    assert suites[1].skipped == 1
    cases = {c.name: c for c in audit}
    assert cases["clean.yaml"].is_passed
    bad = cases["bad.yaml"]
    assert not bad.is_passed
    assert bad.result[0].message == "models/bad.yaml:6: layer 3 breaks it"
    assert bad.result[0].text == "line one\nline two"
    # characters XML cannot hold are spelled out, not written raw (a raw one makes the file unreadable)
    assert "odd\\x1bname\\x00.yaml" in cases
    assert b"\x1b" not in path.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_schema_refuses_what_ci_systems_would_not_read():
    good = junit_xml(suites_of_every_kind()).decode()
    SCHEMA.validate(good)
    for broken in (
        good.replace('<testcase name="clean.yaml" ', "<testcase "),  # a case without a name
        good.replace('tests="3"', 'tests="three"', 1),  # a count that is not a number
        good.replace("<skipped ", "<skip "),
    ):  # an element JUnit has not
        assert broken != good
        with pytest.raises(xmlschema.XMLSchemaValidationError):
            SCHEMA.validate(broken)


def test_annotations_point_at_the_line_and_cannot_forge_a_command():
    suite = CheckSuite(
        "yolo-det audit",
        cases=[
            CheckCase("ok.yaml", "a"),
            CheckCase(
                "m,1:x.yaml", "a", "failed", message="bad\n::error file=x::forged 100%", file="dir,1/m:x.yaml", line=7
            ),
            CheckCase(
                "two.yaml",
                "a",
                "failed",
                message="two places",
                file="two.yaml",
                notes=(("two.yaml", 3, "first"), ("two.yaml", 9, "second")),
            ),
        ],
    )
    lines = github_annotations([suite])
    assert len(lines) == 3  # the passed case gives none; one per place of the second failure
    assert lines[0] == (
        "::error file=dir%2C1/m%3Ax.yaml,line=7,title=yolo-det audit%3A m%2C1%3Ax.yaml::"
        "bad%0A::error file=x::forged 100%25"
    )
    assert all("\n" not in line for line in lines)
    assert lines[1].startswith("::error file=two.yaml,line=3,")
    assert lines[1].endswith("::first")
    assert lines[2].startswith("::error file=two.yaml,line=9,")
    assert lines[2].endswith("::second")


def test_the_hook_keeps_model_yamls_only(tmp_path):
    project = user_project(tmp_path)
    (project / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: {0: a}\n")
    (project / "profile.yaml").write_text("name: mine\nextends: repro\n")
    (project / "broken.yaml").write_text("backbone: [\n")
    (project / "notes.txt").write_text("backbone: []\n")
    names = [
        str(project / n)
        for n in ("tiny.yaml", "data.yaml", "profile.yaml", "broken.yaml", "notes.txt", "deleted.yaml", "gated.yaml")
    ]
    models, other = split_model_yamls(names)
    assert models == [names[0], names[6]]
    assert other == names[1:6]


def run_record(index: int, steps: int = 3) -> RunRecord:
    rec = RunRecord(index=index, param_names=["a", "b"], loss_names=["box"], portable=True, data_root="/d")
    for s in range(1, steps + 1):
        mb = MicroBatch(index=s - 1, epoch=0, data=f"d{s}", files=(f"/d/{s}.png",), loss=(1.0 / s,), raw=f"r{s}")
        rec.steps.append(StepRecord(step=s, epoch=0, batches=[mb], grads=[f"g{s}a", f"g{s}b"], weights=f"w{s}"))
    rec.weights = {"model": "m"}
    return rec


def test_verify_gives_one_case_per_compared_quantity():
    from yolo_det.tools.verify.compare import compare_runs

    same = VerifyReport(
        profile="repro", args={}, runs=[run_record(1), run_record(2)], divergences=[], steps_requested=None, seconds=2.0
    )
    suite = verify_suite(same)
    assert [(c.name, c.outcome) for c in suite.cases] == [
        ("data", "passed"),
        ("loss", "passed"),
        ("gradients", "passed"),
        ("weights", "passed"),
    ]
    other = run_record(2)
    other.steps[1].grads = ["g2a", "noise"]
    other.weights = {"model": "n"}
    div = compare_runs(run_record(1), other)
    assert div is not None
    assert div.kind == "gradients"
    differs = VerifyReport(
        profile="repro", args={}, runs=[run_record(1), other], divergences=[div], steps_requested=None, seconds=2.0
    )
    cases = {c.name: c for c in verify_suite(differs).cases}
    assert cases["gradients"].outcome == "failed"
    assert "step 2" in cases["gradients"].message
    assert cases["data"].outcome == cases["loss"].outcome == "skipped"
    assert "matched through step 2" in cases["data"].message
    assert cases["weights"].outcome == "failed"
    assert {c.classname for c in cases.values()} == {"yolo-det.verify.run2"}
    SCHEMA.validate(junit_xml([verify_suite(differs)]).decode())


def test_against_a_saved_run_names_the_quantity_and_the_environment():
    saved = read_saved(
        {
            "schema": "yolo-det/verify-fingerprints",
            "version": 1,
            "digest": "fingerprint/1",
            "run": _run_to_dict(run_record(1)),
            "record": {},
        },
        "baseline.json",
    )
    here = run_record(2)
    here.steps[0].batches[0].data = "another batch"
    here.weights = {"model": "n"}
    suite = against_suite(compare_against(saved, here))
    outcome = {c.name: c.outcome for c in suite.cases}
    assert outcome == {"data": "failed", "loss": "skipped", "gradients": "skipped", "weights": "failed"}
    assert suite.properties["saved"] == "baseline.json"


# ---------------------------------------------------------------------------------------------------------
# the commands (real audits and trainings)


@pytest.mark.slow
def test_audit_junit_and_annotations_name_the_layer_line_and_fix(tmp_path, capsys, monkeypatch):
    project = user_project(tmp_path / "proj")
    monkeypatch.chdir(project)
    xml = tmp_path / "audit.xml"
    code = main(
        [
            "audit",
            "--import",
            "blocks.py",
            "tiny.yaml",
            "gated.yaml",
            "--imgsz",
            "64",
            "--junit",
            str(xml),
            "--annotations",
            "github",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    SCHEMA.validate(str(xml))
    suite = next(iter(JUnitXml.fromfile(str(xml))))
    cases = {c.name: c for c in suite}
    assert set(cases) == {"tiny.yaml", "gated.yaml"}
    assert cases["tiny.yaml"].is_passed
    failure = cases["gated.yaml"].result[0]
    assert failure.message.startswith("gated.yaml:6: 1 layer finding(s)")
    assert "MaxGate" in failure.text
    assert "DetAdaptiveMaxPool2d" in failure.text
    notes = [line for line in out.splitlines() if line.startswith("::error")]
    assert len(notes) == 1
    assert notes[0].startswith("::error file=gated.yaml,line=6,title=yolo-det audit%3A gated.yaml::layer 3 MaxGate")
    assert "fix: swap AdaptiveMaxPool2d" in notes[0]

    # --fail-on unhandled: the repro profile swaps the pool (passes); balanced leaves it non-deterministic
    assert main(["audit", "--import", "blocks.py", "gated.yaml", "--imgsz", "64", "--fail-on", "unhandled"]) == 0
    assert (
        main(
            [
                "audit",
                "--import",
                "blocks.py",
                "gated.yaml",
                "--imgsz",
                "64",
                "--fail-on",
                "unhandled",
                "--profile",
                "balanced",
            ]
        )
        == 1
    )
    assert "--fail-on unhandled" not in capsys.readouterr().out  # not the hook's output: the table
    assert sorted(p.name for p in project.iterdir()) == ["blocks.py", "gated.yaml", "tiny.yaml"]


def git(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def hook_source(tmp_path: Path) -> tuple[str, str]:
    """``(repo, rev)`` pre-commit installs the hooks from: this clone at HEAD when HEAD holds the working
    tree's ``.pre-commit-hooks.yaml``; otherwise a one-commit repository holding that file."""
    manifest = (ROOT / ".pre-commit-hooks.yaml").read_text()
    head = git(ROOT, "show", "HEAD:.pre-commit-hooks.yaml")
    if head.returncode == 0 and head.stdout == manifest:
        return str(ROOT), git(ROOT, "rev-parse", "HEAD").stdout.strip()
    src = tmp_path / "hooks-src"
    src.mkdir()
    (src / ".pre-commit-hooks.yaml").write_text(manifest)
    for argv in (("init", "-q"), ("add", "."), ("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "hooks")):
        assert git(src, *argv).returncode == 0
    return str(src), git(src, "rev-parse", "HEAD").stdout.strip()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pre_commit_refuses_a_commit_that_adds_a_max_pool_block(tmp_path):
    repo_url, rev = hook_source(tmp_path)
    project = tmp_path / "user-repo"
    project.mkdir()
    (project / "tiny.yaml").write_text(TINY)
    (project / "blocks.py").write_text(BLOCKS)
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {repo_url}\n    rev: {rev}\n    hooks:\n      - id: yolo-det-audit-system\n"
        "        args: [--import, blocks.py, --imgsz, '64']\n"
    )
    bindir = str(Path(sys.executable).parent)
    env = dict(
        os.environ,
        PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
        PRE_COMMIT_HOME=str(tmp_path / "pc"),
        PYTHONPATH=str(ROOT),
        YOLO_OFFLINE="1",
        GIT_AUTHOR_NAME="u",
        GIT_AUTHOR_EMAIL="u@u",
        GIT_COMMITTER_NAME="u",
        GIT_COMMITTER_EMAIL="u@u",
    )
    assert git(project, "init", "-q", env=env).returncode == 0
    install = subprocess.run(
        [sys.executable, "-m", "pre_commit", "install"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    git(project, "add", ".", env=env)
    clean = git(project, "commit", "-qm", "a clean model", env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "yolo-det audit" in clean.stdout + clean.stderr  # the hook ran, and passed

    (project / "tiny.yaml").write_text(GATED)
    git(project, "add", "tiny.yaml", env=env)
    refused = git(project, "commit", "-qm", "add a max-pool gate", env=env)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0, out
    assert "tiny.yaml:6: layer 3 MaxGate (model.3.pool) reaches adaptive_max_pool2d_backward_cuda" in out
    assert "fix: swap AdaptiveMaxPool2d -> yolo_det.layers.pooling.DetAdaptiveMaxPool2d" in out
    log = git(project, "log", "--oneline", env=env).stdout.splitlines()
    assert len(log) == 1  # the refused change was not committed


DRIFT = small_train_tokens(batch=8, nbs=8, val=False, device=None, exist_ok=None)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """A drift baseline as a user commits it: ``verify --steps 2 --save``, written by another process."""
    folder = tmp_path_factory.mktemp("baseline")
    path = folder / "baseline.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), YOLO_OFFLINE="1", YOLO_DET_CACHE=str(folder / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "yolo_det", "verify", "--steps", "2", "--save", str(path), *DRIFT],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return path


@pytest.mark.slow
def test_drift_check_passes_unchanged_and_names_the_change_that_moves_the_numbers(
    baseline, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    ok_xml, bad_xml = tmp_path / "ok.xml", tmp_path / "bad.xml"
    assert main(["verify", "--against", str(baseline), "--junit", str(ok_xml), *DRIFT]) == 0
    capsys.readouterr()
    SCHEMA.validate(str(ok_xml))
    assert all(c.is_passed for c in next(iter(JUnitXml.fromfile(str(ok_xml)))))

    # the baseline ran with Ultralytics' default seed (0); another seed moves the numbers as an upgrade would
    assert json.loads(baseline.read_text())["record"]["seeds"]
    code = main(
        ["verify", "--against", str(baseline), "--junit", str(bad_xml), "--annotations", "github", *DRIFT, "seed=1"]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "differs from the saved run at step 1 (epoch 1): data" in out
    assert "  seed: " in out
    SCHEMA.validate(str(bad_xml))
    cases = {c.name: c for c in next(iter(JUnitXml.fromfile(str(bad_xml))))}
    assert not cases["data"].is_passed
    assert "step 1" in cases["data"].result[0].message
    assert not cases["environment"].is_passed
    assert cases["environment"].result[0].message.startswith("differs from the saved run in seed")
    assert any(line.startswith("::error title=yolo-det verify --against%3A data::") for line in out.splitlines())


def test_diff_gives_a_weights_case_and_one_case_per_cause():
    from yolo_det.tools.ci_report import diff_suite
    from yolo_det.tools.diff import Difference, DiffReport

    same = DiffReport(a="runs/a", b="runs/b", weights={"a": "ab" * 32, "b": "ab" * 32})
    assert [(c.name, c.outcome) for c in diff_suite(same).cases] == [("weights", "passed"), ("configuration", "passed")]
    other = DiffReport(
        a="runs/a",
        b="runs/c",
        weights={"a": "ab" * 32, "b": "cd" * 32},
        differences=[
            Difference(group="seeds", name="seed", a=0, b=1),
            Difference(group="environment", name="hostname", a="x", b="y", changes_bits=False),
        ],
    )
    cases = diff_suite(other).cases
    assert [(c.name, c.outcome) for c in cases] == [("weights", "failed"), ("configuration seed", "failed")]
    assert cases[1].message == "seed: 0 | 1"
    SCHEMA.validate(junit_xml([diff_suite(other)]).decode())
