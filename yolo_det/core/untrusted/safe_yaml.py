"""Bounded YAML: what yolo-det reads from others' files and command lines answers fast, whatever the text.

``yaml.safe_load`` never runs code, but a few hundred bytes can still exhaust memory or the stack: an
alias of an alias of ... (``a: &a [x, x]``, ``b: &b [*a, *a]``, ...) is a small graph whose expansion has
billions of nodes, which any walk of the result or ``repr()`` of it expands; a deep nesting
(``[[[[...]]]]``) recurses past Python's limit; an alias inside its own anchor is a cycle.
:class:`BoundedLoader` composes the document as PyYAML does, and refuses one nested more than
:data:`MAX_DEPTH` levels, one whose expansion (every alias counted as a copy) exceeds :data:`MAX_NODES`
nodes, and one where an alias refers to a node that contains it. The refusal is a
:class:`YamlLimitError`, a ``yaml.MarkedYAMLError`` with the line, so callers report it as any
malformed YAML.

:func:`load` with ``numbers=True`` also reads ``1e-3`` and ``5E4`` as floats (YAML 1.2, and Ultralytics'
own command line), where YAML 1.1 reads them as strings; it is used for ``key=value`` values.

:func:`error_line` is the one line a malformed YAML is reported with: ``WHERE:LINE: malformed YAML: PROBLEM``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["MAX_DEPTH", "MAX_NODES", "BoundedLoader", "YamlLimitError", "compose", "error_line", "load", "prescan"]

#: Deepest nesting of collections accepted (Ultralytics' model YAMLs nest 4 deep).
MAX_DEPTH = 64
#: Most nodes a document may expand to, each alias counted as a copy of what it refers to.
MAX_NODES = 100_000


class YamlLimitError(yaml.MarkedYAMLError):
    """A YAML document is beyond yolo-det's bounds (nesting, alias expansion, cycles, huge numbers)."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting, alias bombs and alias cycles (see the module docstring)."""

    max_depth = MAX_DEPTH
    max_nodes = MAX_NODES

    def __init__(self, stream: Any) -> None:
        if isinstance(stream, str):
            flow_depth_check(stream, self.max_depth)
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise YamlLimitError(
                    f"collections nested more than {self.max_depth} levels deep", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            expanded_size(node, self.max_nodes)
        return node

    def construct_document(self, node: Any) -> Any:
        try:
            return super().construct_document(node)
        except (ValueError, OverflowError, TypeError) as e:  # int('9' * 5000), unhashable keys
            raise YamlLimitError(" ".join(str(e).split())[:120] or type(e).__name__, node.start_mark) from None


def flow_depth_check(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse text whose ``[``/``{`` flow brackets nest deeper than ``max_depth``, in one linear pass.

    PyYAML's scanner looks ahead over a run of open brackets in quadratic time before the composer sees
    the first of them, so a long ``[[[[...`` is refused here, before it is scanned. Quoted strings and
    comments are skipped.

    Raises:
        YamlLimitError: The brackets nest too deep.
    """
    depth = 0
    quote = ""
    line = 0
    prev = "\n"
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == quote:
                if quote == "'" and i + 1 < n and text[i + 1] == "'":
                    i += 1
                else:
                    quote = ""
            elif c == "\\" and quote == '"':
                i += 1
            elif c == "\n":
                line += 1
        elif c == "#" and prev in " \t\n":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c in "'\"" and prev in " \t\n[{,:-":
            quote = c
        elif c in "[{":
            depth += 1
            if depth > max_depth:
                raise YamlLimitError(
                    f"collections nested more than {max_depth} levels deep", yaml.Mark("<text>", i, line, 0, None, 0)
                )
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == "\n":
            line += 1
        prev = c
        i += 1


def expanded_size(root: yaml.Node, limit: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> int:
    """Number of nodes ``root`` expands to (aliases counted as copies), without expanding it.

    Raises:
        YamlLimitError: The expansion exceeds ``limit`` nodes or nests deeper than ``max_depth`` (aliases
            followed), or an alias refers to a node containing it.
    """
    known: dict[int, tuple[int, int]] = {}  # id -> (size, height)
    active: set[int] = set()

    def visit(node: yaml.Node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise YamlLimitError("an alias refers to a node that contains it (a cycle)", node.start_mark)
        found = known.get(key)
        if found is None:
            total, height = 1, 1
            if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
                if level > max_depth:
                    raise YamlLimitError(
                        f"collections nested more than {max_depth} levels deep (aliases followed)", node.start_mark
                    )
                active.add(key)
                children = node.value if isinstance(node, yaml.SequenceNode) else [n for p in node.value for n in p]
                for child in children:
                    size, h = visit(child, level + 1)
                    total += size
                    height = max(height, h + 1)
                    if total > limit:
                        raise YamlLimitError(f"aliases expand to more than {limit} nodes", node.start_mark)
                active.discard(key)
            found = known[key] = (total, height)
        if level + found[1] - 1 > max_depth + 1:
            raise YamlLimitError(
                f"collections nested more than {max_depth} levels deep (aliases followed)", node.start_mark
            )
        return found

    return visit(root, 1)[0]


#: Largest integer a document may hold, in bits (a seed, a size or a count is far smaller; a bigger one only
#: makes ``str()`` of it fail, as Python refuses to print an integer of more than 4300 digits).
MAX_INT_BITS = 1024


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    if abs(value).bit_length() > MAX_INT_BITS:
        raise YamlLimitError(f"an integer of more than {MAX_INT_BITS} bits", node.start_mark)
    return value


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


class _NumbersLoader(BoundedLoader):
    """BoundedLoader that also reads exponent-only floats (``1e-3``) as numbers."""


_NumbersLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load(text: str, *, numbers: bool = False) -> Any:
    """Parse one YAML document within bounds (safe types only).

    Args:
        text: The document.
        numbers: Also read ``1e-3``-style floats as numbers.

    Raises:
        yaml.YAMLError: Malformed, or beyond bounds (:class:`YamlLimitError`).
    """
    loader = (_NumbersLoader if numbers else BoundedLoader)(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def compose(text: str) -> yaml.Node | None:
    """Compose one YAML document within bounds (the node tree, for line numbers).

    Raises:
        yaml.YAMLError: Malformed, or beyond bounds.
    """
    loader = BoundedLoader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def prescan(text: str) -> None:
    """Raise :class:`YamlLimitError` if any document of ``text`` is beyond bounds; other YAML errors are
    left for the caller's own parser to report."""
    loader = BoundedLoader(text)
    try:
        while loader.check_node():
            loader.get_node()
    except YamlLimitError:
        raise
    except yaml.YAMLError:
        return
    finally:
        loader.dispose()


def error_line(where: str, error: Exception, *, fallback: str | None = None, context: bool = False) -> str:
    """``WHERE:LINE: malformed YAML: PROBLEM``: the one line a YAML error (PyYAML's or ruamel's) is reported with.

    Args:
        where: What was read (a path, ``data 'coco.yaml'``); the line number is added when the error has one.
        error: The parser's error (its ``problem_mark`` and ``problem``, when it has them).
        fallback: The problem said when the error names none (default: the first line of the error's text).
        context: Add the parser's context when it points at another line (``(while parsing ... at line N)``).
    """
    mark = getattr(error, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or (fallback if fallback is not None else _first_line(error))
    if context:
        said, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
        if said and context_mark is not None and (mark is None or context_mark.line != mark.line):
            problem += f" ({said} at line {context_mark.line + 1})"
    return f"{where}{line}: malformed YAML: {problem}"


def _first_line(error: Exception) -> str:
    lines = str(error).splitlines()
    return lines[0] if lines else type(error).__name__
