"""Matching traced operations to the op table's entries: which finding each occurrence is."""

from __future__ import annotations

from typing import Any

import torch

from ...core.profiles import PhaseSettings
from ..loader import LoadedModel
from ..optable import OpEntry, OpTable, parse_version
from ..optable import torch_version as _running_torch
from .report import _MODES, Finding
from .trace import _Occurrence, _Trace


def _layer_of(model: torch.nn.Module, path: str) -> tuple[int | None, str | None]:
    parts = path.split(".") if path else []
    for n in range(1, len(parts) + 1):
        try:
            mod = model.get_submodule(".".join(parts[:n]))
        except AttributeError:
            return None, None
        i = getattr(mod, "i", None)
        if isinstance(i, int) and not isinstance(i, bool) and hasattr(mod, "f"):
            return i, type(mod).__name__
    return None, None


def _handled(entry: OpEntry, settings: PhaseSettings, module_class: str, call: str | None) -> bool:
    """True when the profile swaps the module for a deterministic layer or intercepts the functional call."""
    if settings.swaps != "none" and entry.fix.swap_for(module_class):
        return True
    return bool(settings.intercept and call and call in entry.fix.functions)


def _under(entry: OpEntry, settings: PhaseSettings, module_class: str, call: str | None) -> str:
    mode = settings.deterministic_algorithms
    if entry.pass_ == "backward" and settings.backward == "disable":
        mode = "off"
    if settings.swaps != "none" and entry.fix.swap_for(module_class):
        return f"swapped for {entry.fix.swap_for(module_class)} (swaps: {settings.swaps})"
    if settings.intercept and call and call in entry.fix.functions:
        return f"intercepted: {call.rsplit('.', 1)[-1]} -> {entry.fix.functions[call]}"
    text = entry.behaviour(mode)
    if mode == "off" and settings.deterministic_algorithms != "off" and entry.pass_ == "backward":
        text = f"no error; {text} (backward runs with the flag off)"
    return text


def _match(trace: _Trace, table: OpTable, version: str, loaded: LoadedModel, settings: PhaseSettings) -> list[Finding]:
    v = parse_version(version)
    model = loaded.model
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    running = parse_version(_running_torch())

    def add(entry: OpEntry, occ: _Occurrence, note: str = "") -> None:
        key = (entry.id, occ.module)
        g = groups.get(key)
        if g is None:
            groups[key] = {"entry": entry, "occ": occ, "count": 1, "note": note}
        else:
            g["count"] += 1

    for occ in trace.occurrences:
        if occ.kind == "op":
            candidates = table.lookup(occ.name, occ.overload)
        elif occ.kind == "decomposed":
            candidates = table.lookup_forward(occ.name)
        elif occ.kind == "function":
            candidates = table.lookup_function(occ.name)
        elif occ.kind == "node":
            candidates = table.lookup_kind(occ.name)
        else:  # node_name: a backward that could not be traced
            candidates = table.lookup_node(occ.name)
        for entry in candidates:
            when = entry.rule(v)
            if when is None or when == "never":
                continue
            if entry.args and not (occ.args is not None and entry.args_hold(occ.args)):
                continue
            if occ.kind == "decomposed":
                if not OpEntry.reaches(when, via_functional=True, forward_deterministic=True):
                    continue
                note = ""
                if v != running:
                    note = (
                        f"torch {'.'.join(map(str, running))} takes a deterministic decomposition here; "
                        f"torch {version} has none"
                    )
                add(entry, occ, note)
                continue
            via = occ.native is not None and (occ.native in entry.forward_ops or occ.native in entry.ops)
            if not OpEntry.reaches(when, via_functional=via, forward_deterministic=occ.forward_det):
                continue
            add(entry, occ)

    findings = []
    for g in groups.values():
        entry, occ = g["entry"], g["occ"]
        layer, layer_class = _layer_of(model, occ.module)
        module_class = trace.classes.get(occ.module, "?")
        findings.append(
            Finding(
                entry=entry.id,
                kernel=entry.kernel,
                pass_=entry.pass_,
                effect=entry.effect,
                layer=layer,
                layer_class=layer_class,
                yaml_line=loaded.layer_lines.get(layer) if layer is not None else None,
                module=occ.module,
                module_class=module_class,
                op=occ.label or occ.name,
                call=occ.call,
                count=g["count"],
                behaviour={m: entry.behaviour(m) for m in _MODES},
                under_profile=_under(entry, settings, module_class, occ.call),
                fix=entry.fix.describe(module_class),
                condition=entry.condition,
                note=g["note"],
                handled=_handled(entry, settings, module_class, occ.call),
            )
        )
    findings.sort(key=lambda f: (f.layer if f.layer is not None else 10**9, f.module, f.entry))
    return findings


def _merge_observed(
    findings: list[Finding], trace: _Trace, table: OpTable, loaded: LoadedModel, settings: PhaseSettings
) -> list[Finding]:
    seen = {(k, m) for k, _, m, _ in trace.alerts}
    out = []
    for f in findings:
        obs = (f.kernel, f.module) in seen if f.effect == "alert" else None
        out.append(Finding(**{**f.__dict__, "observed": obs}))
    known = {(f.kernel, f.module) for f in findings}
    extra: dict[tuple[str, str], list[Any]] = {}
    for kernel, pass_, module, node in trace.alerts:
        if (kernel, module) in known:
            continue
        extra.setdefault((kernel, module), [pass_, node, 0])[2] += 1
    for (kernel, module), (pass_, node, count) in extra.items():
        layer, layer_class = _layer_of(loaded.model, module)
        module_class = trace.classes.get(module, "?")
        out.append(
            Finding(
                entry="observed",
                kernel=kernel,
                pass_=pass_,
                effect="alert",
                layer=layer,
                layer_class=layer_class,
                yaml_line=loaded.layer_lines.get(layer) if layer is not None else None,
                module=module,
                module_class=module_class,
                op=node or kernel,
                call=None,
                count=count,
                behaviour={
                    "strict": "raises RuntimeError",
                    "warn": "warns; non-deterministic",
                    "off": "non-deterministic, no message",
                },
                under_profile=(
                    "raises RuntimeError" if settings.deterministic_algorithms == "strict" else "non-deterministic"
                ),
                fix="not in yolo-det's table: scoped toggle (profile balanced) or accept",
                observed=True,
                note="seen on the real device only; please report it so the table can learn it",
            )
        )
    out.sort(key=lambda f: (f.layer if f.layer is not None else 10**9, f.module, f.entry))
    return out
