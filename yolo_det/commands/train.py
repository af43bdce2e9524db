"""Train an Ultralytics model under a determinism profile.

Every key=value is an Ultralytics train argument (model=, data=, epochs=, imgsz=, batch=, device=,
seed=, project=, name=, ...), parsed with YAML rules (never eval). Without data= the bundled demo
dataset is used with small defaults (model=yolov8n.yaml epochs=3 imgsz=96 batch=16 device=cpu), so
`yolo-det train --profile repro` trains in well under a minute on a CPU (the demo data is for detection:
other tasks need data=).

Every Ultralytics task trains: detect, segment, pose, obb (data= a dataset YAML) and classify (data= a
folder with train/ and val/ holding one sub-folder per class), each with the trainer of its task.
--import MODULE (repeatable) imports your own blocks first: every nn.Module subclass the module defines is
nameable in the model YAML. Names your process already binds are never replaced.

Before anything is built or written, the values are judged as Ultralytics would judge them: seed= in
[0, 2**32), device= CUDA only where there is one, optimizer= one Ultralytics builds, the model YAML's
module names, the data YAML's train/val images present (yolo-det never downloads a dataset), project= a
writable folder, name= a folder name. lr0=1e-3 is a number, as in Ultralytics' own command line.

model=FILE.pt: the checkpoint's pickle is scanned without unpickling it, and one that names what no
checkpoint needs (builtins.exec, os.system, subprocess, ...) is refused; --trust-checkpoint hands it to
Ultralytics anyway. Ultralytics' own loader then reads it (and honours ULTRALYTICS_SAFE_LOAD=1). A model
YAML is your own model: Ultralytics builds it, evaluating its 'activation:' as it always does.

One line says, as the training starts, the profile, the seed and the layer swaps in force. The run directory
gets determinism.json (profile, seeds, versions, flags, warnings, weights digest); its path and the weights
digest (of the weights' values, not of the file: `yolo-det digest` gives it) are printed at the end. On the
demo data a note says what to expect: a few epochs from scratch detect nothing yet (mAP 0), the loss falls.
However the run ends, the record says how (completed, failed, interrupted, terminated) and lists every weights
file left with its digest.
Exit codes: 0 trained (also when the record could not be written: a warning after the digest), 2 a
bad argument or a run folder in use by another live yolo-det run, 130 interrupted (Ctrl-C, SIGINT),
143 terminated (SIGTERM), 129 terminated (SIGHUP), 1 the training failed (a full disk or a run folder that
became unwritable: one line naming the record, whose status is 'failed'; a weights file cut short is renamed
FILE.incomplete; also when something calls sys.exit() mid-run). A signal stops the training at the next
batch or epoch boundary.

--trace-ops STEPS (7, 3-5, first:2) writes ops-trace-rank0.jsonl (one file per rank) into the run folder:
digests of every module's forward, the backward and the optimizer step of those optimizer steps, which
`yolo-det bisect` compares with another run's. Off by default; it costs time only in the steps traced.

To continue an interrupted run, pass its checkpoint: `resume=True model=RUN/weights/last.pt` (or
`resume=RUN/weights/last.pt`). The checkpoint's own arguments are used (no demo defaults); overrides
that Ultralytics ignores on resume are listed. Under a deterministic profile the continuation is bit for
bit the uninterrupted run (see the README's "Resume" section).

examples:
  yolo-det train --profile repro
  yolo-det train --profile repro resume=runs/detect/train/weights/last.pt
  yolo-det train --profile repro seed=1 project=runs/repro name=a
  yolo-det train --profile balanced model=yolo11n.yaml data=coco8.yaml epochs=100 device=0
  yolo-det train --profile my-profile.yaml model=custom-cbam.yaml data=data.yaml
  yolo-det train --import mypkg.blocks model=my-model.yaml data=data.yaml
  yolo-det train model=yolov8n-cls.yaml data=path/to/images imgsz=64
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import RunFailed
from ..core.record_schema import DIGEST_NOTE
from ..tools.overrides import parse_overrides
from . import add_import_option, add_trust_flag, profile_names, user_inputs


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``train`` arguments."""
    parser.add_argument(
        "--profile",
        default=None,
        metavar="NAME|FILE",
        help=f"built-in profile ({profile_names()}) or a profile YAML file (default: repro; "
        "on resume, the profile the run trained under)",
    )
    add_import_option(parser)
    add_trust_flag(parser)
    parser.add_argument(
        "--trace-ops",
        default=None,
        metavar="STEPS",
        help="trace every op of these optimizer steps (7, 3-5, first:2) into the run folder, for `yolo-det bisect`",
    )
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Ultralytics train arguments")


def train(
    profile: Any,
    args: dict[str, Any],
    modules: list[str] | None = None,
    *,
    warn_record_error: bool = True,
    started: list[Any] | None = None,
    tracer: Any = None,
    banner: bool = False,
    callbacks: Mapping[str, Callable[[Any], None]] | None = None,
) -> Any:
    """Train with Ultralytics under ``profile``; return the plugin (``record_path``, ``weights_digest``,
    ``record_error``).

    ``modules`` (``--import``) are imported first and their classes are nameable in the model YAML.
    ``started`` (a list) gets the plugin as soon as it is attached, so a caller still has it when training raises.
    ``tracer`` (a :class:`yolo_det.tools.trace.OpTracer`) is added to the model's callbacks after the plugin.
    ``banner``: print :func:`start_line` when the training starts (after the layer swaps).
    ``callbacks``: ``{event: function}`` added to the model's callbacks after the plugin's.
    """
    from ultralytics import YOLO

    from ..analysis.blocks import naming_build_errors
    from ..analysis.models import model_names, resolve_model_yaml
    from ..integrations.fonts import ensure_local_font
    from ..integrations.ultralytics import attach

    ensure_local_font()
    train_args = dict(args)
    from ..core.untrusted.safeload import guarded_torch_load

    with model_names(modules), guarded_torch_load():  # the user's blocks build; checkpoints load by the allow-list
        source = train_args.pop("model")
        yaml_path = resolve_model_yaml(source) if str(source).endswith((".yaml", ".yml")) else None
        with naming_build_errors(yaml_path):  # a layer that does not build is one line naming it
            model = YOLO(source)
        plugin = attach(model, profile)
        plugin.warn_record_error = warn_record_error
        if tracer is not None:
            tracer.add_to(model)
        if banner:
            model.add_callback("on_train_start", lambda trainer: _print_start_line(plugin))
        for event, fn in (callbacks or {}).items():
            model.add_callback(event, fn)
        if started is not None:
            started.append(plugin)
        model.train(**train_args)
    return plugin


def start_line(session: Any) -> str:
    """One line saying what a training runs under: the profile (and where it comes from), the seed, the layer
    swaps in force and the intra-op threads when the profile pins them."""
    profile = session.profile
    source = "built-in" if profile.source.startswith("builtin:") else f"file {profile.source or '(in memory)'}"
    swaps = session.swaps()
    policy = profile.train.swaps
    if policy == "none":
        swapped = "no layer swaps (swaps: none)"
    elif not swaps:
        swapped = f"swaps: {policy}, no layer needed one"
    else:
        kinds: dict[str, int] = {}
        for s in swaps:
            key = f"{s['source'].rsplit('.', 1)[-1]} -> {s['target'].rsplit('.', 1)[-1]}"
            kinds[key] = kinds.get(key, 0) + 1
        listed = ", ".join(f"{k}" + (f" x{n}" if n > 1 else "") for k, n in kinds.items())
        swapped = f"swaps: {policy}, {len(swaps)} layer{'s' if len(swaps) != 1 else ''} swapped ({listed})"
    threads = profile.train.extra.get("intra_op_threads")
    pinned = f", {threads} intra-op thread{'s' if threads != 1 else ''}" if threads is not None else ""
    seed = session.seeds()["seed"]
    return f"yolo-det: training under profile '{profile.name}' ({source}), seed {seed}, {swapped}{pinned}"


def demo_note(ul_args: dict[str, Any], run_dir: Path, profile: Any) -> str:
    """What to expect of a training on the bundled demo data: no detection yet (every mAP 0), a falling loss, and
    (under a profile whose training is deterministic) the same weights digest on every repeat."""
    from ..tools.demo import N_TRAIN

    fell = ""
    try:  # Ultralytics' per-epoch table: the training loss, summed over its components
        lines = (run_dir / "results.csv").read_text(encoding="utf-8").splitlines()
        head = [h.strip() for h in lines[0].split(",")]
        cols = [i for i, h in enumerate(head) if h.startswith("train/") and h.endswith("_loss")]
        losses = [sum(float(line.split(",")[i]) for i in cols) for line in lines[1:] if line.strip()]
        if cols and len(losses) >= 2:
            fell = f"; its training loss went from {losses[0]:.2f} to {losses[-1]:.2f}"
    except (OSError, ValueError, IndexError):
        pass
    epochs = ul_args.get("epochs")
    fraction = ul_args.get("fraction")
    images = round(N_TRAIN * fraction) if isinstance(fraction, (int, float)) and 0 < fraction < 1 else N_TRAIN
    return (
        f"note: this was the demo: {ul_args.get('model')} from scratch, {epochs} epoch{'s' if epochs != 1 else ''} "
        f"on {images} images of {ul_args.get('imgsz')} px, far too short to detect anything, so mAP 0 in every "
        f"row is expected{fell}. "
        + (
            "What it shows is repeatability: run it again and the weights digest is the same. "
            if profile.train.deterministic
            else f"Profile '{profile.name}' does not make training repeatable: its weights digest may change. "
        )
        + "For a model that detects, pass your data (data=) and more epochs."
    )


def _print_start_line(plugin: Any) -> None:
    from ..core.constants import global_rank

    if plugin.session is not None and global_rank(-1) in (-1, 0):
        print(start_line(plugin.session), flush=True)


def _resumed_profile(ul_args: dict[str, Any]) -> Any:
    """On resume without --profile: the built-in profile the run's record names (None: not a resume, or none; a
    record's word never opens a profile file)."""
    from ..core.profiles import BUILTIN_PROFILES, load_profile
    from ..core.resume import is_resume
    from ..core.resume.lineage import previous_record

    if not is_resume(ul_args):
        return None
    record = previous_record(str(ul_args["model"]))
    source = ((record or {}).get("profile") or {}).get("source")
    name = source.split(":", 1)[1] if isinstance(source, str) and source.startswith("builtin:") else None
    return load_profile(name) if name in BUILTIN_PROFILES else None


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det train``."""
    from ..core.profiles import load_profile

    given = parse_overrides(list(args.overrides))  # what needs no torch is checked before torch starts
    load_profile(args.profile or "repro")
    from ..analysis.names import checkpoint_imports
    from ..core.resume import is_resume
    from ..tools.prepare import prepare

    tracer = None
    if args.trace_ops is not None:  # a bad STEPS fails before any work
        from ..tools.trace import OpTracer

        tracer = OpTracer(args.trace_ops)

    with user_inputs(args):  # import first: a bad module fails before any work
        # a checkpoint's run imported modules: the user imports them (--import), or one line names what to add;
        # before the gate, which allows a checkpoint's classes of the modules imported, and before anything is written
        ckpt = next(
            (
                v
                for v in (given.get("resume"), given.get("model"))
                if isinstance(v, str) and v.endswith(".pt") and Path(v).is_file()
            ),
            None,
        )
        checkpoint_imports(ckpt, given=args.imports)
        started: list[Any] = []
        profile, ul_args = prepare(args.profile or "repro", list(args.overrides))
        demo = given.get("data") is None and not is_resume(ul_args)
        if args.profile is None:
            profile = _resumed_profile(ul_args) or profile
        try:
            plugin = train(profile, ul_args, warn_record_error=False, started=started, tracer=tracer, banner=True)
        except OSError as e:  # the surroundings failed (disk full, read-only folder): one line, exit 1
            raise RunFailed(_failure(e, started[0] if started else None)) from None
        except SystemExit as e:  # a user's block (or anything) called sys.exit() mid-run: never a success
            raise RunFailed(
                f"training stopped: sys.exit({'' if e.code is None else e.code}) was called during "
                "the run; nothing was trained to the end"
            ) from None
    if plugin.record_error is None and plugin.record_path is not None:
        print(f"determinism record: {plugin.record_path}")
    if plugin.weights_digest is not None:
        print(f"weights digest: {plugin.weights_digest} ({DIGEST_NOTE})")
    from ..integrations.identity import ADJUSTED_BY_ULTRALYTICS

    for key, change in plugin.adjusted.items():  # Ultralytics changed it without a word (it logs optimizer=auto)
        if key in ADJUSTED_BY_ULTRALYTICS:
            print(f"note: {key}={change['asked']} ran as {key}={change['used']}: {change['why']}")
    if demo and plugin.record_path is not None:
        print(demo_note(ul_args, Path(plugin.record_path).parent, profile))
    if tracer is not None and tracer.written is not None:
        print(f"op trace: {tracer.written}")
    if tracer is not None and tracer.shortfall() is not None:  # steps asked for that the run never reached
        print(f"yolo-det: warning: {tracer.shortfall()}", file=sys.stderr)
    if plugin.record_error is not None:  # the training succeeded: a warning, exit code 0
        print(f"yolo-det: warning: {plugin.record_error}", file=sys.stderr)
    return 0


def _failure(error: OSError, plugin: Any) -> str:
    """The line for a run that stopped on an ``OSError``: what failed, and where its record is or why there is none."""
    what = f"training stopped: {type(error).__name__}: {' '.join(str(error).split())}"
    if plugin is None:
        return what
    if plugin.record_error is not None:
        return f"{what}; {plugin.record_error}"
    if plugin.record_path is not None:
        return f"{what}; the run's record (status 'failed'): {plugin.record_path}"
    return what
