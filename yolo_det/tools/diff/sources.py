"""The user's sources: their project's git commit and uncommitted changes, and the installed packages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .common import _MISSING, _Collector, _short_hash

#: Distributions whose versions the environment compares already (``_VERSION_KEYS``).
_COMPARED_DISTS = frozenset(
    {"torch", "torchvision", "numpy", "ultralytics", "yolov5", "yolo-det", "pillow"}
    | {"opencv-python", "opencv-python-headless"}
)


def _sources(c: _Collector, ra: Mapping[str, Any], rb: Mapping[str, Any]) -> None:
    """The user's own code (the project's git commit and uncommitted changes) and the installed packages."""

    def project(r: Mapping[str, Any]) -> Any:
        found = r.get("project", _MISSING)
        return found if found is _MISSING or isinstance(found, Mapping) else None

    def changes(p: Any) -> Any:
        if not isinstance(p, Mapping):
            return p
        if not p.get("dirty"):
            return "none"
        return f"{p.get('changed_files')} file(s), {_short_hash(p.get('changes_sha256'))}"

    pa, pb = project(ra), project(rb)
    if _MISSING in (pa, pb):
        if pa != pb:
            c.notes.append("only one record holds the project's git state (the other is from an older yolo-det)")
    else:
        held = isinstance(pa, Mapping) and isinstance(pb, Mapping)
        na = "(not a git work tree)"
        ga, gb = (p if isinstance(p, Mapping) else {"commit": na, "branch": na, "dirty": na} for p in (pa, pb))
        c.add("code", "project commit", ga.get("commit"), gb.get("commit"), held=held)
        c.add(
            "code",
            "project uncommitted changes",
            changes(ga) if pa else na,
            changes(gb) if pb else na,
            held=held,
            note="a digest of the changes: their text is not recorded",
        )
        c.add(
            "code", "project branch", ga.get("branch"), gb.get("branch"), changes_bits=False, note="the commit decides"
        )
    ka, kb = ra.get("packages"), rb.get("packages")
    if not isinstance(ka, Mapping) or not isinstance(kb, Mapping):
        if isinstance(ka, Mapping) or isinstance(kb, Mapping):
            c.notes.append("only one record lists the installed packages (the other is from an older yolo-det)")
        return
    for name in sorted((set(ka) | set(kb)) - _COMPARED_DISTS):
        if c.add("versions", f"package {name}", ka.get(name, "(not installed)"), kb.get(name, "(not installed)")):
            c.items[-1].measured = False  # another release: nobody measured what it changes
