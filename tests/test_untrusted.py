"""Files from others run no code: the allow-list unpickler, the one gate, model and data YAMLs, bounded work."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import resumable_checkpoint
from tests.hostile.make_corpus import build
from yolo_det.analysis.gate import NOT_PATHS, PATH_KEYS, allow_downloads, check_arguments
from yolo_det.core.errors import ConfigError, ModelError
from yolo_det.core.record import checkpoint_digest, state_dict_digest
from yolo_det.core.untrusted.safeload import guarded_torch_load, load_checkpoint, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    folder = tmp_path_factory.mktemp("hostile")
    marker = folder / "MARKER"
    return build(folder / "files", marker), marker


def _ultralytics_checkpoint(path: Path, yaml_name: str = "yolov8n.yaml") -> torch.nn.Module:
    """A checkpoint saved the way Ultralytics' trainer saves one (model, ema, args, metrics)."""
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(yaml_name, nc=2, verbose=False)
    torch.save(
        {
            "epoch": 0,
            "best_fitness": None,
            "model": None,
            "ema": copy.deepcopy(model).half(),
            "updates": 1,
            "optimizer": None,
            "train_args": {"epochs": 1, "model": yaml_name},
            "date": "2026-01-01",
            "version": "8",
        },
        path,
    )
    return model


def test_every_hostile_file_is_refused_by_every_reader(corpus: tuple[dict[str, Path], Path]) -> None:
    files, marker = corpus
    assert len(files) >= 25
    for name, path in files.items():
        for reader in (load_checkpoint, read_checkpoint):
            with pytest.raises(ModelError) as err:
                reader(path)
            assert "\n" not in str(err.value), name
    assert not marker.exists()


def test_torch_load_guard_routes_through_the_allow_list_and_is_restored(
    corpus: tuple[dict[str, Path], Path], tmp_path: Path
) -> None:
    files, marker = corpus
    real = torch.load
    with guarded_torch_load():
        assert torch.load is not real
        with pytest.raises(ModelError, match="os.system"):
            torch.load(files["os-system"], map_location="cpu", weights_only=False)
        with pytest.raises(ModelError, match="legacy"):
            torch.load(files["legacy-prefix"], weights_only=False)
    assert torch.load is real
    assert not marker.exists()
    with pytest.raises(RuntimeError), guarded_torch_load():
        raise RuntimeError("boom")
    assert torch.load is real


def test_real_checkpoints_load_with_the_same_weights(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.pt"
    model = _ultralytics_checkpoint(ckpt)
    reference = torch.load(ckpt, weights_only=False)["ema"]
    loaded = load_checkpoint(ckpt)["ema"]
    assert type(loaded) is type(reference)
    assert state_dict_digest(loaded) == state_dict_digest(reference) == checkpoint_digest(ckpt)
    assert state_dict_digest(model.half()) == checkpoint_digest(ckpt)
    with guarded_torch_load():  # what Ultralytics gets: the object the allow-list made
        from ultralytics.nn.tasks import load_checkpoint as ultralytics_load

        net, _ = ultralytics_load(str(ckpt))
    assert state_dict_digest(net.half()) == checkpoint_digest(ckpt)


def test_user_blocks_need_import_to_load_but_digest_without(tmp_path: Path) -> None:
    pkg = tmp_path / "userpkg_blocks.py"
    pkg.write_text(
        textwrap.dedent("""\
        import torch
        class UserBlock(torch.nn.Module):
            def __init__(self, c):
                super().__init__()
                self.conv = torch.nn.Conv2d(c, c, 1)
            def forward(self, x):
                return self.conv(x)
        """)
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import userpkg_blocks

        path = tmp_path / "user.pt"
        block = userpkg_blocks.UserBlock(4)
        torch.save({"model": torch.nn.Sequential(block)}, path)
        with pytest.raises(ModelError, match=r"userpkg_blocks\.UserBlock.*--import"):
            load_checkpoint(path)
        assert checkpoint_digest(path) == state_dict_digest(torch.nn.Sequential(block))
        from yolo_det.analysis.models import model_names

        with model_names(["userpkg_blocks"]):
            assert type(load_checkpoint(path)["model"][0]) is userpkg_blocks.UserBlock
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("userpkg_blocks", None)


def test_swapped_model_checkpoint_loads(tmp_path: Path) -> None:
    from yolo_det.fixes.swaps import swap_modules

    model = torch.nn.Sequential(torch.nn.Upsample(scale_factor=2, mode="bilinear"), torch.nn.AdaptiveAvgPool2d(2))
    swap_modules(model, ["0", "1"])
    assert any(type(m).__module__.startswith("yolo_det.layers") for m in model)
    torch.save({"model": model}, tmp_path / "swapped.pt")
    reference = torch.load(tmp_path / "swapped.pt", weights_only=False)["model"]
    loaded = load_checkpoint(tmp_path / "swapped.pt")["model"]
    assert [type(m) for m in loaded] == [type(m) for m in reference]
    assert [vars(m).keys() for m in loaded] == [vars(m).keys() for m in reference]


def test_gate_covers_every_path_valued_argument_of_ultralytics() -> None:
    """Every untyped key of Ultralytics' default.yaml is either gated or named as reading no file, and every
    bool key Ultralytics' code also treats as a path (``isinstance(args.KEY, (str, Path))``) is gated."""
    import ultralytics
    from ultralytics.cfg import (
        CFG_BOOL_KEYS,
        CFG_FLOAT_KEYS,
        CFG_FRACTION_KEYS,
        CFG_INT_KEYS,
        CFG_STR_KEYS,
        DEFAULT_CFG_DICT,
    )

    typed = CFG_FLOAT_KEYS | CFG_FRACTION_KEYS | CFG_INT_KEYS | CFG_BOOL_KEYS | CFG_STR_KEYS
    untyped = {k for k, v in DEFAULT_CFG_DICT.items() if k not in typed and not isinstance(v, (bool, int, float))}
    assert untyped - set(PATH_KEYS) - set(NOT_PATHS) == set()
    source = "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in Path(ultralytics.__file__).parent.rglob("*.py")
    )
    as_paths = {
        k
        for k in CFG_BOOL_KEYS
        if f"isinstance(self.args.{k}, (str, Path))" in source or f"isinstance({k}, (str, Path))" in source
    }
    assert {"resume", "pretrained"} <= as_paths | set(PATH_KEYS)
    assert as_paths <= set(PATH_KEYS)


def test_gate_refuses_hostile_files_behind_every_path_argument(
    corpus: tuple[dict[str, Path], Path], tmp_path: Path
) -> None:
    files, marker = corpus
    evil = files["os-system"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"resume: {evil}\n")
    tracker = tmp_path / "tracker.yaml"
    tracker.write_text(f"tracker_type: botsort\nwith_reid: true\nmodel: {evil}\n")
    for args in (
        {"model": str(evil)},
        {"pretrained": str(evil)},
        {"resume": str(evil)},
        {"distill_model": str(evil)},
        {"cfg": str(cfg)},
        {"tracker": str(tracker)},
    ):
        with pytest.raises(ModelError, match="os.system"):
            check_arguments(args)
    assert not marker.exists()


def test_model_yaml_names_only_module_classes_and_activations_at_any_level(tmp_path: Path) -> None:
    from yolo_det.analysis.loader import check_model_file

    base = {"nc": 2, "backbone": [[-1, 1, "Conv", [8, 3, 2]]], "head": [[-1, 1, "Classify", [2]]]}
    bad = {**base, "backbone": [[-1, 1, "parse_model", [{"activation": "__import__('os').system('x')"}]]]}
    (tmp_path / "fn.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ModelError, match="not a module class"):
        check_model_file(str(tmp_path / "fn.yaml"))
    nested = {**base, "backbone": [[-1, 1, "Conv", [8, 3, 2, {"activation": "print('x')"}]]]}
    (tmp_path / "nested.yaml").write_text(yaml.safe_dump(nested))
    with pytest.raises(ModelError, match="activation"):
        check_model_file(str(tmp_path / "nested.yaml"))
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump({**base, "activation": "nn.ReLU()"}))
    assert check_model_file(str(tmp_path / "ok.yaml")).name == "ok.yaml"


def test_p6_name_resolves_to_the_file_ultralytics_builds(tmp_path: Path) -> None:
    from yolo_det.analysis.loader import check_model_file

    (tmp_path / "yolov8n6.yaml").write_text("nc: 2\nbackbone: []\nhead: []\n")  # checked by name, never built
    sibling = tmp_path / "yolov8n-p6.yaml"
    sibling.write_text("nc: 2\nactivation: print('ran')\nbackbone: [[-1, 1, Conv, [8, 3, 2]]]\nhead: []\n")
    with pytest.raises(ModelError, match=r"yolov8n-p6\.yaml.*activation"):
        check_model_file(str(tmp_path / "yolov8n6.yaml"))


def test_data_download_never_runs_without_opt_in(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    data = tmp_path / "data.yaml"
    data.write_text(
        f"path: {tmp_path}\ntrain: images/train\nval: images/val\ntest: images/test\nnames: [a]\n"
        f"download: |\n  open({str(marker)!r}, 'w')\n"
    )
    with pytest.raises(ConfigError, match="download"):
        check_arguments({"data": str(data)})
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "data.yaml").write_text(data.read_text())
    with pytest.raises(ConfigError, match="download"):
        check_arguments({"data": str(folder)})
    with pytest.raises(ConfigError, match="NDJSON"):
        check_arguments({"data": str(tmp_path / "x.ndjson")})
    with allow_downloads():
        check_arguments({"data": str(data)})
    assert not marker.exists()


_CASES_SCRIPT = """
import contextlib, io, sys
from yolo_det.cli import main
for case in sys.argv[1:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(case.split("|"))
        except SystemExit as e:
            rc = e.code
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    print(rc, len(lines), case[:80], "::", lines[-1][:200] if lines else "")
"""


def _run_cases(cases: list[list[str]], cwd: Path) -> list[list[str]]:
    """Run CLI commands in one fresh process (cheap: one import of torch and Ultralytics); return, per case,
    ``[exit code, number of stderr lines, case, last line]``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CASES_SCRIPT, *("|".join(c) for c in cases)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = [line.split(" ", 2) for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == len(cases), out.stderr[-2000:]
    return rows


@pytest.mark.slow  # more than 2 s
def test_commands_refuse_hostile_files_in_one_line_exit_2(corpus: tuple[dict[str, Path], Path], tmp_path: Path) -> None:
    """Through the CLI (one process per command, the payloads that reached code before): exit 2, one line."""
    files, marker = corpus
    cases: list[list[str]] = []
    for name in (
        "stack-global-alias",
        "nested-pickle",
        "torch-save",
        "legacy-prefix",
        "case-colliding",
        "model-class-called",
    ):
        f = str(files[name])
        cases += [
            ["train", f"model={f}"],
            ["train", f"pretrained={f}"],
            ["train", f"resume={f}"],
            ["train", f"distill_model={f}"],
            ["digest", f],
            ["audit", f],
            ["verify", f"model={f}"],
            ["bench", f"model={f}"],
        ]
    rows = _run_cases(cases, tmp_path)
    assert [r for r in rows if r[0] != "2" or r[1] != "1"] == []
    assert not marker.exists()


@pytest.mark.slow  # more than 2 s
def test_commands_refuse_hostile_model_and_data_yamls(tmp_path: Path) -> None:
    """audit, rewrite --check and train refuse YAMLs whose building would run code; nothing runs, exit 2."""
    marker = tmp_path / "MARKER"
    run = f"open({str(marker)!r}, 'w').write('ran')"
    rows = "backbone:\n  - [-1, 1, Conv, [8, 3, 2]]\nhead:\n  - [-1, 1, Classify, [2]]\n"
    (tmp_path / "fn.yaml").write_text(
        f'nc: 2\nbackbone:\n  - [-1, 1, parse_model, [{{activation: "{run}", backbone: [], head: []}}]]\n'
        "head:\n  - [-1, 1, Classify, [2]]\n"
    )
    (tmp_path / "top.yaml").write_text(f'nc: 2\nactivation: "{run}"\n{rows}')
    (tmp_path / "nested.yaml").write_text(
        f'nc: 2\nbackbone:\n  - [-1, 1, Conv, [8, 3, 2, {{activation: "{run}"}}]]\nhead:\n  - [-1, 1, Classify, [2]]\n'
    )
    (tmp_path / "yolov8n6.yaml").write_text(f"nc: 2\n{rows}")
    (tmp_path / "yolov8n-p6.yaml").write_text(f'nc: 2\nactivation: "{run}"\n{rows}')
    (tmp_path / "data.yaml").write_text(
        f"path: {tmp_path}\ntrain: a\nval: b\ntest: c\nnames: [x]\ndownload: |\n  {run}\n"
    )
    cases = []
    for name in ("fn", "top", "nested", "yolov8n6"):
        f = str(tmp_path / f"{name}.yaml")
        cases += [["audit", f, "--imgsz", "64"], ["train", f"model={f}"]]
        if name != "yolov8n6":  # rewrite builds the text it rewrites (no P6 rename): nothing to refuse there
            cases.append(["rewrite", f, "--check"])
    cases += [
        ["train", f"data={tmp_path / 'data.yaml'}", "model=yolov8n-cls.yaml"],
        ["train", f"data={tmp_path}", "model=yolov8n.yaml"],
        ["train", f"data={tmp_path / 'x.ndjson'}"],
    ]
    rows = _run_cases(cases, tmp_path)
    assert [r for r in rows if r[0] != "2" or r[1] != "1"] == []
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_digest_reads_every_dtype_and_names_a_truncated_file(tmp_path: Path) -> None:
    digests = set()
    for name in ("float8_e4m3fn", "float8_e5m2", "bits8", "float4_e2m1fn_x2", "complex32"):
        dtype = getattr(torch, name)
        raw = torch.arange(8, dtype=torch.uint8)
        t = raw.view(dtype) if torch.empty(0, dtype=dtype).element_size() == 1 else raw.view(torch.int32).view(dtype)
        torch.save({"w": t}, tmp_path / f"{name}.pt")
        digests.add(checkpoint_digest(tmp_path / f"{name}.pt"))
        torch.save({"w": t.clone().view(torch.uint8).add(1).view(dtype)}, tmp_path / "other.pt")
        assert checkpoint_digest(tmp_path / "other.pt") != checkpoint_digest(tmp_path / f"{name}.pt")
    assert len(digests) == 5  # the dtype is part of the digest
    whole = (tmp_path / "float8_e5m2.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[: len(whole) - 40])
    with pytest.raises(ModelError, match="truncated"):
        checkpoint_digest(tmp_path / "cut.pt")


def test_profile_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    from yolo_det.core.errors import ProfileError
    from yolo_det.core.profiles import load_profile
    from yolo_det.core.untrusted.textfile import MAX_TEXT_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("extends: repro\n# " + "x" * MAX_TEXT_BYTES + "\n")
    with pytest.raises(ProfileError, match="bigger than"):
        load_profile(big)
    small = tmp_path / "small.yaml"
    small.write_text("extends: repro\n# " + "x" * 1000 + "\n")
    assert load_profile(small).name


def _download_yaml(folder: Path, marker: Path) -> Path:
    data = folder / "evil.yaml"
    data.write_text(
        f"path: {folder / 'absent'}\ntrain: images/train\nval: images/val\nnames: [a, b]\n"
        f"download: |\n  open({str(marker)!r}, 'w').write('ran')\n"
    )
    return data


def test_the_gate_derives_path_arguments_from_ultralytics_defaults(
    corpus: tuple[dict[str, Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path-valued argument a later Ultralytics adds is gated without a change in yolo-det."""
    import ultralytics.cfg

    from yolo_det.analysis.gate import BOOL_OR_PATH, path_keys

    files, marker = corpus
    keys = path_keys()
    assert set(PATH_KEYS) <= set(keys)
    assert BOOL_OR_PATH <= set(keys)
    assert not set(keys) & set(NOT_PATHS)
    assert {"epochs", "lr0", "save", "imgsz", "source", "project"}.isdisjoint(keys)  # numbers, switches, outputs
    check_arguments({"teacher_weights": str(files["os-system"])})  # control: not an argument of this Ultralytics
    monkeypatch.setattr(
        ultralytics.cfg, "DEFAULT_CFG_DICT", {**ultralytics.cfg.DEFAULT_CFG_DICT, "teacher_weights": ""}
    )
    path_keys.cache_clear()
    try:
        assert path_keys()["teacher_weights"] == "file"
        with pytest.raises(ModelError, match="os.system"):
            check_arguments({"teacher_weights": str(files["os-system"])})
    finally:
        monkeypatch.undo()
        path_keys.cache_clear()
    assert "teacher_weights" not in path_keys()
    assert not marker.exists()


@pytest.mark.slow  # more than 2 s
def test_a_checkpoints_stored_arguments_pass_the_same_gate(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    evil = _download_yaml(tmp_path, marker)
    ckpt = tmp_path / "run" / "weights" / "last.pt"
    resumable_checkpoint(ckpt, {"data": str(evil), "resume": str(ckpt)})  # it names itself too: read once
    for args in ({"model": str(ckpt)}, {"resume": str(ckpt)}, {"pretrained": str(ckpt)}):
        with pytest.raises(ConfigError, match=r"download.*--allow-download.*train_args stored in checkpoint") as e:
            check_arguments(args)
        assert "\n" not in str(e.value)
    clean = tmp_path / "clean.yaml"
    clean.write_text(f"path: {tmp_path}\ntrain: .\nval: .\nnames: [a, b]\n")
    check_arguments({"model": str(ckpt), "data": str(clean)})  # the data given is what Ultralytics reads
    with allow_downloads():
        check_arguments({"model": str(ckpt)})
    nested = tmp_path / "nested" / "weights" / "last.pt"
    resumable_checkpoint(nested, {"model": str(ckpt)})  # a fine-tune of the first: its stored model is gated too
    with pytest.raises(ConfigError, match="download"):
        check_arguments({"model": str(nested)})
    as_dict = tmp_path / "dict" / "weights" / "last.pt"
    resumable_checkpoint(as_dict, {"data": {"train": "x", "download": "print(1)"}})
    with pytest.raises(ConfigError, match=r"data is a mapping .*pass data=path/to/data.yaml"):
        check_arguments({"model": str(as_dict)})
    assert not marker.exists()


def test_resume_never_runs_the_download_a_checkpoint_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from yolo_det.cli import main

    marker = tmp_path / "MARKER"
    ckpt = tmp_path / "run" / "weights" / "last.pt"
    resumable_checkpoint(ckpt, {"data": str(_download_yaml(tmp_path, marker)), "save_dir": str(tmp_path / "run")})
    assert main(["train", f"resume={ckpt}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("yolo-det")]
    assert len(err) == 1
    assert "--allow-download" in err[0]
    assert "evil.yaml" in err[0]
    as_dict = tmp_path / "dict" / "weights" / "last.pt"
    resumable_checkpoint(as_dict, {"data": {"train": "x"}, "save_dir": str(tmp_path / "dict")})
    assert main(["train", f"resume={as_dict}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("yolo-det")]
    assert len(err) == 1
    assert "data is a mapping" in err[0]
    assert not marker.exists()


def test_a_received_run_folder_is_never_written_through_its_links(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from yolo_det.cli import main
    from yolo_det.core import runlock
    from yolo_det.core.resume import resume_folder
    from yolo_det.core.runfolder import check_no_links

    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"mine")
    run = tmp_path / "run"
    ckpt = run / "weights" / "last.pt"
    resumable_checkpoint(ckpt, {"data": "coco8.yaml", "save_dir": str(run)})
    check_no_links(run)  # control: a run folder of real files
    assert resume_folder(ckpt) == run
    for name in ("weights/best.pt", "args.yaml", "results.csv"):
        link = run / name
        link.symlink_to(outside)
        assert main(["train", f"resume={ckpt}"]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("yolo-det")]
        assert len(err) == 1
        assert f"symbolic link '{name}'" in err[0]
        with pytest.raises(ConfigError, match="symbolic link"):
            runlock.acquire(run)  # a fixed name= (exist_ok) or save_dir= into it: the same refusal
        link.unlink()
    (run / "weights" / "sub").symlink_to(tmp_path, target_is_directory=True)  # a linked folder, at any depth
    with pytest.raises(ConfigError, match="symbolic link 'weights/sub'"):
        check_no_links(run)
    (run / "weights" / "sub").unlink()
    assert outside.read_bytes() == b"mine"
    # the run folder itself may be a link (the user's own layout): it is written in the folder it points to
    linked = tmp_path / "linked-run"
    linked.symlink_to(run, target_is_directory=True)
    check_no_links(linked)
    assert resume_folder(linked / "weights" / "last.pt") == linked
    with runlock.acquire(linked) as lock:
        assert lock.folder == run.resolve()


def test_a_classify_folder_with_its_splits_ignores_a_download_only_data_yaml(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    folder = tmp_path / "flowers"
    (folder / "data.yaml").parent.mkdir()
    (folder / "data.yaml").write_text(f"download: |\n  open({str(marker)!r}, 'w')\n")
    with pytest.raises(ConfigError, match=r"it names no split.*--allow-download"):  # control: no splits here
        check_arguments({"data": str(folder)})
    for split in ("train", "val"):
        (folder / split / "a").mkdir(parents=True)
    check_arguments({"data": str(folder)})  # Ultralytics reads the folder, never its data.yaml
    assert not marker.exists()


def test_tensors_sent_between_ranks_unpickle_under_the_load_guard_and_a_stream_is_still_refused() -> None:
    import io
    import pickle

    sent = pickle.dumps([torch.arange(3.0)])  # what torch.distributed's gather_object sends (plain pickle)
    with guarded_torch_load():
        (received,) = pickle.loads(sent)  # torch's storage unpickling calls torch.load on its own bytes
        assert torch.equal(received, torch.arange(3.0))
        with pytest.raises(ModelError, match="legacy-format"):
            torch.load(io.BytesIO(pickle.dumps(1, protocol=2)))  # control: a stream handed to torch.load


class _NestedLoad:
    """An object that unpickles through torch's storage loader (a nested pickle)."""

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        import torch.storage

        return (torch.storage._load_from_bytes, (b"",))


def test_a_checkpoint_cannot_reach_the_storage_loader_the_guard_lets_through(tmp_path: Path) -> None:
    path = tmp_path / "nested.pt"
    torch.save({"model": _NestedLoad()}, path)
    with pytest.raises(ModelError, match="_load_from_bytes"):
        load_checkpoint(path)
