"""The knowledge table: schema, version handling, and its claims checked against the installed torch."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

import pytest
import torch
import torchvision  # registers torchvision:: ops

from yolo_det.analysis.optable import (
    BEHAVIOUR,
    OpEntry,
    decomposable_op,
    function_name,
    load_table,
    parse_table,
    parse_version,
    version_in,
)
from yolo_det.core.errors import ConfigError

TABLE = load_table()
RUNNING = torch.__version__

# The deterministic replacements yolo-det ships (fixed names: the layers are written elsewhere).
ALLOWED_TARGETS = {
    "yolo_det.layers.pooling.DetAdaptiveAvgPool2d",
    "yolo_det.layers.pooling.DetAdaptiveMaxPool2d",
    "yolo_det.layers.pooling.adaptive_avg_pool2d",
    "yolo_det.layers.pooling.adaptive_max_pool2d",
    "yolo_det.layers.upsample.DetUpsample",
    "yolo_det.layers.upsample.interpolate",
    "yolo_det.layers.grid_sample.grid_sample",
    "yolo_det.layers.padding.DetReflectionPad1d",
    "yolo_det.layers.padding.DetReflectionPad2d",
    "yolo_det.layers.padding.DetReflectionPad3d",
    "yolo_det.layers.padding.DetReplicationPad1d",
    "yolo_det.layers.padding.DetReplicationPad2d",
    "yolo_det.layers.padding.DetReplicationPad3d",
    "yolo_det.layers.padding.pad",
    "yolo_det.layers.loss.DetCrossEntropyLoss",
    "yolo_det.layers.loss.DetNLLLoss",
    "yolo_det.layers.loss.cross_entropy",
    "yolo_det.layers.loss.nll_loss",
}


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    obj: object = __import__(module, fromlist=[name])
    return getattr(obj, name)


# ---------------------------------------------------------------------------------------------------------
# versions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.14.1+cu130", (2, 14, 1)),
        ("2.1", (2, 1, 0)),
        ("2.15.0a0+git123", (2, 15, 0)),
        ("1.8.1", (1, 8, 1)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int]) -> None:
    assert parse_version(text) == expected


def test_parse_version_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="not a torch version"):
        parse_version("latest")


@pytest.mark.parametrize(
    ("spec", "version", "inside"),
    [
        (">=2.1", "2.1.0", True),
        (">=2.1", "2.0.1", False),
        (">=1.8,<2.1", "2.0.1", True),
        (">=1.8,<2.1", "2.1.0", False),
        ("<2.14", "2.13.9", True),
        ("==2.2", "2.2.0", True),
        ("!=2.2", "2.2.0", False),
        ("", "9.9", True),
    ],
)
def test_version_in(spec: str, version: str, inside: bool) -> None:
    assert version_in(spec, version) is inside


def test_version_in_rejects_bad_clause() -> None:
    with pytest.raises(ConfigError, match="bad version clause"):
        version_in("~=2.1", "2.1")


def test_bilinear_rule_depends_on_the_torch_version() -> None:
    entry = TABLE.entry("upsample_bilinear2d")
    assert entry.rule("2.0.1") == "always"
    assert entry.rule("2.1.0") == "native_path"
    assert entry.rule("1.7.0") is None  # before use_deterministic_algorithms existed


def test_active_entries_differ_between_versions() -> None:
    old = {e.id for e, _ in TABLE.active("2.0.1")}
    new = {e.id for e, _ in TABLE.active(RUNNING)}
    assert "reflection_pad2d" in old
    assert "reflection_pad2d" not in new
    assert {"adaptive_max_pool2d", "grid_sampler_2d"} <= old & new


@pytest.mark.parametrize(
    ("when", "via", "det", "reached"),
    [
        ("always", True, True, True),
        ("native_path", True, True, False),  # F.interpolate under the flag: CUDA decomposes
        ("native_path", True, False, True),  # forward ran with the flag off
        ("native_path", False, True, True),  # the aten op called directly
        ("native_path", True, None, True),
        ("never", False, False, False),
    ],
)
def test_reaches(when: str, via: bool, det: bool | None, reached: bool) -> None:
    assert OpEntry.reaches(when, via_functional=via, forward_deterministic=det) is reached


# ---------------------------------------------------------------------------------------------------------
# the data file against the installed torch


def test_every_op_exists_in_the_installed_torch() -> None:
    for entry in TABLE:
        for op in (*entry.ops, *entry.forward_ops):
            namespace, name = op.split("::")
            name, _, overload = name.partition(".")
            packet = getattr(getattr(torch.ops, namespace), name)
            assert (overload or "default") in packet.overloads(), f"{entry.id}: {op}"


def test_every_node_exists_in_the_installed_torch() -> None:
    for entry in TABLE:
        for node in entry.nodes:
            assert hasattr(torch._C._functions, node), f"{entry.id}: no autograd node {node}"


def test_fixes_name_real_torch_classes_and_the_fixed_swap_targets() -> None:
    for entry in TABLE:
        for source, target in {**entry.fix.modules, **entry.fix.functions}.items():
            assert callable(_resolve(source)), f"{entry.id}: {source}"
            assert target in ALLOWED_TARGETS, f"{entry.id}: unexpected swap target {target}"
        if not entry.fix.has_swap:
            assert entry.fix.note


def test_entries_without_a_swap_say_toggle_or_accept() -> None:
    for entry_id in ("deform_conv2d", "ctc_loss", "embedding_bag_max", "extension"):
        assert TABLE.entry(entry_id).fix.describe() == "scoped toggle (profile balanced) or accept"


def test_behaviour_per_effect() -> None:
    assert BEHAVIOUR["alert"]["strict"] == "raises RuntimeError"
    assert "warns" in BEHAVIOUR["alert"]["warn"]
    assert "non-deterministic" in BEHAVIOUR["alert"]["warn"]
    assert BEHAVIOUR["warn_only"]["strict"] == "deterministic algorithm"
    assert all("non-deterministic" in text for text in BEHAVIOUR["silent"].values())


def test_decomposition_branches_are_in_the_installed_functional_py() -> None:
    # The table's native_path entries rely on these Python-level branches of torch/nn/functional.py.
    source = Path(torch.nn.functional.__file__).read_text(encoding="utf-8")
    assert "_upsample_linear_vec" in source
    assert "_replication_pad" in source
    assert "torch.are_deterministic_algorithms_enabled()" in source
    native = {e.id for e, when in TABLE.active(RUNNING) if when == "native_path"}
    assert {"upsample_bilinear2d", "replication_pad"} <= native


def test_decomposable_op() -> None:
    x4, x5 = torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 2, 4, 4)
    interp, pad = "torch.nn.functional.interpolate", "torch.nn.functional.pad"
    assert decomposable_op(interp, (x4,), {"scale_factor": 2, "mode": "bilinear"}) == "aten::upsample_bilinear2d"
    assert decomposable_op(interp, (x4,), {"scale_factor": 2, "mode": "bilinear", "antialias": True}) is None
    assert decomposable_op(interp, (x4, None, 2, "bicubic"), {}) is None
    assert decomposable_op(interp, (x5,), {"scale_factor": 2, "mode": "trilinear"}) == "aten::upsample_trilinear3d"
    assert decomposable_op(pad, (x4, (1, 1, 1, 1)), {"mode": "replicate"}) == "aten::replication_pad2d"
    assert decomposable_op(pad, (x4, (1, 1, 1, 1)), {"mode": "reflect"}) is None
    assert decomposable_op("torch.cat", ([x4],), {}) is None


def test_function_name() -> None:
    assert function_name(torch.nn.functional.interpolate) == "torch.nn.functional.interpolate"
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert function_name(sdpa) == "torch.nn.functional.scaled_dot_product_attention"
    assert function_name(torch.nn.functional.adaptive_max_pool2d) == "torch.nn.functional.adaptive_max_pool2d"
    assert function_name(torch.cat) == "torch.cat"


def _rodata(lib: Path) -> bytes:
    """The .rodata section of an ELF64 library (where string literals live)."""
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (shoff,) = struct.unpack_from("<Q", mm, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", mm, 0x3A)
        headers = [struct.unpack_from("<IIQQQQIIQQ", mm, shoff + i * shentsize) for i in range(shnum)]
        names_at = headers[shstrndx][4]
        for name, _type, _flags, _addr, offset, size, *_ in headers:
            if mm[names_at + name : mm.find(b"\0", names_at + name)] == b".rodata":
                return bytes(mm[offset : offset + size])
    raise AssertionError(f"{lib} has no .rodata")


@pytest.fixture(scope="module")
def cuda_literals() -> bytes:
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cuda.so"
    if not lib.is_file():
        pytest.skip("not a CUDA build of torch: no libtorch_cuda.so to check the alert literals against")
    return _rodata(lib)


def test_alert_literals_of_the_installed_torch(cuda_literals: bytes) -> None:
    # Every kernel the table says alerts on this torch must still have its alert literal in the binary
    # (torchvision's ops in torchvision's own library).
    vision = next(iter(sorted(Path(torchvision.__file__).parent.glob("_C*.so"))), None)
    vision_literals = _rodata(vision) if vision is not None else None
    for entry, _when in TABLE.active(RUNNING):
        if entry.effect != "alert":
            continue
        literals = cuda_literals
        if all(op.startswith("torchvision::") for op in entry.ops):
            if vision_literals is None:
                continue
            literals = vision_literals
        assert entry.kernel.encode() + b"\0" in literals, f"{entry.id}: '{entry.kernel}' not in the binary"


def test_reflection_pad2d_alert_is_gone_from_the_installed_torch(cuda_literals: bytes) -> None:
    if parse_version(RUNNING) < (2, 11, 0):
        pytest.skip("the table says reflection_pad2d still alerts before 2.11")
    assert TABLE.entry("reflection_pad2d").rule(RUNNING) == "never"
    for literal in (b"reflection_pad2d_backward_cuda\0", b"reflection_pad2d_backward_out_cuda\0"):
        assert literal not in cuda_literals
    assert b"reflection_pad1d_backward_out_cuda\0" in cuda_literals  # the 1-D one still alerts


def test_message_templates_match_the_binary() -> None:
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    if not lib.is_file():
        pytest.skip("no libtorch_cpu.so")
    rodata = _rodata(lib)
    for mode in ("strict", "warn"):
        tail = TABLE.messages[mode].split("{kernel}", 1)[1]
        assert tail.encode() in rodata, mode


# ---------------------------------------------------------------------------------------------------------
# parsing errors name the file and line


GOOD_ENTRY = """\
  - id: a
    kernel: a_cuda
    pass: backward
    effect: alert
    ops: [aten::adaptive_max_pool2d_backward]
    versions:
      - {torch: ">=1.8", when: always}
    fix:
      note: accept
"""


def _table(body: str) -> str:
    return 'messages:\n  strict: "{kernel} x"\n  warn: "{kernel} y"\nentries:\n' + body


def test_parse_a_minimal_table() -> None:
    table = parse_table(_table(GOOD_ENTRY), "t.yaml")
    assert [e.id for e in table] == ["a"]
    assert table.entry("a").line == 5
    assert table.message("k", warn_only=True) == "k y"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("effect: alert", "effect: loud"), "t.yaml:5: 'effect' must be one of"),
        (("pass: backward", "pass: sideways"), "t.yaml:5: 'pass' must be one of"),
        (("    fix:", "    colour: red\n    fix:"), "t.yaml:5: unknown key 'colour'"),
        ((">=1.8", "~1.8"), "bad version clause"),
        (("when: always", "when: sometimes"), "'when' must be one of"),
        (("aten::adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward"), "namespace::name"),
        (("      note: accept", "      note: ''"), "needs a swap"),
    ],
)
def test_parse_errors(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_table(_table(GOOD_ENTRY.replace(*change)), "t.yaml")


def test_duplicate_ids_and_malformed_yaml() -> None:
    with pytest.raises(ConfigError, match="duplicate entry id 'a'"):
        parse_table(_table(GOOD_ENTRY + GOOD_ENTRY), "t.yaml")
    with pytest.raises(ConfigError, match=r"t.yaml:\d+: malformed YAML"):
        parse_table("entries: [\n", "t.yaml")


def test_load_table_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(_table(GOOD_ENTRY), encoding="utf-8")
    assert load_table(path).entry("a").kernel == "a_cuda"
    with pytest.raises(ConfigError, match="does not exist"):
        load_table(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="no table entry 'b'"):
        load_table(path).entry("b")
