"""``python -m yolo_det`` is ``yolo-det``."""

from .cli import run_cli

if __name__ == "__main__":
    run_cli()
