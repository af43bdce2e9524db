"""The first way in: :func:`attach` a plugin to an ``ultralytics.YOLO`` model, :func:`detach` it again.

Attaching registers the plugin's callbacks on the model and guards its ``train``, ``val``, ``predict`` and
``export`` (instance attributes that shadow the class's methods). Each guarded call passes the one gate for
path-valued arguments (:func:`yolo_det.analysis.gate.check_arguments`) and loads under the allow-list, then
runs under a run of the plugin that restores the process state afterwards, also when the call raises.
``train`` also checks the labels it will read (:func:`yolo_det.analysis.datacheck.check_training_data`),
takes the stop signals, resumes into the checkpoint's folder, locks a run folder whose name is fixed and trains
with the trainer seam (:mod:`.seam`) composed with the model's trainer (or the ``trainer=`` passed); a streaming
``predict`` and ``export`` go through :mod:`.deploy`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from ...analysis.datacheck import check_training_data
from ...core.errors import YoloDetError
from ...core.profiles import Profile, load_profile
from ...core.signals import stop_signals
from ...session.distributed import terminate_via_launcher
from ...session.session import DeterminismSession
from .deploy import export_standard, guarded_stream
from .folders import lock_fixed_folder, resume_into_its_folder
from .launcher import default_base
from .plugin import UltralyticsPlugin, is_plugin_callback
from .seam import seam_trainer

__all__ = ["attach", "detach"]

_ATTACHED = "_yolo_det_plugin"
_GUARDED = ("train", "val", "predict", "export")


def attach(model: Any, profile: Profile | str = "repro", *, record: bool = True) -> UltralyticsPlugin:
    """Make an ``ultralytics.YOLO`` model run under ``profile``.

    Registers the plugin's callbacks on the model and guards ``train``, ``val``, ``predict`` and
    ``export`` so the process-wide state is restored after each call, also when it raises. Attaching
    again returns the same plugin (switched to ``profile``); callbacks are never registered twice.

    Args:
        model: An ``ultralytics.YOLO`` (or any ``ultralytics.engine.model.Model``).
        profile: A built-in name, a profile file path, or a :class:`~yolo_det.core.profiles.Profile`.
        record: Write ``determinism.json`` into each training run directory.

    Returns:
        The plugin (``plugin.record_path`` and ``plugin.weights_digest`` describe the last training run).
    """
    if not hasattr(model, "callbacks") or not hasattr(model, "add_callback"):
        raise YoloDetError(f"attach() needs an ultralytics YOLO model, got {type(model).__name__}")
    plugin: UltralyticsPlugin | None = model.__dict__.get(_ATTACHED)
    if plugin is not None:
        plugin.profile = load_profile(profile)
        plugin.record = record
    else:
        plugin = UltralyticsPlugin(profile, record=record)
        model.__dict__[_ATTACHED] = plugin
        for name in _GUARDED:
            model.__dict__[name] = _guarded(plugin, name, getattr(model, name), model)
    plugin.register(model.callbacks)
    return plugin


def detach(model: Any) -> None:
    """Undo :func:`attach`: remove the callbacks and the guards. No-op if not attached."""
    plugin = model.__dict__.pop(_ATTACHED, None)
    if plugin is None:
        return
    for name in _GUARDED:
        model.__dict__.pop(name, None)
    for event in list(model.callbacks):
        model.callbacks[event] = [f for f in model.callbacks[event] if not is_plugin_callback(f)]


def _guarded(plugin: UltralyticsPlugin, name: str, method: Callable[..., Any], owner: Any) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        from ...analysis.gate import check_arguments
        from ...core.untrusted.allow import allowed_user_modules
        from ...core.untrusted.safeload import guarded_torch_load

        net = owner.model
        # the classes of the model being run are the user's own (built in this process): its checkpoints hold them
        own = {type(m).__module__ for m in net.modules()} if isinstance(net, torch.nn.Module) else set()
        with allowed_user_modules(own):
            # the one gate: every path-valued argument Ultralytics will read (the model's stored ones, then the
            # call's), before it reads any
            check_arguments({**owner.overrides, **kwargs})
            with guarded_torch_load():  # whatever Ultralytics then loads goes through the allow-list
                return _call(*args, **kwargs)

    def _call(*args: Any, **kwargs: Any) -> Any:
        if name == "predict" and kwargs.get("stream"):
            return guarded_stream(plugin, method(*args, **kwargs), _without_threads(plugin))
        if name == "export":
            return export_standard(plugin, method, owner, args, kwargs)
        if name == "train":
            kwargs = resume_into_its_folder(owner, kwargs)
            plugin.asked = dict(kwargs)
            asked = {**owner.overrides, **kwargs}
            check_training_data(asked, task=owner.task)  # before anything is written
            base = kwargs.get("trainer") or default_base(owner)
            kwargs = {**kwargs, "trainer": seam_trainer(base)}  # the trainer seam: yolo-det's methods of the class
            with stop_signals(), plugin.guard(), terminate_via_launcher():
                lock = lock_fixed_folder(owner, kwargs)
                try:
                    return method(*args, **kwargs)
                finally:
                    if lock is not None:
                        lock.release()
        with plugin.guard(baseline=_without_threads(plugin)):
            return method(*args, **kwargs)

    return call


def _without_threads(plugin: UltralyticsPlugin) -> Any:
    """The baseline of a prediction or validation: the process state now, less the thread count. Ultralytics'
    predictor and validator set it when they are built (``select_device``) and later calls reuse them, so giving
    the count back after the first call would run the next ones with another count than the first (and other
    numerics), which Ultralytics alone never does; a training gives it back (its trainer sets it each time)."""
    return dataclasses.replace(DeterminismSession(plugin.profile).snapshot(), intra_op_threads=None)
