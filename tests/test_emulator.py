"""The CUDA alert emulator: CUDA's messages, at CUDA's moments, on the CPU."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from helpers import MODELS
from yolo_det.analysis.emulator import alert_message, emulate_cuda_alerts
from yolo_det.analysis.optable import load_table
from yolo_det.analysis.tracing import tensors
from yolo_det.core.backward import backward_scope

STRICT_TAIL = (
    "does not have a deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'. "
    "You can turn off determinism just for this operation"
)


@pytest.fixture(autouse=True)
def _restore_flags() -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()


def _mode(mode: str) -> None:
    if mode == "off":
        torch.use_deterministic_algorithms(False)
    else:
        torch.use_deterministic_algorithms(True, warn_only=mode == "warn")


def _x() -> torch.Tensor:
    return torch.randn(2, 4, 8, 8, requires_grad=True)


def test_message_is_the_installed_torchs_own_text() -> None:
    # A real CPU alert (max_unpool2d alerts on every device) gives the binary's exact wording.
    x = torch.arange(16.0).view(1, 1, 4, 4)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    _mode("strict")
    with pytest.raises(RuntimeError) as real:
        F.max_unpool2d(y, idx, 2)
    expected = str(real.value).replace("max_unpooling2d_forward_out", "adaptive_max_pool2d_backward_cuda")
    assert alert_message("adaptive_max_pool2d_backward_cuda") == expected
    assert alert_message("k") == load_table().message("k", warn_only=False)
    warn = alert_message("k", warn_only=True)
    assert warn.startswith(load_table().message("k", warn_only=True))
    assert "Triggered internally" in warn


def test_strict_raises_cudas_message_in_backward() -> None:
    x = _x()
    _mode("strict")
    with emulate_cuda_alerts() as log:
        y = F.adaptive_max_pool2d(x, 1).sum()  # the forward is fine on CUDA
        with pytest.raises(RuntimeError) as err:
            y.backward()
    assert str(err.value) == alert_message("adaptive_max_pool2d_backward_cuda")
    assert STRICT_TAIL in str(err.value)
    expected = [("adaptive_max_pool2d_backward_cuda", "backward", "raised")]
    assert [(e.kernel, e.pass_, e.action) for e in log.events] == expected


def test_warn_only_warns_and_runs() -> None:
    x = _x()
    _mode("warn")
    with emulate_cuda_alerts() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.grid_sample(x, torch.rand(2, 3, 3, 2) * 2 - 1, align_corners=False).sum().backward()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert messages == [alert_message("grid_sampler_2d_backward_cuda", warn_only=True)]
    assert x.grad is not None
    assert log.by_action("warned")


def test_flag_off_is_silent_but_logged() -> None:
    _mode("off")
    with emulate_cuda_alerts() as log:
        nn.AdaptiveAvgPool2d((None, 1))(_x()).sum().backward()
    expected = [("adaptive_avg_pool2d_backward_cuda", "silent", "off")]
    assert [(e.kernel, e.action, e.mode) for e in log.events] == expected


def test_the_flag_counts_when_the_backward_kernel_runs() -> None:
    x = _x()
    _mode("off")
    with emulate_cuda_alerts():
        y = F.adaptive_max_pool2d(x, 2).sum()  # forward without the flag ...
        _mode("strict")
        with pytest.raises(RuntimeError, match="adaptive_max_pool2d_backward_cuda"):
            y.backward()  # ... but the backward kernel runs under it


def test_backward_toggle_silences_it() -> None:
    x = _x()
    _mode("strict")
    with emulate_cuda_alerts() as log:
        y = F.adaptive_max_pool2d(x, 1).sum()
        with backward_scope():
            y.backward()
        assert torch.are_deterministic_algorithms_enabled()
    assert x.grad is not None
    assert [e.action for e in log.events] == ["silent"]


def test_bilinear_alerts_only_when_the_forward_ran_without_the_flag() -> None:
    x = _x()
    _mode("strict")
    with emulate_cuda_alerts() as log:
        F.interpolate(x, scale_factor=2, mode="bilinear").sum().backward()  # CUDA decomposes: fine
        assert not log.events
        _mode("off")
        y = F.interpolate(x, scale_factor=2, mode="bilinear").sum()
        _mode("strict")
        with pytest.raises(RuntimeError, match="upsample_bilinear2d_backward_out_cuda"):
            y.backward()
        # the aten op called directly never takes the decomposition
        z = torch.ops.aten.upsample_bilinear2d.vec(x, None, False, [2.0, 2.0]).sum()
        with pytest.raises(RuntimeError, match="upsample_bilinear2d_backward_out_cuda"):
            z.backward()


def test_bilinear_on_torch_2_0_always_alerts() -> None:
    _mode("strict")
    with emulate_cuda_alerts(torch_version="2.0.1"):
        y = F.interpolate(_x(), scale_factor=2, mode="bilinear").sum()
        with pytest.raises(RuntimeError, match="upsample_bilinear2d_backward_out_cuda"):
            y.backward()


def test_grid_sample_follows_cudas_cudnn_path() -> None:
    # bilinear + zeros + align_corners=True goes to cuDNN on CUDA: no alert there (but not deterministic either)
    x, grid = _x(), torch.rand(2, 3, 3, 2) * 2 - 1
    _mode("strict")
    with emulate_cuda_alerts() as log:
        F.grid_sample(x, grid, align_corners=True).sum().backward()
        assert [(e.entry, e.action) for e in log.events] == [("cudnn_grid_sampler", "silent")]
        no_cudnn = torch.backends.cudnn.flags(enabled=False)
        with no_cudnn, pytest.raises(RuntimeError, match="grid_sampler_2d_backward_cuda"):
            F.grid_sample(x, grid, align_corners=True).sum().backward()
        with pytest.raises(RuntimeError, match="grid_sampler_2d_backward_cuda"):
            F.grid_sample(x, grid, align_corners=True, padding_mode="border").sum().backward()


def test_replicate_pad_follows_the_decomposition_too() -> None:
    _mode("strict")
    with emulate_cuda_alerts() as log:
        F.pad(_x(), (1, 1, 1, 1), mode="replicate").sum().backward()
    assert not log.events


def test_average_pool_to_one_by_one_never_alerts() -> None:
    _mode("strict")
    with emulate_cuda_alerts() as log:
        nn.AdaptiveAvgPool2d(1)(_x()).sum().backward()
        nn.AdaptiveAvgPool2d((1, 1))(_x()).sum().backward()
    assert not log.events


def test_forward_alert_fires_in_the_forward() -> None:
    _mode("strict")
    logits, target = torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long)
    with emulate_cuda_alerts():
        F.cross_entropy(logits.flatten(2).transpose(1, 2).reshape(-1, 3), target.flatten())  # (N, C): fine
        with pytest.raises(RuntimeError, match="nll_loss2d_forward_out_cuda_template"):
            F.cross_entropy(logits, target)


def test_embedding_bag_alerts_only_in_max_mode() -> None:
    _mode("strict")
    weight = torch.randn(10, 3, requires_grad=True)
    idx, offsets = torch.tensor([1, 2, 4, 5]), torch.tensor([0, 2])
    with emulate_cuda_alerts():
        F.embedding_bag(idx, weight, offsets, mode="sum").sum().backward()
        with pytest.raises(RuntimeError, match="embedding_bag_backward_cuda_max"):
            F.embedding_bag(idx, weight, offsets, mode="max").sum().backward()


def test_cpu_alerting_ops_are_left_to_torch() -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    _mode("strict")
    with emulate_cuda_alerts() as log, pytest.raises(RuntimeError, match="max_unpooling2d_forward_out"):
        F.max_unpool2d(y, idx, 2)
    assert not log.events  # torch raised by itself; the emulator did not add a second alert


def test_record_only() -> None:
    _mode("strict")
    with emulate_cuda_alerts(record_only=True) as log:
        F.adaptive_max_pool2d(_x(), 1).sum().backward()
    assert [e.action for e in log.events] == ["recorded"]


def test_exits_cleanly_and_nests() -> None:
    _mode("strict")
    with pytest.raises(RuntimeError):
        with emulate_cuda_alerts() as outer:
            with emulate_cuda_alerts() as inner:
                assert inner is outer
                F.adaptive_max_pool2d(_x(), 1).sum().backward()
    assert len(outer.events) == 1  # one alert, not one per nesting level
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    # usable again afterwards
    with emulate_cuda_alerts() as log:
        F.adaptive_max_pool2d(_x(), 1).sum()
    assert not log.events


def test_no_effect_outside_the_block() -> None:
    _mode("strict")
    x = _x()
    with emulate_cuda_alerts() as log:
        pass
    assert not _get_current_dispatch_mode_stack()
    assert not _get_current_function_mode_stack()
    F.adaptive_max_pool2d(x, 1).sum().backward()  # plain CPU: deterministic kernel, no alert
    assert x.grad is not None
    assert not log.events
    # the same op inside a block does alert: what made the difference is the block
    with emulate_cuda_alerts(), pytest.raises(RuntimeError, match="adaptive_max_pool2d_backward_cuda"):
        F.adaptive_max_pool2d(_x(), 1).sum().backward()


# ---------------------------------------------------------------------------------------------------------
# yolo-det's own fake-CUDA trace computes nothing: the emulator never takes it for real kernels


@pytest.mark.slow
def test_the_swap_planning_trace_is_never_taken_for_real_kernels() -> None:
    from yolo_det.analysis.audit.entry import _load
    from yolo_det.analysis.swap_plan import decide_swaps

    model = _load(MODELS / "cbam-max.yaml").model  # Ultralytics' DetectionModel; CUDA refuses its pool's backward
    _mode("strict")
    with emulate_cuda_alerts() as log, warnings.catch_warnings():
        warnings.simplefilter("error")  # a trace that failed would be a warning (and every layer swapped)
        decided = decide_swaps(model, "auto")
    assert decided == {"model.10.max_pool": "adaptive_max_pool2d_backward_cuda"}
    assert log.events == []
    # control: the same model trained for real under the emulator does alert, in the backward
    with emulate_cuda_alerts() as log, pytest.raises(RuntimeError, match="adaptive_max_pool2d_backward_cuda"):
        model.train()
        sum(t.sum() for t in tensors(model(torch.zeros(1, 3, 64, 64)))).backward()
    assert [(e.kernel, e.pass_) for e in log.events] == [("adaptive_max_pool2d_backward_cuda", "backward")]


class _Histogram(nn.Module):
    """Keeps a real tensor (neither parameter nor buffer) and bins it in its forward: CUDA refuses histc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.kept = torch.linspace(0, 1, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * torch.histc(self.kept, bins=4).sum()


def test_a_real_tensor_inside_the_audits_trace_is_no_real_kernel() -> None:
    """Under torch's fake mode an op on real inputs only (a constant the model keeps) computes nothing either."""
    from yolo_det.analysis.audit import audit

    _mode("strict")
    with emulate_cuda_alerts() as log:
        report = audit(_Histogram(), imgsz=8)
    assert log.events == []
    assert {(f.entry, f.pass_) for f in report.findings} == {("histc", "forward")}  # the trace saw it
    # control: the same forward for real alerts as CUDA would
    with emulate_cuda_alerts() as log, pytest.raises(RuntimeError, match="_histc_cuda"):
        _Histogram()(torch.zeros(1, 3, 8, 8))
    assert [e.entry for e in log.events] == ["histc"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_emulated_messages_and_conditions_match_real_cuda() -> None:
    x = torch.randn(2, 4, 8, 8, device="cuda", requires_grad=True)
    _mode("strict")
    with pytest.raises(RuntimeError) as real:
        F.adaptive_max_pool2d(x, 1).sum().backward()
    assert str(real.value) == alert_message("adaptive_max_pool2d_backward_cuda")
    nn.AdaptiveAvgPool2d(1)(x).sum().backward()  # a mean: no alert on CUDA either
    F.interpolate(x, scale_factor=2, mode="bilinear").sum().backward()  # decomposed under the flag
    _mode("off")
    y = F.interpolate(x, scale_factor=2, mode="bilinear").sum()
    _mode("strict")
    with pytest.raises(RuntimeError) as real:
        y.backward()
    assert str(real.value) == alert_message("upsample_bilinear2d_backward_out_cuda")
    _mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.grid_sample(x, torch.zeros(2, 3, 3, 2, device="cuda"), align_corners=False).sum().backward()
    assert alert_message("grid_sampler_2d_backward_cuda", warn_only=True) in [str(w.message) for w in caught]
