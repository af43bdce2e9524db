"""One module per ``yolo-det`` command: ``configure(parser)`` and ``run(args) -> int``."""
