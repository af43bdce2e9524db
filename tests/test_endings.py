"""Runs that end badly, and runs side by side: the record says what happened, the state comes back.

Every interruption is driven at a named point (the testing hook of :mod:`yolo_det.core.signals`, or a
callback), never after a sleep. Subprocess tests run ``python -m yolo_det train`` on the demo data and stop
it with SIGTERM, SIGINT or SIGHUP after the first checkpoint; the command line in process is interrupted at
every named start-up point; in-process tests stop a training from one of its callbacks and check the process
state; unit tests cover the handler itself; others cover two processes on one run folder, two threads, a
record that cannot be written and a streaming prediction.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from helpers import default_stop_signals, small_train, subprocess_env
from statecheck import assert_same_state, global_state
from yolo_det import attach
from yolo_det.cli import main
from yolo_det.core.endings import describe_ending
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.record_schema import DIGEST_NOTE
from yolo_det.core.resume import is_state_file
from yolo_det.core.runlock import LOCK_NAME, RunFolderBusy, acquire
from yolo_det.core.signals import (
    POINTS,
    TEST_HOOK_ENV,
    Terminated,
    defer_stops,
    exit_code,
    pending,
    safe_point,
    stop_signals,
)
from yolo_det.core.state import snapshot
from yolo_det.session.exclusive import ConcurrentSessionError
from yolo_det.session.session import DeterminismSession

pytestmark = pytest.mark.usefixtures("default_stop_handlers")  # whatever dispositions the runner inherited

SMALL = small_train()


# -- helpers --------------------------------------------------------------------------------------------
def start_train(project: Path, name: str, at: str, epochs: int = 3) -> subprocess.Popen[str]:
    """``python -m yolo_det train --profile repro`` on the demo data, tiny images, SIGINT at its default,
    sending itself a signal at a named safe point (``at``: ``POINT:SIGNAL``, see yolo_det.core.signals).

    Its output goes to files (``out.txt``, ``err.txt`` beside the run folder), so a stopped process never
    blocks on a full pipe; :func:`finish` reads them.
    """
    argv = [
        sys.executable,
        "-m",
        "yolo_det",
        "train",
        "--profile",
        "repro",
        f"epochs={epochs}",
        "imgsz=64",
        "plots=False",
        f"project={project}",
        f"name={name}",
        "exist_ok=True",
    ]
    project.mkdir(parents=True, exist_ok=True)
    out, err = (open(project / f"{name}.{kind}.txt", "w") for kind in ("out", "err"))
    with out, err:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            text=True,
            env=subprocess_env({TEST_HOOK_ENV: at}),
            preexec_fn=default_stop_signals,
        )


def finish(proc: subprocess.Popen[str], project: Path, name: str) -> tuple[str, str]:
    """Wait for ``proc`` (killing it after 300 s) and return its stdout and stderr."""
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return tuple((project / f"{name}.{kind}.txt").read_text() for kind in ("out", "err"))  # type: ignore[return-value]


def wait_until_stopped(proc: subprocess.Popen[str]) -> None:
    """Block until ``proc`` is stopped (SIGSTOP); fail with its output if it ended instead."""
    pid, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        raise AssertionError(f"the run ended (exit {proc.returncode}) before it stopped itself")


def digests_by_cli(files: list[str]) -> dict[str, str]:
    """``yolo-det digest FILE ...`` as the user runs it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["digest", *files])
    return {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in out.getvalue().splitlines()}


def assert_weights_true(record: dict, run: Path) -> None:
    """Every weights file on disk is listed, with the digest ``yolo-det digest`` gives for it."""
    files = record["weights"]["files"]
    on_disk = sorted(str(p) for p in (run / "weights").glob("*.pt") if not is_state_file(p))
    assert sorted(f["file"] for f in files) == on_disk
    assert on_disk
    assert all(f["written_by_this_run"] for f in files)
    assert digests_by_cli(on_disk) == {f["file"]: f["sha256"] for f in files}


def stderr_ending(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the command line stopped by a signal ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "status", "code", "line"),
    [
        (signal.SIGTERM, "terminated", 143, "yolo-det: terminated (SIGTERM)"),
        (signal.SIGINT, "interrupted", 130, "yolo-det: interrupted"),
        (signal.SIGHUP, "terminated", 129, "yolo-det: terminated (SIGHUP)"),
    ],
)
def test_cli_stopped_after_first_checkpoint(sig, status, code, line, tmp_path):
    """Stopped right after the first epoch's checkpoint: exit code, one line, the record, the lock released.

    SIGTERM comes from outside while the run holds the folder (it stops itself there first, so a second run
    can be refused meanwhile); SIGINT and SIGHUP it sends itself at that point.
    """
    runs, run = tmp_path / "runs", tmp_path / "runs" / "a"
    outside = sig == signal.SIGTERM
    proc = start_train(runs, "a", at="fit-epoch-end:" + ("SIGSTOP" if outside else signal.Signals(sig).name))
    try:
        if outside:
            wait_until_stopped(proc)
            # A second run into the same live folder is refused with one line, and writes nothing there
            # (run A is stopped meanwhile, so every change in the folder would be the second run's).
            before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
            second = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "yolo_det",
                    "train",
                    "--profile",
                    "repro",
                    "epochs=1",
                    "imgsz=64",
                    f"project={runs}",
                    "name=a",
                    "exist_ok=True",
                ],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                timeout=300,
            )
            assert second.returncode == 2, second.stderr
            assert second.stderr.strip().splitlines() == [second.stderr.strip()]
            assert f"in use by another yolo-det run (pid {proc.pid}" in second.stderr
            after = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
            changed = {p for p in before.keys() & after.keys() if before[p] != after[p]}
            changed |= after.keys() ^ before.keys()
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)  # acted on at the next safe point (this one, or the next epoch's start)
            assert not changed, changed
    finally:
        out, err = finish(proc, runs, "a")
    assert proc.returncode == code, err[-3000:]
    assert stderr_ending(err) == line
    assert "weights digest" not in out
    record = json.loads((run / RECORD_NAME).read_text())
    assert record["status"] == status
    assert record["signal"] == signal.Signals(sig).name
    assert "sha256" not in record["weights"]
    assert "ema_fp32_sha256" not in record["weights"]
    assert_weights_true(record, run)
    assert record["environment"]["argv"][1:3] == ["train", "--profile"]  # this run's record, nobody else's
    assert not (run / LOCK_NAME).exists()


# every named point from the command line's first line to the end of the first epoch
START_UP = POINTS[: POINTS.index("epoch-end") + 1]


@pytest.mark.slow
@pytest.mark.parametrize("point", START_UP)
def test_cli_interrupted_at_any_moment_of_start_up(point, tmp_path, monkeypatch, capsys):
    """SIGINT at each named moment from yolo-det's first line to the first epoch's end: 130, one line, and
    a record saying ``interrupted`` once the run folder exists (the command line, in process)."""
    monkeypatch.setenv(TEST_HOOK_ENV, f"{point}:SIGINT")
    code = main(
        [
            "train",
            "--profile",
            "repro",
            "epochs=1",
            "imgsz=64",
            "plots=False",
            f"project={tmp_path}",
            "name=s",
            "exist_ok=True",
        ]
    )
    err = capsys.readouterr().err
    assert code == 130
    assert stderr_ending(err) == "yolo-det: interrupted"
    record = tmp_path / "s" / RECORD_NAME
    if POINTS.index(point) >= POINTS.index("train-begin"):  # the run folder existed: the record says so
        assert json.loads(record.read_text())["status"] == "interrupted"
    else:
        assert not record.exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


INTERRUPT_IN_TORCH_IMPORT = """
import sys, torch
class Interrupt:  # Ctrl-C landing inside torch's lazy import of torch._dynamo (the first time only)
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == "torch._dynamo.eval_frame" and not Interrupt.fired:
            Interrupt.fired = True
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
from yolo_det.cli import main
code = main(sys.argv[1:])
print("fired", Interrupt.fired, "deterministic", torch.are_deterministic_algorithms_enabled(), flush=True)
raise SystemExit(code)
"""


@pytest.mark.slow
def test_interrupt_inside_torch_lazy_import_is_one_line_and_130(tmp_path):
    """The start-up moment the issue names: torch imports torch._dynamo lazily in use_deterministic_algorithms."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_IN_TORCH_IMPORT,
            "train",
            "--profile",
            "repro",
            "epochs=1",
            "imgsz=64",
            f"project={tmp_path}",
            "name=x",
            "exist_ok=True",
        ],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert stderr_ending(proc.stderr) == "yolo-det: interrupted"
    assert "fired True deterministic False" in proc.stdout  # it hit the import; the process state is as it was


EXEC_INTERRUPTED = """
import signal, sys
from yolo_det.core.signals import stop_signals
try:
    if sys.argv[1:] == ["yolo-det"]:
        with stop_signals():
            exec("import signal; signal.raise_signal(signal.SIGINT)")  # how dataclasses builds methods
            print("exec returned", flush=True)
    else:
        exec("import signal; signal.raise_signal(signal.SIGINT)")
except KeyboardInterrupt:
    raise SystemExit(130)
"""


def test_an_interrupt_inside_exec_waits_and_keeps_the_exit_code(tmp_path):
    """CPython remembers a KeyboardInterrupt raised in code run by ``exec``; under ``python -m`` (3.11 at
    least) it then ends the process by SIGINT instead of the exit code chosen. Under yolo-det's handler
    the interrupt is raised after ``exec`` returns, and the exit code is the one chosen."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    (tmp_path / "probe" / "__main__.py").write_text(EXEC_INTERRUPTED)
    env = subprocess_env(path=[tmp_path])

    def probe(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "probe", *args],
            env=env,
            timeout=120,
            capture_output=True,
            text=True,
            preexec_fn=default_stop_signals,
        )

    ours = probe("yolo-det")
    assert ours.returncode == 130, ours.stderr
    assert ours.stdout == "exec returned\n"
    if sys.version_info[:2] <= (3, 11):  # the interpreter's behaviour the handler avoids
        assert probe().returncode == -signal.SIGINT


# -- in process: the state comes back ----------------------------------------------------------------------
def _send_at(event: str, sig: int):
    def callback(trainer):
        signal.raise_signal(sig)  # the handler runs before this returns

    return event, callback


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "exc", "status"),
    [
        (signal.SIGTERM, Terminated, "terminated"),
        (signal.SIGINT, KeyboardInterrupt, "interrupted"),
        (signal.SIGHUP, Terminated, "terminated"),
    ],
)
def test_in_process_signal_restores_state_and_records(sig, exc, status, tmp_path, demo_data):
    from ultralytics import YOLO

    previous_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own state, to be given back
        run = tmp_path / "run"
        (run / "weights").mkdir(parents=True)
        torch.save({"w": torch.ones(3)}, run / "weights" / "epoch7.pt")  # left by an earlier run
        model = YOLO("yolov8n.yaml")
        plugin = attach(model, "repro")
        model.add_callback(*_send_at("on_model_save", sig))
        before = global_state()
        with pytest.raises(exc) as info:
            model.train(data=demo_data, project=str(tmp_path), name="run", **{**SMALL, "epochs": 2})
        # noted during the checkpoint, acted on at the next safe point
        assert "on_fit_epoch_end" in [entry.name for entry in info.traceback]
        assert_same_state(before, global_state())
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers lasted only as long as the run
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert plugin.session is None
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGHUP, previous_hup)
    record = json.loads((run / RECORD_NAME).read_text())
    assert record["status"] == status
    assert record["signal"] == signal.Signals(sig).name
    if status == "terminated":
        assert record["signal_number"] == int(sig)
    files = {Path(f["file"]).name: f for f in record["weights"]["files"]}
    assert set(files) == {"last.pt", "best.pt", "epoch7.pt"}
    assert not files.pop("epoch7.pt")["written_by_this_run"]
    for f in files.values():
        assert f["written_by_this_run"]
    for f in record["weights"]["files"]:
        assert f["sha256"] == checkpoint_digest(f["file"])


@pytest.mark.slow
def test_failed_run_names_the_error(tmp_path, demo_data):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    attach(model, "fast")

    def explode(trainer):
        raise ValueError("injected\nfailure")

    model.add_callback("on_train_epoch_start", explode)
    with pytest.raises(ValueError):
        model.train(data=demo_data, project=str(tmp_path), name="f", **SMALL)
    record = json.loads((tmp_path / "f" / RECORD_NAME).read_text())
    assert record["status"] == "failed"
    assert record["error"] == {"type": "ValueError", "message": "injected failure"}
    assert record["weights"]["files"] == []


@pytest.fixture
def default_handlers():
    """SIGINT, SIGTERM and SIGHUP at Python's defaults for the test, and put back as found afterwards."""
    defaults = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    found = {sig: signal.signal(sig, handler) for sig, handler in defaults.items()}
    yield defaults
    for sig, handler in found.items():
        signal.signal(sig, handler)


def test_stop_handlers_are_temporary_nested_and_main_thread_only(default_handlers):
    with stop_signals() as installed:
        assert installed
        for sig, default in default_handlers.items():
            assert signal.getsignal(sig) is not default
        with stop_signals() as nested:  # the outer one stays
            assert not nested
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        result: list[bool] = []
        worker = threading.Thread(target=lambda: result.append(stop_signals().__enter__()))
        worker.start()
        worker.join()
        assert result == [False]  # only the main thread can take signals
    assert {sig: signal.getsignal(sig) for sig in default_handlers} == default_handlers


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_outside_a_training_a_stop_is_raised_at_once_and_only_once(sig, code, default_handlers):
    with stop_signals():
        with pytest.raises(KeyboardInterrupt) as info:
            signal.raise_signal(sig)
        assert exit_code(info.value) == code
        assert isinstance(info.value, Terminated) == (sig != signal.SIGINT)
        signal.raise_signal(sig)  # a second one while ending is ignored: the clean-up runs
    ending = describe_ending(info.value)
    assert ending["status"] == ("interrupted" if sig == signal.SIGINT else "terminated")
    assert ending["signal"] == signal.Signals(sig).name


def test_during_a_training_a_stop_waits_for_a_safe_point(default_handlers):
    with stop_signals():
        release = defer_stops()
        signal.raise_signal(signal.SIGTERM)  # mid-batch: only noted
        assert pending() == signal.SIGTERM
        with pytest.raises(Terminated):
            safe_point("batch-end")
        assert pending() is None
        release()
        release()  # idempotent
    with stop_signals():
        release = defer_stops()
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # a second one before the safe point: at once
            signal.raise_signal(signal.SIGINT)
        release()


def test_an_error_after_a_noted_stop_ends_the_run_as_that_stop(default_handlers):
    """A rank stopped with its peers: its SIGTERM is noted mid-step, then the collective fails because a peer
    left first. The run was terminated; the error is kept beside the signal, never a ``failed`` run."""
    lost = RuntimeError("[gloo] Connection closed by peer")
    assert describe_ending(lost)["status"] == "failed"  # control: no stop noted
    with stop_signals():
        release = defer_stops()
        signal.raise_signal(signal.SIGTERM)  # mid-step: only noted
        ending = describe_ending(lost)
        release()
        with pytest.raises(Terminated):
            safe_point("batch-end")
    assert ending["status"] == "terminated"
    assert ending["signal"] == "SIGTERM"
    assert ending["error"] == {"type": "RuntimeError", "message": "[gloo] Connection closed by peer"}


def test_a_stop_inside_the_import_machinery_or_exec_waits(default_handlers, tmp_path, monkeypatch):
    class SignalDuringImport:
        def find_spec(self, name, path=None, target=None):
            if name == "yolo_det_probe_module":
                signal.raise_signal(signal.SIGINT)
            return None

    (tmp_path / "yolo_det_probe_module.py").write_text("VALUE = 1\n")
    sys.modules.pop("yolo_det_probe_module", None)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [SignalDuringImport(), *sys.meta_path])
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with stop_signals():
            import yolo_det_probe_module  # noqa: F401

            steps.append("imported")
            exec("import signal; signal.raise_signal(signal.SIGINT)")  # while the first is still pending
            steps.append("exec returned")
    assert steps == ["imported"]  # the second signal before a safe point was acted on at once
    sys.modules.pop("yolo_det_probe_module", None)
    with pytest.raises(KeyboardInterrupt):
        with stop_signals():
            exec("import signal; signal.raise_signal(signal.SIGINT)")
            steps.append("exec returned")
            assert pending() == signal.SIGINT
    assert steps == ["imported", "exec returned"]  # raised when the block ended, its first safe point


def test_user_handlers_are_called_kept_and_win(default_handlers):
    calls = []

    def mine(signum, frame):
        calls.append(signum)

    signal.signal(signal.SIGTERM, mine)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with stop_signals():
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # ignored on purpose: left alone
        signal.raise_signal(signal.SIGHUP)
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        assert calls == [signal.SIGTERM]  # theirs ran too
        signal.signal(signal.SIGINT, mine)  # set during the block: stays afterwards
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is mine
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_the_testing_hook_fires_once_at_its_point(default_handlers, monkeypatch):
    monkeypatch.setenv(TEST_HOOK_ENV, "batch-end:SIGHUP")
    with stop_signals():
        release = defer_stops()
        safe_point("batch-start")  # another point: nothing
        with pytest.raises(Terminated) as info:
            safe_point("batch-end")
        assert info.value.signal_name == "SIGHUP"
        safe_point("batch-end")  # once only
        release()


# -- restoring never replaces the error ---------------------------------------------------------------------
def test_restore_survives_a_broken_torch_dynamo(monkeypatch):
    """The interrupt that cut torch's lazy import short makes use_deterministic_algorithms raise from then on."""
    base = snapshot()
    session = DeterminismSession("repro")

    def broken(*args, **kwargs):
        raise AttributeError("module 'torch._dynamo' has no attribute 'utils'")

    with pytest.raises(KeyboardInterrupt) as info:
        with session.run():
            session.enter("train")
            assert torch.are_deterministic_algorithms_enabled()
            assert snapshot() != base
            monkeypatch.setattr(torch, "use_deterministic_algorithms", broken)
            raise KeyboardInterrupt
    assert type(info.value) is KeyboardInterrupt
    assert snapshot() == base  # the switch itself was restored without the broken import


def test_a_restore_step_that_fails_is_a_note_on_the_original_error(monkeypatch):
    from yolo_det.core import state as det_state

    base = snapshot()
    session = DeterminismSession("repro")
    session.begin()
    session.enter("train")
    real = det_state._set_env
    monkeypatch.setattr(det_state, "_set_env", lambda env: (_ for _ in ()).throw(OSError("env is gone")))
    with pytest.warns(RuntimeWarning, match="env is gone"), pytest.raises(KeyboardInterrupt) as info:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as error:
            session.end_after(error)
            raise
    assert any("env is gone" in note for note in getattr(info.value, "__notes__", []))
    monkeypatch.setattr(det_state, "_set_env", real)
    det_state._set_env(base.env)
    assert snapshot() == base  # every other step ran although one failed
    assert not session.active


# -- side by side ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def held_elsewhere(folder: Path):
    """Another process holding ``folder``'s run lock; SIGKILLed afterwards (no clean-up at all)."""
    code = (
        "import signal, sys; from yolo_det.core.runlock import acquire; acquire(sys.argv[1]); "
        "print('locked', flush=True); signal.pause()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_run_folder_lock_refuses_a_live_holder_and_ignores_a_dead_one(tmp_path):
    folder = tmp_path / "run"
    with held_elsewhere(folder) as holder:
        with pytest.raises(RunFolderBusy, match=f"in use by another yolo-det run \\(pid {holder.pid} on "):
            acquire(folder)
    assert (folder / LOCK_NAME).exists()
    with acquire(folder) as lock:  # the kernel dropped the dead holder's lock
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        with acquire(folder) as again:  # re-entrant within the process
            assert again is lock
        assert lock.held
    assert not (folder / LOCK_NAME).exists()


@pytest.mark.slow
@pytest.mark.parametrize("way", ["attach", "trainer_class"])
def test_a_live_run_folder_is_refused_before_anything_is_written(way, tmp_path, demo_data):
    from ultralytics import YOLO

    from yolo_det import trainer_class

    folder = tmp_path / "busy"
    with held_elsewhere(folder):
        model = YOLO("yolov8n.yaml")
        kwargs = {"data": demo_data, "project": str(tmp_path), "name": "busy", **SMALL}
        before = global_state()
        with pytest.raises(RunFolderBusy, match="busy' is in use by another yolo-det run"):
            if way == "attach":
                attach(model, "repro")
                model.train(**kwargs)
            else:
                model.train(trainer=trainer_class("repro"), **kwargs)
        assert_same_state(before, global_state())
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # no args.yaml, no weights folder


def test_a_second_thread_is_refused_naming_the_first(tmp_path, demo_data):
    from ultralytics import YOLO

    ready, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            session = DeterminismSession("repro")
            session.run_dir = "runs/first"
            with session.run():
                session.enter("train")
                ready.set()
                done.wait(60)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
            ready.set()

    thread = threading.Thread(target=first, name="trainer-A")
    thread.start()
    try:
        assert ready.wait(60)
        in_thread_a = snapshot()  # what thread A put in force: must be left exactly as it is
        model = YOLO("yolov8n.yaml")
        attach(model, "fast")
        with pytest.raises(
            ConcurrentSessionError, match="profile 'repro' in thread 'trainer-A', run folder 'runs/first'"
        ):
            model.train(data=demo_data, project=str(tmp_path), name="b", **SMALL)
        assert snapshot() == in_thread_a
        assert not (tmp_path / "b").exists()
        with pytest.raises(ConcurrentSessionError):
            DeterminismSession("balanced").begin()
    finally:
        done.set()
        thread.join()
    assert not errors
    # Once the first has ended, the second can run; sessions of one thread still nest.
    outer, inner = DeterminismSession("repro"), DeterminismSession("fast")
    base = snapshot()
    with outer.run():
        outer.enter("train")
        with inner.run():
            inner.enter("deploy")
        assert snapshot().mode == "strict"
    assert snapshot() == base


@pytest.mark.slow
def test_record_that_cannot_be_written_is_a_warning_after_the_digest(tmp_path):
    run = tmp_path / "runs" / "ro"
    (run / RECORD_NAME).mkdir(parents=True)  # determinism.json is a directory
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(
            [
                "train",
                "--profile",
                "fast",
                "epochs=1",
                "imgsz=64",
                "plots=False",
                f"project={tmp_path / 'runs'}",
                "name=ro",
                "exist_ok=True",
            ]
        )
    assert code == 0
    lines = [
        line
        for line in out.getvalue().splitlines()
        if line.startswith(("weights digest", "yolo-det: warning", "yolo-det: error", "determinism record"))
    ]
    digest = checkpoint_digest(run / "weights" / "last.pt")
    assert lines[0] == f"weights digest: {digest} ({DIGEST_NOTE})"
    assert lines[1].startswith(f"yolo-det: warning: could not write {RECORD_NAME} in '{run}'")
    assert len(lines) == 2
    assert (run / RECORD_NAME).is_dir()


# -- streaming prediction -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_streaming_predict_applies_deploy_only_while_the_generator_runs(demo_data):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    attach(model, "fast")
    inside: list[str] = []
    model.add_callback("on_predict_batch_start", lambda p: inside.append(snapshot().mode))
    images = str(Path(demo_data).parent / "demo" / "images" / "val")  # a folder: one image per batch
    count = len(list(Path(images).glob("*.png")))

    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own state
    # the thread count of a prediction is Ultralytics' (its predictor sets NUM_THREADS when it is built, and later
    # calls reuse it): yolo-det neither changes nor gives it back there (attach._without_threads)
    from ultralytics.utils import NUM_THREADS

    torch.set_num_threads(NUM_THREADS)
    before = global_state()
    seen = 0
    for _ in model.predict(images, imgsz=64, device="cpu", verbose=False, stream=True, batch=1):
        assert_same_state(before, global_state())  # the loop body is the user's code: their state
        seen += 1
        if seen == 2:
            torch.use_deterministic_algorithms(False)  # the user changes their state between items
            before = global_state()
    assert seen == count > 2
    assert inside == ["strict"] * count
    assert_same_state(before, global_state())  # what they changed is what they get back

    torch.use_deterministic_algorithms(True)
    before = global_state()
    stream = model.predict(images, imgsz=64, device="cpu", verbose=False, stream=True, batch=1)
    next(stream)
    assert_same_state(before, global_state())
    stream.close()  # abandoned half-way
    assert_same_state(before, global_state())
    assert model._yolo_det_plugin.session is None
