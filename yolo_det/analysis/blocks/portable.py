"""The model YAML a checkpoint stores: rebuildable by plain Ultralytics, with yolo-det's layer names kept
aside under :data:`CHECKPOINT_KEY` and put back when yolo-det rebuilds it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .rows import _tasks

#: The key of a model YAML dict (and so of every checkpoint's stored YAML) where yolo-det keeps what plain
#: Ultralytics does not need: ``imports`` (the user's modules of the run) and ``layers`` (``{index: name}`` of
#: the rows that named yolo-det's deterministic layers and are stored with torch's own names).
CHECKPOINT_KEY = "yolo_det"


def _native_names() -> dict[Any, str]:
    """yolo-det's deterministic layer class -> the ``nn.X`` YAML name of the torch class it stands for."""
    import torch

    from ...layers.table import SWAPS

    return {
        det: f"nn.{native.__name__}"
        for native, det in SWAPS.items()
        if getattr(torch.nn, native.__name__, None) is native
    }


def portable_config(cfg: Mapping[str, Any], imports: list[dict[str, str]]) -> dict[str, Any]:
    """A copy of the model YAML dict ``cfg`` that plain Ultralytics rebuilds: rows naming yolo-det's deterministic
    layers (``DetUpsample``) name torch's (``nn.Upsample``); yolo-det's names and the run's ``imports`` are kept
    under :data:`CHECKPOINT_KEY`, which ``parse_model`` ignores and yolo-det reads back when it rebuilds."""
    namespace = vars(_tasks())
    natives = _native_names()
    out = copy.deepcopy({k: v for k, v in cfg.items() if k != CHECKPOINT_KEY})
    before = cfg.get(CHECKPOINT_KEY)
    layers: dict[str, str] = {}
    if isinstance(before, Mapping) and isinstance(before.get("layers"), Mapping):
        layers.update({str(k): v for k, v in before["layers"].items() if isinstance(v, str)})
    i = 0
    for section in ("backbone", "head"):
        rows = out.get(section)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and len(row) == 4 and isinstance(row[2], str):
                native = natives.get(namespace.get(row[2]))
                if native is not None:
                    layers[str(i)] = row[2]
                    row[2] = native
            i += 1
    out[CHECKPOINT_KEY] = {"imports": [dict(e) for e in imports], "layers": layers}
    return out


def own_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The model YAML dict the run was built from: :func:`portable_config` undone (yolo-det's layer names back in
    their rows, without the :data:`CHECKPOINT_KEY` key). A dict that was never made portable comes back as is."""
    out = dict(cfg)
    if CHECKPOINT_KEY in out and isinstance(out.get("backbone"), list) and isinstance(out.get("head"), list):
        out = _restore_layers(out, {det.__name__: det for det in _native_names()})
    out.pop(CHECKPOINT_KEY, None)
    return out


def _restore_layers(d: dict[str, Any], namespace: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``d`` with the rows :func:`portable_config` stored under torch's names named yolo-det's again (when the
    name still resolves to yolo-det's layer and the row still names that layer's torch class)."""
    extra = d.get(CHECKPOINT_KEY)
    layers = extra.get("layers") if isinstance(extra, Mapping) else None
    if not isinstance(layers, Mapping) or not layers:
        return d
    namespace = vars(_tasks()) if namespace is None else namespace
    natives = _native_names()
    out = dict(d)
    n_backbone = len(d["backbone"])
    rows = copy.deepcopy(d["backbone"] + d["head"])
    for key, name in layers.items():
        i = int(key) if isinstance(key, (int, str)) and str(key).isdigit() else -1
        if (
            0 <= i < len(rows)
            and isinstance(rows[i], list)
            and len(rows[i]) == 4
            and isinstance(name, str)
            and natives.get(namespace.get(name)) == rows[i][2]
        ):
            rows[i][2] = name
    out["backbone"], out["head"] = rows[:n_backbone], rows[n_backbone:]
    return out
