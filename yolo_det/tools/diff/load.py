"""Reading a run's record for the comparison: a run folder, a ``determinism.json`` or a ``verify --save`` file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...core.errors import ConfigError
from ...core.record_schema import MAX_BYTES, RECORD_NAME, RecordError, parse_record
from .report import _esc

#: Files of `yolo-det verify --save` (yolo_det.tools.verify.crossverify).
VERIFY_SAVED_SCHEMA = "yolo-det/verify-fingerprints"


def load_record(source: str | Path) -> tuple[dict[str, Any], str]:
    """Read a run's record: a run folder (its ``determinism.json``), a ``determinism.json`` file, or a file
    written by ``yolo-det verify --save`` (its environment part).

    Returns:
        ``(record, path it was read from)``.

    Raises:
        ConfigError: The path does not exist, is not JSON, is not a yolo-det record, or was written by a
            newer yolo-det.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / RECORD_NAME).is_file():
            raise ConfigError(
                f"'{path}' is a folder without {RECORD_NAME}; pass a yolo-det run folder or a {RECORD_NAME} file"
            )
        path = path / RECORD_NAME
    if not path.is_file():
        raise ConfigError(f"'{path}' does not exist; pass a yolo-det run folder or a {RECORD_NAME} file")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read '{_esc(path)}' ({type(e).__name__}); pass a {RECORD_NAME} file") from None
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (RecursionError, UnicodeDecodeError, ValueError):
        data = None
    if isinstance(data, dict) and data.get("schema") == VERIFY_SAVED_SCHEMA:  # its record part (the run's own)
        data = data.get("record")
        raw = json.dumps(data).encode()
    if isinstance(data, dict) and (not isinstance(data.get("environment"), dict) or "profile" not in data):
        raise ConfigError(f"'{_esc(path)}' is not a yolo-det {RECORD_NAME} (no environment or profile entry)")
    try:
        data = parse_record(raw)
    except RecordError as e:
        raise ConfigError(f"'{_esc(path)}' is not a readable {RECORD_NAME}: {e}") from None
    return data, str(path)
