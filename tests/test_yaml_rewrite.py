"""Model-YAML rewriting: only module names change, comments stay, the reverse gives the original back."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
import torch

from yolo_det.cli import main
from yolo_det.core.errors import ConfigError, ModelError
from yolo_det.fixes.yaml_rewrite import rewrite_yaml, rewrite_yaml_text

MODEL = """\
# A test detector whose neck has every kind of layer the rewriter knows.
nc: 3 # classes
backbone:
  # [from, repeats, module, args]
  - [-1, 1, Conv, [16, 3, 2]] # 0-P1/2
  - [-1, 1, Conv, [32, 3, 2]] # 1-P2/4
  - [-1, 1, C2f, [32, True]]  # 2
  - [-1, 1, Conv, [64, 3, 2]] # 3-P3/8
  - [-1, 1, 'nn.ReflectionPad2d', [0]]   # 4 identity-sized pad, quoted name
  - [-1, 1, Conv, [96, 3, 2]] # 5-P4/16
  - [-1, 1, C2f, [96, True]] # 6
  - [-1, 1, Conv, [128, 3, 2]] # 7-P5/32
  - [-1, 1, SPPF, [128, 5]] # 8

head:
  - [-1, 1, nn.Upsample, [None, 2, "bicubic"]]   # 9  bicubic: no deterministic CUDA backward
  - [[-1, 6], 1, Concat, [1]] # 10
  - [-1, 1, C2f, [96]] # 11
  - [-1, 1, "nn.Upsample", [None, 2, "bilinear"]] # 12 bilinear: decomposed on torch >= 2.1
  - [[-1, 3], 1, Concat, [1]] # 13
  - [-1, 1, C2f, [64]] # 14 (P3/8)
  - [-1, 1, Conv, [64, 3, 2]] # 15
  - [[-1, 11], 1, Concat, [1]] # 16
  - [-1, 1, C2f, [96]] # 17 (P4/16)
  - [-1, 1, Conv, [96, 3, 2]] # 18
  - [[-1, 8], 1, Concat, [1]] # 19
  - [-1, 1, C2f, [128]] # 20 (P5/32)
  - [[14, 17, 20], 1, Detect, [nc]] # 21
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rewrite_changes_only_the_needed_names_and_reverse_restores_the_text():
    result = rewrite_yaml_text(MODEL, origin="m.yaml")
    assert [(c.layer, c.old, c.new) for c in result.changes] == [(9, "nn.Upsample", "DetUpsample")]
    assert result.changes[0].reason == "upsample_bicubic2d_backward_out_cuda"
    before, after = MODEL.splitlines(), result.text.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert changed == [result.changes[0].line - 1]
    assert len(before) == len(after)
    assert after[changed[0]] == (
        '  - [-1, 1, DetUpsample, [None, 2, "bicubic"]]   # 9  bicubic: no deterministic CUDA backward'
    )
    assert result.layers == 22
    assert result.params > 0
    back = rewrite_yaml_text(result.text, reverse=True, origin="m.yaml")
    assert back.text == MODEL
    assert [c.reason for c in back.changes] == ["reverse"]


def test_older_torch_and_policy_all_rewrite_more():
    old = rewrite_yaml_text(MODEL, torch_version="2.0.1")
    assert [c.layer for c in old.changes] == [4, 9, 12]  # reflection pad 2d and bilinear alert there
    assert "'DetReflectionPad2d'" in old.text
    assert '"DetUpsample", [None, 2, "bilinear"]' in old.text
    every = rewrite_yaml_text(MODEL, policy="all")
    assert [c.layer for c in every.changes] == [4, 9, 12]
    assert rewrite_yaml_text(every.text, reverse=True).text == MODEL


class _UsersCBAM(torch.nn.Module):
    """The user's own CBAMMax, with a max pool inside (the YAML cannot name it)."""

    def __init__(self, c1: int, *args: object) -> None:
        super().__init__()
        self.max_pool = torch.nn.AdaptiveMaxPool2d(1)
        self.fc = torch.nn.Conv2d(c1, c1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(self.max_pool(x)))


def test_example_blocks_become_their_deterministic_variants_and_back():
    text = (Path(__file__).resolve().parent.parent / "data" / "models" / "cbam-max.yaml").read_text()
    result = rewrite_yaml_text(text)
    assert [(c.layer, c.old, c.new) for c in result.changes] == [(10, "CBAMMax", "DetCBAMMax")]
    assert "adaptive_max_pool2d_backward_cuda" in result.changes[0].reason
    assert result.inside_blocks == []
    assert rewrite_yaml_text(result.text, reverse=True).text == text


def test_the_users_blocks_are_listed_never_renamed(monkeypatch):
    from ultralytics.nn import tasks

    monkeypatch.setitem(vars(tasks), "CBAMMax", _UsersCBAM)
    text = (Path(__file__).resolve().parent.parent / "data" / "models" / "cbam-max.yaml").read_text()
    result = rewrite_yaml_text(text)
    assert result.changes == []
    assert result.text == text
    assert [(b["layer"], b["module"]) for b in result.inside_blocks] == [(10, "model.10.max_pool")]


@pytest.mark.slow  # more than 2 s
def test_file_rewrite_check_and_in_place(tmp_path, capsys):
    src = tmp_path / "m.yaml"
    src.write_text(MODEL)
    digest = sha(src)
    assert main(["rewrite", str(src), "--check"]) == 1
    assert sha(src) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]
    out = tmp_path / "m-det.yaml"
    assert main(["rewrite", str(src), "-o", str(out)]) == 0
    assert sha(src) == digest
    assert "DetUpsample" in out.read_text()
    assert main(["rewrite", str(out), "--check"]) == 0  # nothing left to rewrite
    assert main(["audit", str(out), "--imgsz", "64"]) == 0  # the rewritten YAML builds and audits clean
    assert main(["rewrite", str(out), "--reverse", "--in-place"]) == 0
    assert out.read_text() == MODEL
    capsys.readouterr()
    assert main(["rewrite", str(src), "--check", "--json"]) == 1
    assert '"changed": true' in capsys.readouterr().out


BAD = [
    (lambda d: [str(d / "missing.yaml"), "-o", str(d / "o.yaml")], "does not exist"),
    (lambda d: [str(d / "m.yaml")], "no output: give -o OUT.yaml, --in-place, or --check"),
    (lambda d: [str(d / "m.yaml"), "-o", str(d / "exists.yaml")], "exists; choose another path or pass --force"),
    (lambda d: [str(d / "m.yaml"), "-o", str(d / "nodir" / "o.yaml")], "does not exist"),
    (lambda d: [str(d / "m.yaml"), "-o", str(d / "ro" / "o.yaml")], "is not writable"),
    (lambda d: [str(d / "m.yaml"), "-o", str(d / "m.yaml")], "the output is the input"),
    (lambda d: [str(d / "unknown.yaml"), "-o", str(d / "o.yaml")], "unknown module"),
    (lambda d: [str(d / "broken.yaml"), "-o", str(d / "o.yaml")], "malformed YAML"),
    (lambda d: [str(d / "notmodel.yaml"), "-o", str(d / "o.yaml")], "not an Ultralytics model YAML"),
    (lambda d: [str(d / "m.yaml"), "-o", str(d / "o.yaml"), "--in-place"], "not allowed with argument"),
]


@pytest.mark.parametrize(("argv", "fragment"), BAD)
def test_bad_input_one_line_exit_2_input_untouched(argv, fragment, tmp_path, capsys):
    if os.geteuid() == 0 and "writable" in fragment:
        pytest.skip("root can write into a read-only folder")
    (tmp_path / "m.yaml").write_text(MODEL)
    (tmp_path / "exists.yaml").write_text("keep me\n")
    (tmp_path / "unknown.yaml").write_text(MODEL.replace("C2f, [96]]", "C2ff, [96]]", 1))
    (tmp_path / "broken.yaml").write_text("backbone: [[-1, 1, Conv\n")
    (tmp_path / "notmodel.yaml").write_text("names: [a, b]\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    before = {p: sha(p) for p in tmp_path.rglob("*") if p.is_file()}
    try:
        code = main(["rewrite", *argv(tmp_path)])
    finally:
        ro.chmod(stat.S_IRWXU)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert fragment in err, err
    assert {p: sha(p) for p in tmp_path.rglob("*") if p.is_file()} == before


def test_api_errors_are_typed(tmp_path):
    with pytest.raises(ConfigError, match="policy must be"):
        rewrite_yaml_text(MODEL, policy="most")
    with pytest.raises(ModelError, match="does not build"):
        rewrite_yaml_text(MODEL.replace("[16, 3, 2]", "[16, 3, 2, 1, 1, 1, 1, 1, 1]", 1))
    src = tmp_path / "m.txt"
    src.write_text(MODEL)
    with pytest.raises(ConfigError, match="not a .yaml file"):
        rewrite_yaml(src, tmp_path / "o.yaml")


@pytest.mark.parametrize("name", ["bicubic-up", "cbam-max", "coordatt", "gridsample-up", "attention-mix"])
def test_every_rewritten_example_builds_and_audits_clean(name, tmp_path, capsys):
    """`rewrite` by example name (no path), then `audit` and `yolo_det.audit()` of what it wrote: exit 0 / ok."""
    import json

    import yolo_det

    out = tmp_path / f"{name}-det.yaml"
    assert main(["rewrite", f"{name}.yaml", "-o", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changed"]
    assert result["inside_blocks"] == []
    assert main(["audit", str(out), "--imgsz", "64"]) == 0
    if name == "cbam-max":  # the Python entry point builds the rewritten YAML too
        assert yolo_det.audit(str(out), imgsz=64).ok
