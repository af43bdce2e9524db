"""Module swaps: same function, same everything else, exact inverse, checkpoints without yolo-det."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from yolo_det import layers
from yolo_det.analysis.zoo import ZOO_MODULES, CBAMMax
from yolo_det.core.errors import ConfigError, YoloDetError
from yolo_det.fixes.swaps import SWAPS, register_swap, swap_modules, swapped, unswap_modules
from yolo_det.layers.registry import registered, registered_layers


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gmax = nn.AdaptiveMaxPool2d(1)
        self.gavg = nn.AdaptiveAvgPool2d(1)  # a mean inside ATen: deterministic, never swapped by auto
        self.rows = nn.AdaptiveAvgPool2d((None, 1))
        self.up = nn.Upsample(scale_factor=2, mode="bicubic", align_corners=False)
        self.near = nn.Upsample(scale_factor=2, mode="nearest")  # deterministic, never swapped by auto
        self.pad = nn.ReflectionPad1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = self.up(y) + self.near(y)
        w = self.pad(y.flatten(2))
        return (z.sum() + (self.gmax(y) * self.gavg(y)).sum() + self.rows(y).sum()) + w.sum()


def run(net: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    net.zero_grad()
    out = net(x)
    out.backward()
    return out.detach(), [p.grad.clone() for p in net.parameters()]


def test_auto_swaps_exactly_the_non_deterministic_layers_and_keeps_the_function():
    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    before = run(net, x)
    records = swap_modules(net, "auto", imgsz=32)
    assert {r.path: r.target for r in records} == {
        "gmax": "DetAdaptiveMaxPool2d",
        "rows": "DetAdaptiveAvgPool2d",
        "up": "DetUpsample",
        "pad": "DetReflectionPad1d",
    }
    assert {r.path: r.reason for r in records}["gmax"] == "adaptive_max_pool2d_backward_cuda"
    assert type(net.gavg) is nn.AdaptiveAvgPool2d
    assert type(net.near) is nn.Upsample
    after = run(net, x)
    assert torch.allclose(after[0], before[0], rtol=0, atol=1e-10)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-10) for a, b in zip(after[1], before[1]))
    assert {r.path for r in unswap_modules(net)} == {r.path for r in records}
    assert not any(type(m) in SWAPS.values() for m in net.modules())


def test_all_policy_swaps_every_registered_class_and_none_swaps_nothing():
    net = Net()
    assert swap_modules(net, "none") == []
    paths = {r.path for r in swap_modules(net, "all")}
    assert paths == {"gmax", "gavg", "rows", "up", "near", "pad"}
    with pytest.raises(ConfigError, match="none, auto or all"):
        swap_modules(net, "some")


def test_the_0_1_policy_keyword_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"swap_modules\(model, 'all'\)"):
        paths = {r.path for r in swap_modules(Net(), policy="all")}
    assert paths == {"gmax", "gavg", "rows", "up", "near", "pad"}
    with (
        pytest.warns(DeprecationWarning, match="deprecated"),
        pytest.raises(ConfigError, match="both modules and policy="),
    ):
        swap_modules(Net(), ["gmax"], policy="all")


def test_swap_keeps_attributes_hooks_mode_device_dtype_and_state():
    m = nn.AdaptiveMaxPool2d(3)
    m.i, m.f, m.type, m.np = 7, -1, "torch.nn.modules.pooling.AdaptiveMaxPool2d", 0  # Ultralytics' attributes
    calls = []
    m.register_forward_hook(lambda mod, i, o: calls.append("fwd"))
    m.register_forward_pre_hook(lambda mod, i: calls.append("pre"))
    m.eval()
    holder = nn.Sequential(m).to(torch.float64)
    swap_modules(holder, "all")
    assert type(holder[0]) is layers.DetAdaptiveMaxPool2d
    assert holder[0] is m
    assert (m.i, m.f, m.type, m.np) == (7, -1, "torch.nn.modules.pooling.AdaptiveMaxPool2d", 0)
    assert not m.training
    assert m.output_size == 3
    assert repr(m) == "DetAdaptiveMaxPool2d(output_size=3)"
    holder(torch.randn(1, 2, 6, 6, dtype=torch.float64))
    assert calls == ["pre", "fwd"]
    assert m.state_dict() == {}


def test_swap_keeps_parameters_of_losses():
    weight = torch.tensor([1.0, 2.0, 3.0])
    holder = nn.ModuleDict({"loss": nn.CrossEntropyLoss(weight=weight, ignore_index=1)})
    keys = set(holder.state_dict())
    swap_modules(holder, "all")
    assert type(holder["loss"]) is layers.DetCrossEntropyLoss
    assert set(holder.state_dict()) == keys
    logits, target = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randint(0, 3, (2, 4, 4))
    expected = nn.CrossEntropyLoss(weight=weight.double(), ignore_index=1)(logits, target)
    holder.double()
    assert torch.allclose(holder["loss"](logits, target), expected, atol=1e-12)


def test_swapped_context_restores_on_error():
    net = Net()
    with pytest.raises(RuntimeError, match="inside"), swapped(net, "all"):
        assert type(net.gmax) is layers.DetAdaptiveMaxPool2d
        raise RuntimeError("inside")
    assert type(net.gmax) is nn.AdaptiveMaxPool2d


def test_pickled_swapped_model_loads_as_pytorch_classes_and_deepcopy_keeps_the_swap(tmp_path):
    net = Net()
    swap_modules(net, "all")
    assert type(copy.deepcopy(net).gmax) is layers.DetAdaptiveMaxPool2d
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded.gmax) is nn.AdaptiveMaxPool2d
    assert type(loaded.up) is nn.Upsample
    assert loaded.up.mode == "bicubic"
    # and in a process where yolo-det cannot even be imported
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveMaxPool2d(1), nn.Upsample(scale_factor=2, mode="bicubic"))
    swap_modules(plain, "all")
    torch.save({"model": plain}, tmp_path / "ckpt.pt")
    code = (
        "import sys; sys.modules['yolo_det'] = None\n"
        "import torch; m = torch.load(sys.argv[1], weights_only=False)['model']\n"
        "print(type(m[1]).__module__, type(m[2]).__name__, tuple(m(torch.randn(1, 3, 8, 8)).shape))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ckpt.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["torch.nn.modules.pooling", "Upsample", "(1,", "4,", "2,", "2)"]


def test_auto_on_a_block_swaps_inside_it():
    holder = nn.Sequential(nn.Conv2d(3, 16, 3), CBAMMax(16))  # the block's input requires grad, as in a model
    records = swap_modules(holder, "auto", imgsz=32)
    assert [r.path for r in records] == ["1.max_pool"]
    assert type(holder[1].avg_pool) is nn.AdaptiveAvgPool2d  # AdaptiveAvgPool2d(1) stays


def test_register_swap_validates_targets():
    class NotASubclass(nn.Module):
        pass

    class WithInit(nn.AdaptiveMaxPool3d):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)

    with pytest.raises(YoloDetError, match="must subclass"):
        register_swap(nn.AdaptiveMaxPool3d, NotASubclass)
    with pytest.raises(YoloDetError, match="defines __init__"):
        register_swap(nn.AdaptiveMaxPool3d, WithInit)


def test_layer_names_resolve_in_ultralytics_yaml_only_while_registered():
    from ultralytics.nn import tasks

    had = "DetUpsample" in vars(tasks)
    with registered_layers(), registered(ZOO_MODULES):
        assert vars(tasks)["DetUpsample"] is layers.DetUpsample
    assert ("DetUpsample" in vars(tasks)) == had


def test_the_decision_is_separate_and_swap_modules_swaps_exactly_the_decided_set():
    from yolo_det.analysis.swap_plan import decide_swaps
    from yolo_det.fixes.swaps import restore

    net = Net()
    decided = decide_swaps(net, "auto", imgsz=32)
    assert set(decided) == {"gmax", "rows", "up", "pad"}
    assert all(type(m).__module__.startswith("torch.") for m in net.children())  # deciding changed nothing
    records = swap_modules(net, ["gmax", "pad"])
    assert {r.path for r in records} == {"gmax", "pad"}
    assert {r.reason for r in records} == {"requested"}
    assert type(net.up) is nn.Upsample
    assert type(net.gmax).__name__ == "DetAdaptiveMaxPool2d"
    restore(net, records)
    assert type(net.gmax) is nn.AdaptiveMaxPool2d
    assert type(net.pad) is nn.ReflectionPad1d
    with pytest.raises(ConfigError, match="cannot swap 'conv'"):
        swap_modules(net, ["conv"])
    with pytest.raises(ConfigError, match="cannot swap 'nope'"):
        swap_modules(net, {"nope": "why"})
    assert all(type(m).__module__.startswith("torch.") for m in net.children())  # a refused set swaps nothing


def test_restore_also_undoes_an_unswap():
    from yolo_det.fixes.swaps import restore

    net = Net()
    swap_modules(net, "all")
    swapped_classes = {p: type(m) for p, m in net.named_modules()}
    records = unswap_modules(net)
    assert records
    assert all(type(m).__module__.startswith("torch.") for m in net.children())
    restore(net, records)
    assert {p: type(m) for p, m in net.named_modules()} == swapped_classes
