"""yolo-det verify: identical runs say so; deliberate non-determinism is caught at the right step and parameter."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import yolo_det.tools.verify as verify_command  # the command imports verify from here when it runs
from helpers import small_train_tokens
from yolo_det.cli import main
from yolo_det.core.errors import RunFailed
from yolo_det.core.state import snapshot
from yolo_det.tools import verify as verify_module
from yolo_det.tools.prepare import prepare
from yolo_det.tools.runtime import PNG_SIGNATURE
from yolo_det.tools.verify import MicroBatch, RunRecord, StepRecord, compare_runs, plot_losses, verify
from yolo_det.tools.verify import recorder as verify_recorder

TINY = small_train_tokens(epochs=None, batch=8, val=False, device=None, exist_ok=None)


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def assert_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()
    import matplotlib.image

    assert matplotlib.image.imread(str(path)).ndim == 3


# ---------------------------------------------------------------------------------------------------------
# comparison on hand-made records (fast)


def make_run(index: int, steps: int = 3, *, grads: int = 3, files: tuple[str, ...] = ("a.png", "b.png")) -> RunRecord:
    rec = RunRecord(index=index, param_names=[f"p{k}" for k in range(grads)], loss_names=["box", "cls"])
    for s in range(1, steps + 1):
        mb = MicroBatch(index=s - 1, epoch=0, data=f"data{s}", files=files, loss=(1.0 / s, 2.0 / s))
        rec.steps.append(StepRecord(step=s, epoch=0, batches=[mb], grads=[f"g{s}-{k}" for k in range(grads)]))
    rec.weights = {"model": "w", "ema": "e"}
    return rec


def test_identical_records_compare_equal():
    assert compare_runs(make_run(1), make_run(2)) is None


def test_data_order_difference_wins_over_loss_and_gradients():
    ref, run = make_run(1), make_run(2)
    b = run.steps[1].batches[0]
    b.data, b.files, b.loss = "other", ("c.png", "d.png"), (9.0, 9.0)
    run.steps[1].grads = ["x", "y", "z"]
    d = compare_runs(ref, run)
    assert d is not None
    assert d.step == 2
    assert d.kind == "data"
    assert d.data_differs
    assert d.loss_differs
    assert d.files == [["a.png", "b.png"], ["c.png", "d.png"]]
    assert "order" in d.detail
    assert set(d.loss_components) == {"box", "cls"}
    assert d.parameters_differing == 3


def test_same_files_different_pixels_is_data_content():
    ref, run = make_run(1), make_run(2)
    run.steps[0].batches[0].data = "other"
    d = compare_runs(ref, run)
    assert d is not None
    assert d.kind == "data"
    assert d.step == 1
    assert "content" in d.detail
    assert d.files is None


def test_loss_difference_is_a_forward_difference():
    ref, run = make_run(1), make_run(2)
    run.steps[2].batches[0].loss = (1.0 / 3, math.nextafter(2.0 / 3, 1.0))
    d = compare_runs(ref, run)
    assert d is not None
    assert (d.kind, d.step) == ("loss", 3)
    assert list(d.loss_components) == ["cls"]
    assert d.note == "the gradients of this step are identical"


def test_gradient_difference_is_measured_from_kept_values():
    ref, run = make_run(1), make_run(2)
    run.steps[1].grads[2] = "changed"
    ref.kept = {2: {"p0": torch.zeros(4), "p1": torch.zeros(4), "p2": torch.tensor([1.0, -2.0, 3.0, 0.5])}}
    ref.kept_until = 2
    run.kept = {2: {"p2": torch.tensor([1.0, -2.0, 3.25, 0.5])}}
    d = compare_runs(ref, run)
    assert d is not None
    assert (d.kind, d.step, d.parameter) == ("gradients", 2, "p2")
    assert d.max_abs_diff == pytest.approx(0.25)
    assert d.reference_abs_max == pytest.approx(3.0)
    assert (d.parameters_differing, d.parameters_total) == (1, 3)


def test_amp_scale_is_divided_out_of_the_difference():
    ref, run = make_run(1), make_run(2)
    run.steps[0].grads[0] = "changed"
    ref.steps[0].scale = run.steps[0].scale = 1024.0
    ref.kept = {1: {"p0": torch.tensor([1024.0])}}
    run.kept = {1: {"p0": torch.tensor([2048.0])}}
    d = compare_runs(ref, run)
    assert d is not None
    assert d.max_abs_diff == pytest.approx(1.0)


def test_gradient_difference_without_kept_values_names_the_parameter_and_says_why():
    ref, run = make_run(1, steps=5), make_run(2, steps=5)
    ref.kept_until = 2
    run.steps[4].grads[1] = "changed"
    d = compare_runs(ref, run)
    assert d is not None
    assert d.parameter == "p1"
    assert d.max_abs_diff is None
    assert "--keep-mib" in (d.note or "")


def test_different_step_counts_and_final_weights():
    ref, run = make_run(1, steps=3), make_run(2, steps=2)
    d = compare_runs(ref, run)
    assert d is not None
    assert (d.kind, d.step) == ("steps", 3)
    ref, run = make_run(1), make_run(2)
    run.weights = {"model": "other", "ema": "e"}
    run.final_diff = [("model.0.weight", 0.5), ("model.1.bias", 0.1)]
    ref.final_state = {"model.0.weight": torch.ones(2), "model.1.bias": torch.full((1,), -4.0)}
    d = compare_runs(ref, run)
    assert d is not None
    assert (d.kind, d.parameter, d.max_abs_diff) == ("weights", "model.0.weight", 0.5)
    assert d.reference_abs_max == 1.0


def test_state_diff_compares_bits():
    a = {"w": torch.tensor([0.0, 1.0, float("nan")]), "n": torch.tensor([3])}
    b = {"w": torch.tensor([-0.0, 1.0, float("nan")]), "n": torch.tensor([3])}
    diff = verify_recorder._state_diff(a, b)
    assert [k for k, _ in diff] == ["w"]
    assert diff[0][1] == 0.0
    assert verify_recorder._state_diff(a, {k: v.clone() for k, v in a.items()}) == []
    c = {"w": torch.tensor([0.0, 1.5, float("nan")]), "n": torch.tensor([3])}
    assert verify_recorder._state_diff(a, c) == [("w", 0.5)]


def test_plot_marks_the_divergence(tmp_path):
    ref, run = make_run(1), make_run(2)
    run.steps[1].grads[0] = "changed"
    report = verify_module.VerifyReport(
        profile="fast", args={}, runs=[ref, run], divergences=[compare_runs(ref, run)], steps_requested=3, seconds=1.0
    )
    path = plot_losses(report, tmp_path / "curves.png")
    assert_png(path)
    assert not report.identical
    assert "NOT reproducible" in report.summary()
    assert "step 2" in report.summary()


def test_summary_says_when_fewer_steps_ran_than_asked():
    runs = [make_run(1, steps=3), make_run(2, steps=3)]
    report = verify_module.VerifyReport(
        profile="repro", args={"epochs": 3}, runs=runs, divergences=[], steps_requested=20, seconds=1.0
    )
    note = report.steps_note
    assert note is not None
    assert "asked for 20 optimizer steps, the runs made 3" in note
    assert "epochs ran out (epochs=3)" in note
    assert "pass epochs=20" in note
    assert f"note: {note}" in report.summary()
    assert report.to_dict()["steps_note"] == note
    enough = verify_module.VerifyReport(
        profile="repro", args={"epochs": 3}, runs=runs, divergences=[], steps_requested=3, seconds=1.0
    )
    assert enough.steps_note is None
    assert "note:" not in enough.summary()
    unknown = verify_module.VerifyReport(
        profile="repro", args={}, runs=runs, divergences=[], steps_requested=5, seconds=1.0
    )
    assert "raise epochs=" in (unknown.steps_note or "")


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]) + "\n".join(
        t.get_text() for t in fig.texts
    )


def test_identical_chart_says_so_in_words_without_a_log_axis(tmp_path):
    from yolo_det.tools.verify import loss_figure

    runs = [make_run(1, steps=6), make_run(2, steps=6), make_run(3, steps=6)]
    report = verify_module.VerifyReport(
        profile="repro", args={}, runs=runs, divergences=[], steps_requested=6, seconds=1.0
    )
    fig = loss_figure(report)
    bottom = fig.axes[1]
    assert bottom.get_yscale() == "linear"
    assert not bottom.get_lines()[1:]
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["0"]
    text = _texts(fig)
    assert "bitwise identical: 3 runs x 6 steps" in text
    assert "0 at every step" in text
    assert_png(plot_losses(report, tmp_path / "same.png"))


def test_diverging_chart_marks_the_first_divergence_on_a_clean_log_axis(tmp_path):
    from yolo_det.tools.verify import loss_figure

    ref, run = make_run(1, steps=30), make_run(2, steps=30)
    for k, step in enumerate(run.steps[11:]):  # losses move by growing relative amounts from step 12
        a, b = step.batches[0].loss
        step.batches[0].loss = (a * (1 + 1e-9 * 10 ** (k / 3)), b)
    run.steps[9].grads[0] = "changed"  # the gradients differ first, at step 10
    report = verify_module.VerifyReport(
        profile="fast", args={}, runs=[ref, run], divergences=[compare_runs(ref, run)], steps_requested=30, seconds=1.0
    )
    assert report.first.step == 10
    assert report.first.kind == "gradients"
    fig = loss_figure(report)
    fig.canvas.draw()
    bottom = fig.axes[1]
    assert bottom.get_yscale() == "log"  # relative difference: positive, no symlog, no negative ticks
    labels = [t.get_text() for t in bottom.get_yticklabels() if t.get_text()]
    assert 0 < len(labels) <= 8
    assert not any(lab.startswith(("-", "\u2212")) for lab in labels)
    lo, hi = bottom.get_ylim()
    assert lo > 0
    assert hi > lo
    red = [line for ax in fig.axes for line in ax.get_lines() if line.get_color() == "red"]
    assert len(red) == 2
    assert all(list(line.get_xdata()) == [10, 10] for line in red)
    assert "first divergence: step 10 (gradients)" in _texts(fig)
    assert "diverge at step 10" in _texts(fig)
    labels = bottom.get_legend_handles_labels()[1]
    assert "run 2 vs run 1" in labels
    assert "run 2: loss identical" in labels
    assert_png(plot_losses(report, tmp_path / "diverged.png"))


# ---------------------------------------------------------------------------------------------------------
# bad input (fast: nothing trains)


def test_callbacks_take_a_function_or_a_list_per_event_and_name_what_is_wrong(tmp_path):
    from yolo_det.core.errors import ConfigError
    from yolo_det.tools.verify.run import check_callbacks

    def fn(trainer: Any) -> None:
        pass

    assert check_callbacks({"on_train_epoch_end": fn}) == {"on_train_epoch_end": [fn]}
    assert check_callbacks({"on_train_epoch_end": [fn, fn], "teardown": (fn,)}) == {
        "on_train_epoch_end": [fn, fn],
        "teardown": [fn, fn][:1],
    }
    args = {"epochs": 1, "imgsz": 64, "device": "cpu", "project": str(tmp_path / "runs")}
    for bad, needle in (
        ({"on_train_epoch_ends": fn}, "is not an Ultralytics callback event. Did you mean 'on_train_epoch_end'?"),
        ({"on_train_epoch_end": "fn"}, "must be a function or a list of functions, got str"),
        ({"on_train_epoch_end": [fn, 3]}, "must be a function or a list of functions, got list"),
        ([fn], "callbacks must be a dict"),
    ):
        with pytest.raises(ConfigError) as caught:
            verify("repro", args, runs=2, steps=1, callbacks=bad)  # refused before any training
        assert needle in str(caught.value)
        assert "\n" not in str(caught.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--runs", "1"], "--runs"),
        (["--steps", "0"], "--steps"),
        (["--keep-mib", "-1"], "--keep-mib"),
        (["resume=True"], "resume"),
        (["time=0.1"], "time"),
        (["device=0,1"], "one device"),
        (["--profile", "repo"], "Did you mean 'repro'"),
        (["epoch=3"], "unknown Ultralytics argument"),
        (["--plot", "curves.jpg"], ".png"),
        (["--plot", "missing/curves.png"], "does not exist"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    code = main(["verify", *argv, f"project={tmp_path / 'runs'}"])
    out, err = capsys.readouterr()
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""
    assert tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------------------
# real trainings (the tiny demo: yolov8n.yaml at imgsz 64, batch 8)


class GradNoise:
    """Adds noise from an unseeded source to one element of one parameter's gradient at one optimizer step.

    With nbs equal to the batch size every backward pass is followed by an optimizer step, so the
    n-th backward is step n.
    """

    def __init__(self, parameter: str, step: int) -> None:
        self.parameter, self.step = parameter, step
        self.noise: list[float] = []
        self.trainers: list[Any] = []
        self._handle: Any = None

    def on_pretrain_routine_end(self, trainer: Any) -> None:
        self.trainers.append(trainer)
        param = dict(trainer.model.named_parameters())[self.parameter]
        count = {"n": 0}
        rng = np.random.default_rng()  # unseeded: OS entropy, different in every run

        def hook(grad: torch.Tensor) -> torch.Tensor:
            count["n"] += 1
            if count["n"] != self.step:
                return grad
            value = float(rng.uniform(0.5, 1.0)) * float(grad.abs().max() + 1e-3)
            self.noise.append(value)
            out = grad.clone()
            out.view(-1)[0] += value
            return out

        self._handle = param.register_hook(hook)

    def teardown(self, trainer: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    @property
    def callbacks(self) -> dict[str, list[Any]]:
        return {"on_pretrain_routine_end": [self.on_pretrain_routine_end], "teardown": [self.teardown]}


class UnseededShuffle:
    """Reseeds the training loader's shuffle generator from an unseeded source at the start of every epoch
    (after yolo-det seeded it: these callbacks run after yolo-det's)."""

    def on_train_epoch_start(self, trainer: Any) -> None:
        loader = trainer.train_loader
        generator = getattr(loader, "generator", None)
        if generator is None:
            generator = loader.sampler.generator
        generator.manual_seed(int(np.random.default_rng().integers(2**62)))

    @property
    def callbacks(self) -> dict[str, list[Any]]:
        return {"on_train_epoch_start": [self.on_train_epoch_start]}


@pytest.mark.slow
def test_demo_with_repro_is_bitwise_identical(tmp_path, capsys):
    before = snapshot()
    plot = tmp_path / "curves.png"
    code = main(
        ["verify", "--profile", "repro", "--steps", "3", "--plot", str(plot), *TINY, f"project={tmp_path / 'runs'}"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "bitwise identical" in out
    assert "NOT reproducible" not in out
    assert out.count(" 3 steps in ") == 2  # both runs stopped after exactly 3 optimizer steps
    assert_png(plot)
    assert snapshot() == before


@pytest.mark.slow
def test_gradient_noise_is_caught_at_its_step_and_parameter(tmp_path):
    name, step = "model.4.m.0.cv1.conv.weight", 2
    noise = GradNoise(name, step)
    _, args = prepare("repro", [*TINY, "nbs=8", "epochs=1", f"project={tmp_path}"])
    report = verify("repro", args, runs=2, steps=3, callbacks=noise.callbacks)
    assert not report.identical
    d = report.first
    assert d is not None
    assert (d.run, d.step, d.kind, d.parameter) == (2, step, "gradients", name)
    assert not d.data_differs
    assert not d.loss_differs
    assert d.parameters_differing == 1
    assert len(noise.noise) == 2
    assert d.max_abs_diff == pytest.approx(abs(noise.noise[0] - noise.noise[1]), rel=1e-3, abs=1e-6)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema"] == "yolo-det/verify/1"
    assert data["identical"] is False
    assert data["steps"] == [3, 3]
    assert data["first_divergence"]["step"] == step
    assert data["first_divergence"]["parameter"] == name
    assert data["comparisons"][0]["final_weights"]["parameters_differing"] >= 1
    assert data["loss"][0][0] == data["loss"][1][0]  # identical before the noise
    for trainer in noise.trainers:  # the recorder put the trainer's methods back
        assert "optimizer_step" not in trainer.__dict__
        assert "preprocess_batch" not in trainer.__dict__


@pytest.mark.slow
def test_strict_mode_crash_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    def crash(trainer: Any) -> None:
        raise RuntimeError(
            "adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, but you "
            "set 'torch.use_deterministic_algorithms(True)'"
        )

    def verify_with_crash(*args: Any, **kwargs: Any) -> Any:
        return verify(*args, callbacks={"on_train_batch_start": [crash]}, **kwargs)

    monkeypatch.setattr(verify_command, "verify", verify_with_crash)
    before = snapshot()
    code = main(["verify", "--profile", "repro", "--steps", "1", *TINY, f"project={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "run 1 stopped" in err
    assert "balanced" in err
    assert snapshot() == before


@pytest.mark.slow
def test_exist_ok_is_accepted(tmp_path, capsys):
    code = main(["verify", "--profile", "repro", "--steps", "1", *TINY, "exist_ok=True", f"project={tmp_path}"])
    out, err = capsys.readouterr()
    assert code in (0, 3), err  # a verdict over the runs (exit 3: one step may leave the weights where they were)
    assert "Traceback" not in err
    assert {p.name for p in tmp_path.iterdir()} >= {"verify-run1", "verify-run2"}


@pytest.mark.parametrize(
    ("raised", "says"),
    [
        (TypeError("got multiple values for keyword argument 'exist_ok'"), "TypeError: got multiple values"),
        (SystemExit(1), "sys.exit(1)"),
        (SystemExit(0), "sys.exit(0)"),
        (RunFailed("training stopped: OSError: [Errno 28] No space left on device"), "No space left on device"),
    ],
)
def test_a_crash_is_exit_2_never_the_diverged_code(raised, says, tmp_path, capsys, monkeypatch):
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(verify_command, "verify", crash)
    code = main(["verify", "--profile", "repro", "--steps", "1", *TINY, f"project={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("yolo-det: error: verify stopped")
    assert says in err
    assert "no verdict" in err


@pytest.mark.slow
def test_unseeded_data_order_exits_1_and_says_data_order(tmp_path, capsys, monkeypatch):
    shuffle = UnseededShuffle()

    def verify_with_shuffle(*args: Any, **kwargs: Any) -> Any:
        return verify(*args, callbacks=shuffle.callbacks, **kwargs)

    monkeypatch.setattr(verify_command, "verify", verify_with_shuffle)
    # the loader's own generator shuffles only without worker-invariant data (which keys the order itself)
    profile = tmp_path / "repro-loader-order.yaml"
    profile.write_text("name: repro-loader-order\nextends: repro\ntrain:\n  data_invariance: false\n")
    code = main(["verify", "--profile", str(profile), "--steps", "2", "--json", *TINY, f"project={tmp_path}"])
    out, _ = capsys.readouterr()
    data = json.loads(out)
    assert code == 1
    assert data["identical"] is False
    assert data["verdict"] == "diverged"
    d = data["first_divergence"]
    assert (d["step"], d["kind"]) == (1, "data")
    assert d["differs"]["data"]
    assert d["files"] is not None
    assert d["files"][0] != d["files"][1]
    assert "order" in d["detail"]
    assert d["parameter"] is not None
    assert d["max_abs_diff"] > 0


# ---------------------------------------------------------------------------------------------------------
# no verdict without evidence: weights that never changed prove nothing

NO_CHANGE = ["nbs=8", "warmup_bias_lr=0.0"]  # one step per batch; the first warmup step has lr 0 for every group


def test_unchanged_weights_are_nothing_compared_on_records():
    ref, run = make_run(1), make_run(2)
    for r in (ref, run):
        r.initial_params = r.final_params = "same"
        r.param_elements = 30
    report = verify_module.VerifyReport("repro", {}, [ref, run], [], None, 0.0)
    assert (report.verdict, report.exit_code) == ("nothing compared", 3)
    assert "raise --steps" in report.nothing_compared[0]
    assert "verdict: nothing compared" in report.summary()
    assert "nothing compared" in verify_module.loss_figure(report).axes[0].get_title()
    run.final_params = ref.final_params = "moved"  # control: weights that moved give the equality verdict
    assert (report.verdict, report.exit_code) == ("bitwise identical", 0)
    assert report.to_dict()["evidence"]["weights_changed"] is True


@pytest.mark.slow
def test_one_step_at_lr_0_is_nothing_compared_exit_3(tmp_path, capsys):
    code = main(["verify", "--profile", "repro", "--steps", "1", *TINY, *NO_CHANGE, f"project={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    assert "nothing compared" in out
    assert "bitwise identical" not in out
    assert "1 optimizer steps" in out
    assert "weights equal the initial ones" in out


@pytest.mark.slow
def test_steps_that_train_are_compared_and_a_difference_still_exits_1(tmp_path, capsys, monkeypatch):
    code = main(["verify", "--profile", "repro", "--steps", "2", *TINY, *NO_CHANGE, f"project={tmp_path / 'a'}"])
    out, err = capsys.readouterr()
    assert code == 0, out + err  # the second step has lr > 0: the weights moved, the equality is evidence
    assert "weights moved from the initial ones" in out
    assert "bitwise identical" in out
    noise = GradNoise("model.4.m.0.cv1.conv.weight", 1)

    def verify_with_noise(*args: Any, **kwargs: Any) -> Any:
        return verify(*args, callbacks=noise.callbacks, **kwargs)

    monkeypatch.setattr(verify_command, "verify", verify_with_noise)
    code = main(["verify", "--profile", "repro", "--steps", "1", *TINY, *NO_CHANGE, f"project={tmp_path / 'b'}"])
    out, err = capsys.readouterr()
    assert code == 1, out + err  # a real difference wins over "nothing compared"
    assert "NOT reproducible" in out
