"""Sessions: nested phases, exact restoration of the baseline, seeding, extensions."""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
import torch

from yolo_det.core.errors import YoloDetError
from yolo_det.core.profiles import load_profile
from yolo_det.core.seeding import rank_seed
from yolo_det.core.state import snapshot
from yolo_det.session.session import DeterminismSession


def test_nested_phases_return_to_the_outer_phase_and_end_restores_baseline():
    base = snapshot()
    session = DeterminismSession("fast", seed=3)
    session.begin()
    session.enter("train")
    assert session.phase == "train"
    assert torch.backends.cudnn.benchmark
    assert not torch.are_deterministic_algorithms_enabled()
    session.enter("val")
    assert session.phases == ("train", "val")
    assert not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled()
    session.exit("val")
    assert torch.backends.cudnn.benchmark
    assert not torch.are_deterministic_algorithms_enabled()
    session.end()
    assert snapshot() == base
    assert not session.active
    session.end()  # idempotent


def test_leaving_phases_out_of_order_is_refused():
    with DeterminismSession("repro").run() as session:
        session.enter("train")
        session.enter("val")
        with pytest.raises(YoloDetError, match="reverse order"):
            session.exit("train")
        session.exit("deploy")  # not entered: nothing to do
        assert session.phases == ("train", "val")


def test_run_restores_after_error_inside_phases():
    base = snapshot()
    session = DeterminismSession("balanced")
    with pytest.raises(KeyError), session.run():
        session.enter("train")
        session.enter("val")
        raise KeyError("boom")
    assert snapshot() == base


def test_train_entry_seeds_with_the_rank_seed():
    session = DeterminismSession("repro", seed=11, rank=2, world_size=4)
    with session.run(), session.phase_scope("train"):
        a = (random.random(), float(torch.rand(())))
    torch.manual_seed(rank_seed(11, 2))
    random.seed(rank_seed(11, 2))
    assert (random.random(), float(torch.rand(()))) == a
    seeds = session.seeds()
    assert seeds["rank_rng_seeds"] == [12, 13, 14, 15]
    assert seeds["rng_seed"] == 14
    assert seeds["sampler_seed"] == 11


def test_profile_seed_wins_over_run_seed(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("extends: repro\ntrain:\n  seed: 5\n")
    session = DeterminismSession(load_profile(path), seed=99)
    assert session.seeds()["seed"] == 5


def test_extensions_are_entered_per_phase_and_exited_in_reverse_even_on_error():
    calls: list[str] = []

    def ext(name):
        def factory(phase, settings, session):
            if phase == "deploy":
                return None

            @contextmanager
            def cm():
                calls.append(f"enter {name} {phase}")
                try:
                    yield
                finally:
                    calls.append(f"exit {name} {phase}")

            return cm()

        return factory

    session = DeterminismSession("repro")
    session.add_extension(ext("a"))
    session.add_extension(ext("b"))
    with pytest.raises(RuntimeError), session.run():
        session.enter("train")
        session.enter("deploy")
        raise RuntimeError
    assert calls == ["enter a train", "enter b train", "exit b train", "exit a train"]


def test_failing_extension_leaves_no_trace():
    base = snapshot()

    def bad(phase, settings, session):
        raise ValueError("cannot enter")

    session = DeterminismSession("fast")
    session.add_extension(bad)
    with pytest.raises(ValueError), session.run():
        session.enter("train")
    assert snapshot() == base
    assert session.phase is None


def test_every_concern_of_a_phase_is_an_extension_applied_in_order_and_undone_in_reverse():
    from yolo_det.session.extensions import Extension, default_extensions

    names = [e.name for e in default_extensions()]
    assert names[:6] == [
        "flags",
        "machine",
        "seeds",
        "backward",
        "swaps",
        "intercept",
    ]
    assert set(names[6:]) <= {"batch_invariant"}  # registered by an integration this process imported
    calls = []

    class Marker(Extension):
        name = "marker"

        def apply(self, ctx):
            calls.append(("apply", ctx.phase, ctx.settings.deterministic_algorithms, snapshot().mode))
            return ctx.phase

        def undo(self, token):
            calls.append(("undo", token, snapshot().mode))

    base = snapshot()
    session = DeterminismSession("repro")
    session.add_extension(Marker())
    with session.run(), session.phase_scope("train"):
        pass
    # the marker runs after the flags are applied and is undone before they are restored
    assert calls == [("apply", "train", "strict", "strict"), ("undo", "train", "strict")]
    assert snapshot() == base


def test_a_handed_over_scaler_and_model_are_undone_with_the_phase():
    from torch import nn

    from yolo_det.core.backward import ToggleScaler

    class Holder:
        scaler = object()

    original = Holder.scaler
    holder = Holder()
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveMaxPool2d(1))
    session = DeterminismSession("balanced")  # train: backward disable; swaps none
    with session.run():
        session.enter("train")
        assert session.wrap_scaler(holder)
        assert isinstance(holder.scaler, ToggleScaler)
        assert not session.wrap_scaler(holder)  # already wrapped: nothing more
        assert session.prepare_model(net) == []
        assert session.swaps() == []
        session.exit("train")
        assert holder.scaler is original
    repro = DeterminismSession("repro")  # train: swaps auto, backward keep
    with repro.run():
        repro.enter("train")
        assert not repro.wrap_scaler(holder)
        assert holder.scaler is original
        records = repro.prepare_model(net, imgsz=32)
        assert [r.path for r in records] == ["1"]
        assert type(net[1]).__name__ == "DetAdaptiveMaxPool2d"
        assert repro.swaps() == [r.to_dict() for r in records]
    assert type(net[1]) is nn.AdaptiveMaxPool2d
    assert repro.swaps() == []
