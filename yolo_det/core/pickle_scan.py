"""The checkpoint opt-in under its documented name: see :mod:`yolo_det.core.untrusted.safeload`."""

from .untrusted.safeload import TRUST_FLAG, check_checkpoint, trust_checkpoints, trusted_checkpoints

__all__ = ["TRUST_FLAG", "check_checkpoint", "trust_checkpoints", "trusted_checkpoints"]
