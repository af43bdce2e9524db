"""The patch's edit table and the text patcher: what each YOLOv5 script gets, line by line.

Every edit is anchored on a line whose text is stable across YOLOv5 tags and the ``yolov5`` PyPI package
(:data:`FILES`; the table of edits is in :mod:`.patch`'s docstring). :func:`patch_text` applies a file's edits
to its unpatched text, :func:`revert_text` takes every ``# yolo-det`` line back out: both are pure functions
of the text, and a file where an anchor is missing or ambiguous raises :class:`NotRecognised`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ...core.errors import PatchError

__all__ = ["BACKUP_SUFFIX", "FILES", "MARKER", "Edit", "NotRecognised", "patch_text", "revert_text", "unified_diff"]

MARKER = "# yolo-det"
#: Suffix of the backup written next to a file before it is changed.
BACKUP_SUFFIX = ".yolo-det.bak"

_IMPORT_LINE = f"from yolo_det.integrations import yolov5 as ydet  {MARKER}"


@dataclass(frozen=True)
class Edit:
    """One anchored edit of a YOLOv5 script.

    Attributes:
        name: Short name shown in reports.
        anchor: The line looked for, as a reader would write it (shown when it is not found).
        pattern: Regex matching the anchor line (without its line ending); the named group ``indent`` is
            the line's indentation.
        kind: ``before``/``after``: insert a line before/after the anchor; ``replace``: rewrite the anchor.
        template: The new line, formatted with the pattern's named groups and ``args`` (the option line's
            extra arguments).
        patched: Regex matching the line this edit writes.
        restore: For ``replace`` edits, the original line, formatted with ``patched``'s named groups.
    """

    name: str
    anchor: str
    pattern: re.Pattern[str]
    kind: Literal["before", "after", "replace"]
    template: str
    patched: re.Pattern[str]
    restore: str = ""


def _insert(name: str, anchor: str, pattern: str, kind: Literal["before", "after"], code: str, patched: str) -> Edit:
    return Edit(
        name,
        anchor,
        re.compile(pattern),
        kind,
        "{indent}" + code + "  " + MARKER,
        re.compile(r"(?P<indent>[ \t]*)" + patched + r"  " + re.escape(MARKER) + r"[ \t]*$"),
    )


_IMPORT = Edit(
    "import",
    "from utils.general import ...",
    re.compile(r"(?P<indent>)from (?:yolov5\.)?utils\.general import\b"),
    "before",
    _IMPORT_LINE,
    re.compile(r"(?P<indent>)" + re.escape(_IMPORT_LINE) + r"[ \t]*$"),
)
_TRAINING = _insert(
    "training", "def train(", r"(?P<indent>)def train\(", "before", "@ydet.training", r"@ydet\.training"
)
_INIT_SEEDS = Edit(
    "init_seeds",
    "init_seeds(opt.seed + 1 + RANK, deterministic=True)",
    re.compile(r"(?P<indent>[ \t]+)init_seeds\((?P<call>opt\.seed\b[^#]*)\)[ \t]*$"),
    "replace",
    "{indent}ydet.init_seeds(init_seeds, {call})  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)ydet\.init_seeds\(init_seeds, (?P<call>[^#]*)\)  " + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}init_seeds({call})",
)
_BACKWARD = Edit(
    "backward",
    "scaler.scale(loss).backward()",
    re.compile(r"(?P<indent>[ \t]+)scaler\.scale\((?P<loss>\w+)\)\.backward\(\)[ \t]*$"),
    "replace",
    "{indent}ydet.backward(scaler.scale({loss}))  " + MARKER,
    re.compile(
        r"(?P<indent>[ \t]+)ydet\.backward\(scaler\.scale\((?P<loss>\w+)\)\)  " + re.escape(MARKER) + r"[ \t]*$"
    ),
    "{indent}scaler.scale({loss}).backward()",
)
_MODEL_DETECT = _insert(
    "prepare_model",
    "amp = check_amp(model)",
    r"(?P<indent>[ \t]+)amp = check_amp\(model\)",
    "before",
    "model = ydet.prepare_model(model)",
    r"model = ydet\.prepare_model\(model\)",
)
_MODEL_CLASSIFY = _insert(
    "prepare_model",
    "model = model.to(device)",
    r"(?P<indent>[ \t]+)model = model\.to\(device\)[ \t]*(?:#.*)?$",
    "after",
    "model = ydet.prepare_model(model)",
    r"model = ydet\.prepare_model\(model\)",
)
_OPTION_PATCHED = r"ydet\.add_argument\(parser(?:, default=[^#]*)?\)"
_OPTION_TRAIN = _insert(
    "option",
    "parser.add_argument('--seed', ...)",
    r"(?P<indent>[ \t]+)parser\.add_argument\(['\"]--seed['\"].*\)[ \t]*(?:#.*)?$",
    "after",
    "ydet.add_argument(parser{args})",
    _OPTION_PATCHED,
)
_OPTION_RUN = _insert(
    "option",
    "parser = argparse.ArgumentParser()",
    r"(?P<indent>[ \t]+)parser = argparse\.ArgumentParser\(\)[ \t]*(?:#.*)?$",
    "after",
    "ydet.add_argument(parser{args})",
    _OPTION_PATCHED,
)
_VALIDATION = _insert(
    "validation", "def run(", r"(?P<indent>)def run\(", "before", "@ydet.validation", r"@ydet\.validation"
)
_DEPLOYMENT = _insert(
    "deployment", "def run(", r"(?P<indent>)def run\(", "before", "@ydet.deployment", r"@ydet\.deployment"
)

_LAST_OPT_STEP = Edit(
    "last_opt_step",
    "last_opt_step = -1",
    re.compile(r"(?P<indent>[ \t]+)last_opt_step = -1[ \t]*$"),
    "replace",
    "{indent}last_opt_step = ydet.last_opt_step(-1)  " + MARKER,
    re.compile(r"(?P<indent>[ \t]+)last_opt_step = ydet\.last_opt_step\(-1\)  " + re.escape(MARKER) + r"[ \t]*$"),
    "{indent}last_opt_step = -1",
)

_TRAIN_LOADER = Edit(
    "train_loader",
    "train_loader, dataset = create_dataloader(...",
    re.compile(r"(?P<indent>[ \t]+)train_loader, dataset = create_dataloader\((?P<rest>[^#]*)$"),
    "replace",
    "{indent}train_loader, dataset = ydet.train_loader(create_dataloader)({rest}  " + MARKER,
    re.compile(
        r"(?P<indent>[ \t]+)train_loader, dataset = ydet\.train_loader\(create_dataloader\)\((?P<rest>[^#]*?)  "
        + re.escape(MARKER)
        + r"[ \t]*$"
    ),
    "{indent}train_loader, dataset = create_dataloader({rest}",
)

_TRAIN_EDITS = (_IMPORT, _TRAINING, _INIT_SEEDS, _MODEL_DETECT, _TRAIN_LOADER, _LAST_OPT_STEP, _BACKWARD, _OPTION_TRAIN)

#: The files the patch changes (relative to the tree's root) and their edits. ``train.py`` and ``val.py``
#: must exist; the others are patched where the tag has them.
FILES: dict[str, tuple[Edit, ...]] = {
    "train.py": _TRAIN_EDITS,
    "segment/train.py": _TRAIN_EDITS,
    "classify/train.py": (_IMPORT, _TRAINING, _INIT_SEEDS, _MODEL_CLASSIFY, _BACKWARD, _OPTION_TRAIN),
    "val.py": (_IMPORT, _VALIDATION),
    "segment/val.py": (_IMPORT, _VALIDATION),
    "classify/val.py": (_IMPORT, _VALIDATION),
    "detect.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "export.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "segment/predict.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
    "classify/predict.py": (_IMPORT, _DEPLOYMENT, _OPTION_RUN),
}


class NotRecognised(PatchError):
    """A file does not have the line an edit is anchored on (or has it more than once)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.detail = message


# ---------------------------------------------------------------------------------------------------------
# text transforms


def _split(text: str) -> list[tuple[str, str]]:
    """Lines as (body, line ending)."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        out.append((body, line[len(body) :]))
    return out


def _newline(lines: Sequence[tuple[str, str]]) -> str:
    for _, end in lines:
        if end:
            return end
    return "\n"


def revert_text(text: str, edits: Iterable[Edit], *, path: str = "<text>") -> str:
    """Return ``text`` with every line written by ``edits`` reverted (unpatched text is returned as is).

    Raises:
        NotRecognised: A line carries the ``# yolo-det`` marker but no edit of this version wrote it.
    """
    edits = tuple(edits)
    out: list[str] = []
    for number, (body, end) in enumerate(_split(text), start=1):
        if MARKER not in body:
            out.append(body + end)
            continue
        for edit in edits:
            m = edit.patched.fullmatch(body)
            if m is None:
                continue
            if edit.kind == "replace":
                out.append(edit.restore.format(**m.groupdict()) + end)
            break
        else:
            raise NotRecognised(
                path,
                f"line {number} is marked '{MARKER}' but is not a line this version of "
                f"yolo-det writes: {body.strip()!r}; restore it by hand (see the backup "
                f"*{BACKUP_SUFFIX} or 'git diff')",
            )
    return "".join(out)


def patch_text(text: str, edits: Iterable[Edit], *, path: str = "<text>", default_profile: str | None = None) -> str:
    """Return the patched form of ``text`` (patched or not).

    Args:
        text: The file's text.
        edits: The file's edits (see :data:`FILES`).
        path: Shown in errors.
        default_profile: Written as the ``--det-profile`` default (None: YOLOv5's behaviour by default).

    Raises:
        NotRecognised: An anchor is missing or ambiguous, or a marked line is unknown.
    """
    edits = tuple(edits)
    lines = _split(revert_text(text, edits, path=path))
    args = "" if default_profile is None else f", default={default_profile!r}"
    before: dict[int, list[str]] = {}
    after: dict[int, list[str]] = {}
    replace: dict[int, str] = {}
    for edit in edits:
        hits = [(i, m) for i, (body, _) in enumerate(lines) if (m := edit.pattern.match(body))]
        if len(hits) != 1:
            found = "found none" if not hits else f"found {len(hits)} (lines {', '.join(str(i + 1) for i, _ in hits)})"
            raise NotRecognised(
                path,
                f"expected exactly one line like `{edit.anchor}` for the '{edit.name}' edit, {found}; left unchanged",
            )
        i, m = hits[0]
        new = edit.template.format(args=args, **m.groupdict())
        if edit.kind == "before":
            before.setdefault(i, []).append(new)
        elif edit.kind == "after":
            after.setdefault(i, []).append(new)
        else:
            if i in replace:
                raise NotRecognised(path, f"two edits rewrite line {i + 1}; left unchanged")
            replace[i] = new
    newline = _newline(lines)
    out: list[str] = []
    for i, (body, end) in enumerate(lines):
        out.extend(line + newline for line in before.get(i, []))
        out.append(replace.get(i, body) + (end if end or i not in after else newline))
        out.extend(line + (end or newline) for line in after.get(i, []))
    return "".join(out)


def unified_diff(path: str, old: str, new: str, *, context: int = 3) -> str:
    """A git-style unified diff of one file (``a/PATH`` -> ``b/PATH``), ``""`` when equal."""
    if old == new:
        return ""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    body = []
    for line in difflib.unified_diff(old_lines, new_lines, f"a/{path}", f"b/{path}", n=context):
        if not line.endswith(("\n", "\r")):
            line += "\n\\ No newline at end of file\n"
        body.append(line)
    return f"diff --git a/{path} b/{path}\n" + "".join(body)
