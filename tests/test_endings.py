"""Runs that end badly, and runs side by side: the record says what happened, the state comes back.

Subprocess tests run ``python -m yolo_det train`` on the demo data and stop it with SIGTERM or SIGINT
(after the first checkpoint, and at a sweep of start-up moments); in-process tests stop a training
from one of its callbacks and check the process state; others cover two processes on one run folder,
two threads, a record that cannot be written and a streaming prediction.
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
import time
from pathlib import Path

import pytest
import torch

from statecheck import assert_same_state, global_state
from yolo_det import attach
from yolo_det.cli import main
from yolo_det.core.record import RECORD_NAME, checkpoint_digest
from yolo_det.core.resume import is_state_file
from yolo_det.core.runlock import LOCK_NAME, RunFolderBusy, acquire
from yolo_det.core.signals import Terminated, terminate_as_interrupt
from yolo_det.core.state import snapshot
from yolo_det.session.exclusive import ConcurrentSessionError
from yolo_det.session.session import DeterminismSession

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"epochs": 1, "imgsz": 64, "batch": 16, "device": "cpu", "workers": 0, "plots": False, "exist_ok": True}


# -- helpers --------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["YOLO_OFFLINE"] = "1"
    env.pop("YOLO_DET_DEBUG", None)
    return env


def start_train(project: Path, name: str, epochs: int = 50) -> subprocess.Popen[str]:
    """``python -m yolo_det train --profile repro`` on the demo data, tiny images, SIGINT at its default.

    50 epochs by default: long enough to still run when a test stops it (it never runs to the end).
    """
    argv = [sys.executable, "-m", "yolo_det", "train", "--profile", "repro", f"epochs={epochs}", "imgsz=64",
            "plots=False", f"project={project}", f"name={name}", "exist_ok=True"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_stable(path: Path, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    """Wait until ``path`` exists and its size stopped changing (Ultralytics writes checkpoints in place)."""
    deadline, size = time.time() + timeout, -1
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if path.is_file():
            now = path.stat().st_size
            if now == size:
                return
            size = now
        time.sleep(0.3)
    raise AssertionError(f"{path} never appeared")


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
    assert sorted(f["file"] for f in files) == on_disk and on_disk
    assert all(f["written_by_this_run"] for f in files)
    assert digests_by_cli(on_disk) == {f["file"]: f["sha256"] for f in files}


def stderr_ending(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the command line stopped by a signal ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("sig", "status", "code", "line"), [
    (signal.SIGTERM, "terminated", 143, "yolo-det: terminated (SIGTERM)"),
    (signal.SIGINT, "interrupted", 130, "yolo-det: interrupted"),
])
def test_cli_stopped_after_first_checkpoint(sig, status, code, line, tmp_path):
    run = tmp_path / "runs" / "a"
    proc = start_train(tmp_path / "runs", "a")
    try:
        wait_for_stable(run / "weights" / "last.pt", proc)
        if sig == signal.SIGTERM:
            # A second run into the same live folder is refused with one line, and writes nothing there
            # (run A is stopped meanwhile, so every change in the folder would be the second run's).
            proc.send_signal(signal.SIGSTOP)
            before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
            second = subprocess.run([sys.executable, "-m", "yolo_det", "train", "--profile", "repro", "epochs=1",
                                     "imgsz=64", f"project={tmp_path / 'runs'}", "name=a", "exist_ok=True"],
                                    capture_output=True, text=True, env=_env(), timeout=300)
            assert second.returncode == 2, second.stderr
            assert second.stderr.strip().splitlines() == [second.stderr.strip()]
            assert f"in use by another yolo-det run (pid {proc.pid}" in second.stderr
            after = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
            changed = {p for p in before.keys() & after.keys() if before[p] != after[p]}
            changed |= after.keys() ^ before.keys()
            proc.send_signal(signal.SIGCONT)
            assert not changed, changed
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err[-3000:]
    assert stderr_ending(err) == line
    assert "weights sha256" not in out
    record = json.loads((run / RECORD_NAME).read_text())
    assert record["status"] == status and record["signal"] == signal.Signals(sig).name
    assert "sha256" not in record["weights"] and "ema_fp32_sha256" not in record["weights"]
    assert_weights_true(record, run)
    assert record["environment"]["argv"][1:3] == ["train", "--profile"]  # this run's record, nobody else's
    assert not (run / LOCK_NAME).exists()


@pytest.mark.slow
def test_cli_interrupted_at_any_moment_of_start_up(tmp_path):
    """SIGINT at moments from yolo-det's first line to the first epoch: exit 130, one line, never a traceback.

    (The first 0.3 s cover the interpreter's own start-up, before any yolo-det code can run.)
    """
    results = []
    for i, delay in enumerate((0.3, 0.6, 1.0, 1.6, 2.3, 3.2, 4.5, 6.0)):
        proc = start_train(tmp_path / "runs", f"s{i}", epochs=1)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
        results.append((delay, proc.returncode, stderr_ending(err)))
        record = tmp_path / "runs" / f"s{i}" / RECORD_NAME
        if record.exists():  # stopped after the run folder existed: the record says so
            assert json.loads(record.read_text())["status"] == "interrupted"
    assert [r for r in results if r[1:] != (130, "yolo-det: interrupted")] == []


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
    proc = subprocess.run([sys.executable, "-c", INTERRUPT_IN_TORCH_IMPORT, "train", "--profile", "repro", "epochs=1",
                           "imgsz=64", f"project={tmp_path}", "name=x", "exist_ok=True"],
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert stderr_ending(proc.stderr) == "yolo-det: interrupted"
    assert "fired True deterministic False" in proc.stdout  # it hit the import; the process state is as it was


EXEC_INTERRUPTED = """
import os, signal, sys
from yolo_det.core.signals import forget_handled_interrupt
try:
    exec("import os, signal; os.kill(os.getpid(), signal.SIGINT)")  # how dataclasses builds methods
except KeyboardInterrupt:
    if sys.argv[1:] == ["forget"]:
        forget_handled_interrupt()
raise SystemExit(130)
"""


@pytest.mark.parametrize("forget", [False, True])
def test_an_interrupt_handled_inside_exec_keeps_the_exit_code(forget, tmp_path):
    """CPython remembers a KeyboardInterrupt raised in a string exec; under ``python -m`` it then ends the
    process by SIGINT instead of the exit code chosen. The command line makes it forget a handled one."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    (tmp_path / "probe" / "__main__.py").write_text(EXEC_INTERRUPTED)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-m", "probe", *(["forget"] if forget else [])], env=env, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if forget:
        assert proc.returncode == 130
    elif sys.version_info[:2] <= (3, 11):  # the interpreter's behaviour the helper exists for
        assert proc.returncode == -signal.SIGINT


# -- in process: the state comes back ----------------------------------------------------------------------
def _send_at(event: str, sig: int):
    def callback(trainer):
        os.kill(os.getpid(), sig)

    return event, callback


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "exc", "status"), [
    (signal.SIGTERM, Terminated, "terminated"),
    (signal.SIGINT, KeyboardInterrupt, "interrupted"),
])
def test_in_process_signal_restores_state_and_records(sig, exc, status, tmp_path, demo_data):
    from ultralytics import YOLO

    previous_term = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own state, to be given back
        run = tmp_path / "run"
        (run / "weights").mkdir(parents=True)
        torch.save({"w": torch.ones(3)}, run / "weights" / "epoch7.pt")  # left by an earlier run
        model = YOLO("yolov8n.yaml")
        plugin = attach(model, "repro")
        model.add_callback(*_send_at("on_model_save", sig))
        before = global_state()
        with pytest.raises(exc):
            model.train(data=demo_data, project=str(tmp_path), name="run", **{**SMALL, "epochs": 2})
        assert_same_state(before, global_state())
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler lasted only as long as the run
        assert plugin.session is None
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    record = json.loads((run / RECORD_NAME).read_text())
    assert record["status"] == status and record["signal"] == signal.Signals(sig).name
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


def test_terminate_handler_is_temporary_and_leaves_user_handlers_alone():
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with terminate_as_interrupt() as installed:
            assert installed and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            with terminate_as_interrupt() as nested:  # the outer one stays
                assert not nested
            with pytest.raises(Terminated) as info:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler runs between bytecodes
            assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while ending is ignored
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def mine(signum, frame):  # the user's own handler wins
            pass

        signal.signal(signal.SIGTERM, mine)
        with terminate_as_interrupt() as installed:
            assert not installed and signal.getsignal(signal.SIGTERM) is mine
        result: list[bool] = []
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        worker = threading.Thread(target=lambda: result.append(terminate_as_interrupt().__enter__()))
        worker.start()
        worker.join()
        assert result == [False]  # only the main thread can take signals
    finally:
        signal.signal(signal.SIGTERM, previous)


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
            assert torch.are_deterministic_algorithms_enabled() and snapshot() != base
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
    code = ("import sys, time; from yolo_det.core.runlock import acquire; acquire(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, env=_env())
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
        with pytest.raises(ConcurrentSessionError,
                           match="profile 'repro' in thread 'trainer-A', run folder 'runs/first'"):
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
        code = main(["train", "--profile", "fast", "epochs=1", "imgsz=64", "plots=False",
                     f"project={tmp_path / 'runs'}", "name=ro", "exist_ok=True"])
    assert code == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith(("weights sha256", "yolo-det:",
                                                                             "determinism record"))]
    digest = checkpoint_digest(run / "weights" / "last.pt")
    assert lines[0] == f"weights sha256: {digest}"
    assert lines[1].startswith(f"yolo-det: warning: could not write {RECORD_NAME} in '{run}'") and len(lines) == 2
    assert (run / RECORD_NAME).is_dir()


# -- streaming prediction -------------------------------------------------------------------------------------
def test_streaming_predict_applies_deploy_only_while_the_generator_runs(demo_data):
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    attach(model, "fast")
    inside: list[str] = []
    model.add_callback("on_predict_batch_start", lambda p: inside.append(snapshot().mode))
    images = str(Path(demo_data).parent / "demo" / "images" / "val")  # a folder: one image per batch
    count = len(list(Path(images).glob("*.png")))

    torch.use_deterministic_algorithms(True, warn_only=True)  # the user's own state
    before = global_state()
    seen = 0
    for _ in model.predict(images, imgsz=64, device="cpu", verbose=False, stream=True, batch=1):
        assert_same_state(before, global_state())  # the loop body is the user's code: their state
        seen += 1
        if seen == 2:
            torch.use_deterministic_algorithms(False)  # the user changes their state between items
            before = global_state()
    assert seen == count > 2 and inside == ["strict"] * count  # fast's deploy phase, in force inside the generator
    assert_same_state(before, global_state())  # what they changed is what they get back

    torch.use_deterministic_algorithms(True)
    before = global_state()
    stream = model.predict(images, imgsz=64, device="cpu", verbose=False, stream=True, batch=1)
    next(stream)
    assert_same_state(before, global_state())
    stream.close()  # abandoned half-way
    assert_same_state(before, global_state())
    assert model._yolo_det_plugin.session is None
