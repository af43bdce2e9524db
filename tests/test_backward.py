"""Deterministic algorithms off exactly while backward runs."""

from __future__ import annotations

import threading

import pytest
import torch

from yolo_det.core.backward import ToggleScaler, backward_scope, toggle_count, toggled_backward


class FlagProbe(torch.autograd.Function):
    """Identity that records the deterministic flag in forward and in backward."""

    log: list[tuple[str, bool, bool]] = []

    @staticmethod
    def forward(ctx, x):
        FlagProbe.log.append(
            (
                "forward",
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
        )
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        FlagProbe.log.append(
            (
                "backward",
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
        )
        return grad


@pytest.fixture(autouse=True)
def _clear_log():
    FlagProbe.log.clear()


def loss_of(x):
    return (FlagProbe.apply(x) * 3).sum()


@pytest.mark.parametrize("enabled_scaler", [False, True])
@pytest.mark.parametrize("warn_only", [False, True])
def test_toggle_scaler_turns_flag_off_only_in_backward(enabled_scaler, warn_only):
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    x = torch.ones(4, requires_grad=True)
    scaler = ToggleScaler(torch.amp.GradScaler("cpu", enabled=enabled_scaler))
    before = toggle_count()
    loss = loss_of(x)
    scaler.scale(loss).backward()
    assert FlagProbe.log == [("forward", True, warn_only), ("backward", False, False)]
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
    assert toggle_count() == before + 1
    expected = 3.0 * (scaler.get_scale() if enabled_scaler else 1.0)
    assert torch.allclose(x.grad, torch.full((4,), expected))
    assert loss.backward.__self__ is loss  # the caller's tensor keeps its own .backward


def test_disabled_toggle_is_transparent_and_unwrap_returns_original():
    torch.use_deterministic_algorithms(True)
    inner = torch.amp.GradScaler("cpu", enabled=False)
    scaler = ToggleScaler(inner, enabled=False)
    scaler.scale(loss_of(torch.ones(2, requires_grad=True))).backward()
    assert FlagProbe.log[-1] == ("backward", True, False)
    assert ToggleScaler.unwrap(ToggleScaler(scaler)) is inner
    assert "enabled=False" in repr(scaler)


def test_scaler_methods_delegate():
    inner = torch.amp.GradScaler("cpu", enabled=True, init_scale=8.0)
    scaler = ToggleScaler(inner)
    assert scaler.get_scale() == 8.0
    assert scaler.is_enabled()
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler.scale((p * 2).sum()).backward()
    scaler.unscale_(opt)
    assert torch.allclose(p.grad, torch.full((3,), 2.0))
    scaler.step(opt)
    scaler.update()
    assert scaler.state_dict() == inner.state_dict()
    scaler.some_attribute = 5
    assert inner.some_attribute == 5


def test_flag_restored_when_backward_raises():
    torch.use_deterministic_algorithms(True)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("boom in backward")

    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="boom in backward"):
        toggled_backward(Boom.apply(x).sum())
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_flag_off_stays_off_and_nested_scopes_restore_once():
    torch.use_deterministic_algorithms(False)
    with backward_scope():
        assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    with backward_scope():
        with backward_scope():
            assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.are_deterministic_algorithms_enabled()  # outer scope still in force
    assert torch.is_deterministic_algorithms_warn_only_enabled()


def test_concurrent_threads_restore_after_the_last_one():
    torch.use_deterministic_algorithms(True)
    inside = threading.Barrier(2)
    seen: list[bool] = []

    def work():
        with backward_scope():
            inside.wait()
            seen.append(torch.are_deterministic_algorithms_enabled())
            inside.wait()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [False, False]
    assert torch.are_deterministic_algorithms_enabled()


def test_toggled_backward_without_toggle_keeps_flag():
    torch.use_deterministic_algorithms(True)
    toggled_backward(loss_of(torch.ones(2, requires_grad=True)), disable_determinism=False)
    assert FlagProbe.log[-1] == ("backward", True, False)
