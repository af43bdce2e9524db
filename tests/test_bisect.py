"""Op traces and ``yolo-det bisect``: one difference planted at a known place is named there, equal runs part nowhere.

Each planted difference has its control: the final weights of the two runs differ (else the plant changed
nothing and naming a place would prove nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import MODELS, small_train_tokens, train_stopped_after
from yolo_det.cli import main
from yolo_det.core.errors import ConfigError
from yolo_det.integrations.ultralytics.seam import SeamTrainer
from yolo_det.tools.trace import OpTracer, parse_steps, read_trace
from yolo_det.tools.trace.bisect import bisect_paths
from yolo_det.tools.trace.tracefile import TRACE_SCHEMA, TRACE_VERSION
from yolo_det.tools.verify import record_runs
from yolo_det.tools.verify.run import check_callbacks

TINY = small_train_tokens(batch=8, nbs=8, val=False, device=None, exist_ok=None)


def traced(
    folder: Path,
    name: str,
    *tokens: str,
    profile: str = "repro",
    callbacks: dict[str, Any] | None = None,
    trace: str = "first:2",
) -> tuple[Path, str]:
    """Train 3 steps in process (as verify does), tracing ``trace``; return the trace and the weights digest."""
    from yolo_det.analysis.models import model_names
    from yolo_det.tools.prepare import prepare

    path = folder / f"{name}.jsonl"
    threads = torch.get_num_threads()
    with model_names():  # the example blocks (CBAMMax) are nameable, as under `yolo-det train`
        given = {t.split("=", 1)[0] for t in tokens}
        base = [t for t in TINY if t.split("=", 1)[0] not in given]
        prof, args = prepare(profile, [*base, *tokens, f"project={folder}", f"name={name}"], check_device=False)
        try:
            (rec,) = record_runs(prof, args, runs=1, steps=3, callbacks=callbacks, trace_ops=trace, trace_file=path)
        finally:
            torch.set_num_threads(threads)
    return path, rec.weights["model"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    seen: list[int] = []
    # a plain function for an event, not a list: verify's callbacks take both, and combine with the tracer
    out = traced(tmp_path_factory.mktemp("base"), "a", callbacks={"on_train_epoch_end": lambda t: seen.append(1)})
    assert seen == [1]
    return out


def _bisect(a: Path, b: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["bisect", str(a), str(b), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------------------
# real trainings


@pytest.mark.slow
def test_two_equal_runs_part_nowhere(
    base: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twin, weights = traced(tmp_path, "b")
    assert weights == base[1]
    code, out = _bisect(base[0], twin, capsys)
    assert code == 0
    assert out["equal"] is True
    assert out["parting"] is None
    assert out["steps_compared"] == 2
    assert out["ops_compared"] > 1000
    trace = read_trace(base[0])
    assert [s.step for s in trace.steps] == [1, 2]
    assert len(trace.steps[0].micro[0].forward) > 200  # every module call of yolov8n
    assert {e[0] for e in trace.steps[0].micro[0].backward} == {"gout", "gin", "grad"}


@pytest.mark.slow
def test_thread_count_is_named_at_the_op_it_changes(
    base: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other, weights = traced(tmp_path, "threads", callbacks={"on_train_start": lambda t: torch.set_num_threads(2)})
    if weights == base[1]:
        pytest.skip("on this CPU the thread count does not change the bits of this model")
    code, out = _bisect(base[0], other, capsys)
    assert code == 1
    p = out["parting"]
    assert p["step"] == 1
    assert p["phase"] in {"forward", "backward"}
    assert p["inputs_equal"] is True
    assert p["type_a"].startswith("torch.nn.modules.")
    settings = {name: (a, b) for name, a, b in p["settings"]}
    assert settings["threads"] == (1, 2)
    assert "cpu_capability" in settings
    assert "layer (swap in force)" in settings
    main(["bisect", str(base[0]), str(other)])
    text = capsys.readouterr().out
    assert "* threads: 1 | 2" in text
    assert "its inputs are equal on both sides" in text


@pytest.mark.slow
def test_changed_batchnorm_momentum_is_named_at_that_batchnorm(
    base: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def momentum(trainer: Any) -> None:
        trainer.model.model[4].m[0].cv1.bn.momentum = 0.5

    other, weights = traced(tmp_path, "bn", callbacks={"on_train_start": momentum})
    assert weights != base[1]  # control: the running statistics differ, so the weights do
    code, out = _bisect(base[0], other, capsys)
    assert code == 1
    p = out["parting"]
    assert (p["step"], p["phase"], p["op"], p["micro"]) == (1, "forward", "model.4.m.0.cv1.bn", 0)
    assert "buffer it updates in forward" in p["detail"]
    assert p["inputs_equal"] is True
    assert "momentum=0.03" in p["extra_a"]
    assert "momentum=0.5" in p["extra_b"]


@pytest.mark.slow
def test_another_augmentation_is_named_as_the_data(
    base: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other, weights = traced(tmp_path, "hsv", "hsv_h=0.0")
    assert weights != base[1]
    junit = tmp_path / "bisect.xml"
    code, out = _bisect(base[0], other, capsys, "--junit", str(junit))
    assert code == 1
    p = out["parting"]
    assert (p["step"], p["phase"], p["op"], p["micro"]) == (1, "data", "batch", 0)
    assert "same images, different pixels" in p["detail"]
    xml = junit.read_text()
    assert 'failures="1"' in xml
    assert "data of batch" in xml


@pytest.mark.slow
def test_swap_disabled_on_one_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A swapped layer computes the same function: its absence is seen (the class in force differs), not a parting."""
    model = f"model={MODELS / 'cbam-max.yaml'}"
    profile = tmp_path / "noswap.yaml"
    profile.write_text("name: repro-noswap\nextends: repro\ntrain:\n  swaps: none\n")
    a, wa = traced(tmp_path, "swap", model)
    b, wb = traced(tmp_path, "noswap", model, profile=str(profile))
    code, out = _bisect(a, b, capsys)
    types = [n for n in out["notes"] if "yolo_det.layers" in n]
    assert types, out["notes"]  # the swapped class in A, torch's in B
    if wa == wb:
        assert code == 0
        assert out["equal"]
    else:
        assert code == 1
        assert out["parting"]["module"] in {t.split(":")[0] for t in types}


def _epochs3(project: Path) -> list[str]:
    """A 3-epoch run of 3 steps an epoch (step 4 is epoch 2's first) in ``project``."""
    return [
        "imgsz=64",
        "batch=8",
        "nbs=8",
        "workers=0",
        "plots=False",
        "val=False",
        "fraction=0.5",
        "epochs=3",
        f"project={project}",
    ]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run of :func:`_epochs3` traced at step 4: the twin of the resumed and replayed runs."""
    project = tmp_path_factory.mktemp("straight")
    assert main(["train", "--trace-ops", "4", *_epochs3(project), "name=straight"]) == 0
    return project / "straight"


@pytest.mark.slow
def test_resumed_run_matches_its_twin_and_a_resume_from_another_epoch_is_named(
    straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = _epochs3(tmp_path)
    first = train_stopped_after([*common, "name=one"], 1)
    second = train_stopped_after([*common, "name=two"], 2)
    from yolo_det.core.record import checkpoint_digest

    assert checkpoint_digest(first) != checkpoint_digest(second)  # control: the two states differ
    capsys.readouterr()
    # the untraced run's step after epoch 1, re-run here from its checkpoint, is the straight run's step 4
    before = checkpoint_digest(first)
    kept = tmp_path / "replayed.jsonl"
    code = main(["bisect", str(straight), "--replay", str(first), "--replay-trace", str(kept), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["b"] == str(kept)
    assert out["steps_compared"] == 1
    assert read_trace(kept).steps[0].iteration == read_trace(straight / "ops-trace-rank0.jsonl").steps[0].iteration
    assert checkpoint_digest(first) == before  # the checkpoint was copied, never resumed in place
    assert not (first.parent.parent / "ops-trace-rank0.jsonl").exists()
    assert main(["train", "--trace-ops", "first:1", f"resume={first}"]) == 0
    assert main(["train", "--trace-ops", "first:1", f"resume={second}"]) == 0
    capsys.readouterr()
    one, two = tmp_path / "one", tmp_path / "two"
    assert (one / "ops-trace-rank0.jsonl").is_file()

    code, out = _bisect(straight, one, capsys)  # a resumed run and its uninterrupted twin
    assert code == 0, out
    assert out["parting"] is None
    assert out["steps_compared"] == 1

    code, out = _bisect(one, two, capsys)  # resumed from the states of epochs 1 and 2
    assert code == 1
    p = out["parting"]
    assert (p["step"], p["phase"]) == (1, "state")
    assert "resumed from different epochs" in p["detail"]


@pytest.mark.slow
def test_a_replayed_checkpoint_made_with_other_threads_names_them_from_its_record(
    straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control, a checkpoint of the same settings replaying equal against the same run, is in the test above."""
    profile = tmp_path / "two-threads.yaml"
    profile.write_text("name: repro-2t\nextends: repro\ntrain:\n  intra_op_threads: 2\n")
    other = train_stopped_after([*_epochs3(tmp_path), "name=other"], 1, profile=str(profile))
    capsys.readouterr()
    code = main(["bisect", str(straight), "--replay", str(other), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert main(["bisect", str(straight), "--replay", str(other)]) == code  # the text report says the same
    capsys.readouterr()
    if code == 0:
        pytest.skip("on this CPU two threads do not change the bits of this model")
    p = out["parting"]
    assert p["phase"] == "state"
    assert "intra_op_threads" in p["detail"]
    assert "another checkpoint or epoch" not in p["detail"]
    assert any("intra_op_threads" in c for c in out["causes"])


@pytest.mark.slow
def test_verify_save_writes_the_trace_beside_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "base.json"
    code = main(["verify", "--steps", "2", "--save", str(saved), "--trace-ops", "2", *TINY])
    out = capsys.readouterr().out
    assert code == 0
    trace = tmp_path / "base.ops.jsonl"
    assert f"op trace: {trace}" in out
    assert [s.step for s in read_trace(trace).steps] == [2]
    assert main(["bisect", str(saved), str(trace)]) == 0  # a --save file stands for its trace
    assert "equal:" in capsys.readouterr().out


def test_trace_ops_needs_save_and_a_valid_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--trace-ops", "2", *TINY]) == 2
    assert "--trace-ops goes with --save FILE" in capsys.readouterr().err
    assert main(["train", "--trace-ops", "5-2", *TINY]) == 2
    assert "a range ends after it starts" in capsys.readouterr().err
    assert main(["bisect", "a.jsonl"]) == 2
    assert "pass two traces (A B), or one trace and --replay" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# without training


def test_steps_forms_and_errors() -> None:
    assert (parse_steps("3-5").first, parse_steps("3-5").last) == (3, 5)
    assert (parse_steps("7").first, parse_steps("7").last) == (7, 7)
    assert (parse_steps("first:4").first, parse_steps("first 4").last) == (1, 4)
    assert 4 in parse_steps("first4")
    assert 5 not in parse_steps("first4")
    for bad in ("0", "5-3", "x", "1-100000", "", "3-"):
        with pytest.raises(ConfigError, match="--trace-ops"):
            parse_steps(bad)


def test_callbacks_take_a_function_or_a_list() -> None:
    def fn(trainer: Any) -> None:
        pass

    assert check_callbacks({"on_train_epoch_end": fn}) == {"on_train_epoch_end": [fn]}
    assert check_callbacks({"on_train_epoch_end": [fn, fn]}) == {"on_train_epoch_end": [fn, fn]}
    assert check_callbacks(None) == {}
    for bad in ({"on_train_epoch_end": 3}, {"on_train_epoch_end": [fn, "x"]}, [fn]):
        with pytest.raises(ConfigError, match="callbacks"):
            check_callbacks(bad)  # type: ignore[arg-type]


class _Base:
    """The parts of an Ultralytics trainer the tracer touches: a model, its optimizer and scaler, the epoch and loader
    counters, preprocess_batch, optimizer_step."""

    def __init__(self, cfg: Any = None, overrides: Any = None, _callbacks: Any = None) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.SiLU())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.epoch = self.start_epoch = 0
        self.amp, self.save_dir, self.train_loader = False, Path("."), [None] * 5

    def preprocess_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        return batch

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()


class _Trainer(SeamTrainer, _Base):
    """:class:`_Base` through the trainer seam, as yolo-det's routes build a trainer (the tracer observes it)."""


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules()) + sum(
        len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()
    )


def _train(trainer: _Trainer, tracer: OpTracer, steps: int, fail_at: int | None = None) -> list[int]:
    tracer.on_pretrain_routine_end(trainer)
    counts = []
    try:
        for i in range(steps):
            batch = trainer.preprocess_batch({"img": torch.full((2, 3, 6, 6), float(i))})
            counts.append(_hooks(trainer.model))
            if fail_at == i:
                raise RuntimeError("planted")
            trainer.model(batch["img"]).sum().backward()
            trainer.optimizer_step()
    finally:
        tracer.teardown(trainer)
    return counts


def test_hooks_only_in_traced_steps_and_all_removed_even_on_error(tmp_path: Path) -> None:
    trainer = _Trainer()
    tracer = OpTracer("2-3", tmp_path / "t.jsonl")
    assert _train(trainer, tracer, 5) == [0, 8, 8, 0, 0]  # 4 module and 4 gradient hooks in steps 2 and 3 only
    assert _hooks(trainer.model) == 0
    assert trainer.yolo_det_state.observers == []  # the tracer is off the trainer after the run
    trace = read_trace(tmp_path / "t.jsonl")
    assert [s.step for s in trace.steps] == [2, 3]
    assert [c.key for c in trace.steps[0].micro[0].forward] == ["0", "1", "2", ""]
    failing = _Trainer()
    with pytest.raises(RuntimeError, match="planted"):
        _train(failing, OpTracer("first:2", tmp_path / "u.jsonl"), 3, fail_at=1)
    assert _hooks(failing.model) == 0
    assert failing.yolo_det_state.observers == []


def test_digests_see_reordered_elements(tmp_path: Path) -> None:
    a, b = _Trainer(), _Trainer()
    _train(a, OpTracer("1", tmp_path / "a.jsonl"), 1)
    with torch.no_grad():  # the same weights, two output channels swapped
        b.model[0].weight.copy_(b.model[0].weight[[1, 0, 2, 3]])
    _train(b, OpTracer("1", tmp_path / "b.jsonl"), 1)
    report = bisect_paths(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert report.parting is not None
    assert report.parting.phase == "state"
    assert report.parting.op == "0.weight"
    same = bisect_paths(tmp_path / "a.jsonl", tmp_path / "a.jsonl")
    assert same.equal
    assert same.ops_compared > 10


def _trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    _train(_Trainer(), OpTracer("1", path), 1)
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h, s: h.update(schema="other"), f"no '{TRACE_SCHEMA}' schema"),
        (lambda h, s: h.update(version=TRACE_VERSION + 1), "upgrade it"),
        (lambda h, s: h.update(digest="xor"), "'digest' must be"),
        (lambda h, s: h.update(modules={"x": {"type": 1}}), "'modules.x' must be"),
        (lambda h, s: s.update(state=[["w", "not-a-digest"]]), "'steps[0].state' must be"),
        (lambda h, s: s["micro"][0]["forward"].append(["k", [], [], [], "f", 9]), "forward[4]"),
        (lambda h, s: s["micro"][0]["backward"].append(["exec", "k", 0, "none"]), "backward["),
        (lambda h, s: s.update(step=True), "'steps[0].step' must be"),
    ],
)
def test_malformed_traces_are_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any], dict[str, Any]], None],
    message: str,
) -> None:
    path = _trace_file(tmp_path)
    head, step = (json.loads(line) for line in path.read_text().splitlines())
    edit(head, step)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")
    with pytest.raises(ConfigError, match="not a usable op trace"):
        read_trace(bad)
    assert main(["bisect", str(path), str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_a_nan_in_a_trace_equals_itself(tmp_path: Path) -> None:
    path = _trace_file(tmp_path)
    head, step = (json.loads(line) for line in path.read_text().splitlines())
    step["scale"] = float("nan")
    step["hyper"] = [{"lr": float("nan"), "momentum": 0.9}]
    head["settings"]["nan_setting"] = float("nan")
    a, b = tmp_path / "nan-a.jsonl", tmp_path / "nan-b.jsonl"
    for p in (a, b):
        p.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")  # JSON's NaN, as json.dumps writes it
    assert "NaN" in a.read_text()
    report = bisect_paths(a, b)
    assert report.equal
    assert report.parting is None
    step["scale"] = 2.0  # control: a scale that differs parts the traces there
    b.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")
    report = bisect_paths(a, b)
    assert report.parting is not None
    assert "AMP scale" in report.parting.detail


def test_trace_reading_is_bounded_by_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from yolo_det.tools.trace import tracefile

    path = _trace_file(tmp_path)
    held = read_trace(path)  # control: read whole under the real bound
    assert held.steps
    monkeypatch.setattr(tracefile, "MAX_TRACE_ENTRIES", 3)
    with pytest.raises(ConfigError, match="more than 3 digests"):
        read_trace(path)
    assert main(["bisect", str(path), str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_unusable_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace_file(tmp_path)
    (tmp_path / "junk.jsonl").write_bytes(b"\xff\xfe not json")
    (tmp_path / "run").mkdir()
    for other, message in [
        (tmp_path / "junk.jsonl", "not JSON lines"),
        (tmp_path / "missing.jsonl", "does not exist"),
        (tmp_path / "run", "holds no op trace for rank 0"),
    ]:
        assert main(["bisect", str(path), str(other)]) == 2
        assert message in capsys.readouterr().err


def test_names_from_a_trace_cannot_act_on_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace_file(tmp_path)
    head, step = (json.loads(line) for line in path.read_text().splitlines())
    evil = "0\x1b[2J\x1b]0;owned\x07\nforged line"
    head["modules"][evil] = head["modules"].pop("0")
    call = step["micro"][0]["forward"][0]
    call[0] = evil
    a = tmp_path / "evil-a.jsonl"
    a.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")
    call[2] = ["f" * 32]  # B: another output of that call
    b = tmp_path / "evil-b.jsonl"
    b.write_text(json.dumps(head) + "\n" + json.dumps(step) + "\n")
    assert main(["bisect", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert "\x07" not in out
    assert not any(line.startswith("forged line") for line in out.splitlines())
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["bisect", str(a), str(deep)]) == 2
    assert "not JSON lines" in capsys.readouterr().err


def test_one_trace_per_rank_and_two_ranks_compare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        trainer = _Trainer()
        trainer.save_dir = run  # type: ignore[attr-defined]
        tracer = OpTracer("1")
        _train(trainer, tracer, 1)
        assert tracer.written == run / f"ops-trace-rank{rank}.jsonl"
        head = read_trace(tracer.written)
        assert (head.rank, head.world_size) == (rank, 2)
    assert main(["bisect", str(run), str(run), "--rank", "0", "--rank-b", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["b"].endswith("ops-trace-rank1.jsonl")
    assert "A is rank 0, B rank 1" in out["notes"]
    assert main(["bisect", str(run), str(run), "--rank", "2"]) == 2
    assert "holds no op trace for rank 2" in capsys.readouterr().err


@pytest.mark.slow
def test_a_trace_request_past_the_runs_end_is_a_warning_a_record_field_and_bisects_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    few = [*TINY, "fraction=0.25", f"project={tmp_path}"]  # 12 images, batch 8: 2 optimizer steps
    assert main(["train", "--trace-ops", "500", *few, "name=late"]) == 0
    err = capsys.readouterr().err
    warning = "yolo-det: warning: --trace-ops 500 traced nothing: the run had 2 optimizer steps"
    assert warning in err, err
    late = tmp_path / "late"
    assert not list(late.glob("ops-trace-rank*.jsonl"))
    record = json.loads((late / "determinism.json").read_text())
    assert record["op_trace"] == {"asked": "500", "steps_run": 2, "traced": [], "file": None}
    with pytest.raises(ConfigError, match=r"trained with --trace-ops 500, but the run made 2 optimizer steps"):
        bisect_paths(late, late)

    assert main(["train", "--trace-ops", "2-500", *few, "name=part"]) == 0
    err = capsys.readouterr().err
    assert "--trace-ops 2-500 traced steps 2 only: the run had 2 optimizer steps" in err, err
    part = json.loads((tmp_path / "part" / "determinism.json").read_text())["op_trace"]
    assert (part["asked"], part["steps_run"], part["traced"]) == ("2-500", 2, [2])
    assert part["file"] == str(tmp_path / "part" / "ops-trace-rank0.jsonl")

    assert main(["train", "--trace-ops", "1-2", *few, "name=whole"]) == 0
    assert "--trace-ops" not in capsys.readouterr().err  # every step asked for ran: no warning


@pytest.mark.slow
def test_verify_save_with_a_trace_past_its_steps_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save = tmp_path / "base.json"
    argv = ["verify", "--steps", "1", "--save", str(save), "--trace-ops", "5", *TINY, f"project={tmp_path}"]
    assert main(argv) in (0, 3)
    err = capsys.readouterr().err
    assert "yolo-det: warning: --trace-ops 5 traced nothing: run 1 had 1 optimizer step" in err, err
    assert save.is_file()
    assert not save.with_suffix(".ops.jsonl").exists()
