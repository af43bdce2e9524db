"""Functional interception: routes exactly the calls that would hit a non-deterministic CUDA kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from yolo_det.analysis.emulator import emulate_cuda_alerts
from yolo_det.fixes.intercept import ROUTED, interception, is_active, routed_calls, suspended

ORIGINALS = {name: getattr(F, name) for name in ROUTED}


def delta(before: dict[str, int]) -> dict[str, int]:
    now = routed_calls()
    return {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)}


def leaf(*shape: int, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).requires_grad_(grad)


CASES = [
    # (name, call, routed?)
    ("grid_sample", lambda: F.grid_sample(leaf(1, 2, 5, 5), leaf(1, 3, 3, 2).tanh(), align_corners=False), True),
    ("grid_sample", lambda: F.grid_sample(leaf(1, 2, 5, 5, grad=False), leaf(1, 3, 3, 2, grad=False)), False),
    ("grid_sample", lambda: F.grid_sample(leaf(1, 2, 5, 5), leaf(1, 3, 3, 2), mode="nearest"), False),
    ("adaptive_max_pool2d", lambda: F.adaptive_max_pool2d(leaf(1, 2, 5, 5), 1), True),
    ("adaptive_max_pool1d", lambda: F.adaptive_max_pool1d(leaf(1, 2, 7), 3), True),
    ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(leaf(1, 2, 5, 5), 1), False),  # a mean
    ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(leaf(1, 2, 5, 5), (None, 1)), True),
    ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(leaf(1, 2, 1, 1), (None, 1)), False),  # 1x1 anyway
    ("interpolate", lambda: F.interpolate(leaf(1, 2, 4, 4), scale_factor=2, mode="bicubic"), True),
    ("interpolate", lambda: F.interpolate(leaf(1, 2, 4, 4), scale_factor=2, mode="nearest"), False),
    ("interpolate", lambda: F.interpolate(leaf(1, 2, 4, 4), scale_factor=2, mode="bilinear", antialias=True), True),
    ("interpolate", lambda: F.interpolate(leaf(1, 2, 6), size=9, mode="linear"), True),
    ("pad", lambda: F.pad(leaf(1, 2, 6), (2, 2), mode="reflect"), True),  # 1-D reflection always alerts
    ("pad", lambda: F.pad(leaf(1, 2, 6), (2, 2)), False),
    ("cross_entropy", lambda: F.cross_entropy(leaf(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))), True),
    ("cross_entropy", lambda: F.cross_entropy(leaf(2, 3), torch.randint(0, 3, (2,))), False),
    ("nll_loss", lambda: F.nll_loss(leaf(2, 3, 4), torch.randint(0, 3, (2, 4)), reduction="none"), False),
]


@pytest.mark.parametrize(("name", "call", "routed"), CASES)
def test_routes_exactly_the_calls_that_need_it_with_the_same_result(name, call, routed):
    torch.manual_seed(0)
    expected = call()
    torch.manual_seed(0)
    before = routed_calls()
    with interception():
        got = call()
    assert delta(before) == ({name: 1} if routed else {})
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_bilinear_follows_the_flag_at_forward_time():
    x = leaf(1, 2, 4, 4)
    with interception():
        torch.use_deterministic_algorithms(True)
        before = routed_calls()
        F.interpolate(x, scale_factor=2, mode="bilinear")  # torch decomposes deterministically here
        assert delta(before) == {}
        torch.use_deterministic_algorithms(False)
        F.interpolate(x, scale_factor=2, mode="bilinear")  # the native kernel would run
        assert delta(before) == {"interpolate": 1}


def test_attributes_are_restored_after_nesting_and_errors():
    assert not is_active()
    with pytest.raises(ValueError), interception():
        with interception():
            assert is_active()
            assert getattr(F.grid_sample, "_yolo_det_router", False)
        assert is_active()  # the outer scope still routes
        with suspended():
            assert F.grid_sample is ORIGINALS["grid_sample"]
        assert getattr(F.grid_sample, "_yolo_det_router", False)
        raise ValueError
    assert not is_active()
    assert {name: getattr(F, name) for name in ROUTED} == ORIGINALS


class Sampler(torch.nn.Module):
    """A block that calls F.grid_sample directly (as RT-DETR's deformable attention and DySample do)."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.nn.Conv2d(2, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        base = torch.stack([xs, ys], -1).expand(n, h, w, 2)
        grid = base + 0.1 * self.offset(x).permute(0, 2, 3, 1).tanh()
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def test_strict_training_step_of_a_functional_block_under_the_emulator():
    torch.manual_seed(0)
    block = Sampler()
    x = torch.randn(2, 2, 6, 6).requires_grad_(True)
    torch.use_deterministic_algorithms(True)
    with emulate_cuda_alerts(), pytest.raises(RuntimeError, match="^grid_sampler_2d_backward_cuda does not have"):
        block(x).square().sum().backward()
    block.zero_grad()
    reference = torch.autograd.grad(block(x).square().sum(), [x, *block.parameters()])
    with emulate_cuda_alerts() as log, interception():
        grads = torch.autograd.grad(block(x).square().sum(), [x, *block.parameters()])
    assert log.events == []
    for a, b in zip(grads, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
