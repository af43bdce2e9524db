"""Profiles: built-ins, user files, validation with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from yolo_det.core.errors import ProfileError
from yolo_det.core.profiles import BUILTIN_PROFILES, PHASES, PhaseSettings, Profile, list_profiles, load_profile


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtins_load_and_have_the_documented_intent():
    assert set(list_profiles()) == set(BUILTIN_PROFILES) == {"repro", "portable", "balanced", "fast"}
    repro, balanced, fast = (load_profile(n) for n in ("repro", "balanced", "fast"))
    for phase in PHASES:
        s = repro.phase(phase)
        assert s.deterministic_algorithms == "strict"
        assert s.backward == "keep"
        assert not s.cudnn_benchmark
        assert s.cudnn_deterministic
        assert not s.allow_tf32
    assert repro.train.swaps == "auto"
    assert repro.train.intercept
    assert repro.deploy.swaps == "none"  # deploy keeps standard modules (export)
    assert balanced.train.deterministic_algorithms == "strict"
    assert balanced.train.backward == "disable"
    assert balanced.val.backward == "keep"
    assert fast.train.deterministic_algorithms == "off"
    assert fast.train.cudnn_benchmark
    assert fast.train.allow_tf32
    assert fast.val.deterministic_algorithms == "strict"
    assert not fast.val.cudnn_benchmark
    assert "bitwise" in balanced.description  # the trade-off is stated


def test_user_profile_extends_defaults_and_phase_overrides(tmp_path):
    path = write(
        tmp_path,
        """
name: mine
extends: repro
defaults:
  fill_uninitialized_memory: false
  env: {NCCL_ALGO: Ring}
train:
  cudnn_benchmark: true
  seed: 7
""",
    )
    p = load_profile(path)
    assert p.name == "mine"
    assert p.source == str(path)
    assert p.train.cudnn_benchmark
    assert p.train.seed == 7
    assert p.train.swaps == "auto"
    assert not p.val.cudnn_benchmark
    assert p.val.seed is None
    assert all(not p.phase(ph).fill_uninitialized_memory for ph in PHASES)
    assert dict(p.deploy.env) == {"NCCL_ALGO": "Ring"}  # a defaults mapping replaces the inherited one
    assert p.description == load_profile("repro").description


def test_profile_without_extends_starts_from_dataclass_defaults(tmp_path):
    p = load_profile(write(tmp_path, "val:\n  deterministic_algorithms: warn\n", name="plain.yml"))
    assert p.name == "plain"
    assert p.train == PhaseSettings()
    assert p.val.deterministic_algorithms == "warn"


def test_extends_a_relative_file_and_detects_cycles(tmp_path):
    write(tmp_path, "extends: b.yaml\n", name="a.yaml")
    write(tmp_path, "extends: a.yaml\n", name="b.yaml")
    with pytest.raises(ProfileError, match="cycle"):
        load_profile(tmp_path / "a.yaml")
    write(tmp_path, "extends: fast\ntrain:\n  allow_tf32: false\n", name="base.yaml")
    child = load_profile(write(tmp_path, "extends: base.yaml\n", name="child.yaml"))
    assert child.train.deterministic_algorithms == "off"
    assert not child.train.allow_tf32


def test_roundtrip_through_yaml(tmp_path):
    for name in BUILTIN_PROFILES:
        p = load_profile(name)
        again = load_profile(write(tmp_path, p.to_yaml(), name=f"{name}-copy.yaml"))
        assert all(again.phase(ph) == p.phase(ph) for ph in PHASES)
        assert again.description == p.description


def test_unknown_name_suggests_close_match():
    with pytest.raises(ProfileError) as e:
        load_profile("repo")
    msg = str(e.value)
    assert "unknown profile 'repo'" in msg
    assert "Did you mean 'repro'?" in msg
    assert "balanced, fast, portable, repro" in msg
    assert "\n" not in msg


def test_missing_file():
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("nope/missing.yaml")


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("train:\n  cudnn_benchmrk: true\n", 2, "Did you mean 'cudnn_benchmark'"),
        ("name: x\ntrian:\n  seed: 1\n", 2, "Did you mean 'train'"),
        ("train:\n  seed: -1\n", 2, "'seed' must be null or an integer"),
        ("train:\n  seed: true\n", 2, "'seed' must be null or an integer"),
        ("val:\n  cudnn_deterministic: 'yes please'\n", 2, "must be true or false"),
        ("deploy:\n  deterministic_algorithms: strcit\n", 2, "Did you mean 'strict'"),
        ("defaults:\n  backward: off\n", 2, "'backward' must be one of keep, disable"),
        ("train: [1, 2]\n", 1, "'train' must be a mapping"),
        ("defaults:\n  env: {PYTHONHASHSEED: [1]}\n", 2, "'env.PYTHONHASHSEED' must be a string or null"),
        ("defaults:\n  env: {YOLO_DET_CACHE: /tmp/x}\n", 2, "may set only the variables that decide determinism"),
        ("train:\n  env: {PYTHONPATH: .}\n", 2, "not 'PYTHONPATH'; set it in your shell instead"),
        ("train:\n  env: {OMP_NUM_THREAD: '1'}\n", 2, "Did you mean 'OMP_NUM_THREADS'"),
        ("extends: 3\n", 1, "'extends' must be a profile name or path"),
        ("name: x\ntrain:\n  seed: 1\n   bad: indent\n", 4, "malformed YAML"),
    ],
)
def test_validation_errors_name_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}"), msg
    assert fragment in msg
    assert "\n" not in msg


def test_empty_and_non_mapping_files(tmp_path):
    with pytest.raises(ProfileError, match="empty"):
        load_profile(write(tmp_path, "# nothing\n"))
    with pytest.raises(ProfileError, match="must be a mapping"):
        load_profile(write(tmp_path, "- a\n- b\n", name="list.yaml"))


def test_yaml_off_reads_as_off_not_false(tmp_path):
    p = load_profile(write(tmp_path, "train:\n  deterministic_algorithms: off\n"))
    assert p.train.deterministic_algorithms == "off"
    assert not p.train.deterministic


def test_phase_lookup_and_replace():
    p = load_profile("repro")
    with pytest.raises(ProfileError, match="Did you mean 'train'"):
        p.phase("trian")
    s = p.train.replace(cudnn_benchmark=True)
    assert s.cudnn_benchmark
    assert not p.train.cudnn_benchmark
    with pytest.raises(ProfileError, match="must be true or false"):
        p.train.replace(cudnn_benchmark="yes")
    assert isinstance(p, Profile)
    assert load_profile(p) is p
    assert hash(p.train) == hash(load_profile("repro").train)


def test_env_is_an_allow_list_of_the_variables_that_decide_determinism(tmp_path, capsys):
    from yolo_det.cli import main
    from yolo_det.core.machine_settings import ISA_ENV, PRESTART_ENV
    from yolo_det.core.profiles import ENV_VARIABLES

    # every variable yolo-det itself sets for determinism may be named in a profile
    assert {k for table in ISA_ENV.values() for k in table} <= set(ENV_VARIABLES)
    assert set(PRESTART_ENV) <= set(ENV_VARIABLES)
    for preset in ("repro", "portable", "balanced", "fast"):
        assert set(load_profile(preset).train.env) <= set(ENV_VARIABLES)
    mine = write(tmp_path, "extends: repro\ntrain:\n  env: {OMP_NUM_THREADS: '1', MKL_CBWR: COMPATIBLE}\n")
    assert dict(load_profile(mine).train.env)["OMP_NUM_THREADS"] == "1"  # control: allowed names load
    shared = tmp_path / "shared.yaml"
    shared.write_text("extends: repro\ndefaults:\n  env: {YOLO_DET_CACHE: /tmp/elsewhere, LD_PRELOAD: x.so}\n")
    assert main(["train", "--profile", str(shared), f"project={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "'YOLO_DET_CACHE'" in err
    assert not (tmp_path / "train").exists()


@pytest.mark.parametrize(
    "secret",
    [
        "root:$6$SECRETHASH:19000:0:99999:7:::\n  bad: [indent\n",  # malformed YAML: its line would be quoted
        "SECRET_TOKEN: abc\n",  # a mapping: its key would be named
        "train:\n  seed: SECRET_VALUE\n",  # a profile with a bad value: the value would be shown
    ],
)
def test_an_extends_error_never_shows_the_extended_files_text(tmp_path, secret):
    target = tmp_path / "private" / "shadow"
    target.parent.mkdir()
    target.write_text(secret)
    (tmp_path / "link.yaml").symlink_to(target)
    shared = write(tmp_path, "extends: link.yaml\n", name="shared.yaml")
    with pytest.raises(ProfileError) as e:
        load_profile(shared)
    msg = str(e.value)
    assert "SECRET" not in msg
    assert "'extends: link.yaml' is not a valid profile" in msg
    assert "profiles show link.yaml" in msg
    with pytest.raises(ProfileError) as own:  # named by the user, the file's own error says what is wrong
        load_profile(tmp_path / "link.yaml")
    assert "is not a valid profile" not in str(own.value)
    assert str(own.value).startswith(str(tmp_path / "link.yaml"))
    cycle = write(tmp_path, "extends: shared2.yaml\n", name="shared2.yaml")
    with pytest.raises(ProfileError, match="forms a cycle"):  # errors holding no file text still pass through
        load_profile(cycle)
