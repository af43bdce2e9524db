"""core/nesting.NestedPatch: a change made on the outermost entry of a block, undone on its outermost exit."""

from __future__ import annotations

import pytest

from yolo_det.core.nesting import NestedPatch


def test_nested_blocks_apply_once_and_undo_once_at_the_outermost_exit() -> None:
    calls: list[object] = []
    patch = NestedPatch(lambda: calls.append("apply") or "token", calls.append)
    with patch.scope():
        assert (calls, patch.depth) == (["apply"], 1)
        with patch.scope():
            assert (calls, patch.depth) == (["apply"], 2)
        assert calls == ["apply"]  # the inner exit undoes nothing
    assert (calls, patch.depth) == (["apply", "token"], 0)
    with patch.scope():  # a later block applies again
        pass
    assert calls == ["apply", "token", "apply", "token"]


def test_an_error_in_the_block_still_undoes_and_an_error_in_apply_leaves_nothing_entered() -> None:
    undone: list[object] = []
    patch = NestedPatch(lambda: 1, undone.append)
    with pytest.raises(ValueError), patch.scope(), patch.scope():
        raise ValueError("in the block")
    assert (undone, patch.depth) == ([1], 0)

    def fails() -> int:
        raise RuntimeError("cannot apply")

    broken = NestedPatch(fails, undone.append)
    with pytest.raises(RuntimeError), broken.scope():
        pass
    assert (undone, broken.depth) == ([1], 0)
