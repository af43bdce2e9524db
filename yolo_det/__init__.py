"""yolo-det: reproducible YOLO training without giving up what users need.

Determinism *profiles* say, per phase (train, val, deploy), how the process is set up; the
integrations apply them at the right moments of an Ultralytics or YOLOv5 run and restore the user's
state afterwards, errors included. Quick start::

    from ultralytics import YOLO
    import yolo_det

    model = YOLO("yolov8n.yaml")
    yolo_det.attach(model, "repro")          # or model.train(trainer=yolo_det.trainer_class("repro"))
    model.train(data="data.yaml", epochs=10)

For hand-written loops: ``yolo_det.DeterminismSession``, ``yolo_det.phase_scope`` and
``yolo_det.backward_scope``. Before renting a GPU: ``yolo_det.audit("my-model.yaml")`` names the layers
that will break strict determinism on CUDA, and the fix. A model YAML that names your own blocks builds
inside ``with yolo_det.custom_modules("mypkg.blocks"):`` (or ``yolo_det.audit(..., modules=["mypkg.blocks"])``).
"""

from __future__ import annotations

from .audit import AuditReport, Finding, audit
from .backward import ToggleScaler, backward_scope, toggled_backward
from .errors import ConfigError, ModelError, PatchError, ProfileError, YoloDetError
from .integrations.ultralytics import UltralyticsPlugin, attach, detach, trainer_class
from .intercept import interception
from .names import custom_modules
from .profiles import PhaseSettings, Profile, list_profiles, load_profile
from .record import checkpoint_digest, environment, state_dict_digest
from .seeding import data_seed, rank_seed, seed_dataloader, seed_everything, seed_worker
from .session import DeterminismSession
from .state import DeterminismState, apply, phase_scope, restore, snapshot
from .swaps import register_layers, registered_layers, swap_modules, unswap_modules
from .yaml_rewrite import rewrite_yaml

__version__ = "0.1.0"

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
    "audit",
    "backward_scope",
    "checkpoint_digest",
    "custom_modules",
    "data_seed",
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
