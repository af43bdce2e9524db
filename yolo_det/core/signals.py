"""Stop signals acted on at safe points.

Schedulers, ``timeout``, Docker and Kubernetes stop a process with SIGTERM, a closed terminal sends
SIGHUP, a user presses Ctrl-C (SIGINT). SIGTERM's and SIGHUP's default action kills Python without
running a single ``finally`` (no state restored, no record written), and Python's SIGINT raises
:class:`KeyboardInterrupt` at whatever bytecode runs, also inside the import machinery or code built by
``exec``, where CPython can swallow it or remember it past the ``except`` that handled it.

While :func:`stop_signals` is active (a command of the command line, a ``model.train()``), yolo-det's
handler takes these three signals and only *notes* the stop. The stop is acted on, by raising
:class:`KeyboardInterrupt` (SIGINT) or :class:`Terminated` (SIGTERM, SIGHUP; a ``KeyboardInterrupt``
subclass, so every clean-up that runs for Ctrl-C runs for it too), at a *safe point*:

- during a training (between :func:`defer_stops` and its release: from the moment the train phase is
  entered until the run ends), at the next :func:`safe_point`: a batch or epoch boundary (a stop noted
  after the last one lets the run finish and is raised when the :func:`stop_signals` block ends);
- outside a training, at once, from the handler, unless the signal landed in the import machinery or in
  code run by ``exec``; then at the next :func:`safe_point` or when the :func:`stop_signals` block ends.

A second stop signal while a stop is noted but not yet acted on is acted on at once (press Ctrl-C twice
to leave a long batch); once a stop was raised, further stop signals are ignored (the clean-up is
running; a scheduler that wants the process gone sends SIGKILL).

Handlers the user installed are kept: theirs is called after the stop is noted (a signal set to
``SIG_IGN`` is left ignored, and yolo-det installs nothing for it). Handlers are installed only in the
main thread, and each is put back when the outermost block ends, unless the user replaced it meanwhile.

Testing hook: ``YOLO_DET_TEST_SIGNAL_AT=POINT[@N][:SIGNAL]`` (``SIGINT`` by default) makes the process send
itself the signal the first (``N``-th) time it reaches the safe point named ``POINT`` (:data:`POINTS`) while
:func:`stop_signals` is active (once per outermost block), so tests
stop a run at a named moment instead of after a sleep. With ``YOLO_DET_TEST_SIGNAL_RANK=R`` only the process of
global rank ``R`` (``RANK``) at its first start (``TORCHELASTIC_RESTART_COUNT`` unset or 0) does so: one worker
of a torchrun job, not the workers torchrun starts again; with ``YOLO_DET_TEST_SIGNAL_AGENT=1`` that worker sends the
signal to its torchrun agent first (a machine lost).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["POINTS", "TEST_HOOK_ENV", "Terminated", "defer_stops", "exit_code", "pending", "safe_point", "stop_signals"]

#: The environment variable of the testing hook.
TEST_HOOK_ENV = "YOLO_DET_TEST_SIGNAL_AT"
#: The testing hook's rank filter (see the module docstring).
TEST_HOOK_RANK_ENV = "YOLO_DET_TEST_SIGNAL_RANK"
#: With ``YOLO_DET_TEST_SIGNAL_AGENT=1`` a torchrun worker sends the signal to its agent first (a machine lost).
TEST_HOOK_AGENT_ENV = "YOLO_DET_TEST_SIGNAL_AGENT"


def _hook_applies() -> bool:
    wanted = os.environ.get(TEST_HOOK_RANK_ENV)
    if wanted is None:
        return True
    return os.environ.get("RANK") == wanted and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


#: The named safe points, in the order a command-line training reaches them.
POINTS = (
    "cli-start",  # the command line's first line, handlers installed
    "cli-parsed",  # arguments parsed, the command's module imported
    "train-begin",  # Ultralytics: on_pretrain_routine_start (the train phase is entered)
    "train-setup",  # Ultralytics: on_pretrain_routine_end (model, data loaders built)
    "train-start",  # Ultralytics: on_train_start
    "epoch-start",  # on_train_epoch_start
    "batch-start",  # on_train_batch_start; YOLOv5: each backward
    "batch-end",  # on_train_batch_end
    "epoch-end",  # on_train_epoch_end (before validation and the checkpoint)
    "states-gathering",  # on_train_epoch_end, a job's ranks: each rank's state captured, not yet sent to rank 0
    "fit-epoch-end",  # on_fit_epoch_end (after the epoch's checkpoint and resume state)
    "cli-end",  # the command returned
)

_STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Terminated(KeyboardInterrupt):
    """A run stopped by SIGTERM or SIGHUP while yolo-det's handler was installed.

    Attributes:
        signum: The signal number.
        signal_name: Its name (``SIGTERM``, ``SIGHUP``).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        super().__init__(f"terminated by {self.signal_name}")

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (143 for SIGTERM, 129 for SIGHUP), the shell's convention for a signal."""
        return 128 + self.signum


def exit_code(exc: BaseException) -> int:
    """The CLI exit code for an interruption: ``128 + signum`` for :class:`Terminated`, else 130 (SIGINT)."""
    return exc.exit_code if isinstance(exc, Terminated) else 128 + int(signal.SIGINT)


class _Stops:
    """The process's stop state while :func:`stop_signals` is active (main thread only)."""

    def __init__(self) -> None:
        self.depth = 0  # nested stop_signals blocks
        self.previous: dict[int, Any] = {}  # signum -> the handler found (put back at the end)
        self.deferring = 0  # nested trainings in progress
        self.pending: int | None = None  # a stop noted, not yet acted on
        self.raised = False  # a stop was acted on: the run is ending
        self.fired: set[str] = set()  # testing hook: points fired in this block
        self.reached: dict[str, int] = {}  # testing hook: times each point was reached in this block
        self.outer: set[int] = set()  # the frames that entered the outermost block (outside it)

    def reset(self) -> None:
        self.previous.clear()
        self.deferring = 0
        self.pending = None
        self.raised = False
        self.fired.clear()
        self.reached.clear()
        self.outer.clear()


_STOPS = _Stops()


def _exception(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _unsafe(frame: FrameType | None) -> bool:
    """Whether ``frame`` (or a caller inside the :func:`stop_signals` block) is the import machinery or code run
    by ``exec``. The frames that entered the block are not looked at: a program that is itself run by ``exec``
    (a test runner's worker, an embedding application) is not inside an ``exec`` the block started."""
    outer = _STOPS.outer
    while frame is not None and id(frame) not in outer:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib"):
            return True
        if name == "<string>" and frame.f_back is not None:  # exec'd (``python -c`` code is the outermost)
            return True
        frame = frame.f_back
    return False


def _raise_pending() -> None:
    signum, _STOPS.pending = _STOPS.pending, None
    if signum is not None and not _STOPS.raised:
        _STOPS.raised = True
        raise _exception(signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    stops = _STOPS
    again = stops.pending is not None
    if not stops.raised and not again:
        stops.pending = signum
    user = stops.previous.get(signum)
    if callable(user) and user is not signal.default_int_handler:
        user(signum, frame)  # the user's handler still runs (it may raise: their choice)
    if stops.raised or stops.depth == 0:
        return
    if again:  # a second signal before the first was acted on: now
        stops.pending = None
        stops.raised = True
        raise _exception(signum)
    if stops.deferring == 0 and not _unsafe(frame):
        _raise_pending()


@contextmanager
def stop_signals() -> Iterator[bool]:
    """Take SIGINT, SIGTERM and SIGHUP for the block; act on them at safe points (see the module).

    Nested blocks leave the outer block's handlers in place. A stop still pending when the outermost
    block ends without an error is raised there.

    Yields:
        Whether this block installed the handlers (False in a nested block or outside the main thread).
    """
    stops = _STOPS
    main = threading.current_thread() is threading.main_thread()
    if stops.depth or not main:
        yield False
        if main and stops.deferring == 0:
            _raise_pending()
        return
    installed: dict[int, Any] = {}
    try:
        for sig in _STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current is None:  # ignored on purpose, or not set from Python
                continue
            installed[int(sig)] = current
            signal.signal(sig, _handler)
        stops.previous.update(installed)
        caller: FrameType | None = sys._getframe(1)
        while caller is not None:  # alive for the whole block: their ids cannot be reused meanwhile
            stops.outer.add(id(caller))
            caller = caller.f_back
        stops.depth = 1
        yield True
        _raise_pending()
    finally:
        stops.depth = 0
        for signum, previous in installed.items():
            if signal.getsignal(signum) is _handler:  # a handler the user set during the block stays
                signal.signal(signum, previous)
        stops.reset()


def defer_stops() -> Callable[[], None]:
    """Note stops instead of raising them at once until the returned function is called (a training).

    The returned function is idempotent; it never raises. Outside a :func:`stop_signals` block nothing
    is deferred (no handler of ours would note a stop), so a training that never ends cleanly cannot
    leave a deferral behind for a later block.
    """
    if _STOPS.depth == 0:
        return lambda: None
    _STOPS.deferring += 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            _STOPS.deferring = max(0, _STOPS.deferring - 1)

    return release


def pending() -> int | None:
    """The number of the stop signal noted and not yet acted on, if any."""
    return _STOPS.pending


def safe_point(name: str) -> None:
    """A point where a noted stop is acted on (raised); the testing hook's ``POINT`` names it.

    Raises:
        KeyboardInterrupt: a SIGINT was noted (:class:`Terminated` for SIGTERM or SIGHUP).
    """
    hook = os.environ.get(TEST_HOOK_ENV)
    if hook and _STOPS.depth and name not in _STOPS.fired and _hook_applies():
        point, _, sig = hook.partition(":")
        point, _, nth = point.partition("@")
        if point == name:
            _STOPS.reached[name] = _STOPS.reached.get(name, 0) + 1
        if point == name and _STOPS.reached[name] >= (int(nth) if nth.isdigit() else 1):
            _STOPS.fired.add(name)
            if os.environ.get(TEST_HOOK_AGENT_ENV) == "1" and os.environ.get("TORCHELASTIC_RUN_ID"):
                os.kill(os.getppid(), getattr(signal, sig or "SIGINT"))  # the torchrun agent too: a machine lost
            signal.raise_signal(getattr(signal, sig or "SIGINT"))  # handlers run before this returns
    if _STOPS.depth and _STOPS.pending is not None and threading.current_thread() is threading.main_thread():
        _raise_pending()
