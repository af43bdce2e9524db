"""The audit entry point: load the model, trace it, match the trace, report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ...core.errors import ConfigError, ModelError
from ...core.profiles import Profile, load_profile
from ..loader import LoadedModel, load_model
from ..optable import OpTable, fake_cuda_trace_problem, load_table, parse_version
from ..optable import torch_version as _running_torch
from .match import _match, _merge_observed
from .report import AuditReport, Finding
from .trace import _fake_trace, _loss_trace, _real_trace

__all__ = ["audit"]


def _check_size(imgsz: Any, batch: Any, stride: int | None) -> int:
    if isinstance(imgsz, bool) or not isinstance(imgsz, int) or imgsz < 1:
        raise ConfigError(f"imgsz must be a positive integer, got {imgsz!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch!r}")
    if stride:
        if imgsz < stride or imgsz % stride:
            lower = max(stride, imgsz // stride * stride)
            upper = lower if lower > imgsz else lower + stride
            options = sorted({lower, upper})
            raise ConfigError(
                f"imgsz {imgsz} is not a multiple of the model's stride {stride}; use {' or '.join(map(str, options))}"
            )
    return imgsz


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Torch's intra-op threads set to one for the block, then put back (on error too).

    Building a model runs a few hundred tiny CPU kernels (the parameters' initialisation), whose values the
    audit never reads; on a machine whose cores are busy with other work, handing each to a second thread costs
    more than it saves (yolov8n, 2 cores, load average 2-3: 0.6-2.5 s of CPU with two threads, 0.15 s with one).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _load(model: Any, modules: Any = None) -> LoadedModel:
    if isinstance(model, LoadedModel):
        return model
    from ..names import custom_modules

    # the user's blocks, yolo-det's layer names and the example blocks
    with custom_modules(list(modules or [])), _one_thread():
        return load_model(model)


def audit(
    model: Any,
    *,
    imgsz: int = 640,
    batch: int = 2,
    profile: str | Profile = "repro",
    device: str = "fake",
    torch_version: str | None = None,
    table: str | Path | OpTable | None = None,
    loss: bool = False,
    modules: Any = None,
) -> AuditReport:
    """Find the layers of ``model`` that will not train under strict determinism on CUDA.

    Args:
        model: A model YAML (path, Ultralytics name such as ``yolov8n.yaml``, or yolo-det example such as
            ``cbam-max.yaml``; rewritten YAMLs' ``Det*`` names and the blocks of :mod:`yolo_det.analysis.zoo` are
            known), a checkpoint path, a factory ``package.module:function``, an
            ``nn.Module`` or an ``ultralytics.YOLO``.
        imgsz: Square input size of the trace (a multiple of the model's stride).
        batch: Batch size of the trace.
        profile: The profile (name, file or :class:`~yolo_det.core.profiles.Profile`) whose train phase decides
            the deterministic flag at forward time and the "under profile" column.
        device: ``fake`` (the default: fake CUDA, any machine) or ``cuda``/``cuda:N`` to also run the real kernels
            under strict mode as a second opinion.
        torch_version: Read the table for this torch version instead of the running one ("what would happen on
            torch 2.0?"). The trace itself always runs on the installed torch.
        table: A table file of the same format as the built-in one (default: the built-in table).
        loss: Also run one real training step of an Ultralytics model on the CPU (forward, the model's own loss
            on a synthetic batch, backward) and report what the loss itself reaches (module ``(loss)``). The loss
            branches on its data, which a fake trace cannot follow; use a small ``imgsz``.
        modules: The user's modules whose classes a model YAML names: module names (``"mypkg.blocks"``), ``.py``
            paths, module objects or ``{name: class}`` mappings (the CLI's ``--import``); see
            :func:`yolo_det.analysis.names.custom_modules`. yolo-det's layer names (``DetUpsample``, ...) and
            example blocks always resolve; a name the process already binds is never replaced.

    Returns:
        The report: ``.findings``, ``.ok``, ``.to_dict()``, ``.format_table()``.

    Raises:
        ModelError: The model cannot be loaded, built or run.
        ConfigError: Bad ``imgsz``/``batch``/``device``/``torch_version``, or a bad table.
        ProfileError: Bad profile.
    """
    started = time.perf_counter()
    prof = load_profile(profile)
    settings = prof.train
    tbl = load_table(table)
    running = _running_torch()
    version = running if torch_version is None else str(torch_version)
    parse_version(version)
    if not isinstance(device, str) or not (device == "fake" or device == "cuda" or device.startswith("cuda:")):
        raise ConfigError(f"device must be 'fake' or 'cuda[:N]', got {device!r}")
    if device != "fake" and not torch.cuda.is_available():
        raise ConfigError(
            f"device '{device}' needs a CUDA GPU and none is available; the default fake-CUDA trace needs none"
        )
    loaded = _load(model, modules)
    _check_size(imgsz, batch, loaded.stride)
    problem = fake_cuda_trace_problem()
    if problem is not None:
        raise ModelError(f"the audit cannot trace here: {problem}")
    trace = _fake_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=settings.deterministic)
    findings = _match(trace, tbl, version, loaded, settings)
    notes = list(trace.notes)
    if loss:
        loss_trace = _loss_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=settings.deterministic)
        findings += [f for f in _match(loss_trace, tbl, version, loaded, settings) if f.module == "(loss)"]
    device_label = "fake-cuda"
    if device != "fake":
        real = _real_trace(loaded, tbl, imgsz=imgsz, batch=batch, forward_det=True, device=device)
        findings = _merge_observed(findings, real, tbl, loaded, settings)
        notes += real.notes
        device_label = f"fake-cuda+{device}"
    findings, fixed = _split_fixed(findings, loaded.model)
    return AuditReport(
        model=loaded.source,
        findings=findings,
        fixed=fixed,
        torch_version=version,
        running_torch=running,
        profile=prof.name,
        imgsz=imgsz,
        batch=batch,
        device=device_label,
        yaml_path=str(loaded.yaml_path) if loaded.yaml_path else None,
        notes=notes,
        stats={
            "ops": trace.counts["ops"],
            "autograd_nodes": trace.counts["nodes"],
            "backward_nodes_run": trace.counts["backward_nodes"],
            "seconds": round(time.perf_counter() - started, 3),
        },
    )


def _split_fixed(findings: list[Finding], model: Any) -> tuple[list[Finding], list[Finding]]:
    """Findings in yolo-det's own deterministic layers (``DetUpsample``, ...: their custom backward runs only torch
    ops, checked by the trace) are fixed, not findings: (the rest, those)."""
    from ...layers.table import SWAPS

    ours = tuple(SWAPS.values())
    rest, fixed = [], []
    for f in findings:
        try:
            module = model.get_submodule(f.module) if f.module and f.module != "(loss)" else None
        except AttributeError:
            module = None
        if f.effect == "review" and isinstance(module, ours):
            fixed.append(f)
        else:
            rest.append(f)
    return rest, fixed
