"""Train a recorded run again here and say, epoch by epoch, whether the weights are the same.

SOURCE is a run folder (holding determinism.json), a determinism.json file, a file written by
`yolo-det verify --save`, or a checkpoint of a run (RUN/weights/last.pt, epochN.pt) beside its record.
The command is rebuilt from the record: its built-in profile (or --profile), every training argument it ran
with (as asked: what optimizer=auto chose is chosen again), its seed; the model, data and arguments pass
the same gate as `yolo-det train`'s. The record only names files: nothing it names is opened unchecked, no
profile file is read on its word (pass --profile FILE), and a module its model needs is imported only with
--import (one line names it). Output goes to a new folder (--project/--name, as `train`'s project=/name=; default:
Ultralytics' runs folder and the run's name, numbered when it exists), never into SOURCE's.

In order it prints: what this machine predicts (`yolo-det check-machine`'s rule: threads, instruction-set
branches, versions, GPU), the data (the recorded content digest against the data here: the first file that differs,
by its path under the dataset root, from the record's file table; a record without one names the split and part),
then the weights digest after each epoch against the record's (`epoch_weights`; a record without them compares its
final digest only), and one verdict:

  same weights                  every epoch compared was bitwise the same              exit 0
  parted at epoch K: CAUSES     the first epoch whose weights differ, with the          exit 1
                                causes `yolo-det diff` names (and the first op that
                                differs, `yolo-det bisect`'s, when the run was traced)
  cannot be the same here: ...  the weights parted and only machine causes differ       exit 1
                                (threads, CPU, GPU, versions), or the run needs a
                                device this machine lacks (nothing trained: exit 3)
  nothing compared              no recorded digest for an epoch trained                 exit 3

Exit 2: an unusable SOURCE (not a record, malformed, a refused file, a profile file or module needed).
A run traced with --trace-ops (its record's `op_trace`, its trace beside it) is traced again on the same steps.
The training stops at the first epoch that parts; --epochs N trains the run's schedule (the same learning
rate and mosaic epochs) but stops after epoch N, so a long run is checked in minutes. With --png FILE, a
picture of both runs' loss and metric curves per epoch (their results.csv), the epoch they parted at marked.

examples:
  yolo-det reproduce runs/detect/train
  yolo-det reproduce colleague/determinism.json --data datasets/my.yaml --epochs 1
  yolo-det reproduce runs/detect/train/weights/epoch3.pt --import mypkg.blocks
  yolo-det reproduce runs/detect/train --png curves.png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.fileio import check_output_path
from ..core.text import printable
from . import add_import_option, add_trust_flag

#: The verdicts and their exit codes.
SAME, PARTED, CANNOT, NOTHING = "same weights", "parted at epoch", "cannot be the same here", "nothing compared"
#: Arguments the rebuilt command never takes from a record: where it writes (the new folder decides), what yolo-det
#: decides itself, a cfg file (its values are among the recorded ones) and resuming.
_NOT_TAKEN = frozenset({"project", "name", "save_dir", "exist_ok", "deterministic", "mode", "cfg", "resume"})
#: Diff groups whose causes are the machine's, not the command's.
_MACHINE_GROUPS = frozenset({"versions", "gpu", "cpu", "threads"})


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``reproduce`` arguments."""
    parser.add_argument(
        "source", metavar="SOURCE", help="run folder, determinism.json, verify --save file, or a run's checkpoint"
    )
    parser.add_argument("--epochs", type=int, default=None, metavar="N", help="check only the first N epochs")
    parser.add_argument(
        "--profile", default=None, metavar="NAME|FILE", help="the run's profile (default: its built-in one)"
    )
    parser.add_argument("--data", default=None, metavar="PATH", help="the run's dataset here (its digest decides)")
    parser.add_argument("--model", default=None, metavar="PATH", help="the run's model here (its digest decides)")
    parser.add_argument("--project", default=None, help="where the new run folder goes (default: Ultralytics')")
    parser.add_argument("--name", default=None, help="the new run folder's name (default: the run's)")
    parser.add_argument("--verbose", action="store_true", help="show Ultralytics' training log (on stderr)")
    parser.add_argument(
        "--png", metavar="FILE", help="write both runs' loss and metric curves per epoch, the parting epoch marked"
    )
    add_import_option(parser)
    add_trust_flag(parser)


def recorded_epochs(record: Mapping[str, Any]) -> dict[int, str]:
    """``{epoch: weights digest}`` the record holds: ``epoch_weights`` of every part, else the final digest at the
    epochs completed."""
    out: dict[int, str] = {}
    for part in [*(record.get("segments") or []), record]:
        for entry in part.get("epoch_weights") or [] if isinstance(part, Mapping) else []:
            epoch, digest = (entry.get("epoch"), entry.get("sha256")) if isinstance(entry, Mapping) else (None, None)
            if isinstance(epoch, int) and not isinstance(epoch, bool) and isinstance(digest, str):
                out[epoch] = digest
    final, done = (record.get("weights") or {}).get("sha256"), record.get("epochs_completed")
    if isinstance(final, str) and isinstance(done, int) and done >= 1:
        out.setdefault(done, final)
    return out


def _token(key: str, value: Any) -> str:
    """``key=value`` as ``yolo-det train`` parses it (JSON scalars and lists are YAML)."""
    return f"{key}={json.dumps(value)}"


def rebuilt_tokens(record: Mapping[str, Any], *, data: str | None, model: str | None) -> tuple[list[str], list[str]]:
    """The ``key=value`` tokens of the run's command (those that differ from this Ultralytics' defaults), and the
    recorded arguments this Ultralytics does not know (dropped)."""
    from ..core.compat import DEFAULT_CFG_DICT

    recorded = record.get("ultralytics_args")
    if not isinstance(recorded, Mapping):
        recorded = record.get("run")
    if not isinstance(recorded, Mapping) or not recorded.get("model"):
        raise ConfigError("the record lists no training arguments (model=, data=, ...): nothing to rebuild")
    adjusted = record.get("adjusted_args")
    asked = {
        k: v["asked"]
        for k, v in (adjusted.items() if isinstance(adjusted, Mapping) else [])
        if isinstance(v, Mapping) and "asked" in v
    }
    values = {**recorded, **asked, **({"data": data} if data else {}), **({"model": model} if model else {})}
    unknown = sorted(k for k in values if k not in DEFAULT_CFG_DICT and k not in _NOT_TAKEN)
    tokens = [
        _token(k, v)
        for k, v in sorted(values.items())
        if k in DEFAULT_CFG_DICT and k not in _NOT_TAKEN and v != DEFAULT_CFG_DICT[k]
    ]
    return tokens, unknown


def _profile(record: Mapping[str, Any], given: str | None) -> Any:
    """The profile to train under: ``given``, else the record's built-in one (never a file the record names)."""
    from ..core.machine_settings import missing_env
    from ..core.profiles import BUILTIN_PROFILES, load_profile

    recorded = record.get("profile") or {}
    name = recorded.get("name")
    if given is not None:
        profile = load_profile(given)
    elif name in BUILTIN_PROFILES and recorded.get("source") == f"builtin:{name}":
        profile = load_profile(name)
    else:
        raise ConfigError(
            f"the run trained under the profile {printable(str(name)[:80], newlines=False)!r}, not a built-in one, "
            "and yolo-det opens no file on a record's word: pass --profile FILE with that profile"
        )
    isa = profile.train.extra.get("cpu_isa")
    if isa is not None and missing_env(isa):
        raise ConfigError(f"profile '{profile.name}' sets the CPU branches before torch starts: pass --profile {name}")
    return profile


def _data_line(record: Mapping[str, Any], trainer: Any) -> str:
    """One line: the data here against the recorded content digest (``diff``'s data comparison: the first file
    that differs, when the record holds its file table)."""
    from ..integrations.identity import trainer_data_fingerprint
    from ..integrations.trainer_state import state_of
    from ..tools.diff import diff_records

    recorded, found = record.get("data"), (state_of(trainer).identity or {}).get("data")
    if not isinstance(recorded, Mapping) or not isinstance(found, Mapping):
        return "data: not compared (a record without a data fingerprint; the weights decide)"
    if recorded.get("sha256") == found.get("sha256"):
        return f"data: the same (content digest {str(found.get('sha256'))[:16]})"
    group = recorded.get("files_group")
    if isinstance(group, int) and group >= 1 and group != found.get("files_group"):  # tables compare when alike
        found = trainer_data_fingerprint(trainer, files_group=group)
    report = diff_records(record, {**record, "data": dict(found)}, a="recorded", b="here")
    first = next((d for d in report.causes if d.group == "data"), None)
    what = first.brief().removeprefix("data: ") if first is not None else "the data fingerprint"
    return f"data: DIFFERENT: {what}" + ("" if "files" in recorded else " (the record names no file: an older one)")


class _Stop(Exception):
    """Raised at the end of the epoch after which the reproduction stops."""


def _read(args: argparse.Namespace) -> tuple[dict[str, Any], str, dict[int, str]]:
    """The record of SOURCE, where it was read, and the digests to compare (``{epoch: digest}``); a checkpoint
    (read by the allow-list reader, never unpickled) limits them to its epoch."""
    from ..analysis.names import recorded_imports
    from ..core.record import checkpoint_digest
    from ..tools.diff import load_record

    source = Path(args.source).expanduser()
    checkpoint = source if source.suffix in {".pt", ".pth"} else None
    record, where = load_record(source.resolve().parent.parent if checkpoint is not None else source)
    if record.get("framework", "ultralytics") != "ultralytics":
        framework = printable(str(record.get("framework"))[:40], newlines=False)
        raise ConfigError(f"'{where}' is a {framework} run; reproduce trains Ultralytics runs")
    expected = recorded_epochs(record)
    if checkpoint is not None:
        digest = checkpoint_digest(checkpoint)
        epoch = next((e for e, d in sorted(expected.items()) if d == digest), None)
        if epoch is None:
            raise ConfigError(f"'{checkpoint}' holds weights its run's record ({where}) does not list for any epoch")
        expected = {e: d for e, d in expected.items() if e <= epoch}
    recorded_imports(record.get("imports"), f"the run '{where}'", given=args.imports)
    seeds = record.get("seeds") or {}
    world = seeds.get("world_size") if isinstance(seeds, Mapping) else None
    shards = ((record.get("profile") or {}).get("train") or {}).get("shards")
    if isinstance(world, int) and world > 1 and not shards:
        raise ConfigError(
            f"the run trained on {world} ranks without shards, so its weights need {world} ranks; reproduce trains "
            "in one process (a profile with shards makes the weights independent of the world size)"
        )
    return record, where, expected


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det reproduce``: 0 same weights, 1 parted (or cannot be the same here), 3 nothing compared."""
    from ..analysis.gate import allow_downloads
    from ..analysis.models import model_names
    from ..core.quiet import quiet_ultralytics
    from ..core.untrusted.container import trusted_checkpoints
    from ..integrations.trainer_state import state_of
    from ..tools.machine_check import check_machine
    from ..tools.prechecks.run_folder import run_dir
    from ..tools.prepare import prepare
    from .train import train

    png = check_output_path(args.png, suffix=".png", what="--png")
    record, where, expected = _read(args)
    profile = _profile(record, args.profile)
    tokens, unknown = rebuilt_tokens(record, data=args.data, model=args.model)
    origin = Path(where).resolve().parent
    with (
        model_names(args.imports),
        trusted_checkpoints(args.trust_checkpoint),
        allow_downloads(args.allow_download),
    ):
        out = [_token("name", args.name or origin.name), *([_token("project", args.project)] if args.project else [])]
        profile, ul_args = prepare(profile, [*tokens, *out])  # the gate `yolo-det train` passes
        new_dir = run_dir(ul_args, ul_args.get("task")).resolve()
        if new_dir == origin or origin in new_dir.parents:
            raise ConfigError(f"the new run folder '{new_dir}' is inside the run reproduced; pick another --project")
        total = int(ul_args.get("epochs") or 0)
        if args.epochs is not None and not 1 <= args.epochs <= total:
            raise ConfigError(f"--epochs must be between 1 and the run's {total} epochs, got {args.epochs}")
        if not expected:
            print(f"verdict: {NOTHING}: the record holds no weights digest (a run that never finished an epoch)")
            return 3
        last = min(args.epochs or total, max(expected))  # no epoch past the last digest held is trained
        print(
            printable(
                f"reproducing {where}: yolo-det train --profile {profile.name} {' '.join(tokens)}", newlines=False
            )
        )
        if unknown:  # names from the record: escaped, so none starts a line of its own
            print(printable(f"note: not arguments of this Ultralytics, left out: {', '.join(unknown)}", newlines=False))
        trace, tracer = _source_trace(record, where)  # a traced run is traced again the same way
        machine = check_machine(record, profile)
        *lines, verdict = machine.summary().splitlines()
        print(f"machine: {verdict}")  # check-machine's prediction first, then its causes
        for line in lines:
            print(line)
        if any(c.name == "device" for c in machine.causes):
            print(f"verdict: {CANNOT}: the run trained on a device this machine lacks; nothing trained")
            return 3
        got: dict[int, str] = {}
        seen: set[int] = set()

        def on_train_start(trainer: Any) -> None:
            print(printable(_data_line(record, trainer), newlines=False))

        def on_fit_epoch_end(trainer: Any) -> None:
            epoch = int(trainer.epoch) + 1
            if epoch > total or epoch in seen:  # Ultralytics' final evaluation ends with this event too
                return
            seen.add(epoch)
            got.update(state_of(trainer).epoch_weights)
            mark = "" if epoch not in expected else " (same)" if got.get(epoch) == expected[epoch] else " (DIFFERENT)"
            print(f"epoch {epoch}: weights {str(got.get(epoch, 'not checkpointed'))[:16]}{mark}", flush=True)
            parted = epoch in expected and got.get(epoch) != expected[epoch]
            if (parted or epoch >= last) and epoch < total:
                state_of(trainer).stopped_on_purpose = True  # recorded as interrupted, not failed
                raise _Stop

        started: list[Any] = []
        with quiet_ultralytics(args.verbose):
            try:
                train(
                    profile,
                    ul_args,
                    started=started,
                    tracer=tracer,
                    callbacks=_callbacks(on_train_start, on_fit_epoch_end),
                )
            except _Stop:
                pass
    if started[0].record_path:
        new_dir = Path(started[0].record_path).parent
    print(f"new run: {new_dir}")
    got = {e: d for e, d in got.items() if e <= last}
    code = _verdict(record, origin, new_dir, got, expected, trace=trace)
    if png is not None:
        from ..tools.curves import write_curves_png  # matplotlib only when a picture is asked for

        for line in write_curves_png(origin, new_dir, png, parted_epoch=_parted_at(got, expected)):
            print(f"yolo-det: {line}", file=sys.stderr)
        print(f"curves written to {png}")
    return code


def _parted_at(got: Mapping[int, str], expected: Mapping[int, str]) -> int | None:
    """The first epoch both hold a digest of whose digests differ (None: none)."""
    return next((e for e in sorted(got) if e in expected and got[e] != expected[e]), None)


def _source_trace(record: Mapping[str, Any], where: str) -> tuple[Path | None, Any]:
    """The op trace of the run reproduced and a tracer of the same steps for the new run, when its record says it
    was traced (``op_trace``) and the trace is beside it; else ``(None, None)``."""
    from ..tools.trace import OpTracer
    from ..tools.trace.bisect import resolve_trace

    if "op_trace" not in record:
        return None, None
    tracer = OpTracer(record["op_trace"].get("asked", ""))  # a request it cannot read fails before any training
    try:
        found: Path | None = resolve_trace(where)
    except ConfigError:
        found = None
    if found is None or found.suffix != ".jsonl" or not found.is_file():
        print(printable(f"note: the run was traced (--trace-ops); its op trace is not beside {where}", newlines=False))
        return None, None
    return found, tracer


def _first_op(trace: Path, new_dir: Path) -> str:
    """Where two traced runs part, by ``yolo-det bisect``'s comparison: the first op whose output differs."""
    from ..core.errors import YoloDetError
    from ..tools.trace.bisect import bisect_paths

    try:
        report = bisect_paths(trace, new_dir)
    except YoloDetError as e:
        return f"first op not named ({e})"
    p = report.parting
    if p is None:
        return f"the {report.steps_compared} traced step(s) agree, the runs part after them"
    return f"first op: {p.op or 'the step'} ({p.phase}, step {p.step})"


def _verdict(
    record: Mapping[str, Any],
    origin: Path,
    new_dir: Path,
    got: Mapping[int, str],
    expected: Mapping[int, str],
    *,
    trace: Path | None = None,
) -> int:
    """Print the verdict on the digests of the epochs trained (``got``) against the record's, with the first op
    that differs when the run was traced (``trace``, the source's); return the exit code."""
    from ..tools.diff import diff_records, load_record

    compared = sorted(e for e in got if e in expected)
    parted_at = _parted_at(got, expected)
    if parted_at is None:
        if not compared:
            held = ", ".join(map(str, sorted(expected)))
            print(f"verdict: {NOTHING}: the record holds digests of epoch(s) {held}, none of an epoch trained")
            return 3
        print(f"verdict: {SAME} ({len(compared)} epoch(s) compared: {compared[0]}-{compared[-1]})")
        return 0
    new_record, _ = load_record(new_dir)
    causes = diff_records(record, new_record, a="recorded", b="here").causes  # diff's causes, most likely first
    # Known to change the bits first: a version pair nobody measured and the project's own code (a reviewer's
    # folder is rarely the author's; the rebuilt command imports only the modules the record names) come last.
    strong = [d for d in causes if d.measured and d.group != "code"]
    weak = [d for d in causes if d not in strong]
    named = "; ".join(d.brief() for d in [*strong, *weak][:3]) or (
        "no difference in the records: non-determinism the profile does not cover"
    )
    if len(causes) > 3:
        named += f" (+{len(causes) - 3} more: yolo-det diff {origin} {new_dir})"
    if trace is not None:
        named += f"; {_first_op(trace, new_dir)}"
    if strong and all(d.group in _MACHINE_GROUPS for d in strong):
        print(printable(f"verdict: {CANNOT}: {named} (parted at epoch {parted_at})", newlines=False))
    else:
        print(printable(f"verdict: {PARTED} {parted_at}: {named}", newlines=False))
    return 1


def _callbacks(*fns: Any) -> dict[str, Any]:
    return {fn.__name__: fn for fn in fns}


__all__ = ["CANNOT", "NOTHING", "PARTED", "SAME", "configure", "rebuilt_tokens", "recorded_epochs", "run"]
