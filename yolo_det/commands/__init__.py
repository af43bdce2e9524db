"""One module per ``yolo-det`` command: ``configure(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse

IMPORT_HELP = ("import MODULE first (package.module from the current folder or sys.path, or a .py file): every "
               "nn.Module subclass it defines is nameable in model YAMLs (repeatable)")


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--import MODULE`` (repeatable) to a command that builds models."""
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE", help=IMPORT_HELP)
