"""docs/cost.md's profile tables are generated from bench/results (bench/make_cost_tables.py)."""

from __future__ import annotations

import importlib.util
import json

from helpers import ROOT

spec = importlib.util.spec_from_file_location("make_cost_tables", ROOT / "bench" / "make_cost_tables.py")
assert spec is not None
assert spec.loader is not None
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)


def test_the_page_matches_the_results():
    page = tables.PAGE.read_text(encoding="utf-8")
    assert page.count("<!-- generated from bench/results/") == 3
    assert tables.main(["--check"]) == 0


def test_a_new_result_rewrites_only_its_table(tmp_path, monkeypatch):
    result = json.loads((tables.RESULTS / "bench.json").read_text())
    result["rows"][0]["step_ms"] = 123.4
    (tmp_path / "bench.json").write_text(json.dumps(result))
    (tmp_path / "bench_h200.json").write_text((tables.RESULTS / "bench_h200.json").read_text())
    (tmp_path / "accuracy.json").write_text((tables.RESULTS / "accuracy.json").read_text())
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    page = tables.PAGE.read_text(encoding="utf-8")
    new = tables.render(page)
    changed = [(a, b) for a, b in zip(page.splitlines(), new.splitlines()) if a != b]
    assert len(changed) == 1
    assert changed[0][1].startswith(f"| {result['rows'][0]['profile']} | 123 ms |")


def test_the_accuracy_table_is_the_one_its_json_holds(tmp_path, monkeypatch):
    for name in ("bench.json", "bench_h200.json"):
        (tmp_path / name).write_text((tables.RESULTS / name).read_text())
    result = json.loads((tables.RESULTS / "accuracy.json").read_text())
    result["table"] = result["table"].replace("| plain |", "| plain (changed) |")
    (tmp_path / "accuracy.json").write_text(json.dumps(result))
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    page = tables.PAGE.read_text(encoding="utf-8")
    changed = [(a, b) for a, b in zip(page.splitlines(), tables.render(page).splitlines()) if a != b]
    assert len(changed) == 1
    assert changed[0][1].startswith("| plain (changed) |")
