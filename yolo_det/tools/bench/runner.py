"""Running the bench: set up a trainer, apply each configuration through a session, time the steps.

Length: one concern, running the bench inside a training's setup. Most of it is :class:`_Runner`, whose
steps (the configurations, the saved training state, timed blocks, the overhead, kernels, memory) share
the trainer and the batches it holds; split apart they would pass that state around.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from typing import Any

import torch

from ...analysis.swap_plan import decide_swaps
from ...core import state as _state
from ...core.backward import ToggleScaler
from ...core.errors import ConfigError
from ...core.profiles import PhaseSettings, Profile, load_profile
from ...core.quiet import quiet_ultralytics
from ...fixes.intercept import suspended
from ...session.session import DeterminismSession
from ..runtime import run_folder, unwrap_model
from .isolations import BASES, ISOLATIONS, POOL_BATCHES, RESERVED, Isolation, _fmt_value
from .memory import _Memory
from .report import BenchReport, _Config
from .scopes import _SCOPES, _handled, _scope_extension
from .stats import ratio_interval, verdict

__all__ = ["bench", "check_args", "parse_profiles"]


class _Done(Exception):
    """Ends the Ultralytics training once the bench has run inside its setup callback."""


def parse_profiles(profiles: str | Sequence[str | Profile]) -> list[Profile]:
    items = [p.strip() for p in profiles.split(",")] if isinstance(profiles, str) else list(profiles)
    if not items or any(isinstance(p, str) and not p for p in items):
        raise ConfigError("--profiles needs a comma-separated list of profiles, e.g. --profiles repro,balanced,fast")
    loaded = [load_profile(p) for p in items]
    names = [p.name for p in loaded]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"--profiles names {', '.join(dupes)} more than once")
    return loaded


def check_args(args: Mapping[str, Any], steps: int, warmup: int, block: int) -> None:
    """Check the bench's own arguments (one-line :class:`~yolo_det.core.errors.ConfigError` on bad input)."""
    for name, value, low in (("--steps", steps, 1), ("--warmup", warmup, 0), ("--block", block, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    for key, why in RESERVED.items():
        if args.get(key) not in (None, False, 0):
            raise ConfigError(f"'{key}=' cannot be passed to bench: {why}")
    device = args.get("device")
    if isinstance(device, (list, tuple)) or (isinstance(device, str) and "," in device.strip(",")):
        raise ConfigError(f"bench runs on one device; got device={device!r} (pass a single device, e.g. device=0)")


def bench(
    profiles: str | Sequence[str | Profile],
    args: Mapping[str, Any],
    *,
    steps: int = 20,
    warmup: int = 3,
    block: int = 5,
    isolate: bool = True,
    verbose: bool = False,
    progress: Callable[[str], None] | None = None,
    kernel_steps: int = 0,
) -> BenchReport:
    """Measure each profile's training step on the model and device of ``args`` in one process.

    Args:
        profiles: Profile names or files (a comma-separated string or a sequence), or Profiles.
        args: Ultralytics train arguments, ``model`` included (see :func:`yolo_det.tools.prepare.prepare`).
            ``plots`` and ``val`` default to False here. Without ``project`` the run folder is temporary.
        steps: Measured steps per configuration.
        warmup: Untimed steps per configuration before its first measurement.
        block: Consecutive steps a configuration runs before the next one takes over.
        isolate: Also measure each setting toggled on its own (see :data:`ISOLATIONS`).
        verbose: Show Ultralytics' own log (on stderr).
        progress: Called with a line of text as the bench advances.
        kernel_steps: On CUDA, after the measurement, run this many extra steps of each profile under
            ``torch.profiler`` and report its GPU kernels (``rows[i]["kernels"]``: name, calls and self
            device time per step, largest first); 0 (default) or a CPU device: not profiled.

    Returns:
        The report (``rows`` has one entry per profile, in the order given).
    """
    from ultralytics import YOLO

    loaded = parse_profiles(profiles)
    check_args(args, steps, warmup, block)
    train_args = {"plots": False, "val": False, **dict(args)}
    model_src = train_args.pop("model")
    train_args.pop("name", None)
    result: dict[str, Any] = {}

    def run_bench(trainer: Any) -> None:
        try:
            result["report"] = _Runner(
                trainer,
                loaded,
                steps=steps,
                warmup=warmup,
                block=block,
                isolate=isolate,
                progress=progress,
                model_name=str(model_src),
                kernel_steps=kernel_steps,
            ).run()
        finally:
            for loader in (getattr(trainer, "train_loader", None), getattr(trainer, "test_loader", None)):
                close = getattr(loader, "close", None)
                if callable(close):
                    close()
        raise _Done

    before = _state.snapshot()
    try:
        with run_folder(train_args.pop("project", None)) as project, quiet_ultralytics(verbose):
            from ...core.untrusted.safeload import guarded_torch_load

            with guarded_torch_load():  # a checkpoint loads through the allow-list
                model = YOLO(model_src)
            model.add_callback("on_pretrain_routine_end", run_bench)
            try:
                model.train(**{**train_args, "project": project, "name": "bench", "exist_ok": True})
            except _Done:
                pass
    finally:
        _state.restore(before)
    if "report" not in result:  # pragma: no cover - a trainer that never reaches on_pretrain_routine_end
        raise ConfigError("the trainer ended before its setup finished; nothing was measured")
    return result["report"]


def _interval_fields(prefix: str, cfg: _Config, ref: _Config | None) -> dict[str, Any]:
    """``<prefix>_low``, ``<prefix>_high`` (95% bootstrap interval of the ratio of medians ``cfg / ref``) and
    ``<prefix>_verdict`` (``slower``, ``faster`` or ``within noise``); None where it cannot be computed."""
    empty = {f"{prefix}_low": None, f"{prefix}_high": None, f"{prefix}_verdict": None}
    if ref is None or not cfg.times or not ref.times:
        return empty
    if ref is cfg:
        return {f"{prefix}_low": 1.0, f"{prefix}_high": 1.0, f"{prefix}_verdict": "reference"}
    ratio, low, high = ratio_interval(cfg.times, ref.times)
    return {f"{prefix}_low": low, f"{prefix}_high": high, f"{prefix}_verdict": verdict(ratio, low, high)}


class _Runner:
    """The timed loop inside a set-up trainer."""

    def __init__(
        self,
        trainer: Any,
        profiles: list[Profile],
        *,
        steps: int,
        warmup: int,
        block: int,
        isolate: bool,
        progress: Callable[[str], None] | None,
        model_name: str,
        kernel_steps: int = 0,
    ) -> None:
        self.trainer = trainer
        self.kernel_steps = kernel_steps
        self.profiles = profiles
        self.steps, self.warmup, self.block = steps, warmup, block
        self.isolate = isolate
        self.progress = progress or (lambda line: None)
        self.model_name = model_name
        self.device: torch.device = trainer.device
        self.memory = _Memory(self.device)
        self.sync: Callable[[], None] | None = (
            (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else None
        )
        self._swap_plans: dict[tuple[int, str], dict[str, str]] = {}

    # -- configurations -----------------------------------------------------------------------------
    def _configs(
        self,
    ) -> tuple[dict[str, _Config], list[tuple[Profile, str]], list[tuple[Isolation, str, str | None, str]]]:
        by_settings: dict[PhaseSettings, _Config] = {}

        def config(key: str, settings: PhaseSettings) -> str:
            if settings not in by_settings:
                by_settings[settings] = _Config(key=key, settings=settings)
            return by_settings[settings].key

        profile_keys = [(p, config(f"profile:{p.name}", p.train)) for p in self.profiles]
        isolations: list[tuple[Isolation, str, str | None, str]] = []
        handled = _handled()
        if self.isolate:
            for iso in ISOLATIONS:
                if iso.devices is not None and self.device.type not in iso.devices:
                    isolations.append((iso, "", None, f"not applicable on {self.device.type}"))
                elif iso.needs_scope is not None and iso.needs_scope not in handled:
                    isolations.append(
                        (
                            iso,
                            "",
                            None,
                            "not measured: no implementation registered (yolo_det.tools.bench.register_scope)",
                        )
                    )
                else:
                    base = config(f"base:{iso.base}", BASES[iso.base])
                    toggled = config(f"toggle:{iso.setting}", BASES[iso.base].replace(**iso.changes))
                    isolations.append((iso, base, toggled, "measured"))
        configs = {c.key: c for c in by_settings.values()}
        for p, key in profile_keys:
            for name in ("swaps", "intercept"):
                value = getattr(p.train, name)
                if value not in ("none", False) and name not in handled:
                    configs[key].notes.append(f"{name}={_fmt_value(value)} not applied (no implementation registered)")
        return configs, profile_keys, isolations

    # -- training state -------------------------------------------------------------------------------
    def _save_state(self) -> dict[str, Any]:
        t = self.trainer

        def cpu(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return obj.detach().to("cpu", copy=True)
            if isinstance(obj, dict):
                return {k: cpu(v) for k, v in obj.items()}
            if isinstance(obj, list):
                return [cpu(v) for v in obj]
            return obj

        return {
            "model": cpu(unwrap_model(t.model).state_dict()),
            "optimizer": cpu(t.optimizer.state_dict()),
            "scaler": cpu(ToggleScaler.unwrap(t.scaler).state_dict()),
            "ema": cpu(t.ema.ema.state_dict()),
            "ema_updates": t.ema.updates,
        }

    def _load_state(self, saved: dict[str, Any]) -> None:
        t = self.trainer
        unwrap_model(t.model).load_state_dict(saved["model"])
        t.optimizer.load_state_dict(saved["optimizer"])
        t.optimizer.zero_grad(set_to_none=True)
        ToggleScaler.unwrap(t.scaler).load_state_dict(saved["scaler"])
        t.ema.ema.load_state_dict(saved["ema"])
        t.ema.updates = saved["ema_updates"]

    # -- steps ----------------------------------------------------------------------------------------
    def _step_fn(self) -> Callable[[dict[str, Any]], None]:
        from ...core.compat import autocast

        t = self.trainer
        amp = torch.bfloat16 if getattr(t.args, "amp", None) == "bf16" else bool(t.amp)
        device_type = self.device.type

        def step(batch: dict[str, Any]) -> None:
            with autocast(amp, device=device_type):
                b = t.preprocess_batch(dict(batch))
                loss, _ = t.model(b)
                loss = loss.sum()
            t.scaler.scale(loss).backward()
            t.optimizer_step()

        return step

    def _block(
        self,
        step: Callable[[dict[str, Any]], None],
        pool: list[dict[str, Any]],
        n: int,
        times: list[float] | None,
        cpu_times: list[float] | None = None,
    ) -> None:
        """Run ``n`` steps; append each one's wall seconds to ``times`` and, on a CPU device, its process CPU
        seconds to ``cpu_times`` (None: untimed)."""
        clock = time.perf_counter
        cpu_clock = time.process_time if cpu_times is not None else None
        sync = self.sync
        size = len(pool)
        c0 = 0.0
        for j in range(n):
            batch = pool[j % size]
            if cpu_clock is not None:
                c0 = cpu_clock()
            t0 = clock()
            step(batch)
            if sync is not None:
                sync()
            if times is not None:
                times.append(clock() - t0)
            if cpu_clock is not None and cpu_times is not None:
                cpu_times.append(cpu_clock() - c0)

    def _overhead(self, pool: list[dict[str, Any]], median_step: float) -> dict[str, Any]:
        """The cost of :meth:`_block`'s bookkeeping per step, measured with an empty step."""

        def empty(batch: dict[str, Any]) -> None:
            return None

        n = 2000
        samples = []
        for _ in range(5):
            times: list[float] = []
            t0 = time.perf_counter()
            self._block(empty, pool, n, times, [] if self.device.type == "cpu" else None)
            samples.append((time.perf_counter() - t0) / n)
        per_step = statistics.median(samples)
        return {
            "per_step_us": per_step * 1e6,
            "percent_of_median_step": 100.0 * per_step / median_step if median_step > 0 else math.nan,
            "method": "the measurement loop run with an empty step (clock reads, sync, bookkeeping), "
            f"{n} steps x 5, median",
        }

    def _apply(self, stack: ExitStack, settings: PhaseSettings) -> None:
        """Apply ``settings`` through a session (undone when ``stack`` closes): flags, the backward toggle on
        the trainer's scaler, swaps on its model (decided once per setting), interception, registered scopes."""
        t = self.trainer
        model = unwrap_model(t.model)
        session = DeterminismSession(Profile("bench", "", settings, settings, settings), seed=None)
        for factory, _ in list(_SCOPES):
            session.add_extension(functools.partial(_scope_extension, factory, model))
        session.begin()
        stack.callback(session.end)
        session.enter("train")
        session.wrap_scaler(t)
        if settings.swaps != "none":
            key = (id(model), settings.swaps)
            if key not in self._swap_plans:
                with suspended():
                    self._swap_plans[key] = decide_swaps(model, settings.swaps)
            session.prepare_model(model, decided=self._swap_plans[key])

    def _measured_block(
        self, cfg: _Config, step: Callable[[dict[str, Any]], None], pool: list[dict[str, Any]], n: int
    ) -> None:
        """Time ``n`` steps of ``cfg``; measure its peak memory (see :class:`_Memory`).

        On CUDA the peak is read around every timed block (resetting the peak counter costs nothing). On a
        CPU, measuring means returning freed memory to the OS first, which the next step pays for in page
        faults; so there the peak is taken once per configuration, on one extra untimed step after its first
        timed block.
        """
        if self.device.type == "cuda":
            self.memory.begin()
            self._block(step, pool, n, cfg.times)
            self._record_memory(cfg)
            return
        self._block(step, pool, n, cfg.times, cfg.cpu_times)
        if cfg.peak is None and self.memory.available:
            self.memory.begin()
            self._block(step, pool, 1, None)
            self._record_memory(cfg)

    def _profile_kernels(
        self, cfg: _Config, step: Callable[[dict[str, Any]], None], pool: list[dict[str, Any]], top: int = 60
    ) -> None:
        """Run ``kernel_steps`` steps of ``cfg`` under ``torch.profiler``; keep its largest GPU kernels."""
        from torch.profiler import ProfilerActivity, profile

        n = self.kernel_steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            self._block(step, pool, n, None)
        kernels = []
        for e in prof.key_averages():
            if str(e.device_type).split(".")[-1] != "CUDA":
                continue
            self_us = e.self_device_time_total
            kernels.append({"name": e.key, "calls_per_step": e.count / n, "self_us_per_step": float(self_us) / n})
        kernels.sort(key=lambda k: -k["self_us_per_step"])
        cfg.kernels = kernels[:top]

    def _record_memory(self, cfg: _Config) -> None:
        mem = self.memory.end()
        if mem is not None:
            cfg.peak = max(cfg.peak or 0, mem[0])
            cfg.peak_delta = max(cfg.peak_delta or 0, mem[1])

    def _guarded(self, cfg: _Config, body: Callable[[_Config], None], saved: dict[str, Any]) -> None:
        """Run ``body`` under ``cfg`` from the saved state; a RuntimeError marks the configuration failed."""
        if cfg.error is not None:
            return
        try:
            with ExitStack() as stack:
                self._load_state(saved)
                self._apply(stack, cfg.settings)
                body(cfg)
        except RuntimeError as e:  # e.g. strict determinism meeting a kernel without a deterministic version
            cfg.error = " ".join(str(e).split())[:300]
            cfg.times.clear()
            cfg.cpu_times.clear()
            self.trainer.optimizer.zero_grad(set_to_none=True)
            self.progress(f"bench: {cfg.key} failed: {cfg.error}")

    def run(self) -> BenchReport:
        t = self.trainer
        configs, profile_keys, isolations = self._configs()
        it = iter(t.train_loader)
        pool = [next(it) for _ in range(max(1, min(len(t.train_loader), POOL_BATCHES)))]
        del it
        batch_size = int(pool[0]["img"].shape[0])
        (getattr(t, "_model_train", None) or t.model.train)()
        step = self._step_fn()
        saved = self._save_state()
        order = list(configs)
        self.progress(
            f"bench: {len(order)} configurations x ({self.warmup} warm-up + {self.steps} measured steps) "
            f"on {self.device}"
        )
        try:
            for key in order:  # warm-up, untimed
                self._guarded(configs[key], lambda cfg: self._block(step, pool, self.warmup, None), saved)
            rounds = math.ceil(self.steps / self.block)
            for r in range(rounds):
                shift = r % len(order)
                for key in order[shift:] + order[:shift]:
                    cfg = configs[key]
                    n = min(self.block, self.steps - len(cfg.times))
                    if n > 0 and cfg.error is None:
                        self._guarded(cfg, functools.partial(self._measured_block, step=step, pool=pool, n=n), saved)
                self.progress(f"bench: round {r + 1}/{rounds} done")
            if self.kernel_steps > 0 and self.device.type == "cuda":
                for _, key in profile_keys:
                    self._guarded(configs[key], lambda cfg: self._profile_kernels(cfg, step, pool), saved)
        finally:
            self._load_state(saved)
        timed = [configs[k].median() for _, k in profile_keys if configs[k].error is None and configs[k].times]
        fastest = min(timed) if timed else math.nan
        fastest_cfg = next(
            (
                configs[k]
                for _, k in profile_keys
                if configs[k].error is None and configs[k].times and configs[k].median() == fastest
            ),
            None,
        )
        peaks = [peak for _, k in profile_keys if (peak := configs[k].peak) is not None]
        smallest = min(peaks) if peaks else None
        rows = []
        for p, key in profile_keys:
            c = configs[key]
            ok = c.error is None and bool(c.times)
            med = c.median()
            q1, q3 = c.quartiles()
            rows.append(
                {
                    "profile": p.name,
                    "source": p.source,
                    "steps": len(c.times) if ok else 0,
                    "step_ms": med * 1e3 if ok else None,
                    "step_ms_q1": q1 * 1e3 if ok else None,
                    "step_ms_q3": q3 * 1e3 if ok else None,
                    "step_cpu_ms": cpu * 1e3 if ok and (cpu := c.cpu_median()) is not None else None,
                    "step_times_ms": [t * 1e3 for t in c.times] if ok else [],
                    "images_per_s": batch_size / med if ok and med > 0 else None,
                    "peak_memory_bytes": c.peak if ok else None,
                    "peak_memory_over_start_bytes": c.peak_delta if ok else None,
                    "time_ratio": med / fastest if ok and fastest > 0 else None,
                    **_interval_fields("time_ratio", c, fastest_cfg if ok else None),
                    "throughput_ratio": fastest / med if ok and med > 0 else None,
                    "memory_ratio": (c.peak / smallest) if ok and c.peak is not None and smallest else None,
                    "error": c.error,
                    "settings": {k: v for k, v in c.settings.to_dict().items() if k not in {"seed"}},
                    "notes": list(c.notes),
                    "kernels": c.kernels,
                }
            )
        setting_rows = []
        for iso, base_key, toggled_key, status in isolations:
            row: dict[str, Any] = {
                "setting": iso.setting,
                "label": iso.label,
                "base": iso.base,
                "changes": dict(iso.changes),
                "status": status,
                "base_ms": None,
                "toggled_ms": None,
                "cost_ratio": None,
                "cost_pct": None,
                "memory_delta_bytes": None,
                "base_cpu_ms": None,
                "toggled_cpu_ms": None,
                "cpu_cost_pct": None,
                "cost_pct_low": None,
                "cost_pct_high": None,
                "verdict": None,
            }
            if toggled_key is not None:
                b, tg = configs[base_key], configs[toggled_key]
                failed = b.error or tg.error
                if failed:
                    row["status"] = f"error: {failed}"
                else:
                    bm, tm = b.median(), tg.median()
                    bc, tc = b.cpu_median(), tg.cpu_median()
                    if bc and tc:
                        row.update(base_cpu_ms=bc * 1e3, toggled_cpu_ms=tc * 1e3, cpu_cost_pct=100.0 * (tc / bc - 1.0))
                    interval = _interval_fields("cost", tg, b)
                    row.update(
                        base_ms=bm * 1e3,
                        toggled_ms=tm * 1e3,
                        cost_ratio=tm / bm,
                        cost_pct=100.0 * (tm / bm - 1.0),
                        verdict=interval["cost_verdict"],
                        cost_pct_low=_pct(interval["cost_low"]),
                        cost_pct_high=_pct(interval["cost_high"]),
                        memory_delta_bytes=(tg.peak - b.peak) if tg.peak is not None and b.peak is not None else None,
                    )
            setting_rows.append(row)
        all_timed = [c.median() for c in configs.values() if c.error is None and c.times]
        overhead = self._overhead(pool, statistics.median(all_timed) if all_timed else math.nan)
        info = {
            "model": self.model_name,
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else (platform.processor() or platform.machine()),
            "imgsz": int(pool[0]["img"].shape[-1]),
            "batch": batch_size,
            "amp": bool(t.amp),
            "steps": self.steps,
            "warmup": self.warmup,
            "block": self.block,
            "configurations": len(order),
            "memory_method": self.memory.method,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        }
        return BenchReport(rows=rows, settings=setting_rows, overhead=overhead, info=info)


def _pct(ratio: float | None) -> float | None:
    """A time ratio as a cost in percent (``None`` stays ``None``)."""
    return None if ratio is None else 100.0 * (ratio - 1)
