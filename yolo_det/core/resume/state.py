"""The resume-state file: its name next to a checkpoint, writing and loading it, and finding the one that
matches the checkpoint a run resumes from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelError
from ..fileio import atomic_file, file_sha256

#: Format tag stored in every resume-state file.
FORMAT = "yolo-det/resume/1"
_PREFIX = "yolo-det-resume"


def is_state_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a resume state written by :func:`save_state` (not a weights checkpoint)."""
    return Path(path).name.startswith(f"{_PREFIX}.")


def state_path(checkpoint: str | os.PathLike[str], rank: int = 0) -> Path:
    """Where the resume state of ``checkpoint`` lives for ``rank`` (0 for a single process).

    The name never starts with ``last`` (Ultralytics' ``resume=True`` picks the newest ``last*.pt``).
    """
    checkpoint = Path(checkpoint)
    suffix = f".rank{rank}" if rank > 0 else ""
    return checkpoint.with_name(f"{_PREFIX}.{checkpoint.stem}{suffix}.pt")


def previous_state_path(checkpoint: str | os.PathLike[str], rank: int = 0) -> Path:
    """Where the resume state of the checkpoint before the current one is kept while a new pair is written."""
    path = state_path(checkpoint, rank)
    return path.with_name(f"{path.stem}.prev.pt")


def state_files(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """Every resume state of ``checkpoint`` on disk: each rank's (:func:`state_path`), current and previous
    (:func:`previous_state_path`)."""
    checkpoint = Path(checkpoint)
    prefix = f"{_PREFIX}.{checkpoint.stem}"
    found = []
    for p in sorted(checkpoint.parent.glob(f"{prefix}*.pt")):
        rest = p.name[len(prefix) : -len(".pt")]  # "", ".rank1", ".prev", ".rank1.prev"
        if rest and not rest.startswith("."):
            continue
        parts = rest.split(".")[1:]
        if parts[-1:] == ["prev"]:
            parts = parts[:-1]
        if p.is_file() and (not parts or (len(parts) == 1 and parts[0][:4] == "rank" and parts[0][4:].isdigit())):
            found.append(p)
    return found


def save_state(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write a resume state atomically (tensors and plain values only).

    It is serialised straight into a temporary file in the same folder, which then replaces ``path``: a
    reader sees the old file or the new one, never half of one. There is no fsync (Ultralytics does not sync
    its checkpoints either); a file torn by a power loss fails to load and is reported, never used.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, sync=False) as f:
        torch.save({"format": FORMAT, **state}, f)
    return path


def state_bytes(state: Mapping[str, Any]) -> bytes:
    """A resume state serialised as :func:`save_state` writes it (its tensors copied to the CPU first): what a rank
    without the run folder sends to the rank that writes it (the receiver writes these bytes as they came; the
    collective that carries them unpickles its envelope: the ranks of a job trust each other, docs/security.md)."""
    import io

    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **{k: host_copy(v) for k, v in state.items()}}, buffer)
    return buffer.getvalue()


def host_copy(obj: Any) -> Any:
    """``obj`` with every tensor in it (nested in dicts, lists, tuples) copied to the CPU, others as they are."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu" and t.dtype in NUMPY_COPY_DTYPES:
            return torch.from_numpy(t.numpy().copy())  # one memcpy, no intra-op thread pool
        return t.to("cpu", copy=True)
    if isinstance(obj, Mapping):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(host_copy(v) for v in obj) if isinstance(obj, list) else tuple(host_copy(v) for v in obj)
    return obj


#: The dtypes a CPU tensor is copied through NumPy for (one memcpy, no intra-op thread pool); also used by
#: the verify recorder.
NUMPY_COPY_DTYPES = {
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a resume state written by :func:`save_state` (``weights_only``: no code runs).

    Raises:
        ModelError: The file is not a yolo-det resume state.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(
            f"'{path}' is not a yolo-det resume state ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ModelError(f"'{path}' is not a yolo-det resume state of format {FORMAT}")
    return state


def find_state(
    checkpoint: str | os.PathLike[str],
    *,
    rank: int,
    start_epoch: int,
    ema: Any,
    updates: Any,
    world_size: int | None = None,
    shards: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
    """Look up and check the resume state of ``checkpoint`` for a run resuming at ``start_epoch``.

    Args:
        checkpoint: The checkpoint the run resumes from.
        rank: The process's rank (0 for a single process).
        start_epoch: The first epoch the resumed run trains.
        ema: The EMA module loaded from the checkpoint (for its weights digest), or ``None``.
        updates: The EMA update count loaded from the checkpoint (a state of another save is refused).
        world_size: The number of ranks of the resumed run (a state written by a run of another number of
            ranks is refused: the data order and the gradient sums differ). ``None``: not checked.
        shards: The resumed run's ``shards`` (profile key): a state written under the same ``shards`` is used
            whatever the number of ranks (the weights do not depend on it), a state of other ``shards`` is refused.

    Returns:
        ``(info, state, problem)``: the record's resume data, the state to restore (``None`` when it is
        missing or belongs to another save) and why it cannot be used.
    """
    ckpt = Path(checkpoint)
    info: dict[str, Any] = {
        "resumed": True,
        "checkpoint": str(ckpt),
        "epoch": start_epoch,
        "state_found": False,
        "state_file": None,
    }
    try:
        info["checkpoint_sha256"] = file_sha256(ckpt)
    except OSError:
        info["checkpoint_sha256"] = None
    if isinstance(ema, torch.nn.Module):
        from ..record import state_dict_digest

        info["checkpoint_weights_sha256"] = state_dict_digest(ema)
    path = state_path(ckpt, rank)
    candidates = [p for p in (path, previous_state_path(ckpt, rank)) if p.is_file()]
    if not candidates:
        why = f"{path.name} not found next to it: a checkpoint from a run without yolo-det, or the file was removed"
        info["problem"] = why
        return info, None, why
    why = ""
    for path in candidates:  # the newest first; the previous one matches a checkpoint whose successor was not written
        try:
            state = load_state(path)
        except Exception as e:
            why = str(e)
            continue
        want = state.get("updates") if updates is None else updates
        if int(state.get("epoch", -2)) == start_epoch - 1 and state.get("updates") == want:
            break
        why = (
            f"{path.name} belongs to epoch {state.get('epoch')} (updates {state.get('updates')}), "
            f"the checkpoint to epoch {start_epoch - 1} (updates {want})"
        )
    else:
        info["problem"] = why
        return info, None, why
    saved_ranks, saved_shards = state.get("world_size"), state.get("shards")
    if (shards or saved_shards) and saved_shards != shards:
        why = (
            f"{path.name} was written by a run with shards: {saved_shards}, this run has shards: {shards}; "
            "resume with the same shards to continue bit for bit"
        )
        info["problem"] = why
        return info, None, why
    # the same shards: the same weights on any number of ranks
    if (
        not shards
        and world_size is not None
        and saved_ranks is not None
        and int(saved_ranks) != max(int(world_size), 1)
    ):
        why = (
            f"{path.name} was written by a run of {saved_ranks} rank(s), this run has {max(int(world_size), 1)}; "
            "resume with as many ranks to continue bit for bit"
        )
        info["problem"] = why
        return info, None, why
    info.update(state_found=True, state_file=str(path))
    return info, state, None
