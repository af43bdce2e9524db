"""What the user changed: their project's git state and the installed distributions, for the run record.

:func:`project_state` describes the git work tree a run was started from (its commit, branch, and whether
the tracked files differ from the commit, with a digest of how: never the text of a change);
:func:`installed_packages` lists the installed distributions with their versions.

The folder may be one the user received: its ``.git/config`` and ``.gitattributes`` must not be able to run
a command. So git is asked only what it reads from its object store and index (``rev-parse``,
``symbolic-ref``, ``ls-tree``, ``ls-files``), with a fixed argument list, no pager, no system config, no
fsmonitor and a short timeout; the work tree's files are read and hashed here, never through git's filters,
textconv or external diff, which a config can point at a program. A missing git, a folder that is not a work
tree, or any git failure gives None, never an error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["GIT_TIMEOUT_S", "installed_packages", "project_state", "run_sources"]

#: Seconds each git command may take before the project is recorded as unknown.
GIT_TIMEOUT_S = 10.0
_SAFE = ("-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false", "--no-pager", "--no-optional-locks")


def _git(folder: Path, *args: str) -> bytes | None:
    """The output of ``git ARGS`` in ``folder``, or None when git is missing, fails or takes too long."""
    git = shutil.which("git")
    if git is None:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no GIT_DIR etc. from the caller
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", GIT_OPTIONAL_LOCKS="0")
    try:
        done = subprocess.run(  # noqa: S603 - a fixed argument list; see the module docstring
            [git, "-C", str(folder), *_SAFE, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _entries(listing: bytes) -> dict[bytes, tuple[bytes, bytes]]:
    """``path -> (mode, object id)`` of ``ls-tree -r -z`` (mode type id) or ``ls-files -s -z`` (mode id stage)."""
    out: dict[bytes, tuple[bytes, bytes]] = {}
    for line in listing.split(b"\0"):
        meta, tab, path = line.partition(b"\t")
        fields = meta.split(b" ")
        if tab and len(fields) == 3:
            out[path] = (fields[0], fields[2] if fields[1] in (b"blob", b"commit", b"tree") else fields[1])
    return out


def _blob_id(path: Path, algorithm: str) -> bytes | None:
    """The git object id of a work-tree file as it is now (a symlink: its target), or None when it is gone
    or not a regular file or link. Read here with no filter: git's would be the config's to choose."""
    h = hashlib.new(algorithm)
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            target = os.fsencode(os.readlink(path))
            h.update(b"blob %d\0" % len(target) + target)
            return h.hexdigest().encode()
        if not stat.S_ISREG(info.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            if not stat.S_ISREG(opened.st_mode):
                return None
            h.update(b"blob %d\0" % opened.st_size)
            read = 0
            while chunk := f.read(1 << 20):
                h.update(chunk)
                read += len(chunk)
            if read != opened.st_size:  # changed while read: a digest of no state the file was in
                return None
    except OSError:
        return None
    return h.hexdigest().encode()


def project_state(folder: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The git state of the work tree holding ``folder`` (default: the current folder), or None.

    Returns:
        ``commit`` (HEAD's id, None before the first commit), ``branch`` (None when detached), ``dirty`` (whether
        a tracked or staged file differs from the commit), ``changed_files`` (how many), and ``changes_sha256``:
        a SHA-256 digest of every differing path with its current content's object id (None when clean). The
        text of a change is never read into the record.
    """
    where = Path(os.getcwd() if folder is None else folder)
    top = _git(where, "rev-parse", "--show-toplevel")
    if not top or not top.strip():
        return None
    root = Path(os.fsdecode(top.strip()))
    commit = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    branch = _git(root, "symbolic-ref", "--quiet", "--short", "HEAD")
    fmt = (_git(root, "rev-parse", "--show-object-format") or b"sha1").strip().decode("ascii", "replace")
    if fmt not in {"sha1", "sha256"}:
        return None
    tree = _git(root, "ls-tree", "-r", "-z", "--full-tree", "HEAD") if commit else b""
    index = _git(root, "ls-files", "-s", "-z")
    if tree is None or index is None:
        return None
    head, staged = _entries(tree), _entries(index)
    digest, changed = hashlib.sha256(), 0
    for path in sorted(set(head) | set(staged)):
        mode, oid = head.get(path, (b"", b""))
        index_mode, index_oid = staged.get(path, (b"", b""))
        if b"160000" in (mode, index_mode):
            continue  # a submodule: a project of its own
        now = _blob_id(root / os.fsdecode(path), fmt)
        if now is not None and now == oid == index_oid:
            continue
        changed += 1
        digest.update(b"\0".join((path, index_oid or b"unstaged", now or b"deleted", b"")))
    return {
        "commit": commit.strip().decode("ascii", "replace") if commit else None,
        "branch": os.fsdecode(branch.strip()) if branch and branch.strip() else None,
        "dirty": changed > 0,
        "changed_files": changed,
        "changes_sha256": digest.hexdigest() if changed else None,
    }


@cache
def _distributions() -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(name.lower().replace("_", "-").replace(".", "-"), dist.version)
    return tuple(sorted(found.items()))


def installed_packages() -> dict[str, str]:
    """Every installed distribution's name (normalized: lower case, ``-`` for ``_``/``.``) and version, sorted
    (read once a process: the code a process runs is the code it imported)."""
    return dict(_distributions())


def run_sources() -> dict[str, Any]:
    """What the record keeps of the user's sources as a run starts: ``project`` (:func:`project_state` of the
    current folder) and ``packages`` (:func:`installed_packages`)."""
    return {"project": project_state(), "packages": installed_packages()}
