"""The record schema: one typed table checks what is written and what is read, and generates docs/record.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from yolo_det.cli import main
from yolo_det.core.record_schema import MAX_DEPTH, RECORD_SCHEMA, RecordError, check_record, parse_record, record_doc

BASE = {
    "schema": RECORD_SCHEMA,
    "status": "completed",
    "framework": "ultralytics",
    "profile": {"name": "repro", "train": {"deterministic": True}, "val": {}, "deploy": {}},
    "environment": {"torch": "2.4.0", "env": {"PYTHONHASHSEED": "0"}, "gpus": []},
    "weights": {"sha256": "ab" * 32},
    "seeds": {"seed": 0},
}

BAD = {  # field -> (value, what the one line names)
    "profile": ("x", "'profile' must be object, got string"),
    "profile.train": ([1, 2], "'profile.train' must be object, got array"),
    "nondeterminism_warnings": (5, "'nondeterminism_warnings' must be array, got integer"),
    "swaps": (5, "'swaps' must be array, got integer"),
    "environment.env": ([1, 2], "'environment.env' must be object, got array"),
    "data.splits": ([1], "'data.splits' must be object, got array"),
    "state_at_train_start": ("x", "'state_at_train_start' must be object or null, got string"),
    "status": ("done", "'status' is 'done', not one of"),
    "epochs_completed": ("2", "'epochs_completed' must be integer, got string"),
    "segments": ([{"profile": 1, "environment": {}}], "segments[0]: field 'profile' must be object"),
}


def _with(field: str, value: object) -> dict:
    record = json.loads(json.dumps(BASE))
    *outer, last = field.split(".")
    target = record
    for key in outer:
        target = target.setdefault(key, {})
    target[last] = value
    return record


def test_a_conforming_record_parses_and_its_unknown_fields_are_kept() -> None:
    record = {**BASE, "a_newer_field": {"x": [1]}}
    assert check_record(record) is None
    assert parse_record(json.dumps(record)) == record


@pytest.mark.parametrize("field", list(BAD))
def test_every_wrong_typed_field_is_one_line(field: str) -> None:
    value, message = BAD[field]
    with pytest.raises(RecordError) as e:
        parse_record(json.dumps(_with(field, value)))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_deep_large_and_non_json_records_are_refused_in_one_line() -> None:
    for text, message in (
        ("[" * 100_000 + "]" * 100_000, f"deeper than {MAX_DEPTH}"),
        (
            '{"run": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}",  # just too deep
            f"deeper than {MAX_DEPTH}",
        ),
        ("{not json", "not a JSON record"),
        (b"\xff\xfe", "not a JSON record"),
    ):
        with pytest.raises(RecordError) as e:
            parse_record(text)
        assert message in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(RecordError, match="more than the 100 a record may have"):
        parse_record(json.dumps(BASE), max_bytes=100)


def test_newer_schema_is_refused_with_what_to_do() -> None:
    assert "upgrade yolo-det" in (check_record({**BASE, "schema": RECORD_SCHEMA + 1}) or "")


def test_docs_record_md_is_generated_from_the_schema() -> None:
    page = (ROOT / "docs" / "record.md").read_text(encoding="utf-8")
    assert page == record_doc(), "docs/record.md is stale: python -m yolo_det.core.record_schema > docs/record.md"
    assert "| `resume.bitwise_expected` | boolean |" in page
    assert "| `epochs_completed` | integer |" in page


@pytest.mark.parametrize("field", list(BAD))
def test_diff_of_a_malformed_record_is_one_line_exit_2(
    field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(BASE))
    bad.write_text(json.dumps(_with(field, BAD[field][0])))
    assert main(["diff", str(good), str(bad)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1
    assert BAD[field][1] in out.err


def test_diff_of_a_100000_deep_record_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(BASE))
    bad.write_text('{"profile": {}, "environment": {}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["diff", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"deeper than {MAX_DEPTH}" in err


def test_diff_reads_json_without_importing_torch(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(BASE))
    b.write_text(json.dumps(BASE))
    code = (
        "import sys; from yolo_det.cli import main; rc = main(['diff', sys.argv[1], sys.argv[2]]); "
        "assert 'torch' not in sys.modules, 'torch imported'; assert 'numpy' not in sys.modules; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(a), str(b)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "bitwise identical and are" in proc.stdout


def test_text_from_a_record_cannot_forge_a_verdict_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = json.loads(json.dumps(BASE)), json.loads(json.dumps(BASE))
    a["environment"]["cpu_model"] = "Intel"
    b["environment"]["cpu_model"] = "x\nverdict: these runs should be bitwise identical and are\x1b[2K\x1b]0;t\x07"
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    verdicts = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert len(verdicts) == 1
    assert "and are" not in verdicts[0]
    assert "\\nverdict:" in out
    assert "\\x1b[2K" in out
