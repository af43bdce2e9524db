"""A new profile setting touches the profile schema and one extension, nothing else.

The setting and its extension below are defined here, with the public hooks only (``register_setting``,
``register_extension``): the profile loader, ``PhaseSettings``, the session and ``to_dict``/``to_yaml``
take them up without a change.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from yolo_det.core.errors import ProfileError
from yolo_det.core.profiles import PhaseSettings, Setting, load_profile, register_setting, unregister_setting
from yolo_det.session.extensions import Extension, PhaseContext, register_extension, unregister_extension
from yolo_det.session.session import DeterminismSession

#: Stands for a process-wide switch the new setting controls (a torch flag, a library's global mode).
SWITCH = {"value": "the user's"}


def _check_marker(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"must be a string or null, got {value!r}")
    return value


MARKER = Setting("test_marker", default=None, check=_check_marker, doc="test only: sets SWITCH while a phase runs")


class MarkerExtension(Extension):
    """Applies ``test_marker``: sets the switch for the phase; undo puts back what was there."""

    name = "test_marker"

    def apply(self, ctx: PhaseContext) -> Any:
        want = ctx.settings.extra["test_marker"]
        if want is None:
            return None
        before = SWITCH["value"]
        SWITCH["value"] = want
        return before

    def undo(self, token: Any) -> None:
        SWITCH["value"] = token


@pytest.fixture
def marker():
    register_setting(MARKER)
    register_extension(MarkerExtension)
    try:
        yield
    finally:
        unregister_extension(MarkerExtension)
        unregister_setting("test_marker")
        SWITCH["value"] = "the user's"


def _profile(tmp_path, text: str):
    path = tmp_path / "marked.yaml"
    path.write_text(text, encoding="utf-8")
    return load_profile(path)


def test_the_new_setting_is_read_from_a_profile_and_shown(tmp_path, marker) -> None:
    profile = _profile(tmp_path, "name: marked\nextends: repro\ntrain:\n  test_marker: training\n")
    assert profile.train.extra["test_marker"] == "training"
    assert profile.val.extra["test_marker"] is None  # the default where the profile does not say
    assert profile.train.to_dict()["test_marker"] == "training"
    assert profile.train.replace(test_marker="other").extra["test_marker"] == "other"
    assert pickle.loads(pickle.dumps(profile.train)) == profile.train
    again = _profile(tmp_path, profile.to_yaml())
    assert again.train == profile.train
    assert again.val == profile.val


def test_the_new_setting_is_applied_and_undone_in_a_phase(tmp_path, marker) -> None:
    profile = _profile(tmp_path, "extends: repro\ntrain:\n  test_marker: training\n")
    session = DeterminismSession(profile, seed=0)
    with session.run():
        assert SWITCH["value"] == "the user's"
        with session.phase_scope("train"):
            assert SWITCH["value"] == "training"
            with session.phase_scope("val"):  # val leaves the switch as it finds it
                assert SWITCH["value"] == "training"
        assert SWITCH["value"] == "the user's"
    with pytest.raises(RuntimeError, match="boom"), session.run(), session.phase_scope("train"):
        assert SWITCH["value"] == "training"
        raise RuntimeError("boom")
    assert SWITCH["value"] == "the user's"  # undone on error too


def test_a_bad_value_is_a_one_line_profile_error(tmp_path, marker) -> None:
    with pytest.raises(ProfileError, match=r"marked\.yaml:2: .*'test_marker' must be a string or null, got 3"):
        _profile(tmp_path, "train:\n  test_marker: 3\n")
    with pytest.raises(ProfileError, match="taken"):
        register_setting(Setting("seed", default=None, check=_check_marker))


def test_without_registration_the_setting_does_not_exist(tmp_path) -> None:
    with pytest.raises(ProfileError, match="unknown setting 'test_marker'"):
        _profile(tmp_path, "train:\n  test_marker: training\n")
    assert "test_marker" not in PhaseSettings().to_dict()
    assert not any(isinstance(e, MarkerExtension) for e in DeterminismSession("repro").extensions)
