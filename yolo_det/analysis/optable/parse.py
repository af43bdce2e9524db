"""Reading the op table from YAML (the packaged file or a user's), with one-line errors."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ...core.errors import ConfigError, did_you_mean
from ...core.untrusted import safe_yaml
from .model import Fix, OpEntry, OpTable, VersionRange
from .schema import _DEFAULT, _ENTRY_KEYS, _NODE_KINDS, _OP_NAME, _PASSES, _REQUIRED, _TOP_KEYS, _WHENS, EFFECTS
from .versions import version_in

__all__ = ["load_table", "parse_table"]


def _lines_of_entries(text: str) -> list[int]:
    try:
        node = safe_yaml.compose(text)
    except yaml.YAMLError:
        return []
    if not isinstance(node, yaml.MappingNode):
        return []
    for key, value in node.value:
        if key.value == "entries" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def _str_tuple(value: Any, key: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: '{key}' must be a list of names, got {value!r}")
    return tuple(value)


def _str_map(value: Any, key: str, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: '{key}' must map names to names, got {value!r}")
    return dict(value)


def _parse_entry(raw: Any, where: str, line: int | None) -> OpEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an entry must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in _ENTRY_KEYS:
            raise ConfigError(
                f"{where}: unknown key '{key}'; valid keys: "
                f"{', '.join(_ENTRY_KEYS)}.{did_you_mean(str(key), _ENTRY_KEYS)}"
            )
    for key in _REQUIRED:
        if key not in raw:
            raise ConfigError(f"{where}: entry is missing '{key}'")
    for key in ("id", "kernel"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    if raw["pass"] not in _PASSES:
        raise ConfigError(f"{where}: 'pass' must be one of {', '.join(_PASSES)}, got {raw['pass']!r}")
    if raw["effect"] not in EFFECTS:
        raise ConfigError(
            f"{where}: 'effect' must be one of {', '.join(EFFECTS)}, got {raw['effect']!r}."
            f"{did_you_mean(str(raw['effect']), EFFECTS)}"
        )
    ops = _str_tuple(raw.get("ops"), "ops", where)
    forward_ops = _str_tuple(raw.get("forward_ops"), "forward_ops", where)
    for op in (*ops, *forward_ops):
        if not _OP_NAME.match(op):
            raise ConfigError(f"{where}: op '{op}' must be written namespace::name or namespace::name.overload")
    kinds = _str_tuple(raw.get("node_kinds"), "node_kinds", where)
    for kind in kinds:
        if kind not in _NODE_KINDS:
            raise ConfigError(f"{where}: node kind '{kind}' must be one of {', '.join(_NODE_KINDS)}")
    functions = _str_tuple(raw.get("functions"), "functions", where)
    if not (ops or functions or kinds):
        raise ConfigError(f"{where}: an entry needs 'ops', 'functions' or 'node_kinds' to be matched")
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: 'args' must map argument names to values")
    versions = raw["versions"]
    if not isinstance(versions, list) or not versions:
        raise ConfigError(
            f"{where}: 'versions' must be a non-empty list of {{torch: spec, when: always|native_path|never}}"
        )
    ranges = []
    for item in versions:
        if not isinstance(item, dict) or set(item) != {"torch", "when"}:
            raise ConfigError(f"{where}: each 'versions' item must be {{torch: spec, when: ...}}, got {item!r}")
        if item["when"] not in _WHENS:
            raise ConfigError(f"{where}: 'when' must be one of {', '.join(_WHENS)}, got {item['when']!r}")
        spec = str(item["torch"])
        version_in(spec, (0, 0, 0))  # validates the clauses
        ranges.append(VersionRange(spec, item["when"]))
    fix_raw = raw["fix"]
    if not isinstance(fix_raw, dict) or not set(fix_raw) <= {"modules", "functions", "note"}:
        raise ConfigError(f"{where}: 'fix' must be a mapping with modules, functions and/or note")
    fix = Fix(
        _str_map(fix_raw.get("modules"), "fix.modules", where),
        _str_map(fix_raw.get("functions"), "fix.functions", where),
        str(fix_raw.get("note") or ""),
    )
    if not fix.has_swap and not fix.note:
        raise ConfigError(f"{where}: 'fix' needs a swap (modules/functions) or a note")
    return OpEntry(
        id=raw["id"],
        kernel=raw["kernel"],
        pass_=raw["pass"],
        effect=raw["effect"],
        ops=ops,
        forward_ops=forward_ops,
        nodes=_str_tuple(raw.get("nodes"), "nodes", where),
        functions=functions,
        node_kinds=kinds,
        args=args,
        cpu_alerts=bool(raw.get("cpu_alerts", False)),
        triggered_by=str(raw.get("triggered_by") or ""),
        condition=str(raw.get("condition") or ""),
        versions=tuple(ranges),
        fix=fix,
        line=line,
    )


def parse_table(text: str, source: str = "<table>") -> OpTable:
    """Parse and validate a table document.

    Raises:
        ConfigError: The YAML is malformed or an entry is invalid (the message names the file and line).
    """
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as e:
        raise ConfigError(safe_yaml.error_line(str(source), e)) from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ConfigError(f"{source}: a table must be a mapping with an 'entries' list")
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key '{key}'; valid keys: {', '.join(_TOP_KEYS)}")
    messages = data.get("messages") or {}
    if not isinstance(messages, dict) or not all(isinstance(v, str) and "{kernel}" in v for v in messages.values()):
        raise ConfigError(f"{source}: 'messages' must map strict/warn to templates containing {{kernel}}")
    lines = _lines_of_entries(text)
    entries: list[OpEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["entries"]):
        line_no = lines[i] if i < len(lines) else None
        where = f"{source}:{line_no}" if line_no else f"{source} (entry {i + 1})"
        entry = _parse_entry(raw, where, line_no)
        if entry.id in seen:
            raise ConfigError(f"{where}: duplicate entry id '{entry.id}'")
        seen.add(entry.id)
        entries.append(entry)
    return OpTable(entries, messages, source)


@lru_cache(maxsize=1)
def _default_table() -> OpTable:
    text = resources.files("yolo_det.analysis.optable").joinpath(_DEFAULT).read_text(encoding="utf-8")
    return parse_table(text, source=f"yolo_det/analysis/optable/{_DEFAULT}")


def load_table(path: str | Path | OpTable | None = None) -> OpTable:
    """Load the table shipped with yolo-det (``path=None``), or a table file of the same format.

    Args:
        path: None for the built-in table, a YAML path, or an :class:`OpTable` (returned as is).

    Raises:
        ConfigError: The file is missing, malformed or invalid.
    """
    if path is None:
        return _default_table()
    if isinstance(path, OpTable):
        return path
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"table file '{p}' does not exist; omit it to use the built-in table")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read table file '{p}': {e}") from None
    return parse_table(text, source=str(p))
