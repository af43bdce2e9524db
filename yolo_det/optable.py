"""The knowledge table: CUDA kernels that are not deterministic, per torch version.

The table is package data (``yolo_det/data/nondeterministic_ops.yaml``), readable and meant to be
edited: each entry names the kernel torch prints in its error, the aten ops and autograd nodes that
reach it, the pass (forward/backward), what torch does under each deterministic mode (the *effect*),
the condition, per torch version range whether it holds, and the deterministic replacement. The
audit (:mod:`yolo_det.audit`) and the CPU emulator (:mod:`yolo_det.emulator`) both read it, for the
running torch version or for one given explicitly::

    table = load_table()
    for entry, when in table.active("2.0.1"):
        print(entry.id, entry.kernel, when)

Matching a traced op against the table is :meth:`OpTable.lookup`; whether an occurrence reaches the
kernel is :meth:`OpEntry.reaches`, which encodes the only run-time condition torch has today: since
2.1, ``F.interpolate``/``F.pad`` route some calls through a deterministic decomposition on CUDA when
deterministic algorithms are on at forward time (``native_path``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

import yaml

from . import safe_yaml
from .errors import ConfigError, did_you_mean

__all__ = [
    "BEHAVIOUR",
    "EFFECTS",
    "Fix",
    "OpEntry",
    "OpTable",
    "VersionRange",
    "decomposable_op",
    "function_name",
    "load_table",
    "op_arguments",
    "parse_table",
    "parse_version",
    "torch_version",
    "version_in",
]

Effect = Literal["alert", "warn_only", "silent", "review"]
When = Literal["always", "native_path", "never"]
Pass = Literal["forward", "backward"]
NodeKind = Literal["extension", "python_function"]

EFFECTS: tuple[str, ...] = get_args(Effect)
_WHENS: tuple[str, ...] = get_args(When)
_PASSES: tuple[str, ...] = get_args(Pass)
_NODE_KINDS: tuple[str, ...] = get_args(NodeKind)

#: What happens, per effect, under each deterministic mode (``strict``, ``warn`` = warn_only, ``off``).
BEHAVIOUR: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "alert": MappingProxyType({"strict": "raises RuntimeError", "warn": "warns; non-deterministic",
                               "off": "non-deterministic, no message"}),
    "warn_only": MappingProxyType({"strict": "deterministic algorithm", "warn": "warns; non-deterministic",
                                   "off": "non-deterministic, no message"}),
    "silent": MappingProxyType({"strict": "non-deterministic, no message", "warn": "non-deterministic, no message",
                                "off": "non-deterministic, no message"}),
    "review": MappingProxyType({"strict": "custom backward (its torch ops were checked)",
                                "warn": "custom backward (its torch ops were checked)",
                                "off": "custom backward (its torch ops were checked)"}),
})

_ENTRY_KEYS = ("id", "kernel", "pass", "effect", "ops", "forward_ops", "nodes", "functions", "node_kinds", "args",
               "cpu_alerts", "triggered_by", "condition", "versions", "fix")
_REQUIRED = ("id", "kernel", "pass", "effect", "versions", "fix")
_TOP_KEYS = ("schema", "checked_against", "messages", "entries")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_DEFAULT = "nondeterministic_ops.yaml"


# ---------------------------------------------------------------------------------------------------------
# versions


def parse_version(version: str | Iterable[int]) -> tuple[int, int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14, 1)``. Local and pre-release suffixes are ignored.

    Raises:
        ConfigError: The string does not start with a version number.
    """
    if not isinstance(version, str):
        parts = [int(p) for p in version]
    else:
        m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
        if m is None:
            raise ConfigError(f"'{version}' is not a torch version; give it like 2.1 or 2.14.1")
        parts = [int(p) for p in m.group(1).split(".")]
    parts = (parts + [0, 0, 0])[:3]
    return parts[0], parts[1], parts[2]


def torch_version() -> str:
    """The running torch's version string."""
    import torch

    return str(torch.__version__)


def version_in(spec: str, version: str | tuple[int, int, int]) -> bool:
    """Whether ``version`` satisfies ``spec``, a comma-separated list like ``">=2.1,<2.14"`` (empty: any).

    Raises:
        ConfigError: A clause of ``spec`` is not ``<op><version>``.
    """
    v = parse_version(version) if isinstance(version, str) else version
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ConfigError(f"bad version clause '{clause}' in '{spec}'; use >=, <=, ==, !=, > or < and a version, e.g. >=2.1,<2.14")
        op, bound = m.group(1), parse_version(m.group(2))
        ok = {">=": v >= bound, "<=": v <= bound, "==": v == bound, "!=": v != bound, ">": v > bound, "<": v < bound}[op]
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------
# entries


@dataclass(frozen=True)
class VersionRange:
    """One ``versions`` item: for torch versions in ``spec``, the entry holds ``when``."""

    spec: str
    when: str

    def contains(self, version: str | tuple[int, int, int]) -> bool:
        """Whether ``version`` is in this range."""
        return version_in(self.spec, version)


@dataclass(frozen=True)
class Fix:
    """The deterministic replacement of an entry.

    Attributes:
        modules: ``{"torch.nn.X": "yolo_det.layers...DetX"}``: module classes and their drop-in swaps.
        functions: ``{"torch.nn.functional.f": "yolo_det.layers...f"}``: functional replacements.
        note: What to do when no swap fits.
    """

    modules: Mapping[str, str] = field(default_factory=dict)
    functions: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", MappingProxyType(dict(self.modules)))
        object.__setattr__(self, "functions", MappingProxyType(dict(self.functions)))

    def __hash__(self) -> int:
        return hash((tuple(self.modules.items()), tuple(self.functions.items()), self.note))

    @property
    def has_swap(self) -> bool:
        """Whether a deterministic drop-in exists (module or function)."""
        return bool(self.modules or self.functions)

    def swap_for(self, module_class: str | None) -> str | None:
        """The drop-in class for ``module_class`` (``"torch.nn.AdaptiveMaxPool2d"`` or its bare name), or None."""
        if not module_class:
            return None
        for source, target in self.modules.items():
            if module_class in (source, source.rsplit(".", 1)[-1]):
                return target
        return None

    def describe(self, module_class: str | None = None) -> str:
        """One line: the swap for ``module_class`` if there is one, else the functional replacement, else the note."""
        swap = self.swap_for(module_class)
        if swap:
            return f"swap {module_class.rsplit('.', 1)[-1]} -> {swap}"  # type: ignore[union-attr]
        if self.functions:
            calls = ", ".join(f"{src.rsplit('.', 1)[-1]} -> {dst}" for src, dst in self.functions.items())
            mods = ", ".join(self.modules.values())
            return f"replace {calls}" + (f" (modules: {mods})" if mods else "")
        if self.modules:
            return "swap " + ", ".join(f"{s.rsplit('.', 1)[-1]} -> {d}" for s, d in self.modules.items())
        return self.note or "scoped toggle (profile balanced) or accept"

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {"modules": dict(self.modules), "functions": dict(self.functions), "note": self.note}


@dataclass(frozen=True)
class OpEntry:
    """One kernel of the table (see the header of the data file for the meaning of each field)."""

    id: str
    kernel: str
    pass_: str
    effect: str
    ops: tuple[str, ...] = ()
    forward_ops: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    node_kinds: tuple[str, ...] = ()
    args: Mapping[str, Any] = field(default_factory=dict)
    cpu_alerts: bool = False
    triggered_by: str = ""
    condition: str = ""
    versions: tuple[VersionRange, ...] = ()
    fix: Fix = field(default_factory=Fix)
    line: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))

    def __hash__(self) -> int:
        return hash(self.id)

    def rule(self, version: str | tuple[int, int, int]) -> str | None:
        """``always``, ``native_path`` or ``never`` for ``version``; None when no range covers it."""
        for rng in self.versions:
            if rng.contains(version):
                return rng.when
        return None

    def behaviour(self, mode: str) -> str:
        """What happens under deterministic mode ``mode`` (``strict``, ``warn`` or ``off``)."""
        return BEHAVIOUR[self.effect][mode]

    def args_hold(self, bound: Mapping[str, Any]) -> bool:
        """Whether the op arguments ``bound`` (schema name -> value) satisfy the entry's ``args``."""
        for name, want in self.args.items():
            if name not in bound:
                return False
            value = bound[name]
            if want == "present":
                if value is None:
                    return False
            elif value != want:
                return False
        return True

    @staticmethod
    def reaches(when: str, *, via_functional: bool, forward_deterministic: bool | None) -> bool:
        """Whether an occurrence reaches the non-deterministic kernel under rule ``when``.

        Args:
            when: The entry's rule for the torch version in question.
            via_functional: The forward call went through torch's Python layer (``F.interpolate``, ``F.pad``,
                ``F.max_pool3d``) rather than calling the aten op directly.
            forward_deterministic: Deterministic algorithms were on when the forward ran (None: unknown,
                counted as off).
        """
        if when == "always":
            return True
        if when == "native_path":
            return not (via_functional and bool(forward_deterministic))
        return False

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for ``--json``)."""
        return {
            "id": self.id,
            "kernel": self.kernel,
            "pass": self.pass_,
            "effect": self.effect,
            "ops": list(self.ops),
            "triggered_by": self.triggered_by,
            "condition": self.condition,
            "versions": [{"torch": r.spec, "when": r.when} for r in self.versions],
            "fix": self.fix.to_dict(),
        }


class OpTable:
    """The loaded table.

    Args:
        entries: The entries, in file order.
        messages: ``{"strict": ..., "warn": ...}`` message templates with a ``{kernel}`` field.
        source: Where the table came from (for messages).
    """

    def __init__(self, entries: Iterable[OpEntry], messages: Mapping[str, str] | None = None, source: str = "") -> None:
        self.entries: tuple[OpEntry, ...] = tuple(entries)
        self.messages: Mapping[str, str] = MappingProxyType(dict(messages or {}))
        self.source = source
        self._by_id = {e.id: e for e in self.entries}
        self._by_op: dict[str, list[OpEntry]] = {}
        self._by_forward_op: dict[str, list[OpEntry]] = {}
        self._by_function: dict[str, list[OpEntry]] = {}
        self._by_kind: dict[str, list[OpEntry]] = {}
        self._by_node: dict[str, list[OpEntry]] = {}
        for e in self.entries:
            for node in e.nodes:
                self._by_node.setdefault(node, []).append(e)
            for op in e.ops:
                self._by_op.setdefault(op, []).append(e)
            for op in e.forward_ops:
                self._by_forward_op.setdefault(op, []).append(e)
            for fn in e.functions:
                self._by_function.setdefault(fn, []).append(e)
            for kind in e.node_kinds:
                self._by_kind.setdefault(kind, []).append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Any:
        return iter(self.entries)

    def entry(self, entry_id: str) -> OpEntry:
        """The entry called ``entry_id``.

        Raises:
            ConfigError: No such entry.
        """
        try:
            return self._by_id[entry_id]
        except KeyError:
            raise ConfigError(f"no table entry '{entry_id}'.{did_you_mean(entry_id, self._by_id)}") from None

    def active(self, version: str | None = None) -> list[tuple[OpEntry, str]]:
        """``(entry, when)`` for every entry that holds on ``version`` (default: the running torch)."""
        v = parse_version(version or torch_version())
        out = []
        for e in self.entries:
            when = e.rule(v)
            if when is not None and when != "never":
                out.append((e, when))
        return out

    def lookup(self, op: str, overload: str = "") -> list[OpEntry]:
        """Entries whose ``ops`` name ``op`` (``"aten::name"``), with or without ``overload``."""
        found = list(self._by_op.get(op, ()))
        if overload:
            found += self._by_op.get(f"{op}.{overload}", [])
        return found

    def lookup_forward(self, op: str) -> list[OpEntry]:
        """Entries whose ``forward_ops`` name ``op``."""
        return list(self._by_forward_op.get(op, ()))

    def lookup_function(self, qualname: str) -> list[OpEntry]:
        """Entries whose ``functions`` name ``qualname`` (``"torch.nn.functional.scaled_dot_product_attention"``)."""
        return list(self._by_function.get(qualname, ()))

    def lookup_node(self, node: str) -> list[OpEntry]:
        """Entries whose ``nodes`` name the autograd node class ``node``."""
        return list(self._by_node.get(node, ()))

    @property
    def op_names(self) -> frozenset[str]:
        """Every op named in ``ops`` (without overloads), for fast filtering."""
        return frozenset(op.split(".", 1)[0] for op in self._by_op)

    def lookup_kind(self, kind: str) -> list[OpEntry]:
        """Entries matched by node kind (``extension`` or ``python_function``)."""
        return list(self._by_kind.get(kind, ()))

    @property
    def functions(self) -> frozenset[str]:
        """Every function named by an entry."""
        return frozenset(self._by_function)

    def message(self, kernel: str, *, warn_only: bool) -> str:
        """The text torch prints for ``kernel`` under strict (``warn_only=False``) or warn_only mode."""
        template = self.messages.get("warn" if warn_only else "strict")
        if not template:
            raise ConfigError(f"{self.source}: the table has no '{'warn' if warn_only else 'strict'}' message template")
        return template.replace("{kernel}", kernel)


# ---------------------------------------------------------------------------------------------------------
# loading


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
            raise ConfigError(f"{where}: unknown key '{key}'; valid keys: {', '.join(_ENTRY_KEYS)}.{did_you_mean(str(key), _ENTRY_KEYS)}")
    for key in _REQUIRED:
        if key not in raw:
            raise ConfigError(f"{where}: entry is missing '{key}'")
    for key in ("id", "kernel"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    if raw["pass"] not in _PASSES:
        raise ConfigError(f"{where}: 'pass' must be one of {', '.join(_PASSES)}, got {raw['pass']!r}")
    if raw["effect"] not in EFFECTS:
        raise ConfigError(f"{where}: 'effect' must be one of {', '.join(EFFECTS)}, got {raw['effect']!r}."
                          f"{did_you_mean(str(raw['effect']), EFFECTS)}")
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
        raise ConfigError(f"{where}: 'versions' must be a non-empty list of {{torch: spec, when: always|native_path|never}}")
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
    fix = Fix(_str_map(fix_raw.get("modules"), "fix.modules", where), _str_map(fix_raw.get("functions"), "fix.functions", where),
              str(fix_raw.get("note") or ""))
    if not fix.has_swap and not fix.note:
        raise ConfigError(f"{where}: 'fix' needs a swap (modules/functions) or a note")
    return OpEntry(
        id=raw["id"], kernel=raw["kernel"], pass_=raw["pass"], effect=raw["effect"], ops=ops, forward_ops=forward_ops,
        nodes=_str_tuple(raw.get("nodes"), "nodes", where), functions=functions, node_kinds=kinds, args=args,
        cpu_alerts=bool(raw.get("cpu_alerts", False)), triggered_by=str(raw.get("triggered_by") or ""),
        condition=str(raw.get("condition") or ""), versions=tuple(ranges), fix=fix, line=line,
    )


def parse_table(text: str, source: str = "<table>") -> OpTable:
    """Parse and validate a table document.

    Raises:
        ConfigError: The YAML is malformed or an entry is invalid (the message names the file and line).
    """
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: malformed YAML: {getattr(e, 'problem', None) or e}") from None
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
        line = lines[i] if i < len(lines) else None
        where = f"{source}:{line}" if line else f"{source} (entry {i + 1})"
        entry = _parse_entry(raw, where, line)
        if entry.id in seen:
            raise ConfigError(f"{where}: duplicate entry id '{entry.id}'")
        seen.add(entry.id)
        entries.append(entry)
    return OpTable(entries, messages, source)


@lru_cache(maxsize=1)
def _default_table() -> OpTable:
    text = resources.files("yolo_det.data").joinpath(_DEFAULT).read_text(encoding="utf-8")
    return parse_table(text, source=f"yolo_det/data/{_DEFAULT}")


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


# ---------------------------------------------------------------------------------------------------------
# torch's Python-level decompositions

_SIGNATURES: dict[str, Any] = {}


def _bind(function: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    import inspect

    import torch.nn.functional as F

    sig = _SIGNATURES.get(function)
    if sig is None:
        fn = getattr(F, function.rsplit(".", 1)[-1], None)
        if fn is None:
            return None
        sig = _SIGNATURES[function] = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def decomposable_op(function: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The aten op that ``function(*args, **kwargs)`` would route through a deterministic decomposition.

    Since torch 2.1, ``F.interpolate`` (4-D bilinear without antialias; 5-D trilinear on recent torch),
    ``F.pad`` (``replicate``) and ``F.max_pool3d_with_indices`` take a decomposition on CUDA when
    deterministic algorithms are on, instead of calling the aten op whose CUDA backward alerts. This returns
    that aten op (``"aten::upsample_bilinear2d"``), or None when the call has no such branch. Whether the
    branch exists on a given torch version is the table's business (``when: native_path``).

    Args:
        function: The qualified name, e.g. ``"torch.nn.functional.interpolate"``.
        args: Positional arguments of the call.
        kwargs: Keyword arguments of the call.
    """
    if function not in ("torch.nn.functional.interpolate", "torch.nn.functional.pad",
                        "torch.nn.functional.max_pool3d_with_indices"):
        return None
    bound = _bind(function, args, kwargs)
    if bound is None:
        return None
    tensor = bound.get("input")
    dim = getattr(tensor, "dim", None)
    if dim is None:
        return None
    ndim = dim()
    if function.endswith("interpolate"):
        mode = bound.get("mode")
        if mode == "bilinear" and ndim == 4 and not bound.get("antialias"):
            return "aten::upsample_bilinear2d"
        if mode == "trilinear" and ndim == 5:
            return "aten::upsample_trilinear3d"
        return None
    if function.endswith(".pad"):
        pad = bound.get("pad")
        if bound.get("mode") == "replicate" and isinstance(pad, (list, tuple)) and len(pad) in (2, 4, 6):
            return f"aten::replication_pad{len(pad) // 2}d"
        return None
    return "aten::max_pool3d_with_indices"


def function_name(func: Any) -> str:
    """A stable qualified name for a torch function seen by a ``TorchFunctionMode``.

    Functions of ``torch.nn.functional`` (including builtins re-exported there, such as
    ``scaled_dot_product_attention``) are named ``torch.nn.functional.<name>``.
    """
    import torch.nn.functional as F

    name = getattr(func, "__name__", None) or type(func).__name__
    if getattr(F, name, None) is func:
        return f"torch.nn.functional.{name}"
    module = getattr(func, "__module__", None)
    if module:
        return f"{module}.{name}"
    qual = getattr(func, "__qualname__", name)
    return f"torch.{qual}"


def op_arguments(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of an aten op call by schema name (defaults filled in), for an entry's ``args`` check."""
    out: dict[str, Any] = {}
    for i, a in enumerate(func._schema.arguments):
        if a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif i < len(args):
            out[a.name] = args[i]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out
