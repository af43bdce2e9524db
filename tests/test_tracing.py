"""The dispatch-mode machinery shared by the audit and the emulator."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from yolo_det.analysis.tracing import (
    DispatchHook,
    FunctionHook,
    any_fake,
    current_node,
    deterministic_flag,
    deterministic_mode,
    node_metadata,
    output_node,
    tensors,
)


@pytest.mark.parametrize("mode", ["off", "warn", "strict"])
def test_deterministic_flag_sets_and_restores_on_error(mode: str) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(RuntimeError, match="boom"), deterministic_flag(mode):
        assert deterministic_mode() == mode
        raise RuntimeError("boom")
    assert deterministic_mode() == "warn"
    with deterministic_flag(None):
        torch.use_deterministic_algorithms(False)
    assert deterministic_mode() == "warn"  # None: whatever the block changed is put back too
    with pytest.raises(ValueError, match="one of off, warn, strict"), deterministic_flag("on"):
        pass


def test_hooks_hand_each_call_to_the_handler_and_leave_no_mode_behind() -> None:
    ops: list[str] = []
    calls: list[str] = []

    def on_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        ops.append(func._schema.name)
        return func(*args, **kwargs)

    def on_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(getattr(func, "__name__", ""))
        return func(*args, **kwargs)

    x = torch.ones(1, 1, 4, 4)
    with DispatchHook(on_op), FunctionHook(on_call):
        y = F.max_pool2d(x, 2)
    assert torch.equal(y, torch.ones(1, 1, 2, 2))
    assert "aten::max_pool2d_with_indices" in ops or "aten::max_pool2d" in ops
    assert "max_pool2d" in calls or "_max_pool2d" in calls
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()


def test_a_handler_may_stand_in_for_the_op() -> None:
    def zeros(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return torch.zeros_like(args[0]) if func is torch.ops.aten.add.Tensor else func(*args, **kwargs)

    with DispatchHook(zeros):
        out = torch.ones(3) + torch.ones(3)
    assert torch.equal(out, torch.zeros(3))


def test_node_metadata_reaches_the_backward_of_the_node() -> None:
    seen: list[Any] = []

    def on_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        node = current_node()
        if node is not None:
            seen.append(node_metadata(node).get("tag"))
        return func(*args, **kwargs)

    x = torch.ones(2, requires_grad=True)
    y = (x * 3).sum()
    node = output_node(y)
    assert node is not None
    assert output_node(3) is None
    node_metadata(node)["tag"] = "sum"
    with DispatchHook(on_op):
        y.backward()
    assert "sum" in seen
    assert current_node() is None


def test_tensors_and_fakes() -> None:
    a, b, c = torch.ones(1), torch.zeros(2), torch.ones(3)
    assert [t.shape for t in tensors((a, [b, {"k": c}], "x", 1))] == [a.shape, b.shape, c.shape]
    assert tensors([[[[a]]]], max_depth=2) == []
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(a)
    assert any_fake((fake,), {})
    assert any_fake((), {"x": [fake]})
    assert not any_fake((a,), {"x": b})
