"""The op table's entries: which kernel, when it alerts, what fixes it (plain, frozen data)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...core.errors import ConfigError, did_you_mean
from .schema import BEHAVIOUR
from .versions import parse_version, torch_version, version_in

__all__ = ["Fix", "OpEntry", "OpTable", "VersionRange"]


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
        if swap and module_class:
            return f"swap {module_class.rsplit('.', 1)[-1]} -> {swap}"
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
