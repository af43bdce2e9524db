"""Fuzzing the YAML rewriter: generated model YAMLs either fail with a documented error or round-trip."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yolo_det.core.errors import ConfigError, ModelError
from yolo_det.fixes.yaml_rewrite import rewrite_yaml_text

LAYERS = st.one_of(
    st.just(("Conv", "[16, 3, 1]")),
    st.sampled_from(["nearest", "bilinear", "bicubic"]).map(lambda m: ("nn.Upsample", f'[None, 2, "{m}"]')),
    st.integers(1, 4).map(lambda k: ("nn.AdaptiveAvgPool2d", f"[{k}]")),
    st.sampled_from(["[1]", "[[4, 4]]", "[[None, 1]]"]).map(lambda a: ("nn.AdaptiveAvgPool2d", a)),
    st.integers(1, 3).map(lambda k: ("nn.AdaptiveMaxPool2d", f"[{k}]")),
    st.integers(0, 2).map(lambda p: ("nn.ReflectionPad2d", f"[{p}]")),
    st.integers(0, 2).map(lambda p: ("nn.ReplicationPad2d", f"[{p}]")),
    st.just(("nn.Identity", "[]")),
    st.just(("NoSuchBlock", "[16]")),  # an unknown name: a documented error
    st.just(("Conv", "[16, 3, 1, 1, 1, 1, 1, 1, 1]")),  # arguments that do not build: a documented error
)
QUOTES = st.sampled_from(["", "'", '"'])
COMMENTS = st.sampled_from(["", "  # a comment", " # 'quoted' and: colons", "\t# tab"])


@st.composite
def model_yaml(draw) -> str:
    lines = ["# generated", "nc: 3", "backbone:", "  - [-1, 1, Conv, [16, 3, 2]]  # 0"]
    for _ in range(draw(st.integers(1, 5))):
        name, args = draw(LAYERS)
        q = draw(QUOTES)
        lines.append(f"  - [-1, {draw(st.sampled_from(['1', ' 1']))}, {q}{name}{q}, {args}]{draw(COMMENTS)}")
    lines += ["head:", "  - [-1, 1, Classify, [nc]]  # classifier"]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=model_yaml(), policy=st.sampled_from(["auto", "all"]))
def test_rewrite_round_trips_or_fails_cleanly(text, policy):
    try:
        result = rewrite_yaml_text(text, policy=policy, origin="fuzz.yaml", imgsz=64)
    except (ModelError, ConfigError) as e:
        assert "\n" not in str(e)
        assert str(e).startswith("fuzz.yaml")
        return
    # rewrite_yaml_text rebuilds the output and compares layer and parameter counts before returning
    assert result.layers == text.count("\n  - ")
    if policy == "all":
        nameable = sum(
            text.count(f"{name}")
            for name in (
                "nn.Upsample",
                "nn.AdaptiveAvgPool2d",
                "nn.AdaptiveMaxPool2d",
                "nn.ReflectionPad2d",
                "nn.ReplicationPad2d",
            )
        )
        assert len(result.changes) == nameable
    back = rewrite_yaml_text(result.text, reverse=True, origin="fuzz.yaml")
    assert back.text == text
    assert back.params == result.params
