"""Registering module names for Ultralytics model YAMLs: idempotent, and exactly undone by registered()."""

from __future__ import annotations

import pytest
from torch import nn
from ultralytics.nn import tasks

from yolo_det.core.errors import ConfigError
from yolo_det.layers.registry import (
    register_ultralytics_modules,
    registered,
    registered_names,
    unregister_ultralytics_modules,
)


class BlockA(nn.Identity):
    pass


class BlockB(nn.Identity):
    pass


def test_register_is_idempotent_and_undoable() -> None:
    assert "YdtBlockA" not in vars(tasks)
    try:
        register_ultralytics_modules({"YdtBlockA": BlockA})
        register_ultralytics_modules({"YdtBlockA": BlockA})  # same object again: no-op
        assert vars(tasks)["YdtBlockA"] is BlockA
        assert registered_names()["YdtBlockA"] is BlockA
    finally:
        unregister_ultralytics_modules(["YdtBlockA"])
    assert "YdtBlockA" not in vars(tasks)
    assert "YdtBlockA" not in registered_names()


def test_a_clash_registers_nothing() -> None:
    with pytest.raises(ConfigError, match="already defines it"):
        register_ultralytics_modules({"YdtFresh": BlockA, "Conv": BlockB})  # Conv is Ultralytics' own
    assert "YdtFresh" not in vars(tasks)
    assert vars(tasks)["Conv"] is not BlockB


@pytest.mark.parametrize("mapping", [{"nn.Foo": BlockA}, {"not an identifier": BlockA}, {"YdtX": 3}, {"YdtX": nn}])
def test_invalid_names_and_objects(mapping: dict) -> None:
    with pytest.raises(ConfigError):
        register_ultralytics_modules(mapping)


def test_registered_restores_the_namespace_exactly() -> None:
    before = dict(vars(tasks))
    register_ultralytics_modules({"YdtKept": BlockA})
    try:
        with registered({"YdtKept": BlockA, "YdtTemp": BlockB}):
            assert vars(tasks)["YdtTemp"] is BlockB
        assert vars(tasks)["YdtKept"] is BlockA  # registered before the block: still there
        assert "YdtTemp" not in vars(tasks)
        with pytest.raises(RuntimeError), registered({"YdtTemp": BlockB}):
            raise RuntimeError("boom")
        assert "YdtTemp" not in vars(tasks)
        assert "YdtTemp" not in registered_names()
    finally:
        unregister_ultralytics_modules(["YdtKept"])
    assert vars(tasks) == before


def test_registered_names_resolve_in_parse_model() -> None:
    d = {"nc": 1, "backbone": [[-1, 1, "Conv", [8, 3, 2]], [-1, 1, "YdtBlockB", []]], "head": []}
    with registered({"YdtBlockB": BlockB}):
        model, _ = tasks.parse_model(d, ch=3, verbose=False)
    assert isinstance(model[1], BlockB)
    with pytest.raises(KeyError):
        tasks.parse_model(d, ch=3, verbose=False)
