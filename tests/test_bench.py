"""yolo-det bench: one row per profile, a valid PNG chart, per-setting costs, the swap extension point, bad input."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from yolo_det.cli import main
from yolo_det.core.state import snapshot
from yolo_det.tools import bench as bench_module
from yolo_det.tools.bench import ISOLATIONS, bench, register_scope, unregister_scope
from yolo_det.tools.bench import scopes as bench_scopes
from yolo_det.tools.bench.memory import _Memory
from yolo_det.tools.prepare import prepare
from yolo_det.tools.runtime import PNG_SIGNATURE

TINY = ["imgsz=64", "batch=8", "workers=0"]
FAST = ["--steps", "2", "--warmup", "1", "--block", "1"]


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--profiles", ""], "--profiles"),
        (["--profiles", "repro,,fast"], "--profiles"),
        (["--profiles", "repro,fsat"], "Did you mean 'fast'"),
        (["--profiles", "repro,repro"], "more than once"),
        (["--steps", "0"], "--steps"),
        (["--warmup", "-1"], "--warmup"),
        (["--block", "0"], "--block"),
        (["resume=True"], "resume"),
        (["device=0,1"], "one device"),
        (["imgsz"], "key=value"),
        (["--plot", "chart.svg"], ".png"),
        (["--plot", "nowhere/chart.png"], "does not exist"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert tree(tmp_path) == before


def test_cpu_memory_measure_sees_an_allocation():
    mem = _Memory(torch.device("cpu"))
    if not mem.available:
        pytest.skip("peak RSS is measured on Linux only")
    mem.begin()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    result = mem.end()
    del block
    assert result is not None
    peak, over_start = result
    assert over_start >= 48 * 2**20
    assert peak >= over_start


def test_isolations_name_real_settings_and_bases():
    from yolo_det.core.profiles import PhaseSettings

    fields = set(PhaseSettings().to_dict())
    for iso in ISOLATIONS:
        assert iso.setting in fields
        assert set(iso.changes) <= fields
        assert iso.base in bench_module.BASES
        toggled = bench_module.BASES[iso.base].replace(**iso.changes)
        assert toggled != bench_module.BASES[iso.base]  # the toggle changes something


@pytest.mark.slow
def test_cli_json_has_one_row_per_profile_and_the_chart_is_a_png(tmp_path, capsys):
    before = snapshot()
    chart = tmp_path / "cost.png"
    code = main(
        [
            "bench",
            "--profiles",
            "fast,repro,balanced",
            *FAST,
            "--json",
            "--plot",
            str(chart),
            *TINY,
            f"project={tmp_path / 'runs'}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)  # stdout is JSON only
    assert data["schema"] == "yolo-det/bench/1"
    assert [r["profile"] for r in data["rows"]] == ["fast", "repro", "balanced"]
    for row in data["rows"]:
        assert row["steps"] == 2
        assert row["step_ms"] > 0
        assert row["images_per_s"] == pytest.approx(8 / row["step_ms"] * 1e3)
        assert row["time_ratio"] >= 1.0
    assert min(r["time_ratio"] for r in data["rows"]) == 1.0
    assert data["fastest"] in {"fast", "repro", "balanced"}
    statuses = {s["setting"]: s["status"] for s in data["settings"]}
    assert statuses["deterministic_algorithms"] == "measured"
    assert statuses["backward"] == "measured"
    assert statuses["cudnn_benchmark"] == "not applicable on cpu"
    assert statuses["swaps"] == "measured"
    assert statuses["intercept"] == "measured"
    assert data["overhead"]["per_step_us"] > 0
    assert data["overhead"]["percent_of_median_step"] > 0
    assert data["plot"] == str(chart)
    assert chart.read_bytes()[:8] == PNG_SIGNATURE
    from PIL import Image

    with Image.open(chart) as im:
        im.verify()
    import matplotlib.image

    assert matplotlib.image.imread(str(chart)).shape[2] in (3, 4)
    assert snapshot() == before


@pytest.mark.slow
def test_registered_scope_applies_swaps_around_every_block(tmp_path):
    seen: list[str] = []
    depth = {"n": 0}

    @contextlib.contextmanager
    def fake_swaps(model, settings):
        assert isinstance(model, torch.nn.Module)
        assert model.training
        depth["n"] += 1
        seen.append(settings.swaps)
        try:
            yield
        finally:
            depth["n"] -= 1

    def factory(model, settings):
        return fake_swaps(model, settings) if settings.swaps != "none" else None

    register_scope(factory, handles={"swaps"})
    try:
        _, args = prepare("repro", [*TINY, f"project={tmp_path}"])
        report = bench("repro,fast", args, steps=2, warmup=1, block=1)
    finally:
        unregister_scope(factory)
    assert depth["n"] == 0
    assert seen
    assert set(seen) == {"auto"}
    rows = {s["setting"]: s for s in report.settings}
    assert rows["swaps"]["status"] == "measured"
    assert rows["swaps"]["toggled_ms"] > 0
    assert rows["intercept"]["status"] == "measured"  # the built-in scope handles it
    repro = report.rows[0]
    assert repro["profile"] == "repro"
    assert repro["notes"] == []
    table = report.table()
    assert "repro" in table
    assert "fast" in table
    assert "bench overhead" in table
    assert "swaps=auto" in table
    assert factory not in [f for f, _ in bench_scopes._SCOPES]


@pytest.mark.slow
def test_a_profile_that_raises_is_reported_and_the_others_still_measured(tmp_path):
    message = "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation"

    @contextlib.contextmanager
    def strict_breaks(model, settings):
        def hook(module, args):
            strict = torch.are_deterministic_algorithms_enabled()
            if strict and not torch.is_deterministic_algorithms_warn_only_enabled():
                raise RuntimeError(message)

        handle = model.register_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    def factory(model, settings):
        return strict_breaks(model, settings)

    register_scope(factory, handles=())
    try:
        _, args = prepare("repro", [*TINY, f"project={tmp_path}"])
        report = bench("repro,fast", args, steps=2, warmup=1, block=1)
    finally:
        unregister_scope(factory)
    repro, fast = report.rows
    assert repro["error"]
    assert message in repro["error"]
    assert repro["step_ms"] is None
    assert repro["steps"] == 0
    assert fast["error"] is None
    assert fast["steps"] == 2
    assert fast["time_ratio"] == 1.0
    assert report.fastest == "fast"
    rows = {s["setting"]: s for s in report.settings}
    assert rows["fill_uninitialized_memory"]["status"].startswith("error:")  # its base is strict
    assert rows["deterministic_algorithms"]["status"].startswith("error:")  # strict, toggled from everything off
    assert rows["allow_tf32"]["status"] == "not applicable on cpu"  # TF32 exists on CUDA only
    assert "raised:" in report.table()
