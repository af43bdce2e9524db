"""The ``yolo-det`` command line.

``main(argv) -> int`` runs in process (tests call it directly). A known error (bad profile, bad ``key=value``,
missing file, ...) prints one line on stderr and returns 2; set ``YOLO_DET_DEBUG=1`` to see the traceback
instead. Every command but ``train`` uses 1 for a verdict ("they differ"): an unforeseen error ending one of
them is one line and 2 as well, never 1. Ctrl-C (SIGINT) prints one line and returns 130; SIGTERM and SIGHUP,
handled like Ctrl-C while a command runs, print one line and return 143 and 129. A training stops at the next
batch or epoch boundary, anything else at once (:mod:`yolo_det.core.signals`). Each command is a module of
:mod:`yolo_det.commands` with a ``configure(parser)`` and a ``run(args) -> int``; this module only dispatches,
and imports a command's module only when that command runs (``--help``, ``--version`` and ``profiles`` start
without torch).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
import traceback
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from .core.errors import ConfigError, YoloDetError

__all__ = ["main"]

# command -> (module, one-line help). The module defines configure(parser) and run(args) -> int.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("yolo_det.commands.train", "train an Ultralytics model under a determinism profile"),
    "profiles": ("yolo_det.commands.profiles", "list the built-in profiles, or show one resolved"),
    "digest": ("yolo_det.commands.digest", "print the weights digest of checkpoints"),
    "audit": ("yolo_det.commands.audit", "name the layers that break strict determinism on CUDA (no GPU needed)"),
    "rewrite": ("yolo_det.commands.rewrite", "swap a model YAML's non-deterministic layers for deterministic ones"),
    "verify": ("yolo_det.commands.verify", "train several times and check the runs are bitwise identical"),
    "diff": ("yolo_det.commands.diff", "compare two runs' records and say why their weights differ"),
    "bisect": ("yolo_det.commands.bisect", "find the first op where two traced runs part (--trace-ops)"),
    "check-deploy": (
        "yolo_det.commands.check_deploy",
        "check that detections do not depend on the batch; compare export records",
    ),
    "check-machine": (
        "yolo_det.commands.check_machine",
        "say whether this machine will reproduce a run's weights, and what to set when not",
    ),
    "reproduce": (
        "yolo_det.commands.reproduce",
        "train a recorded run again here and say, epoch by epoch, whether the weights are the same",
    ),
    "bench": ("yolo_det.commands.bench", "measure what each profile costs: step time, throughput, peak memory"),
    "patch-yolov5": ("yolo_det.commands.patch_yolov5", "patch a YOLOv5 clone so train.py takes --det-profile"),
}

EPILOG = """\
examples:
  yolo-det train --profile repro                       # train on the bundled demo data (CPU, < 1 min)
  yolo-det train --profile balanced model=yolo11n.yaml data=my.yaml epochs=50 device=0
  yolo-det profiles                                    # list profiles
  yolo-det profiles show repro                         # resolved settings per phase
  yolo-det digest runs/detect/train/weights/last.pt   # weights digest
  yolo-det verify --profile repro --steps 5            # train twice, compare step by step
  yolo-det diff runs/detect/train runs/detect/train2  # why do two runs differ?
  yolo-det bench --profiles repro,balanced,fast        # what each profile costs here

two runs differ? which command:
  yolo-det diff RUN_A RUN_B          first: compares the two records and names the setting, data, version or
                                     machine difference that explains the split (no training, under a second)
  yolo-det check-machine RUN         before training elsewhere: will this machine give RUN's weights, and if
                                     not, what to set
  yolo-det reproduce RUN             trains a recorded run again here (its command rebuilt from the record) and
                                     compares the weights after each epoch: same, the epoch it parts and why
  yolo-det verify --against FILE     trains here and compares step by step with a run saved elsewhere
                                     (verify --save FILE there): the first step and tensor that part
  yolo-det bisect RUN_A RUN_B        the first op where two runs part (both trained with --trace-ops STEPS;
                                     --replay CHECKPOINT for a run that was not traced)

Set YOLO_DET_DEBUG=1 to see tracebacks.
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and raise instead of exiting; no abbreviations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser; the sub-parsers of ``commands`` (default: all) are fully configured.

    The other commands are listed with their one-line help only, so their modules are not imported.
    """
    from . import __version__

    parser = _Parser(
        prog="yolo-det",
        description="Reproducible YOLO training: determinism profiles per phase, layer audits and swaps, "
        "run verification and benchmarks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"yolo-det {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = set(COMMANDS if commands is None else commands)
    for name, (module, help_text) in COMMANDS.items():
        if name not in wanted:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        mod = importlib.import_module(module)
        doc = textwrap.dedent(mod.__doc__ or help_text)
        p = sub.add_parser(name, help=help_text, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``yolo-det`` command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    The process is given back as it was: the environment whole (what Ultralytics' ``YOLO()`` and the command set
    is removed or put back), and, when torch was imported before, its determinism flags and thread count.
    """
    with _process_kept():
        return _main(argv)


@contextmanager
def _process_kept() -> Iterator[None]:
    """Put back, when the block ends, the environment and (torch imported before) torch's state it began with."""
    env = dict(os.environ)
    state = None
    if "torch" in sys.modules:  # never imported for this: --help and argument errors start without torch
        from .core.state import snapshot

        state = snapshot()
    try:
        yield
    finally:
        if state is not None:
            from .core.state import restore

            restore(state)
        for key in [k for k in os.environ if k not in env]:
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def _main(argv: Sequence[str] | None) -> int:
    debug = False
    try:
        debug = os.environ.get("YOLO_DET_DEBUG", "") not in {"", "0", "false", "False"}
        from .core.signals import safe_point, stop_signals

        with stop_signals():  # SIGINT, SIGTERM, SIGHUP: clean-up, record, exit 130, 143, 129
            safe_point("cli-start")
            tokens = list(sys.argv[1:] if argv is None else argv)
            from .core.launcher import check_launcher_env

            check_launcher_env()  # before Ultralytics reads RANK, LOCAL_RANK and WORLD_SIZE at import
            from .commands.prestart import prepare  # before anything imports torch

            prepare(next(iter(_command_of(tokens)), None), tokens, reexec=argv is None)
            parser = build_parser(_command_of(tokens))
            args, extra = parser.parse_known_args(tokens)
            _take_extra(args, extra)
            safe_point("cli-parsed")
            if getattr(args, "_run", None) is None:
                parser.print_help()
                return 2
            code = _run_command(args)
            safe_point("cli-end")
            return code
    except YoloDetError as e:
        if debug:
            traceback.print_exc()
        print(f"yolo-det: error: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP while a command runs (core.signals.Terminated)
        from .core.signals import Terminated, exit_code

        what = f"terminated ({e.signal_name})" if isinstance(e, Terminated) else "interrupted"
        print(f"yolo-det: {what}", file=sys.stderr)
        return exit_code(e)


#: The command whose exit code 1 means "the training failed"; every other command's 1 is a verdict ("they differ",
#: "diverged", "found", "would change").
_TRAINING = "train"


def _run_command(args: argparse.Namespace) -> int:
    """Run the parsed command and return its exit code.

    Outside ``train``, exit 1 is a verdict, so what ends a command unforeseen (an exception that is no
    :class:`YoloDetError`, a ``sys.exit()`` from a user's module, a failed run) is one line and exit 2, "unusable
    input": a script never reads a crash as a difference.
    """
    if args.command == _TRAINING:
        return int(args._run(args) or 0)
    try:
        return int(args._run(args) or 0)
    except YoloDetError as e:
        if e.exit_code == 1:
            raise YoloDetError(f"{args.command} stopped: {e}; no verdict was reached") from e
        raise
    except (Exception, SystemExit) as e:
        what = f"sys.exit({'' if e.code is None else e.code})" if isinstance(e, SystemExit) else type(e).__name__
        detail = "" if isinstance(e, SystemExit) else f": {e}"
        raise YoloDetError(
            f"{args.command} stopped on an unexpected error ({what}{detail}); no verdict was reached "
            "(YOLO_DET_DEBUG=1 shows the traceback)"
        ) from e


def _take_extra(args: argparse.Namespace, extra: list[str]) -> None:
    """``key=value`` tokens after an option (``train epochs=1 --import m model=x.yaml``) are overrides like the
    others; anything else left over is an unknown argument."""
    if not extra:
        return
    overrides = getattr(args, "overrides", None)
    if isinstance(overrides, list) and not any(t.startswith("-") for t in extra):
        overrides.extend(extra)
        return
    command = f"yolo-det {args.command}" if getattr(args, "command", None) else "yolo-det"
    raise ConfigError(f"{command}: unrecognized arguments: {' '.join(extra)} (see '{command} --help')")


def _command_of(tokens: Sequence[str]) -> list[str]:
    """The command named in ``tokens`` (the first token that is not an option), as a list of zero or one."""
    for token in tokens:
        if not token.startswith("-"):
            return [token] if token in COMMANDS else []
    return []


_MAX_MESSAGE = 2000


def _one_line(e: BaseException) -> str:
    from .core.text import printable

    text = " ".join(str(e).split())
    # a value from a file is never shown whole, nor able to act on the terminal
    return printable(text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + " ...", newlines=False)


def run_cli() -> NoReturn:
    """Console-script entry point."""
    code = main()
    _leave_to_the_os()
    raise SystemExit(code)


def _leave_to_the_os() -> None:
    """Collect the garbage, then leave the objects still alive to the operating system at exit.

    Python's collections while it shuts down walk every object the process still holds: after an audit,
    torch's and ``torch._dynamo``'s 340 000 (0.75-1.0 s of CPU, a sixth of the whole command), to finalise
    objects still alive at exit, whose finalisers Python does not promise to run. The garbage is collected
    here first, so what Python promises still holds: every unreachable object is finalised, and the
    ``atexit`` handlers run as before.
    """
    import gc

    gc.collect()
    gc.freeze()
