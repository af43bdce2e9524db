"""A loaded object carries no behaviour: a module's pickled state may set data only, never a callable or a hook."""

from __future__ import annotations

import copy
import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from yolo_det.core.errors import ModelError
from yolo_det.core.record import checkpoint_digest, state_dict_digest
from yolo_det.core.untrusted.safeload import load_checkpoint, read_checkpoint


def _model() -> torch.nn.Module:
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolov8n.yaml", nc=2, verbose=False)


def _save(path: Path, model: torch.nn.Module) -> Path:
    torch.save({"epoch": 0, "model": None, "ema": model, "train_args": {"epochs": 1}}, path)
    return path


def _hostile(kind: str) -> torch.nn.Module:
    """A real model whose pickled state sets behaviour to an allowed class (what torch.save writes of it)."""
    from ultralytics.nn.tasks import DetectionModel

    model = _model()
    head = model.model[-1]
    if kind == "forward":
        object.__setattr__(head, "forward", DetectionModel)
    elif kind == "forward-module":
        head.__dict__["forward"] = torch.nn.Identity()
    elif kind == "attribute-class":
        head.__dict__["helper"] = [DetectionModel]
    else:
        getattr(head, kind)[7] = DetectionModel
    return model


KINDS = [
    "forward",
    "forward-module",
    "attribute-class",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_module_state_setting_behaviour_is_refused(tmp_path: Path, kind: str) -> None:
    path = _save(tmp_path / f"{kind}.pt", _hostile(kind))
    # control: torch's own loader gives the behaviour back (calling the model would call DetectionModel)
    head = torch.load(path, weights_only=False)["ema"].model[-1]
    key = {"forward-module": "forward", "attribute-class": "helper"}.get(kind, kind)
    assert vars(head)[key], kind
    for reader in (load_checkpoint, read_checkpoint):
        with pytest.raises(ModelError, match="may hold only data") as err:
            reader(path)
        assert "\n" not in str(err.value)
        assert str(path) in str(err.value)


def test_the_message_names_the_object_and_what_it_held(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"sets Detect._forward_hooks to a hook dict of 1 entries"):
        load_checkpoint(_save(tmp_path / "h.pt", _hostile("_forward_hooks")))
    with pytest.raises(ModelError, match=r"sets Detect.forward to the class .*DetectionModel, over a method"):
        load_checkpoint(_save(tmp_path / "f.pt", _hostile("forward")))


def _zip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", data)
        zf.writestr("archive/version", b"3\n")
    return buf.getvalue()


def _s(text: str) -> bytes:
    return b"X" + len(text).to_bytes(4, "little") + text.encode()


def test_a_compiled_call_in_a_crafted_state_is_refused(tmp_path: Path) -> None:
    """``torch.save`` drops ``_compiled_call_impl``; a crafted pickle sets it (``Module.__call__`` would call it)."""
    data = (
        b"\x80\x02ctorch.nn.modules.linear\nIdentity\n)\x81}("
        + _s("training")
        + b"\x88"
        + _s("_compiled_call_impl")
        + b"cultralytics.nn.tasks\nDetectionModel\nub."
    )
    path = tmp_path / "compiled.pt"
    path.write_bytes(_zip(data))
    assert pickle.loads(data)._compiled_call_impl.__name__ == "DetectionModel"  # control
    for reader in (load_checkpoint, read_checkpoint):
        with pytest.raises(ModelError, match=r"sets Identity._compiled_call_impl to the class"):
            reader(path)


def test_a_hook_added_after_the_state_was_given_is_refused(tmp_path: Path) -> None:
    """The pickle gives a module an empty hook dict, then fills that dict through its memo: checked at the end."""
    data = (
        b"\x80\x02ctorch.nn.modules.linear\nIdentity\n)\x81q\x00}("
        + _s("training")
        + b"\x88"
        + _s("_forward_hooks")
        + b"ccollections\nOrderedDict\n)Rq\x01ub"  # BUILD with the empty dict
        + b"h\x01K\x00cultralytics.nn.tasks\nDetectionModel\ns0."  # dict[0] = DetectionModel; pop; STOP
    )
    path = tmp_path / "late.pt"
    path.write_bytes(_zip(data))
    loaded = pickle.loads(data)  # control: the plain unpickler gives a module whose call calls DetectionModel
    assert list(loaded._forward_hooks.values())[0].__name__ == "DetectionModel"
    for reader in (load_checkpoint, read_checkpoint):
        with pytest.raises(ModelError, match=r"sets Identity._forward_hooks to a hook dict"):
            reader(path)


def test_a_state_given_to_a_tensor_is_refused(tmp_path: Path) -> None:
    """``Tensor.__setstate__`` would set the tensor's backward hooks: torch never pickles a tensor with a state."""
    plain = io.BytesIO()
    torch.save(torch.zeros(2), plain)
    with zipfile.ZipFile(plain) as zf:
        names = zf.namelist()
        records = {n: zf.read(n) for n in names}
    pkl = next(n for n in names if n.endswith("data.pkl"))
    body = records[pkl]
    assert body.endswith(b".")
    hooks = b"(\x88K\x00ccollections\nOrderedDict\n)R" + b"q\x7fK\x00cultralytics.nn.tasks\nDetectionModel\nst"
    records[pkl] = body[:-1] + hooks + b"b."
    path = tmp_path / "tensor.pt"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for n, d in records.items():
            zf.writestr(n, d)
    path.write_bytes(buf.getvalue())
    for reader in (load_checkpoint, read_checkpoint):
        with pytest.raises(ModelError, match="gives a tensor a state"):
            reader(path)


def test_real_models_and_own_layers_still_load(tmp_path: Path) -> None:
    from ultralytics.cfg import get_cfg

    from yolo_det.fixes.swaps import swap_modules

    model = _model()
    model.args = get_cfg()
    model.criterion = model.init_criterion()  # a loss object, its assigner and its namespace of arguments
    swapped = torch.nn.Sequential(torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.AdaptiveAvgPool2d(2))
    swap_modules(swapped, ["0", "1"])
    assert all(type(m).__module__.startswith("yolo_det.layers") for m in swapped)
    path = tmp_path / "real.pt"
    torch.save({"ema": copy.deepcopy(model).half(), "model": swapped, "extra": OrderedDict(a=1)}, path)
    loaded = load_checkpoint(path)
    assert state_dict_digest(loaded["ema"]) == checkpoint_digest(path)
    assert type(loaded["ema"].criterion).__name__ == type(model.criterion).__name__
    reference = torch.load(path, weights_only=False)["model"]
    assert [type(m) for m in loaded["model"]] == [type(m) for m in reference]
    read_checkpoint(path)
