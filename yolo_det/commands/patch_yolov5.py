"""Patch a YOLOv5 tree so its scripts take --det-profile and run under yolo-det profiles.

DIR is a YOLOv5 clone (any tag from v7.0 to master) or the installed yolov5 package. The patch changes
a few lines of train.py, val.py, detect.py and export.py (and their segment/ and classify/ versions):
each changed line ends with '# yolo-det' and calls yolo_det.integrations.yolov5. Without --det-profile
the patched scripts behave exactly as before. Each changed file is first backed up as
FILE.yolo-det.bak; running the command again changes nothing. Nothing is written outside DIR's real
path: a file or folder linking outside it is refused, a link inside it stays a link. The change is all
or nothing: an error, Ctrl-C, SIGTERM or SIGHUP at any point leaves the tree as it was (or, after the last
rename, fully patched); a journal (.yolo-det-patch.journal) lets the next run undo or complete an operation
killed outright (SIGKILL), or --repair alone. A file whose anchor line is missing, or with a '# yolo-det' line
this version did not write, is named with the line looked for and nothing is changed (exit code 2).

exit codes: 0 done (or, with --check, nothing to change); 1 with --check or --diff: the tree would change,
or a file was not recognised; 2 bad input (not a YOLOv5 tree, read-only tree, a file not recognised, unknown
profile); 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP (the tree whole).

examples:
  yolo-det patch-yolov5 ~/yolov5                       # patch a clone
  yolo-det patch-yolov5 ~/yolov5 --check               # what would change; exit 1 if unpatched
  yolo-det patch-yolov5 ~/yolov5 --diff > det.diff     # the change as a diff, nothing written
  yolo-det patch-yolov5 ~/yolov5 --profile repro       # --det-profile defaults to repro
  yolo-det patch-yolov5 ~/yolov5 --reverse             # remove the patch
  python train.py --det-profile repro --data data.yaml --cfg yolov5n.yaml --weights ''
"""

from __future__ import annotations

import argparse
import sys

from ..core.errors import PatchError
from ..core.text import printable
from ..integrations.yolov5.patch import BACKUP_SUFFIX, plan
from ..integrations.yolov5.writer import JOURNAL, apply_plan, pending_journal, repair


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``patch-yolov5`` arguments."""
    parser.add_argument("dir", metavar="DIR", help="YOLOv5 clone or installed yolov5 package folder")
    parser.add_argument(
        "--check", action="store_true", help="report what would change and exit 1 if anything would; write nothing"
    )
    parser.add_argument("--reverse", action="store_true", help="remove the patch")
    parser.add_argument("--diff", action="store_true", help="print the change as a unified diff; write nothing")
    parser.add_argument(
        "--profile",
        metavar="NAME|FILE",
        default=None,
        help="make --det-profile default to this profile (default: no profile, YOLOv5's behaviour)",
    )
    parser.add_argument("--no-backup", action="store_true", help=f"do not write FILE{BACKUP_SUFFIX} backups")
    parser.add_argument(
        "--repair",
        action="store_true",
        help=f"only finish what an interrupted run left ({JOURNAL}): undo it, or complete it when it "
        "had reached its commit point",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``yolo-det patch-yolov5``."""
    journal = pending_journal(args.dir)
    if journal is not None and (args.check or args.diff) and not args.repair:
        raise PatchError(
            f"an interrupted patch-yolov5 left {journal}; run 'yolo-det patch-yolov5 {args.dir} --repair' "
            "first (the tree may be half changed until then)"
        )
    if journal is not None or args.repair:
        done = repair(args.dir)
        message = f"an interrupted patch-yolov5 was {done}" if done else "nothing to repair"
        print(printable(f"yolo-det: {message} in {journal.parent if journal else args.dir}"), file=sys.stderr)
        if args.repair:
            return 0
    result = plan(args.dir, reverse=args.reverse, default_profile=None if args.reverse else args.profile)
    verb = "unpatch" if args.reverse else "patch"
    if args.diff:
        sys.stdout.write(result.diff())
        for f in result.unrecognised:
            print(printable(f"yolo-det: {f.path}: not recognised: {f.error}"), file=sys.stderr)
        return 1 if result.unrecognised else 0
    if args.check:
        for f in result.unrecognised:
            print(printable(f"yolo-det: {result.root / f.path}: not recognised: {f.error}"), file=sys.stderr)
        for f in result.files:
            if f.error is not None:
                continue
            if f.changes:
                print(printable(f"{f.path}: would {verb}"))
                for line in f.summary():
                    print(printable(line))
            else:
                print(printable(f"{f.path}: {'patched' if f.patched else 'not patched'}, nothing to change"))
        pending = bool(result.changes) or bool(result.unrecognised)
        return 1 if pending else 0
    written = apply_plan(result, backup=not args.no_backup)  # refuses a tree with an unrecognised file, unchanged
    done = "unpatched" if args.reverse else "patched"
    for f in result.files:
        print(printable(f"{f.path}: {done if f.changes else 'unchanged'}"))
    print(
        f"{len(written)} file(s) {done} in {result.root}"
        + ("" if args.no_backup or not written else f" (backups: *{BACKUP_SUFFIX})")
    )
    return 0
