"""The model YAML a checkpoint stores: rebuildable by plain Ultralytics, with yolo-det's layer names kept
aside under :data:`CHECKPOINT_KEY` and put back when yolo-det rebuilds it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .rows import _tasks

#: The key of a model YAML dict (and so of every checkpoint's stored YAML) where yolo-det keeps what plain
#: Ultralytics does not need: ``imports`` (the user's modules of the run) and ``layers`` (``{index: name}`` of
#: the rows that named yolo-det's deterministic layers and are stored with torch's own names) and ``args``
#: (``{index: YAML arguments}`` of the declared blocks stored with their constructor's arguments).
CHECKPOINT_KEY = "yolo_det"


def _native_names() -> dict[Any, str]:
    """yolo-det's deterministic layer class -> the YAML name of the class it stands for: ``nn.X`` for torch's,
    the block's name for an example block's variant (``DetCBAMMax`` -> ``CBAMMax``, :mod:`yolo_det_zoo`)."""
    import torch

    from ...layers.table import SWAPS
    from ..zoo import DET_VARIANTS, ZOO_MODULES

    return {
        **{
            det: f"nn.{native.__name__}"
            for native, det in SWAPS.items()
            if getattr(torch.nn, native.__name__, None) is native
        },
        **{ZOO_MODULES[det]: block for block, det in DET_VARIANTS.items()},
    }


def portable_config(
    cfg: Mapping[str, Any], imports: list[dict[str, str]], call_args: Mapping[int, list[Any]] | None = None
) -> dict[str, Any]:
    """A copy of the model YAML dict ``cfg`` that plain Ultralytics rebuilds: rows naming yolo-det's deterministic
    layers (``DetUpsample``, ``DetCBAMMax``) name the class they stand for (``nn.Upsample``, ``CBAMMax``, which
    pickles as ``yolo_det_zoo.CBAMMax``), and the rows of ``call_args`` (``{index: constructor arguments}``, the
    declared single-input blocks that keep their channels) hold the arguments their constructor received, which
    plain Ultralytics passes as they are. yolo-det's names and arguments and the run's ``imports`` are kept
    under :data:`CHECKPOINT_KEY`, which ``parse_model`` ignores and yolo-det reads back when it rebuilds."""
    namespace = vars(_tasks())
    natives = _native_names()
    out = copy.deepcopy({k: v for k, v in cfg.items() if k != CHECKPOINT_KEY})
    before = cfg.get(CHECKPOINT_KEY)
    layers: dict[str, str] = {}
    own_args: dict[str, Any] = {}
    if isinstance(before, Mapping) and isinstance(before.get("layers"), Mapping):
        layers.update({str(k): v for k, v in before["layers"].items() if isinstance(v, str)})
    if isinstance(before, Mapping) and isinstance(before.get("args"), Mapping):
        own_args.update({str(k): v for k, v in before["args"].items()})
    i = 0
    for section in ("backbone", "head"):
        rows = out.get(section)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and len(row) == 4 and isinstance(row[2], str):
                native = natives.get(namespace.get(row[2]))
                if native is not None:
                    layers[str(i)] = row[2]
                    row[2] = native
                if call_args and i in call_args and str(i) not in own_args:
                    own_args[str(i)] = row[3]
                    row[3] = copy.deepcopy(list(call_args[i]))
            i += 1
    out[CHECKPOINT_KEY] = {
        "imports": [dict(e) for e in imports],
        "layers": layers,
        **({"args": own_args} if own_args else {}),
    }
    return out


def plain_needs(cfg: Mapping[str, Any], declared: Mapping[int, tuple[Any, int]] | None = None) -> dict[str, Any]:
    """What plain Ultralytics (no yolo-det) needs to rebuild the model of a checkpoint storing ``cfg`` (a
    :func:`portable_config` result), with the names resolved in the current ``ultralytics.nn.tasks``.

    ``declared``: ``{index: (c_in, c_out)}`` of the rows built by a channel rule whose stored arguments could not
    be made the constructor's. Returns ``{"modules": {YAML name: module}, "yolo_det": [reasons]}``: the user's
    blocks that plain Ultralytics builds once their module is importable (the checkpoint's pickle names it) and
    the name is bound in ``ultralytics.nn.tasks`` (what adding the block to that module's imports does), and
    one line per row it cannot build at all (then only yolo-det fine-tunes the checkpoint; with the modules
    importable plain Ultralytics still loads, validates, predicts and exports it).
    """
    namespace = vars(_tasks())
    modules: dict[str, str] = {}
    reasons: list[str] = []
    i = 0
    for section in ("backbone", "head"):
        rows = cfg.get(section)
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, list) and len(row) == 4 and isinstance(row[2], str):
                name = row[2]
                owner = str(getattr(namespace.get(name), "__module__", "") or "")
                plain = name.startswith(("nn.", "torchvision.ops.")) or owner.split(".")[0] in _PLAIN_PACKAGES
                if not plain:
                    sources = row[0] if isinstance(row[0], list) else [row[0]]
                    if len(sources) > 1:
                        reasons.append(
                            f"layer {i} ({name}) takes {len(sources)} inputs: Ultralytics' parse_model builds a "
                            "block it does not know from one input only"
                        )
                    elif declared and i in declared:
                        c_in, c_out = declared[i]
                        reasons.append(
                            f"layer {i} ({name}) turns {c_in} channels into {c_out}: Ultralytics' parse_model "
                            "assumes a block it does not know keeps its input channels"
                        )
                    else:
                        modules[name] = owner
            i += 1
    return {"modules": modules, "yolo_det": reasons}


#: Packages whose classes plain Ultralytics resolves in a model YAML by itself (``yolo_det_zoo`` binds its
#: names when a checkpoint's pickle imports it).
_PLAIN_PACKAGES = frozenset({"ultralytics", "torch", "torchvision", "yolo_det_zoo"})


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
    own_args = extra.get("args") if isinstance(extra, Mapping) else None
    layers = layers if isinstance(layers, Mapping) else {}
    own_args = own_args if isinstance(own_args, Mapping) else {}
    if not layers and not own_args:
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
    for key, args in own_args.items():  # the YAML arguments a declared block's channel rule receives
        i = int(key) if isinstance(key, (int, str)) and str(key).isdigit() else -1
        if 0 <= i < len(rows) and isinstance(rows[i], list) and len(rows[i]) == 4 and isinstance(args, list):
            rows[i][3] = copy.deepcopy(args)
    out["backbone"], out["head"] = rows[:n_backbone], rows[n_backbone:]
    return out
