"""Determinism profiles: what each phase of a run (train, val, deploy) must set up.

Length: one concern, the profile schema: the settings, their validation (one branch per setting) and
the loader that names the file and line of an error change together when a setting is added.

A :class:`Profile` holds one :class:`PhaseSettings` per phase. Profiles are data: the built-ins
(``repro``, ``portable``, ``balanced``, ``fast``) are YAML files shipped in ``yolo_det/core/presets``, and a user's
profile is a YAML file of the same shape, optionally ``extends:`` a built-in::

    name: my-profile
    description: repro, but cuDNN may autotune during training
    extends: repro
    defaults:            # applied to every phase
      fill_uninitialized_memory: false
    train:
      cudnn_benchmark: true

:func:`load_profile` takes a built-in name or a path and validates everything: an unknown key, a
wrong type or a bad value raises :class:`~yolo_det.core.errors.ProfileError` naming the file and line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

import yaml

from .errors import ProfileError, did_you_mean
from .text import short
from .untrusted import safe_yaml

__all__ = [
    "BUILTIN_PROFILES",
    "ENV_VARIABLES",
    "PHASES",
    "PhaseSettings",
    "Profile",
    "Setting",
    "list_profiles",
    "load_profile",
    "register_setting",
    "shard_layout_problem",
    "unregister_setting",
]

DeterministicAlgorithms = Literal["off", "warn", "strict"]
BackwardMode = Literal["keep", "disable"]
SwapPolicy = Literal["none", "auto", "all"]
Phase = Literal["train", "val", "deploy"]

PHASES: tuple[str, ...] = get_args(Phase)
BUILTIN_PROFILES: tuple[str, ...] = ("balanced", "fast", "portable", "repro")
_SEED_LIMIT = 2**32  # numpy's legacy seeding accepts [0, 2**32)

#: The environment variables a profile's ``env`` may set: those that decide determinism, and what each decides.
#: Any other name is refused (a profile may come from someone else, and a variable such as ``PYTHONPATH``,
#: ``LD_PRELOAD`` or ``YOLO_DET_CACHE`` would change what the run, or a process it starts, loads).
ENV_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        "CUBLAS_WORKSPACE_CONFIG": "cuBLAS's workspace: a fixed one makes its kernels deterministic",
        "NVIDIA_TF32_OVERRIDE": "whether CUDA libraries may use TF32",
        "NCCL_ALGO": "NCCL's all-reduce algorithm (the order of its sums)",
        "NCCL_PROTO": "NCCL's protocol (the order of its sums)",
        "PYTHONHASHSEED": "Python's hash seed (the order of sets, for processes started with it)",
        "OMP_NUM_THREADS": "OpenMP's thread count (how CPU reductions are split)",
        "MKL_NUM_THREADS": "MKL's thread count (how its reductions are split)",
        "OPENBLAS_NUM_THREADS": "OpenBLAS's thread count (how its reductions are split)",
        "MKL_CBWR": "MKL's conditional numerical reproducibility branch",
        "MKL_ENABLE_INSTRUCTIONS": "the instruction set MKL may use",
        "ATEN_CPU_CAPABILITY": "the instruction set of ATen's CPU kernels",
        "ONEDNN_MAX_CPU_ISA": "the instruction set oneDNN may use",
        "DNNL_MAX_CPU_ISA": "the instruction set oneDNN may use (its former name)",
    }
)


@dataclass(frozen=True)
class PhaseSettings:
    """How the process is set up while one phase runs.

    Attributes:
        seed: Seed for python, numpy and torch RNGs when the phase starts. ``None`` means "the run's seed"
            for training (Ultralytics' ``seed=``, YOLOv5's ``--seed``) and "do not reseed" for val/deploy.
        deterministic_algorithms: ``torch.use_deterministic_algorithms``: ``off``, ``warn`` (warn_only=True:
            offending CUDA kernels warn and stay non-deterministic) or ``strict`` (they raise).
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` (autotuning; picks algorithms per run).
        cudnn_deterministic: ``torch.backends.cudnn.deterministic``.
        allow_tf32: TF32 for float32 matmuls and cuDNN convolutions (changes numerics, not determinism).
        fill_uninitialized_memory: ``torch.utils.deterministic.fill_uninitialized_memory``: under
            deterministic algorithms, fill new tensors with NaN so reads of uninitialized memory repeat.
        backward: ``keep`` runs backward under the phase's settings; ``disable`` turns deterministic
            algorithms off exactly while the backward pass runs. That lets layers without a deterministic
            CUDA backward train under ``strict``, but it also turns off the deterministic paths of
            ``index_put``/``scatter_add``/``gather`` backward, so backward is no longer bitwise reproducible.
        swaps: Layer-swap policy: ``none``; ``auto`` (swap the layers whose CUDA kernel is non-deterministic
            on the running torch for deterministic equivalents); ``all`` (swap every layer that has an
            equivalent, whatever the torch version).
        intercept: Route non-deterministic functional calls (``F.grid_sample``, ``F.adaptive_max_pool2d``,
            ``F.interpolate``, ...) to deterministic implementations while the phase runs.
        env: Environment variables set while the phase runs (``None`` unsets one), e.g.
            ``CUBLAS_WORKSPACE_CONFIG`` or NCCL's ``NCCL_ALGO``.
        extra: Values of the settings added with :func:`register_setting` (name -> value; the defaults of
            those not given). Profile files and :meth:`to_dict` show them next to the built-in settings.
    """

    seed: int | None = None
    deterministic_algorithms: DeterministicAlgorithms = "strict"
    cudnn_benchmark: bool = False
    cudnn_deterministic: bool = True
    allow_tf32: bool = False
    fill_uninitialized_memory: bool = True
    backward: BackwardMode = "keep"
    swaps: SwapPolicy = "none"
    intercept: bool = False
    env: Mapping[str, str | None] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        extra = {name: s.default for name, s in _EXTRA.items()}
        extra.update(self.extra)
        object.__setattr__(self, "extra", MappingProxyType(extra))

    def __hash__(self) -> int:
        return hash(
            (
                *(getattr(self, name) for name in _FIELDS if name != "env"),
                tuple(sorted(self.env.items(), key=lambda kv: kv[0])),
                tuple(sorted(self.extra.items(), key=lambda kv: kv[0])),
            )
        )

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (_phase_settings, (self.to_dict(),))

    @property
    def deterministic(self) -> bool:
        """True when deterministic algorithms are on (``warn`` or ``strict``)."""
        return self.deterministic_algorithms != "off"

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data (JSON/YAML-ready); registered settings appear next to the built-in ones."""
        out = {name: getattr(self, name) for name in _FIELDS}
        out["env"] = dict(self.env)
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> PhaseSettings:
        """Return a copy with ``changes`` applied (validated like a profile file)."""
        data = self.to_dict()
        for key, value in changes.items():
            data[key] = _check_value(key, value, where="PhaseSettings.replace")
        return _phase_settings(data)


def _phase_settings(data: Mapping[str, Any]) -> PhaseSettings:
    """PhaseSettings from the flat dict of :meth:`PhaseSettings.to_dict` (also the unpickle helper)."""
    fields = {k: v for k, v in data.items() if k in _FIELDS}
    return PhaseSettings(**fields, extra={k: v for k, v in data.items() if k not in _FIELDS})


@dataclass(frozen=True)
class Setting:
    """A phase setting added by an extension (the built-in settings are :class:`PhaseSettings`' fields).

    Attributes:
        name: The key in profile files (``train: {name: value}``) and in :attr:`PhaseSettings.extra`.
        default: The value when a profile does not say.
        check: ``check(value) -> value``: the value normalised, or ``ValueError``/``TypeError`` saying what
            is expected (the message follows "'name' " in the one-line profile error).
        doc: One line on what the setting does.
    """

    name: str
    default: Any
    check: Callable[[Any], Any]
    doc: str = ""


#: Settings registered by extensions, by name (see :func:`register_setting`).
_EXTRA: dict[str, Setting] = {}


def register_setting(setting: Setting) -> None:
    """Add a phase setting to the profile schema (profiles, :meth:`PhaseSettings.replace`, ``to_dict``).

    The extension that applies it reads ``ctx.settings.extra[setting.name]``. Registering the same object
    again is a no-op.

    Raises:
        ProfileError: The name is not an identifier, or is taken by a built-in or another registered setting.
    """
    name = setting.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ProfileError(f"cannot register setting {name!r}: a setting name must be a Python identifier")
    if _EXTRA.get(name) is setting:
        return
    if name in _FIELDS or name in _TOP_KEYS or name == "extra" or name in _EXTRA:
        raise ProfileError(f"cannot register setting '{name}': the name is taken; choose another")
    _EXTRA[name] = setting


def unregister_setting(name: str) -> None:
    """Remove a setting added by :func:`register_setting` (unknown names are ignored)."""
    _EXTRA.pop(name, None)


@dataclass(frozen=True)
class Profile:
    """A named set of phase settings.

    Attributes:
        name: The profile's name.
        description: One paragraph on what the profile is for and what it gives up.
        train: Settings while training (forward, backward, optimizer steps).
        val: Settings while validating, inside training and in ``model.val()``.
        deploy: Settings while predicting and exporting.
        source: ``builtin:NAME`` or the path of the YAML file it was loaded from.
    """

    name: str
    description: str
    train: PhaseSettings
    val: PhaseSettings
    deploy: PhaseSettings
    source: str = ""

    def phase(self, phase: str) -> PhaseSettings:
        """Return the settings of ``phase`` (``train``, ``val`` or ``deploy``)."""
        if phase not in PHASES:
            raise ProfileError(
                f"unknown phase '{phase}'; choose from {', '.join(PHASES)}.{did_you_mean(phase, PHASES)}"
            )
        return getattr(self, phase)

    def to_dict(self) -> dict[str, Any]:
        """The resolved profile as plain data (JSON/YAML-ready)."""
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            **{p: self.phase(p).to_dict() for p in PHASES},
        }

    def to_yaml(self) -> str:
        """The resolved profile as a YAML document that :func:`load_profile` accepts."""
        data = self.to_dict()
        data.pop("source")
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


# ---------------------------------------------------------------------------------------------------------
# validation

_FIELDS = {f.name: f for f in dataclasses.fields(PhaseSettings) if f.name != "extra"}
_CHOICES: dict[str, tuple[str, ...]] = {
    "deterministic_algorithms": get_args(DeterministicAlgorithms),
    "backward": get_args(BackwardMode),
    "swaps": get_args(SwapPolicy),
}
_BOOLS = {"cudnn_benchmark", "cudnn_deterministic", "allow_tf32", "fill_uninitialized_memory", "intercept"}
_TOP_KEYS = ("name", "description", "extends", "defaults", *PHASES)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_value(key: str, value: Any, *, where: str) -> Any:
    """Validate one phase setting and return it normalised; raise ProfileError with ``where`` as prefix."""
    extra = _EXTRA.get(key)
    if extra is not None:
        try:
            return extra.check(value)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{where}: '{key}' {e}") from None
    if key not in _FIELDS:
        valid = [*_FIELDS, *_EXTRA]
        raise ProfileError(
            f"{where}: unknown setting '{key[:100]}'; valid settings: {', '.join(valid)}."
            f"{did_you_mean(key[:100], valid)}"
        )
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: '{key}' must be true or false, got {_type_name(value)} {short(value)}")
        return value
    if key in _CHOICES:
        choices = _CHOICES[key]
        if isinstance(value, bool) and key == "deterministic_algorithms":
            value = "strict" if value else "off"  # YAML 'deterministic_algorithms: false' reads as a bool
        if value not in choices:
            raise ProfileError(
                f"{where}: '{key}' must be one of {', '.join(choices)}, got {short(value)}."
                f"{did_you_mean(str(value)[:100], choices) if isinstance(value, str) else ''}"
            )
        return value
    if key == "seed":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _SEED_LIMIT:
            raise ProfileError(f"{where}: 'seed' must be null or an integer in [0, 2**32), got {short(value)}")
        return value
    if key == "env":
        if not isinstance(value, Mapping):
            raise ProfileError(
                f"{where}: 'env' must be a mapping of variable name to string or null, got {short(value)}"
            )
        env: dict[str, str | None] = {}
        for name, val in value.items():
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ProfileError(f"{where}: 'env' has an invalid variable name {short(name)}")
            if name not in ENV_VARIABLES:
                raise ProfileError(
                    f"{where}: 'env' may set only the variables that decide determinism "
                    f"({', '.join(ENV_VARIABLES)}), not {short(name)[:100]}; set it in your shell instead."
                    f"{did_you_mean(name[:100], list(ENV_VARIABLES))}"
                )
            if val is not None and not isinstance(val, (str, int, float)) or isinstance(val, bool):
                raise ProfileError(f"{where}: 'env.{name[:100]}' must be a string or null, got {short(val)}")
            if isinstance(val, str) and "\0" in val:
                raise ProfileError(
                    f"{where}: 'env.{name[:100]}' contains a NUL character, which no environment "
                    "variable can hold; remove it"
                )
            env[name] = None if val is None else str(val)
        return env
    raise AssertionError(f"unhandled setting {key}")  # pragma: no cover - _FIELDS and the branches agree


class _Lines:
    """Line numbers of the keys of a YAML document, found by composing its node tree."""

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, ...], int] = {}
        try:
            node = safe_yaml.compose(text)
        except yaml.YAMLError:
            node = None
        if node is not None:
            self._walk(node, (), set())

    def _walk(self, node: yaml.Node, path: tuple[str, ...], seen: set[int]) -> None:
        if isinstance(node, yaml.MappingNode) and id(node) not in seen and len(path) < 3:
            seen.add(id(node))  # an aliased mapping is walked once
            for key_node, value_node in node.value:
                key = (*path, str(key_node.value)[:100])
                self._lines[key] = key_node.start_mark.line + 1
                self._walk(value_node, key, seen)

    def line(self, *path: str) -> int | None:
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None


def _where(origin: str, lines: _Lines, *path: str) -> str:
    line = lines.line(*path)
    return f"{origin}:{line}" if line else origin


def _builtin_text(name: str) -> str:
    return resources.files("yolo_det.core.presets").joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def list_profiles() -> dict[str, str]:
    """Return ``{name: description}`` of the built-in profiles."""
    return {name: load_profile(name).description for name in BUILTIN_PROFILES}


def load_profile(profile: str | os.PathLike[str] | Profile) -> Profile:
    """Load and validate a profile.

    Args:
        profile: A built-in name (one of :data:`BUILTIN_PROFILES`), the path of a profile YAML file,
            or a :class:`Profile` (returned as is).

    Returns:
        The resolved profile.

    Raises:
        ProfileError: The name is unknown, the file is missing or malformed, or a setting is invalid.
            The message names the file and line.
    """
    return _load(profile, chain=())


class _Structural(ProfileError):
    """A profile error whose message holds no text of the file (a cycle, a missing file, an unknown name): it may be
    shown through ``extends:``, where the profile's own errors are not (they quote the file)."""


def _load(
    profile: str | os.PathLike[str] | Profile, *, chain: tuple[str, ...], base_dir: Path | None = None
) -> Profile:
    if isinstance(profile, Profile):
        return profile
    if not isinstance(profile, (str, os.PathLike)):
        raise ProfileError(f"a profile must be a name or a path, got {_type_name(profile)}")
    text_name = os.fspath(profile)
    if text_name in BUILTIN_PROFILES:
        return _parse(
            _builtin_text(text_name),
            origin=f"builtin:{text_name}",
            chain=chain,
            base_dir=None,
            ident=f"builtin:{text_name}",
        )
    path = Path(text_name).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    looks_like_path = path.suffix in {".yaml", ".yml"} or os.sep in text_name or "/" in text_name
    if not looks_like_path:
        raise _Structural(
            f"unknown profile '{text_name}'; choose from {', '.join(BUILTIN_PROFILES)} or give the path of a "
            f"profile YAML file.{did_you_mean(text_name, BUILTIN_PROFILES)}"
        )
    if not path.is_file():
        raise _Structural(
            f"profile file '{path}' does not exist; give a built-in name "
            f"({', '.join(BUILTIN_PROFILES)}) or an existing YAML file"
        )
    from .untrusted.textfile import TextTooLarge, read_text

    try:
        text = read_text(path, what="profile")
    except TextTooLarge as e:
        raise ProfileError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"cannot read profile file '{path}': {e}") from None
    return _parse(text, origin=str(path), chain=chain, base_dir=path.parent, ident=os.path.realpath(path))


def _parse(text: str, *, origin: str, chain: tuple[str, ...], base_dir: Path | None, ident: str) -> Profile:
    # ``chain`` holds the real paths of the files being loaded, so ``extends: ../p/up.yaml`` is a cycle too
    if ident in chain:
        raise _Structural(f"{origin}: 'extends' forms a cycle: {' -> '.join((*chain, ident))}")
    if len(chain) >= 32:
        raise _Structural(f"{origin}: 'extends' chains more than 32 profiles")
    try:
        data = safe_yaml.load(text)
    except yaml.YAMLError as e:
        raise ProfileError(safe_yaml.error_line(str(origin), e, context=True)) from None
    lines = _Lines(text)
    if data is None:
        raise ProfileError(f"{origin}: the profile file is empty; see `yolo-det profiles show repro` for the format")
    if not isinstance(data, dict):
        raise ProfileError(
            f"{origin}:1: a profile must be a mapping with keys {', '.join(_TOP_KEYS)}, got {_type_name(data)}"
        )
    for key in data:
        if key not in _TOP_KEYS:
            raise ProfileError(
                f"{_where(origin, lines, str(key)[:100])}: unknown key '{str(key)[:100]}'; valid keys: "
                f"{', '.join(_TOP_KEYS)}.{did_you_mean(str(key)[:100], _TOP_KEYS)}"
            )

    extends = data.get("extends")
    if extends is not None:
        if not isinstance(extends, str):
            raise ProfileError(
                f"{_where(origin, lines, 'extends')}: 'extends' must be a profile name or path, got {short(extends)}"
            )
        try:
            base = _load(extends, chain=(*chain, ident), base_dir=base_dir)
        except _Structural as e:
            where = _where(origin, lines, "extends")
            raise _Structural(f"{where}: in 'extends: {short(extends)[1:-1]}': {e}") from None
        except ProfileError:
            # what the extended file holds is never quoted here (it may be any file the name reaches, a link to a
            # secret included): the user sees why by naming it
            raise _Structural(
                f"{_where(origin, lines, 'extends')}: 'extends: {short(extends)[1:-1]}' is not a valid profile; "
                f"run 'yolo-det profiles show {short(extends)[1:-1]}' to see why"
            ) from None
        phases = {p: base.phase(p).to_dict() for p in PHASES}
        description = base.description
    else:
        phases = {p: PhaseSettings().to_dict() for p in PHASES}
        description = ""

    sections = [("defaults", PHASES)] + [(p, (p,)) for p in PHASES]
    for section, targets in sections:
        values = data.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ProfileError(
                f"{_where(origin, lines, section)}: '{section}' must be a mapping of settings, got {_type_name(values)}"
            )
        for key, value in values.items():
            where = _where(origin, lines, section, str(key))
            checked = _check_value(str(key), value, where=f"{where}: in '{section}'")
            for target in targets:
                phases[target][str(key)] = checked

    name = data.get("name")
    if name is None:
        name = Path(origin).stem if not origin.startswith("builtin:") else origin.split(":", 1)[1]
    if not isinstance(name, str) or not name.strip():
        raise ProfileError(f"{_where(origin, lines, 'name')}: 'name' must be a non-empty string, got {short(name)}")
    desc = data.get("description", description)
    if not isinstance(desc, str):
        raise ProfileError(
            f"{_where(origin, lines, 'description')}: 'description' must be a string, got {_type_name(desc)}"
        )
    return Profile(
        name=name,
        description=" ".join(desc.split()),
        source=origin,
        **{p: _phase_settings(phases[p]) for p in PHASES},
    )


# ---------------------------------------------------------------------------------------------------------
# settings of yolo-det's own extensions, registered like any plugin's


def _check_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"must be true or false, got {_type_name(value)} {short(value)}")
    return value


#: Worker-invariant data: every random draw of a training sample keyed by (seed, epoch, sample index), so the
#: batches do not depend on the loader's worker count (built into the training loader by the trainer seam).
DATA_INVARIANCE = Setting(
    "data_invariance",
    False,
    _check_bool,
    "augmentation draws keyed by (seed, epoch, sample index): the same batches for any worker count",
)
register_setting(DATA_INVARIANCE)


def _check_shards(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ValueError(f"must be null or an integer from 1 to 4096, got {_type_name(value)} {short(value)}")
    return value


#: The same weights on any number of ranks: each global batch is cut into K shards by sample index, each shard is
#: computed alone and the shards' gradients are summed in shard order (``fixes.shards``; implies data invariance).
SHARDS = Setting(
    "shards",
    None,
    _check_shards,
    "K fixed shards per global batch, summed in shard order: the same weights on 1, 2, ... K ranks (K % ranks == 0)",
)
register_setting(SHARDS)


def shard_layout_problem(shards: int, world: int, batch: Any) -> str | None:
    """What does not fit ``shards: K`` on ``world`` ranks with the global ``batch`` (one line), or None.

    The one rule: the ranks divide ``K`` and the batch is a multiple of ``K``. The pre-checks apply it to the
    arguments before anything is built, :class:`yolo_det.fixes.shards.ShardLayout` to the trainer's batch.
    """
    if shards % world:
        divisors = [d for d in range(1, shards + 1) if shards % d == 0]
        return (
            f"shards: {shards} needs a number of ranks that divides {shards} ({', '.join(map(str, divisors))}), "
            f"this job has {world}; change the ranks or the profile's shards"
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < shards or batch % shards:
        fit = max(shards, int(batch) // shards * shards) if isinstance(batch, (int, float)) else shards
        return (
            f"shards: {shards} needs a batch that is a multiple of {shards}, got batch={batch}; "
            f"use batch={fit} or another shards"
        )
    return None


def _register_builtin_settings() -> None:
    """The settings of yolo-det's own extensions (``batch_invariant``, ``intra_op_threads``, ``cpu_isa``),
    registered like a plugin's."""
    from .deploy_settings import DEPLOY_SETTINGS
    from .machine_settings import MACHINE_SETTINGS

    for name, default, check, doc in (*DEPLOY_SETTINGS, *MACHINE_SETTINGS):
        register_setting(Setting(name, default, check, doc))


_register_builtin_settings()
