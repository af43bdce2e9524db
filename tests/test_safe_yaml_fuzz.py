"""Fuzzing the override parser and the profile loader with hostile YAML: alias bombs, deep nesting, cycles,
merge-key bombs, huge numbers. Each answer comes within a second, and is a value or the documented one-line
error (ConfigError / ProfileError), nothing else.

Time is the process's CPU time: the tests run on machines shared with other jobs, where wall time also
counts the waits for a core."""

from __future__ import annotations

import string
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yolo_det.core.errors import ConfigError, ProfileError
from yolo_det.core.profiles import load_profile
from yolo_det.core.untrusted import safe_yaml
from yolo_det.tools.overrides import parse_overrides

LIMIT_S = 1.0
MAX_MESSAGE = 1000


@st.composite
def alias_bomb(draw: st.DrawFn) -> str:
    """``a: &a [x, ...]``, then levels of ``width`` aliases of the level before (flow or block, lists or maps)."""
    width = draw(st.integers(2, 12))
    levels = draw(st.integers(1, 12))
    as_map = draw(st.booleans())
    leaf = draw(st.sampled_from(["x", "1", "'s'", "{k: v}", "[1, 2]"]))
    lines = [f"l0: &l0 [{', '.join([leaf] * width)}]"]
    for i in range(1, levels + 1):
        if as_map:
            items = ", ".join(f"k{j}: *l{i - 1}" for j in range(width))
            lines.append(f"l{i}: &l{i} {{{items}}}")
        else:
            lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@st.composite
def merge_bomb(draw: st.DrawFn) -> str:
    """Merge keys (``<<``) of merges: each level merges the previous one several times."""
    levels = draw(st.integers(1, 16))
    width = draw(st.integers(2, 6))
    lines = ["m0: &m0 {a: 1, b: 2, c: 3}"]
    for i in range(1, levels + 1):
        merged = ", ".join([f"*m{i - 1}"] * width)
        lines.append(f"m{i}: &m{i} {{<<: [{merged}], k{i}: {i}}}")
    return "\n".join(lines) + "\n"


@st.composite
def nesting(draw: st.DrawFn) -> str:
    depth = draw(st.integers(1, 4000))
    kind = draw(st.sampled_from(["flow-list", "flow-map", "block", "mixed"]))
    if kind == "flow-list":
        return "[" * depth + "1" + "]" * depth
    if kind == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if kind == "block":
        depth = min(depth, 300)
        return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "v\n"
    return "[{a: " * (depth // 2) + "1" + "}]" * (depth // 2)


@st.composite
def cycle(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["&a [*a]", "&a {k: *a}", "&a [1, [2, *a]]", "&a {k: [*a, *a]}", "x: &a [*a, *a, *a]"]))


GARBAGE = st.text(string.printable + "&*[]{}:,-!|>'\"%@`", max_size=300)
HUGE_NUMBERS = st.sampled_from(["9" * 5000, "1e999999", "-" + "9" * 4400, "0x" + "f" * 5000, ".inf", "1_0" * 2000])
HOSTILE = st.one_of(alias_bomb(), merge_bomb(), nesting(), cycle(), GARBAGE, HUGE_NUMBERS)
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


def _one_line(e: Exception) -> None:
    text = str(e)
    assert text, text[:2000]
    assert "\n" not in text, text[:2000]
    assert len(text) <= MAX_MESSAGE, text[:2000]


@FUZZ
@given(text=HOSTILE, key=st.sampled_from(["epochs", "imgsz", "name", "lr0"]))
def test_override_parser_answers_fast_and_in_one_line(text: str, key: str) -> None:
    start = time.process_time()
    try:
        parsed = parse_overrides([f"{key}={text}"])
        repr(parsed)  # whatever came back can be shown without expanding anything
    except ConfigError as e:
        _one_line(e)
    assert time.process_time() - start < LIMIT_S


@FUZZ
@given(text=HOSTILE, where=st.sampled_from(["top", "seed", "env", "name", "defaults"]))
def test_profile_loader_answers_fast_and_in_one_line(text: str, where: str, tmp_path: Path) -> None:
    indented = "\n".join("  " + line for line in text.splitlines())
    doc = {
        "top": text,
        "seed": f"extends: repro\nbombs:\n{indented}\ntrain:\n  seed: 1\n",
        "env": f"train:\n  env:\n    PYTHONHASHSEED:\n{indented}\n",
        "name": f"name:\n{indented}\n",
        "defaults": f"defaults:\n{indented}\n",
    }[where]
    path = tmp_path / "fuzz.yaml"
    path.write_text(doc, encoding="utf-8")
    start = time.process_time()
    try:
        load_profile(path)
    except ProfileError as e:
        _one_line(e)
    assert time.process_time() - start < LIMIT_S


@pytest.mark.parametrize(
    "text",
    [
        "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
        + "".join(f"{n}: &{n} [{','.join(['*' + p] * 10)}]\n" for p, n in zip("abcdefghi", "bcdefghij"))
        + "train:\n  seed: *j\n",
        "train: " + "[" * 500 + "]" * 500,
        "&a [*a]",
    ],
)
def test_a_hostile_1kb_profile_answers_within_a_second(text: str, tmp_path: Path) -> None:
    assert len(text.encode()) <= 1024
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    start = time.process_time()
    with pytest.raises(ProfileError) as e:
        load_profile(path)
    assert time.process_time() - start < LIMIT_S
    _one_line(e.value)


def test_legitimate_aliases_and_numbers_still_load() -> None:
    assert safe_yaml.load("a: &a [1, 2]\nb: *a\n") == {"a": [1, 2], "b": [1, 2]}
    assert safe_yaml.load("base: &b {x: 1}\nd: {<<: *b, y: 2}\n")["d"] == {"x": 1, "y": 2}
    assert safe_yaml.load("v: 1e-3") == {"v": "1e-3"}  # YAML 1.1 for files
    assert safe_yaml.load("1e-3", numbers=True) == 0.001
    assert safe_yaml.load("5E4", numbers=True) == 50000.0
    assert safe_yaml.load("-2.5e+2", numbers=True) == -250.0
    assert safe_yaml.load("1e", numbers=True) == "1e"
    assert parse_overrides(["lr0=1e-3", "weight_decay=5e-4", "name=1e3x"]) == {
        "lr0": 0.001,
        "weight_decay": 0.0005,
        "name": "1e3x",
    }
    with pytest.raises(yaml.YAMLError):
        safe_yaml.load("[" * 65 + "]" * 65)
    safe_yaml.load("[" * 60 + "]" * 60)  # deep but within bounds
    assert (
        safe_yaml.load("'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['  # [[[[[[[[")
        == "[" * 72
    )
