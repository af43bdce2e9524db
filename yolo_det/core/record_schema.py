"""The schema of ``determinism.json``: typed, versioned, one table used by the writer, the reader and the docs.

Length: one table: every field of the record, with its type and meaning, in the one place the three read it.

:data:`FIELDS` lists every top-level field a record may hold, with its JSON type, whether every record has
it, and what it means; objects list their own known fields the same way. Three things use it:

- :func:`yolo_det.core.record.write_record` checks a record against it before writing (a field of the wrong
  type is a bug of the writer, never a file on disk);
- :func:`parse_record` reads a record (``yolo-det diff``, resume): the text is refused above
  :data:`MAX_BYTES`, nested deeper than :data:`MAX_DEPTH`, or not JSON, and every known field of the wrong
  type is refused, each as one line (:class:`RecordError`);
- :func:`record_doc` writes ``docs/record.md`` (``python -m yolo_det.core.record_schema > docs/record.md``; a
  test checks the page is up to date).

Fields a record holds that the table does not know (a newer yolo-det's, a plugin's) are kept and not checked.
Version history: 1, the first; 2, ``status: running`` from the start of training, ``epochs_completed``
counting checkpointed epochs, ``segments`` holding every earlier part of a resumed run, ``resume.reasons``;
3, ``environment.host``, the machine fingerprint (:mod:`yolo_det.core.machine`) taken when training started.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import YoloDetError

__all__ = [
    "FIELDS",
    "MAX_BYTES",
    "MAX_DEPTH",
    "DIGEST_NOTE",
    "RECORD_NAME",
    "RECORD_SCHEMA",
    "STATUSES",
    "Field",
    "RecordError",
    "check_record",
    "parse_record",
    "record_doc",
]

#: The record's file name, in the run folder.
RECORD_NAME = "determinism.json"
#: The version of the record format this yolo-det writes (``schema`` in every record).
RECORD_SCHEMA = 3
#: Records larger than this are refused unread (an ordinary record is tens of kilobytes).
MAX_BYTES = 64 * 1024 * 1024
#: Records nested deeper than this are refused (an ordinary record nests 6 levels).
MAX_DEPTH = 64
#: What the weights digest (``weights.sha256``, ``yolo-det digest``, ``weights digest:`` of ``train``) hashes.
DIGEST_NOTE = (
    "SHA-256 of the weights' values in a fixed order and dtype, not of the file's bytes: "
    "`yolo-det digest FILE` gives it, `sha256sum FILE` does not"
)
#: How a run ended, or ``running`` while it trains.
STATUSES = ("running", "completed", "failed", "interrupted", "terminated", "killed")


class RecordError(YoloDetError):
    """A record that cannot be read: too large, too deep, not JSON, or a field of the wrong type."""


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Field:
    """One field of the record.

    Attributes:
        name: The key.
        types: Its JSON types (``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``, ``null``).
        doc: What it means.
        required: Whether every record of this version has it.
        fields: The known fields of an object.
        items: The JSON types of an array's items (checked for each item).
        values: The values a string may take (empty: any).
    """

    name: str
    types: tuple[str, ...]
    doc: str
    required: bool = False
    fields: tuple[Field, ...] = ()
    items: tuple[str, ...] = ()
    values: tuple[str, ...] = ()


_O, _A, _S, _I, _N, _B, _Z = "object", "array", "string", "integer", "number", "boolean", "null"
_MACHINE_STRINGS = (
    ("arch", "The CPU architecture."),
    ("cpu_vendor", "The CPU vendor (`/proc/cpuinfo`)."),
    ("cpu_model", "The CPU model."),
    ("cpu_capability", "ATen's CPU capability in force (AVX2, AVX512, DEFAULT)."),
    ("mkl", "MKL's version."),
    ("onednn", "oneDNN's version."),
    ("torch", "torch's version."),
    ("ultralytics", "Ultralytics' version (null: not installed; `check-machine` names a different one)."),
)
_PHASE = "The resolved settings of the {} phase (see docs/profiles: deterministic, backward, swaps, ...)."

FIELDS: tuple[Field, ...] = (
    Field("schema", (_I,), "The record format's version (this page: 3; a record without it is version 1)."),
    Field(
        "status",
        (_S,),
        "How the run ended: `running` while it trains (the record is written from the start of "
        "training and rewritten at every checkpoint, so a SIGKILLed run leaves `running`), `completed`, `failed`, "
        "`interrupted` (Ctrl-C), `terminated` (a signal handled like Ctrl-C); in `segments`, `killed` for a part "
        "whose record still said `running` when the run was resumed.",
        values=STATUSES,
    ),
    Field("framework", (_S,), "`ultralytics` or `yolov5`."),
    Field(
        "profile",
        (_O,),
        "The profile the run trained under, resolved.",
        required=True,
        fields=(
            Field("name", (_S,), "The profile's name."),
            Field("source", (_S, _Z), "Where it came from (`builtin:NAME` or a file)."),
            Field("description", (_S, _Z), "Its description."),
            Field("train", (_O,), _PHASE.format("train")),
            Field("val", (_O,), _PHASE.format("val")),
            Field("deploy", (_O,), _PHASE.format("deploy")),
        ),
    ),
    Field(
        "seeds",
        (_O,),
        "The seeds: `seed` and those derived from it (data order, sampler, RNG, per rank).",
        fields=(Field("seed", (_I, _Z), "The run's seed."),),
    ),
    Field(
        "environment",
        (_O,),
        "The software and hardware the run trained on.",
        required=True,
        fields=(
            *(
                Field(k, (_S, _Z), f"The version of {k}.")
                for k in (
                    "python",
                    "torch",
                    "torch_git_version",
                    "cuda",
                    "numpy",
                    "torchvision",
                    "ultralytics",
                    "yolov5",
                    "yolo_det",
                    "opencv",
                    "pillow",
                )
            ),
            Field("cudnn", (_I, _Z), "cuDNN's version number."),
            Field("platform", (_S, _Z), "The platform string (not a cause of different bits)."),
            Field("machine", (_S, _Z), "The machine type (x86_64, arm64, ...)."),
            Field("processor", (_S, _Z), "The processor string."),
            Field("cpu_model", (_S, _Z), "The CPU's model name."),
            Field("cpu_capability", (_S, _Z), "The instruction set PyTorch's CPU kernels use (AVX2, AVX512, ...)."),
            Field("cpu_count", (_I, _Z), "Logical CPUs."),
            Field("cuda_available", (_B,), "Whether CUDA was usable."),
            Field("gpus", (_A,), "The GPU model names.", items=(_S,)),
            Field("torch_threads", (_I, _Z), "torch's intra-op threads."),
            Field("torch_interop_threads", (_I, _Z), "torch's inter-op threads."),
            Field("env", (_O,), "The variables that can change a run's bits, as the training had them (null: unset)."),
            Field("argv", (_A,), "The command line."),
            Field("replaced_env", (_O,), "Your own variables the profile replaced before torch started (name: value)."),
            Field(
                "host",
                (_O,),
                "What of the machine decides the bits, as training started (`yolo-det check-machine` reads it).",
                fields=(
                    *(Field(k, (_S, _Z), d) for k, d in _MACHINE_STRINGS),
                    Field("cpu_flags", (_A,), "The CPU's AVX/FMA/SSE4/AMX flags.", items=(_S,)),
                    Field("cpu_count", (_I, _Z), "Logical CPUs."),
                    Field("intra_op_threads", (_I,), "torch's intra-op threads in use."),
                    Field("inter_op_threads", (_I,), "torch's inter-op threads."),
                    Field("mkldnn_enabled", (_B,), "Whether oneDNN (mkldnn) kernels were on."),
                    Field("env", (_O,), "The instruction-set and thread variables (null: unset)."),
                    Field("gpu", (_O, _Z), "On CUDA: name, SM count, capability, driver, CUDA, cuDNN, TF32 flags."),
                ),
            ),
        ),
    ),
    Field(
        "project",
        (_O, _Z),
        "The git state of your project: the work tree the run was started from, as training started "
        "(null: not in a git work tree, or git is missing). Read without running anything its config names.",
        fields=(
            Field("commit", (_S, _Z), "The commit checked out (null before the first commit)."),
            Field("branch", (_S, _Z), "The branch (null: a detached HEAD)."),
            Field(
                "dirty",
                (_B,),
                "Whether a tracked or staged file differed from the commit (untracked files do not count).",
            ),
            Field("changed_files", (_I,), "How many files differed."),
            Field(
                "changes_sha256",
                (_S, _Z),
                "A SHA-256 digest of the differing paths and their contents' git ids (null when clean); "
                "the text of a change is never recorded.",
            ),
        ),
    ),
    Field("packages", (_O,), "Every installed distribution as training started: name -> version, sorted."),
    Field("state_before", (_O, _Z), "The process's determinism flags before yolo-det changed anything."),
    Field("state_at_train_start", (_O, _Z), "The flags in force when the first batch started."),
    Field("backward_toggles", (_I,), "How often determinism was turned off around backward (`backward: disable`)."),
    Field("swaps", (_A,), "The layers replaced by deterministic ones.", items=(_O,)),
    Field("routed_calls", (_O,), "Functional calls routed to deterministic versions, by name."),
    Field("nondeterminism_warnings", (_A,), "Every non-determinism warning seen.", items=(_O, _S)),
    Field(
        "weights",
        (_O,),
        "The weights the run left.",
        fields=(
            Field("file", (_S,), "The final weights file (`last.pt`)."),
            Field("sha256", (_S,), f"The weights digest of that file: {DIGEST_NOTE}."),
            Field("ema_fp32_sha256", (_S,), "The digest of the final EMA in float32."),
            Field("files", (_A,), "Every weights file in the run's weights folder, read back from disk.", items=(_O,)),
        ),
    ),
    Field(
        "epoch_weights",
        (_A,),
        "The weights digest of `last.pt` right after each epoch's checkpoint, `{epoch, sha256}` (epochs counted from "
        "1; a resumed part lists the epochs it trained, its `segments` the earlier ones): what `yolo-det reproduce` "
        "compares epoch by epoch.",
        items=(_O,),
    ),
    Field("run", (_O,), "The framework's main arguments and `save_dir`."),
    Field(
        "guarantees",
        (_O,),
        "Ultralytics, at the end of the run: each guarantee the train phase asked for and whether the run had it "
        "(`flags`: the state at every optimizer step; `data_invariance`: the loader keyed; `shards`: the layout).",
        fields=(
            Field("flags", (_O,), "`in_force` (null: steps not observed), `steps`, `steps_off`, `differing`."),
            Field("data_invariance", (_O,), "`in_force`, `loader` (the training loader's mode at the end)."),
            Field("shards", (_O,), "`in_force`, `layout` (shards, world, rank, batch)."),
        ),
    ),
    Field(
        "trainer_seam",
        (_O,),
        "Ultralytics: whether the run trained through yolo-det's trainer seam (`trainer_class`, `attach`, the CLI), "
        "and what it left off without it (callbacks registered in a trainer of the user's own).",
        fields=(
            Field("in_force", (_B,), "True when the trainer's class composed the seam."),
            Field("off", (_A,), "What the run left off for want of the seam (empty with it).", items=(_S,)),
        ),
    ),
    Field("ultralytics_args", (_O,), "Every Ultralytics argument the run trained with."),
    Field(
        "adjusted_args",
        (_O,),
        "The arguments asked for that Ultralytics changed itself: `{name: {asked, used, why}}` (`workers` on a CPU).",
    ),
    Field(
        "data",
        (_O,),
        "The dataset fingerprint.",
        fields=(
            Field("sha256", (_S,), "Digest of the whole fingerprint."),
            Field("splits", (_O,), "Per split: the digests, and the images, labels, instances, backgrounds used."),
            Field("version", (_I,), "The fingerprint's version."),
            Field(
                "files",
                (_A,),
                "Which file differs, when the digests do: `[name, sha256]` per file (16 hex digits), by name relative "
                "to the dataset root, up to 256 files; beyond, `[first, last, digest]` per group of `files_group` "
                "files (a digest of their names and contents). What `yolo-det reproduce` and `diff` name; not part "
                "of `sha256`.",
                items=(_A,),
            ),
            Field("files_group", (_I,), "Files per entry of `files` (1: one per file)."),
        ),
    ),
    Field(
        "model",
        (_O,),
        "The model fingerprint (start: `yaml` or `checkpoint`, architecture, initial weights).",
        fields=(Field("kind", (_S,), "How the model was given."),),
    ),
    Field("phase_events", (_A,), "The phases entered and left, in order.", items=(_O,)),
    Field(
        "op_trace",
        (_O,),
        "With `--trace-ops`: what was asked and what was traced (steps the run never reached are not in `traced`).",
        fields=(
            Field("asked", (_S,), "The steps asked for (`3-5`)."),
            Field("steps_run", (_I,), "The optimizer steps the run made."),
            Field("traced", (_A,), "The steps the trace holds.", items=(_I,)),
            Field("file", (_S, _Z), "The trace written (null: no step asked for ran)."),
        ),
    ),
    Field("ranks", (_A,), "Every rank's flags, seeds and place (node, host, device, versions).", items=(_O,)),
    Field("rank_problems", (_A,), "Ranks whose flags, versions or machine differ from rank 0's.", items=(_O, _S)),
    Field("launch", (_O, _Z), "The job torchrun/srun started: world size, node, rendezvous, restart count."),
    Field(
        "epochs_completed",
        (_I,),
        "Epochs whose checkpoint was written (a run killed in epoch 3 after two checkpoints says 2).",
    ),
    Field("epochs", (_I, _Z), "The epochs the run was asked to train."),
    Field("signal", (_S,), "The signal that stopped the run (`terminated`, `interrupted`)."),
    Field("signal_number", (_I,), "Its number."),
    Field("stopped", (_S,), "Why a run stopped cleanly after a saved epoch."),
    Field("ending", (_S,), "In `segments`: what is known of how a `killed` part ended."),
    Field(
        "error",
        (_O,),
        "The exception that ended a `failed` run, or that a noted stop surfaced as (`type`, `message`).",
        fields=(Field("type", (_S,), "Its class."), Field("message", (_S,), "Its message, one line.")),
    ),
    Field(
        "resume",
        (_O, _Z),
        "How the run resumed (null for a fresh run).",
        fields=(
            Field("resumed", (_B,), "True."),
            Field("checkpoint", (_S,), "The checkpoint it resumed from."),
            Field("epoch", (_I,), "The first epoch it trained."),
            Field("state_found", (_B,), "Whether the resume state matching the checkpoint was found."),
            Field(
                "bitwise_expected", (_B,), "Whether the run is expected to end bit for bit as the uninterrupted run."
            ),
            Field(
                "reasons",
                (_A,),
                "Why not, one line each (a changed profile, an override that changes the result, a missing state).",
                items=(_S,),
            ),
            Field("overrides", (_O,), "Arguments that differ from the checkpoint's (`{name: [checkpoint, now]}`)."),
        ),
    ),
    Field(
        "segments",
        (_A,),
        "The earlier parts of a resumed run, oldest first: each is the record that part left "
        "(its profile, arguments, environment, status and `epochs_completed`).",
        items=(_O,),
    ),
    Field("resume_states_written", (_I,), "Resume states written by this part."),
    Field("imports", (_A,), "The `--import` modules the run's model needed (see docs/blocks.md).", items=(_O,)),
    Field("checkpoint_yaml_layers", (_O,), "yolo-det layer names the checkpoints' YAML stores under torch's names."),
    Field(
        "checkpoint_needs",
        (_O,),
        "What plain Ultralytics needs to fine-tune the checkpoints: `modules` (YAML name -> module to import and "
        "bind in `ultralytics.nn.tasks`), `yolo_det` (why only yolo-det can; empty when plain Ultralytics can).",
    ),
)


def _type_names(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for name, types in _JSON_TYPES.items():
        if name != "number" and isinstance(value, types):
            return name
    return "number" if isinstance(value, float) else type(value).__name__


def _matches(value: Any, types: tuple[str, ...]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, _JSON_TYPES[t]) for t in types)


def _check(value: Mapping[str, Any], fields: tuple[Field, ...], prefix: str) -> str | None:
    for f in fields:
        path = f"{prefix}{f.name}"
        if f.name not in value:
            if f.required:
                return f"no '{path}' field"
            continue
        v = value[f.name]
        if not _matches(v, f.types):
            return f"field '{path}' must be {' or '.join(f.types)}, got {_type_names(v)}"
        if f.values and isinstance(v, str) and v not in f.values:
            return f"field '{path}' is {_short(v)}, not one of {', '.join(f.values)}"
        if f.items and isinstance(v, list):
            for i, item in enumerate(v):
                if not _matches(item, f.items):
                    return f"field '{path}[{i}]' must be {' or '.join(f.items)}, got {_type_names(item)}"
        if f.fields and isinstance(v, dict):
            problem = _check(v, f.fields, path + ".")
            if problem:
                return problem
    return None


def _short(text: str, limit: int = 40) -> str:
    shown = text.encode("unicode_escape").decode("ascii")
    return repr(shown if len(shown) <= limit else shown[: limit - 3] + "...")


def check_record(record: Any, *, segments: bool = True) -> str | None:
    """The first problem of a parsed record against :data:`FIELDS` (one line), or None when it conforms.

    Each entry of ``segments`` is checked as a record of its own (``segments[i].field`` in the message).
    """
    if not isinstance(record, dict):
        return f"a record is a JSON object, got {_type_names(record)}"
    schema = record.get("schema", 1)
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        return f"invalid record schema {schema!r:.40}"
    if schema > RECORD_SCHEMA:
        return f"record schema {schema}, newer than this yolo-det reads ({RECORD_SCHEMA}); upgrade yolo-det"
    problem = _check(record, FIELDS, "")
    if problem or not segments:
        return problem
    for i, part in enumerate(record.get("segments") or []):
        sub = check_record(part, segments=True)
        if sub:
            return f"segments[{i}]: {sub}"
    return None


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (iterative: a deep value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_record(data: bytes | str, *, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Parse and check a record's text (see the module docstring).

    Raises:
        RecordError: One line: larger than ``max_bytes``, not UTF-8 JSON, nested deeper than
            :data:`MAX_DEPTH`, or a field of the wrong type.
    """
    size = len(data)
    if size > max_bytes:
        raise RecordError(f"record is {size} bytes, more than the {max_bytes} a record may have")
    try:
        parsed = json.loads(data)
    except RecursionError:
        raise RecordError(f"record nests deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"not a JSON record ({type(e).__name__}: {str(e).splitlines()[0][:80]})") from None
    if _depth(parsed) > MAX_DEPTH:
        raise RecordError(f"record nests deeper than {MAX_DEPTH} levels")
    problem = check_record(parsed)
    if problem:
        raise RecordError(problem)
    return parsed


def _doc_rows(fields: tuple[Field, ...], prefix: str = "") -> list[str]:
    rows = []
    for f in fields:
        kind = " or ".join(f.types) + (f" of {' or '.join(f.items)}" if f.items else "")
        req = "yes" if f.required else ""
        rows.append(f"| `{prefix}{f.name}` | {kind} | {req} | {f.doc} |")
        rows.extend(_doc_rows(f.fields, f"{prefix}{f.name}."))
    return rows


_INTRO = """# The run record: `determinism.json`

<!-- generated by `python -m yolo_det.core.record_schema > docs/record.md` from yolo_det/core/record_schema.py;
edit the schema, not this page -->

Every training run under yolo-det writes `determinism.json` into its run folder. It is written atomically
(a reader never sees half a file) and it tells the truth at every moment:

- **From the first second.** The record exists with `status: running` from the start of training, and is
  rewritten at every checkpoint (`last.pt`) with `epochs_completed` counting the checkpointed epochs. A
  run killed with SIGKILL leaves a record saying `running`, the last checkpointed epoch, and the
  profile, model, data and environment it trained with. In a reused folder (`exist_ok=True`) a new run
  replaces the previous run's record before it writes any weights, so a record never describes weights
  another run produced.
- **However it ends.** `completed`, `failed` (with the error), `interrupted` (Ctrl-C), `terminated` (a
  signal), each with every weights file in the folder digested from disk.
- **Across resumes.** A resumed run's record has `resume` (the checkpoint, whether its resume state was
  found, `bitwise_expected` and the `reasons` when it is false) and `segments`: the record of every
  earlier part, oldest first, each with its own profile, arguments, environment and ending.

`yolo-det diff RUN_A RUN_B` compares two records. Records are read with a size limit ({max_bytes} bytes)
and a depth limit ({max_depth} levels), and every known field is checked for its type: a malformed record
is one line, exit 2.

## Fields (schema {schema})

A field marked *required* is in every record of this version; others appear when they apply. Unknown
fields are kept and not checked.

| field | type | required | meaning |
|---|---|---|---|
"""


def record_doc() -> str:
    """The text of ``docs/record.md``, generated from :data:`FIELDS`."""
    intro = _INTRO.format(max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, schema=RECORD_SCHEMA)
    return intro + "\n".join(_doc_rows(FIELDS)) + "\n"


if __name__ == "__main__":  # pragma: no cover - the docs generator
    sys.stdout.write(record_doc())
