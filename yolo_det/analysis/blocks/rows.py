"""Where a row of a model YAML is: Ultralytics' ``tasks`` module, each row's line in the YAML text, and the
one-line place of a row that messages start with."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ...core.untrusted import safe_yaml


def _tasks() -> Any:
    from ...core.compat import tasks

    return tasks


def _yaml_lines(d: Mapping[str, Any]) -> dict[int, int]:
    source = d.get("yaml_file")
    if not isinstance(source, str) or not source:
        return {}
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return layer_lines(text)


def layer_lines(text: str) -> dict[int, int]:
    """``{layer index: 1-based line}`` of the ``backbone`` + ``head`` rows of a model YAML (counted as
    ``parse_model`` counts them)."""
    try:
        node = safe_yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    sections = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    lines: dict[int, int] = {}
    i = 0
    for name in ("backbone", "head"):
        seq = sections.get(name)
        if isinstance(seq, yaml.SequenceNode):
            for item in seq.value:
                lines[i] = item.start_mark.line + 1
                i += 1
    return lines


def _where(d: Mapping[str, Any], index: int, name: str, source: Any) -> str:
    line = _yaml_lines(d).get(index)
    place = f"{d.get('yaml_file')}:{line}: " if line else ""
    return f"{place}layer {index} ({name}, from {source})"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
