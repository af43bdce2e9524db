"""The comparisons topic by topic: data, model, seeds, profile, arguments, environment, swaps and warnings,
and the data stream; each adds what differs to a :class:`~.common._Collector`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...core.datafp import first_file_difference
from ...core.machine import machine_causes, machine_view
from ..data_stream import explain_data_stream, neutral_args
from .common import (
    _MISSING,
    OUTPUT_ARGS,
    _args,
    _canon,
    _Collector,
    _fingerprint,
    _get,
    _sharded,
    _short_hash,
    _trained_on_cpu,
    _why_missing,
)
from .report import Difference

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


def _data(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    fa, fb = _fingerprint(ra, "data"), _fingerprint(rb, "data")
    path_a, path_b = _args(ra).get("data", _MISSING), _args(rb).get("data", _MISSING)
    if fa is None or fb is None:
        for rec, label, fp in ((ra, "A", fa), (rb, "B", fb)):
            if fp is None:
                c.notes.append(_why_missing(rec, "data", label) + ": the data are compared by the data= path only")
        c.add("data", "data= (path; no fingerprint)", path_a, path_b)
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
    c.add("data", "data= (path)", path_a, path_b, changes_bits=False, note="the fingerprint decides")
    if fa.get("sha256") == fb.get("sha256"):
        return
    sa, sb = fa.get("splits") or {}, fb.get("splits") or {}
    renamed, start = False, len(c.items)
    for split in sorted(set(sa) | set(sb), key=lambda s: (s != "train", s)):
        xa, xb = sa.get(split), sb.get(split)
        if xa is None or xb is None:
            c.add("data", f"data: {split} split", "present" if xa else "absent", "present" if xb else "absent")
            continue
        if xa.get("sha256") == xb.get("sha256"):
            continue
        if xa.get("content_sha256") and xa.get("content_sha256") == xb.get("content_sha256"):
            renamed = (
                c.add(
                    "data",
                    f"data: {split} file names",
                    f"{xa.get('images')} images, names {_short_hash(xa.get('list_sha256'))}",
                    f"{xb.get('images')} images, names {_short_hash(xb.get('list_sha256'))}",
                    changes_bits=False,
                    note="the same images and labels, listed another way (a .txt image list, another path:); "
                    "the order they are read in is compared by the data stream",
                )
                or renamed
            )
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
    if any(d.changes_bits for d in c.items[start:]) and (first := first_file_difference(fa, fb)):  # the parts' cause
        c.items.insert(start, Difference("data", f"data: first file that differs: {first[0]}", first[1], first[2]))
    c.add("data", "data: class names", _short_hash(fa.get("names_sha256")), _short_hash(fb.get("names_sha256")))
    if not renamed and not any(d.group == "data" and d.changes_bits for d in c.items):  # a reason not shown above
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
    shards = _sharded(ra, rb)
    for key in _SEED_KEYS[1:]:
        per_rank = key in {"world_size", "rank_rng_seeds"}
        c.add(
            "seed",
            f"seed: {key}",
            _get(ra, "seeds", key),
            _get(rb, "seeds", key),
            changes_bits=not seed_differs and not (shards and per_rank),
            note="derived from the seed"
            if seed_differs
            else f"no effect: both runs train shards: {shards}"
            if shards and per_rank
            else None,
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
            derived = key.endswith("PYTHONHASHSEED") and (
                seed_differs
                or _canon(_get(ra, "environment", "env", "RANK")) != _canon(_get(rb, "environment", "env", "RANK"))
            )
            cuda_only = on_cpu and key.startswith(_CUDA_ONLY_FLAGS)
            c.add(
                "profile",
                f"flag at train start: {key}",
                sa.get(key, _MISSING),
                sb.get(key, _MISSING),
                changes_bits=not derived and not cuda_only,
                note="derived from the seed and the rank" if derived else _ON_CPU if cuda_only else None,
            )


#: The launcher's description of a rank (the world size, compared under "ranks", is what changes the weights).
_LAUNCHER_ENV = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK"})


def _flat(state: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _used(record: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The values Ultralytics used in place of those asked, and why (``adjusted_args``: ``optimizer=auto``'s
    choice, ``workers`` on a CPU)."""
    adjusted = record.get("adjusted_args")
    if not isinstance(adjusted, Mapping):
        return {}
    return {
        k: (v["used"], str(v.get("why", ""))) for k, v in adjusted.items() if isinstance(v, Mapping) and "used" in v
    }


def _arguments(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    c.add("args", "framework", ra.get("framework", _MISSING), rb.get("framework", _MISSING))
    used = {**_used(rb), **_used(ra)}
    # the values the runs trained with
    aa = {**_args(ra), **{k: v for k, (v, _) in _used(ra).items()}}
    ab = {**_args(rb), **{k: v for k, (v, _) in _used(rb).items()}}
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
    ua, ub = _get(ra, "environment", "ultralytics"), _get(rb, "environment", "ultralytics")
    versions_differ = ua != ub and _MISSING not in (ua, ub) and "ultralytics_args" in ra and "ultralytics_args" in rb
    for key in sorted(keys - OUTPUT_ARGS - {"seed", "data", "model", "cfg", "weights"}):
        va, vb = aa.get(key, _MISSING), ab.get(key, _MISSING)
        note = None
        if versions_differ and _MISSING in (va, vb):
            note = f"an argument of Ultralytics {ub if va is _MISSING else ua} only: the Ultralytics versions differ"
        elif key in used:
            note = f"as Ultralytics used it, not as asked (adjusted_args): {used[key][1]}"
        c.add("args", f"{key}=", va, vb, note=note)
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
    for d in c.items:
        if d.group == "versions":
            d.measured = False  # another release: nobody measured what it changes
    on_cpu = _trained_on_cpu(ra) and _trained_on_cpu(rb)
    for key in ("gpus", "cuda_available"):
        env("gpu", key, changes_bits=not on_cpu, note="both runs trained on the CPU" if on_cpu else None)
    for key in ("cpu_model", "cpu_capability", "machine", "processor"):
        env("cpu", key)
    both_hosts = isinstance(ea.get("host"), Mapping) and isinstance(eb.get("host"), Mapping)
    for key in ("torch_threads", "torch_interop_threads"):  # as the record was written; host: as it trained
        env(
            "threads",
            key,
            changes_bits=not both_hosts,
            note="the threads while training decide" if both_hosts else None,
        )
    env(
        "threads",
        "cpu_count",
        changes_bits=not both_hosts,
        note="the threads in use decide, not the core count" if both_hosts else None,
    )
    _machine(c, ea, eb, cuda=not on_cpu)
    va, vb = ea.get("env") or {}, eb.get("env") or {}
    seed_differs = _canon(_get(ra, "seeds", "seed")) != _canon(_get(rb, "seeds", "seed"))
    rank_differs = _canon(va.get("RANK")) != _canon(vb.get("RANK"))
    for key in sorted(set(va) | set(vb)):
        derived = (seed_differs or rank_differs) and key == "PYTHONHASHSEED"  # set from the seed and the rank
        cuda_only = on_cpu and f"env.{key}".startswith(_CUDA_ONLY_FLAGS)
        launcher = key in _LAUNCHER_ENV
        c.add(
            "env",
            key,
            va.get(key, _MISSING),
            vb.get(key, _MISSING),
            changes_bits=not derived and not cuda_only and not launcher,
            note="derived from the seed and the rank"
            if derived
            else _ON_CPU
            if cuda_only
            else "the launcher's: the world size under ranks decides"
            if launcher
            else None,
        )
    env("other", "platform", changes_bits=False, note="the CPU, versions and threads above are what matter")
    env("other", "argv", name="command line", changes_bits=False)


#: Machine causes that an environment line above already names (the cause adds its fix to that line's note).
_SAME_AS = {
    "torch": "torch",
    "Ultralytics": "ultralytics",
    "intra-op threads": "torch_threads",
    "ATen CPU capability": "cpu_capability",
}


def _machine(c: _Collector, ea: Mapping[str, Any], eb: Mapping[str, Any], *, cuda: bool) -> None:
    """The machine causes of :func:`yolo_det.core.machine.machine_causes`, the rule ``check-machine`` uses."""
    causes, _ = machine_causes(machine_view(ea), machine_view(eb), cuda=cuda)
    named = {d.name: d for d in c.items}
    for cause in causes:
        line = named.get(_SAME_AS.get(cause.name, ""))
        if line is not None and line.changes_bits:
            line.note = cause.reason if line.note is None else f"{line.note}; {cause.reason}"
            line.measured = cause.measured
            continue
        if c.add("gpu" if cuda else "cpu", cause.name, cause.a, cause.b, note=cause.reason):
            c.items[-1].measured = cause.measured


def _swaps_and_warnings(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    def swaps(r: Mapping[str, Any]) -> list[str]:
        return sorted(_canon(s) for s in r.get("swaps") or [])

    held = "swaps" in ra and "swaps" in rb
    c.add("swaps", "layer swaps", [json.loads(s) for s in swaps(ra)], [json.loads(s) for s in swaps(rb)], held=held)
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
        held="nondeterminism_warnings" in ra and "nondeterminism_warnings" in rb,
    )


def _data_stream(c: _Collector, sa: Any, sb: Any) -> None:
    """The reasons of :mod:`yolo_det.tools.data_stream`; an argument they show cannot change the data does not."""
    neutral = {f"{k}=" for k in neutral_args(sa, sb)}
    for d in c.items:
        if d.group == "args" and d.name in neutral:
            d.changes_bits, d.note = False, "the data were worker-invariant in both runs"
    causes = {d.name: d for d in c.items if d.changes_bits}
    # the same images and labels under other names: the dataset digest differs by the names alone
    renamed = next((d.name for d in c.items if d.group == "data" and d.name.endswith(" file names")), None)

    def origin_of(name: str) -> str | None:
        found = _stream_origin(name, causes)
        return found if found is not None or name != "data stream: dataset" else renamed

    stream = explain_data_stream(sa, sb)
    own = [r for r in stream if r.changes_data and r.name != "data stream: first batches"]
    for r in stream:
        changes, note = r.changes_data, r.note
        # a reason another group already names is its consequence, not a second cause
        origin = origin_of(r.name)
        if changes and origin is not None:
            changes, note = False, f"follows from {origin}"
        elif changes and r.name == "data stream: first batches":
            left = [x.name.removeprefix("data stream: ") for x in own if origin_of(x.name) is None]
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
