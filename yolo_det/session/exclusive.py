"""One active determinism session per process.

Torch's determinism switches, cuDNN and TF32 flags, the environment and ``warnings.showwarning`` are
process-wide: two sessions applying their phases from two threads at once would each run under the
other's flags, record the other's state and restore each other's baseline. So a session that begins
while a session of *another thread* is active is refused with :class:`ConcurrentSessionError`, naming
the active one (profile, thread, run folder); nothing of the active session is touched. Sessions of the
*same* thread nest as before (an inner session starts from, and gives back, the state the outer one
has in force). Threads that must train under profiles run one after the other.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.errors import YoloDetError

__all__ = ["ConcurrentSessionError", "claim", "release"]

_lock = threading.Lock()
_active: list[tuple[Any, threading.Thread]] = []


class ConcurrentSessionError(YoloDetError):
    """A session began while another thread's session is active."""


def _describe(session: Any, thread: threading.Thread) -> str:
    profile = getattr(getattr(session, "profile", None), "name", "?")
    run_dir = getattr(session, "run_dir", None)
    where = f", run folder '{run_dir}'" if run_dir else ""
    return f"profile '{profile}' in thread '{thread.name}'{where}"


def claim(session: Any) -> None:
    """Register ``session`` as active in the calling thread.

    Raises:
        ConcurrentSessionError: A session of another thread is active.
    """
    me = threading.current_thread()
    with _lock:
        _active[:] = [(s, t) for s, t in _active if t.is_alive()]  # a thread that died mid-session holds nothing
        for other, thread in _active:
            if thread is not me and thread.is_alive():
                raise ConcurrentSessionError(
                    f"another yolo-det session is active in this process ({_describe(other, thread)}); torch's "
                    f"determinism flags are process-wide, so the session for profile "
                    f"'{getattr(getattr(session, 'profile', None), 'name', '?')}' in thread '{me.name}' cannot "
                    "run at the same time: run them one after the other, or in separate processes"
                )
        _active.append((session, me))


def release(session: Any) -> None:
    """Forget ``session`` (no-op when it is not registered)."""
    with _lock:
        _active[:] = [(s, t) for s, t in _active if s is not session]
