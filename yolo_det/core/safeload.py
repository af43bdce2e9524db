"""Checkpoints read without running them: see :mod:`yolo_det.core.untrusted.safeload` (this name stays for
existing imports)."""

from .untrusted.safeload import (
    TRUST_FLAG,
    Inert,
    check_checkpoint,
    checkpoint_model_yaml,
    checkpoint_state_dict,
    guarded_torch_load,
    is_module_like,
    load_checkpoint,
    module_state_dict,
    read_checkpoint,
    trust_checkpoints,
    trust_hint,
    trusted_checkpoints,
)

__all__ = [
    "TRUST_FLAG",
    "Inert",
    "check_checkpoint",
    "checkpoint_model_yaml",
    "checkpoint_state_dict",
    "guarded_torch_load",
    "is_module_like",
    "load_checkpoint",
    "module_state_dict",
    "read_checkpoint",
    "trust_checkpoints",
    "trust_hint",
    "trusted_checkpoints",
]
