"""The machine fingerprint, the ``portable`` settings, the one rule of machine causes, and ``check-machine``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from yolo_det.cli import main
from yolo_det.core.errors import ConfigError, ProfileError
from yolo_det.core.machine import machine_causes, machine_fingerprint, machine_view
from yolo_det.core.machine_settings import cannot_match, missing_env
from yolo_det.core.profiles import load_profile
from yolo_det.core.record_schema import check_record
from yolo_det.session.extensions import MachinePinning, PhaseContext
from yolo_det.tools.machine_check import check_machine


def _record(host: dict | None = None, *, profile: str = "repro", schema: int = 3) -> dict:
    env = {"torch": torch.__version__, "machine": "x86_64", "torch_threads": 1, "cpu_capability": "AVX512"}
    if host is not None:
        env["host"] = host
    return {
        "schema": schema,
        "status": "completed",
        "framework": "ultralytics",
        "profile": load_profile(profile).to_dict(),
        "environment": env,
        "run": {"device": "cpu"},
    }


def test_the_fingerprint_holds_what_decides_the_bits_and_fits_the_schema() -> None:
    fp = machine_fingerprint()
    assert fp["intra_op_threads"] == torch.get_num_threads()
    assert fp["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(fp["env"]) >= {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR"}
    assert fp["torch"] == torch.__version__
    assert check_record(_record(fp)) is None
    bad = copy.deepcopy(fp)
    bad["intra_op_threads"] = "8"
    assert "environment.host.intra_op_threads" in (check_record(_record(bad)) or "")


def test_an_old_record_still_reads_and_is_compared_on_what_it_holds(tmp_path: Path, capsys) -> None:
    old = _record(None, schema=2)
    assert check_record(old) is None
    view = machine_view(old["environment"])
    assert view["intra_op_threads"] == 1
    assert view["cpu_capability"] == "AVX512"
    other = {**view, "intra_op_threads": 3}
    causes, notes = machine_causes(view, other, cuda=False)
    assert [c.name for c in causes] == ["intra-op threads"]
    assert "intra_op_threads: 1" in causes[0].fix
    path = tmp_path / "determinism.json"
    path.write_text(json.dumps(old))
    code = main(["check-machine", str(path), "--profile", "repro"])
    assert code in (0, 1)
    assert "will" in capsys.readouterr().out


def test_every_cause_is_named_with_its_fix_and_an_equal_machine_has_none() -> None:
    a = machine_fingerprint()
    assert machine_causes(a, copy.deepcopy(a), cuda=False) == ([], [])
    b = copy.deepcopy(a)
    b.update(intra_op_threads=a["intra_op_threads"] + 2, cpu_capability="DEFAULT", mkl="0.0")
    b["env"] = {**a["env"], "MKL_CBWR": "AUTO" if a["env"].get("MKL_CBWR") != "AUTO" else None}
    names = {c.name: c for c in machine_causes(a, b, cuda=False)[0]}
    assert {"intra-op threads", "ATen CPU capability", "MKL_CBWR", "MKL version"} <= set(names)
    assert "ATEN_CPU_CAPABILITY=default" in names["ATen CPU capability"].fix
    # on CUDA the GPU decides, and a CPU difference does not count
    ga = {**a, "gpu": {"name": "NVIDIA H100", "sm_count": 132, "cuda": "12.8"}}
    gb = {**b, "gpu": {"name": "NVIDIA H100", "sm_count": 114, "cuda": "12.8"}}
    assert [c.name for c in machine_causes(ga, gb, cuda=True)[0]] == ["GPU sm_count"]


def test_machine_settings_are_validated_in_one_line() -> None:
    profile = load_profile("portable")
    assert profile.train.extra["intra_op_threads"] == 1
    assert profile.train.extra["cpu_isa"] == "avx2"
    with pytest.raises(ProfileError, match="'intra_op_threads' must be null or an integer"):
        profile.train.replace(intra_op_threads=0)
    with pytest.raises(ProfileError, match="'cpu_isa' must be null or one of avx2, default"):
        profile.train.replace(cpu_isa="avx512")


def test_a_machine_that_cannot_match_is_told_in_one_line() -> None:
    assert "needs an x86-64 CPU" in (cannot_match("avx2", machine="aarch64") or "")
    assert "needs a CPU with AVX2" in (cannot_match("avx2", machine="x86_64", flags=frozenset({"sse2"})) or "")
    assert cannot_match("avx2", machine="x86_64", flags=frozenset({"avx2"})) is None
    assert missing_env("avx2", {"ATEN_CPU_CAPABILITY": "avx2"}) == {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_CBWR": "COMPATIBLE",
    }


class _Session:
    class profile:
        name = "t"


def test_pinning_sets_the_threads_and_restores_them() -> None:
    before = torch.get_num_threads()
    ext = MachinePinning()
    settings = load_profile("repro").train.replace(intra_op_threads=before + 1)
    token = ext.apply(PhaseContext(_Session(), "train", settings))
    try:
        assert torch.get_num_threads() == before + 1
    finally:
        ext.undo(token)
    assert torch.get_num_threads() == before


def test_python_api_refuses_a_process_whose_branches_were_not_pinned_before_torch(monkeypatch) -> None:
    monkeypatch.delenv("MKL_CBWR", raising=False)
    settings = load_profile("portable").train
    with pytest.raises(
        ConfigError, match=r"needs ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_CBWR=COMPATIBLE"
    ):
        MachinePinning().apply(PhaseContext(_Session(), "train", settings))


def test_cli_in_a_process_with_torch_names_what_to_set_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert main(["train", "--profile", "portable", "epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "needs ATEN_CPU_CAPABILITY=avx2" in err
    assert len(err.strip().splitlines()) == 1


def test_check_machine_predicts_the_run_s_own_machine_and_names_the_threads(tmp_path: Path, capsys) -> None:
    here = machine_fingerprint()
    record = _record(here)
    record["environment"]["host"]["intra_op_threads"] = 7  # trained with 7 threads; repro here uses Ultralytics'
    verdict = check_machine(record, "repro")
    assert verdict.exit_code == 1
    assert any(c.name == "intra-op threads" and c.a == 7 for c in verdict.causes)
    path = tmp_path / "determinism.json"
    path.write_text(json.dumps(record))
    assert main(["check-machine", str(path)]) == 1
    out = capsys.readouterr().out
    assert "intra-op threads: recorded 7" in out
    assert "will differ" in out
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["check-machine", str(tmp_path / "bad.json")]) == 2


def test_a_machine_of_another_architecture_is_refused_before_training(monkeypatch, capsys) -> None:
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert main(["train", "--profile", "portable", "epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "cannot reproduce its weights on this machine" in err
    assert "needs an x86-64 CPU, and this machine is aarch64" in err


def test_diff_names_the_machine_causes_check_machine_names() -> None:
    from yolo_det.tools.diff import diff_records

    a = _record(machine_fingerprint())
    b = copy.deepcopy(a)
    b["environment"]["host"]["intra_op_threads"] = 5
    b["environment"]["host"]["env"]["MKL_CBWR"] = "AUTO"
    expected = {c.name for c in machine_causes(a["environment"]["host"], b["environment"]["host"], cuda=False)[0]}
    assert expected == {"intra-op threads", "MKL_CBWR"}
    report = diff_records(a, b)
    causes = {d.name: d for d in report.causes}
    assert expected <= set(causes)
    assert "fix: intra_op_threads:" in (causes["intra-op threads"].note or "")
    # the same records, compared with themselves: nothing
    assert not [d for d in diff_records(a, copy.deepcopy(a)).causes if d.group in {"cpu", "threads"}]


def test_the_ultralytics_version_is_a_cause_named_by_check_machine_and_diff() -> None:
    from yolo_det.core.compat import ultralytics_version
    from yolo_det.tools.diff import diff_records

    a = _record(machine_fingerprint())
    assert a["environment"]["host"]["ultralytics"] == ultralytics_version()
    a["environment"]["ultralytics"] = ultralytics_version()
    a["ultralytics_args"] = {"epochs": 2, "imgsz": 64}
    same = copy.deepcopy(a)
    assert not [d for d in diff_records(a, same).causes if d.name in ("Ultralytics", "ultralytics")]  # control
    b = copy.deepcopy(a)
    b["environment"]["host"]["ultralytics"] = b["environment"]["ultralytics"] = "8.3.0"
    b["ultralytics_args"] = {"epochs": 2}  # 8.3.0 without imgsz= here, as an older release lacks a newer argument
    causes = machine_causes(a["environment"]["host"], b["environment"]["host"], cuda=False)[0]
    assert [(c.name, c.fix) for c in causes] == [("Ultralytics", f"install ultralytics=={ultralytics_version()}")]
    report = diff_records(a, b)
    line = next(d for d in report.causes if d.name == "ultralytics")
    assert "install ultralytics==" in (line.note or "")
    arg = next(d for d in report.differences if d.name == "imgsz=")
    assert "Ultralytics versions differ" in (arg.note or "")
    assert f"Ultralytics {ultralytics_version()} only" in (arg.note or "")
    # a YOLOv5 run has no Ultralytics on either side: nothing to compare
    assert machine_causes({"ultralytics": None}, {"ultralytics": None}, cuda=False) == ([], [])


def test_check_machine_shows_record_text_escaped_and_never_as_a_fix(tmp_path: Path, capsys) -> None:
    here = machine_fingerprint()
    record = _record(here)
    evil = "9.9\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\r\u202eforged"
    record["environment"]["host"]["torch"] = evil
    record["environment"]["host"]["intra_op_threads"] = -5
    path = tmp_path / "determinism.json"
    path.write_text(json.dumps(record))
    assert main(["check-machine", str(path), "--profile", "repro"]) == 1
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in out
    assert "\\x1b]8;;http://evil.example" in out  # shown, escaped
    assert "install the torch version the record names" in out
    assert "intra_op_threads: -5" not in out
    assert not any(line.startswith("forged") for line in out.splitlines())
    record["environment"]["host"].update(torch="9.9.1", intra_op_threads=7)  # control: real values are the fix
    path.write_text(json.dumps(record))
    assert main(["check-machine", str(path), "--profile", "repro"]) == 1
    out = capsys.readouterr().out
    assert "install torch==9.9.1" in out
    assert "intra_op_threads: 7 in the profile" in out


def test_a_records_profile_name_never_loads_a_file_here(tmp_path: Path, monkeypatch) -> None:
    local = tmp_path / "local.yaml"
    local.write_text("name: loaded-from-a-file\nextends: fast\n")
    monkeypatch.chdir(tmp_path)
    record = _record(machine_fingerprint())
    for name in (str(local), "local.yaml"):
        record["profile"]["name"] = name
        verdict = check_machine(record)
        assert verdict.profile == "repro"
        assert any("not a built-in one" in n for n in verdict.notes)
    record["profile"]["name"] = "fast"  # control: a built-in name is the run's profile
    assert check_machine(record).profile == "fast"
    assert check_machine(record, str(local)).profile == "loaded-from-a-file"  # named by the user: loaded


def _portable_host(**changes: object) -> dict:
    """The fingerprint a ``portable`` run on this machine records (one thread, the AVX2 branches pinned)."""
    from yolo_det.core.machine_settings import ISA_ENV

    host = machine_fingerprint()
    host.update({"intra_op_threads": 1, "cpu_capability": "AVX2", **changes})
    host["env"] = {**host["env"], **ISA_ENV["avx2"]}
    return host


def test_a_version_nobody_measured_is_not_promised_and_diff_says_the_same(tmp_path: Path, capsys) -> None:
    from yolo_det.tools.diff import diff_records

    # a portable run on torch 2.15.0 (oneDNN 3.13.3), checked here on another torch: measured to agree once, but no
    # rule promises it, and nothing known to change the bits differs
    record = _record(_portable_host(torch="2.15.0", onednn="3.13.3"), profile="portable")
    assert torch.__version__ != "2.15.0"
    verdict = check_machine(record, "portable")
    assert verdict.verdict == "not promised"
    assert verdict.exit_code == 3
    assert {c.name for c in verdict.causes} >= {"torch", "oneDNN version"}
    assert not any(c.measured for c in verdict.causes)
    path = tmp_path / "determinism.json"
    path.write_text(json.dumps(record))
    assert main(["check-machine", str(path), "--profile", "portable"]) == 3
    out = capsys.readouterr().out
    assert "torch: recorded 2.15.0" in out
    assert "not measured" in out
    assert "not promised under profile 'portable'" in out
    assert "will differ" not in out
    assert "will agree" not in out
    # control: the same torch here is "will agree"; a thread count added to the version is "will differ"
    same = _record(_portable_host(), profile="portable")
    assert check_machine(same, "portable").verdict == "will agree"
    threads = _record(_portable_host(torch="2.15.0", intra_op_threads=4), profile="portable")
    assert check_machine(threads, "portable").verdict == "will differ"
    assert main(["check-machine", str(path), "--profile", "portable", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["verdict"] == "not promised"
    # diff reads the same rule: a torch release is named as not measured, and weights that differ under it are not
    # "expected to differ"
    here = copy.deepcopy(same)
    record["weights"], here["weights"] = {"sha256": "a" * 64}, {"sha256": "b" * 64}
    report = diff_records(record, here)
    line = next(d for d in report.causes if d.name == "torch")
    assert not line.measured
    assert "not measured" in (line.note or "")
    assert "nobody has measured" in report.verdict
    assert "expected to differ" not in report.verdict


def test_a_cpu_without_avx2_is_not_told_to_use_the_profile_it_cannot_run(monkeypatch) -> None:
    info = {"vendor_id": "GenuineIntel", "model name": "an old CPU", "flags": "fpu sse2 sse4_1 sse4_2"}
    monkeypatch.setattr("yolo_det.core.machine.cpu_info", lambda: info)
    monkeypatch.setattr("yolo_det.core.machine_settings.cpu_info", lambda: info)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    record = _record(_portable_host(), profile="portable")
    record["environment"]["host"]["cpu_flags"] = ["avx", "avx2", "fma"]
    verdict = check_machine(record, "portable")
    assert verdict.verdict == "will differ"
    text = verdict.summary()
    assert "needs a CPU with AVX2, and this one has none; no setting fixes it" in text
    fixes = [c.fix for c in verdict.causes if c.name in ("ATen CPU capability", "oneDNN instruction set")]
    assert fixes, text
    for fix in fixes:  # no fix that names a setting this CPU cannot run, nor portable as the cure
        assert "portable has it" not in fix
        assert "cpu_isa: avx2" not in fix
        assert "no setting reproduces an AVX2 run on it" in fix


def test_portable_names_a_value_of_yours_it_replaces_and_the_record_keeps_it(monkeypatch, capsys) -> None:
    import sys
    from types import SimpleNamespace

    from yolo_det.commands import prestart
    from yolo_det.core.machine_settings import REPLACED_VAR, replaced_env
    from yolo_det.core.record import environment

    class Exec(Exception):
        pass

    seen: dict = {}

    def execve(path: str, argv: list, env: dict) -> None:
        seen.update(env=env, argv=argv)
        raise Exec

    monkeypatch.setattr(prestart.os, "execve", execve)
    # a console start: torch not imported yet
    monkeypatch.setattr(prestart, "sys", SimpleNamespace(modules={}, executable=sys.executable, stderr=sys.stderr))
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the value portable wants: not a replacement
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # unset: set, not replaced
    with pytest.raises(Exec):
        prestart.prepare("train", ["train", "--profile", "portable", "epochs=1"], reexec=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "yolo-det: profile 'portable' replaces your MKL_CBWR=AUTO with MKL_CBWR=COMPATIBLE "
        "(yours are kept in determinism.json, environment.replaced_env)"
    ]
    env = seen["env"]
    assert env["MKL_CBWR"] == "COMPATIBLE"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert replaced_env(env) == {"MKL_CBWR": "AUTO"}
    monkeypatch.setenv(REPLACED_VAR, env[REPLACED_VAR])
    record_env = environment()
    assert record_env["replaced_env"] == {"MKL_CBWR": "AUTO"}
    assert check_record(_record(record_env["host"]) | {"environment": record_env}) is None
    # nothing of yours replaced: no line, an empty record field; a name outside the allow-list is never read back
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with pytest.raises(Exec):
        prestart.prepare("train", ["train", "--profile", "portable"], reexec=True)
    assert capsys.readouterr().err == ""
    assert REPLACED_VAR not in seen["env"]
    assert replaced_env({REPLACED_VAR: '{"LD_PRELOAD": "x", "MKL_CBWR": "AUTO"}'}) == {"MKL_CBWR": "AUTO"}
