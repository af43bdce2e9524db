"""Will this machine reproduce a run's weights? The prediction of ``yolo-det check-machine``.

:func:`check_machine` predicts the machine fingerprint (:mod:`yolo_det.core.machine`) the same command would
train with here under a profile: the profile's ``intra_op_threads`` (without it, the ``min(8, cores - 1)``
Ultralytics sets for CPU training, or torch's own count), its ``cpu_isa`` branches (without it, those this
process has), this torch and this CPU or GPU. It compares that with the record's fingerprint through
:func:`~yolo_det.core.machine.machine_causes`, the rule ``yolo-det diff`` and ``verify --against`` use, and adds
the training settings of the profile that differ from the run's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.machine import MachineCause, machine_causes, machine_fingerprint, machine_view
from ..core.machine_settings import ISA_CAPABILITY, ISA_ENV, cannot_match
from ..core.profiles import BUILTIN_PROFILES, Profile, load_profile
from ..core.text import printable
from .diff.common import _args, _trained_on_cpu

__all__ = ["EXIT_CODES", "MachineVerdict", "check_machine", "predicted_fingerprint"]

#: Settings whose effect is judged through the fingerprint (threads, branches), or that act only on CUDA.
_THROUGH_FINGERPRINT = frozenset({"intra_op_threads", "cpu_isa"})
_CUDA_ONLY = frozenset({"cudnn_benchmark", "cudnn_deterministic", "allow_tf32", "env"})


#: The three answers and their exit codes.
EXIT_CODES = {"will agree": 0, "will differ": 1, "not promised": 3}


@dataclass
class MachineVerdict:
    """The prediction: the causes (none: will agree), notes, and both fingerprints.

    The verdict is "will differ" when a cause is known to change the bits, "not promised" when every cause is a
    version difference nobody has measured (:attr:`MachineCause.measured`), else "will agree".
    """

    causes: list[MachineCause]
    notes: list[str] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)
    here: dict[str, Any] = field(default_factory=dict)
    profile: str = ""

    @property
    def verdict(self) -> str:
        """``will agree``, ``will differ`` or ``not promised``."""
        if any(c.measured for c in self.causes):
            return "will differ"
        return "not promised" if self.causes else "will agree"

    @property
    def exit_code(self) -> int:
        """0: will agree; 1: will differ; 3: not promised."""
        return EXIT_CODES[self.verdict]

    def summary(self) -> str:
        """The report: one line per cause with why it matters (the setting that fixes it, or that nobody measured
        it), then the verdict. Text read from the record is escaped (a control character, a terminal escape, a bidi
        mark) and cut short, as ``diff`` shows it."""
        lines = [f"  {c.name}: recorded {_show(c.a)} | here {_show(c.b)} -> {c.reason}" for c in self.causes]
        lines += [f"  note: {n}" for n in self.notes]
        verdict, profile = self.verdict, f"under profile '{self.profile}'"
        if verdict == "will differ":
            known = sum(c.measured for c in self.causes)
            lines.append(f"will differ {profile}: {known} cause(s) above change the bits")
        elif verdict == "not promised":
            lines.append(
                f"not promised {profile}: {len(self.causes)} version difference(s) above that nobody has measured; "
                "the weights may agree or not (train once here and compare with `yolo-det digest` to know)"
            )
        else:
            lines.append(f"will agree: the same command {profile} reproduces those weights here")
        return "\n".join(printable(line, newlines=False) for line in lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "verdict": self.verdict,
            "profile": self.profile,
            "causes": [
                {"name": c.name, "recorded": c.a, "here": c.b, "fix": c.fix, "measured": c.measured}
                for c in self.causes
            ],
            "notes": list(self.notes),
            "recorded": self.recorded,
            "here": self.here,
        }


def predicted_fingerprint(record: Mapping[str, Any], profile: Profile) -> dict[str, Any]:
    """The fingerprint the run's command would train with here under ``profile``."""
    here = machine_fingerprint()
    train = profile.phase("train").extra
    threads = train.get("intra_op_threads")
    if threads is None and _trained_on_cpu(record) and record.get("framework", "ultralytics") == "ultralytics":
        threads = min(8, max(1, (os.cpu_count() or 1) - 1))  # Ultralytics' NUM_THREADS for CPU training
    if threads is not None:
        here["intra_op_threads"] = threads
    isa = train.get("cpu_isa")
    if isa is not None and cannot_match(isa) is None:
        here["cpu_capability"] = ISA_CAPABILITY[isa]
        here["env"] = {**(here.get("env") or {}), **ISA_ENV[isa]}
    return here


def _show(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def check_machine(record: Mapping[str, Any], profile: str | Profile | None = None) -> MachineVerdict:
    """Predict whether the run's command under ``profile`` (default: the run's own) reproduces its weights here.

    Raises:
        ProfileError: ``profile`` is unknown or malformed.
    """
    recorded_profile = record.get("profile") or {}
    if not isinstance(recorded_profile, Mapping):
        recorded_profile = {}
    recorded_name = recorded_profile.get("name")
    builtin = recorded_name if recorded_name in BUILTIN_PROFILES else None
    early: list[str] = []
    if profile is not None:
        resolved = load_profile(profile)
    else:  # a record names its profile; only a built-in one is loaded by that name, never a file here
        resolved = load_profile(builtin or "repro")
        if builtin is None:
            early.append(
                f"the run's profile '{_show(recorded_name, 60)}' is not a built-in one: predicted under repro; "
                "pass --profile FILE to predict under the run's profile file"
            )
    on_cuda = not _trained_on_cpu(record)
    here = predicted_fingerprint(record, resolved)
    recorded = machine_view(record.get("environment") or {})
    causes, notes = machine_causes(recorded, here, cuda=on_cuda)
    isa = resolved.phase("train").extra.get("cpu_isa")
    problem = cannot_match(isa) if isa is not None and not on_cuda else None
    if problem:
        causes.insert(0, MachineCause("profile's cpu_isa", isa, "not available", problem))
    ran = recorded_profile.get("train") or {}
    wanted = resolved.phase("train").to_dict()
    for key in sorted(set(ran) & set(wanted) - _THROUGH_FINGERPRINT):
        if not on_cuda and key in _CUDA_ONLY:
            continue
        if _canon(ran[key]) != _canon(wanted[key]):
            causes.append(
                MachineCause(
                    f"profile setting train.{key}",
                    ran[key],
                    wanted[key],
                    f"--profile {builtin} (the run's profile)" if builtin else "--profile with the run's profile file",
                )
            )
    device = _args(record).get("device")
    if on_cuda and not here.get("gpu"):
        causes.append(MachineCause("device", device or "cuda", "no CUDA here", "train on a machine with the GPU"))
    return MachineVerdict(causes, early + notes, recorded=recorded, here=here, profile=resolved.name)
