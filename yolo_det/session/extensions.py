"""What applying a phase consists of: one extension per concern, each with ``apply`` and ``undo``.

:class:`~yolo_det.session.session.DeterminismSession` runs :func:`default_extensions` (in this order) when
a phase is entered, and undoes them in reverse order when it is left, on error too:

- :class:`FlagsAndEnv`: torch flags and environment variables (:mod:`yolo_det.core.state`);
- :class:`MachinePinning`: ``intra_op_threads`` (torch's threads, whatever Ultralytics chose) and the check
  that ``cpu_isa``'s branches were pinned before torch started (:mod:`yolo_det.core.machine_settings`);
- :class:`Seeds`: seeding at the start of a phase, and the data order of a handed-over loader;
- :class:`BackwardToggle`: deterministic algorithms off while the backward pass runs, for a scaler handed
  over to the session (:class:`~yolo_det.core.backward.ToggleScaler`) and for ``session.backward(loss)``;
- :class:`Swaps`: the phase's ``swaps`` policy on a model handed over to the session (the decision is
  :func:`yolo_det.analysis.swap_plan.decide_swaps`, the mechanism :mod:`yolo_det.fixes.swaps`);
- :class:`Interception`: routing of ``torch.nn.functional`` calls (:mod:`yolo_det.fixes.intercept`).

``data_invariance`` and ``shards`` are no extension: the integration builds them into the training loader (the
trainer seam's ``get_dataloader``, :mod:`yolo_det.integrations.ultralytics.seam`; YOLOv5's, the patched
``create_dataloader`` line in ``train()``: :meth:`yolo_det.integrations.yolov5.data.YOLOv5Data.build`).

An integration adds what only it knows with :func:`register_extension` (the Ultralytics plugin's
``batch_invariant`` on a predictor or validator: :mod:`yolo_det.integrations.ultralytics.batch_invariance`).

An extension's ``apply(ctx)`` returns a token (what it replaced) or None when it did nothing;
``undo(token)`` puts back what the token describes. Objects handed over while a phase is in force (the
model, the scaler) are applied through the same extensions, via ``hand_over``. A new profile setting is
a field of the schema (:class:`~yolo_det.core.profiles.PhaseSettings`, or
:func:`~yolo_det.core.profiles.register_setting`) and one extension (in :func:`default_extensions`, or
:func:`register_extension`); nothing else changes (docs/architecture.md).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..analysis.swap_plan import decide_swaps
from ..core import state as _state
from ..core.backward import ToggleScaler
from ..core.errors import ConfigError
from ..core.machine_settings import ISA_CAPABILITY, ISA_ENV, cannot_match, missing_env
from ..core.profiles import PhaseSettings
from ..core.seeding import rank_seed, seed_dataloader, seed_everything
from ..fixes import swaps as _swaps
from ..fixes.intercept import interception, suspended

__all__ = [
    "BackwardToggle",
    "ContextExtension",
    "Extension",
    "FlagsAndEnv",
    "Interception",
    "MachinePinning",
    "PhaseContext",
    "Seeds",
    "Swaps",
    "default_extensions",
    "register_extension",
    "unregister_extension",
]


@dataclass(frozen=True)
class PhaseContext:
    """What an extension is applied for: the session (a ``DeterminismSession``), the phase and its settings."""

    session: Any
    phase: str
    settings: PhaseSettings


class Extension:
    """One concern of applying a phase. Subclasses override :meth:`apply` and :meth:`undo`."""

    name = "extension"

    def apply(self, ctx: PhaseContext) -> Any:
        """Apply this concern for ``ctx``; return a token for :meth:`undo`, or None when nothing changed."""
        return None

    def undo(self, token: Any) -> None:
        """Put back what :meth:`apply` (or :meth:`hand_over`) replaced, as described by ``token``."""

    def hand_over(self, ctx: PhaseContext, what: str, obj: Any, **options: Any) -> Any:
        """Apply this concern to an object handed over while ``ctx``'s phase is in force (a model, a scaler).

        Returns:
            A token for :meth:`undo`, or None when this extension has nothing to do with ``obj``.
        """
        return None


class FlagsAndEnv(Extension):
    """The phase's torch flags and environment variables; undo restores the exact previous state."""

    name = "flags"

    def apply(self, ctx: PhaseContext) -> Any:
        return _state.apply(ctx.settings)

    def undo(self, token: Any) -> None:
        _state.restore(token)


class MachinePinning(Extension):
    """``intra_op_threads`` and ``cpu_isa``: pin the threads; refuse a process whose ISA branches are not pinned."""

    name = "machine"

    def apply(self, ctx: PhaseContext) -> Any:
        isa = ctx.settings.extra.get("cpu_isa")
        if isa is not None:
            problem = cannot_match(isa)
            if problem:
                raise ConfigError(f"profile '{ctx.session.profile.name}': {problem}")
            missing = missing_env(isa)
            if missing or torch.backends.cpu.get_cpu_capability() != ISA_CAPABILITY[isa]:
                needed = " ".join(f"{k}={v}" for k, v in ISA_ENV[isa].items())
                raise ConfigError(
                    f"profile '{ctx.session.profile.name}' (cpu_isa: {isa}) needs {needed} in the environment before "
                    f"torch is imported: start Python with them (`{needed} python train.py`; yolo-det train sets them)"
                )
        threads = ctx.settings.extra.get("intra_op_threads")
        if threads is None:
            return None
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        return before

    def undo(self, token: Any) -> None:
        torch.set_num_threads(token)


class Seeds(Extension):
    """Seed python, numpy and torch when a phase starts: the phase's own ``seed``, else (train) the run's.

    Training seeds with this rank's seed (:func:`~yolo_det.core.seeding.rank_seed`). A session whose
    ``seed`` is None leaves the random generators alone unless the phase sets a seed. A data loader handed
    over (``what="loader"``) gets its shuffle order and worker seeds from the run's seed
    (:func:`~yolo_det.core.seeding.seed_dataloader`). Nothing to undo.
    """

    name = "seeds"

    def apply(self, ctx: PhaseContext) -> Any:
        seed = self.seed_for(ctx)
        if seed is not None:
            seed_everything(seed)
        return None

    def hand_over(self, ctx: PhaseContext, what: str, obj: Any, **options: Any) -> Any:
        if what == "loader":
            seed_dataloader(obj, ctx.session.seeds()["seed"], rank=ctx.session.rank)
        return None

    @staticmethod
    def seed_for(ctx: PhaseContext) -> int | None:
        """The seed entering ``ctx``'s phase uses (None: the generators are left alone)."""
        settings, session = ctx.settings, ctx.session
        seed = settings.seed if settings.seed is not None else (session.seed if ctx.phase == "train" else None)
        if seed is None:
            return None
        return rank_seed(seed, session.rank) if ctx.phase == "train" else int(seed)


class BackwardToggle(Extension):
    """``backward: disable``: a handed-over scaler is wrapped in a ToggleScaler (``what="scaler"``, ``obj``
    the object holding it as ``.scaler``); undo puts the original scaler back."""

    name = "backward"

    def hand_over(self, ctx: PhaseContext, what: str, obj: Any, **options: Any) -> Any:
        if what != "scaler" or ctx.settings.backward != "disable":
            return None
        scaler = getattr(obj, "scaler", None)
        if scaler is None or isinstance(scaler, ToggleScaler):
            return None
        obj.scaler = ToggleScaler(scaler)
        return obj, scaler

    def undo(self, token: Any) -> None:
        holder, scaler = token
        if isinstance(getattr(holder, "scaler", None), ToggleScaler):
            holder.scaler = scaler


class Swaps(Extension):
    """The phase's ``swaps`` policy on a handed-over model (``what="model"``); undo swaps back.

    Options: ``imgsz`` (the audit trace's input size) and ``decided`` (a decision already taken, module
    path -> reason, which skips the audit).
    """

    name = "swaps"

    def hand_over(self, ctx: PhaseContext, what: str, obj: Any, **options: Any) -> Any:
        if what != "model" or ctx.settings.swaps == "none":
            return None
        decided = options.get("decided")
        if decided is None:
            with suspended():  # trace the model as it is, not as interception would run it
                decided = decide_swaps(obj, ctx.settings.swaps, imgsz=int(options.get("imgsz", 64)))
        records = _swaps.swap_modules(obj, decided)
        return (obj, records) if records else None

    def undo(self, token: Any) -> None:
        model, records = token
        _swaps.restore(model, records)


class Interception(Extension):
    """``intercept: true``: non-deterministic functional calls routed for the phase."""

    name = "intercept"

    def apply(self, ctx: PhaseContext) -> Any:
        if not ctx.settings.intercept:
            return None
        cm = interception()
        cm.__enter__()
        return cm

    def undo(self, token: Any) -> None:
        token.__exit__(None, None, None)


class ContextExtension(Extension):
    """A ``factory(phase, settings, session) -> context manager | None`` as an extension (entered per phase)."""

    def __init__(self, factory: Callable[[str, PhaseSettings, Any], AbstractContextManager[Any] | None]) -> None:
        self.factory = factory
        self.name = getattr(factory, "__name__", "context")

    def apply(self, ctx: PhaseContext) -> Any:
        cm = self.factory(ctx.phase, ctx.settings, ctx.session)
        if cm is None:
            return None
        cm.__enter__()
        return cm

    def undo(self, token: Any) -> None:
        token.__exit__(None, None, None)


#: Extensions added with :func:`register_extension` (factories, in registration order).
_REGISTERED: list[Callable[[], Extension]] = []


def default_extensions() -> list[Extension]:
    """The extensions every session applies, in order (undone in reverse): the built-in ones, then the
    registered ones."""
    return [
        FlagsAndEnv(),
        MachinePinning(),
        Seeds(),
        BackwardToggle(),
        Swaps(),
        Interception(),
        *(make() for make in _REGISTERED),
    ]


def register_extension(factory: Callable[[], Extension]) -> None:
    """Apply a new extension in every session created from now on, after the built-in ones.

    ``factory()`` makes one instance per session (an :class:`Extension` subclass is a factory). With
    :func:`yolo_det.core.profiles.register_setting` this is all a new profile setting needs: the setting in
    the schema, and the extension that applies and undoes it. Registering the same factory again is a no-op.
    """
    if not callable(factory):
        raise ConfigError(f"register_extension needs a factory of Extension objects (a class), got {factory!r}")
    if factory not in _REGISTERED:
        _REGISTERED.append(factory)


def unregister_extension(factory: Callable[[], Extension]) -> None:
    """Stop applying an extension added by :func:`register_extension` (sessions already made keep theirs)."""
    if factory in _REGISTERED:
        _REGISTERED.remove(factory)
