"""yolo-det: reproducible YOLO training without giving up what users need.

Determinism *profiles* say, per phase (train, val, deploy), how the process is set up; the
integrations apply them at the right moments of an Ultralytics or YOLOv5 run and restore the user's
state afterwards, errors included. Quick start::

    from ultralytics import YOLO
    import yolo_det

    model = YOLO("yolov8n.yaml")
    yolo_det.attach(model, "repro")  # or model.train(trainer=yolo_det.trainer_class("repro"))
    model.train(data="data.yaml", epochs=10)

For hand-written loops: ``yolo_det.DeterminismSession``, ``yolo_det.phase_scope`` and
``yolo_det.backward_scope``. Before renting a GPU: ``yolo_det.audit("my-model.yaml")`` names the layers
that will break strict determinism on CUDA, and the fix. A model YAML that names your own blocks builds
inside ``with yolo_det.custom_modules("mypkg.blocks"):`` (or ``yolo_det.audit(..., modules=["mypkg.blocks"])``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analysis.audit import AuditReport, Finding, audit
    from .analysis.blocks import declare_block
    from .analysis.names import custom_modules
    from .core.backward import ToggleScaler, backward_scope, toggled_backward
    from .core.errors import ConfigError, ModelError, PatchError, ProfileError, YoloDetError
    from .core.launcher import export_slurm_env
    from .core.profiles import PhaseSettings, Profile, list_profiles, load_profile
    from .core.record import checkpoint_digest, environment, state_dict_digest
    from .core.seeding import data_seed, rank_seed, seed_dataloader, seed_everything, seed_worker
    from .core.state import DeterminismState, apply, phase_scope, restore, snapshot
    from .fixes.intercept import interception
    from .fixes.swaps import swap_modules, unswap_modules
    from .fixes.yaml_rewrite import rewrite_yaml
    from .integrations.ultralytics import UltralyticsPlugin, attach, detach, trainer_class
    from .layers.registry import register_layers, registered_layers
    from .session.session import DeterminismSession

__version__ = "0.4.0"

__all__ = [
    "AuditReport",
    "ConfigError",
    "DeterminismSession",
    "DeterminismState",
    "Finding",
    "ModelError",
    "PatchError",
    "PhaseSettings",
    "Profile",
    "ProfileError",
    "ToggleScaler",
    "UltralyticsPlugin",
    "YoloDetError",
    "__version__",
    "apply",
    "attach",
    "export_slurm_env",
    "audit",
    "backward_scope",
    "checkpoint_digest",
    "custom_modules",
    "data_seed",
    "declare_block",
    "detach",
    "environment",
    "interception",
    "list_profiles",
    "load_profile",
    "phase_scope",
    "rank_seed",
    "register_layers",
    "registered_layers",
    "restore",
    "rewrite_yaml",
    "seed_dataloader",
    "seed_everything",
    "seed_worker",
    "snapshot",
    "state_dict_digest",
    "swap_modules",
    "toggled_backward",
    "trainer_class",
    "unswap_modules",
]

#: Public name -> the module that defines it. Imported on first use (PEP 562), so ``import yolo_det``
#: and the command line's help start without importing torch.
_PUBLIC: dict[str, str] = {
    name: f"yolo_det.{module}"
    for module, names in {
        "core.backward": ("ToggleScaler", "backward_scope", "toggled_backward"),
        "core.errors": ("ConfigError", "ModelError", "PatchError", "ProfileError", "YoloDetError"),
        "core.profiles": ("PhaseSettings", "Profile", "list_profiles", "load_profile"),
        "core.record": ("checkpoint_digest", "environment", "state_dict_digest"),
        "core.seeding": ("data_seed", "rank_seed", "seed_dataloader", "seed_everything", "seed_worker"),
        "core.state": ("DeterminismState", "apply", "phase_scope", "restore", "snapshot"),
        "core.launcher": ("export_slurm_env",),
        "layers.registry": ("register_layers", "registered_layers"),
        "analysis.audit": ("AuditReport", "Finding", "audit"),
        "analysis.names": ("custom_modules",),
        "analysis.blocks": ("declare_block",),
        "fixes.intercept": ("interception",),
        "fixes.swaps": ("swap_modules", "unswap_modules"),
        "fixes.yaml_rewrite": ("rewrite_yaml",),
        "session.session": ("DeterminismSession",),
        "integrations.ultralytics": ("UltralyticsPlugin", "attach", "detach", "trainer_class"),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'yolo_det' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
