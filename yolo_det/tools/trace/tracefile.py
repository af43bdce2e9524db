"""The op trace file: JSON lines, a header then one line per traced step; written atomically, read strictly.

A trace is input from elsewhere (another machine, another user): :func:`read_trace` checks the schema name,
the version and the digest kind, and every field's type and size, before anything uses it; the first
field that is wrong is named in one line. Nothing in a trace is ever executed or imported: it is JSON
holding names, numbers and digests.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError
from ...core.fileio import atomic_write_text

__all__ = [
    "TRACE_DIGEST",
    "TRACE_SCHEMA",
    "TRACE_VERSION",
    "ForwardCall",
    "Micro",
    "Trace",
    "TraceStep",
    "read_trace",
    "write_trace",
]

TRACE_SCHEMA = "yolo-det/op-trace"
TRACE_VERSION = 1
TRACE_DIGEST = "fingerprint/1"  # yolo_det.tools.fingerprint
MAX_TRACE_BYTES = 512 * 2**20
#: The most digests (inputs, outputs, gradients, states, weights) a trace may hold: what bounds the memory reading
#: one costs (a 512 MiB file of short lines would otherwise make tens of millions of objects).
MAX_TRACE_ENTRIES = 4_000_000
_NAN = float("nan")
_MAX_TEXT = 4096
_DIGEST = re.compile(r"^(?:[0-9a-f]{32}|none)$")
_BACKWARD_KINDS = ("gout", "gin", "grad")
_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "npu", "meta")


@dataclass(frozen=True)
class ForwardCall:
    """One module call: its key (``name``, or ``name#k`` for the k-th repeat), input and output digests."""

    key: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: tuple[str, ...]
    dtype: str


@dataclass(frozen=True)
class Micro:
    """One micro-batch of a step: the batch digests, the forward calls, the backward events in autograd's order."""

    data: str
    files: str
    forward: tuple[ForwardCall, ...]
    backward: tuple[tuple[str, str, int, str], ...]


@dataclass(frozen=True)
class TraceStep:
    """One traced optimizer step."""

    step: int
    epoch: int
    iteration: int
    state: tuple[tuple[str, str], ...]
    micro: tuple[Micro, ...]
    optimizer: tuple[tuple[str, str, str], ...]
    hyper: tuple[tuple[tuple[str, float], ...], ...]
    scale: float


@dataclass
class Trace:
    """A trace file, read and checked.

    Attributes:
        path: Where it was read from.
        rank: The rank that wrote it; world_size: how many ranks trained.
        device_type: The device the model trained on (digests compare only between equal device types).
        settings: The op settings of :func:`yolo_det.tools.trace.settings.op_settings`.
        modules: ``{name: {"type": class path, "extra": extra_repr}}``.
        steps: The traced steps, in order.
    """

    path: str
    rank: int
    world_size: int
    device_type: str
    steps_spec: str
    settings: dict[str, Any]
    modules: dict[str, dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[TraceStep] = field(default_factory=list)


def write_trace(path: str | os.PathLike[str], header: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> Path:
    """Write a header and the steps so far to ``path`` atomically (JSON lines) and return the path."""
    head = {
        "schema": TRACE_SCHEMA,
        "version": TRACE_VERSION,
        "digest": TRACE_DIGEST,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **header,
    }
    lines = [json.dumps(head, sort_keys=True, separators=(",", ":"), default=str)]
    lines.extend(json.dumps(s, separators=(",", ":"), default=str) for s in steps)
    return atomic_write_text(path, "\n".join(lines) + "\n")


class _Bad(Exception):
    pass


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise _Bad(f"'{where}' must be {what}")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**62) < v < 2**62


def _text(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_TEXT


def _digest(v: Any) -> bool:
    return isinstance(v, str) and _DIGEST.match(v) is not None


def _digests(v: Any, where: str) -> tuple[str, ...]:
    _need(isinstance(v, list) and all(_digest(x) for x in v), where, "a list of digests")
    return tuple(v)


def _header(data: Any) -> dict[str, Any]:
    _need(isinstance(data, dict), "header", "a JSON object")
    if data.get("schema") != TRACE_SCHEMA:
        raise _Bad(f"no '{TRACE_SCHEMA}' schema (write one with --trace-ops STEPS)")
    version = data.get("version")
    _need(_int(version) and version >= 1, "version", "a positive integer")
    if version > TRACE_VERSION:
        raise _Bad(f"version {version} of the op-trace format; this yolo-det reads up to {TRACE_VERSION}: upgrade it")
    _need(data.get("digest") == TRACE_DIGEST, "digest", repr(TRACE_DIGEST))
    for key in ("rank", "world_size"):
        _need(_int(data.get(key)) and data[key] >= 0, key, "a non-negative integer")
    _need(data.get("device_type") in _DEVICE_TYPES, "device_type", f"one of {', '.join(_DEVICE_TYPES)}")
    _need(_text(data.get("steps")), "steps", "a string")
    settings = data.get("settings")
    _need(isinstance(settings, dict), "settings", "an object")
    for k, v in settings.items():
        _need(
            _text(k) and (v is None or isinstance(v, (bool, int, float)) or _text(v)), f"settings.{k}"[:80], "a scalar"
        )
    modules = data.get("modules")
    _need(isinstance(modules, dict), "modules", "an object")
    for name, m in modules.items():
        _need(
            _text(name)
            and isinstance(m, dict)
            and _text(m.get("type"))
            and _text(m.get("extra"))
            and (m.get("buffers") is None or (_int(m["buffers"]) and m["buffers"] >= 0)),
            f"modules.{name}"[:80],
            "an object with 'type' and 'extra' strings (and a 'buffers' count)",
        )
    meta = data.get("meta", {})
    _need(
        isinstance(meta, dict) and all(_text(k) and (v is None or _text(v)) for k, v in meta.items()),
        "meta",
        "an object of strings",
    )
    return data


def _step(data: Any, n: int, names: dict[str, str] | None = None, budget: list[int] | None = None) -> TraceStep:
    """Check one step's line and make it a :class:`TraceStep`; ``names`` keeps each module name once across steps,
    ``budget`` counts down the digests a trace may still hold."""
    names = {} if names is None else names
    budget = [MAX_TRACE_ENTRIES] if budget is None else budget
    at = f"steps[{n}]"

    def name(text: str) -> str:
        return names.setdefault(text, text)

    def spend(count: int) -> None:
        budget[0] -= count
        if budget[0] < 0:
            raise _Bad(f"it holds more than {MAX_TRACE_ENTRIES} digests (at {at}): not an op trace yolo-det compares")

    _need(isinstance(data, dict), at, "a JSON object")
    for key in ("step", "epoch", "iteration"):
        _need(_int(data.get(key)) and data[key] >= 0, f"{at}.{key}", "a non-negative integer")
    state = data.get("state")
    _need(
        isinstance(state, list)
        and all(isinstance(e, list) and len(e) == 2 and _text(e[0]) and _digest(e[1]) for e in state),
        f"{at}.state",
        "a list of [name, digest]",
    )
    micro = data.get("micro")
    _need(isinstance(micro, list), f"{at}.micro", "a list")
    micros = []
    for j, m in enumerate(micro):
        mat = f"{at}.micro[{j}]"
        _need(
            isinstance(m, dict) and _digest(m.get("data")) and _digest(m.get("files")),
            mat,
            "an object with data and files digests",
        )
        fwd = m.get("forward")
        _need(isinstance(fwd, list), f"{mat}.forward", "a list")
        calls = []
        for k, c in enumerate(fwd):
            cat = f"{mat}.forward[{k}]"
            _need(
                isinstance(c, list) and len(c) == 5 and _text(c[0]) and _text(c[4]),
                cat,
                "[key, inputs, outputs, shapes, dtype]",
            )
            _need(isinstance(c[3], list) and all(_text(s) for s in c[3]), f"{cat}.shapes", "a list of strings")
            inputs, outputs = _digests(c[1], f"{cat}.inputs"), _digests(c[2], f"{cat}.outputs")
            spend(len(inputs) + len(outputs))
            calls.append(ForwardCall(name(c[0]), inputs, outputs, tuple(name(x) for x in c[3]), name(c[4])))
        bwd = m.get("backward")
        _need(isinstance(bwd, list), f"{mat}.backward", "a list")
        events = []
        for k, e in enumerate(bwd):
            _need(
                isinstance(e, list)
                and len(e) == 4
                and e[0] in _BACKWARD_KINDS
                and _text(e[1])
                and _int(e[2])
                and _digest(e[3]),
                f"{mat}.backward[{k}]",
                "[gout|gin|grad, key, index, digest]",
            )
            events.append((name(e[0]), name(e[1]), e[2], e[3]))
        spend(len(events) + 2)
        micros.append(Micro(m["data"], m["files"], tuple(calls), tuple(events)))
    opt = data.get("optimizer")
    _need(
        isinstance(opt, list)
        and all(isinstance(e, list) and len(e) == 3 and _text(e[0]) and _digest(e[1]) and _digest(e[2]) for e in opt),
        f"{at}.optimizer",
        "a list of [name, gradient digest, weights digest]",
    )
    hyper = data.get("hyper", [])
    _need(
        isinstance(hyper, list)
        and all(
            isinstance(g, dict)
            and all(_text(k) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in g.items())
            for g in hyper
        ),
        f"{at}.hyper",
        "a list of objects of numbers",
    )
    scale = data.get("scale", 1.0)
    _need(isinstance(scale, (int, float)) and not isinstance(scale, bool), f"{at}.scale", "a number")
    spend(len(state) + 2 * len(opt))
    return TraceStep(
        step=data["step"],
        epoch=data["epoch"],
        iteration=data["iteration"],
        state=tuple((name(e[0]), e[1]) for e in state),
        micro=tuple(micros),
        optimizer=tuple((name(e[0]), e[1], e[2]) for e in opt),
        hyper=tuple(tuple(sorted((name(k), _number(v)) for k, v in g.items())) for g in hyper),
        scale=_number(scale),
    )


def _number(v: float) -> float:
    """A trace's number as a float, NaN kept as the one shared NaN (see :func:`_constant`)."""
    return v if isinstance(v, float) else float(v)


def _constant(name: str) -> float:
    """JSON's ``NaN``/``Infinity``: NaN is one shared object, so that a NaN compares equal to itself wherever a
    trace's values are compared in tuples, lists or dicts (which compare items by identity first)."""
    return _NAN if name == "NaN" else float(name)


def _rows(f: Any, p: Path) -> Iterator[Any]:
    """The JSON values of the lines of ``f``, one at a time (a line is never longer than the file's cap)."""
    size, number = 0, 0
    while True:
        line = f.readline(MAX_TRACE_BYTES - size + 1)  # never more than the file may still hold
        if not line:
            return
        number += 1
        size += len(line)
        if size > MAX_TRACE_BYTES:
            raise ConfigError(f"'{p}' is larger than {MAX_TRACE_BYTES >> 20} MiB: not an op trace")
        if not line.strip():
            continue
        try:
            yield json.loads(line, parse_constant=_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ConfigError(
                f"'{p}' is not a usable op trace: not JSON lines (line {number}: {type(e).__name__})"
            ) from None


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and check an op trace, one line at a time.

    The file is streamed: each line is checked and kept only as the step it describes (names shared between
    steps are kept once), so reading costs about the steps' own size, not the file's several times; the file
    may hold at most :data:`MAX_TRACE_BYTES` and :data:`MAX_TRACE_ENTRIES` digests.

    Raises:
        ConfigError: Missing, too large, not JSON lines, another schema, a newer version, or a malformed field
            (one line naming it).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"'{p}' does not exist; pass an op trace (.jsonl) or a run folder trained with --trace-ops")
    names: dict[str, str] = {}
    budget = [MAX_TRACE_ENTRIES]
    try:
        with p.open("rb") as f:
            rows = _rows(f, p)
            first = next(rows, None)
            if first is None:
                raise _Bad("the file is empty")
            head = _header(first)
            steps = [_step(r, n, names, budget) for n, r in enumerate(rows)]
    except OSError as e:
        raise ConfigError(f"cannot read '{p}' ({type(e).__name__})") from None
    except _Bad as e:
        raise ConfigError(f"'{p}' is not a usable op trace: {e}") from None
    return Trace(
        path=str(p),
        rank=head["rank"],
        world_size=head["world_size"],
        device_type=head["device_type"],
        steps_spec=head["steps"],
        settings=dict(head["settings"]),
        modules={k: dict(v) for k, v in head["modules"].items()},
        meta=dict(head.get("meta", {})),
        steps=steps,
    )
