"""SIGTERM handled like Ctrl-C while a run is in progress.

Schedulers, ``timeout``, Docker and Kubernetes stop a process with SIGTERM, whose default action kills
Python without running a single ``finally``: no state restored, no record written. While
:func:`terminate_as_interrupt` is active (the duration of a training run), SIGTERM raises
:class:`Terminated` in the main thread instead, a :class:`KeyboardInterrupt` subclass, so every clean-up
that runs for Ctrl-C runs for it too and the record can say ``terminated``.

The handler is installed only when it can be given back exactly: in the main thread, and only where
SIGTERM still has its default action (a handler or ``SIG_IGN`` the user set wins and is left alone).
The previous handler is restored when the block ends. A second SIGTERM while the run is already ending
is ignored (the clean-up is running; a scheduler that wants the process gone sends SIGKILL).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Terminated", "exit_code", "forget_handled_interrupt", "terminate_as_interrupt"]

_installed = False


class Terminated(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM) while yolo-det's handler was installed.

    Attributes:
        signum: The signal number.
        signal_name: Its name (``SIGTERM``).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        super().__init__(f"terminated by {self.signal_name}")

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (143 for SIGTERM), the shell's convention for a process ended by a signal."""
        return 128 + self.signum


def exit_code(exc: BaseException) -> int:
    """The CLI exit code for an interruption: ``128 + signum`` for :class:`Terminated`, else 130 (SIGINT)."""
    return exc.exit_code if isinstance(exc, Terminated) else 128 + int(signal.SIGINT)


@contextmanager
def terminate_as_interrupt() -> Iterator[bool]:
    """Raise :class:`Terminated` on SIGTERM for the duration of the block (main thread, default handler only).

    Nested blocks leave the outer block's handler in place.

    Yields:
        Whether this block installed the handler.
    """
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield False
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:  # already ending: let the clean-up finish
            return
        raised = True
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    _installed = True
    try:
        yield True
    finally:
        _installed = False
        signal.signal(signal.SIGTERM, previous)


def forget_handled_interrupt() -> None:
    """Tell CPython that the KeyboardInterrupt just handled was handled.

    CPython (3.8 to 3.11 at least) sets an internal flag when a KeyboardInterrupt leaves code run from a
    string by ``exec`` (``dataclasses`` builds its methods that way, so an interrupt during an import can
    land there), and keeps it even when the interrupt is caught further up; ``python -m`` then ends the
    process by killing it with SIGINT instead of exiting with the code the program returned. The command
    line calls this after it has handled an interrupt, so its exit code is the one it chose. Does
    nothing where the flag cannot be found.
    """
    try:
        import ctypes

        flag = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except Exception:  # another interpreter or version: nothing to forget
        return
    flag.value = 0
