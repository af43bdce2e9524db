"""What a training run was made from: its data, its starting model and its Ultralytics arguments.

:func:`run_identity` is taken when the trainer has built its data loaders and its model, before the first
step (``on_pretrain_routine_end``), and goes into ``determinism.json`` as three entries:

- ``data``: the dataset fingerprint of :mod:`yolo_det.core.datafp` over the datasets the trainer built
  (``train`` and the validation split), with each split's counts of what it trains on: ``images``, ``labels``
  (label files), ``instances`` (label rows) and ``backgrounds`` (images without any);
- ``model``: ``source`` (the ``model=`` argument), ``kind`` (``yaml``, ``checkpoint`` or ``other``),
  ``yaml_sha256`` (SHA-256 of the model YAML's text, for a YAML start), ``architecture_sha256`` (SHA-256 of
  the model's parsed architecture dict as canonical JSON, any start) and ``start_weights_sha256`` (the
  weights digest of :mod:`yolo_det.core.record` over the weights the first step starts from: the checkpoint's
  for a ``.pt`` start, the seeded initialisation for a YAML start). Nothing is loaded from disk for it:
  the digest is taken from the model the trainer already built, so no checkpoint is unpickled again;
- ``ultralytics_args``: every Ultralytics argument of the run, as plain JSON values;
- ``adjusted_args``: the arguments asked for that Ultralytics' trainer changed itself (``workers`` on a CPU;
  ``optimizer``, ``lr0`` and ``momentum`` under ``optimizer=auto``, read from the optimizer it built), each with
  the value asked, the value used and why.

Taking the identity never fails a run: a part that cannot be computed holds ``{"error": "..."}`` instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.datafp import dataset_fingerprint
from ..core.modules import unwrap_model
from ..core.plain import plain_value
from ..core.record import state_dict_digest

__all__ = ["model_fingerprint", "plain_args", "plain_value", "run_identity", "trainer_data_fingerprint"]


def _error(e: BaseException) -> dict[str, str]:
    first = str(e).splitlines()[0] if str(e) else ""
    return {"error": f"{type(e).__name__}: {first}"[:300]}


def plain_args(args: Any) -> dict[str, Any]:
    """An Ultralytics ``IterableSimpleNamespace`` (or any namespace or mapping) as plain JSON values."""
    items = args.items() if isinstance(args, Mapping) else vars(args).items()
    return {str(k): plain_value(v) for k, v in sorted(items)}


def model_fingerprint(model: Any, source: Any) -> dict[str, Any]:
    """The fingerprint of the model a training starts from (see the module docstring).

    Args:
        model: The built model (an ``nn.Module``, possibly wrapped in DDP or ``torch.compile``).
        source: What ``model=`` named: a YAML name or path, or a checkpoint path.
    """
    import torch

    src = str(source) if source is not None else None
    suffix = Path(src).suffix.lower() if src else ""
    kind = "yaml" if suffix in {".yaml", ".yml"} else "checkpoint" if suffix in {".pt", ".pth"} else "other"
    out: dict[str, Any] = {"source": src, "kind": kind}
    if kind == "yaml" and src:
        from ..analysis.models import resolve_model_yaml

        path = resolve_model_yaml(src)
        out["yaml_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    net = unwrap_model(model)
    arch = getattr(net, "yaml", None)
    if isinstance(arch, Mapping):
        from ..analysis.blocks import own_config

        text = json.dumps(plain_value(own_config(arch)), sort_keys=True)  # as built, also from a checkpoint
        out["architecture_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    if isinstance(net, torch.nn.Module):
        out["start_weights_sha256"] = state_dict_digest(net)
        out["parameters"] = int(sum(p.numel() for p in net.parameters()))
    return out


def _split_spec(dataset: Any) -> dict[str, Any] | None:
    files = getattr(dataset, "im_files", None)
    if isinstance(files, (list, tuple)):
        return {"images": list(files)}
    samples = getattr(dataset, "samples", None)  # Ultralytics classification: [file, class index, ...]
    if isinstance(samples, (list, tuple)) and all(isinstance(s, (list, tuple)) and len(s) >= 2 for s in samples):
        return {"images": [str(s[0]) for s in samples], "classes": [int(s[1]) for s in samples]}
    return None


def _label_counts(dataset: Any) -> dict[str, int]:
    """``{"instances", "backgrounds"}``: the label rows a dataset trains on and its images without any."""
    labels = getattr(dataset, "labels", None)
    if not isinstance(labels, (list, tuple)) or not all(isinstance(x, Mapping) and "cls" in x for x in labels):
        return {}
    rows = [len(x["cls"]) for x in labels]
    return {"instances": int(sum(rows)), "backgrounds": sum(1 for n in rows if n == 0)}


def trainer_data_fingerprint(trainer: Any, *, files_group: int | None = None) -> dict[str, Any]:
    """The dataset fingerprint of an Ultralytics trainer's training and validation datasets, with the label rows
    each split trains on (``instances``) and its images without any (``backgrounds``); ``files_group``: as
    :func:`~yolo_det.core.datafp.dataset_fingerprint`'s."""
    data = getattr(trainer, "data", None) or {}
    splits: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {}
    val_split = str(getattr(getattr(trainer, "args", None), "split", None) or "val")
    for name, loader in (
        ("train", getattr(trainer, "train_loader", None)),
        (val_split, getattr(trainer, "test_loader", None)),
    ):
        dataset = getattr(loader, "dataset", None)
        spec = _split_spec(dataset)
        if spec is not None:
            splits[name] = spec
            counts[name] = _label_counts(dataset)
    if not splits:
        return {"error": "the trainer's datasets list no image files"}
    root = data.get("path") if isinstance(data, Mapping) else None
    names = data.get("names") if isinstance(data, Mapping) else None
    out = dataset_fingerprint(splits, root=root, names=names, files_group=files_group)
    for name, extra in counts.items():
        out["splits"][name].update(extra)
    return out


#: The arguments Ultralytics' trainer changes itself, and why (it says nothing of it).
ADJUSTED_BY_ULTRALYTICS: dict[str, str] = {
    "workers": "Ultralytics loads the data in the main process when it trains on a CPU or MPS device",
}


#: Ultralytics' defaults of the arguments ``optimizer=auto`` replaces (``ultralytics/cfg/default.yaml``).
_OPTIMIZER_DEFAULTS = {"optimizer": "auto", "lr0": 0.01, "momentum": 0.937}
_AUTO = (
    "optimizer=auto: Ultralytics chose the optimizer, lr0 and momentum itself (from the class count and the "
    "iterations) and ignored the values given"
)


def _optimizer_used(optimizer: Any) -> dict[str, Any]:
    """The optimizer's class, first learning rate and momentum, as built (``betas[0]`` for the Adam family)."""
    groups = optimizer.param_groups
    first = groups[0]
    momentum = first["betas"][0] if "betas" in first else first.get("momentum")
    return {
        "optimizer": type(optimizer).__name__,
        "lr0": float(first.get("initial_lr", first["lr"])),
        "momentum": None if momentum is None else float(momentum),
    }


def adjusted_args(asked: Mapping[str, Any] | None, args: Any, optimizer: Any = None) -> dict[str, Any]:
    """The arguments the run was given that Ultralytics' trainer changed: ``{name: {"asked", "used", "why"}}``.

    ``optimizer``: the trainer's optimizer once built; under ``optimizer=auto`` (asked, or Ultralytics' default)
    its class, learning rate and momentum are the values used for ``optimizer``, ``lr0`` and ``momentum``.
    """
    out: dict[str, Any] = {}
    for key, why in ADJUSTED_BY_ULTRALYTICS.items():
        if not isinstance(asked, Mapping) or key not in asked or not hasattr(args, key):
            continue
        want, used = plain_value(asked[key]), plain_value(getattr(args, key))
        if want != used:
            out[key] = {"asked": want, "used": used, "why": why}
    given = asked if isinstance(asked, Mapping) else {}
    if optimizer is not None and str(given.get("optimizer", "auto")).lower() == "auto":
        for key, used in _optimizer_used(optimizer).items():
            want = plain_value(given.get(key, _OPTIMIZER_DEFAULTS[key]))
            if used is not None and want != used:
                out[key] = {"asked": want, "used": used, "why": _AUTO}
    return out


def run_identity(trainer: Any, *, asked: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"data", "model", "ultralytics_args", "adjusted_args"}`` of an Ultralytics trainer (see the module
    docstring); ``asked``: the arguments the run was given (``model.train(**asked)``)."""
    out: dict[str, Any] = {}
    args = getattr(trainer, "args", None)
    try:
        out["data"] = trainer_data_fingerprint(trainer)
    except Exception as e:  # a fingerprint never fails the run
        out["data"] = _error(e)
    try:
        out["model"] = model_fingerprint(getattr(trainer, "model", None), getattr(args, "model", None))
    except Exception as e:
        out["model"] = _error(e)
    try:
        out["ultralytics_args"] = plain_args(args) if args is not None else {}
        out["adjusted_args"] = adjusted_args(asked, args, getattr(trainer, "optimizer", None))
    except Exception as e:
        out["ultralytics_args"] = _error(e)
    return out
