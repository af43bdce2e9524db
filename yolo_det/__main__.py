"""``python -m yolo_det`` is ``yolo-det``.

Ctrl-C while the command line itself is being imported gives the same one line and exit code 130 as
Ctrl-C later on (``import yolo_det`` itself imports nothing heavy).
"""

import sys

try:
    from .cli import run_cli
except KeyboardInterrupt:
    print("yolo-det: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    run_cli()
