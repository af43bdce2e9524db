"""Rewrite a model YAML so its non-deterministic layers become yolo-det's deterministic ones, and back.

Length: one operation: finding each row's name in the text, building the model to decide what needs
renaming, and the rewrite with its report.

``rewrite_yaml`` changes only the module name of the layers that need it (``nn.AdaptiveMaxPool2d`` ->
``DetAdaptiveMaxPool2d``, ``nn.Upsample`` with a non-nearest mode -> ``DetUpsample``, ...). The edit is
made in the text itself, at the position of that one token, so comments, key order, quoting and the
layout of every other line stay byte for byte; ``reverse=True`` turns the names back, and a rewrite
followed by a reverse gives the original text. Which layers need it is decided as everywhere in
yolo-det: by tracing the built model on fake CUDA (:func:`yolo_det.analysis.audit.audit`) for the running torch
version (``policy="auto"``), or for every layer that has an equivalent (``policy="all"``).

The yolo-det names resolve in Ultralytics' ``parse_model`` once :func:`yolo_det.layers.registry.register_layers`
ran (``yolo-det train`` and :func:`yolo_det.attach` do it). A layer whose non-determinism is inside a
block (the max pool of a CBAM block, the ``grid_sample`` of RT-DETR's decoder) has no name to change in
the YAML: the report lists it, and the profile's module swaps and functional interception handle it
at training time. The exception is yolo-det's own example blocks (:mod:`yolo_det.zoo`): a ``CBAMMax`` that
is the zoo's becomes ``DetCBAMMax`` (the same block with deterministic layers inside); a name bound to the
user's own class is never renamed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import torch

from ..core.errors import ConfigError, ModelError, YoloDetError
from ..core.fileio import atomic_write_text, check_output_path

__all__ = ["YAML_NAMES", "Change", "RewriteResult", "rewrite_yaml", "rewrite_yaml_text"]

#: YAML module name -> yolo-det name that Ultralytics resolves after :func:`yolo_det.layers.registry.register_layers`.
YAML_NAMES: dict[str, str] = {
    "nn.AdaptiveAvgPool1d": "DetAdaptiveAvgPool1d",
    "nn.AdaptiveAvgPool2d": "DetAdaptiveAvgPool2d",
    "nn.AdaptiveAvgPool3d": "DetAdaptiveAvgPool3d",
    "nn.AdaptiveMaxPool1d": "DetAdaptiveMaxPool1d",
    "nn.AdaptiveMaxPool2d": "DetAdaptiveMaxPool2d",
    "nn.Upsample": "DetUpsample",
    "nn.UpsamplingBilinear2d": "DetUpsamplingBilinear2d",
    "nn.ReflectionPad1d": "DetReflectionPad1d",
    "nn.ReflectionPad2d": "DetReflectionPad2d",
    "nn.ReflectionPad3d": "DetReflectionPad3d",
    "nn.ReplicationPad1d": "DetReplicationPad1d",
    "nn.ReplicationPad2d": "DetReplicationPad2d",
    "nn.ReplicationPad3d": "DetReplicationPad3d",
}
_REVERSE = {v: k for k, v in YAML_NAMES.items()}
_SECTIONS = ("backbone", "head")


@dataclass(frozen=True)
class Change:
    """One rewritten layer.

    Attributes:
        layer: The layer index (Ultralytics ``.i``: backbone then head).
        line: The 1-based line of the module name in the file.
        old: The module name before.
        new: The module name after.
        reason: Why (the kernel it reaches, or "reverse").
    """

    layer: int
    line: int
    old: str
    new: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"layer": self.layer, "line": self.line, "old": self.old, "new": self.new, "reason": self.reason}


@dataclass
class RewriteResult:
    """What :func:`rewrite_yaml_text` did.

    Attributes:
        text: The rewritten text (the input text when nothing changed).
        changes: The layers whose module name changed.
        inside_blocks: Findings inside blocks, which the YAML cannot name (``layer``, ``module``, ``kernel``).
        layers: Number of layers of the model.
        params: Parameter count of the model built from the input (and from the output: they are equal).
    """

    text: str
    changes: list[Change] = field(default_factory=list)
    inside_blocks: list[dict[str, Any]] = field(default_factory=list)
    layers: int = 0
    params: int = 0

    @property
    def changed(self) -> bool:
        """Whether the text changed."""
        return bool(self.changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "changed": self.changed,
            "changes": [c.to_dict() for c in self.changes],
            "inside_blocks": self.inside_blocks,
            "layers": self.layers,
            "params": self.params,
        }

    def format(self, source: str = "") -> str:
        """A readable report."""
        lines = []
        for c in self.changes:
            lines.append(f"{source}:{c.line}: layer {c.layer}: {c.old} -> {c.new} ({c.reason})")
        for b in self.inside_blocks:
            lines.append(
                f"layer {b['layer']} ({b['layer_class']}): {b['module']} reaches {b['kernel']} inside the "
                "block; not nameable in the YAML: swapped at training time by the profile"
            )
        if not lines:
            lines.append("nothing to rewrite")
        lines.append(f"{len(self.changes)} layer(s) changed; {self.layers} layers, {self.params:,} parameters")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# locating module names in the text


@dataclass(frozen=True)
class _Slot:
    layer: int
    name: str
    line: int  # 0-based
    col: int  # 0-based start of the token (quote included, if any)
    length: int  # token length in the text
    args: Any


def _position(node: Any, index: int) -> tuple[int, int]:
    """0-based line and column of item ``index`` of a sequence loaded by ruamel's round-trip loader."""
    line, col = node.lc.item(index)
    return int(line), int(col)


def _slots(text: str, origin: str) -> Iterator[_Slot]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from ..core.untrusted import safe_yaml

    try:
        safe_yaml.prescan(text)  # bounded: nesting, alias expansion, cycles (before ruamel sees the text)
    except safe_yaml.YamlLimitError as e:
        raise ModelError(safe_yaml.error_line(origin, e)) from None
    yaml = YAML(typ="rt")
    try:
        data = yaml.load(StringIO(text))
    except YAMLError as e:
        raise ModelError(safe_yaml.error_line(origin, e)) from None
    if not isinstance(data, dict) or not all(isinstance(data.get(s), list) for s in _SECTIONS):
        raise ModelError(f"{origin}: not an Ultralytics model YAML (expected 'backbone' and 'head' lists of layers)")
    lines = text.splitlines(keepends=True)
    index = 0
    for section in _SECTIONS:
        for row in data[section]:
            if not isinstance(row, list) or len(row) < 3 or not isinstance(row[2], str):
                raise ModelError(
                    f"{origin}:{_row_line(row, data[section])}: layer {index} is not [from, repeats, module, args]"
                )
            line, col = _position(row, 2)
            token = _token_at(lines[line], col, row[2])
            if token is None:
                raise ModelError(f"{origin}:{line + 1}: could not find the module name '{row[2]}' of layer {index}")
            yield _Slot(index, row[2], line, col, token, row[3] if len(row) > 3 else [])
            index += 1


def _row_line(row: Any, seq: Any) -> int:
    try:
        return int(row.lc.line) + 1
    except AttributeError:
        return int(seq.lc.line) + 1


def _token_at(line: str, col: int, name: str) -> int | None:
    for quote in ("", '"', "'"):
        token = f"{quote}{name}{quote}"
        if line.startswith(token, col):
            return len(token)
    return None


def _replace(text: str, slots: list[tuple[_Slot, str]]) -> str:
    lines = text.splitlines(keepends=True)
    # right to left within a line, so earlier columns stay valid
    for slot, new in sorted(slots, key=lambda s: (s[0].line, -s[0].col)):
        line = lines[slot.line]
        old_token = line[slot.col : slot.col + slot.length]
        quote = old_token[0] if old_token[0] in "\"'" else ""
        lines[slot.line] = line[: slot.col] + f"{quote}{new}{quote}" + line[slot.col + slot.length :]
    return "".join(lines)


# ---------------------------------------------------------------------------------------------------------
# deciding what to rewrite


def _build(text: str, origin: str) -> Any:
    """Build the model the YAML describes (yolo-det layer names registered); return the DetectionModel."""
    import yaml as pyyaml

    from ..analysis.model_yaml import check_activation
    from ..analysis.names import custom_modules
    from ..core.untrusted.safe_yaml import error_line, load

    try:
        cfg = load(text)
    except pyyaml.YAMLError as e:
        raise ModelError(error_line(origin, e)) from None
    if isinstance(cfg, dict):
        check_activation(cfg, origin)
    task = _guess_task(cfg)
    try:
        with custom_modules():
            from ..analysis.loader import check_yaml_modules
            from ..core.compat import tasks

            if isinstance(cfg, dict):  # every layer an allowed module class, before Ultralytics builds anything
                check_yaml_modules(cfg, text, origin, vars(tasks))

            cls = {
                "detect": tasks.DetectionModel,
                "segment": tasks.SegmentationModel,
                "pose": tasks.PoseModel,
                "obb": tasks.OBBModel,
                "classify": tasks.ClassificationModel,
            }.get(task, tasks.DetectionModel)
            if "rtdetr" in str(cfg.get("head", "")).lower():
                cls = tasks.RTDETRDetectionModel
            cfg = dict(cfg, yaml_file=origin)
            return cls(cfg, verbose=False)
    except KeyError as e:
        raise ModelError(
            f"{origin}: unknown module {e} in the model YAML; import the module that defines it "
            "(--import MODULE, "
            "or modules=[...] in Python)"
        ) from None
    except YoloDetError:
        raise
    except Exception as e:  # any build failure is "a YAML that does not build"
        from ..analysis.blocks import build_error

        named = build_error(e, {"yaml_file": origin})
        if named:
            where = "" if named.startswith(str(origin)) else f"{origin}: "
            raise ModelError(f"{where}the model YAML does not build: {named}") from None
        raise ModelError(
            f"{origin}: the model YAML does not build: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        ) from None


def _guess_task(cfg: Any) -> str:
    try:
        from ..core.compat import guess_model_task

        return guess_model_task(cfg)
    except Exception:  # fall back to detection
        return "detect"


def _params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def rewrite_yaml_text(
    text: str,
    *,
    reverse: bool = False,
    policy: str = "auto",
    origin: str = "<yaml>",
    imgsz: int = 64,
    torch_version: str | None = None,
    modules: Iterable[Any] | None = None,
) -> RewriteResult:
    """Rewrite a model YAML's text (see the module docstring). Nothing is written.

    Args:
        text: The YAML text.
        reverse: Turn yolo-det names back into standard ones (for export or sharing).
        policy: ``auto`` (only layers that reach a non-deterministic CUDA kernel on the running torch, or on
            ``torch_version``) or ``all`` (every layer with a deterministic equivalent).
        origin: Name used in messages (the file path).
        imgsz: Input size of the trace that decides ``auto``.
        torch_version: Decide for this torch version instead of the running one.
        modules: The user's modules whose classes the YAML names (as ``--import``; see
            :func:`yolo_det.names.custom_modules`).

    Returns:
        The result; ``result.text`` is the new text.

    Raises:
        ModelError: Malformed YAML, not a model YAML, or a model that does not build.
        ConfigError: Bad ``policy``.
    """
    if policy not in ("auto", "all"):
        raise ConfigError(f"policy must be 'auto' or 'all', got {policy!r}")
    from ..analysis.names import custom_modules

    with custom_modules(list(modules or [])):
        return _rewrite(text, reverse=reverse, policy=policy, origin=origin, imgsz=imgsz, torch_version=torch_version)


def _zoo_blocks() -> dict[str, str]:
    """Zoo block name -> deterministic variant, for the names that resolve to the zoo's own class right now
    (a name bound to the user's class is the user's: it is never renamed)."""
    from ..analysis.zoo import DET_VARIANTS, ZOO_MODULES
    from ..core.compat import tasks

    ns = vars(tasks)
    return {
        name: det
        for name, det in DET_VARIANTS.items()
        if ns.get(name) is ZOO_MODULES[name] and ns.get(det) is ZOO_MODULES[det]
    }


def _rewrite(
    text: str, *, reverse: bool, policy: str, origin: str, imgsz: int, torch_version: str | None
) -> RewriteResult:
    slots = list(_slots(text, origin))
    model = _build(text, origin)
    result = RewriteResult(text=text, layers=len(slots), params=_params(model))
    todo: list[tuple[_Slot, str]] = []
    blocks = _zoo_blocks()
    if reverse:
        back = {**_REVERSE, **{det: name for name, det in blocks.items()}}
        for slot in slots:
            if slot.name in back:
                todo.append((slot, back[slot.name]))
                result.changes.append(Change(slot.layer, slot.line + 1, slot.name, back[slot.name], "reverse"))
    else:
        names = {**YAML_NAMES, **blocks}
        reasons = _reasons(
            model, slots, names, policy=policy, imgsz=imgsz, torch_version=torch_version, origin=origin, result=result
        )
        for slot in slots:
            if slot.layer in reasons:
                new = names[slot.name]
                todo.append((slot, new))
                result.changes.append(Change(slot.layer, slot.line + 1, slot.name, new, reasons[slot.layer]))
    if todo:
        result.text = _replace(text, todo)
        rebuilt = _build(result.text, origin)
        if _params(rebuilt) != result.params or len(list(_slots(result.text, origin))) != result.layers:
            raise YoloDetError(f"{origin}: the rewritten YAML builds a different model; nothing was written")
    return result


def _reasons(
    model: Any,
    slots: list[_Slot],
    names: dict[str, str],
    *,
    policy: str,
    imgsz: int,
    torch_version: str | None,
    origin: str,
    result: RewriteResult,
) -> dict[int, str]:
    """Layer index -> reason, for the layers to rewrite (``names``: YAML name -> its deterministic name)."""
    nameable = {s.layer: s for s in slots if s.name in names}
    if policy == "all":
        return {i: "policy all" for i in nameable}
    from ..analysis.audit import audit

    stride_t = getattr(model, "stride", None)
    stride = int(stride_t.max()) if isinstance(stride_t, torch.Tensor) and stride_t.numel() else 32
    size = max(stride, (imgsz // stride) * stride)
    try:
        report = audit(model, imgsz=size, batch=2, torch_version=torch_version)
    except YoloDetError as e:
        raise ModelError(f"{origin}: {e}") from None
    reasons: dict[int, str] = {}
    for f in report.findings:
        if not f.breaks_determinism or f.layer is None:
            continue
        top = f"model.{f.layer}"
        slot = nameable.get(f.layer)
        if (
            slot is not None
            and slot.name in YAML_NAMES
            and f.module in (top, f"{top}.0")
            and f.module_class == slot.name[3:]
        ):
            reasons.setdefault(f.layer, f.kernel)
        elif slot is not None and slot.name not in YAML_NAMES and (f.module == top or f.module.startswith(top + ".")):
            reasons.setdefault(f.layer, f"{f.kernel} inside {slot.name}")
        elif not any(b["layer"] == f.layer and b["module"] == f.module for b in result.inside_blocks):
            result.inside_blocks.append(
                {"layer": f.layer, "layer_class": f.layer_class, "module": f.module, "kernel": f.kernel}
            )
    return reasons


def rewrite_yaml(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str] | None = None,
    *,
    in_place: bool = False,
    check: bool = False,
    force: bool = False,
    **kwargs: Any,
) -> RewriteResult:
    """Rewrite the model YAML file ``src`` into ``dst`` (atomically). See :func:`rewrite_yaml_text`.

    Args:
        src: The input YAML. It is never changed unless ``in_place``.
        dst: The output path; must not exist unless ``force``.
        in_place: Rewrite ``src`` itself (``dst`` must be None).
        check: Write nothing; the result says whether a rewrite is needed.
        force: Allow ``dst`` to exist.
        **kwargs: ``reverse``, ``policy``, ``imgsz``, ``torch_version``, ``modules``.

    Raises:
        ConfigError: Conflicting or missing output arguments, an existing output, an unwritable output folder.
        ModelError: See :func:`rewrite_yaml_text`.
    """
    src = Path(src)
    if not src.is_file():
        from ..analysis.models import resolve_model_yaml

        found = resolve_model_yaml(src) if not src.parent.parts else None
        if found is None:
            raise ConfigError(f"model YAML '{src}' does not exist")
        src = found
    if src.suffix not in {".yaml", ".yml"}:
        raise ConfigError(f"'{src}' is not a .yaml file")
    if in_place and dst is not None:
        raise ConfigError("give either an output path (-o) or --in-place, not both")
    if not check and not in_place and dst is None:
        raise ConfigError("no output: give -o OUT.yaml, --in-place, or --check")
    target = src if in_place else (Path(dst) if dst is not None else None)
    if target is not None and not check:
        if not in_place and target.resolve() == src.resolve():
            raise ConfigError("the output is the input; pass --in-place to rewrite the input itself")
        if not in_place and target.exists() and not force:
            raise ConfigError(f"output '{target}' exists; choose another path or pass --force to replace it")
        check_output_path(target, suffix=(".yaml", ".yml"), what="output")
    try:
        text = src.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read '{src}': {e}") from None
    result = rewrite_yaml_text(text, origin=str(src), **kwargs)
    if not check and target is not None and (result.changed or not in_place):
        atomic_write_text(target, result.text)
    return result
