"""Instance attributes replaced for a while come back exactly: the old value, or none at all."""

from __future__ import annotations

from yolo_det.core.instance_attrs import SavedAttributes


class _Trainer:
    def step(self) -> str:
        return "class"


def test_replaced_attributes_come_back_as_they_were() -> None:
    t = _Trainer()
    t.own = "mine"  # type: ignore[attr-defined]
    saved = SavedAttributes()
    saved.save(t, "step", "own")
    t.step = lambda: "wrapped"  # type: ignore[method-assign]
    t.own = "replaced"  # type: ignore[attr-defined]
    saved.save(t, "step")  # saving again keeps the first value
    assert t.step() == "wrapped"
    saved.restore()
    assert "step" not in t.__dict__
    assert t.step() == "class"  # the class's method shows through again
    assert t.own == "mine"  # type: ignore[attr-defined]
    t.own = "later"  # type: ignore[attr-defined]
    saved.restore()  # a second restore changes nothing
    assert t.own == "later"  # type: ignore[attr-defined]
