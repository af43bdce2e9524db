"""Fuzzing the profile loader: any input gives a valid profile or a one-line ProfileError, nothing else."""

from __future__ import annotations

import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yolo_det.core.errors import ProfileError
from yolo_det.core.profiles import PHASES, Profile, load_profile

KEYS = [
    "seed",
    "deterministic_algorithms",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "allow_tf32",
    "fill_uninitialized_memory",
    "backward",
    "swaps",
    "intercept",
    "env",
    "cudnn_benchmrk",
    "sed",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**33),
    st.floats(allow_nan=True),
    st.sampled_from(["off", "warn", "strict", "keep", "disable", "none", "auto", "all", "yes", ""]),
    st.text(string.printable, max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(string.ascii_letters, max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
SECTION = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5)
DOC = st.fixed_dictionaries(
    {},
    optional={
        "name": VALUES,
        "description": VALUES,
        "extends": st.sampled_from(["repro", "fast", "balanced", "nope", 3]),
        "defaults": st.one_of(SECTION, VALUES),
        "train": SECTION,
        "val": SECTION,
        "deploy": SECTION,
        "trian": SECTION,
    },
)


def check(path) -> None:
    try:
        profile = load_profile(path)
    except ProfileError as e:
        assert "\n" not in str(e)
        assert str(e)
        return
    assert isinstance(profile, Profile)
    for phase in PHASES:
        s = profile.phase(phase)
        assert s.deterministic_algorithms in {"off", "warn", "strict"}
        assert s.seed is None or (isinstance(s.seed, int) and 0 <= s.seed < 2**32)
        assert all(isinstance(v, (str, type(None))) for v in s.env.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=DOC)
def test_generated_profile_documents(tmp_path, doc):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    check(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(string.printable, max_size=200))
def test_arbitrary_text(tmp_path, text):
    path = tmp_path / "text.yaml"
    path.write_text(text)
    check(path)
