"""Users' blocks declare their channels (single- and multi-input) and build in every command, without a fork of
Ultralytics; a block that does not build is one line naming the layer and its YAML line."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch import nn
from ultralytics.nn import tasks

from yolo_det.analysis.blocks import build_error, declare_block, declared_channels, undeclare_block
from yolo_det.analysis.names import custom_modules
from yolo_det.cli import main
from yolo_det.core.errors import ModelError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class WeightedAdd(nn.Module):
    """BiFPN-style fast normalised weighted add of two maps with equal channels, then a 1x1 conv to ``c2``."""

    yolo_det_channels = staticmethod(lambda c_in, c2=None: (c2 or c_in[0], [c_in[0], c2 or c_in[0]]))

    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.conv = nn.Conv2d(c1, c2, 1)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        w = torch.relu(self.w)
        w = w / (w.sum() + 1e-4)
        return self.conv(w[0] * xs[0] + w[1] * xs[1])


class Eca(nn.Module):
    """Channel attention whose kernel size follows its channels (declared later with declare_block)."""

    def __init__(self, c1: int, gamma: int = 2) -> None:
        super().__init__()
        k = int(abs((math.log2(c1) + 1) / gamma))
        k = k if k % 2 else k + 1
        self.conv = nn.Conv1d(1, 1, k, padding=k // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x.mean((2, 3))[:, None, :])[:, 0, :, None, None]
        return x * torch.sigmoid(y)


class Squeeze(nn.Module):
    """Takes its channels from the YAML (undeclared): a wrong number breaks in the first forward."""

    def __init__(self, c1: int) -> None:
        super().__init__()
        self.fc = nn.Linear(c1, c1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(x.mean((2, 3))))[..., None, None]


class Undeclared(WeightedAdd):
    yolo_det_channels = None


def model_yaml(tmp_path, attention="[-1, 1, Eca, [2]]", add="WeightedAdd", add_args="[]"):
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        nc: 2
        backbone:
          - [-1, 1, Conv, [16, 3, 2]]
          - [-1, 1, Conv, [32, 3, 2]]
          - [-1, 1, Conv, [64, 3, 2]]
          - [-1, 1, Conv, [64, 3, 2]]
          - {attention}
        head:
          - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
          - [[-1, 2], 1, {add}, {add_args}]
          - [-1, 1, Conv, [48, 3, 2]]
          - [[-1, 4], 1, Concat, [1]]
          - [[6, 8], 1, Detect, [nc]]
        """),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def eca_declared():
    declare_block(Eca, channels=lambda c, *args: (c, [c, *args]))
    yield
    undeclare_block(Eca)


MODULES = {"WeightedAdd": WeightedAdd, "Eca": Eca, "Squeeze": Squeeze, "Undeclared": Undeclared}


def test_declared_blocks_build_with_the_channels_their_rules_give(tmp_path, eca_declared):
    path = model_yaml(tmp_path, add_args="[24]")
    with custom_modules(MODULES):
        model = tasks.DetectionModel(str(path), verbose=False)
    add, eca = model.model[6], model.model[4]
    assert isinstance(add, WeightedAdd)
    assert add.f == [-1, 2]
    assert add.i == 6
    assert add.conv.in_channels == 64
    assert add.conv.out_channels == 24
    assert model.model[7].conv.in_channels == 24  # the next layer sees the declared output channels
    assert model.model[8].f == [-1, 4]
    assert isinstance(eca, Eca)
    assert eca.conv.kernel_size == (3,)
    assert 2 in model.save
    assert 4 in model.save
    out = model.eval()(torch.zeros(1, 3, 64, 64))
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.shape[1] == 4 + 2  # boxes and 2 classes


def test_parse_model_is_ultralytics_own_outside_and_for_models_without_declared_blocks(tmp_path):
    before = tasks.parse_model
    with custom_modules():
        assert tasks.parse_model is not before
        torch.manual_seed(0)
        inside = tasks.DetectionModel("yolov8n.yaml", verbose=False).state_dict()
        with custom_modules():  # nested: one wrapper
            pass
        assert tasks.parse_model is not before
    assert tasks.parse_model is before
    torch.manual_seed(0)
    outside = tasks.DetectionModel("yolov8n.yaml", verbose=False).state_dict()
    assert inside.keys() == outside.keys()
    assert all(torch.equal(inside[k], outside[k]) for k in inside)


def test_a_wrong_channel_argument_names_the_layer_and_line(tmp_path):
    path = model_yaml(tmp_path, attention="[-1, 1, Squeeze, [128]]")
    with custom_modules(MODULES), pytest.raises(RuntimeError) as info:
        tasks.DetectionModel(str(path), verbose=False)
    line = build_error(info.value, {"yaml_file": str(path)})
    assert line is not None
    assert "\n" not in line
    assert f"{path}:7: layer 4 (Squeeze, from -1): RuntimeError: mat1 and mat2" in line


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (lambda c, *a: c, "must return (c_out, args_to_pass)"),
        (lambda c, *a: (0, [c]), "must return (c_out, args_to_pass)"),
        (lambda c, *a: (c, [c, 2, 3, 4]), "check its channel rule (input channels 64 -> 64)"),
        (lambda c, *a: 1 / 0, "its channel rule raised ZeroDivisionError"),
    ],
)
def test_a_wrongly_declared_block_is_one_line_naming_it(tmp_path, rule, expected):
    path = model_yaml(tmp_path)
    declare_block(Eca, channels=rule)
    try:
        with custom_modules(MODULES), pytest.raises(ModelError) as info:
            tasks.DetectionModel(str(path), verbose=False)
    finally:
        undeclare_block(Eca)
    message = str(info.value)
    assert message.startswith(f"{path}:7: layer 4 (Eca, from -1): ")
    assert expected in message
    assert "\n" not in message


def test_an_undeclared_multi_input_block_says_to_declare_it(tmp_path, eca_declared):
    path = model_yaml(tmp_path, add="Undeclared")
    with custom_modules(MODULES), pytest.raises(TypeError) as info:
        tasks.DetectionModel(str(path), verbose=False)
    line = build_error(info.value, {"yaml_file": str(path)})
    assert line is not None
    assert f"{path}:10: layer 6 (Undeclared, from [-1, 2])" in line
    assert "declare them" in line


def test_declare_block_checks_its_arguments():
    with pytest.raises(Exception, match="nn.Module subclass"):
        declare_block(int, channels=lambda c: (c, []))
    with pytest.raises(Exception, match="callable"):
        declare_block(Eca, channels=3)  # type: ignore[arg-type]


def test_parse_model_restored_on_error():
    before = tasks.parse_model
    with pytest.raises(RuntimeError), declared_channels():
        raise RuntimeError("boom")
    assert tasks.parse_model is before


def test_audit_and_rewrite_of_a_bad_layer_are_one_line_exit_2(tmp_path, monkeypatch, capsys):
    mod = tmp_path / "blocks_bad.py"
    mod.write_text(
        textwrap.dedent("""\
        import torch
        from torch import nn
        class Squeeze(nn.Module):
            def __init__(self, c1):
                super().__init__()
                self.fc = nn.Linear(c1, c1)
            def forward(self, x):
                return x * torch.sigmoid(self.fc(x.mean((2, 3))))[..., None, None]
        """),
        encoding="utf-8",
    )
    path = model_yaml(tmp_path, attention="[-1, 1, Squeeze, [128]]", add="Concat", add_args="[1]")
    monkeypatch.chdir(tmp_path)
    rewrite = ["rewrite", "--import", str(mod), str(path), "-o", "o.yaml"]
    for argv in (["audit", "--import", str(mod), str(path)], rewrite):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert "layer 4 (Squeeze, from -1)" in err, err
        assert "m.yaml:7" in err, err
    assert not (tmp_path / "o.yaml").exists()


def test_audit_of_a_rewritten_yaml_reports_yolo_dets_layers_as_fixed(tmp_path):
    from yolo_det.analysis.audit import audit
    from yolo_det.analysis.models import EXAMPLES
    from yolo_det.fixes.yaml_rewrite import rewrite_yaml

    out = tmp_path / "rw.yaml"
    rewrite_yaml(EXAMPLES / "bicubic-up.yaml", out, imgsz=64)
    before = audit(str(EXAMPLES / "bicubic-up.yaml"), imgsz=64, batch=1)
    report = audit(str(out), imgsz=64, batch=1)
    assert {f.layer for f in before.findings if f.breaks_determinism} == {10, 13}  # the input has findings
    assert report.findings == []
    assert report.ok
    assert [(f.layer, f.module_class) for f in report.fixed] == [(10, "DetUpsample"), (13, "DetUpsample")]
    table = report.format_table()
    assert "fixed: layer 10 (line 19) model.10 DetUpsample" in table
    assert "accept" not in table
    assert report.to_dict()["fixed"][1]["layer"] == 13
