"""Compare two runs' ``determinism.json`` records: every difference, the most likely cause first, and a verdict.

:func:`diff_records` lists each difference between two records with both values, grouped and ordered by
how likely it is to change the bits of the trained weights:

1. data (the dataset fingerprint of :mod:`yolo_det.core.datafp`, per split: image list, image contents, labels),
2. model (architecture, YAML text, the weights the first step starts from),
3. seeds, 4. profile settings per phase and the flags observed at train start, 5. Ultralytics arguments,
6. versions (torch, CUDA, cuDNN, numpy, Ultralytics, OpenCV, ...), 7. GPU model, 8. CPU model and
instruction set, 9. thread counts, 10. environment variables, 11. layer swaps,
12. non-determinism warnings seen (a symptom, not a cause), and last what cannot change the bits
(paths, the command line, the platform string).

Each difference says whether it can change the trained weights (``changes_bits``): a GPU difference
cannot when both runs trained on the CPU; the validation and deploy phases do not change ``last.pt``;
a YAML start's initial weights follow from the seed and the torch version when those differ.

The verdict is one line: "these runs should be bitwise identical and are"; "these runs should be
bitwise identical but their weights differ: non-determinism not covered by the profile (see warnings)";
or "expected to differ because: ..." naming the most likely causes. Records written by older versions,
without fingerprints, are compared on what they hold (data and model by path) with a note saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.record_schema import MAX_BYTES, RECORD_NAME, RecordError, parse_record
from .data_stream import explain_data_stream, neutral_args

__all__ = ["DIFF_SCHEMA", "GROUPS", "Difference", "DiffReport", "diff_paths", "diff_records", "load_record"]

DIFF_SCHEMA = "yolo-det/diff/1"
#: Files of `yolo-det verify --save` (yolo_det.tools.verify.crossverify).
VERIFY_SAVED_SCHEMA = "yolo-det/verify-fingerprints"
#: Groups in the order of how likely a difference in them changes the bits; ``other`` never does.
GROUPS: dict[str, str] = {
    "data": "data",
    "model": "model",
    "seed": "seeds",
    "profile": "profile settings",
    "args": "Ultralytics arguments",
    "versions": "versions",
    "gpu": "GPU",
    "cpu": "CPU",
    "threads": "threads",
    "env": "environment variables",
    "swaps": "layer swaps",
    "warnings": "non-determinism warnings seen",
    "other": "other",
}
#: Ultralytics arguments that only name or decorate outputs (never change the trained weights).
OUTPUT_ARGS = frozenset(
    {
        "project",
        "name",
        "save_dir",
        "exist_ok",
        "verbose",
        "plots",
        "save",
        "save_period",
        "save_json",
        "save_txt",
        "save_conf",
        "save_crop",
        "save_frames",
        "show",
        "show_labels",
        "show_conf",
        "show_boxes",
        "line_width",
        "visualize",
        "vid_stride",
        "stream_buffer",
        "embed",
        "source",
        "format",
        "keras",
        "optimize",
        "int8",
        "dynamic",
        "simplify",
        "opset",
        "workspace",
        "nms",
        "mode",
    }
)
_VERSION_KEYS = (
    "torch",
    "torch_git_version",
    "cuda",
    "cudnn",
    "numpy",
    "ultralytics",
    "yolov5",
    "torchvision",
    "opencv",
    "pillow",
    "python",
    "yolo_det",
)
_SEED_KEYS = ("seed", "data_seed", "sampler_seed", "rng_seed", "rank_rng_seeds", "world_size", "data_order")
_MISSING = "(not recorded)"


@dataclass
class Difference:
    """One difference between two records.

    Attributes:
        group: One of :data:`GROUPS`.
        name: What differs, e.g. ``seed``, ``torch``, ``data: train labels``, ``imgsz=``.
        a, b: The two values (``"(not recorded)"`` when a record lacks it).
        changes_bits: Whether this difference can change the trained weights.
        note: Why it cannot, or what the values mean, when that needs saying.
    """

    group: str
    name: str
    a: Any
    b: Any
    changes_bits: bool = True
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {
            "group": self.group,
            "name": self.name,
            "a": self.a,
            "b": self.b,
            "changes_bits": self.changes_bits,
            "note": self.note,
        }


@dataclass
class DiffReport:
    """The outcome of :func:`diff_records`.

    Attributes:
        a, b: Where the records came from.
        differences: Every difference, ordered by group (see :data:`GROUPS`).
        weights: ``{"a": digest, "b": digest}`` of the final weights (None when a record has none).
        ema: The same for the EMA weights.
        notes: What could not be compared, and why.
        status: ``{"a": ..., "b": ...}`` of the runs (``completed`` or ``failed``).
    """

    a: str
    b: str
    differences: list[Difference] = field(default_factory=list)
    weights: dict[str, str | None] = field(default_factory=dict)
    ema: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    progress: dict[str, str] = field(default_factory=dict)
    resumed: dict[str, list[int]] = field(default_factory=dict)

    @property
    def causes(self) -> list[Difference]:
        """The differences that can change the trained weights, most likely first."""
        return [d for d in self.differences if d.changes_bits]

    @property
    def same_configuration(self) -> bool:
        """True when no difference can change the trained weights."""
        return not self.causes

    @property
    def weights_equal(self) -> bool | None:
        """Whether the final weights digests are equal (None when a record has none)."""
        a, b = self.weights.get("a"), self.weights.get("b")
        if not a or not b:
            return None
        ema_a, ema_b = self.ema.get("a"), self.ema.get("b")
        return a == b and (not ema_a or not ema_b or ema_a == ema_b)

    @property
    def kind(self) -> str:
        """``identical``, ``nondeterministic``, ``expected``, ``configured-differently`` or ``incomparable``."""
        equal = self.weights_equal
        if self.causes:
            return "configured-differently" if equal else "expected"
        if equal is None:
            return "incomparable"
        return "identical" if equal else "nondeterministic"

    @property
    def exit_code(self) -> int:
        """0 when the runs are configured the same and their weights digests are equal, else 1."""
        return 0 if self.kind == "identical" else 1

    @property
    def verdict(self) -> str:
        """One line for people."""
        kind = self.kind
        if kind == "identical":
            if self.resumed:
                after = "; ".join(
                    f"run {k.upper()} resumed after epoch {', '.join(map(str, v))}" for k, v in self.resumed.items()
                )
                return f"equivalent: {after}, and the weights are bitwise identical"
            return "these runs should be bitwise identical and are"
        if kind == "nondeterministic":
            seen = sum(self.warnings.values())
            hint = f"{seen} warning(s) recorded" if seen else "no warning was recorded"
            return (
                "these runs should be bitwise identical but their weights differ: non-determinism not covered "
                f"by the profile (see warnings: {hint})"
            )
        if kind == "incomparable":
            missing = [k.upper() for k in ("a", "b") if not self.weights.get(k)]
            why = ", ".join(
                f"run {k} ({self.progress.get(k.lower()) or self.status.get(k.lower(), 'unknown')})" for k in missing
            )
            return f"these runs are configured the same, but the weights cannot be compared: no final weights for {why}"
        reasons = "; ".join(_short(d) for d in self.causes[:3])
        more = f"; and {len(self.causes) - 3} more" if len(self.causes) > 3 else ""
        if kind == "configured-differently":
            return f"configured differently ({reasons}{more}), yet their weights are identical"
        return f"expected to differ because: {reasons}{more}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (schema ``yolo-det/diff/1``)."""
        return {
            "schema": DIFF_SCHEMA,
            "a": self.a,
            "b": self.b,
            "verdict": self.verdict,
            "kind": self.kind,
            "same_configuration": self.same_configuration,
            "weights_equal": self.weights_equal,
            "weights": self.weights,
            "ema": self.ema,
            "status": self.status,
            "differences": [d.to_dict() for d in self.differences],
            "notes": self.notes,
            "exit_code": self.exit_code,
            "progress": self.progress,
            "resumed_after": self.resumed,
        }

    def summary(self) -> str:
        """Lines for the terminal: the records, the weights, the differences by group, the verdict."""
        lines = [f"A: {self.a}", f"B: {self.b}"]
        for key in ("a", "b"):
            if self.status.get(key) not in ("completed", None):
                lines.append(f"run {key.upper()}: {self.progress.get(key) or self.status.get(key)}")
            if self.resumed.get(key):
                lines.append(f"run {key.upper()}: resumed after epoch {', '.join(map(str, self.resumed[key]))}")
        wa, wb = self.weights.get("a"), self.weights.get("b")
        state = {True: "equal", False: "DIFFERENT", None: "not comparable"}[self.weights_equal]
        lines.append(f"weights: A {(wa or 'none')[:16]}  B {(wb or 'none')[:16]}  ({state})")
        for title, items in (
            ("differences that can change the weights, most likely first:", self.causes),
            ("differences that do not change the weights:", [d for d in self.differences if not d.changes_bits]),
        ):
            if not items:
                continue
            lines.append(title)
            group = None
            for d in items:
                if d.group != group:
                    group = d.group
                    lines.append(f"  {GROUPS[group]}")
                note = f"  ({d.note})" if d.note else ""
                lines.append(f"    {d.name}: A {_show(d.a)} | B {_show(d.b)}{note}")
        if not self.differences:
            lines.append("no differences in configuration, software or hardware")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(_esc(line) for line in lines)


def _esc(value: Any) -> str:
    """``value`` as text with every non-printable character escaped (a newline, a terminal escape, a bidi mark):
    text read from a record cannot start a line of its own or change the terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _show(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(d: Difference) -> str:
    return f"{d.name} ({_show(d.a, 40)} vs {_show(d.b, 40)})"


# ---------------------------------------------------------------------------------------------------------
# loading


def load_record(source: str | Path) -> tuple[dict[str, Any], str]:
    """Read a run's record: a run folder (its ``determinism.json``), a ``determinism.json`` file, or a file
    written by ``yolo-det verify --save`` (its environment part).

    Returns:
        ``(record, path it was read from)``.

    Raises:
        ConfigError: The path does not exist, is not JSON, is not a yolo-det record, or was written by a
            newer yolo-det.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / RECORD_NAME).is_file():
            raise ConfigError(
                f"'{path}' is a folder without {RECORD_NAME}; pass a yolo-det run folder or a {RECORD_NAME} file"
            )
        path = path / RECORD_NAME
    if not path.is_file():
        raise ConfigError(f"'{path}' does not exist; pass a yolo-det run folder or a {RECORD_NAME} file")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read '{_esc(path)}' ({type(e).__name__}); pass a {RECORD_NAME} file") from None
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (RecursionError, UnicodeDecodeError, ValueError):
        data = None
    if isinstance(data, dict) and data.get("schema") == VERIFY_SAVED_SCHEMA:  # its record part (the run's own)
        data = data.get("record")
        raw = json.dumps(data).encode()
    if isinstance(data, dict) and (not isinstance(data.get("environment"), dict) or "profile" not in data):
        raise ConfigError(f"'{_esc(path)}' is not a yolo-det {RECORD_NAME} (no environment or profile entry)")
    try:
        data = parse_record(raw)
    except RecordError as e:
        raise ConfigError(f"'{_esc(path)}' is not a readable {RECORD_NAME}: {e}") from None
    return data, str(path)


# ---------------------------------------------------------------------------------------------------------
# comparing


def _get(record: Mapping[str, Any], *keys: str) -> Any:
    value: Any = record
    for k in keys:
        if not isinstance(value, Mapping) or k not in value:
            return _MISSING
        value = value[k]
    return value


class _Collector:
    def __init__(self) -> None:
        self.items: list[Difference] = []
        self.notes: list[str] = []

    def add(self, group: str, name: str, a: Any, b: Any, *, changes_bits: bool = True, note: str | None = None) -> bool:
        if _canon(a) == _canon(b):
            return False
        self.items.append(Difference(group, name, a, b, changes_bits, note))
        return True


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


_MARKERS = {"data": "splits", "model": "kind"}  # a key only the fingerprint has (YOLOv5 records hold another "model")


def _fingerprint(record: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = record.get(key)
    if isinstance(value, Mapping) and "error" not in value and _MARKERS[key] in value:
        return value
    return None


def _why_missing(record: Mapping[str, Any], key: str, label: str) -> str:
    value = record.get(key)
    if isinstance(value, Mapping) and "error" in value:
        return f"record {label} has no {key} fingerprint ({value['error']})"
    return f"record {label} has no {key} fingerprint (written by an older yolo-det, or by the YOLOv5 integration)"


def _short_hash(h: Any) -> Any:
    return h[:12] if isinstance(h, str) else h


def _args(record: Mapping[str, Any]) -> Mapping[str, Any]:
    args = record.get("ultralytics_args")
    if isinstance(args, Mapping) and "error" not in args:
        return args
    run = record.get("run")
    return run if isinstance(run, Mapping) else {}


def _trained_on_cpu(record: Mapping[str, Any]) -> bool:
    device = _args(record).get("device")
    if str(device).strip().lower() in {"cpu", "mps"}:
        return True
    return device in (None, "") and not _get(record, "environment", "cuda_available")


def _data(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    fa, fb = _fingerprint(ra, "data"), _fingerprint(rb, "data")
    if fa is None or fb is None:
        for rec, label, fp in ((ra, "A", fa), (rb, "B", fb)):
            if fp is None:
                c.notes.append(_why_missing(rec, "data", label) + ": the data are compared by the data= path only")
        c.add("data", "data= (path; no fingerprint)", _args(ra).get("data", _MISSING), _args(rb).get("data", _MISSING))
        return
    if fa.get("version") != fb.get("version"):
        c.add(
            "data",
            "data fingerprint version",
            fa.get("version"),
            fb.get("version"),
            note="fingerprints of different versions cannot be compared",
        )
        return
    c.add(
        "data",
        "data= (path)",
        _args(ra).get("data", _MISSING),
        _args(rb).get("data", _MISSING),
        changes_bits=False,
        note="the fingerprint decides",
    )
    if fa.get("sha256") == fb.get("sha256"):
        return
    sa, sb = fa.get("splits") or {}, fb.get("splits") or {}
    for split in sorted(set(sa) | set(sb), key=lambda s: (s != "train", s)):
        xa, xb = sa.get(split), sb.get(split)
        if xa is None or xb is None:
            c.add("data", f"data: {split} split", "present" if xa else "absent", "present" if xb else "absent")
            continue
        if xa.get("sha256") == xb.get("sha256"):
            continue
        if xa.get("list_sha256") != xb.get("list_sha256"):
            c.add(
                "data",
                f"data: {split} image list",
                f"{xa.get('images')} images, {_short_hash(xa.get('list_sha256'))}",
                f"{xb.get('images')} images, {_short_hash(xb.get('list_sha256'))}",
            )
        if xa.get("images_sha256") != xb.get("images_sha256") and xa.get("list_sha256") == xb.get("list_sha256"):
            c.add(
                "data",
                f"data: {split} image contents",
                _short_hash(xa.get("images_sha256")),
                _short_hash(xb.get("images_sha256")),
                note="same file names, different bytes",
            )
        if xa.get("labels_sha256") != xb.get("labels_sha256"):
            c.add(
                "data",
                f"data: {split} labels",
                f"{_short_hash(xa.get('labels_sha256'))} ({xa.get('missing_labels', 0)} missing)",
                f"{_short_hash(xb.get('labels_sha256'))} ({xb.get('missing_labels', 0)} missing)",
            )
    c.add("data", "data: class names", _short_hash(fa.get("names_sha256")), _short_hash(fb.get("names_sha256")))
    if not any(d.group == "data" and d.changes_bits for d in c.items):  # a reason the parts above do not show
        c.add("data", "data", _short_hash(fa.get("sha256")), _short_hash(fb.get("sha256")))


def _model(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    ma, mb = _fingerprint(ra, "model"), _fingerprint(rb, "model")
    if ma is None or mb is None:
        for rec, label, fp in ((ra, "A", ma), (rb, "B", mb)):
            if fp is None:
                c.notes.append(_why_missing(rec, "model", label) + ": the model is compared by the model= path only")

        def source(r: Mapping[str, Any]) -> Any:  # Ultralytics: model=; YOLOv5: --cfg and --weights
            args = _args(r)
            found = {k: args[k] for k in ("model", "cfg", "weights") if args.get(k) not in (None, "")}
            return found or _MISSING

        c.add("model", "model (path; no fingerprint)", source(ra), source(rb))
        return
    c.add("model", "model: start", ma.get("kind"), mb.get("kind"))
    c.add(
        "model",
        "model: architecture",
        _short_hash(ma.get("architecture_sha256", _MISSING)),
        _short_hash(mb.get("architecture_sha256", _MISSING)),
    )
    if ma.get("kind") == mb.get("kind") == "yaml":
        c.add("model", "model: YAML text", _short_hash(ma.get("yaml_sha256")), _short_hash(mb.get("yaml_sha256")))
    wa, wb = ma.get("start_weights_sha256", _MISSING), mb.get("start_weights_sha256", _MISSING)
    if wa != wb:
        if ma.get("kind") == mb.get("kind") == "checkpoint":
            c.add("model", "model: checkpoint weights", _short_hash(wa), _short_hash(wb))
        else:
            explained = [k for k in ("seed",) if _canon(_get(ra, "seeds", k)) != _canon(_get(rb, "seeds", k))]
            explained += [k for k in ("torch",) if _get(ra, "environment", k) != _get(rb, "environment", k)]
            c.add(
                "model",
                "model: initial weights",
                _short_hash(wa),
                _short_hash(wb),
                changes_bits=not explained,
                note=f"a YAML start: follows from the {' and '.join(explained)}" if explained else None,
            )
    c.add(
        "model",
        "model= (path)",
        ma.get("source"),
        mb.get("source"),
        changes_bits=False,
        note="the fingerprints above decide",
    )


def _seeds(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    seed_differs = c.add("seed", "seed", _get(ra, "seeds", "seed"), _get(rb, "seeds", "seed"))
    for key in _SEED_KEYS[1:]:
        c.add(
            "seed",
            f"seed: {key}",
            _get(ra, "seeds", key),
            _get(rb, "seeds", key),
            changes_bits=not seed_differs,
            note="derived from the seed" if seed_differs else None,
        )


#: Profile settings and flags that only act on CUDA (cuDNN, TF32, cuBLAS, NCCL): no effect on a CPU run.
_CUDA_ONLY_SETTINGS = frozenset({"cudnn_benchmark", "cudnn_deterministic", "allow_tf32"})
_CUDA_ONLY_FLAGS = ("cudnn_", "matmul_fp32_precision", "env.CUBLAS_WORKSPACE_CONFIG", "env.NCCL_")
_ON_CPU = "no effect: both runs trained on the CPU"


def _profile(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    pa, pb = ra.get("profile") or {}, rb.get("profile") or {}
    on_cpu = _trained_on_cpu(ra) and _trained_on_cpu(rb)
    c.add("profile", "profile name", _get(pa, "name"), _get(pb, "name"), changes_bits=False, note="the settings decide")
    for phase in ("train", "val", "deploy"):
        xa, xb = pa.get(phase) or {}, pb.get(phase) or {}
        for key in sorted(set(xa) | set(xb)):
            cuda_only = on_cpu and key in _CUDA_ONLY_SETTINGS
            note = None if phase == "train" else f"the {phase} phase does not change the trained weights"
            c.add(
                "profile",
                f"{phase}.{key}",
                xa.get(key, _MISSING),
                xb.get(key, _MISSING),
                changes_bits=phase == "train" and not cuda_only,
                note=_ON_CPU if cuda_only else note,
            )
    sa, sb = _flat(ra.get("state_at_train_start") or {}), _flat(rb.get("state_at_train_start") or {})
    if sa and sb:
        seed_differs = _canon(_get(ra, "seeds", "seed")) != _canon(_get(rb, "seeds", "seed"))
        for key in sorted(set(sa) | set(sb)):
            derived = seed_differs and key.endswith("PYTHONHASHSEED")
            cuda_only = on_cpu and key.startswith(_CUDA_ONLY_FLAGS)
            c.add(
                "profile",
                f"flag at train start: {key}",
                sa.get(key, _MISSING),
                sb.get(key, _MISSING),
                changes_bits=not derived and not cuda_only,
                note="derived from the seed" if derived else _ON_CPU if cuda_only else None,
            )


def _flat(state: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _arguments(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    c.add("args", "framework", ra.get("framework", _MISSING), rb.get("framework", _MISSING))
    aa, ab = _args(ra), _args(rb)
    if ("ultralytics_args" in ra) != ("ultralytics_args" in rb):
        c.notes.append(
            "only one record lists every Ultralytics argument (the other is from an older yolo-det): "
            "arguments are compared where both have them"
        )
        keys = set(aa) & set(ab)
    else:
        keys = set(aa) | set(ab)
    # seed, data and model have their own groups; YOLOv5's --cfg/--weights are its model; Ultralytics' cfg=
    # file only fills in other arguments, which are compared themselves
    for key in sorted(keys - OUTPUT_ARGS - {"seed", "data", "model", "cfg", "weights"}):
        c.add("args", f"{key}=", aa.get(key, _MISSING), ab.get(key, _MISSING))
    for key in sorted(keys & OUTPUT_ARGS):
        c.add(
            "other",
            f"{key}=",
            aa.get(key, _MISSING),
            ab.get(key, _MISSING),
            changes_bits=False,
            note="names or decorates outputs only",
        )


def _environment(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    ea, eb = ra.get("environment") or {}, rb.get("environment") or {}

    def env(
        group: str, key: str, *, name: str | None = None, changes_bits: bool = True, note: str | None = None
    ) -> None:
        a, b = ea.get(key, _MISSING), eb.get(key, _MISSING)
        if _MISSING in (a, b) and a != b:
            note = "not recorded by the older record"
        c.add(group, name or key, a, b, changes_bits=changes_bits and _MISSING not in (a, b), note=note)

    for key in _VERSION_KEYS:
        env("versions", key)
    on_cpu = _trained_on_cpu(ra) and _trained_on_cpu(rb)
    for key in ("gpus", "cuda_available"):
        env("gpu", key, changes_bits=not on_cpu, note="both runs trained on the CPU" if on_cpu else None)
    for key in ("cpu_model", "cpu_capability", "machine", "processor"):
        env("cpu", key)
    for key in ("torch_threads", "torch_interop_threads", "cpu_count"):
        env("threads", key)
    va, vb = ea.get("env") or {}, eb.get("env") or {}
    seed_differs = _canon(_get(ra, "seeds", "seed")) != _canon(_get(rb, "seeds", "seed"))
    for key in sorted(set(va) | set(vb)):
        derived = seed_differs and key == "PYTHONHASHSEED"  # the profile sets it from the seed
        cuda_only = on_cpu and f"env.{key}".startswith(_CUDA_ONLY_FLAGS)
        c.add(
            "env",
            key,
            va.get(key, _MISSING),
            vb.get(key, _MISSING),
            changes_bits=not derived and not cuda_only,
            note="derived from the seed" if derived else _ON_CPU if cuda_only else None,
        )
    env("other", "platform", changes_bits=False, note="the CPU, versions and threads above are what matter")
    env("other", "argv", name="command line", changes_bits=False)


def _swaps_and_warnings(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    def swaps(r: Mapping[str, Any]) -> list[str]:
        return sorted(_canon(s) for s in r.get("swaps") or [])

    c.add("swaps", "layer swaps", [json.loads(s) for s in swaps(ra)], [json.loads(s) for s in swaps(rb)])
    c.add(
        "swaps",
        "routed calls",
        ra.get("routed_calls", _MISSING),
        rb.get("routed_calls", _MISSING),
        changes_bits=False,
        note="a consequence of the profile and model",
    )

    def messages(r: Mapping[str, Any]) -> list[str]:
        return sorted(
            {
                str(w.get("message", w)).splitlines()[0][:200] if isinstance(w, Mapping) else str(w)
                for w in r.get("nondeterminism_warnings") or []
            }
        )

    c.add(
        "warnings",
        "non-determinism warnings",
        messages(ra),
        messages(rb),
        changes_bits=False,
        note="a symptom: a non-deterministic kernel ran",
    )


def _data_stream(c: _Collector, sa: Any, sb: Any) -> None:
    """The reasons of :mod:`yolo_det.tools.data_stream`; an argument they show cannot change the data does not."""
    neutral = {f"{k}=" for k in neutral_args(sa, sb)}
    for d in c.items:
        if d.group == "args" and d.name in neutral:
            d.changes_bits, d.note = False, "the data were worker-invariant in both runs"
    causes = {d.name: d for d in c.items if d.changes_bits}
    stream = explain_data_stream(sa, sb)
    own = [r for r in stream if r.changes_data and r.name != "data stream: first batches"]
    for r in stream:
        changes, note = r.changes_data, r.note
        # a reason another group already names is its consequence, not a second cause
        origin = _stream_origin(r.name, causes)
        if changes and origin is not None:
            changes, note = False, f"follows from {origin}"
        elif changes and r.name == "data stream: first batches":
            left = [x.name.removeprefix("data stream: ") for x in own if _stream_origin(x.name, causes) is None]
            if not left and causes:
                changes, note = False, f"an effect of {', '.join(list(causes)[:3])}"
        c.items.append(Difference("data", r.name, r.a, r.b, changes, note))


def _stream_origin(name: str, causes: Mapping[str, Difference]) -> str | None:
    """The difference listed elsewhere that a data-stream reason restates (the seed, the dataset's bytes, an
    augmentation argument), or None."""
    what = name.removeprefix("data stream: ")
    if what == "seed" and "seed" in causes:
        return "the seed"
    if what == "dataset":
        found = next((n for n, d in causes.items() if d.group == "data"), None)
        return found
    if what.endswith("=") and what in causes:
        return f"the argument {what}"
    return None


# ---------------------------------------------------------------------------------------------------------
# lineage: the parts of a resumed run

#: Arguments a resumed part has by being resumed (never a difference of configuration).
_RESUME_ARGS = frozenset({"resume", "model", "pretrained"})


def _parts(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The parts of a run, oldest first: its ``segments``, then the record itself."""
    segments = record.get("segments")
    return [*(s for s in segments if isinstance(s, Mapping)), record] if isinstance(segments, list) else [record]


def _span(parts: list[Mapping[str, Any]], i: int) -> str:
    start = parts[i - 1].get("epochs_completed") if i else 0
    end = parts[i].get("epochs_completed")
    if isinstance(start, int) and isinstance(end, int) and end > start:
        return f"epochs {start + 1}-{end}"
    return "no epoch checkpointed"


def _effective(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """A resumed run's record as one run: the first part's start (model fingerprint, model=, resume=) with the
    rest of the last part's record."""
    parts = _parts(record)
    if len(parts) == 1:
        return record
    first = parts[0]
    out = dict(record)
    if "model" in first:
        out["model"] = first["model"]
    for key in ("ultralytics_args", "run"):
        args, first_args = record.get(key), first.get(key)
        if isinstance(args, Mapping) and isinstance(first_args, Mapping):
            out[key] = {**args, **{k: first_args[k] for k in _RESUME_ARGS if k in first_args}}
    return out


def _lineage(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    """Each part of a resumed run against the other run: its profile and arguments, and what its resume says."""
    for label, rec, other in (("A", ra, _parts(rb)[-1]), ("B", rb, _parts(ra)[-1])):
        parts = _parts(rec)
        if len(parts) == 1:
            continue
        other_train = _get(other, "profile", "train")
        other_args = _args(other)
        for i, part in enumerate(parts):
            name = f"part {i + 1} of {label} ({_span(parts, i)})"
            train = _get(part, "profile", "train")
            if _canon(train) != _canon(other_train):
                mine, theirs = (_get(part, "profile", "name"), _get(other, "profile", "name"))
                pair = (mine, theirs) if label == "A" else (theirs, mine)
                c.add("profile", f"{name}: trained under the profile", *pair)
            args = _args(part)
            for key in sorted((set(args) & set(other_args)) - OUTPUT_ARGS - _RESUME_ARGS - {"seed", "data", "cfg"}):
                if _canon(args[key]) != _canon(other_args[key]):
                    pair = (args[key], other_args[key]) if label == "A" else (other_args[key], args[key])
                    c.add("args", f"{name}: {key}=", *pair)
        resume = rec.get("resume")
        if isinstance(resume, Mapping) and resume.get("bitwise_expected") is False:
            reasons = resume.get("reasons") or ["the resume state was not used"]
            c.add(
                "args",
                f"resume of {label}: not expected bit for bit",
                "; ".join(map(str, reasons)),
                "",
                note=f"as recorded by run {label}",
            )


def _resumed_after(record: Mapping[str, Any]) -> list[int]:
    return [
        int(p["resume"]["epoch"])
        for p in _parts(record)
        if isinstance(p.get("resume"), Mapping) and isinstance(p["resume"].get("epoch"), int)
    ]


def _progress(record: Mapping[str, Any]) -> str:
    """How far a run that did not complete got: ``terminated after 2 of 4 epochs``."""
    status = record.get("status", _MISSING)
    done, total = record.get("epochs_completed"), _args(record).get("epochs")
    if status == "running":
        status = "running, or killed (its record still says running)"
    if isinstance(done, int):
        of = f" of {total}" if isinstance(total, int) else ""
        return f"{status} after {done}{of} epoch(s) checkpointed"
    return str(status)


def diff_records(record_a: Mapping[str, Any], record_b: Mapping[str, Any], *, a: str = "A", b: str = "B") -> DiffReport:
    """Compare two records (see the module docstring).

    Args:
        record_a, record_b: Parsed ``determinism.json`` contents.
        a, b: Names for the two (their paths), shown in the report.
    """
    c = _Collector()
    full_a, full_b = record_a, record_b
    record_a, record_b = _effective(record_a), _effective(record_b)
    _data(c, record_a, record_b)
    _model(c, record_a, record_b)
    _seeds(c, record_a, record_b)
    _profile(c, record_a, record_b)
    _lineage(c, full_a, full_b)
    _arguments(c, record_a, record_b)
    _environment(c, record_a, record_b)
    _swaps_and_warnings(c, record_a, record_b)
    _data_stream(c, record_a.get("data_stream"), record_b.get("data_stream"))
    order = {g: i for i, g in enumerate(GROUPS)}
    items = sorted(c.items, key=lambda d: order[d.group])  # stable: the order of addition within a group
    report = DiffReport(a=a, b=b, differences=items, notes=c.notes)
    for key, rec in (("a", record_a), ("b", record_b)):
        found = rec.get("weights")
        weights = found if isinstance(found, Mapping) else {}
        report.weights[key] = weights.get("sha256")
        report.ema[key] = weights.get("ema_fp32_sha256")
        report.status[key] = rec.get("status", _MISSING)
        report.warnings[key] = len(rec.get("nondeterminism_warnings") or [])
        report.progress[key] = _progress(rec)
    report.resumed = {k: _resumed_after(r) for k, r in (("a", full_a), ("b", full_b)) if _resumed_after(r)}
    return report


def diff_paths(paths: Sequence[str | Path]) -> DiffReport:
    """Load two records (run folders or files) and compare them."""
    if len(paths) != 2:
        raise ConfigError(f"diff compares two runs, got {len(paths)}")
    (ra, pa), (rb, pb) = load_record(paths[0]), load_record(paths[1])
    return diff_records(ra, rb, a=pa, b=pb)
