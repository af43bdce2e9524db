"""An installed wheel works like a clone: examples ship in the package, demo data goes to the user cache, files get
normal modes."""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from yolo_det.core.fileio import atomic_write_text, new_file_mode
from yolo_det.tools import demo

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_new_files_get_the_modes_of_open_and_replaced_files_keep_theirs(tmp_path, mask):
    with _umask(mask):
        assert new_file_mode() == 0o666 & ~mask
        path = atomic_write_text(tmp_path / "a.yaml", "x: 1\n")
        assert _mode(path) == 0o666 & ~mask
        os.chmod(path, 0o600)
        atomic_write_text(path, "x: 2\n")
        assert _mode(path) == 0o600
        assert path.read_text() == "x: 2\n"
        out = demo.generate(tmp_path / "demo", n_train=1, n_val=1)
        files = [p for p in (tmp_path / "demo").rglob("*") if p.is_file()] + [out]
        assert len(files) == 5
        assert {_mode(p) for p in files} == {0o666 & ~mask}
        assert not list(tmp_path.rglob(".*.tmp"))


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_resume_states_and_patched_files_get_the_same_modes(tmp_path, mask):
    """Every writer goes through core.fileio: a resume state (torch.save) gets the umask mode too."""
    from yolo_det.core.fileio import atomic_file
    from yolo_det.core.resume import save_state

    with _umask(mask):
        state = save_state(tmp_path / "weights" / "yolo-det-resume.last.pt", {"epoch": 1})
        assert _mode(state) == 0o666 & ~mask
        os.chmod(state, 0o640)
        save_state(state, {"epoch": 2})
        assert _mode(state) == 0o640
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "half.bin") as f:
        f.write(b"half")
        raise KeyboardInterrupt  # interrupted mid-write: nothing left, no temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights"]
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["yolo-det-resume.last.pt"]


def test_an_installed_package_writes_demo_data_into_the_user_cache(tmp_path, monkeypatch):
    """Outside a source checkout (a wheel in site-packages), the demo data goes to the cache, never beside the
    package."""
    site = tmp_path / "site-packages"
    (site / "data").mkdir(parents=True)  # what another package may have put there
    monkeypatch.setattr(demo, "_REPO_DATA", site / "data")
    monkeypatch.setenv("YOLO_DET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "N_TRAIN", 2)
    monkeypatch.setattr(demo, "N_VAL", 1)
    monkeypatch.setattr(demo.generate, "__kwdefaults__", {"n_train": 2, "n_val": 1, "seed": 0})
    assert demo.default_demo_folder() == tmp_path / "cache" / "demo"
    path = demo.demo_data_yaml()
    assert path == tmp_path / "cache" / "demo.yaml"
    assert (tmp_path / "cache" / "demo" / ".complete").is_file()
    assert demo.main([]) == 0
    assert list((site / "data").iterdir()) == []
    assert demo.demo_data_yaml() == path  # generated once


def test_examples_are_package_files_and_resolve_by_name(tmp_path, monkeypatch):
    from yolo_det.analysis.models import EXAMPLES, example_names, resolve_model_yaml

    assert EXAMPLES.parent.parent == ROOT / "yolo_det"
    assert "cbam-max.yaml" in example_names()
    monkeypatch.chdir(tmp_path)
    assert resolve_model_yaml("cbam-max.yaml") == (EXAMPLES / "cbam-max.yaml").resolve()
    (tmp_path / "cbam-max.yaml").write_text("nc: 1\n")  # a file in the current folder wins
    assert resolve_model_yaml("cbam-max.yaml") == (tmp_path / "cbam-max.yaml").resolve()
    assert resolve_model_yaml("no-such-model.yaml") is None


def _source_copy(dst: Path) -> Path:
    """The files a wheel is built from, copied so that building writes nothing into the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    for package in ("yolo_det", "yolo_det_zoo"):
        shutil.copytree(ROOT / package, dst / package, ignore=ignore)
    return dst


@pytest.mark.slow
def test_wheel_install_trains_from_an_empty_folder(tmp_path):
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = before.ru_utime + before.ru_stime
    times = {}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        YOLO_OFFLINE="1",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        YOLO_DET_CACHE=str(tmp_path / "cache"),
        YOLO_CONFIG_DIR=str(tmp_path / "ultralytics"),
    )
    src = _source_copy(tmp_path / "src")
    (src.parent / "dist").mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("yolo_det-*.whl")
    times["wheel"] = time.perf_counter() - started
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # the current environment's packages (torch, ultralytics, ...), seen after the venv's own (a venv made from
    # inside a venv with --system-site-packages would see the base interpreter's instead)
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "_current_env.pth").write_text("\n".join(ours) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        env=env,
        timeout=300,
    )
    times["install"] = time.perf_counter() - started
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = (
        subprocess.run(
            [
                str(python),
                "-c",
                "import yolo_det; from yolo_det.analysis.models import resolve_model_yaml as r; "
                "print('PATHS', yolo_det.__file__, r('cbam-max.yaml'))",
            ],
            check=True,
            env=env,
            cwd=empty,
            capture_output=True,
            text=True,
        )
        .stdout.split("PATHS ")[-1]
        .split()
    )
    assert probe[0].startswith(purelib)
    assert probe[1].startswith(purelib)

    proc = subprocess.run(
        [str(venv / "bin" / "yolo-det"), "train", "--profile", "repro", "epochs=1"],
        env=env,
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(0o022),
    )
    times["train"] = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "weights digest: " in proc.stdout
    demo_yaml = tmp_path / "cache" / "demo.yaml"
    assert demo_yaml.is_file()
    assert _mode(demo_yaml) == 0o644
    images = list((tmp_path / "cache" / "demo" / "images" / "train").glob("*.png"))
    assert len(images) == demo.N_TRAIN
    assert {_mode(p) for p in images} == {0o644}
    assert not (Path(purelib) / "data").exists()  # nothing written beside the package
    record = Path(proc.stdout.split("determinism record: ")[-1].split()[0])
    assert record.is_file()
    assert _mode(record) == 0o644
    # The budget is CPU time (what the test costs), not wall time (which a loaded shared machine stretches).
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    print(f"wheel smoke test: {cpu:.1f} s of CPU; wall clock at each stage: {times}")
    assert cpu < 60, f"the wheel smoke test used {cpu:.0f} s of CPU (wall times: {times})"


def _stub_distribution(site: Path, name: str, version: str) -> None:
    """An installed distribution as pip sees one (its metadata only): what a user's environment holds."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")


def _resolve_into(tmp_path: Path, wheel: Path, installed: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """pip's resolver (``--dry-run --report``, no index) installing ``wheel`` into a venv holding ``installed``."""
    venv = tmp_path / f"venv-{len(list(tmp_path.glob('venv-*')))}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for name, version in installed.items():
        _stub_distribution(Path(purelib), name, version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")  # no site index, links or constraints
    report = tmp_path / "report.json"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--dry-run",
            "--no-index",
            "--report",
            str(report),
            "--quiet",
            str(wheel),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


#: The oldest versions pyproject.toml accepts, and what else the wheel requires, as a user's environment has them.
OLDEST = {
    "torch": "2.4.1",
    "torchvision": "0.19.1",
    "ultralytics": "8.3.0",
    "PyYAML": "6.0.1",
    "opencv-python": "4.6.0.66",
    "numpy": "1.26.4",
    "matplotlib": "3.8.0",
    "ruamel.yaml": "0.18.6",
    "cloudpickle": "3.1.1",
}


@pytest.mark.slow
def test_installing_the_wheel_keeps_the_users_older_torch_and_ultralytics(tmp_path):
    """pip's own resolver, given the built wheel and an environment with the oldest supported torch and
    Ultralytics, installs yolo-det alone; a torch below the range makes it ask for another torch (control)."""
    import json

    src = _source_copy(tmp_path / "src")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    (wheel,) = (tmp_path / "dist").glob("yolo_det-*.whl")
    done = _resolve_into(tmp_path, wheel, OLDEST)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [item["metadata"]["name"] for item in report["install"]] == ["yolo-det"]
    older = _resolve_into(tmp_path, wheel, {**OLDEST, "torch": "2.3.1", "ultralytics": "8.2.103"})
    assert older.returncode != 0
    assert "torch" in older.stderr
