"""The audit: fake-CUDA trace, attribution to modules and YAML layers, matching, report, CLI."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchvision
import yaml
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from helpers import MODELS, ROOT
from yolo_det import AuditReport, audit
from yolo_det.analysis.audit.trace import _real_trace
from yolo_det.analysis.emulator import emulate_cuda_alerts
from yolo_det.analysis.loader import load_model
from yolo_det.analysis.models import resolve_model_yaml
from yolo_det.analysis.optable import load_table
from yolo_det.analysis.zoo import ZOO_MODULES
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError, ModelError, ProfileError
from yolo_det.layers.registry import registered


@pytest.fixture(autouse=True)
def _clean_state() -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    assert (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ) == before
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()


def _rows(path: Path) -> list[tuple[int, str, int]]:
    """(layer index, module name, 1-based line) of a model YAML, found from the text (independently of the loader)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    rows = data["backbone"] + data["head"]
    lines = path.read_text(encoding="utf-8").splitlines()
    row_lines = [n + 1 for n, line in enumerate(lines) if re.match(r"^\s*-\s*\[", line)]
    assert len(row_lines) == len(rows)
    return [(i, row[2], row_lines[i]) for i, row in enumerate(rows)]


def _layers(report: AuditReport) -> set[int]:
    return {f.layer for f in report.findings if f.breaks_determinism}


# ---------------------------------------------------------------------------------------------------------
# the test models of data/models


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "module", "kernel"),
    [
        ("cbam-max", "CBAMMax", "adaptive_max_pool2d_backward_cuda"),
        ("coordatt", "CoordAtt", "adaptive_avg_pool2d_backward_cuda"),
        ("gridsample-up", "GridSampleUpsample", "grid_sampler_2d_backward_cuda"),
        ("bicubic-up", "nn.Upsample", "upsample_bicubic2d_backward_out_cuda"),
    ],
)
def test_zoo_models_are_reported_at_their_layer(name: str, module: str, kernel: str) -> None:
    path = MODELS / f"{name}.yaml"
    rows = yaml.safe_load(path.read_text(encoding="utf-8"))
    args = [row[3] for row in rows["backbone"] + rows["head"]]
    # an nn.Upsample reaches the bicubic kernel only in bicubic mode (nearest upsampling is another kernel)
    expected = [(i, line) for i, m, line in _rows(path) if m == module and (m != "nn.Upsample" or "bicubic" in args[i])]
    assert expected, f"{name}.yaml has no {module} row"
    report = audit(path, imgsz=64)
    assert not report.ok
    assert report.exit_code == 1
    assert {(f.layer, f.yaml_line) for f in report.findings} == set(expected)
    assert {f.kernel for f in report.findings} == {kernel}
    assert all(f.pass_ == "backward" and f.behaviour["strict"] == "raises RuntimeError" for f in report.findings)


@pytest.mark.slow
def test_attention_mix_reports_both_blocks() -> None:
    path = MODELS / "attention-mix.yaml"
    rows = {m: i for i, m, _ in _rows(path)}
    report = audit(path, imgsz=64)
    by_layer = {(f.layer, f.layer_class, f.module_class, f.entry) for f in report.findings}
    assert by_layer == {
        (rows["CBAMMax"], "CBAMMax", "AdaptiveMaxPool2d", "adaptive_max_pool2d"),
        (rows["CoordAtt"], "CoordAtt", "AdaptiveAvgPool2d", "adaptive_avg_pool2d"),
    }
    modules = {f.module for f in report.findings}
    assert modules == {
        f"model.{rows['CBAMMax']}.max_pool",
        f"model.{rows['CoordAtt']}.pool_h",
        f"model.{rows['CoordAtt']}.pool_w",
    }


@pytest.mark.slow
def test_fix_and_profile_columns() -> None:
    report = audit(MODELS / "cbam-max.yaml", imgsz=64, profile="balanced")
    (f,) = report.findings
    assert f.fix == "swap AdaptiveMaxPool2d -> yolo_det.layers.pooling.DetAdaptiveMaxPool2d"
    assert f.under_profile.startswith("no error; non-deterministic")  # balanced turns the flag off in backward
    repro = audit(MODELS / "cbam-max.yaml", imgsz=64, profile="repro").findings[0]
    assert "DetAdaptiveMaxPool2d" in repro.under_profile
    assert "swaps: auto" in repro.under_profile
    grid = audit(MODELS / "gridsample-up.yaml", imgsz=64).findings[0]
    assert grid.call == "torch.nn.functional.grid_sample"
    assert grid.fix == "replace grid_sample -> yolo_det.layers.grid_sample.grid_sample"
    assert grid.under_profile.startswith("intercepted")


# ---------------------------------------------------------------------------------------------------------
# stock Ultralytics models


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolov8n.yaml", "yolo11n.yaml", "yolov5nu.yaml"])
def test_stock_detectors_audit_clean(name: str) -> None:
    report = audit(name, imgsz=320)
    assert report.ok
    assert report.findings == []
    assert report.exit_code == 0
    assert report.stats["backward_nodes_run"] > 100
    assert not report.notes


def _stock_row(name: str, module: str) -> tuple[int, int]:
    path = resolve_model_yaml(name)
    assert path is not None
    (row,) = [(i, line) for i, m, line in _rows(path) if m == module]
    return row


@pytest.mark.slow
def test_rtdetr_reports_grid_sample_in_its_decoder() -> None:
    index, line = _stock_row("rtdetr-l.yaml", "RTDETRDecoder")
    report = audit("rtdetr-l.yaml", imgsz=320)
    assert not report.ok
    decoder = load_model("rtdetr-l.yaml").model.model[index]
    n_layers = len(decoder.decoder.layers)
    assert len(report.findings) == n_layers  # one MSDeformAttn per decoder layer
    for f in report.findings:
        assert (f.layer, f.yaml_line, f.layer_class, f.module_class) == (index, line, "RTDETRDecoder", "MSDeformAttn")
        assert f.kernel == "grid_sampler_2d_backward_cuda"
        assert f.call == "torch.nn.functional.grid_sample"


@pytest.mark.slow
def test_yolo_world_v1_reports_its_adaptive_max_pool() -> None:
    index, line = _stock_row("yolov8s-world.yaml", "ImagePoolingAttn")
    report = audit("yolov8s-world.yaml", imgsz=320)
    assert {(f.layer, f.yaml_line, f.layer_class, f.entry) for f in report.findings} == {
        (index, line, "ImagePoolingAttn", "adaptive_max_pool2d")
    }
    assert {f.module for f in report.findings} == {f"model.{index}.im_pools.{k}" for k in range(3)}


# ---------------------------------------------------------------------------------------------------------
# version handling and the flag at forward time


def _bilinear_yaml(tmp_path: Path) -> Path:
    text = (MODELS / "bicubic-up.yaml").read_text(encoding="utf-8").replace('"bicubic"', '"bilinear"')
    path = tmp_path / "bilinear-up.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
def test_bilinear_verdict_depends_on_the_torch_version(tmp_path: Path) -> None:
    path = _bilinear_yaml(tmp_path)
    upsample_rows = {i for i, m, _ in _rows(path) if m == "nn.Upsample"}
    today = audit(path, imgsz=64)
    assert today.ok
    assert today.findings == []
    old = audit(path, imgsz=64, torch_version="2.0.1")
    assert not old.ok
    assert old.torch_version == "2.0.1"
    expected = {(i, "upsample_bilinear2d_backward_out_cuda") for i in upsample_rows}
    assert {(f.layer, f.kernel) for f in old.findings} == expected
    assert all("decomposition" in f.note for f in old.findings)


@pytest.mark.slow
def test_bilinear_without_the_flag_at_forward_time(tmp_path: Path) -> None:
    path = _bilinear_yaml(tmp_path)
    report = audit(path, imgsz=64, profile="fast")  # fast trains with deterministic algorithms off
    assert {f.entry for f in report.findings} == {"upsample_bilinear2d"}
    assert all(f.under_profile == "non-deterministic, no message" for f in report.findings)


@pytest.mark.slow
def test_a_custom_table_for_torch_2_0(tmp_path: Path) -> None:
    # The same model and torch, two tables: one saying bilinear always alerts on 2.0 and one as shipped.
    path = _bilinear_yaml(tmp_path)
    text = (
        Path(load_table().source)
        if Path(load_table().source).is_file()
        else ROOT / "yolo_det" / "data" / "nondeterministic_ops.yaml"
    ).read_text(encoding="utf-8")
    custom = tmp_path / "table.yaml"
    custom.write_text(
        text.replace('- {torch: ">=2.1", when: native_path}', '- {torch: ">=2.1", when: always}'), encoding="utf-8"
    )
    assert audit(path, imgsz=64).ok
    assert not audit(path, imgsz=64, table=custom).ok


# ---------------------------------------------------------------------------------------------------------
# single ops, each through the whole trace (the table's [PROBE] claims)


class _Probe(nn.Module):
    """A 1x1 convolution (so that gradients flow) followed by the op under test."""

    def __init__(
        self, op: Callable[[Any, torch.Tensor], Any], weight: torch.Tensor | None = None, **modules: nn.Module
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.w = nn.Parameter(weight) if weight is not None else None
        for name, m in modules.items():
            self.add_module(name, m)
        self.op = op

    def forward(self, x: torch.Tensor) -> Any:
        return self.op(self, self.conv(x))


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 2 + torch.histc(g, bins=4).sum() * 0  # histc alerts on CUDA: inside a custom backward


@torch.library.custom_op("ydtest::scale", mutates_args=())
def _ext_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_ext_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_ext_scale.register_autograd(lambda ctx, g: g * 2)


def _grid(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape[0], 3, 3, 2, device=x.device, dtype=x.dtype)


PROBES: dict[str, tuple[Callable[[], nn.Module], set[str]]] = {
    "adaptive max pool": (lambda: _Probe(lambda s, x: s.p(x), p=nn.AdaptiveMaxPool2d(1)), {"adaptive_max_pool2d"}),
    "adaptive avg pool (None,1)": (
        lambda: _Probe(lambda s, x: s.p(x), p=nn.AdaptiveAvgPool2d((None, 1))),
        {"adaptive_avg_pool2d"},
    ),
    "adaptive avg pool 1": (lambda: _Probe(lambda s, x: s.p(x), p=nn.AdaptiveAvgPool2d(1)), set()),
    "bilinear": (lambda: _Probe(lambda s, x: s.p(x), p=nn.Upsample(scale_factor=2, mode="bilinear")), set()),
    "bilinear antialias": (
        lambda: _Probe(lambda s, x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)),
        {"upsample_bilinear2d_aa"},
    ),
    "bicubic": (
        lambda: _Probe(lambda s, x: s.p(x), p=nn.Upsample(scale_factor=2, mode="bicubic")),
        {"upsample_bicubic2d"},
    ),
    "nearest": (lambda: _Probe(lambda s, x: s.p(x), p=nn.Upsample(scale_factor=2)), set()),
    "reflection pad 2d": (lambda: _Probe(lambda s, x: s.p(x), p=nn.ReflectionPad2d(1)), set()),
    "reflection pad 1d": (
        lambda: _Probe(lambda s, x: s.p(x.flatten(2)), p=nn.ReflectionPad1d(1)),
        {"reflection_pad1d"},
    ),
    "replication pad 2d": (lambda: _Probe(lambda s, x: s.p(x), p=nn.ReplicationPad2d(1)), set()),
    "grid_sample": (lambda: _Probe(lambda s, x: F.grid_sample(x, _grid(x), align_corners=False)), {"grid_sampler_2d"}),
    "grid_sample cudnn": (
        lambda: _Probe(lambda s, x: F.grid_sample(x, _grid(x), align_corners=True)),
        {"cudnn_grid_sampler"},
    ),
    "cross entropy 4-D": (
        lambda: _Probe(lambda s, x: F.cross_entropy(x, torch.zeros_like(x[:, 0], dtype=torch.long))),
        {"nll_loss2d"},
    ),
    "cross entropy 2-D": (
        lambda: _Probe(lambda s, x: F.cross_entropy(x.mean((2, 3)), torch.zeros_like(x[:, 0, 0, 0], dtype=torch.long))),
        set(),
    ),
    "deform_conv2d": (
        lambda: _Probe(
            lambda s, x: torchvision.ops.deform_conv2d(
                x, torch.zeros(x.shape[0], 18, x.shape[2], x.shape[3], device=x.device), s.w, padding=1
            ),
            weight=torch.zeros(4, 4, 3, 3),
        ),
        {"deform_conv2d"},
    ),
    "custom Function": (lambda: _Probe(lambda s, x: _Twice.apply(x)), {"custom_function", "histc"}),
    "extension op": (lambda: _Probe(lambda s, x: _ext_scale(x)), {"extension"}),
    "embedding_bag max": (
        lambda: _Probe(
            lambda s, x: F.embedding_bag(
                torch.zeros(4, dtype=torch.long, device=x.device),
                x.flatten(1)[:, :3],
                torch.tensor([0, 2], device=x.device),
                mode="max",
            )
        ),
        {"embedding_bag_max"},
    ),
    "embedding_bag sum": (
        lambda: _Probe(
            lambda s, x: F.embedding_bag(
                torch.zeros(4, dtype=torch.long, device=x.device),
                x.flatten(1)[:, :3],
                torch.tensor([0, 2], device=x.device),
                mode="sum",
            )
        ),
        set(),
    ),
    "sdpa": (lambda: _Probe(lambda s, x: F.scaled_dot_product_attention(x, x, x)), {"sdpa"}),
}


@pytest.mark.parametrize("case", sorted(PROBES))
def test_single_ops(case: str) -> None:
    factory, expected = PROBES[case]
    report = audit(factory(), imgsz=16)
    assert {f.entry for f in report.findings} == expected
    assert report.ok is not any(f.effect in ("alert", "silent") for f in report.findings)
    for f in report.findings:
        assert f.layer is None
        assert f.yaml_line is None


def test_effects_decide_ok() -> None:
    assert audit(PROBES["sdpa"][0](), imgsz=16).ok  # strict mode picks a deterministic SDPA algorithm
    custom = audit(PROBES["custom Function"][0](), imgsz=16)
    by_entry = {f.entry: f for f in custom.findings}
    assert by_entry["custom_function"].effect == "review"
    assert by_entry["custom_function"].op == "_TwiceBackward"
    assert by_entry["histc"].pass_ == "forward"
    assert by_entry["histc"].module == ""
    assert not custom.ok  # because of the histc in its backward, not because it is custom
    ext = audit(PROBES["extension op"][0](), imgsz=16)
    assert ext.findings[0].op == "ydtest::scale"
    assert ext.findings[0].effect == "silent"
    assert not ext.ok


# ---------------------------------------------------------------------------------------------------------
# the training loss (a real CPU step on a synthetic batch)


@pytest.mark.slow
def test_loss_pass_reports_the_losss_own_ops() -> None:
    from ultralytics.cfg import get_cfg

    from yolo_det.analysis.audit.entry import _load

    loaded = _load("yolov8n-seg.yaml")
    loaded.model.args = get_cfg(overrides={"mask_ratio": 1})  # full-size masks: the loss resizes the prototypes
    assert audit(loaded, imgsz=64, loss=True).ok  # bilinear under the flag: decomposed on today's torch
    old = audit(loaded, imgsz=64, loss=True, torch_version="2.0.1")
    assert {(f.module, f.module_class, f.entry, f.call) for f in old.findings} == {
        ("(loss)", "v8SegmentationLoss", "upsample_bilinear2d", "torch.nn.functional.interpolate")
    }
    assert audit(loaded, imgsz=64, torch_version="2.0.1").ok  # without loss=True the loss is not looked at


def test_loss_pass_needs_an_ultralytics_model() -> None:
    with pytest.raises(ConfigError, match="needs an Ultralytics model"):
        audit(PROBES["nearest"][0](), imgsz=16, loss=True)


# ---------------------------------------------------------------------------------------------------------
# inputs: YAML, checkpoint, factory, module objects


@pytest.mark.slow
def test_checkpoint_input_keeps_layers_and_lines(tmp_path: Path) -> None:
    with registered(ZOO_MODULES):
        model = load_model(MODELS / "cbam-max.yaml").model
    ckpt = tmp_path / "last.pt"
    torch.save({"model": model, "epoch": 1}, ckpt)
    report = audit(str(ckpt), imgsz=64)
    rows = {m: (i, line) for i, m, line in _rows(MODELS / "cbam-max.yaml")}
    assert {(f.layer, f.yaml_line) for f in report.findings} == {rows["CBAMMax"]}
    assert report.model == str(ckpt)


def test_factory_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models_ydt.py").write_text(
        textwrap.dedent("""
        from torch import nn
        def build():
            return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveMaxPool2d(2))
    """),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    report = audit("my_models_ydt:build", imgsz=32)
    assert [(f.module, f.module_class, f.layer) for f in report.findings] == [("2", "AdaptiveMaxPool2d", None)]


@pytest.mark.slow
def test_ultralytics_yolo_object_and_model_state_unchanged() -> None:
    from ultralytics import YOLO

    with registered(ZOO_MODULES):
        yolo = YOLO(str(MODELS / "cbam-max.yaml"))
    model = yolo.model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    attrs = {id(m): dict(vars(m)) for m in model.modules()}
    report = audit(yolo, imgsz=64)
    assert {f.layer for f in report.findings} == {10}
    assert not model.training
    assert all(not m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(vars(m).keys() == attrs[id(m)].keys() for m in model.modules())


@pytest.mark.slow
def test_auditing_twice_gives_the_same_report() -> None:
    loaded = load_model("rtdetr-l.yaml")  # its decoder caches anchors: the audit must not leave fakes behind
    first = audit(loaded, imgsz=320)
    second = audit(loaded, imgsz=320)
    assert [f.to_dict() for f in first.findings] == [f.to_dict() for f in second.findings]
    out = loaded.model.eval()(torch.zeros(1, 3, 64, 64))  # still a working real model
    assert torch.isfinite(out[0]).all()


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("missing.yaml", ModelError, "not found"),
        ("missing.pt", ModelError, "not found"),
        ("no_such_pkg_ydt.sub:make", ModelError, "cannot import"),
        ("yolo_det.analysis.zoo:nothing_here", ModelError, "has no callable 'nothing_here'"),
    ],
)
def test_bad_model_specs(spec: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        audit(spec)


@pytest.mark.slow
def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="not a multiple of the model's stride 32; use 96 or 128"):
        audit("yolov8n.yaml", imgsz=100)
    with pytest.raises(ConfigError, match="positive integer"):
        audit("yolov8n.yaml", imgsz=0)
    with pytest.raises(ConfigError, match="positive integer"):
        audit("yolov8n.yaml", batch=-1)
    with pytest.raises(ConfigError, match="not a torch version"):
        audit("yolov8n.yaml", torch_version="new")
    with pytest.raises(ProfileError, match="unknown profile"):
        audit("yolov8n.yaml", profile="repo")
    with pytest.raises(ConfigError, match="device must be"):
        audit("yolov8n.yaml", device="tpu")


# ---------------------------------------------------------------------------------------------------------
# report


@pytest.mark.slow
def test_report_formats() -> None:
    report = audit(MODELS / "attention-mix.yaml", imgsz=64)
    table = report.format_table()
    assert "adaptive_max_pool2d_backward_cuda" in table
    assert "10 CBAMMax" in table
    assert "verdict: NOT deterministic under strict mode: 3 findings (layers 10, 17)" in table
    assert "strict: raises RuntimeError | warn_only: warns; non-deterministic" in table
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False
    assert data["yaml_path"].endswith("attention-mix.yaml")
    assert {f["layer"] for f in data["findings"]} == {10, 17}
    assert set(data["findings"][0]) >= {"layer", "module", "module_class", "kernel", "pass", "behaviour", "fix"}
    clean = audit("yolov8n.yaml", imgsz=320).format_table()
    assert clean.endswith("verdict: trains under strict determinism")


# ---------------------------------------------------------------------------------------------------------
# CLI


@pytest.mark.slow
def test_cli_exit_codes_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "yolov8n.yaml", "--imgsz", "320"]) == 0
    assert "trains under strict determinism" in capsys.readouterr().out
    assert main(["audit", str(MODELS / "cbam-max.yaml"), "--imgsz", "64", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["layer"] == 10
    assert data["findings"][0]["kernel"] == "adaptive_max_pool2d_backward_cuda"


def test_cli_audits_several_models_in_one_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    cbam = "data/models/cbam-max.yaml"
    assert main(["audit", "yolov8n.yaml", cbam, "--imgsz", "64"]) == 1  # the worst verdict decides
    out = capsys.readouterr().out
    first, second = out.index("== yolov8n.yaml (1/2) =="), out.index(f"== {cbam} (2/2) ==")
    assert first < out.index("trains under strict determinism") < second
    assert "adaptive_max_pool2d_backward_cuda" in out[second:]
    assert "adaptive_max_pool2d" not in out[:second]
    assert main(["audit", "yolov8n.yaml", "yolov8n.yaml", "--imgsz", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list)
    assert len(data) == 2
    assert all(r["findings"] == [] for r in data)
    assert data[0]["model"] == data[1]["model"]


@pytest.mark.slow
def test_cli_several_models_one_bad_prints_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["audit", "yolov8n.yaml", "missing-model.yaml", "--imgsz", "64"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "missing-model.yaml" in err
    assert main(["audit", "yolov8n.yaml", "data/models/cbam-max.yaml", "--fix", "-o", "x.yaml"]) == 2
    assert "one model" in capsys.readouterr().err


def _bad_yamls(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]\nhead: []\n", encoding="utf-8")
    unknown = tmp_path / "unknown.yaml"
    shutil.copy(MODELS / "cbam-max.yaml", unknown)
    unknown.write_text(unknown.read_text(encoding="utf-8").replace("CBAMMax, [128]", "CBAMax, [128]"), encoding="utf-8")
    return {
        "malformed": (malformed, r"malformed\.yaml:\d+: malformed YAML"),
        "unknown": (unknown, r"unknown\.yaml:18: unknown module 'CBAMax' in layer 10.*Did you mean 'CBAMMax'\?"),
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["missing-model.yaml"],
        ["data/models/cbam-max.yaml", "--imgsz", "100"],
        ["data/models/cbam-max.yaml", "--imgsz", "0"],
        ["data/models/cbam-max.yaml", "--imgsz", "abc"],
        ["data/models/cbam-max.yaml", "--profile", "nope"],
        ["data/models/cbam-max.yaml", "--device", "tpu"],
        ["weights-that-do-not-exist.pt"],
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["audit", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("yolo-det: error: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("case", ["malformed", "unknown"])
def test_cli_bad_yaml(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, pattern = _bad_yamls(tmp_path)[case]
    assert main(["audit", str(path), "--imgsz", "64"]) == 2
    out, err = capsys.readouterr()
    assert out == "", err
    assert err.count("\n") == 1, err
    assert re.search(pattern, err), err


def test_cli_cuda_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["audit", "yolov8n.yaml", "--device", "cuda"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# second opinion: real kernels


@pytest.mark.parametrize("name", ["attention-mix", "gridsample-up", "bicubic-up"])
def test_real_pass_agrees_with_the_trace_on_the_emulated_cpu(name: str) -> None:
    # The real-device pass, run on the CPU under the emulator, sees exactly what the fake-CUDA trace predicts.
    from yolo_det.analysis.audit.entry import _load

    loaded = _load(str(MODELS / f"{name}.yaml"))
    predicted = {(f.kernel, f.module) for f in audit(loaded, imgsz=64).findings}
    with emulate_cuda_alerts():
        trace = _real_trace(loaded, load_table(), imgsz=64, batch=2, forward_det=True, device="cpu")
    assert {(k, m) for k, _, m, _ in trace.alerts} == predicted


NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@NEEDS_CUDA
def test_device_cuda_confirms_the_findings() -> None:
    report = audit(MODELS / "attention-mix.yaml", imgsz=64, device="cuda")
    assert report.device == "fake-cuda+cuda"
    assert [f.observed for f in report.findings] == [True] * 3
    assert not [f for f in report.findings if f.entry == "observed"]
    clean = audit("yolov8n.yaml", imgsz=320, device="cuda")
    assert clean.ok
    assert clean.findings == []


@pytest.mark.gpu
@NEEDS_CUDA
@pytest.mark.parametrize("case", sorted(PROBES))
def test_table_against_the_real_cuda_kernels(case: str) -> None:
    # Ground truth: every alert the table predicts is raised by the real kernel, and no other kernel raises.
    factory, expected = PROBES[case]
    report = audit(factory(), imgsz=16, device="cuda")
    assert [f.kernel for f in report.findings if f.entry == "observed"] == []
    assert {f.entry for f in report.findings} == expected
    assert all(f.observed for f in report.findings if f.effect == "alert")
