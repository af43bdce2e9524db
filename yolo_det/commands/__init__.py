"""One module per ``yolo-det`` command: ``configure(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tools.ci_report import CheckSuite

IMPORT_HELP = (
    "import MODULE first (package.module from the current folder or sys.path, or a .py file): every "
    "nn.Module subclass it defines is nameable in model YAMLs (repeatable)"
)


def profile_names() -> str:
    """The built-in profiles' names for a help text, from the presets yolo-det ships (``repro, balanced, ...``)."""
    from ..core.profiles import BUILTIN_PROFILES

    return ", ".join(BUILTIN_PROFILES)


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--import MODULE`` (repeatable) to a command that builds models."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=IMPORT_HELP)


def add_trust_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--trust-checkpoint`` (skip the scan of a ``model=FILE.pt`` checkpoint's pickle) and
    ``--allow-download`` (let a data YAML's ``download:`` script run) to a command that trains or loads."""
    from ..analysis.gate import DOWNLOAD_FLAG
    from ..core.untrusted.container import TRUST_FLAG

    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="hand model=FILE.pt to Ultralytics even when its pickle names functions no checkpoint "
        "needs (only for files you trust: loading runs them)",
    )
    parser.add_argument(
        DOWNLOAD_FLAG, action="store_true", help="let a data YAML's download: script run (only for files you trust)"
    )


@contextmanager
def user_inputs(args: argparse.Namespace) -> Iterator[None]:
    """While the block runs: the ``--import`` modules imported and nameable (a bad one fails before any work), and the
    gate set as :func:`add_trust_flag`'s flags say."""
    from ..analysis.gate import allow_downloads
    from ..analysis.models import model_names
    from ..core.untrusted.container import trusted_checkpoints

    with model_names(args.imports), trusted_checkpoints(args.trust_checkpoint), allow_downloads(args.allow_download):
        yield


def add_ci_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--junit FILE`` and ``--annotations github`` (results for CI systems) to a command."""
    parser.add_argument(
        "--junit",
        default=None,
        metavar="FILE.xml",
        help="also write the result as JUnit XML (one test case per model or compared quantity)",
    )
    parser.add_argument(
        "--annotations",
        choices=("github",),
        default=None,
        help="also print GitHub Actions annotations (::error file=...,line=...::) for what failed",
    )


def check_ci_options(args: argparse.Namespace) -> None:
    """Check ``--junit`` before any work (an existing file is replaced; a missing folder is an error)."""
    from ..core.fileio import check_output_path

    if getattr(args, "junit", None):
        args.junit = check_output_path(args.junit, suffix=".xml", what="--junit")


def emit_ci(args: argparse.Namespace, suites: Sequence[CheckSuite]) -> None:
    """Write ``--junit`` and print ``--annotations`` for ``suites`` (annotations go to stderr under --json)."""
    import sys

    from ..tools.ci_report import github_annotations, write_junit

    if getattr(args, "junit", None):
        write_junit(args.junit, suites)
    if getattr(args, "annotations", None) == "github":
        stream = sys.stderr if getattr(args, "json", False) else sys.stdout
        for line in github_annotations(suites):
            print(line, file=stream)
